"""Output roots other users can write are refused, and a trace never lands outside its
directory even when another user swaps a path (issue 10: with an output root owned by another
user, that user could replace a guest's directory by a symbolic link and root's serve wrote
the trace wherever it pointed; traces were 0755/0644, readable by every local user).

The other user is `nobody` (uid 65534): the test's attacker process runs as nobody.
"""
import grp
import os
import stat
import subprocess
import time

import pytest

from hostile.helpers import (
    IVTRACE,
    FakeClient,
    Server,
    babeltrace2,
    loadgen,
    need_tools,
    private_dir,
    record,
    sidecar,
    start_record,
    wait_for,
)

NOBODY = 65534


def as_nobody():
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def attacker(script):
    """Runs python `script` as nobody (fails the test if it fails)."""
    p = subprocess.run(["/usr/bin/python3", "-c", script], preexec_fn=as_nobody,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def owned_by_nobody(prefix, mode=0o755):
    d = private_dir(prefix)
    os.chown(d, NOBODY, NOBODY)
    os.chmod(d, mode)
    return d


def tree(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.fixture
def evil():
    """Where the attacker would like root to write: a directory anyone may write."""
    d = owned_by_nobody("evil", 0o777)
    yield d
    subprocess.run(["rm", "-rf", str(d)])


def test_a_root_another_user_owns_or_can_write_is_refused(shm, tmp_path):
    need_tools()
    theirs = owned_by_nobody("theirs")
    shared = private_dir("shared")
    os.chmod(shared, 0o1777)
    try:
        for root in (theirs, shared):
            p = subprocess.run([str(IVTRACE), "serve", "--socket", str(tmp_path / "s.sock"),
                                "-o", str(root)], capture_output=True, text=True, timeout=30)
            assert p.returncode == 2, p.stderr
            assert "output root" in p.stderr and "--allow-shared-output" in p.stderr, p.stderr
            p = record("--shm", shm, "-o", root, "--duration", 0.1)
            assert p.returncode == 2 and "--allow-shared-output" in p.stderr, p.stderr
    finally:
        theirs.rmdir()
        shared.rmdir()


def test_record_never_follows_a_directory_swapped_for_a_link(shm, evil):
    """record opens its output directory once; the owner of the parent renames it away and
    puts a link to their own directory in its place before the first packet: the trace still
    goes into the directory record opened."""
    need_tools()
    parent = owned_by_nobody("parent")
    out = parent / "trace"
    try:
        rec = start_record("--shm", shm, "-o", out)
        wait_for(out.exists, 30, "record to create its output directory")
        time.sleep(0.3)
        attacker(f"import os; os.rename({str(out)!r}, {str(parent / 'moved')!r}); "
                 f"os.symlink({str(evil)!r}, {str(out)!r})")
        stats = loadgen(shm, "--events", 20_000, "--threads", 2, "--size", 32)
        _, err = rec.communicate(timeout=60)
        assert rec.returncode == 0, err
        assert tree(evil) == [], f"the trace went through the link: {tree(evil)}"
        moved = parent / "moved"
        rc, lines, bt = babeltrace2(moved)
        assert rc == 0 and lines == stats["attempted"] - stats["dropped"], bt
    finally:
        subprocess.run(["rm", "-rf", str(parent)])


def test_serve_on_a_shared_root_never_writes_through_a_link(tmp_path, evil):
    """serve -o ROOT --allow-shared-output where ROOT belongs to the attacker: a link planted
    at the guest's name is passed over, and the guest's directory swapped for a link before
    its first packet still gets the trace."""
    need_tools()
    root = owned_by_nobody("root")
    try:
        attacker(f"import os; os.symlink({str(evil)!r}, {str(root / 'guest1')!r})")
        srv = Server(root, "--size", "16M", "--allow-shared-output")
        try:
            c = FakeClient(srv.sock)
            shm = wait_for(lambda: srv.guest("guest1"), 10, "guest1")["shm"]
            loadgen(shm, "--events", 0, "--channels", 4, "--subbufs", 32, "--subbuf-size", 65536,
                    "--no-close")
            srv.wait_guest("guest1", "recording", timeout=30)
            mine = root / "guest1-2"
            assert mine.is_dir() and not mine.is_symlink()
            attacker(f"import os; os.rename({str(mine)!r}, {str(root / 'moved')!r}); "
                     f"os.symlink({str(evil)!r}, {str(mine)!r})")
            loadgen(shm, "--events", 50_000, "--size", 16)
            c.close()
            srv.wait_guest("guest1", "done", timeout=30)
            rc, sums = srv.stop()
        finally:
            srv.cleanup()
        assert rc == 0
        assert tree(evil) == [], f"the trace went through a link: {tree(evil)}"
        rc, lines, bt = babeltrace2(root / "moved" / "user")
        assert rc == 0 and lines == 50_000, bt
    finally:
        subprocess.run(["rm", "-rf", str(root)])


def test_traces_are_0750_and_0640_in_the_given_group(shm, tmp_path):
    need_tools()
    group = grp.getgrnam("nogroup").gr_gid
    loadgen(shm, "--events", 10_000, "--threads", 2, "--size", 32)
    out = tmp_path / "t"
    p = record("--shm", shm, "-o", out, "--group", "nogroup")
    assert p.returncode == 0, p.stderr
    entries = [out, *out.rglob("*")]
    assert len(entries) >= 5, tree(out)
    for e in entries:
        st = e.lstat()
        want = 0o750 if stat.S_ISDIR(st.st_mode) else 0o640
        assert stat.S_IMODE(st.st_mode) == want, (e, oct(st.st_mode))
        assert st.st_gid == group, (e, st.st_gid)
    assert sidecar(out)["state"] == "finalized"
