#!/usr/bin/python3
"""In-guest benchmark: ivtrace.ko's probes against ftrace on the same tracepoints, one boot.

    sudo /usr/bin/python3 bench/guest/run.py [--reps 5] [--smp 1] [--quick]
    make -C bench guest          # the same, then regenerates docs/performance.md

Boots the demo guest (vm/ivtvm.py, auto accelerator) once and runs bench/guest/guestbench.sh
in it: configurations off / ivtrace / ftrace / ivtrace-kmem / ftrace-kmem, interleaved in a
rotated order per repetition, each running three workloads (ivtwl syscalls: a getppid()
loop; ivtwl forkexec: fork + exec of a static no-op + wait; ivtwl cpu: an integer loop with
no system call). Both tracers only record (per-CPU ring, overwrite mode, no reader).
Writes bench/results/guest/<date>-<host>.json (a sub-directory: bench/report.py's native
section reads bench/results/*.json). Timings are results, never pass/fail.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "vm"))
import guestbuild  # noqa: E402
import ivtvm  # noqa: E402

KMOD = ROOT / "guest" / "kmod"
WORKLOAD = ROOT / "vm" / "guest" / "workload"
RESULTS = HERE.parent / "results" / "guest"
CONFIGS = ["off", "ivtrace", "ftrace", "ivtrace-kmem", "ftrace-kmem"]
WORKLOADS = ["syscall", "forkexec", "cpu"]
RE_M = re.compile(r"^GB m rep=(\d+) config=(\S+) workload=(\S+) i=(\d+) ns_per_op=([\d.]+) "
                  r"events=(-?\d+)", re.M)


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def machine(man, accel, why, smp, mem):
    cpu = ivtvm.cpu_identity()
    v = sh([ivtvm.QEMU, "--version"])
    qemu = v.stdout.splitlines()[0] if v.returncode == 0 else "?"
    git = sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip()
    dirty = sh(["git", "-C", str(ROOT), "status", "--porcelain", "--", "guest/kmod",
                "vm/guest/workload", "bench/guest"]).stdout.split("\n")
    return {
        "host": socket.gethostname(), "host_cpu": cpu, "host_cpus": os.cpu_count(),
        "host_kernel": platform.release(), "qemu": qemu,
        "guest_kernel": man["kernel_version"], "guest_cpus": smp, "guest_mem": mem,
        "accel": accel, "accel_reason": why,
        "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
        "ivtrace_git": {"commit": git,
                        "uncommitted_in": sorted({l[3:].split("/")[0] for l in dirty if l})},
    }


def med(v):
    return statistics.median(v) if v else None


def summarize(ms, params):
    """Per (config, workload): `best_ns`, the fastest of all its runs (the machine is shared:
    interference only ever adds time), and per repetition the fastest of its runs, whose
    median and min-max over repetitions are the spread. Added cost: traced - untraced, from
    the bests (`added_ns`) and paired per repetition (`added_ns_per_rep`, median
    `added_median_ns`). ivtrace/ftrace: the ratio of the added costs, both ways."""
    reps = sorted({m["rep"] for m in ms})
    per = {}  # (config, workload) -> {rep: [ns]}
    ev = {}
    for m in ms:
        per.setdefault((m["config"], m["workload"]), {}).setdefault(m["rep"], []).append(
            m["ns_per_op"])
        ev.setdefault((m["config"], m["workload"]), []).append(m["events"])
    ops = {"syscall": params["syscalls"], "forkexec": params["forks"], "cpu": params["cpu_iters"]}
    table = {}
    for (c, w), byrep in per.items():
        rbest = {r: min(v) for r, v in byrep.items()}
        table.setdefault(w, {})[c] = {
            "best_ns": min(rbest.values()),
            "per_rep_best_ns": [rbest[r] for r in reps if r in rbest],
            "median_ns": med(list(rbest.values())),
            "min_ns": min(rbest.values()), "max_ns": max(rbest.values()),
            "events_per_op": med(ev[(c, w)]) / ops[w],
        }
    for w, row in table.items():
        off = row.get("off")
        if not off:
            continue
        for c, x in row.items():
            if c == "off":
                continue
            added = [a - b for a, b in zip(x["per_rep_best_ns"], off["per_rep_best_ns"])]
            x["added_ns_per_rep"] = added
            x["added_median_ns"] = med(added)
            x["added_ns"] = x["best_ns"] - off["best_ns"]
            x["overhead_pct"] = 100.0 * x["added_ns"] / off["best_ns"]
        for a, b in (("ivtrace", "ftrace"), ("ivtrace-kmem", "ftrace-kmem")):
            if a in row and b in row:
                pa, pb = row[a]["added_ns_per_rep"], row[b]["added_ns_per_rep"]
                ma, mb = row[a]["added_median_ns"], row[b]["added_median_ns"]
                row[a]["vs_" + b] = {
                    "added_ratio": (row[a]["added_ns"] / row[b]["added_ns"]
                                    if row[b]["added_ns"] > 0 else None),
                    "added_ratio_of_medians": ma / mb if mb > 0 else None,
                    "added_ratio_per_rep": [x / y for x, y in zip(pa, pb) if y > 0],
                }
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="repetitions (rotated order), >= 3")
    ap.add_argument("--inner", type=int, default=3, help="runs of each workload per config")
    ap.add_argument("--syscalls", type=int, default=300000)
    ap.add_argument("--forks", type=int, default=300)
    ap.add_argument("--cpu-iters", type=int, default=200000000)
    ap.add_argument("--buf-kb", type=int, default=512,
                    help="per-CPU ring of both tracers, KiB (a multiple of 64)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--smp", type=int, default=1)
    ap.add_argument("--mem", default="512M")
    ap.add_argument("--accel", default="auto")
    ap.add_argument("--quick", action="store_true",
                    help="smaller counts, 3 x 1 runs; written as *-quick.json")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("-o", "--output", help="results file (default bench/results/guest/...)")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.syscalls, a.forks, a.cpu_iters, a.inner = 3, 100000, 100, 20000000, 1
    if a.buf_kb % 64 or a.buf_kb < 128:
        ap.error("--buf-kb must be a multiple of 64, at least 128")

    try:
        guest = guestbuild.build_guest()
    except guestbuild.BuildError as e:
        sys.exit(f"guest bench: {e}")
    man = guest.manifest
    args = [str(a.reps), str(a.syscalls), str(a.forks), str(a.cpu_iters), str(a.inner),
            str(a.buf_kb), a.configs]
    run = "sh /bench/guestbench.sh " + " ".join(args)
    shm = Path(f"/dev/shm/ivt-guestbench-{os.getpid()}")
    t0 = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc)
    vm = ivtvm.VM(run, shm=str(shm), shm_size="16M", shm_clear=True, smp=a.smp, mem=a.mem,
                  accel=a.accel,
                  add=[str(KMOD / "ivtrace.ko"), str(WORKLOAD / "ivtwl"),
                       f"{HERE / 'guestbench.sh'}:/bench/guestbench.sh"])
    info = machine(man, vm.accel, vm.accel_reason, a.smp, a.mem)
    print(f"guest bench: {vm.accel} ({vm.accel_reason}), guest {man['kernel_version']}, "
          f"{a.smp} vCPU, configs {a.configs}, {a.reps} reps x {a.inner} runs", flush=True)
    seen = 0
    try:
        vm.start()
        while vm.proc.poll() is None and time.monotonic() - t0 < a.timeout:
            lines = vm.console_text.splitlines()
            for ln in lines[seen:]:
                if ln.startswith("GB "):
                    print("  " + ln, flush=True)
            seen = len(lines)
            time.sleep(1)
        r = vm.wait(timeout=max(1, a.timeout - (time.monotonic() - t0)))
    finally:
        vm.kill()
        shm.unlink(missing_ok=True)
    text = r.console_text
    for ln in text.splitlines()[seen:]:
        if ln.startswith("GB "):
            print("  " + ln)
    errs = re.findall(r"^GB error (.*)$", text, re.M)
    if errs or "GB done" not in text or not r.ok:
        sys.exit(f"guest bench failed: {errs or r.summary()}\n{r.tail(40)}")
    ms = [{"rep": int(m[0]), "config": m[1], "workload": m[2], "i": int(m[3]),
           "ns_per_op": float(m[4]), "events": int(m[5])} for m in RE_M.findall(text)]
    params = {"reps": a.reps, "inner": a.inner, "syscalls": a.syscalls, "forks": a.forks,
              "cpu_iters": a.cpu_iters, "buf_kb": a.buf_kb, "configs": a.configs.split(","),
              "smp": a.smp, "mem": a.mem}
    res = {
        "schema": "ivtrace-guest-bench/1",
        "date": date.isoformat(timespec="seconds"),
        "argv": sys.argv,
        "reproduce": "make -C bench guest   (bench/guest/run.py "
                     + " ".join(sys.argv[1:]) + ")",
        "guest_command": run,
        "qemu_command": r.cmd,
        "machine": info,
        "params": params,
        "ftrace_events": re.findall(r"^GB info config=(ftrace\S*) (.*)$", text, re.M),
        "ivtrace_info": re.findall(r"^GB info config=(ivtrace\S*) (.*)$", text, re.M),
        "guest_info": re.findall(r"^GB info (kernel=.*)$", text, re.M),
        "duration_s": round(time.monotonic() - t0, 1),
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        "measurements": ms,
        "summary": summarize(ms, params),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"{date.strftime('%Y-%m-%dT%H%M%S')}-{socket.gethostname()}" + (
        "-quick" if a.quick else "")
    out = Path(a.output) if a.output else RESULTS / f"{name}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"guest bench: wrote {out} ({res['duration_s']} s)")
    for w, row in res["summary"].items():
        for c, x in row.items():
            extra = ""
            if "added_ns" in x:
                extra = f", +{x['added_ns']:.0f} ns ({x['overhead_pct']:.1f} %)"
            for k, v in x.items():
                if k.startswith("vs_") and v["added_ratio"] is not None:
                    extra += f", added cost {v['added_ratio']:.2f}x of {k[3:]}'s"
            print(f"  {w:<9}{c:<14}{x['best_ns']:>12.1f} ns/op best, median "
                  f"{x['median_ns']:.1f} [{x['min_ns']:.1f}..{x['max_ns']:.1f}]{extra}; "
                  f"{x['events_per_op']:.2f} events/op")


if __name__ == "__main__":
    main()
