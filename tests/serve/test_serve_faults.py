"""`ivtrace serve` keeps serving when peers misbehave or die (two real guests at once).

One server (with --host-events), two TCG guests "ga" and "gb" tracing a steady trickle of
kernel-API events, and three clients that are not QEMU:
  - E connects and hangs up at once (during the handshake);
  - M reads the handshake, then sends bytes (QEMU never does): the server drops it;
  - F reads the handshake and keeps its socket while ivtrace-loadgen writes user events into
    F's region file; then F's socket is closed mid-trace.
Then QEMU "ga" is SIGKILLed mid-trace, and guest "gb" panics (the guest dies, QEMU exits).
After each blow the server must be alive and the remaining guests still recording; at the end
every trace is finalized: SIGINT exits 0, and babeltrace2 reads every trace directory
(guest kernel, F's user trace, every host trace).
"""
import os
import signal
import subprocess
import time

import pytest

from serve import serve as s

LOOP = """
echo "SERVE-{n}: loop"
end=$(( $(date +%s) + {secs} ))
while [ $(date +%s) -lt $end ]; do echo 50 > /proc/ivtrace-test; usleep 20000; done
echo "SERVE-{n}: loop-done"
{after}
"""
GA = LOOP.format(n="ga", secs=600, after="")
GB = LOOP.format(n="gb", secs=75, after="echo c > /proc/sysrq-trigger; sleep 30")


def events_of(srv, name):
    g = srv.guest(name)
    return (g or {}).get("events", 0)


def grows(srv, name, secs=4.0):
    a = events_of(srv, name)
    time.sleep(secs)
    return events_of(srv, name) > a


