"""The VM view (DIR/vm, on the guest's clock) in Trace Compass (one boot).

`ivtrace serve --host-events` records a guest running the demo workload; at the end it
derives the VM view (the vCPUs' preempted/blocked intervals, docs/kvm.md "The VM view") into
OUT/<name>/vm, a CTF trace whose clock is the guest traces' own. Trace Compass opens it in an
experiment with the host trace (one trace per clock: the guest's and the host's): it reads
every event babeltrace2 reads, at the same times, inside the recording. (Trace Compass 6.2
has no VM analysis of its own; docs/kvm.md says what it would need and what the traces carry.)
"""
import subprocess
from pathlib import Path

import pytest

from tracecompass import tc as t

SECONDS = 3
NAME = "tcvm"
SLACK_NS = 120 * 1_000_000_000
READERS_AGREE_NS = 1_000


@pytest.fixture(scope="module")
def rec(tmp_path_factory, tc_add):
    if not Path("/sys/kernel/tracing/trace_marker").exists():  # host events need tracefs
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True)
    return t.record_serve(tmp_path_factory.mktemp("tc-vm"), tc_add, SECONDS, NAME,
                          extra=("--host-events",))


@pytest.fixture(scope="module")
def exp(rec, tracecompass):
    return tracecompass.experiment([rec["out"] / "host", rec["out"] / "vm"])


def test_the_recording_has_a_vm_view(rec):
    assert rec["rc"] == 0, rec["stderr"]
    assert (rec["out"] / "vm" / "metadata").is_file(), rec["stderr"]
    vm = rec["summaries"][NAME][-1]["serve"]["vm_view"]
    assert vm["intervals"] > 0 and vm["read_errors"] == [], vm
    meta = (rec["out"] / "vm" / "metadata").read_text()
    guest = t.clock_block(rec["out"] / "kernel")
    mine = t.clock_block(rec["out"] / "vm")
    for key in ("name", "uuid", "freq", "offset_s", "offset"):
        assert mine[key] == guest[key], key
    assert 'domain = "vm";' in meta


def test_trace_compass_reads_the_vm_view_as_babeltrace2_does(rec, exp):
    host, vm = exp["traces"]
    print(f"\nTrace Compass: vm {vm['type']}, {vm['events']:,} events, {t.iso(vm['start_ns'])} .. "
          f"{t.iso(vm['end_ns'])}; host {host['events']:,} events")
    first, last = t.babeltrace2_times(rec["out"] / "vm")
    assert vm["events"] > 0
    assert abs(vm["start_ns"] - first) <= READERS_AGREE_NS
    assert abs(vm["end_ns"] - last) <= READERS_AGREE_NS
    lo, hi = rec["before_ns"] - SLACK_NS, rec["after_ns"] + SLACK_NS
    assert lo <= vm["start_ns"] <= vm["end_ns"] <= hi
    overlap = min(vm["end_ns"], host["end_ns"]) - max(vm["start_ns"], host["start_ns"])
    assert overlap > 0.5e9, "the vCPUs' intervals lie where the host saw the vCPU threads"
