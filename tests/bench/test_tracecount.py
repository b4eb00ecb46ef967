"""bench/harness/tracecount.py and guest_stats.py: the guest preset counts every tracer's
trace by name and checks the counts against what the workload made. Here the readers meet
real traces of this host's own kernel (a tracefs instance, perf record) of a workload whose
events are known, and the agreement check is shown to catch a count that is off.

Needs root, tracefs and perf (skipped otherwise); a few seconds.
"""
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from harness import guest_stats, tracecount

REPO = Path(__file__).resolve().parents[2]

TRACEFS = Path("/sys/kernel/tracing")
GB_WORK = REPO / "build" / "bench" / "guest" / "gb-work"
CALLS = 3000
OTHER_CALLS = 700  # getppid calls by another task in the same trace: not the workload's


@pytest.fixture
def gb_other(gb_work, tmp_path):
    """gb-work under another name: its exec is not the workload's, its calls are not either."""
    other = tmp_path / "gb-other"
    shutil.copy(gb_work, other)
    return other


def both(gb_work, gb_other) -> list[str]:
    """The workload and, at the same time, another task calling getppid."""
    return ["sh", "-c", f"{gb_other} getppid {OTHER_CALLS} & {gb_work} getppid {CALLS}; wait"]


@pytest.fixture(scope="module")
def gb_work():
    p = subprocess.run(["make", "-C", str(REPO / "bench" / "guest" / "workloads")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return GB_WORK


def needs_tracefs():
    if os.geteuid() != 0 or not (TRACEFS / "instances").is_dir():
        pytest.skip("needs root and tracefs")


def event_ids() -> dict[int, str]:
    ids = {}
    for e in ("raw_syscalls/sys_enter", "raw_syscalls/sys_exit", "sched/sched_process_exec",
              "sched/sched_switch"):
        ids[int((TRACEFS / "events" / e / "id").read_text())] = e.split("/")[1]
    return ids


def test_ftrace_raw_pages_of_this_kernel(gb_work, gb_other, tmp_path):
    """getppid N times under a tracefs instance, beside another task's getppid calls; its raw
    pages, read back, hold N entries and N exits of system call 110 by the task that exec'd
    gb-work (filename in a __data_loc, pid in the common fields), the other's apart."""
    needs_tracefs()
    inst = TRACEFS / "instances" / f"lttngbench-test-{os.getpid()}"
    inst.mkdir()
    readers = []
    try:
        for e in ("raw_syscalls/sys_enter", "raw_syscalls/sys_exit", "sched/sched_process_exec"):
            (inst / "events" / e / "enable").write_text("1")
        (inst / "tracing_on").write_text("1")
        p = subprocess.run(both(gb_work, gb_other), capture_output=True)
        (inst / "tracing_on").write_text("0")
        assert p.returncode == 0
        for cpu in sorted((inst / "per_cpu").glob("cpu*")):
            out = open(tmp_path / f"{cpu.name}.raw", "wb")
            readers.append(subprocess.Popen(["cat", str(cpu / "trace_pipe_raw")], stdout=out))
        time.sleep(1.0)
    finally:
        for r in readers:
            r.kill()
            r.wait()
        (inst / "tracing_on").write_text("0")
        inst.rmdir()
    c = tracecount.ftrace_raw(tmp_path, event_ids())
    assert c["by_name"]["getppid_entry"] == CALLS, c
    assert c["by_name"]["getppid_exit"] == CALLS, c
    assert c["by_name"]["exec_gb_work"] == 1, c
    assert c["by_name"]["getppid_other_entry"] >= OTHER_CALLS, c
    assert c["lost"] == 0 and c["bytes_per_event"] > 8, c


def test_perf_data_of_this_kernel(gb_work, gb_other, tmp_path):
    """perf record of the whole machine (-a, as in the guest): perf script's view counted
    the same way, the other task's getppid calls apart, a record perf wrote twice counted once."""
    if os.geteuid() != 0 or not shutil.which("perf"):
        pytest.skip("needs root and perf")
    p = subprocess.run(["perf", "record", "-q", "-a", "-m", "4M", "-e",
                        "raw_syscalls:sys_enter,raw_syscalls:sys_exit,sched:sched_process_exec",
                        "-o", str(tmp_path / "perf.data"), "--", *both(gb_work, gb_other)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    c = tracecount.perf_data(tmp_path)
    # On a busy host perf drops samples (PERF_RECORD_LOST_SAMPLES): then the counts must be
    # short by no more than it reported lost, as the guest preset's agreement check asks.
    b = c["by_name"]
    assert 0 < b["getppid_entry"] <= CALLS and CALLS - b["getppid_entry"] <= c["lost"], c
    assert 0 < b["getppid_exit"] <= CALLS and CALLS - b["getppid_exit"] <= c["lost"], c
    assert b.get("getppid_other_entry", 0) <= OTHER_CALLS + 1, c  # + the shell's own
    assert c["lost"] or b["getppid_other_entry"] >= OTHER_CALLS, c
    assert c["lost"] or "gb-other" in " ".join(c["other_getppid_by"]), c
    # perf 6.1 itself can write a block of records twice when the host is busy (see
    # test_perf_records_written_twice_are_counted_once): the copies are counted once, so with
    # nothing lost the counts are exact, and how many copies there were is said.
    assert c["lost"] or (b["getppid_entry"], b["getppid_exit"]) == (CALLS, CALLS), c
    print(f"\nperf record -a: {b['getppid_entry']} getppid entries, {c['lost']} lost, "
          f"{c['duplicate_records']} records written twice")


def test_perf_records_written_twice_are_counted_once():
    """perf record (perf 6.1) can write a block of the ring twice; the copies are the same
    records, but perf script may print a copy of an exec with another comm (the block's
    copied COMM record changed the task's name in between). Counted once, and said."""
    block = [
        "              sh   629 [000]    11.201239534:  sched:sched_process_exec: "
        "filename=/usr/local/bin/gb-work pid=629 old_pid=629",
        "         gb-work   629 [000]    11.201307486:   raw_syscalls:sys_enter: NR 110 ()",
        "         gb-work   629 [000]    11.201313354:    raw_syscalls:sys_exit: NR 110 = 1",
    ]
    copy = [block[0].replace("              sh", "         gb-work")] + block[1:]
    later = "         gb-work   629 [000]    11.201434916:   raw_syscalls:sys_enter: NR 110 ()"
    counts, others, lost, dups = tracecount.perf_script_counts(block + copy + [later])
    assert dups == 3 and lost == 0 and others == {}
    assert counts["exec_gb_work"] == 1 and counts["sched_process_exec"] == 1
    assert counts["getppid_entry"] == 2 and counts["getppid_exit"] == 1
    # the same event at another time, or on another CPU, is another record
    again = [block[1].replace("11.201307486", "11.201307487"), block[1].replace("[000]", "[001]")]
    counts, _, _, dups = tracecount.perf_script_counts(block + again)
    assert dups == 0 and counts["getppid_entry"] == 3


def test_page_reader_follows_the_layout():
    """A page as ring_buffer.c writes it: a small event, a time extend, a large event
    (length word), padding; a page that says events were missed before it, and how many."""
    small = struct.pack("<HBBi", 7, 0, 0, 1) + struct.pack("<q", 110) + bytes(4)  # 20 B
    big = struct.pack("<HBBi", 8, 0, 0, 1) + bytes(120)                          # 128 B
    data = struct.pack("<I", (len(small) // 4) | (5 << 5)) + small
    data += struct.pack("<II", 30 | (1 << 5), 0)                                  # time extend
    data += struct.pack("<II", 0 | (3 << 5), 4 + len(big)) + big
    data += struct.pack("<II", 29 | (1 << 5), 12) + bytes(8)   # padding: array[0] + 4 bytes
    commit = len(data) | tracecount.MISSED_EVENTS | tracecount.MISSED_STORED
    page = struct.pack("<QQ", 1, commit) + data + struct.pack("<Q", 42)
    page += bytes(4096 - len(page))
    got = list(tracecount.ftrace_page_events(page))
    assert [g[0] for g in got] == [4 + len(small), 8 + len(big), "missed"]
    assert got[0][1][:2] == struct.pack("<H", 7) and got[1][1][:2] == struct.pack("<H", 8)
    assert got[2][1] == 42


def run(config, workload, rep, by_name, lost=0, ops=100):
    return {"config": config, "workload": workload, "rep": rep, "ops": ops,
            "counts": {"by_name": by_name, "lost": lost, "events": sum(by_name.values())}}


def test_agreement_catches_a_count_that_is_off():
    ok = run("ivt-flight", "getppid", 1, {"getppid_entry": 100, "getppid_exit": 100})
    short_but_lost = run("ft-pipe", "getppid", 1, {"getppid_entry": 97, "getppid_exit": 100},
                         lost=3)
    short = run("perf-trace", "getppid", 1, {"getppid_entry": 90, "getppid_exit": 90})
    execs = run("lttng-discard", "forkexec", 1, {"exec_gb_work": 101})
    pp = run("ft-ring", "pingpong", 1, {"sched_switch": 150, "sched_wakeup": 120})
    table, bad = guest_stats.agreement([ok, short_but_lost, short, execs, pp])
    assert table["getppid"]["ivt-flight"][0]["agrees"]
    assert table["getppid"]["ft-pipe"][0]["agrees"]
    assert not table["getppid"]["perf-trace"][0]["agrees"]
    assert table["forkexec"]["lttng-discard"][0]["agrees"]
    assert not table["pingpong"]["ft-ring"][0]["agrees"]  # 150 < 2 x 100 switches
    assert len(bad) == 2 and "perf-trace" in bad[0]
