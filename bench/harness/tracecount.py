"""Counting the events of every tracer's trace, by the same names, on the host (preset guest).

Each reader is the tracer's own or an independent one: babeltrace2's Python bindings (bt2)
for the CTF traces of LTTng and ivtrace, `perf script` for perf.data, `perf trace`'s text,
and a reader of ftrace's raw ring-buffer pages (the page and event-header layout the guest
kernel's tracefs describes in events/header_page and header_event, Linux 6.1). Names are
mapped to one vocabulary: the kernel tracepoints' own (sched_switch, ..., task_rename),
syscall_entry / syscall_exit for sys_enter / sys_exit and LTTng's per-system-call events,
and besides, the events whose number the workloads fix: `getppid_entry` / `getppid_exit`
(system call 110 made by the workload's own process) and `exec_gb_work` (sched_process_exec
of the workload binary, gb-work). Every result says how many events the tracer reported lost.

Every tracer traces the whole guest, so a getppid counts as the workload's only when the task
that made it is one that exec'd gb-work: whatever else in the guest calls getppid (a daemon, a
tracer's own helper) would otherwise be charged to the workload in one tracer's trace and not
in another's. Those others are kept apart as `getppid_other_entry` / `_exit`, with `other_getppid_by`
(task -> calls) saying who made them. How the task is known differs by trace: perf's samples
and ftrace's common fields carry it; the CTF traces (LTTng, ivtrace) carry the CPU in each
packet, so the reader follows each CPU's current task through sched_switch (next_tid) and
sched_process_exec (tid).
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
COMMON_PID_OFFSET = 4  # common fields: u16 type, u8 flags, u8 preempt_count, s32 pid
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


class Workload:
    """The workload's tasks (those that exec'd gb-work) and the getppid calls by task, so that
    only the workload's own are counted as getppid_entry / getppid_exit."""

    def __init__(self):
        self.tasks: set = set()
        self.getppid: Counter = Counter()  # (task, "entry" | "exit") -> n
        self.names: dict = {}  # task -> its name, where the trace says it

    def exec_of_workload(self, task) -> None:
        self.tasks.add(task)

    def call(self, task, phase: str, name: str | None = None) -> None:
        self.getppid[(task, phase)] += 1
        if name:
            self.names[task] = name

    def into(self, counts: Counter) -> dict:
        """Adds getppid_{entry,exit} (the workload's) and getppid_other_* to counts; returns
        who made the others (task -> calls) for the record."""
        others: Counter = Counter()
        for (task, phase), n in self.getppid.items():
            if task in self.tasks:
                counts["getppid_" + phase] += n
            else:
                counts["getppid_other_" + phase] += n
                who = f"{self.names[task]}/{task}" if task in self.names else str(task)
                others[who] += n if phase == "entry" else 0
        return dict(others.most_common(8))


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file())


# --------------------------------------------------------------------------- CTF (bt2)

def ctf(path: Path, stream_glob: str = "**/*") -> dict:
    """A CTF trace (LTTng's kernel trace, ivtrace's): events by name and the discarded-events
    counts of its packets, read with babeltrace2's bindings."""
    import bt2  # python3-bt2, for /usr/bin/python3 (the harness's interpreter)
    counts: Counter = Counter()
    wl, current = Workload(), {}  # current: CPU -> the tid running there, as far as seen
    discarded = 0
    for msg in bt2.TraceCollectionMessageIterator(str(path)):
        if type(msg) is bt2._EventMessageConst:
            ctf_event(msg.event, counts, wl, current)
        elif type(msg) is bt2._DiscardedEventsMessageConst:
            discarded += msg.count or 0
    others = wl.into(counts)
    data = [p for p in Path(path).rglob("*") if p.is_file() and "metadata" not in p.name
            and p.suffix not in (".idx", ".json")]
    return result(counts, discarded, sum(p.stat().st_size for p in data),
                  other_getppid_by=others)


def ctf_cpu(event):
    """The CPU of an event: its packet context's cpu_id (LTTng and ivtrace both write it),
    else its stream (one stream per CPU)."""
    pc = event.packet.context_field if event.packet else None
    if pc is not None and "cpu_id" in pc:
        return int(pc["cpu_id"])
    return ("stream", event.stream.id)


