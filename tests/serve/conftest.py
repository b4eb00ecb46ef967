"""Fixtures of the `ivtrace serve` acceptance tests (tests/serve)."""
import subprocess
from pathlib import Path

import pytest

from serve import serve as s


@pytest.fixture(scope="session")
def serve_add(guest):
    """The ivtvm `add=` list: ivtrace.ko and ivtrace_test.ko (the session's guest build,
    tests/conftest.py); bin/ivtrace and bin/ivtrace-loadgen must exist (make)."""
    for f in (s.IVTRACE, s.LOADGEN):
        if not f.exists():
            pytest.fail(f"{f} missing (run `make` at the top)")
    return guest.add("ivtrace.ko", "ivtrace_test.ko")


@pytest.fixture(scope="session", autouse=True)
def tracefs():
    """`ivtrace serve --host-events` reads the host's tracefs. A Debian system mounts it at
    boot (systemd); a machine or container without systemd may not, and serve then records no
    host events. Mount it when it is missing (root), and leave it mounted afterwards: other
    runs on this machine may be using it by then."""
    path = Path("/sys/kernel/tracing")
    if not (path / "trace_marker").exists():
        p = subprocess.run(["mount", "-t", "tracefs", "nodev", str(path)], capture_output=True,
                           text=True)
        if p.returncode != 0:
            pytest.fail(f"tracefs is not mounted and `mount -t tracefs nodev {path}` failed "
                        f"({p.stderr.strip()}): mount it as root, then rerun")
    return path
