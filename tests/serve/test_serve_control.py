"""A control request sent the moment a guest's region is formatted reaches the recording.

serve looks for an unformatted region every 200 ms, and a control request wakes the guest
too. The look must come first: a request that arrives between the module's formatting and
serve's next look belongs to the recording that look starts. It used to be refused as "the
guest module has not formatted the region yet" (seen in CI, where the ftrace control test
sent its first request right after the guest's module loaded).

The guest here is not QEMU: ivtrace-loadgen takes serve's handshake and formats the
region serve gave it at once. libivtrace's writer takes no commands, so the recording
answers that it does not obey them; what matters is that the request got that far. No VM;
well under a second.
"""
import subprocess
import time

import pytest

from serve import serve as s

TRIES = 3  # each one a new guest: the race is hit at most once per guest


def wait_formatted(path, timeout=10.0):
    """Until the region's magic (written last, with release, by the formatter) is set."""
    end = time.monotonic() + timeout
    with open(path, "rb", buffering=0) as f:
        while time.monotonic() < end:
            f.seek(0)
            if any(f.read(8)):
                return
            time.sleep(0.0005)
    pytest.fail(f"{path} was not formatted within {timeout} s")


def new_guest(srv, known):
    """ivtrace-loadgen as a guest of serve (handshake, then it formats its region at once):
    (the writer, its guest name, its region path), as soon as serve lists it."""
    writer = subprocess.Popen([str(s.LOADGEN), "--ivshmem-socket", str(srv.sock),
                               "--channels", "4", "--subbuf-size", "65536", "--events", "100",
                               "--rate", "1", "--no-close"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        fresh = [g for g in srv.ctl("list")[1]["guests"] if g["name"] not in known and g["shm"]]
        if fresh:
            return writer, fresh[0]["name"], fresh[0]["shm"]
        time.sleep(0.002)
    writer.kill()
    pytest.fail(f"serve never listed the new guest:\n{srv.stderr()}")


def test_a_request_right_after_formatting_is_not_refused(tmp_path):
    srv = s.Server(tmp_path / "traces", "--size", "16M")
    answers, known, writers = [], set(), []
    try:
        for _ in range(TRIES):
            writer, name, shm = new_guest(srv, known)
            known.add(name)
            writers.append(writer)
            wait_formatted(shm)
            rc, p = srv.ctl("--guest", name, "flush", check=False, json_out=False)
            answers.append((name, rc, (p.stdout + p.stderr).strip()))
    finally:
        for w in writers:
            w.kill()
            w.wait()
        srv.stop()
        srv.cleanup()
    print("\n" + "\n".join(f"{n}: rc {rc}: {msg}" for n, rc, msg in answers))
    refused = [a for a in answers if "not formatted" in a[2]]
    assert not refused, refused
    # It reached the recording, which read the region's features: libivtrace's writer
    # takes no commands (the guest module's does).
    assert all(rc != 0 and "does not obey control commands" in msg for _, rc, msg in answers), \
        answers
