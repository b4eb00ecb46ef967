"""Guest and host traces of one `ivtrace serve` recording, opened together in Trace Compass
(one boot).

`ivtrace serve` records a guest (QEMU with ivshmem-doorbell, ivtrace.ko, the demo workload)
into OUT/<name>/{kernel,user,host}: the guest's clock maps its TSC onto host time (ping-pong
through the region), the host trace counts host nanoseconds. Trace Compass opens the guest
kernel trace and the host trace as one experiment (TcReport.java): both must sit at the
recording's real date and overlap in time, as babeltrace 1 and babeltrace2 also read them.
"""
import pytest

from tracecompass import tc as t

SECONDS = 3
NAME = "tcexp"
SLACK_NS = 120 * 1_000_000_000
READERS_AGREE_NS = 1_000


@pytest.fixture(scope="module")
def rec(tmp_path_factory, tc_add):
    return t.record_serve(tmp_path_factory.mktemp("tc-serve"), tc_add, SECONDS, NAME)


@pytest.fixture(scope="module")
def exp(rec, tracecompass):
    report = tracecompass.experiment([rec["out"] / "kernel", rec["out"] / "host"])
    for tr in report["traces"]:
        print(f"\nTrace Compass: {tr['path']}: {tr['type']}, {tr['events']:,} events, "
              f"{t.iso(tr['start_ns'])} .. {t.iso(tr['end_ns'])}", end="")
    return report


def test_the_serve_recording_is_clean(rec):
    r = rec["boot"]
    assert r.ok and r.exit_code == 0, r.summary() + "\n" + r.tail(40)
    assert "TC: workload rc=0" in r.console_text
    assert rec["rc"] == 0, rec["stderr"]
    assert list(rec["summaries"]) == [NAME], rec["stderr"]
    for sub in ("kernel", "user", "host"):
        assert (rec["out"] / sub / "metadata").is_file(), sub


def test_both_traces_are_at_the_recordings_real_date(rec, exp):
    lo, hi = rec["before_ns"] - SLACK_NS, rec["after_ns"] + SLACK_NS
    kernel, host = exp["traces"]
    assert kernel["type"] == "LttngKernelTrace" and kernel["events"] > 1000
    assert host["events"] > 0
    for tr in exp["traces"]:
        assert lo <= tr["start_ns"] <= tr["end_ns"] <= hi, (tr["path"], t.iso(tr["start_ns"]))


def test_guest_and_host_traces_overlap_in_time(exp):
    kernel, host = exp["traces"]
    overlap = min(kernel["end_ns"], host["end_ns"]) - max(kernel["start_ns"], host["start_ns"])
    print(f"\noverlap {overlap / 1e9:.3f} s of guest {(kernel['end_ns'] - kernel['start_ns']) / 1e9:.3f}"
          f" s and host {(host['end_ns'] - host['start_ns']) / 1e9:.3f} s")
    assert overlap > 0.5e9
    whole = exp["experiment"]
    assert whole["start_ns"] == min(kernel["start_ns"], host["start_ns"])
    assert whole["end_ns"] == max(kernel["end_ns"], host["end_ns"])
    assert whole["events"] == kernel["events"] + host["events"]


def test_every_reader_puts_the_host_trace_at_the_same_time(rec, exp):
    d = rec["out"] / "host"
    host = exp["traces"][1]
    bt2_first, bt2_last = t.babeltrace2_times(d)
    bt1_first, bt1_last = t.babeltrace1_times(d)
    assert (bt1_first, bt1_last) == (bt2_first, bt2_last)  # a 1 GHz clock: no rounding
    assert abs(host["start_ns"] - bt2_first) <= READERS_AGREE_NS
    assert abs(host["end_ns"] - bt2_last) <= READERS_AGREE_NS


def test_every_reader_puts_the_guest_trace_at_the_same_time(rec, exp):
    d = rec["out"] / "kernel"
    kernel = exp["traces"][0]
    assert t.clock_block(d)["offset_s"] == "0"
    bt2_first, bt2_last = t.babeltrace2_times(d)
    bt1_first, bt1_last = t.babeltrace1_times(d)
    for got in (bt1_first - bt2_first, bt1_last - bt2_last, kernel["start_ns"] - bt2_first,
                kernel["end_ns"] - bt2_last):
        assert abs(got) <= READERS_AGREE_NS
