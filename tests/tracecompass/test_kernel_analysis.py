"""Trace Compass's LTTng kernel analysis on a real guest recording (one boot).

The guest (QEMU, the Debian kernel, ivtrace.ko with vm/demo's event groups) runs the demo
workload (vm/guest/workload/demo.sh: named children, exec'd workers, file work, user events)
for SECONDS while `ivtrace record` drains it, as `make demo` does. Trace Compass 6.2 opens
the kernel trace as an LTTng kernel trace and runs KernelAnalysisModule (TcReport.java);
its state system must hold the recording's real date, named threads, and per-CPU syscalls,
IRQs and softirqs. babeltrace 1 and babeltrace2 read the same clock block to the same dates.
"""
import pytest

from tracecompass import tc as t

SECONDS = 4
# Host clock vs trace: the mapping's error is microseconds to a millisecond; the slack covers
# boot and shutdown around the workload.
SLACK_NS = 120 * 1_000_000_000
READERS_AGREE_NS = 1_000  # babeltrace 1 and Trace Compass round through a double: ~0.25 us


@pytest.fixture(scope="module")
def rec(tmp_path_factory, tc_add):
    return t.record_demo(tmp_path_factory.mktemp("tc-demo"), tc_add, SECONDS)


@pytest.fixture(scope="module")
def tc_kernel(rec, tracecompass):
    report = tracecompass.kernel(rec["out"] / "kernel")
    tr = report["trace"]
    print(f"\nTrace Compass: {tr['type']} ({tr['event_layout']}), {tr['events']:,} events, "
          f"{t.iso(tr['start_ns'])} .. {t.iso(tr['end_ns'])}")
    return report


def test_the_recording_is_clean(rec):
    r = rec["boot"]
    assert r.ok and r.exit_code == 0, r.summary() + "\n" + r.tail(40)
    assert "TC: workload rc=0" in r.console_text and "TC: rmmod rc=0" in r.console_text
    assert rec["rc"] == 0, rec["stderr"]
    assert rec["summary"]["stop_reason"] == "region closed by its owner"


def test_trace_compass_opens_an_lttng_kernel_trace(tc_kernel):
    tr = tc_kernel["trace"]
    assert tr["type"] == "LttngKernelTrace"
    assert tr["event_layout"] == "Lttng29EventLayout"  # tracer lttng-modules 2.13
    assert tr["events"] > 10_000


def test_the_trace_starts_at_the_recordings_real_date(rec, tc_kernel):
    """Not January 1970: Trace Compass < 6.3 reads the clock's `offset` only."""
    tr, ss = tc_kernel["trace"], tc_kernel["state_system"]
    lo, hi = rec["before_ns"] - SLACK_NS, rec["after_ns"] + SLACK_NS
    print(f"\nhost clock {t.iso(rec['before_ns'])} .. {t.iso(rec['after_ns'])}; Trace Compass "
          f"{t.iso(tr['start_ns'])} .. {t.iso(tr['end_ns'])}")
    assert lo <= tr["start_ns"] < tr["end_ns"] <= hi, (t.iso(tr["start_ns"]), t.iso(lo))
    assert lo <= ss["start_ns"] < ss["end_ns"] <= hi
    assert tr["end_ns"] - tr["start_ns"] >= 1_000_000_000  # demo.sh's rounds last >= 1 s


def test_at_least_95_percent_of_threads_are_named(tc_kernel):
    # "-1" is Trace Compass's placeholder for "no thread known yet" on a CPU: an interrupt
    # before the CPU's first sched_switch is charged to Threads/-1, for LTTng's traces too.
    threads = [x for x in tc_kernel["threads"] if x["attribute"] != "-1"]
    named = [x for x in threads if x.get("name")]
    unnamed = [x["attribute"] for x in threads if not x.get("name")]
    print(f"\n{len(named)} of {len(threads)} threads named; unnamed: {unnamed[:20]}")
    assert len(threads) >= 20
    assert len(named) >= 0.95 * len(threads), unnamed
    names = {x["name"] for x in named}
    # the workload's named children and exec'd workers (vm/guest/workload/demo.sh)
    assert {"db-writer", "web-worker", "cache-sweeper", "compress-job", "report-gen"} <= names


def test_every_cpu_shows_system_calls_and_softirqs(tc_kernel):
    cpus = tc_kernel["cpus"]
    for cpu, c in sorted(cpus.items()):
        print(f"\nCPU {cpu}: states {c['states']}, irqs {c['irqs']}, softirqs {c['softirqs']}, "
              f"{c['current_threads']} threads ran", end="")
    assert len(cpus) == 2
    for cpu, c in cpus.items():
        assert c["states"].get("syscall", 0) > 0, (cpu, c)
        assert c["states"].get("usermode", 0) > 0, (cpu, c)
        assert c["states"].get("softirq", 0) > 0 and c["softirqs"], (cpu, c)
        assert c["current_threads"] > 1, (cpu, c)


def test_system_calls_are_named(tc_kernel):
    calls = tc_kernel["syscalls"]
    print(f"\n{len(calls)} system calls: {sorted(calls)}")
    assert {"read", "write", "openat", "close", "execve", "wait4", "clock_nanosleep"} <= set(calls)


