"""A region that shrinks under the reader (ftruncate by its writer or by a client that was
handed it) never takes the recorder down (issue 10: it used to die of SIGBUS, leaving every
guest's trace unfinalized).

- record: the loopback writer's file is truncated mid-recording; record stops with a clear
  reason, finalizes what it read (babeltrace2 reads it) and exits normally;
- serve, default: regions are memfds sealed against shrinking: the client's ftruncate fails
  (EPERM) and its recording goes on untouched;
- serve --shm-dir (plain files): the client truncates its region file; that guest's trace is
  finalized ("region shrank"), the other guest keeps recording, serve exits 0 on SIGINT.
"""
import os
import time

from hostile.helpers import (
    FakeClient,
    Server,
    babeltrace2,
    loadgen,
    need_tools,
    private_dir,
    sidecar,
    start_record,
    wait_for,
)

GEOMETRY = ["--channels", 4, "--subbufs", 32, "--subbuf-size", 65536, "--size", 16]


def test_record_survives_a_region_truncated_mid_recording(shm, tmp_path):
    need_tools()
    out = tmp_path / "t"
    rec = start_record("--shm", shm, "-o", out)
    lg = loadgen(shm, "--events", 2_000_000, "--rate", 100_000, "--threads", 2, "--size", 32,
                 "--subbufs", 16, "--subbuf-size", 16384, "--channels", 2, "--no-close",
                 wait=False)
    wait_for(lambda: (out / "user").exists(), 30, "the first packets")
    time.sleep(1)
    os.truncate(shm, 4096)          # the writer's file loses all but its header page
    try:
        _, err = rec.communicate(timeout=60)
    finally:
        lg.kill()
        lg.wait()
    print(err)
    assert rec.returncode == 0, err
    assert "shrank" in err
    d = sidecar(out)
    assert d["state"] == "finalized" and d["stop_reason"].startswith("region shrank"), d
    rc, lines, bt_err = babeltrace2(out)
    assert rc == 0, bt_err
    assert lines == sum(c["events"] for c in d["channels"]) > 0


def test_serve_regions_cannot_be_shrunk(tmp_path):
    need_tools()
    srv = Server(tmp_path / "traces", "--size", "16M")
    try:
        c = FakeClient(srv.sock)
        shm_fd = c.fds[0]                   # the region, as QEMU would get it
        g = wait_for(lambda: srv.guest("guest1"), 10, "guest1")
        lg = loadgen(g["shm"], "--events", 400_000, "--rate", 100_000, *GEOMETRY, "--no-close",
                     wait=False)
        srv.wait_guest("guest1", "recording", timeout=30)
        try:
            os.ftruncate(shm_fd, 4096)
            shrunk = True
        except PermissionError:
            shrunk = False
        assert not shrunk, "a client could shrink its region"
        assert os.fstat(shm_fd).st_size == 16 << 20
        lg.communicate(timeout=60)
        assert lg.returncode == 0
        assert srv.alive(), srv.stderr()
        c.close()
        srv.wait_guest("guest1", "done", timeout=30)
        rc, sums = srv.stop()
    finally:
        srv.cleanup()
    assert rc == 0
    d = sums["guest1"][-1]
    assert sum(c["events"] for c in d["channels"]) == 400_000
    assert sum(sum(c["lost"].values()) for c in d["channels"]) == 0


def test_serve_survives_a_region_file_truncated(tmp_path):
    need_tools()
    shm_dir = private_dir("shm")
    srv = Server(tmp_path / "traces", "--size", "16M", "--shm-dir", shm_dir)
    lgs = []
    try:
        victim, other = FakeClient(srv.sock), FakeClient(srv.sock)
        for name in ("guest1", "guest2"):
            g = wait_for(lambda name=name: srv.guest(name), 10, name)
            lgs.append(loadgen(g["shm"], "--events", 4_000_000, "--rate", 50_000, *GEOMETRY,
                               "--no-close", wait=False))
            srv.wait_guest(name, "recording", timeout=30)
        time.sleep(1)
        os.truncate(srv.guest("guest1")["shm"], 4096)
        srv.wait_guest("guest1", "done", timeout=30)
        before = srv.guest("guest2")["events"]
        time.sleep(2)
        assert srv.alive(), srv.stderr()
        assert srv.guest("guest2")["events"] > before, "the other guest stopped recording"
        rc = srv.sigint_exits_within(60)
        sums = srv.summaries()
        log = srv.stderr()
    finally:
        for lg in lgs:
            lg.kill()
            lg.wait()
        srv.cleanup()
        for f in shm_dir.iterdir():
            f.unlink()
        shm_dir.rmdir()
    victim.close()
    other.close()
    print(log)
    assert rc == 0, log
    assert sums["guest1"][-1]["stop_reason"].startswith("region shrank"), sums["guest1"][-1]
    for name in ("guest1", "guest2"):
        rc, lines, err = babeltrace2(tmp_path / "traces" / name)
        assert rc == 0 and lines > 0, err
