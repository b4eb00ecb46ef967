"""Nested tracing's forwarding path at one level of virtualization (issue 16, item 3).

A real QEMU guest (TCG) plays L2: ivtrace.ko on an ivshmem-plain region, ivtrace-loadgen writing
numbered user events once the host says go. This host plays L1 and L0 at once:

  L2's region --(ivtrace record --clock-sync --forward FIFO)--> FIFO
      --(ivtrace-forward --create)--> a /dev/shm region standing in for L1's own
      --(ivtrace record)--> L0's trace, with L2's trace under DIR/nested/<name>-0/

What L1 and L0 run is exactly what they run in a real nest (tests/nested/README.md): only L1's
region is a loopback file here instead of L1's /dev/ivtrace, and L1's CLOCK_MONOTONIC is this
host's. The full three-level boot is `make test-nested` (minutes of TCG inside TCG).

Checked: every L2 user event reaches L0 with its exact payload (babeltrace2 reads L0's whole
directory); each lies on L0's timeline inside the host-time window in which the guest wrote it
(after the host created the go file, before the host read the guest's "written" line), widened
by the composed bound L0 reports; L0's time of each event agrees with L1's own trace within the
outer part of that bound (the composition adds no error of its own); nothing was lost on the way
(no corrupt forwarded packet, no incomplete message, no forward event dropped).
"""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import ctf
import loadgen_pattern as pattern
from serve import serve as s  # tests/serve/serve.py (a bare "serve" is the package)

HERE = Path(__file__).resolve().parent

NAME = "movenest-l2"
EVENTS = 500
SIZE = 24
FORWARD = s.REPO / "bin" / "ivtrace-forward"
GUEST_SCRIPT = f"""
echo "NEST: ready"
i=0; while [ ! -e /mnt/host/go ]; do usleep 20000; i=$((i+1)); [ $i -gt 3000 ] && exit 3; done
ivtrace-loadgen-static --shm /dev/ivtrace --threads 1 --events {EVENTS} --rate 2000 \\
    --size {SIZE} --json > /mnt/host/loadgen.json
echo "NEST: written"
"""


def host_ns():
    """Now on the host time base ivtrace uses (CLOCK_MONOTONIC on the CLOCK_REALTIME base)."""
    mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    real = time.clock_gettime_ns(time.CLOCK_REALTIME)
    mono2 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return real + (mono2 - mono) // 2


def stop(proc, what, sig=None, timeout=120):
    if sig is not None:
        proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{what} did not finish within {timeout}s")
    assert proc.returncode == 0, f"{what} exited {proc.returncode}"
    return out


@pytest.fixture(scope="module")
def nest(tmp_path_factory, guest):
    if not os.access(FORWARD, os.X_OK):
        pytest.fail(f"{FORWARD} missing: run `make` first")
    tmp = tmp_path_factory.mktemp("nest")
    share = tmp / "share"
    share.mkdir()
    fifo = tmp / "forward.fifo"
    os.mkfifo(fifo)
    tag = f"{NAME}-{os.getpid()}"
    shm_l2, shm_l1 = Path("/dev/shm") / f"{tag}-l2", Path("/dev/shm") / f"{tag}-l1"
    l1_out, l0_out = tmp / "l1", tmp / "l0"
    add = guest.add("ivtrace.ko", "ivtrace-loadgen-static")
    procs = {}
    t0 = time.monotonic()
    try:
        procs["forward"] = subprocess.Popen(
            [str(FORWARD), "--shm", str(shm_l1), "--create", "--in", str(fifo)],
            stdout=subprocess.PIPE, stderr=open(tmp / "forward.log", "wb"))
        procs["l0"] = subprocess.Popen(
            [str(s.IVTRACE), "record", "--shm", str(shm_l1), "-o", str(l0_out), "--name", "l1",
             "--json"], stdout=subprocess.PIPE, stderr=open(tmp / "l0.log", "wb"))
        with s.ivtvm.VM(GUEST_SCRIPT, shm=str(shm_l2), shm_size="4M", shm_clear=True,
                        modules=["ivtrace"], modopts={"ivtrace": "flush_ms=5 subbuf_size=16384"},
                        add=add, share=str(share), smp=1, mem="256M", append="no_timer_check",
                        log=str(tmp / "console.log"), extra_args=["-name", NAME]) as vm:
            procs["l1"] = subprocess.Popen(
                [str(s.IVTRACE), "record", "--shm", str(shm_l2), "-o", str(l1_out), "--name",
                 NAME, "--clock-sync", "--forward", str(fifo), "--json"],
                stdout=subprocess.PIPE, stderr=open(tmp / "l1.log", "wb"))
            vm.wait_for(r"^NEST: ready", timeout=s.TIMEOUT)
            time.sleep(2)  # L1's first clock-sync burst
            t_go = host_ns()
            (share / "go").touch()
            vm.wait_for(r"^NEST: written", timeout=s.TIMEOUT)
            t_done = host_ns()
            r = vm.wait(timeout=s.TIMEOUT)
        assert r.exit_code == 0 and not r.panicked, r.explain()
        l1_sum = json.loads(stop(procs["l1"], "L1's ivtrace record", signal.SIGINT))
        fwd = json.loads(stop(procs["forward"], "ivtrace-forward"))
        l0_sum = json.loads(stop(procs["l0"], "L0's ivtrace record"))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        shm_l1.unlink(missing_ok=True)
        shm_l2.unlink(missing_ok=True)
    nested = sorted((l0_out / "nested").glob(f"{NAME}-*"))
    assert len(nested) == 1, (list((l0_out / "nested").iterdir()), (tmp / "l0.log").read_text())
    # The guest's summary comes through the 9p share: a long console line can be cut by
    # kernel messages written in the middle of it.
    return {"tmp": tmp, "l1": l1_out, "l0": l0_out, "nested": nested[0],
            "loadgen": json.loads((share / "loadgen.json").read_text()),
            "window": (t_go, t_done), "forward": fwd,
            "l1_sum": l1_sum, "l0_sum": l0_sum, "seconds": time.monotonic() - t0,
            "info": json.loads((nested[0] / "nested.json").read_text())}


