"""Live migration while tracing (issue 16, item 1), with real QEMUs under TCG.

Host A and host B are two QEMUs and two recorders on this machine; the migration runs over a
loopback TCP socket (QMP `migrate`). The guest writes numbered user events (ivtrace-loadgen
through /dev/ivtrace, paced, ~12 s) and its kernel events while it runs on A, while it migrates
and after it arrived on B. Once the migration is over, A's recorder hands off (its part ends
with complete packets and DIR/handoff.json) and B's resumes from that handoff.

- doorbell: ivshmem-doorbell with master=on (QEMU migrates its memory only then), two
  `ivtrace serve` daemons; B's QEMU runs with -incoming, so B's serve waits for `ctl resume`.
- plain: ivshmem-plain on two memory-backend-file regions, two `ivtrace record`
  (SIGUSR1 hands off, --resume-from), clock by polled ping-pong (--clock-sync).

Checked with babeltrace2's Python bindings, per part and together: every event loadgen wrote
is in A's or B's trace exactly once or counted as discarded (the parts' discarded counts add
up); no packet is in both parts; each channel's events are in time order across the two parts;
babeltrace2 reads both parts at once; B has its own clock mapping.
"""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from common import wait_for
from ivtools.ports import free_ports
from ivtools.qmp import QMP
from serve import serve as s  # tests/serve/serve.py (a bare "serve" is the package)

HERE = Path(__file__).resolve().parent

NAME = "movenest-mig"
EVENTS = 12000
RATE = 1000  # events/s: ~12 s of writing, the migration in its middle
GUEST_SCRIPT = f"""
echo "MIG: writing"
ivtrace-loadgen-static --shm /dev/ivtrace --threads 1 --events {EVENTS} --rate {RATE} \\
    --size 16 --json > /tmp/lg.json
echo "MIG: loadgen $(cat /tmp/lg.json)"
echo "MIG: done"
"""
MODOPTS = {"ivtrace": "flush_ms=20 subbuf_size=16384"}


def migrate(qmp_path, port, timeout=120):
    """QMP migrate to 127.0.0.1:port; returns query-migrate's final answer (status completed)."""
    q = QMP(qmp_path)
    try:
        q.cmd("migrate", uri=f"tcp:127.0.0.1:{port}")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            info = q.cmd("query-migrate")
            if info.get("status") == "completed":
                return info
            if info.get("status") in ("failed", "cancelled"):
                pytest.fail(f"migration {info.get('status')}: {info}")
            time.sleep(0.2)
        pytest.fail(f"migration did not complete within {timeout} s: {info}")
    finally:
        q.close()


def loadgen_result(console):
    for line in console.splitlines():
        if line.startswith("MIG: loadgen "):
            return json.loads(line[len("MIG: loadgen "):])
    pytest.fail("the guest printed no loadgen result:\n" + console[-3000:])


def vm_kwargs(add, tmp, tag, qmp_path, extra):
    return dict(run=GUEST_SCRIPT, modules=["ivtrace"], modopts=MODOPTS, add=add, smp=2,
                append=DIAG_APPEND,
                mem="256M", log=str(tmp / f"console-{tag}.log"),
                extra_args=["-name", f"{NAME},debug-threads=on",
                            "-qmp", f"unix:{qmp_path},server=on,wait=off", *extra])


# no_timer_check: a busy host can fail the IO-APIC timer check. The rest is for a guest that
# hangs (docs/migration.md "A guest that hangs while the module loads"): loglevel=5 lets the
# soft-lockup report's backtrace through `quiet`, softlockup_all_cpu_backtrace=1 adds every
# other CPU's, and nokaslr keeps the vCPUs' instruction pointers nameable afterwards.
DIAG_APPEND = "no_timer_check loglevel=5 softlockup_all_cpu_backtrace=1 nokaslr"
SOFT_LOCKUP = r"watchdog: BUG: soft lockup - CPU#\d+ stuck for \d+s! \[[^\]]*\]"


def vcpu_state(qmp_path):
    """Every vCPU's instruction pointer, flags, halted state and local APIC (IRR: interrupts
    raised but not yet taken), from QEMU's monitor. With nokaslr, any later boot's
    /proc/kallsyms names the addresses (the Debian package ships no System.map)."""
    q = QMP(qmp_path)

    def hmp(line):
        return q.cmd("human-monitor-command", **{"command-line": line}).replace("\r", "")

    try:
        regs = hmp("info registers -a")
        lapic = "".join(hmp(f"info lapic {n}") for n in range(2))
    finally:
        q.close()
    rips = [f"CPU#{m[1]}: RIP {m[2]} RFL={m[3]} HLT={m[4]}"
            for m in re.finditer(r"^CPU#(\d+)\nRAX=.*?RIP=([0-9a-f]+) RFL=([0-9a-f]+).*?HLT=(\d)",
                                 regs, re.M | re.S)]
    return "\n".join(rips) + "\n" + lapic