def ctf_event(event, counts: Counter, wl: Workload, current: dict) -> None:
    name = event.name
    counts[canonical(name)] += 1
    if name == "sched_switch":
        current[ctf_cpu(event)] = int(event.payload_field["next_tid"])
    elif name == "sched_process_exec":
        tid = int(event.payload_field["tid"])
        current[ctf_cpu(event)] = tid
        if str(event.payload_field["filename"]).endswith(WORKLOAD_BINARY):
            counts["exec_gb_work"] += 1
            wl.exec_of_workload(tid)
    elif name in ("syscall_entry_getppid", "syscall_exit_getppid"):
        wl.call(current.get(ctf_cpu(event), "unknown"), name.split("_")[1])


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
    wl = Workload()
    nbytes = missed = 0
    for f in sorted(Path(path).glob("cpu*.raw")):
        data = f.read_bytes()
        for at in range(0, len(data) - PAGE_HEADER + 1, 4096):
            for length, payload in ftrace_page_events(data[at:at + 4096]):
                if length == "missed":
                    missed += payload
                    continue
                nbytes += length
                ftrace_event(payload, ids, counts, wl)
    others = wl.into(counts)
    return result(counts, missed, nbytes, file_bytes=dir_bytes(path), other_getppid_by=others)


def ftrace_event(payload: bytes, ids: dict[int, str], counts: Counter, wl: Workload) -> None:
    etype, = struct.unpack_from("<H", payload, 0)
    name = canonical(ids.get(etype, f"id{etype}"))
    counts[name] += 1
    if len(payload) < 16:
        return
    pid, = struct.unpack_from("<i", payload, COMMON_PID_OFFSET)
    if name in ("syscall_entry", "syscall_exit"):
        nr, = struct.unpack_from("<q", payload, SYSCALL_ID_OFFSET)
        if nr == GETPPID_NR:
            wl.call(pid, name.split("_")[1])
    elif name == "sched_process_exec" and exec_of_workload(payload):
        counts["exec_gb_work"] += 1
        wl.exec_of_workload(pid)


# --------------------------------------------------------------------------- perf

RE_PERF_NR = re.compile(r"NR (\d+) ([(=])")
# `perf script --ns -F comm,tid,cpu,time,event,trace`: "  gb-work   123 [001]  56.789012345:
# raw_syscalls:sys_enter: NR 110 (...)"; with ns times two real records never print alike
RE_PERF_SAMPLE = re.compile(r"^\s*(.*?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+?):?\s(.*)$")


def perf_data(path: Path) -> dict:
    """perf.data, read with this host's `perf script` (the guest's perf version): samples
    by event, getppid's (by task), and the PERF_RECORD_LOST counts; records perf record wrote
    twice are counted once (perf_script_counts)."""
    f = Path(path) / "perf.data"
    p = subprocess.run(["perf", "script", "-i", str(f), "--ns", "-F",
                        "comm,tid,cpu,time,event,trace", "--show-lost-events"],
                       capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"perf script -i {f} failed: {p.stderr.strip()[-500:]}")
    counts, others, lost, duplicates = perf_script_counts(p.stdout.splitlines())
    lost_samples = perf_lost_samples(f)
    return result(counts, lost + lost_samples, f.stat().st_size, other_getppid_by=others,
                  duplicate_records=duplicates, duplicates_counted_once=True,
                  lost_records_events=lost,
                  lost_samples=lost_samples)


