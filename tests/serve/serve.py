"""Helpers of the `ivtrace serve` acceptance tests: the server process, `ivtrace ctl`, CPU time
from /proc, a fake ivshmem client, and the analyses (causality, delivery latency) over what
babeltrace2's Python bindings read back.

Nothing here knows ivtrace's wire format: bt2 decodes the traces, /proc gives CPU time.
"""
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ivtools import ivtvm  # noqa: F401  (the tests' s.ivtvm)
from ivtools.ivshmem import FakeClient  # noqa: F401  (the tests' s.FakeClient)
from ivtools.proc import stop_recorder

REPO = Path(__file__).resolve().parents[2]

IVTRACE = REPO / "bin" / "ivtrace"
LOADGEN = REPO / "bin" / "ivtrace-loadgen"
TIMEOUT = float(os.environ.get("IVTRACE_VM_TIMEOUT", "300"))


class Server:
    """`ivtrace serve` in the background (socket in a short private directory)."""

    def __init__(self, out, *extra):
        self.dir = Path(tempfile.mkdtemp(prefix="ivt-serve-"))  # sun_path is 108 bytes
        self.sock = self.dir / "s.sock"
        self.out = Path(out)
        self.log = self.out.parent / f"{self.out.name}.serve.log"
        self.stdout = self.out.parent / f"{self.out.name}.serve.json"
        self.cmd = [str(IVTRACE), "serve", "--socket", str(self.sock), "-o", str(self.out),
                    "--json", *map(str, extra)]
        with open(self.log, "wb") as se, open(self.stdout, "wb") as so:
            self.proc = self._spawn(self.cmd, so, se)
        deadline = time.monotonic() + 10
        while not self.sock.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"serve did not start:\n{self.stderr()}")
            time.sleep(0.05)
        self.rc = None

    def _spawn(self, cmd, so, se):
        return subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL)

    @property
    def pid(self):
        return self.proc.pid

    def stderr(self):
        return self.log.read_text(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def ctl(self, *args, check=True, json_out=True):
        cmd = [str(IVTRACE), "ctl", "--socket", str(self.sock), *(["--json"] if json_out else []),
               *map(str, args)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if check and p.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        if json_out and p.stdout.strip():
            return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])
        return p.returncode, p

    def guest(self, name):
        _, v = self.ctl("list")
        for g in v["guests"]:
            if g["name"] == name:
                return g
        return None

    def wait_guest(self, name, state_prefix, timeout=120):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            g = self.guest(name)
            if g and g["state"].startswith(state_prefix):
                return g
            time.sleep(0.2)
        pytest.fail(f"guest {name} never reached state '{state_prefix}':\n{self.stderr()}")

    def stop(self):
        """SIGINT; returns the exit code and the per-guest summaries (JSON lines)."""
        how = stop_recorder(self.proc, 0, interrupt_wait_s=120)
        self.rc = self.proc.returncode
        if self.rc == -signal.SIGKILL:
            pytest.fail(f"serve {how}:\n{self.stderr()}")
        return self.rc, self.summaries()

    def summaries(self):
        out = {}
        for line in self.stdout.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                out.setdefault(d["serve"]["guest"], []).append(d)
        return out

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for p in self.dir.iterdir():
            p.unlink()
        self.dir.rmdir()


# --------------------------------------------------------------------------------- reading

def bt2_events(path, names):
    """(name, ns, cycles, stream_id, payload) of the events named in `names` under `path`."""
    import bt2

    from ctf import value
    out = []
    for msg in bt2.TraceCollectionMessageIterator(str(path)):
        if type(msg) is bt2._EventMessageConst and msg.event.name in names:
            ev = msg.event
            cs = msg.default_clock_snapshot
            out.append((ev.name, cs.ns_from_origin, cs.value, ev.stream.id,
                        {k: value(v) for k, v in ev.payload_field.items()}))
    return out


def causality(rang_ns, received):
    """Order-free check: the k-th doorbell the host received (by time) happened after the k-th
    ring (by mapped time), for every k. `received`: (ns, count) per eventfd read.
    Returns n, violations and the smallest slack (received - rang), ns."""
    rang = sorted(rang_ns)
    recv = []
    for ns, count in sorted(received):
        recv += [ns] * count
    n = min(len(rang), len(recv))
    slack = [recv[k] - rang[k] for k in range(n)]
    return {
        "rang": len(rang), "received": len(recv), "compared": n,
        "violations": sum(1 for s in slack if s < 0),
        "min_slack_ns": min(slack) if slack else None,
        "median_slack_ns": sorted(slack)[n // 2] if slack else None,
    }


def mapped_ns(clock, ticks):
    """Tick value `ticks` in nanoseconds since the epoch with the recording's clock mapping
    (the sidecar's `clock`), as the host converts the guest traces' times: integers, the
    quotient rounded down (ivtrace_region::ns::NsScale)."""
    delta = (ticks - clock["ref_ticks"]) * 1_000_000_000
    return clock["ref_realtime_ns"] + delta // max(clock["freq_hz"], 1)


def delivery_latency(events, delivered, clock):
    """Per kernel event (channel, value, ns): host time its packet reached the trace file minus
    the event's mapped time. `delivered`: (ns, payload) of ivtrace_packet_delivered, whose
    packet times are the guest's ticks; the kernel trace's values are those ticks in
    nanoseconds with the final mapping `clock` (docs/ctf.md "Time"), to which they are
    converted here."""
    by_chan = {}
    for ns, p in delivered:
        bounds = (mapped_ns(clock, p["ts_begin"]), mapped_ns(clock, p["ts_end"]))
        by_chan.setdefault(p["chan"], []).append((*bounds, ns))
    for v in by_chan.values():
        v.sort()
    lat = []
    missing = 0
    for chan, cycles, ns in events:
        hit = None
        for b, e, at in by_chan.get(chan, []):
            if b <= cycles <= e:
                hit = at
                break
        if hit is None:
            missing += 1
        else:
            lat.append(hit - ns)
    return lat, missing
