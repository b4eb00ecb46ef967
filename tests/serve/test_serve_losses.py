"""Every lost event of an `ivtrace serve` recording reaches a CTF reader (one boot).

A guest whose rings are far too small (2 x 4 KiB per channel) in flight-recorder mode
(overwrite) writes bursts of kernel-API events (ivtrace_test.ko) with every event group on,
while `ivtrace serve --host-events --shm-dir /dev/shm --keep-shm` records it (the region a
file, not a sealed memfd, so that it outlives serve): the writer laps the host, so the
host loses packets it could not copy in time (host-side losses `overwritten`, maybe `torn`).
babeltrace2 (Python bindings and the command) must announce as many discarded events as
`ivtrace report` recorded, over the guest's traces and the host trace (tests/losses.py);
`ivtrace snapshot` of the region that serve kept must too.
"""
import time

import pytest

import losses
from serve import serve as s

NAME = "lossy"
MODOPTS = "events=sched,irq,timer,kmem,syscall,printk subbuf_size=4096 nr_subbufs=2 mode=overwrite"
GUEST_SCRIPT = """
i=0
while [ $i -lt 20 ]; do echo 2000 > /proc/ivtrace-test; i=$((i+1)); done
echo "LOSSES: bursts $(cat /proc/ivtrace-test)"
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, serve_add):
    tmp = tmp_path_factory.mktemp("serve-losses")
    out = tmp / "traces"
    srv = s.Server(out, "--size", "16M", "--shm-dir", "/dev/shm", "--keep-shm", "--host-events")
    region = None
    try:
        with s.ivtvm.VM(GUEST_SCRIPT, doorbell=str(srv.sock), vectors=2, smp=2,
                        modules=["ivtrace", "ivtrace_test"], modopts={"ivtrace": MODOPTS},
                        add=serve_add, extra_args=["-name", f"{NAME},debug-threads=on"],
                        log=str(tmp / "console.log")) as vm:
            srv.wait_guest(NAME, "recording", timeout=s.TIMEOUT)
            region = srv.guest(NAME)["shm"]
            r = vm.wait(timeout=s.TIMEOUT)
        assert r.exit_code == 0 and not r.panicked, r.explain()
        time.sleep(1)
        rc, summaries = srv.stop()
        snap = tmp / "snapshot"
        if region:
            s.subprocess.run([str(s.IVTRACE), "snapshot", "--shm", region, "-o", str(snap)],
                             check=True, capture_output=True, timeout=120)
    finally:
        srv.cleanup()
        if region:
            s.Path(region).unlink(missing_ok=True)
    assert rc == 0, srv.stderr()
    return {"boot": r, "out": out / NAME, "summary": summaries[NAME][-1], "snapshot": snap}


def test_the_guest_ran_clean(run):
    r = run["boot"]
    assert "LOSSES: bursts" in r.console_text, r.tail(40)
    assert not r.kernel_problems, r.kernel_problems


def test_every_loss_of_the_serve_recording_is_a_discarded_event(run):
    losses.assert_every_loss_is_in_the_ctf(run["out"], want=("overwritten",))
    assert (run["out"] / "host" / "metadata").is_file(), "the host trace is counted too"
    assert run["summary"]["host_lost"] is not None, run["summary"].keys()


def test_every_loss_of_a_snapshot_of_the_kept_region_is_a_discarded_event(run):
    losses.assert_every_loss_is_in_the_ctf(run["snapshot"])