def user_events(path):
    return [e for e in ctf.events(str(path)) if e.name == "loadgen:payload"]


def test_every_l2_event_reaches_l0_with_its_payload(nest):
    lg, info = nest["loadgen"], nest["info"]
    print(f"\nnested: {nest['seconds']:.0f} s; loadgen {lg}; forward {nest['forward']}; "
          f"stats {info['stats']}")
    assert lg["written"] == EVENTS and lg["dropped"] == 0, lg
    events = user_events(nest["nested"] / "user")
    seqs = sorted(e.payload["seq"] for e in events)
    assert seqs == list(range(EVENTS)), f"{len(seqs)} of {EVENTS} user events reached L0"
    for e in events:
        assert e.payload["thread"] == 0
        assert e.payload["data"] == pattern.text(0, e.payload["seq"], SIZE), e.payload
    st = info["stats"]
    assert st["corrupt_packets"] == 0 and st["incomplete_messages"] == 0, st
    assert nest["forward"]["dropped"] == 0, nest["forward"]
    # Both sidecars say it: L1 what it forwarded, L0 what it expanded.
    fwd = nest["l1_sum"]["nested"]["forwarded"]
    assert fwd["not_forwarded_packets"] == 0 and fwd["packets"] == st["packets"], fwd
    (g,) = nest["l0_sum"]["nested"]["guests"]
    assert g["stats"] == st and g["clock_error_ns"] == info["clock"]["error_ns"], g


def test_l0_reads_the_whole_nest(nest):
    """babeltrace2 reads L0's directory: L1's own trace (the forward events) and L2's traces
    (user and kernel) on one timeline."""
    p = subprocess.run(["babeltrace2", str(nest["l0"])], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    names = {m.group(1) for m in re.finditer(r"\] \(\+[?.\d]+\) \S+ (\S+):", p.stdout)}
    assert {"ivtrace:forward", "ivtrace:forward_sync", "loadgen:payload"} <= names, names
    assert (nest["nested"] / "kernel" / "metadata").is_file(), "L2's kernel trace"


def test_l0_time_lies_within_the_composed_bound(nest):
    info = nest["info"]
    clock, inner, outer, sync = info["clock"], info["inner_clock"], info["outer_clock"], info["sync"]
    half_sync = (sync["mono_after"] - sync["mono_before"]) // 2
    bound = clock["error_ns"]
    print(f"\nnested clock: {clock['method']} ±{bound} ns = inner ±{inner['error_ns']} + outer "
          f"±{outer['error_ns']} + sync ±{half_sync}")
    assert bound == inner["error_ns"] + outer["error_ns"] + half_sync + 1
    t_go, t_done = nest["window"]
    ns = [e.ns for e in user_events(nest["nested"] / "user")]
    early = t_go - min(ns)
    late = max(ns) - t_done
    print(f"nested: first event {-early / 1e6:+.3f} ms after go, last {late / 1e6:+.3f} ms "
          f"after the host read 'written' (window {(t_done - t_go) / 1e6:.0f} ms)")
    assert min(ns) >= t_go - bound and max(ns) <= t_done + bound


def test_l0_agrees_with_l1_within_the_outer_bound(nest):
    """The same events on L1's own timeline (L2's mapping alone) and on L0's (composed): the
    difference is the L1->L0 part, which the outer bound and the sync bracket cover."""
    info = nest["info"]
    outer_part = info["outer_clock"]["error_ns"] + \
        (info["sync"]["mono_after"] - info["sync"]["mono_before"]) // 2 + 1
    l1 = {e.payload["seq"]: e.ns for e in user_events(nest["l1"] / "user")}
    l0 = {e.payload["seq"]: e.ns for e in user_events(nest["nested"] / "user")}
    assert l1.keys() == l0.keys()
    diffs = [l0[k] - l1[k] for k in l0]
    print(f"\nnested: L0 - L1 per event {min(diffs)} .. {max(diffs)} ns (outer part "
          f"±{outer_part} ns; L1's time base vs L0's adds their offsets' few us)")
    # Each recorder measures its own realtime-monotonic offset: allow their uncertainty too.
    slack = 50_000
    assert all(abs(d) <= outer_part + slack for d in diffs), (min(diffs), max(diffs))