def wait_writing(vm, qmp_path):
    """Wait for the guest's "MIG: writing". A soft lockup in the guest kernel fails the run at
    once, with the console's backtraces and the vCPUs' state, rather than after s.TIMEOUT; it is
    reported, never retried: a module that hangs the guest must be seen."""
    m = vm.wait_for(rf"^MIG: writing|{SOFT_LOCKUP}", timeout=s.TIMEOUT)
    if m.group(0).startswith("MIG"):
        return
    time.sleep(8)  # the other CPUs' backtraces follow the report
    try:
        state = vcpu_state(qmp_path)
    except Exception as e:  # noqa: BLE001 - the lockup is the failure; the dump is extra
        state = f"(QEMU's monitor did not answer: {e!r})"
    pytest.fail(f"the guest kernel locked up before the workload started ({m.group(0)}); "
                f"docs/migration.md 'A guest that hangs while the module loads' says what is "
                f"known. vCPUs:\n{state}\nconsole:\n{vm.console_text[-12000:]}")


def plain_device(shm):
    """ivshmem-plain on a shared file, master=on: QEMU 7.2 migrates the device's memory only
    for a master (without it: "Migration is disabled when using feature 'peer mode'")."""
    s.ivtvm.prepare_shm(Path(shm), 4 << 20, clear=True)
    return ["-object", f"memory-backend-file,id=ivshm0,size=4M,share=on,mem-path={shm}",
            "-device", "ivshmem-plain,memdev=ivshm0,master=on"]


def doorbell_device(sock):
    return ["-chardev", f"socket,id=ivsh,path={sock}",
            "-device", "ivshmem-doorbell,chardev=ivsh,vectors=2,master=on"]


# ------------------------------------------------------------------------------- the runs

def run_doorbell(tmp, add):
    a = s.Server(tmp / "a", "--size", "4M", "--sync-interval", "1")
    b = s.Server(tmp / "b", "--size", "4M", "--sync-interval", "1")
    qa, qb = tmp / "qa.sock", tmp / "qb.sock"
    [port] = free_ports(1)
    t = {}
    try:
        with s.ivtvm.VM(**vm_kwargs(add, tmp, "a", qa, doorbell_device(a.sock))) as vm_a:
            wait_writing(vm_a, qa)
            a.wait_guest(NAME, "recording", timeout=60)
            vm_b = s.ivtvm.VM(**vm_kwargs(add, tmp, "b", qb, [
                *doorbell_device(b.sock), "-incoming", f"tcp:127.0.0.1:{port}"]))
            vm_b.start()
            try:
                b.wait_guest(NAME, "incoming migration", timeout=60)
                # B's serve refuses to read the region before the migration is over.
                rc, v = b.ctl("--guest", NAME, "flush", check=False)
                t["control_before_resume"] = v
                time.sleep(3)  # events written on A before the migration
                t["migrate"] = migrate(qa, port)
                _, t["handoff"] = a.ctl("--guest", NAME, "handoff")
                handoff = Path(t["handoff"]["result"]) / "handoff.json"
                wait_for(handoff.exists, 60, f"{handoff} to appear")
                _, t["resume"] = b.ctl("--guest", NAME, "resume", handoff)
                vm_a.kill()
                vm_b.wait_for(r"^MIG: done", timeout=s.TIMEOUT)
                r_b = vm_b.wait(timeout=s.TIMEOUT)
            finally:
                vm_b.kill()
        assert r_b.exit_code == 0 and not r_b.panicked, r_b.explain()
        time.sleep(0.5)
        rc_a, sum_a = a.stop()
        rc_b, sum_b = b.stop()
    finally:
        a.cleanup()
        b.cleanup()
    assert rc_a == 0, a.stderr()
    assert rc_b == 0, b.stderr()
    t["logs"] = {"a": a.stderr(), "b": b.stderr()}
    return {"a": tmp / "a" / NAME, "b": tmp / "b" / NAME, "console": r_b.console_text,
            "sum_a": sum_a[NAME][-1], "sum_b": sum_b[NAME][-1], "t": t}


