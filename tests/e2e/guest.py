"""Shared parts of the end-to-end guest tests: recorder, trace reading, checks (the guest
itself is built by the session fixture `guest` of tests/conftest.py).

Real parts only: QEMU (python/ivtools/ivtvm.py), the Debian guest kernel, guest/kmod/ivtrace.ko,
guest/lib's static ivtrace-loadgen, vm/guest/workload/ivtwl, bin/ivtrace, and babeltrace2's
Python bindings (tests/ctf.py) as the independent reader.
"""
import json
import os
import re
import struct
import subprocess
import uuid
from pathlib import Path

import pytest

import ctf
import loadgen_pattern as pattern
from ivtools import ivtvm  # noqa: F401  (the e2e tests' g.ivtvm)
from ivtools.proc import stop_recorder

REPO = Path(__file__).resolve().parents[2]
IVTRACE = REPO / "bin" / "ivtrace"
TIMEOUT = float(os.environ.get("IVTRACE_VM_TIMEOUT", "300"))
LOADGEN_EVENT = "loadgen:payload"


def build_all():
    """The `add=` list of these guests (ivtrace.ko, the static loadgen, ivtwl) from the one
    guest build, for helpers that cannot take the session fixture `guest` of
    tests/conftest.py (which the tests here use). A failed build fails the test."""
    from ivtools import guestbuild

    try:
        guest = guestbuild.build_guest()
    except guestbuild.BuildError as e:
        pytest.fail(f"building the guest failed: {e}")
    if not IVTRACE.exists():
        pytest.fail(f"{IVTRACE} missing (run `make` at the top)")
    return guest.add("ivtrace.ko", "ivtrace-loadgen-static", "ivtwl")


def shm_path(tag):
    return Path(f"/dev/shm/ivt-e2e-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def token():
    return uuid.uuid4().hex[:12]


class Recorder:
    """`ivtrace record --json` in the background; .wait() returns its summary (the sidecar)."""

    def __init__(self, shm, out):
        self.out = Path(out)
        self.err = self.out.parent / f"{self.out.name}.record.log"
        self.json = self.out.parent / f"{self.out.name}.record.json"
        self.cmd = [str(IVTRACE), "record", "--shm", str(shm), "-o", str(out), "--force",
                    "--json"]
        with open(self.json, "wb") as so, open(self.err, "wb") as se:
            self.proc = subprocess.Popen(self.cmd, stdout=so, stderr=se,
                                         stdin=subprocess.DEVNULL)
        self.rc = None

    def wait(self, timeout, boot=None):
        """Wait for the recorder to stop by itself; fail (after a SIGINT) if it does not.
        `boot` (the guest's BootResult) puts the guest's own account into that failure: a
        recorder that never saw a formatted region is most often a guest that did not get
        as far as loading the module, and its console says why."""
        try:
            self.rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            guest = "" if boot is None else f"\n{boot.explain(40)}"
            pytest.fail(f"the recorder did not stop by itself within {timeout} s "
                        f"(region not CLOSED?)\n{self.stderr()}{guest}")
        return self.summary()

    def stop(self):
        """SIGINT the recorder at once (it flushes what was committed); kill it after 30 s."""
        stop_recorder(self.proc, 0, interrupt_wait_s=30)
        self.rc = self.proc.returncode

    def stderr(self):
        return self.err.read_text(errors="replace")

    def summary(self):
        text = self.json.read_text()
        assert text.strip(), f"recorder printed no summary (exit {self.rc})\n{self.stderr()}"
        return json.loads(text)


def snapshot(shm, out):
    p = subprocess.run([str(IVTRACE), "snapshot", "--shm", str(shm), "-o", str(out), "--force",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"ivtrace snapshot failed ({p.returncode}):\n{p.stderr}"
    return json.loads(p.stdout)


def lost(summary):
    """Every loss the recorder's summary reports, by reason (zero reasons left out)."""
    out = {}
    for c in summary["channels"]:
        for k, v in c["lost"].items():
            if v:
                out[k] = out.get(k, 0) + v
    if summary.get("lost_no_channel"):
        out["no_channel"] = summary["lost_no_channel"]
    return out


def trace_dirs(out):
    """The CTF traces under `out` (directories with a metadata file), wherever they are."""
    dirs = sorted(p.parent for p in Path(out).rglob("metadata"))
    assert dirs, f"no CTF trace (metadata file) under {out}"
    return dirs


def read(out):
    """(events, discarded) of every trace under `out`, each trace read on its own by
    babeltrace2 (test_babeltrace2_reads_the_whole_output reads them all at once)."""
    events, discarded = [], 0
    for d in trace_dirs(out):
        events += ctf.events(d)
        discarded += ctf.discarded(d)
    return events, discarded


def by_name(events, name):
    return [e for e in events if e.name == name]


def check_loadgen(events, threads, n, lo, hi, payload="text"):
    """Exactly seq 0..n-1 of every thread, each payload byte recomputed (tests/loadgen_pattern)."""
    seen = {}
    for e in events:
        p = e.payload
        t, s = p["thread"], p["seq"]
        assert 0 <= t < threads, p
        assert (t, s) not in seen, f"duplicate event thread {t} seq {s}"
        ln = pattern.length(t, s, lo, hi)
        if payload == "text":
            want = pattern.text(t, s, ln)
        else:
            want = list(pattern.binary(t, s, ln))
        got = p["data"] if payload == "text" else list(p["data"])
        assert got == want, f"thread {t} seq {s}: payload differs"
        seen[(t, s)] = True
    for t in range(threads):
        got = sorted(s for (tt, s) in seen if tt == t)
        assert got == list(range(n)), (
            f"thread {t}: {len(got)} of {n} events; first missing "
            f"{next((i for i in range(n) if i not in set(got)), None)}")


def console_json(text, key):
    """The JSON object printed after `key` on a console line."""
    m = re.search(rf"^{re.escape(key)} (\{{.*\}})\s*$", text, re.M)
    assert m, f"no '{key} {{...}}' line on the console"
    return json.loads(m.group(1))


def marks(text, key):
    return re.findall(rf"^{re.escape(key)}(.*)$", text, re.M)


def kids(text):
    """{name: pid} from ivtwl kids' "IVTWL kid NAME pid=P" lines."""
    return {n: int(p) for n, p in re.findall(r"^IVTWL kid (\S+) pid=(\d+)", text, re.M)}


def write_last_word(shm, value):
    """The host->guest signal `ivtwl hostwait` polls: the BAR's last 8 bytes."""
    with open(shm, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(struct.pack("<Q", value))
