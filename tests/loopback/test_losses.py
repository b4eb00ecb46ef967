"""Every lost event reaches a CTF reader, on this machine (no VM): ivtrace-loadgen floods small
regions so that every writer-side and host-side loss happens for real, `ivtrace record` and
`ivtrace snapshot` write the traces, and babeltrace2 (Python bindings and the command) must
report as many discarded events as `ivtrace report` recorded, reason by reason
(tests/losses.py).

Which stream carries which loss is docs/abi.md's "Lost events": a channel's own drops and the
host's losses of its packets are that channel's stream's; events no channel could take are
the user trace's `user_no_channel` stream's.
"""
import subprocess

import losses
from common import run

SMALL = ["--channels", 2, "--subbufs", 4, "--subbuf-size", 4096]


def loadgen(tools, shm, *args):
    return run([tools["loadgen"], "--shm", str(shm), *map(str, args)], timeout=120)


def record(tools, shm, out, *args, timeout=120):
    p = run([tools["ivtrace"], "record", "--shm", str(shm), "-o", str(out), *map(str, args)],
            timeout=timeout)
    return p


def snapshot(tools, shm, out):
    return run([tools["ivtrace"], "snapshot", "--shm", str(shm), "-o", str(out)])


def writer_losses_region(tools, shm):
    """A discard-mode region with every writer-side loss: a full ring (no reader), events
    larger than a packet, and threads that found no free channel (four writers at once, two
    channels). The writers are gone afterwards; the region stays LIVE."""
    loadgen(tools, shm, "--create", *SMALL, "--threads", 1, "--events", 5000, "--size", 16,
            "--no-close")
    loadgen(tools, shm, "--threads", 1, "--events", 10, "--size", 5000)
    # Paced: the four threads overlap for 0.1 s, so two of them find both channels taken.
    loadgen(tools, shm, "--threads", 4, "--events", 400, "--rate", 4000, "--size", 16)


def test_writer_drops_and_events_without_a_channel_are_discarded_events(tools, shm, tmp_path):
    writer_losses_region(tools, shm)
    out = tmp_path / "record"
    record(tools, shm, out)
    assert (out / "user" / "user_no_channel").is_file()
    losses.assert_every_loss_is_in_the_ctf(out, want=("full", "too_big", "no_channel"))


def test_a_snapshot_carries_the_same_losses(tools, shm, tmp_path):
    writer_losses_region(tools, shm)
    out = tmp_path / "snapshot"
    snapshot(tools, shm, out)
    losses.assert_every_loss_is_in_the_ctf(out, want=("full", "too_big", "no_channel"))


def test_packets_the_writer_overwrote_before_the_host_read_them(tools, shm, tmp_path):
    """Overwrite mode, no reader while the writer laps its ring many times: `record` then
    finds most packets gone (host-side loss "overwritten"); a snapshot of the same region
    keeps the newest packets and loses nothing it could have read."""
    loadgen(tools, shm, "--create", *SMALL, "--mode", "overwrite", "--threads", 1,
            "--events", 20000, "--size", 16, "--no-close")
    out = tmp_path / "record"
    record(tools, shm, out)
    losses.assert_every_loss_is_in_the_ctf(out, want=("overwritten",))
    snap = tmp_path / "snapshot"
    snapshot(tools, shm, snap)
    a = losses.assert_every_loss_is_in_the_ctf(snap)
    assert a["report_recorded"] == 0, a


def test_a_live_flood_into_a_tiny_region(tools, shm, tmp_path):
    """The recorder drains while three threads flood a two-channel region of 2 x 4 KiB rings:
    whatever it loses and however, the traces announce exactly that."""
    out = tmp_path / "live"
    rec = subprocess.Popen([tools["ivtrace"], "record", "--shm", str(shm), "-o", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        loadgen(tools, shm, "--create", "--channels", 2, "--subbufs", 2, "--subbuf-size", 4096,
                "--threads", 3, "--events", 100_000, "--size", "8-200")
        _, err = rec.communicate(timeout=120)
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
    assert rec.returncode == 0, err
    a = losses.assert_every_loss_is_in_the_ctf(out)
    assert a["report_recorded"] > 0, "a 2 x 4 KiB ring cannot keep up with this flood"