def recorder(shm, out, *extra):
    log = open(f"{out}.log", "wb")
    return subprocess.Popen([str(s.IVTRACE), "record", "--shm", str(shm), "-o", str(out),
                             "--name", NAME, "--clock-sync", "--json", *map(str, extra)],
                            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)


def finish(proc, what, sig=None):
    if sig is not None:
        proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{what} did not finish")
    assert proc.returncode == 0, f"{what} exited {proc.returncode}"
    return json.loads(out.decode())


def run_plain(tmp, add):
    shm_a = Path("/dev/shm") / f"{NAME}-plain-a-{os.getpid()}"
    shm_b = Path("/dev/shm") / f"{NAME}-plain-b-{os.getpid()}"
    qa, qb = tmp / "qa.sock", tmp / "qb.sock"
    [port] = free_ports(1)
    t = {}
    out_a, out_b = tmp / "a", tmp / "b"
    rec_a = rec_b = None
    try:
        with s.ivtvm.VM(**vm_kwargs(add, tmp, "a", qa, plain_device(shm_a))) as vm_a:
            rec_a = recorder(shm_a, out_a)
            wait_writing(vm_a, qa)
            vm_b = s.ivtvm.VM(**vm_kwargs(add, tmp, "b", qb, [
                *plain_device(shm_b), "-incoming", f"tcp:127.0.0.1:{port}"]))
            vm_b.start()
            try:
                rec_b = recorder(shm_b, out_b, "--resume-from", out_a / "handoff.json")
                time.sleep(3)
                t["migrate"] = migrate(qa, port)
                rec_a.send_signal(signal.SIGUSR1)
                sum_a = finish(rec_a, "record on A")
                vm_a.kill()
                vm_b.wait_for(r"^MIG: done", timeout=s.TIMEOUT)
                r_b = vm_b.wait(timeout=s.TIMEOUT)
            finally:
                vm_b.kill()
        assert r_b.exit_code == 0 and not r_b.panicked, r_b.explain()
        sum_b = finish(rec_b, "record on B", signal.SIGINT)
    finally:
        for p in (rec_a, rec_b):
            if p is not None and p.poll() is None:
                p.kill()
        shm_a.unlink(missing_ok=True)
        shm_b.unlink(missing_ok=True)
    t["logs"] = {"a": Path(f"{out_a}.log").read_text(), "b": Path(f"{out_b}.log").read_text()}
    return {"a": out_a, "b": out_b, "console": r_b.console_text, "sum_a": sum_a,
            "sum_b": sum_b, "t": t}


@pytest.fixture(scope="module", params=["doorbell", "plain"])
def migrated(request, tmp_path_factory, guest):
    tmp = Path(tempfile.mkdtemp(prefix=f"mig-{request.param}-", dir=tmp_path_factory.getbasetemp()))
    add = guest.add("ivtrace.ko", "ivtrace-loadgen-static")
    t0 = time.monotonic()
    r = (run_doorbell if request.param == "doorbell" else run_plain)(tmp, add)
    r["variant"] = request.param
    r["seconds"] = time.monotonic() - t0
    r["parts"] = {k: read_part(r[k]) for k in ("a", "b")}
    return r


# ------------------------------------------------------------------------------- reading

def read_part(path):
    """Per channel (trace domain, stream class, stream instance): event times (ns) and packet
    sequence numbers; loadgen's sequence numbers; discarded events announced."""
    import bt2
    chans, seqs, discarded = {}, [], 0
    for msg in bt2.TraceCollectionMessageIterator(str(path)):
        t = type(msg)
        if t is bt2._EventMessageConst:
            st = msg.event.stream
            if st.trace.environment.get("domain") == "host" or "hostname" not in st.trace.environment:
                pass
            key = (str(st.trace.environment.get("domain", "?")), st.cls.id, st.id)
            c = chans.setdefault(key, {"ns": [], "packets": set()})
            c["ns"].append(msg.default_clock_snapshot.ns_from_origin)
            if msg.event.name == "loadgen:payload":
                seqs.append(int(msg.event.payload_field["seq"]))
        elif t is bt2._PacketBeginningMessageConst:
            st = msg.packet.stream
            key = (str(st.trace.environment.get("domain", "?")), st.cls.id, st.id)
            ctx = msg.packet.context_field
            if ctx is not None and "packet_seq_num" in ctx:
                chans.setdefault(key, {"ns": [], "packets": set()})["packets"].add(
                    int(ctx["packet_seq_num"]))
        elif t is bt2._DiscardedEventsMessageConst:
            if msg.count is not None:
                discarded += msg.count
    return {"chans": chans, "seqs": seqs, "discarded": discarded}


