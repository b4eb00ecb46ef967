"""Helpers of the hostile-client and fault tests (tests/hostile): the binary under test, a
server under a descriptor limit, fake ivshmem clients that keep their descriptors, byte access
to a region, /proc sampling.

`IVTRACE_BIN` picks the ivtrace binary under test (default bin/ivtrace): run the suite with an
older build to see each failure these tests pin down.
"""
import json
import os
import resource
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from common import wait_for  # noqa: F401  (the hostile tests import it from here)
from ivtools.proc import stop_recorder
from serve import serve as s

REPO = Path(__file__).resolve().parents[2]

IVTRACE = Path(os.environ.get("IVTRACE_BIN", REPO / "bin" / "ivtrace"))
LOADGEN = REPO / "bin" / "ivtrace-loadgen"
NAME = "loadgen:payload"


def need_tools():
    for f in (IVTRACE, LOADGEN):
        if not os.access(f, os.X_OK):
            pytest.fail(f"{f} missing: run `make` first")


def nofile(soft, hard):
    """preexec_fn: this descriptor limit for the child."""
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return apply


def fds_of(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def limits_of(pid, name="Max open files"):
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            return [int(x) for x in line[len(name):].split()[:2]]
    return None


class Server(s.Server):
    """`ivtrace serve` (the binary under test), optionally under a descriptor limit."""

    def __init__(self, out, *extra, limit=None):
        s.IVTRACE = IVTRACE
        self._limit = limit
        super().__init__(out, *extra)

    def _spawn(self, cmd, so, se):
        pre = nofile(*self._limit) if self._limit else None
        return subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                                preexec_fn=pre)

    def sigint_exits_within(self, secs):
        """SIGINT; the exit code, or None if serve did not exit within `secs` (then killed)."""
        stop_recorder(self.proc, 0, interrupt_wait_s=secs)
        return None if self.proc.returncode == -signal.SIGKILL else self.proc.returncode


FakeClient = s.FakeClient


def loadgen(shm, *args, wait=True, **kw):
    """ivtrace-loadgen on `shm` (the --json summary if waited for, else the process)."""
    cmd = [str(LOADGEN), "--shm", str(shm), "--json", *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def record(*args, timeout=120, **kw):
    """`ivtrace record ARGS`, waited for (never a panic)."""
    p = subprocess.run([str(IVTRACE), "record", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, **kw)
    assert p.returncode != 101 and "panicked at" not in p.stderr, p.stderr
    return p


def start_record(*args, **kw):
    return subprocess.Popen([str(IVTRACE), "record", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def sidecar(d):
    return json.loads((Path(d) / "ivtrace.json").read_text())


def babeltrace2(d):
    """`babeltrace2 DIR`: (exit code, events printed, stderr)."""
    p = subprocess.run(["babeltrace2", str(d)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout.count("\n"), p.stderr


def private_dir(prefix):
    """A directory only root can write, unique to this run (names cannot collide)."""
    return Path(tempfile.mkdtemp(prefix=f"ivt-harden-{prefix}-"))
