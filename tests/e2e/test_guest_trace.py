"""A real guest traced from boot to unload, recorded live by the host (one boot).

The guest (QEMU, Debian kernel, ivtrace.ko loaded by /init, default event groups) runs
GUEST_SCRIPT while `ivtrace record` drains the region on the host:
  1. a printk marker; ivtwl forks K children with known names (the name is theirs from the
     fork on); ivtrace-loadgen-static writes M known events per thread through /dev/ivtrace;
  2. rmmod ivtrace: the region is CLOSED and the recorder must stop by itself; the guest waits
     until the host says so (ivtwl hostwait: the BAR's last word), then insmod again;
  3. a second, short session recorded by a second `ivtrace record`: user events, a marker;
     rmmod again; /init checks dmesg for BUG/WARNING/Oops and powers off.
babeltrace2 (bt2) reads both recordings; every user payload is recomputed.

Module-level unload/reload cycles, control commands and the published event table are
tests/kmod/test_kmod.py's; this file is about what a user gets: a live recording of a guest.
"""
import re
import subprocess

import pytest

from e2e import guest as g

K_NAMES = ["e2e-kid-0", "e2e-kid-1", "e2e-kid-2", "e2e-kid-3"]
M = 3000                 # events per loadgen thread, session 1
THREADS = 2
LO, HI = 1, 200          # payload bytes
M2, SIZE2 = 500, 24      # session 2: one thread, fixed size
MAGIC = 0x5EC0_4D5E_5510_4E21  # host -> guest: "recorder 1 is done"