def perf_script_counts(lines) -> tuple[Counter, dict, int, int]:
    """`perf script --ns -F comm,tid,cpu,time,event,trace` lines -> counts by name, who made
    the getppid calls that are not the workload's, PERF_RECORD_LOST events, copies skipped.

    The guest's perf record (perf 6.1, perf_mmap__push) reads the ring's head, then reads it
    again to decide how much to write, and keeps the first value as where the next write
    starts: when the kernel added records between the two reads, perf.data holds them twice
    (seen on a loaded host: 20 to 589 records in a contiguous block, the same bytes twice).
    A copy is the same record: same task, CPU, ns time, event and fields. Only the comm that
    perf script prints is not from the record but from the task's state as perf script has
    rebuilt it, and the block's copies of COMM/FORK/EXIT records change that state, so two
    copies of an exec can print different comms: the 2026-11-24T131908 run counted such
    copies twice (exec_gb_work 202 of 201, one sys_exit more than sys_enter, where whole
    lines were compared). So a copy is recognised without its comm."""
    counts: Counter = Counter()
    wl, seen = Workload(), set()
    lost = duplicates = 0
    for ln in lines:
        if "PERF_RECORD_LOST" in ln:
            lost += int(ln.split()[-1])
            continue
        m = RE_PERF_SAMPLE.match(ln)
        if not m:
            continue
        key = m.groups()[1:]  # tid, cpu, time, event, fields: everything but the comm
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        perf_sample(m, counts, wl)
    return counts, wl.into(counts), lost, duplicates


RE_PERF_LOST_SAMPLES = re.compile(r"^\s*LOST_SAMPLES events:\s+(\d+)\s*$")


def perf_lost_samples(f: Path) -> int:
    """Samples the kernel could not write (PERF_RECORD_LOST_SAMPLES, which `perf script
    --show-lost-events` does not print): `perf report --stats` sums them per event, on
    lines without a percentage (the aggregated lines count records, not samples)."""
    p = subprocess.run(["perf", "report", "-i", str(f), "--stats"], capture_output=True,
                       text=True)
    if p.returncode:
        raise RuntimeError(f"perf report --stats -i {f} failed: {p.stderr.strip()[-500:]}")
    return sum(int(m.group(1)) for m in map(RE_PERF_LOST_SAMPLES.match, p.stdout.splitlines())
               if m)


def perf_sample(m: re.Match, counts: Counter, wl: Workload) -> None:
    comm, tid, name, rest = m.group(1), int(m.group(2)), canonical(m.group(5)), m.group(6)
    counts[name] += 1
    nr = RE_PERF_NR.search(rest) if name.startswith("syscall_") else None
    if nr and int(nr.group(1)) == GETPPID_NR:
        wl.call(tid, "entry" if nr.group(2) == "(" else "exit", comm)
    elif name == "sched_process_exec" and f"/{WORKLOAD_BINARY} " in rest:
        counts["exec_gb_work"] += 1
        wl.exec_of_workload(tid)


RE_TRACE_SYSCALL = re.compile(r"\): \S+ (\w+)\(")
RE_TRACE_EVENT = re.compile(r" (\w+:\w+)\(")
RE_TRACE_LOST = re.compile(r"LOST (\d+) events")
RE_TRACE_TASK = re.compile(r"(\S*)/(\d+) ")  # the first "comm/tid " of a line: its task


def perf_trace(path: Path) -> dict:
    """`perf trace -o FILE` text: one line per system call (entry and exit: two events), one
    per tracepoint event, and `LOST n events!` lines."""
    f = Path(path) / "trace.txt"
    counts: Counter = Counter()
    wl = Workload()
    lost = 0
    with open(f, errors="replace") as fh:
        for ln in fh:
            m = RE_TRACE_LOST.search(ln)
            if m:
                lost += int(m.group(1))
                continue
            perf_trace_line(ln, counts, wl)
    others = wl.into(counts)
    return result(counts, lost, f.stat().st_size, other_getppid_by=others)


def perf_trace_line(ln: str, counts: Counter, wl: Workload) -> None:
    task = RE_TRACE_TASK.search(ln)
    comm, tid = (task.group(1), int(task.group(2))) if task else (None, "unknown")
    m = RE_TRACE_SYSCALL.search(ln)
    if m:
        counts["syscall_entry"] += 1
        counts["syscall_exit"] += 1
        if m.group(1) == "getppid":
            wl.call(tid, "entry", comm)
            wl.call(tid, "exit", comm)
        return
    m = RE_TRACE_EVENT.search(ln)
    if m:
        name = canonical(m.group(1))
        counts[name] += 1
        if name == "sched_process_exec" and f"/{WORKLOAD_BINARY}" in ln:
            counts["exec_gb_work"] += 1
            wl.exec_of_workload(tid)
