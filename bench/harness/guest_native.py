"""The guest preset's native calibration: the tracers that also run on this host's own
kernel (ftrace, perf) measured with the same workload binary natively, so that the report
can say how much TCG scales each tracer's per-event cost, and not only the primitives.

Natively, on CPU 0 (the CPU the vCPU thread uses during the boot): gb-work's getppid loop
untraced, with ftrace recording the same tracepoints into a tracefs instance of its own
(`gb-native-PID`, nobody reading), and under `perf record` of the same tracepoints (the
task only, not -a: this machine runs other people's jobs). Rounds alternate the three;
the medians and every round are kept. Per event: added CPU time of the task / 2 (a
getppid call is one sys_enter and one sys_exit).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
SCHED = ("sched_switch", "sched_wakeup", "sched_wakeup_new", "sched_process_fork",
         "sched_process_exec", "sched_process_exit", "sched_process_free")
EVENTS = [f"sched/{e}" for e in SCHED] + ["task/task_rename", "raw_syscalls/sys_enter",
                                          "raw_syscalls/sys_exit"]
RE_GBW = re.compile(r"ops=(\d+) wall_ns=(\d+) cpu_ns=(\d+)")


def gbw(cmd: list[str]) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = RE_GBW.search(p.stdout)
    if p.returncode or not m:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stdout[-300:]}{p.stderr[-500:]}")
    ops, wall, cpu = (int(x) for x in m.groups())
    return {"wall": wall / ops, "cpu": cpu / ops}


def ftrace_round(work: list[str], inst: Path) -> dict:
    w = lambda f, v: (inst / f).write_text(v)  # noqa: E731
    w("tracing_on", "0")
    w("buffer_size_kb", "32768")
    w("trace", "")
    for e in EVENTS:
        w(f"events/{e}/enable", "1")
    w("tracing_on", "1")
    try:
        return gbw(work)
    finally:
        w("tracing_on", "0")
        for e in EVENTS:
            w(f"events/{e}/enable", "0")


def perf_round(work: list[str], out: Path) -> dict:
    ev = ",".join(e.replace("/", ":") for e in EVENTS)
    return gbw(["perf", "record", "-q", "-m", "8192", "-e", ev, "-o", str(out), "--"] + work)


def calibrate(gb_work: Path, scratch: Path, ops: int = 1000000, rounds: int = 5) -> dict:
    """{'off'|'ft-ring'|'perf-record': {rounds: [...], wall, cpu (medians, ns/call)}, and per
    event for the two tracers}; {'skipped': why} when tracefs or perf is missing."""
    if not (TRACEFS / "instances").is_dir() or not shutil.which("perf"):
        return {"skipped": "no tracefs instances or no perf on this host"}
    pin = ["taskset", "-c", "0"] if (os.cpu_count() or 1) >= 2 else []
    work = pin + [str(gb_work), "getppid", str(ops)]
    inst = TRACEFS / "instances" / f"gb-native-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    res: dict = {"ops": ops, "command": " ".join(work), "tracefs_instance": inst.name,
                 "perf_command": f"perf record -q -m 8192 -e EVENTS -o FILE -- {' '.join(work)}",
                 "runs": {"off": [], "ft-ring": [], "perf-record": []}}
    inst.mkdir()
    try:
        for _ in range(rounds):
            res["runs"]["off"].append(gbw(work))
            res["runs"]["ft-ring"].append(ftrace_round(work, inst))
            res["runs"]["perf-record"].append(perf_round(work, scratch / "native.perf.data"))
    finally:
        inst.rmdir()
        (scratch / "native.perf.data").unlink(missing_ok=True)
    for c, v in res["runs"].items():
        res[c] = {k: statistics.median(x[k] for x in v) for k in ("wall", "cpu")}
    for c in ("ft-ring", "perf-record"):
        res[c]["added_cpu_per_event"] = (res[c]["cpu"] - res["off"]["cpu"]) / 2
    return res
