"""A client that holds a lock on its region cannot hang serve (issue 10: the guest's thread
blocked in flock forever, and serve then ignored SIGINT until SIGKILL).

Control commands are posted under an exclusive flock of the region file so that two
controllers never interleave. Anyone who can open the region can hold that lock. Here the
client formats its region as a writer that obeys commands (IVT_FEAT_CONTROL), takes the lock
through its own open of the region, and keeps it: the command through serve fails within its
acknowledgement timeout, the guest thread goes on answering, and SIGINT ends serve promptly.
"""
import fcntl
import os
import subprocess
import time

from common import abi
from hostile.helpers import IVTRACE, LOADGEN, FakeClient, Server, need_tools, wait_for


def formatted_region_with_control(tmp_path, size):
    """A formatted region image (loadgen) whose header says it obeys control commands."""
    path = tmp_path / "image"
    p = subprocess.run([str(LOADGEN), "--shm", str(path), "--channels", "4", "--subbufs", "32",
                        "--subbuf-size", "65536", "--events", "1000", "--no-close"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    image = bytearray(path.read_bytes())
    assert len(image) == size
    off = abi("offsetof.ivt_region_hdr.features")
    features = int.from_bytes(image[off:off + 8], "little") | abi("IVT_FEAT_CONTROL")
    image[off:off + 8] = features.to_bytes(8, "little")
    return bytes(image)


def test_a_lock_held_by_a_client_times_out_and_sigint_still_works(tmp_path):
    need_tools()
    size = 16 << 20
    image = formatted_region_with_control(tmp_path, size)
    srv = Server(tmp_path / "traces", "--size", "16M")
    try:
        c = FakeClient(srv.sock)
        shm = wait_for(lambda: srv.guest("guest1"), 10, "guest1")["shm"]
        # Publish the header (magic) last, as a formatter does.
        os.pwrite(c.fds[0], image[8:], 8)
        os.pwrite(c.fds[0], image[:8], 0)
        srv.wait_guest("guest1", "recording", timeout=30)
        held = os.open(shm, os.O_RDWR)          # a new open: its own lock
        fcntl.flock(held, fcntl.LOCK_EX)
        t0 = time.monotonic()
        p = subprocess.run([str(IVTRACE), "ctl", "--socket", str(srv.sock), "--guest", "guest1",
                            "flush"], capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        print(f"\nctl flush with the lock held: exit {p.returncode} after {took:.1f} s: "
              f"{p.stderr.strip()}")
        assert p.returncode != 0 and "locked" in p.stderr, p.stderr
        _, listed = srv.ctl("list")             # the guest thread still answers
        assert listed["guests"][-1]["state"] == "recording"
        t0 = time.monotonic()
        rc = srv.sigint_exits_within(30)
        print(f"SIGINT with the lock still held: exit {rc} after {time.monotonic() - t0:.1f} s")
        assert rc == 0, srv.stderr()
        os.close(held)
        c.close()
    finally:
        srv.cleanup()
