"""Helpers of the relay tests (tests/relay): a real lttng-relayd on free ports with its output
in a temporary directory (ivtools.relayd), simulated guests (ivtrace-loadgen --ivshmem-socket), reading traces
back with babeltrace2 (the CLI for event-by-event comparison, bt2 for per-stream counts) and a
live viewer that notes when each event line arrived.

Nothing here knows ivtrace's wire format: babeltrace2 decodes every trace.
"""
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ivtools.proc import stop_recorder
from ivtools.relayd import Relayd  # noqa: F401  (the tests' relay: r.Relayd)

REPO = Path(__file__).resolve().parents[2]
LOADGEN = REPO / "bin" / "ivtrace-loadgen"


class SimGuest:
    """A simulated guest: ivtrace-loadgen as an ivshmem client of `sock` (QEMU's handshake,
    the region formatted with libivtrace, `threads` writer threads at `rate` events/s each)."""

    def __init__(self, sock, events, threads=2, rate=0, size=32):
        self.cmd = [str(LOADGEN), "--ivshmem-socket", str(sock), "--events", str(events),
                    "--threads", str(threads), "--channels", str(threads), "--rate", str(rate),
                    "--size", str(size), "--json"]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.result = None

    def wait(self, timeout=300):
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            pytest.fail(f"{' '.join(self.cmd)} -> {self.proc.returncode}\n{err}")
        self.result = json.loads(out)
        return self.result


def trace_lines(path):
    """babeltrace2's text of one CTF trace directory, timestamps in clock cycles (the local
    copy's clock mapping is refined at the end, the relay's is the first one; cycles are what
    the guest wrote)."""
    p = subprocess.run(["babeltrace2", "--clock-cycles", "--no-delta", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"babeltrace2 {path}: {p.stderr}"
    return p.stdout.splitlines(), p.stderr


def stream_counts(path):
    """Events per (stream class, stream instance) of the CTF trace under `path` (bt2), and the
    discarded events babeltrace2 announces per stream."""
    import bt2
    events, discarded = {}, {}
    for msg in bt2.TraceCollectionMessageIterator(str(path)):
        if type(msg) is bt2._EventMessageConst:
            s = msg.event.stream
            key = (s.cls.id, s.id)
            events[key] = events.get(key, 0) + 1
        elif type(msg) is bt2._DiscardedEventsMessageConst:
            s = msg.stream
            key = (s.cls.id, s.id)
            discarded[key] = discarded.get(key, 0) + (msg.count or 0)
    return events, discarded


STAMP = re.compile(r"^\[(\d+)\.(\d+)\]")


class LiveViewer:
    """`babeltrace2 --input-format=lttng-live URL` in the background; each line is kept with
    the host's realtime when it arrived."""

    def __init__(self, url):
        self.cmd = ["babeltrace2", "--input-format=lttng-live", "--clock-seconds", url]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def stop(self):
        stop_recorder(self.proc, 0, interrupt_wait_s=20)
        self.reader.join(timeout=10)
        return self.proc.stderr.read()

    def latencies(self, name):
        """Seconds from each `name` event's time to its line's arrival."""
        out = []
        for arrived, line in self.lines:
            m = STAMP.match(line)
            if m and f" {name}:" in line:
                out.append(arrived - float(f"{m.group(1)}.{m.group(2)}"))
        return out