def test_irqs_are_seen(tc_kernel):
    irqs = {cpu: c["irqs"] for cpu, c in tc_kernel["cpus"].items() if c["irqs"]}
    assert irqs, tc_kernel["cpus"]
    assert any(c["states"].get("irq", 0) for c in tc_kernel["cpus"].values())


def test_every_cpu_shows_irqs(tc_kernel):
    """Device IRQs all land on one vCPU under TCG (the serial port's on vCPU 1), but every CPU
    takes local timer interrupts and IPIs: ivtrace.ko writes them as lttng-modules does
    (x86_irq_vectors_local_timer_entry/exit, ...), and Trace Compass shows each vector as an
    IRQ of the CPU it ran on."""
    for cpu, c in tc_kernel["cpus"].items():
        assert c["irqs"], f"CPU {cpu}: no IRQ in Trace Compass's state system: {c}"
        local_timer = 0xEC  # Linux's LOCAL_TIMER_VECTOR on x86
        assert str(local_timer) in c["irqs"], (cpu, sorted(c["irqs"]))
    assert any(c["states"].get("irq", 0) for c in tc_kernel["cpus"].values())


@pytest.mark.parametrize("sub", ["kernel", "user"])
def test_babeltrace_1_2_and_trace_compass_agree_on_the_dates(rec, tracecompass, tc_kernel, sub):
    d = rec["out"] / sub
    clock = t.clock_block(d)
    assert clock["offset_s"] == "0", clock  # the whole offset in cycles (see the metadata)
    bt2_first, bt2_last = t.babeltrace2_times(d)
    bt1_first, bt1_last = t.babeltrace1_times(d)
    tr = tc_kernel["trace"] if sub == "kernel" else \
        tracecompass.experiment([d])["traces"][0]
    print(f"\n{sub}: babeltrace2 {bt2_first} .. {bt2_last}; babeltrace 1 {bt1_first - bt2_first:+d} "
          f"/ {bt1_last - bt2_last:+d} ns; Trace Compass {tr['start_ns'] - bt2_first:+d} / "
          f"{tr['end_ns'] - bt2_last:+d} ns")
    assert rec["before_ns"] - SLACK_NS <= bt2_first < bt2_last <= rec["after_ns"] + SLACK_NS
    assert abs(bt1_first - bt2_first) <= READERS_AGREE_NS
    assert abs(bt1_last - bt2_last) <= READERS_AGREE_NS
    assert abs(tr["start_ns"] - bt2_first) <= READERS_AGREE_NS
    assert abs(tr["end_ns"] - bt2_last) <= READERS_AGREE_NS


@pytest.mark.parametrize("sub,prefix", [("kernel", "sched_switch"), ("user", "")])
def test_trace_compass_shows_every_timestamp_to_the_nanosecond(rec, tracecompass, sub, prefix):
    """Nanosecond resolution, not only the date: Trace Compass's time of every sched_switch
    (kernel trace) or every event (user trace) equals babeltrace2's (exact integer arithmetic
    from the clock block) to the ns, and its times are not all multiples of 256 ns (the step
    of a double near 1.8e18 ns). Both traces count nanoseconds since the epoch on a 1 GHz
    clock with offset 0 (docs/ctf.md, "Time"): Trace Compass 6.2 scales no value through a
    double at 1 GHz."""
    d = rec["out"] / sub
    assert t.clock_block(d)["freq"] == "1000000000"
    tc_ns = sorted(e["ns"] for e in tracecompass.events(d, prefix)["matched"]
                   if e["name"].startswith(prefix))
    bt2_ns = sorted(t.babeltrace2_event_times(d, prefix or None))
    step256 = sum(1 for ns in tc_ns if ns % 256 == 0)
    differ = [(a, b) for a, b in zip(tc_ns, bt2_ns) if a != b]
    print(f"\n{sub} {prefix or 'events'}: Trace Compass {len(tc_ns):,}, babeltrace2 "
          f"{len(bt2_ns):,}; multiples of 256 ns in Trace Compass {step256:,}; times that "
          f"differ {len(differ):,}"
          + (f", first {differ[0][0] - differ[0][1]:+d} ns" if differ else ""))
    assert len(tc_ns) == len(bt2_ns) > 100
    assert step256 < len(tc_ns) / 16, "Trace Compass rounds to 256 ns"
    assert not differ, f"{len(differ)} of {len(tc_ns)} times differ from babeltrace2's"


def test_babeltrace_1_and_2_agree_on_every_user_event_to_the_nanosecond(rec):
    """The user trace's values are nanoseconds at 1 GHz (the drain rewrites them in place):
    babeltrace 1, which converts through a double at any other frequency, prints babeltrace2's
    time for every event."""
    d = rec["out"] / "user"
    bt1, bt2 = t.babeltrace1_event_times(d), t.babeltrace2_event_times(d)
    differ = [(a, b) for a, b in zip(sorted(bt1), sorted(bt2)) if a != b]
    print(f"\nuser: babeltrace 1 {len(bt1):,} events, babeltrace2 {len(bt2):,}; "
          f"times that differ {len(differ):,}")
    assert len(bt1) == len(bt2) > 100
    assert not differ, f"{len(differ)} of {len(bt1)} times differ, first {differ[0]}"
