"""Counting the events of every tracer's trace, by the same names, on the host (preset guest).

Each reader is the tracer's own or an independent one: babeltrace2's Python bindings (bt2)
for the CTF traces of LTTng and ivtrace, `perf script` for perf.data, `perf trace`'s text,
and a reader of ftrace's raw ring-buffer pages (the page and event-header layout the guest
kernel's tracefs describes in events/header_page and header_event, Linux 6.1). Names are
mapped to one vocabulary: the kernel tracepoints' own (sched_switch, ..., task_rename),
syscall_entry / syscall_exit for sys_enter / sys_exit and LTTng's per-system-call events,
and besides, the events whose number the workloads fix: `getppid_entry` / `getppid_exit`
(system call 110) and `exec_gb_work` (sched_process_exec of the workload binary, gb-work).
Every result says how many events the tracer reported lost.
"""

from __future__ import annotations

import re
import struct
import subprocess
from collections import Counter
from pathlib import Path

GETPPID_NR = 110  # x86-64
WORKLOAD_BINARY = "gb-work"  # bench/guest/workloads/gb-work.c, what forkexec execs

# ftrace ring-buffer pages (kernel/trace/ring_buffer.c): u64 timestamp, local_t commit
# (data size, plus flags in bits 31 and 30: events were missed before this page, and their
# number is stored after the data), then the data; event headers are u32 with type_len in
# the low 5 bits.
PAGE_HEADER = 16
MISSED_EVENTS, MISSED_STORED = 1 << 31, 1 << 30
TYPE_PADDING, TYPE_TIME_EXTEND, TYPE_TIME_STAMP = 29, 30, 31
SYSCALL_ID_OFFSET = 8  # sys_enter / sys_exit: `long id` after the 8 bytes of common fields
EXEC_FILENAME_OFFSET = 8  # sched_process_exec: `__data_loc char[] filename` (u32: len << 16 | offset)


def canonical(name: str) -> str:
    """One vocabulary for every tracer's event names."""
    name = name.split(":", 1)[-1]
    if name in ("sys_enter",) or name.startswith("syscall_entry_"):
        return "syscall_entry"
    if name in ("sys_exit",) or name.startswith("syscall_exit_"):
        return "syscall_exit"
    return name


def result(counts: Counter, lost: int, nbytes: int, **extra) -> dict:
    """Counts by canonical name, the total, what the tracer reported lost, bytes."""
    total = sum(n for k, n in counts.items() if not k.startswith(("getppid_", "exec_")))
    out = {"events": total, "by_name": dict(sorted(counts.items())), "lost": lost,
           "bytes": nbytes, "bytes_per_event": round(nbytes / total, 2) if total else None}
    out.update(extra)
    return out


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file())


# --------------------------------------------------------------------------- CTF (bt2)

def ctf(path: Path, stream_glob: str = "**/*") -> dict:
    """A CTF trace (LTTng's kernel trace, ivtrace's): events by name and the discarded-events
    counts of its packets, read with babeltrace2's bindings."""
    import bt2  # python3-bt2, for /usr/bin/python3 (the harness's interpreter)
    counts: Counter = Counter()
    discarded = 0
    for msg in bt2.TraceCollectionMessageIterator(str(path)):
        if type(msg) is bt2._EventMessageConst:
            name = msg.event.name
            counts[canonical(name)] += 1
            if name in ("syscall_entry_getppid", "syscall_exit_getppid"):
                counts["getppid_" + name.split("_")[1]] += 1
            elif name == "sched_process_exec" and \
                    str(msg.event.payload_field["filename"]).endswith(WORKLOAD_BINARY):
                counts["exec_gb_work"] += 1
        elif type(msg) is bt2._DiscardedEventsMessageConst:
            discarded += msg.count or 0
    data = [p for p in Path(path).rglob("*") if p.is_file() and "metadata" not in p.name
            and p.suffix not in (".idx", ".json")]
    return result(counts, discarded, sum(p.stat().st_size for p in data))


# --------------------------------------------------------------------------- ftrace raw pages

def ftrace_page_events(page: bytes):
    """(event length, payload) of every data event of one raw page; then ('missed', n)."""
    commit, = struct.unpack_from("<Q", page, 8)
    size = commit & ~(MISSED_EVENTS | MISSED_STORED) & 0xFFFFFFFF
    off = PAGE_HEADER
    end = PAGE_HEADER + min(size, len(page) - PAGE_HEADER)
    while off + 4 <= end:
        hdr, = struct.unpack_from("<I", page, off)
        type_len, delta = hdr & 0x1F, hdr >> 5
        if type_len == TYPE_PADDING:
            if delta == 0:
                break  # the rest of the page is empty
            length, = struct.unpack_from("<I", page, off + 4)
            off += 4 + length
        elif type_len in (TYPE_TIME_EXTEND, TYPE_TIME_STAMP):
            off += 8
        elif type_len == 0:
            length, = struct.unpack_from("<I", page, off + 4)
            yield 4 + length, page[off + 8:off + 4 + length]
            off += 4 + length
        else:
            yield 4 + 4 * type_len, page[off + 4:off + 4 + 4 * type_len]
            off += 4 + 4 * type_len
    if commit & MISSED_STORED and end + 8 <= len(page):
        yield "missed", struct.unpack_from("<Q", page, end)[0]
    elif commit & MISSED_EVENTS:
        yield "missed", 0


