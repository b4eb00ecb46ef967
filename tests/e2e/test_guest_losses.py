"""Every lost event of a real guest reaches a CTF reader (one boot, `ivtrace record`).

The guest (QEMU, the Debian kernel, ivtrace.ko with every event group) has rings far too
small for what it does: 2 x 4 KiB per channel, one user channel. It runs the demo workload
(vm/guest/workload/demo.sh) with the syscall group on, so the kernel channels overflow
(writer loss `full`); three ivtrace-loadgen threads write at once through /dev/ivtrace while
there is one user channel (`no_channel`); one writes events larger than a packet
(`too_big`). `ivtrace record` drains it live. babeltrace2 (Python bindings and the command)
must announce as many discarded events as `ivtrace report` recorded (tests/losses.py); a
snapshot of the region left behind must too.
"""
from pathlib import Path

import pytest

import losses
from e2e import guest as g

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "vm" / "guest" / "workload"
SECONDS = 3
MODOPTS = ("events=sched,irq,timer,kmem,syscall,printk subbuf_size=4096 nr_subbufs=2 "
           "user_channels=1")

GUEST_SCRIPT = f"""
/workload/demo.sh {SECONDS} > /dev/null
echo "LOSSES: demo rc=$?"
ivtrace-loadgen-static --shm /dev/ivtrace --threads 3 --events 300 --rate 1000 --size 16
echo "LOSSES: three writers rc=$?"
ivtrace-loadgen-static --shm /dev/ivtrace --threads 1 --events 5 --size 5000
echo "LOSSES: too big rc=$?"
rmmod ivtrace
echo "LOSSES: rmmod rc=$?"
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, e2e_add):
    tmp = tmp_path_factory.mktemp("guest-losses")
    shm = g.shm_path("losses")
    rec = g.Recorder(shm, tmp / "record")
    add = list(e2e_add) + [f"{WORKLOAD / 'demo.sh'}:/workload/"]
    try:
        with g.ivtvm.VM(GUEST_SCRIPT, shm=str(shm), shm_size="16M", shm_clear=True, smp=2,
                        modules=["ivtrace"], modopts={"ivtrace": MODOPTS}, add=add,
                        log=str(tmp / "console.log")) as vm:
            r = vm.wait(timeout=g.TIMEOUT + SECONDS)
        summary = rec.wait(timeout=60, boot=r)
        snap = g.snapshot(shm, tmp / "snapshot")
    finally:
        rec.stop()
        shm.unlink(missing_ok=True)
    return {"boot": r, "summary": summary, "snapshot": snap, "out": tmp / "record",
            "snap_out": tmp / "snapshot"}


def test_the_guest_ran_clean(run):
    r = run["boot"]
    text = r.console_text
    for step in ("demo", "three writers", "too big", "rmmod"):
        assert f"LOSSES: {step} rc=0" in text, r.explain(60)
    assert not r.kernel_problems, r.kernel_problems


def test_every_loss_of_the_recording_is_a_discarded_event(run):
    a = losses.assert_every_loss_is_in_the_ctf(run["out"], want=("full", "no_channel",
                                                                  "too_big"))
    assert a["reasons"] == g.lost(run["summary"]), "report and the recorder's summary agree"
    # two of the three loadgen writers at least (the demo's user events may find no channel
    # too: its writers overlap)
    assert a["reasons"]["no_channel"] >= 2 * 300, a


def test_every_loss_of_a_snapshot_is_a_discarded_event(run):
    losses.assert_every_loss_is_in_the_ctf(run["snap_out"], want=("no_channel",))