@pytest.fixture(scope="module")
def run(tmp_path_factory, serve_add):
    tmp = tmp_path_factory.mktemp("serve-faults")
    out = tmp / "traces"
    srv = s.Server(out, "--size", "16M", "--host-events")
    facts = {}
    vms = []
    lg = None
    try:
        # E: connects and leaves during the handshake.
        e = s.FakeClient(srv.sock, read_handshake=False)
        e.close()
        # M: takes the handshake, then talks.
        m = s.FakeClient(srv.sock)
        facts["m_handshake"] = m.msgs
        m.send(b"not a QEMU\n")
        time.sleep(0.5)
        assert srv.alive(), srv.stderr()

        for name, script in (("ga", GA), ("gb", GB)):
            vm = s.ivtvm.VM(script, doorbell=str(srv.sock), vectors=2, smp=1, mem="384M",
                            modules=["ivtrace", "ivtrace_test"], add=serve_add,
                            extra_args=["-name", f"{name},debug-threads=on"],
                            log=str(tmp / f"{name}.console.log"))
            vm.start()
            vms.append(vm)
        for vm, name in zip(vms, ("ga", "gb")):
            vm.wait_for(rf"^SERVE-{name}: loop$", timeout=s.TIMEOUT)
            srv.wait_guest(name, "recording", timeout=60)

        # F: a client that is not QEMU, whose region a loopback writer fills.
        f = s.FakeClient(srv.sock)
        fname = [g for g in srv.ctl("list")[1]["guests"] if g["name"].startswith("guest")
                 and g["state"] != "done"][-1]
        facts["f_name"] = fname["name"]
        lg = subprocess.Popen([str(s.LOADGEN), "--shm", fname["shm"], "--channels", "4",
                               "--subbufs", "32", "--subbuf-size", "65536", "--events", "2000000",
                               "--rate", "20000", "--size", "16", "--no-close"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        srv.wait_guest(fname["name"], "recording", timeout=30)
        time.sleep(3)
        assert events_of(srv, fname["name"]) > 0
        f.close()                                          # the client socket dies mid-trace
        srv.wait_guest(fname["name"], "done", timeout=30)
        lg.kill()
        lg.wait()
        facts["after_f"] = {n: grows(srv, n) for n in ("ga", "gb")}
        assert srv.alive(), srv.stderr()

        os.killpg(vms[0].proc.pid, signal.SIGKILL)         # QEMU ga dies mid-trace
        facts["ga_killed_at_ns"] = time.time_ns()
        vms[0].wait(timeout=30)
        srv.wait_guest("ga", "done", timeout=30)
        facts["after_ga"] = grows(srv, "gb")
        assert srv.alive(), srv.stderr()

        r = vms[1].wait(timeout=s.TIMEOUT)                 # gb panics at the end of its loop
        facts["gb_panicked"] = r.panicked
        srv.wait_guest("gb", "done", timeout=30)
        assert srv.alive(), srv.stderr()
        m.close()
        rc, summaries = srv.stop()
    finally:
        if lg and lg.poll() is None:
            lg.kill()
        for vm in vms:
            vm.kill()
        srv.cleanup()
    yield {"out": out, "rc": rc, "summaries": summaries, "facts": facts, "log": srv.stderr()}


def test_server_survives_and_exits_cleanly(run):
    f = run["facts"]
    print(f"\nfacts: {f}")
    assert run["rc"] == 0, run["log"]
    assert f["m_handshake"][:3] == [(0, 0), (0, 0), (-1, 1)]
    assert "the peer sent 11 bytes" in run["log"]
    assert all(f["after_f"].values()), "a guest stopped recording when another client died"
    assert f["after_ga"], "gb stopped recording when QEMU ga was killed"
    assert f["gb_panicked"]


def test_every_peer_got_its_own_finalized_trace(run):
    sums = run["summaries"]
    f = run["facts"]["f_name"]
    assert set(sums) == {"ga", "gb", f}, (set(sums), run["log"])
    for name, reason in (("ga", "peer disconnected"), ("gb", "peer disconnected"),
                         (f, "peer disconnected")):
        d = sums[name][-1]
        print(f"\n{name}: {d['stop_reason']}; clock {d['clock']['method']} "
              f"(error <= {d['clock']['error_ns']} ns); notification "
              f"{d['notification']['mode']} {d['notification']['doorbells_received']} doorbells "
              f"/ {d['notification']['completed_packets']} packets", end="")
        assert d["stop_reason"].startswith(reason), d["stop_reason"]
        lost = sum(sum(c["lost"].values()) for c in d["channels"])
        assert lost == 0, (name, [c["lost"] for c in d["channels"]])
    # The misbehaving and the early clients never formatted a region: no trace.
    assert sorted(p.name for p in run["out"].iterdir()) == sorted(sums)


def test_babeltrace2_reads_every_trace(run):
    import ctf
    out = run["out"]
    counts = {}
    for d in sorted(p.parent for p in out.rglob("metadata")):
        evs = ctf.events(d, lambda n: n in ("ivtrace_test_event", "loadgen:payload"))
        counts[str(d.relative_to(out))] = len(evs)
        assert evs, d
    print(f"\nevents per trace: {counts}")
    assert {"ga/kernel", "ga/host", "gb/kernel", "gb/host"} <= set(counts)
    f = run["facts"]["f_name"]
    assert counts[f"{f}/user"] > 0
    # gb kept recording after ga's QEMU died.
    gb_last = max(e.ns for e in ctf.events(out / "gb" / "kernel",
                                           lambda n: n == "ivtrace_test_event")
                  if e.name == "ivtrace_test_event")
    assert gb_last > run["facts"]["ga_killed_at_ns"]
    # F's loadgen events are contiguous from seq 0 per thread (nothing lost at the cut).
    seqs = sorted(e.payload["seq"] for e in ctf.events(out / f / "user")
                  if e.name == "loadgen:payload")
    assert seqs == list(range(len(seqs)))
    host = ctf.events(out / "ga" / "host", lambda n: False)
    assert any(e.name == "sched_switch" for e in host), "no vCPU sched_switch for ga"
