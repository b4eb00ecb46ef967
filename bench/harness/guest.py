"""guest: ivtrace.ko's probes against ftrace on the same tracepoints, inside one guest.

Boots the demo guest (vm/ivtvm.py, auto accelerator) once and runs bench/guest/guestbench.sh
in it: configurations off / ivtrace / ftrace / ivtrace-kmem / ftrace-kmem, interleaved in a
rotated order per repetition, each running three workloads (ivtwl syscalls: a getppid()
loop; ivtwl forkexec: fork + exec of a static no-op + wait; ivtwl cpu: an integer loop with
no system call). Both tracers only record (per-CPU ring, overwrite mode, no reader).
"""

from __future__ import annotations

import os
import re
import statistics
import time
from pathlib import Path

import ivtvm

from . import BenchError, guests
from .results import ROOT

NAME = "guest"
HELP = "ivtrace.ko against ftrace on the same tracepoints, in one guest"
SCRIPT = ROOT / "bench" / "guest" / "guestbench.sh"
CONFIGS = ["off", "ivtrace", "ftrace", "ivtrace-kmem", "ftrace-kmem"]
WORKLOADS = ["syscall", "forkexec", "cpu"]
RE_M = re.compile(r"^GB m rep=(\d+) config=(\S+) workload=(\S+) i=(\d+) ns_per_op=([\d.]+) "
                  r"events=(-?\d+)", re.M)


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


def add_arguments(ap):
    ap.add_argument("--reps", type=int, default=5, help="repetitions (rotated order), >= 3")
    ap.add_argument("--inner", type=int, default=3, help="runs of each workload per config")
    ap.add_argument("--syscalls", type=int, default=300000)
    ap.add_argument("--forks", type=int, default=300)
    ap.add_argument("--cpu-iters", type=int, default=200000000)
    ap.add_argument("--buf-kb", type=int, default=512,
                    help="per-CPU ring of both tracers, KiB (a multiple of 64)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--timeout", type=float, default=3600)
    guests.add_arguments(ap)


def follow(vm, timeout: float, t0: float) -> int:
    """Echo the guest's GB lines while it runs; returns how many console lines were seen."""
    seen = 0
    while vm.proc.poll() is None and time.monotonic() - t0 < timeout:
        lines = vm.console_text.splitlines()
        for ln in lines[seen:]:
            if ln.startswith("GB "):
                print("  " + ln, flush=True)
        seen = len(lines)
        time.sleep(1)
    return seen


def run(a, rec) -> list[str]:
    if a.quick:
        a.reps, a.syscalls, a.forks, a.cpu_iters, a.inner = 3, 100000, 100, 20000000, 1
    if a.buf_kb % 64 or a.buf_kb < 128:
        raise BenchError("--buf-kb must be a multiple of 64, at least 128")
    guest = guests.build(a, rec, host_tools=False)
    args = [str(a.reps), str(a.syscalls), str(a.forks), str(a.cpu_iters), str(a.inner),
            str(a.buf_kb), a.configs]
    command = "sh /bench/guestbench.sh " + " ".join(args)
    shm = Path(f"/dev/shm/ivt-guestbench-{os.getpid()}")
    t0 = time.monotonic()
    vm = ivtvm.VM(command, shm=str(shm), shm_size="16M", shm_clear=True, smp=a.smp, mem=a.mem,
                  accel=a.accel, add=guest.add("ivtrace.ko", "ivtwl") +
                  [f"{SCRIPT}:/bench/guestbench.sh"])
    guests.describe(rec, guest, (vm.accel, vm.accel_reason), a.smp, a.mem)
    loadavg_before = Path("/proc/loadavg").read_text().split()[:3]
    print(f"guest bench: {vm.accel} ({vm.accel_reason}), guest {guest.kernel_version}, "
          f"{a.smp} vCPU, configs {a.configs}, {a.reps} reps x {a.inner} runs", flush=True)
    try:
        vm.start()
        seen = follow(vm, a.timeout, t0)
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
        raise BenchError(f"the guest bench failed: {errs or r.summary()}\n{r.tail(40)}")
    ms = [{"rep": int(m[0]), "config": m[1], "workload": m[2], "i": int(m[3]),
           "ns_per_op": float(m[4]), "events": int(m[5])} for m in RE_M.findall(text)]
    params = {"reps": a.reps, "inner": a.inner, "syscalls": a.syscalls, "forks": a.forks,
              "cpu_iters": a.cpu_iters, "buf_kb": a.buf_kb, "configs": a.configs.split(","),
              "smp": a.smp, "mem": a.mem}
    rec["data"] = {
        "guest_command": command,
        "qemu_command": r.cmd,
        "params": params,
        "ftrace_events": re.findall(r"^GB info config=(ftrace\S*) (.*)$", text, re.M),
        "ivtrace_info": re.findall(r"^GB info config=(ivtrace\S*) (.*)$", text, re.M),
        "guest_info": re.findall(r"^GB info (kernel=.*)$", text, re.M),
        "conditions": {"loadavg_before": loadavg_before,
                       "loadavg_after": Path("/proc/loadavg").read_text().split()[:3]},
        "measurements": ms,
        "summary": summarize(ms, params),
    }
    print_summary(rec["data"]["summary"])
    return []


def print_summary(summary: dict) -> None:
    for w, row in summary.items():
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
