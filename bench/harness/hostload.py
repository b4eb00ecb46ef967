"""What else the machine was doing during a run: per-CPU busy and steal time, the load
average, the busiest processes, and waiting for a quiet machine. Every preset records
these, so that other jobs' load shows as load and not as a tracer's cost."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import time
from pathlib import Path


def cpu_times() -> list[list[int]]:
    """Per CPU, the first 8 fields of /proc/stat (user .. steal, jiffies); guest and
    guest_nice are left out: they are already counted in user and nice."""
    rows = []
    for line in Path("/proc/stat").read_text().splitlines():
        if re.match(r"cpu\d+ ", line):
            v = [int(x) for x in line.split()[1:9]]
            rows.append(v + [0] * (8 - len(v)))
    return rows


def busy_pct(a: list[list[int]], b: list[list[int]]) -> list[float]:
    """Per CPU, % of the time between two cpu_times() that was not idle or iowait."""
    out = []
    for x, y in zip(a, b):
        d = [j - i for i, j in zip(x, y)]
        tot = sum(d) or 1
        out.append(round(100.0 * (tot - d[3] - d[4]) / tot, 1))
    return out


def steal_pct(a: list[list[int]], b: list[list[int]]) -> list[float]:
    """Per CPU, % of the time this (virtual) machine's CPU was taken by its own hypervisor."""
    out = []
    for x, y in zip(a, b):
        d = [j - i for i, j in zip(x, y)]
        out.append(round(100.0 * d[7] / (sum(d) or 1), 2))
    return out


def per_cpu(values: list[float]) -> dict[str, float]:
    return {f"cpu{i}": v for i, v in enumerate(values)}


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def top_procs(n: int = 6) -> list[str]:
    p = subprocess.run(["ps", "-eo", "pid,pcpu,etimes,comm", "--sort=-pcpu"],
                       capture_output=True, text=True)
    return [" ".join(line.split()) for line in p.stdout.splitlines()[1:n + 1]]


def snapshot() -> dict:
    return {"time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "loadavg": Path("/proc/loadavg").read_text().strip(), "top": top_procs()}


class Section:
    """Times a part of a run and records the machine's load while it ran, into
    conditions[name]: load before and after, seconds, per-CPU busy and steal %."""

    def __init__(self, conditions: dict, name: str):
        self.conditions, self.name = conditions, name

    def __enter__(self):
        print(f"== {self.name}", file=sys.stderr, flush=True)
        self.before = snapshot()
        self.t0, self.c0 = time.time(), cpu_times()
        return self

    def __exit__(self, *exc):
        c1 = cpu_times()
        self.conditions[self.name] = {
            "before": self.before, "after": snapshot(),
            "seconds": round(time.time() - self.t0, 1),
            "cpu_busy_percent": per_cpu(busy_pct(self.c0, c1)),
            "cpu_steal_percent": per_cpu(steal_pct(self.c0, c1)),
        }
        return False


def wait_for_quiet(max_load: float, max_wait: float, say) -> dict:
    """Wait (up to max_wait s) until the 1-minute load average is <= max_load; what was
    seen goes into the results."""
    t0 = time.monotonic()
    first = loadavg()
    while loadavg()[0] > max_load and time.monotonic() - t0 < max_wait:
        say(f"load average {loadavg()[0]:.2f} > {max_load}: waiting (other jobs on this "
            f"machine; {max_wait - (time.monotonic() - t0):.0f} s left)")
        time.sleep(30)
    la = loadavg()
    return {"max_load": max_load, "waited_s": round(time.monotonic() - t0, 1),
            "loadavg_first_seen": first, "loadavg_at_start": la,
            "quiet": la[0] <= max_load, "top_at_start": top_procs()}
