"""Trace Compass's Disk I/O analysis on the ftrace relay's block events (one boot).

The guest (QEMU, the Debian kernel, a virtio-blk disk, ivtrace.ko ftrace=1 with the relay it
starts) boots with `trace_event=block` and `trace_clock=x86-tsc`: ftrace records block
requests, the relay moves its pages through the region, `ivtrace record` decodes them into
the kernel trace as LTTng's block_rq_* events (docs/ftrace.md), beside the native probes'
events and state dump, which names the disk. A workload reads and writes the disk with
direct I/O of known sizes. Trace Compass 6.2 opens the kernel trace as an LTTng kernel trace
and runs InputOutputAnalysisModule (TcReport.java `disks`): the disk is there by name, with
its requests and at least the sectors the workload moved.
"""
import pytest

from e2e import guest as g

READ_SECTORS = 64 * 128       # dd: 64 reads of 64 KiB
WRITE_SECTORS = 32 * 64       # dd: 32 writes of 32 KiB
REQUESTS = 64 + 32

SCRIPT = r"""
dd if=/dev/vda of=/dev/null bs=64k count=64 iflag=direct 2>/dev/null
echo "TC: read rc=$?"
dd if=/dev/zero of=/dev/vda bs=32k count=32 seek=512 oflag=direct 2>/dev/null
echo "TC: write rc=$?"
sleep 1
killall ivtrace-ftrace
while pidof ivtrace-ftrace >/dev/null; do sleep 0.1; done
rmmod ivtrace
echo "TC: rmmod rc=$?"
"""


@pytest.fixture(scope="module")
def rec(tmp_path_factory, guest):
    tmp = tmp_path_factory.mktemp("tc-ftrace-disks")
    disk = tmp / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(64 << 20)
    shm = g.shm_path("tc-ftrace")
    out = tmp / "rec"
    recorder = g.Recorder(shm, out)
    try:
        with g.ivtvm.VM(SCRIPT, shm=str(shm), shm_size="16M", shm_clear=True, smp=2,
                        modules=["ivtrace"], modopts={"ivtrace": "ftrace=1"},
                        add=guest.add("ivtrace.ko", "ivtrace-ftrace"),
                        append="trace_clock=x86-tsc trace_event=block",
                        extra_args=["-drive", f"file={disk},if=virtio,format=raw"],
                        log=str(tmp / "console.log")) as vm:
            r = vm.wait(timeout=g.TIMEOUT)
        summary = recorder.wait(timeout=120, boot=r)
    finally:
        recorder.stop()
        shm.unlink(missing_ok=True)
    return {"out": out, "boot": r, "summary": summary, "rc": recorder.rc}


@pytest.fixture(scope="module")
def disks(rec, tracecompass):
    report = tracecompass.disks(rec["out"] / "kernel")
    print(f"\nTrace Compass disks: {report['disks']}")
    return report


def test_the_recording_is_clean(rec):
    r = rec["boot"]
    text = r.console_text
    assert r.ok, r.summary() + "\n" + r.tail(40)
    for step in ("read", "write", "rmmod"):
        assert f"TC: {step} rc=0" in text, r.tail(40)
    assert rec["rc"] == 0
    assert rec["summary"]["ftrace"]["events_by_name"].get("block_rq_issue", 0) >= REQUESTS


def test_disk_io_analysis_shows_the_requests(disks):
    named = {d["name"]: d for d in disks["disks"] if d["name"]}
    assert "vda" in named, disks["disks"]
    vda = named["vda"]
    assert vda["driver_requests"] >= REQUESTS, vda
    assert vda["sectors_read"] >= READ_SECTORS, vda
    assert vda["sectors_written"] >= WRITE_SECTORS, vda