GUEST_SCRIPT = r"""
M=/lib/modules/$(uname -r)/extra
# Kernel lines reach the serial console at once, ours through the tty queue: let the queue
# drain (tcsetattr TCSADRAIN) before the kernel prints, or its line lands inside ours.
drain() {{ stty -F /dev/console -echo 2>/dev/null; }}
echo "<3>E2E-PRINTK {token} before the children" > /dev/kmsg
ivtwl kids --ms 300 {kids}
echo "E2E: kids rc=$?"
ivtrace-loadgen-static --shm /dev/ivtrace --events {m} --threads {threads} --size {lo}-{hi} \
    --json > /tmp/lg1.json
echo "E2E: loadgen1 rc=$?"
echo "E2E-LG1 $(cat /tmp/lg1.json)"
drain
rmmod ivtrace
echo "E2E: rmmod1 rc=$?"
ivtwl hostwait {magic:x} 120
echo "E2E: hostwait rc=$?"
insmod $M/ivtrace.ko
echo "E2E: insmod2 rc=$?"
echo "E2E: reloaded"
ivtrace-loadgen-static --shm /dev/ivtrace --events {m2} --size {size2} --json > /tmp/lg2.json
echo "E2E: loadgen2 rc=$?"
echo "E2E-LG2 $(cat /tmp/lg2.json)"
drain
echo "<3>E2E-PRINTK {token} after the reload" > /dev/kmsg
sleep 0.3
rmmod ivtrace
echo "E2E: rmmod2 rc=$?"
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, e2e_add):
    tmp = tmp_path_factory.mktemp("guest-trace")
    shm = g.shm_path("trace")
    tok = g.token()
    script = GUEST_SCRIPT.format(token=tok, kids=" ".join(K_NAMES), m=M, threads=THREADS,
                                 lo=LO, hi=HI, magic=MAGIC, m2=M2, size2=SIZE2)
    rec1 = g.Recorder(shm, tmp / "s1")
    rec2 = None
    try:
        with g.ivtvm.VM(script, shm=str(shm), shm_size="16M", shm_clear=True, smp=2,
                        modules=["ivtrace"], add=e2e_add, log=str(tmp / "console.log")) as vm:
            try:
                vm.wait_for(r"^E2E: rmmod1 rc=", timeout=g.TIMEOUT)
                sum1 = rec1.wait(timeout=60)       # CLOSED -> stops by itself
                g.write_last_word(shm, MAGIC)
                vm.wait_for(r"^E2E: reloaded", timeout=120)
                rec2 = g.Recorder(shm, tmp / "s2")
            finally:
                r = vm.wait(timeout=g.TIMEOUT)
        sum2 = rec2.wait(timeout=60) if rec2 else None
    finally:
        rec1.stop()
        if rec2:
            rec2.stop()
        shm.unlink(missing_ok=True)
    print(r.summary())
    return {"boot": r, "token": tok, "rec1": rec1, "sum1": sum1, "rec2": rec2, "sum2": sum2,
            "out1": tmp / "s1", "out2": tmp / "s2"}


@pytest.fixture(scope="module")
def trace1(run):
    return g.read(run["out1"])


def test_guest_ran_clean(run):
    r = run["boot"]
    text = r.console_text
    assert r.ok and r.powered_off, r.explain(60)
    rcs = dict(re.findall(r"^E2E: (\w+) rc=(\d+)", text, re.M))
    assert rcs == {"kids": "0", "loadgen1": "0", "rmmod1": "0", "hostwait": "0",
                   "insmod2": "0", "loadgen2": "0", "rmmod2": "0"}, r.explain(60)
    # /init's dmesg check over the whole boot (both sessions, both unloads)
    assert not r.kernel_problems and g.marks(text, "IVTRACE-GUEST: dmesg-problems ") == ["0"], \
        r.kernel_problems


def test_recorder_stopped_by_itself_without_loss(run):
    rec, s = run["rec1"], run["sum1"]
    assert rec.rc == 0, rec.stderr()
    assert s["stop_reason"] == "region closed by its owner", s["stop_reason"]
    assert g.lost(s) == {}, g.lost(s)
    lg = g.console_json(run["boot"].console_text, "E2E-LG1")
    assert (lg["written"], lg["dropped"]) == (M * THREADS, 0), lg


def test_no_discarded_events_in_ctf(trace1):
    _, discarded = trace1
    assert discarded == 0


def test_user_events_exact(trace1):
    events, _ = trace1
    g.check_loadgen(g.by_name(events, g.LOADGEN_EVENT), THREADS, M, LO, HI)


def test_fork_events_name_the_children(run, trace1):
    events, _ = trace1
    kids = g.kids(run["boot"].console_text)
    assert sorted(kids) == sorted(K_NAMES), run["boot"].tail(40)
    forks = {e.payload["child_tid"]: e.payload for e in g.by_name(events, "sched_process_fork")}
    for name, pid in kids.items():
        assert pid in forks, f"no sched_process_fork for {name} (tid {pid})"
        assert forks[pid]["child_comm"] == name, forks[pid]
        assert forks[pid]["child_pid"] == pid, forks[pid]


def test_children_are_scheduled(run, trace1):
    """Wire form: sched_switch carries thread ids; each child runs (next_tid)."""
    events, _ = trace1
    kids = g.kids(run["boot"].console_text)
    switched_in = {e.payload["next_tid"] for e in g.by_name(events, "sched_switch")}
    assert set(kids.values()) <= switched_in, (kids, len(switched_in))


def test_sched_switch_names_the_children(run, trace1):
    events, _ = trace1
    kids = g.kids(run["boot"].console_text)
    switches = g.by_name(events, "sched_switch")
    assert switches and "next_comm" in switches[0].payload, sorted(switches[0].payload)
    names = {}
    for e in switches:
        names.setdefault(e.payload["next_tid"], set()).add(e.payload["next_comm"])
    for name, pid in kids.items():
        assert name in names.get(pid, set()), (name, pid, names.get(pid))


def test_printk_marker(run, trace1):
    events, _ = trace1
    msgs = [e.payload["msg"] for e in g.by_name(events, "printk_console")]
    want = f"E2E-PRINTK {run['token']} before the children"
    assert any(want in m for m in msgs), msgs[-10:]
    assert not any(f"{run['token']} after the reload" in m for m in msgs)


def test_reload_records_again(run):
    """After rmmod + insmod in the same boot, a second recording sees a new session."""
    rec2, s2 = run["rec2"], run["sum2"]
    assert rec2 is not None and rec2.rc == 0, rec2 and rec2.stderr()
    assert s2["stop_reason"] == "region closed by its owner", s2["stop_reason"]
    assert s2["trace_uuid"] != run["sum1"]["trace_uuid"]
    assert g.lost(s2) == {}, g.lost(s2)
    lg = g.console_json(run["boot"].console_text, "E2E-LG2")
    assert (lg["written"], lg["dropped"]) == (M2, 0), lg
    events, discarded = g.read(run["out2"])
    assert discarded == 0
    g.check_loadgen(g.by_name(events, g.LOADGEN_EVENT), 1, M2, SIZE2, SIZE2)
    msgs = [e.payload["msg"] for e in g.by_name(events, "printk_console")]
    assert any(f"E2E-PRINTK {run['token']} after the reload" in m for m in msgs), msgs[-10:]
    assert g.by_name(events, "sched_switch") and g.by_name(events, "lttng_statedump_end")


def test_babeltrace2_reads_the_whole_output(run):
    """`babeltrace2 OUT` (what a user types) reads kernel and user events together. Run in a
    child process: the bt2 assertion aborts the process."""
    p = subprocess.run(["babeltrace2", str(run["out1"]), "-c", "sink.utils.counter"],
                         capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-500:]
    n = int(re.findall(r"^\s*(\d+) Event messages", p.stdout, re.M)[-1])
    assert n == sum(c["events"] for c in run["sum1"]["channels"])
