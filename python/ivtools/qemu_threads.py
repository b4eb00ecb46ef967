"""A QEMU process's threads seen from the host: which are vCPUs, pinning them to host CPUs,
and what the host scheduler gave them (/proc/PID/task/TID/schedstat).

QEMU names its vCPU threads `CPU n/TCG` or `CPU n/KVM` when it runs with
`-name NAME,debug-threads=on`; without that every thread is `qemu-system-x86` and no vCPU
can be told apart. schedstat's first two fields are the thread's time on a CPU and its time
runnable but waiting on a run queue, in ns (Documentation/scheduler/sched-stats.rst).
Threads come and go while they are read (QEMU's thread pool retires idle workers): one that
ends meanwhile is skipped, never an error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

RE_VCPU = re.compile(r"CPU (\d+)/")


def schedstat(pid: int, tid: int | None = None) -> tuple[int, int]:
    """(time on a CPU, time waiting on a run queue), ns, of thread `tid` of process `pid`
    (without `tid`: of its main thread alone). OSError if it has ended."""
    where = f"/proc/{pid}/task/{tid}" if tid is not None else f"/proc/{pid}"
    run_ns, wait_ns, _slices = Path(where, "schedstat").read_text().split()
    return int(run_ns), int(wait_ns)


def threads(pid: int) -> dict[int, str]:
    """Thread id -> name (comm) of every thread of `pid`; {} once the process has ended."""
    out = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for t in tasks:
        try:
            out[int(t.name)] = (t / "comm").read_text().strip()
        except OSError:
            pass
    return out


def vcpu_index(comm: str) -> int | None:
    """The vCPU a QEMU thread runs, from its name (`CPU 1/TCG` -> 1); None for the others."""
    m = RE_VCPU.match(comm)
    return int(m.group(1)) if m else None


def vcpu_threads(pid: int) -> dict[int, int]:
    """vCPU index -> thread id, for every vCPU thread of QEMU process `pid`."""
    return {i: tid for tid, comm in threads(pid).items() if (i := vcpu_index(comm)) is not None}


def cpu_ns(pid: int) -> int:
    """Time on a CPU of every thread of `pid` so far, ns (schedstat: exact, all threads)."""
    return sum(_sched_or_zero(pid, tid)[0] for tid in threads(pid))


def vcpu_sched(pid: int) -> tuple[int, int, int]:
    """(vCPU threads' time on a CPU, their run-queue wait, the other threads' time on a
    CPU), ns, of QEMU process `pid`: what the host scheduler gave the guest, and what QEMU's
    own side (main loop, I/O threads for slirp, 9p, chardevs) cost."""
    run = wait = other = 0
    for tid, comm in threads(pid).items():
        r, w = _sched_or_zero(pid, tid)
        if vcpu_index(comm) is not None:
            run, wait = run + r, wait + w
        else:
            other += r
    return run, wait, other


def pin_qemu(pid: int, vcpu_cpu: int, other_cpu: int, vcpus: set[int] | None = None) -> dict:
    """Pin QEMU process `pid`: its vCPU threads (`vcpus`: those indexes, default all) on host
    CPU `vcpu_cpu`, every other thread (main loop, RCU, I/O workers, the other vCPUs) on
    `other_cpu`. A thread started later inherits the main thread's CPU. Returns the names
    pinned, {"vcpu": [...], "other": [...]}; a vCPU asked for by index that QEMU does not
    have (no `debug-threads=on`?) is a RuntimeError."""
    done: dict[str, list[str]] = {"vcpu": [], "other": []}
    for tid, comm in threads(pid).items():
        i = vcpu_index(comm)
        kind = "vcpu" if i is not None and (vcpus is None or i in vcpus) else "other"
        try:
            os.sched_setaffinity(tid, {vcpu_cpu if kind == "vcpu" else other_cpu})
        except ProcessLookupError:
            continue  # ended since it was listed
        done[kind].append(comm)
    missing = sorted((vcpus or set()) - {vcpu_index(c) for c in done["vcpu"]})
    if missing:
        raise RuntimeError(f"QEMU (pid {pid}) has no thread for vCPU {missing}: its threads are "
                           f"{sorted(done['vcpu'] + done['other'])}; run it with "
                           "-name NAME,debug-threads=on")
    return done


def _sched_or_zero(pid: int, tid: int) -> tuple[int, int]:
    try:
        return schedstat(pid, tid)
    except (OSError, ValueError):
        return 0, 0  # the thread ended since it was listed