def exec_of_workload(payload: bytes) -> bool:
    """A sched_process_exec payload whose filename is the workload binary."""
    loc, = struct.unpack_from("<I", payload, EXEC_FILENAME_OFFSET)
    off, size = loc & 0xFFFF, loc >> 16
    return payload[off:off + size].rstrip(b"\0").endswith(WORKLOAD_BINARY.encode())


def ftrace_raw(path: Path, ids: dict[int, str]) -> dict:
    """The per-CPU files of `cat per_cpu/cpuN/trace_pipe_raw` (whole pages): events by name
    (ids: the guest's events/*/id), bytes they take in the ring (headers and time extends
    included), and the events the pages say were missed."""
    counts: Counter = Counter()
    nbytes = missed = 0
    for f in sorted(Path(path).glob("cpu*.raw")):
        data = f.read_bytes()
        for at in range(0, len(data) - PAGE_HEADER + 1, 4096):
            for length, payload in ftrace_page_events(data[at:at + 4096]):
                if length == "missed":
                    missed += payload
                    continue
                nbytes += length
                etype, = struct.unpack_from("<H", payload, 0)
                name = canonical(ids.get(etype, f"id{etype}"))
                counts[name] += 1
                if name in ("syscall_entry", "syscall_exit") and len(payload) >= 16:
                    nr, = struct.unpack_from("<q", payload, SYSCALL_ID_OFFSET)
                    if nr == GETPPID_NR:
                        counts["getppid_" + name.split("_")[1]] += 1
                elif name == "sched_process_exec" and exec_of_workload(payload):
                    counts["exec_gb_work"] += 1
    return result(counts, missed, nbytes, file_bytes=dir_bytes(path))


# --------------------------------------------------------------------------- perf

RE_PERF_NR = re.compile(r"NR (\d+) ([(=])")


def perf_data(path: Path) -> dict:
    """perf.data, read with this host's `perf script` (the guest's perf version): samples
    by event, getppid's, and the PERF_RECORD_LOST counts."""
    f = Path(path) / "perf.data"
    p = subprocess.run(["perf", "script", "-i", str(f), "-F", "event,trace",
                        "--show-lost-events"], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"perf script -i {f} failed: {p.stderr.strip()[-500:]}")
    counts: Counter = Counter()
    lost = 0
    for ln in p.stdout.splitlines():
        head = ln.split(None, 1)
        if not head:
            continue
        if head[0] == "PERF_RECORD_LOST":
            lost += int(ln.split()[-1])
            continue
        name = canonical(head[0].rstrip(":"))
        counts[name] += 1
        m = RE_PERF_NR.search(ln) if name.startswith("syscall_") else None
        if m and int(m.group(1)) == GETPPID_NR:
            counts["getppid_entry" if m.group(2) == "(" else "getppid_exit"] += 1
        elif name == "sched_process_exec" and f"/{WORKLOAD_BINARY} " in ln:
            counts["exec_gb_work"] += 1
    return result(counts, lost, f.stat().st_size)


RE_TRACE_SYSCALL = re.compile(r"\): \S+ (\w+)\(")
RE_TRACE_EVENT = re.compile(r" (\w+:\w+)\(")
RE_TRACE_LOST = re.compile(r"LOST (\d+) events")


def perf_trace(path: Path) -> dict:
    """`perf trace -o FILE` text: one line per system call (entry and exit: two events), one
    per tracepoint event, and `LOST n events!` lines."""
    f = Path(path) / "trace.txt"
    counts: Counter = Counter()
    lost = 0
    with open(f, errors="replace") as fh:
        for ln in fh:
            m = RE_TRACE_LOST.search(ln)
            if m:
                lost += int(m.group(1))
                continue
            m = RE_TRACE_SYSCALL.search(ln)
            if m:
                counts["syscall_entry"] += 1
                counts["syscall_exit"] += 1
                if m.group(1) == "getppid":
                    counts["getppid_entry"] += 1
                    counts["getppid_exit"] += 1
                continue
            m = RE_TRACE_EVENT.search(ln)
            if m:
                name = canonical(m.group(1))
                counts[name] += 1
                if name == "sched_process_exec" and f"/{WORKLOAD_BINARY}" in ln:
                    counts["exec_gb_work"] += 1
    return result(counts, lost, f.stat().st_size)
