#!/usr/bin/python3
"""One-off: convert the results files of the four old harnesses (native schema 1,
ivtrace-guest-bench/1, ivtrace-eval/1, doorbell schema 1) to ivtrace-bench/2, write
bench/results/history.json from all of them, and keep only the runs the documentation
cites. Every measurement is copied as it is; only the envelope changes (machine, accelerator,
guest, git, command), paths become repository-relative (the runs were made in /work/main)
and files that moved are named where they are now. Run once, from the repository root."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, "bench")
from harness import history, results  # noqa: E402

OLD_ROOT = "/work/main"
MOVED = [("bench/eval/sink.py", "bench/harness/sink.py"),
         ("bench/eval/guest/evalguest.sh", "bench/guest/evalguest.sh"),
         ("build/eval/dropbear", "build/bench/dropbear"),
         ("build/eval/workloads", "build/bench/guest"),
         ("bench/doorbell/run.py", "bench/run doorbell")]
R = Path("bench/results")
# (old file, preset, new name) for every run; `keep`: cited by docs/performance.md
RUNS = sorted(R.glob("*.json")) + sorted(R.glob("*/*.json")) + sorted(R.glob("*/*/*.json"))
KEEP = {"2026-11-21T092747-vm.json", "guest/2026-11-21T070633-vm.json",
        "eval/2026-11-21T090012-vm.json", "doorbell/2026-11-21T090010-vm.json",
        "eval/focused/2026-11-21T093316-vm-int-bare-idle-stream.json"}


def moved(obj):
    if isinstance(obj, str):
        s = results.portable(obj, OLD_ROOT)
        for a, b in MOVED:
            s = s.replace(a, b)
        return s
    if isinstance(obj, list):
        return [moved(x) for x in obj]
    if isinstance(obj, dict):
        return {k: moved(v) for k, v in obj.items()}
    return obj


def envelope(preset, old, command, duration):
    return {"schema": results.SCHEMA, "preset": preset, "quick": False, "date": old["date"],
            "duration_s": duration, "command": command, "argv": old["argv"],
            "accelerator": {"name": "none", "reason": "runs on the host, no guest"},
            "guest": None, "build": {"stale": []}}


def old_cpu(hc, flags=()):
    return {"vendor_id": hc.get("vendor_id"), "cpu_family": hc.get("cpu family"),
            "model": hc.get("model"), "model_name": hc.get("model name"),
            "flags_of_interest": list(flags)}


def native(old):
    m = old["machine"]
    rec = envelope("native", old, "bench/run native",
                   round(sum(c["seconds"] for c in old["conditions"].values()), 1))
    rec["machine"] = {"host": m["hostname"], "cpu": m["cpu"], "cpus": m["online_cpus"],
                      "mem_gib": m["mem_gib"], "kernel": m["kernel"],
                      "kernel_version": m["kernel_version"], "versions": m["versions"],
                      "details": {k: m[k] for k in ("clocksource", "dmesg_hypervisor_tsc",
                                                     "vulnerabilities", "root_fs")}}
    rec["git"] = {"commit": m["ivtrace_git"]["commit"],
                  "uncommitted": m["ivtrace_git"]["uncommitted_in"]}
    rec["data"] = {k: old[k] for k in ("conditions", "native", "drain", "live_steady", "live")
                   if k in old}
    return rec


def guest(old):
    m = old["machine"]
    rec = envelope("guest", old, "bench/run guest", old["duration_s"])
    rec["machine"] = {"host": m["host"], "cpu": old_cpu(m["host_cpu"]), "cpus": m["host_cpus"],
                      "mem_gib": None, "kernel": m["host_kernel"], "kernel_version": None,
                      "versions": {"qemu": m["qemu"]}, "details": {}}
    rec["accelerator"] = {"name": m["accel"], "reason": m["accel_reason"]}
    rec["guest"] = {"kernel": m["guest_kernel"], "cpus": m["guest_cpus"], "mem": m["guest_mem"]}
    rec["git"] = {"commit": m["ivtrace_git"]["commit"],
                  "uncommitted": m["ivtrace_git"]["uncommitted_in"]}
    rec["data"] = {k: old[k] for k in ("guest_command", "qemu_command", "params",
                                       "ftrace_events", "ivtrace_info", "guest_info",
                                       "measurements", "summary")}
    rec["data"]["conditions"] = {"loadavg_before": m["loadavg_before"],
                                 "loadavg_after": old["loadavg_after"]}
    return rec


def evaluation(old):
    m = old["machine"]
    args = [a for a in old["argv"][1:] if a != "--no-report"]
    if "-o" in args:
        args[args.index("-o") + 1] = "FILE"
    rec = envelope("evaluation", old, shlex.join(["bench/run", "evaluation", *args]),
                   old["duration_s"])
    flags = (["hypervisor"] if m.get("host_hypervisor_flag") else []) + m.get("host_vmx_svm", [])
    rec["machine"] = {"host": m["host"], "cpu": old_cpu(m["host_cpu"], flags),
                      "cpus": m["host_cpus"], "mem_gib": m.get("host_mem_gib"),
                      "kernel": m["host_kernel"], "kernel_version": m.get("host_kernel_version"),
                      "versions": m["versions"], "details": {}}
    rec["accelerator"] = {"name": m["accel"], "reason": m["accel_reason"]}
    rec["guest"] = {"kernel": m["guest_kernel"], "cpus": m["guest_cpus"], "mem": m["guest_mem"]}
    rec["git"] = {"commit": m["ivtrace_git"]["commit"],
                  "uncommitted": m["ivtrace_git"]["uncommitted"]}
    rec["build"] = {"stale": [{"part": w, "files": [], "error": w}
                              for w in old.get("build_warnings", [])]}
    rec["data"] = {k: old[k] for k in ("guest_info", "conditions", "params", "commands", "boot",
                                       "calibration", "measurements", "tracer_stats",
                                       "transport", "sink_errors", "summary", "incomplete")
                   if k in old}
    return rec


def doorbell(old):
    m = old["machine"]
    rec = envelope("doorbell", old, "bench/run doorbell", None)
    db = old["ivshmem_doorbell"]
    rec["machine"] = {"host": m.get("host"), "cpu": {"model_name": m["cpu"]},
                      "cpus": m["vcpus"], "mem_gib": None, "kernel": m["kernel"],
                      "kernel_version": None, "versions": {"qemu": m["qemu"]}, "details": {}}
    rec["accelerator"] = {"name": db["accel"], "reason": db["accel_reason"]}
    rec["guest"] = {"kernel": None, "cpus": 2, "mem": "512M"}
    rec["git"] = {"commit": m["ivtrace_commit"], "uncommitted": None}
    rec["data"] = {k: old[k] for k in ("eventfd_threads", "ivshmem_doorbell", "kvm_ioeventfd",
                                       "trace_rates")}
    return rec


def convert(path):
    old = json.loads(path.read_text())
    rel = str(path.relative_to(R))
    kind = rel.split("/")[0] if "/" in rel else "native"
    rec = {"native": native, "guest": guest, "eval": evaluation, "doorbell": doorbell}[kind](old)
    return moved(rec), rel.replace("eval/", "evaluation/", 1) if kind == "eval" else (
        f"native/{rel}" if kind == "native" else rel)


def main():
    entries = []
    for path in RUNS:
        rec, new_rel = convert(path)
        new = R / new_rel
        old_rel = str(path.relative_to(R))
        if old_rel in KEEP:
            new.parent.mkdir(parents=True, exist_ok=True)
            if new != path:
                subprocess.run(["git", "mv", str(path), str(new)], check=True)
            png = path.with_suffix(".png")
            if png.exists() and new != path:
                subprocess.run(["git", "mv", str(png), str(new.with_suffix(".png"))],
                               check=True)
            results.write(rec, new)
        else:
            subprocess.run(["git", "rm", "-q", str(path)], check=True)
            png = path.with_suffix(".png")
            if png.exists():
                subprocess.run(["git", "rm", "-q", str(png)], check=True)
        entry = history.entry(rec, new)
        entry["file"] = f"bench/results/{new_rel}" if old_rel in KEEP else \
            f"bench/results/{old_rel}"
        entries.append(entry)
    history.save(entries)


if __name__ == "__main__":
    main()