# ------------------------------------------------------------------------------- checks

def test_every_event_is_in_one_part_or_counted(migrated):
    lg = loadgen_result(migrated["console"])
    a, b = migrated["parts"]["a"], migrated["parts"]["b"]
    in_a, in_b = set(a["seqs"]), set(b["seqs"])
    print(f"\n{migrated['variant']}: loadgen {lg}; A {len(in_a)} events (seq "
          f"{min(in_a, default=None)}..{max(in_a, default=None)}), B {len(in_b)} (seq "
          f"{min(in_b, default=None)}..{max(in_b, default=None)}); discarded A {a['discarded']} "
          f"B {b['discarded']}; {migrated['seconds']:.0f} s")
    assert len(a["seqs"]) == len(in_a) and len(b["seqs"]) == len(in_b), "an event twice in a part"
    assert not in_a & in_b, f"events in both parts: {sorted(in_a & in_b)[:10]}"
    assert in_a and in_b, "the guest wrote on both hosts"
    # Before, during and after: A holds the beginning, B the end.
    assert max(in_a) < EVENTS - 1000 and min(in_b) > 1000
    missing = set(range(EVENTS)) - in_a - in_b
    lost_loadgen = lg["attempted"] - lg["written"]
    assert len(in_a) + len(in_b) + a["discarded"] + b["discarded"] >= EVENTS - lost_loadgen
    assert len(missing) <= lost_loadgen + a["discarded"] + b["discarded"], sorted(missing)[:20]
    assert lg["attempted"] == EVENTS


def test_no_packet_in_both_parts_and_time_runs_forward(migrated):
    a, b = migrated["parts"]["a"]["chans"], migrated["parts"]["b"]["chans"]
    compared = 0
    for key in set(a) & set(b):
        if key[0] == "host":
            continue  # each host's own trace
        both = a[key]["packets"] & b[key]["packets"]
        assert not both, f"{key}: packets {sorted(both)} in both parts"
        if a[key]["ns"] and b[key]["ns"]:
            compared += 1
            assert max(a[key]["ns"]) <= min(b[key]["ns"]), key
        for part in (a, b):
            ns = part[key]["ns"]
            assert all(x <= y for x, y in zip(ns, ns[1:])), key
    assert compared >= 2, f"channels written on both hosts: {compared}"


def test_babeltrace2_reads_both_parts_at_once(migrated):
    p = subprocess.run(["babeltrace2", str(migrated["a"]), str(migrated["b"])],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count("loadgen:payload") == (len(migrated["parts"]["a"]["seqs"])
                                                 + len(migrated["parts"]["b"]["seqs"]))


def test_each_part_has_its_own_clock_and_the_handoff_joins_them(migrated):
    sa = json.loads((migrated["a"] / "ivtrace.json").read_text())
    sb = json.loads((migrated["b"] / "ivtrace.json").read_text())
    assert sa["migration"]["part"] == 0 and sa["migration"]["handoff"]
    assert sb["migration"]["part"] == 1 and sb["migration"]["resumed_from"]
    assert sa["trace_uuid"] != sb["trace_uuid"]
    ca, cb = sa["clock"], sb["clock"]
    print(f"\n{migrated['variant']}: clock A {ca['method']} +-{ca['error_ns']} ns, "
          f"B {cb['method']} +-{cb['error_ns']} ns; migration {migrated['t']['migrate']}")
    assert cb["method"] == ca["method"] and "ping" in cb["method"], (ca, cb)
    # How far B's mapping places a guest tick from where A's would: under TCG the guest TSC
    # stands still while the guest is stopped, so about the stop time (a print, not a check).
    t = cb["ref_ticks"]
    at = {k: c["ref_realtime_ns"] + (t - c["ref_ticks"]) * 1e9 / c["freq_hz"]
          for k, c in (("a", ca), ("b", cb))}
    print(f"{migrated['variant']}: B's mapping minus A's at B's reference tick: "
          f"{(at['b'] - at['a']) / 1e6:.3f} ms (migration downtime "
          f"{migrated['t']['migrate'].get('downtime')} ms)")
    if migrated["variant"] == "doorbell":
        assert len(sb["clock_sync"]["pingpong"]["points"]) > 0
        assert not migrated["t"]["control_before_resume"]["ok"]
