"""What survives a guest that dies: `ivtrace snapshot` of the backing file after QEMU is gone
(two boots, no recorder running during either).

1. Kernel panic: ivtrace.ko in flight-recorder mode (mode=overwrite); ivtrace-loadgen-static
   writes N known events per thread, a known line goes to the kernel log, then
   `echo c > /proc/sysrq-trigger`. After QEMU exits: every event loadgen committed, with its
   exact payload, and the last kernel log lines, the panic message included, in order.
2. QEMU killed with SIGKILL while loadgen is writing (stream mode, no reader): the snapshot
   holds user events with contiguous sequence numbers from 0, at least every event of the
   packets the host saw complete before the kill.

tests/kmod/test_kmod.py checks the panic salvage at module level (the kernel API's events,
the panic line); here the writer is a user-space program and the checks are per event.
"""
import mmap
import os
import signal
import struct
from pathlib import Path

import pytest

from common import wait_for
from e2e import guest as g

THREADS, N, LO, HI = 2, 2000, 1, 100
PANIC_SCRIPT = r"""
ivtrace-loadgen-static --shm /dev/ivtrace --events {n} --threads {threads} --size {lo}-{hi} \
    --json > /tmp/lg.json
echo "E2E: loadgen rc=$?"
echo "E2E-LG $(cat /tmp/lg.json)"
# A panic throws away console output still queued in the tty: drain it first
# (tcsetattr TCSADRAIN waits until the UART has sent everything, as /init does).
stty -F /dev/console -echo 2>/dev/null
sleep 0.2
echo "<2>E2E-LAST-WORDS {token}" > /dev/kmsg
echo c > /proc/sysrq-trigger
sleep 10
echo "E2E: survived the panic"
"""

KLO, KHI = 8, 64         # payload bytes: events of 4 + 2 + 8 + 9..65 = 23..79 bytes
KILL_SCRIPT = r"""
echo "E2E: writing"
ivtrace-loadgen-static --shm /dev/ivtrace --events 1000000 --rate 2000 --size {lo}-{hi}
echo "E2E: loadgen ended rc=$?"
"""


def panic_and_salvage(tmp_path_factory, tag, script, add, modopts="mode=overwrite"):
    """Boot a guest whose script ends in a kernel panic (QEMU exits: panic=-1, -no-reboot),
    then `ivtrace snapshot` the region it left behind."""
    tmp = tmp_path_factory.mktemp(f"guest-{tag}")
    shm = g.shm_path(tag)
    try:
        r = g.ivtvm.boot(script, shm=str(shm), shm_size="16M", shm_clear=True, smp=2,
                         modules=["ivtrace"], modopts={"ivtrace": modopts}, add=add,
                         log=str(tmp / "console.log"), timeout=g.TIMEOUT)
        assert r.qemu_returncode is not None and not r.timed_out, r.explain()
        summary = g.snapshot(shm, tmp / "snap")
    finally:
        shm.unlink(missing_ok=True)
    print(r.summary())
    return {"boot": r, "summary": summary, "out": tmp / "snap"}


def lines_to_the_panic(msgs, token):
    """(index of the last words, index of the panic line) in the salvaged printk lines; the
    panic line comes after the last words."""
    last = next((i for i, m in enumerate(msgs) if f"E2E-LAST-WORDS {token}" in m), None)
    assert last is not None, msgs[-10:]
    panic = next((i for i, m in enumerate(msgs) if "Kernel panic - not syncing" in m), None)
    assert panic is not None and panic > last, msgs[last:][:40]
    assert "sysrq triggered crash" in msgs[panic], msgs[panic]
    return last, panic


@pytest.fixture(scope="module")
def panicked(tmp_path_factory, e2e_add):
    tok = g.token()
    script = PANIC_SCRIPT.format(n=N, threads=THREADS, lo=LO, hi=HI, token=tok)
    return {**panic_and_salvage(tmp_path_factory, "panic", script, e2e_add), "token": tok}


def test_guest_panicked(panicked):
    r = panicked["boot"]
    assert r.panicked and "sysrq triggered crash" in r.panic_message, r.explain()
    assert "E2E: survived the panic" not in r.console_text
    assert g.marks(r.console_text, "E2E: loadgen rc=") == ["0"], r.explain()


def test_snapshot_has_every_committed_user_event(panicked):
    lg = g.console_json(panicked["boot"].console_text, "E2E-LG")
    assert (lg["written"], lg["dropped"]) == (N * THREADS, 0), lg
    events, discarded = g.read(panicked["out"])
    assert discarded == 0
    g.check_loadgen(g.by_name(events, g.LOADGEN_EVENT), THREADS, N, LO, HI)


def test_snapshot_has_the_last_kernel_log_lines(panicked):
    events, _ = g.read(panicked["out"])
    msgs = [e.payload["msg"] for e in g.by_name(events, "printk_console")]
    last, panic = lines_to_the_panic(msgs, panicked["token"])
    # the sysrq handler's own line comes between the two
    assert any("sysrq" in m.lower() for m in msgs[last + 1:panic]), msgs[last:panic + 1]


# --------------------------------------------------------------------------- panic under a flood

# CPU 1 prints kernel log lines without a pause (every level reaches the consoles: ivtrace's and
# the UART, each written with interrupts off under the console lock) while CPU 0 panics: the
# panic finds the console busy on the other CPU, stops that CPU (by NMI if its interrupts stay
# off), perhaps in the middle of ivtrace's console write, and flushes the log itself.
FLOOD_SCRIPT = r"""
dmesg -n 8
taskset -c 1 sh -c 'i=0; while :; do echo "E2E-FLOOD $i" > /dev/kmsg; i=$((i+1)); done' &
sleep 2
stty -F /dev/console -echo 2>/dev/null
echo "<2>E2E-LAST-WORDS {token}" > /dev/kmsg
taskset -c 0 sh -c 'echo c > /proc/sysrq-trigger'
sleep 10
echo "E2E: survived the panic"
"""


@pytest.fixture(scope="module")
def flooded(tmp_path_factory, e2e_add):
    tok = g.token()
    script = FLOOD_SCRIPT.format(token=tok)
    return {**panic_and_salvage(tmp_path_factory, "panic-flood", script, e2e_add), "token": tok}


def test_a_panic_beside_a_console_flood_ends_and_is_salvaged(flooded):
    r = flooded["boot"]
    assert r.panicked and "sysrq triggered crash" in r.panic_message, r.explain()
    assert "E2E: survived the panic" not in r.console_text
    events, _ = g.read(flooded["out"])
    lines = g.by_name(events, "printk_console")
    # A record is written to the consoles by whichever CPU holds the console lock then: the
    # flood's lines come from CPU 1's console writes, and from CPU 0's too (its own printk
    # calls and the flush at the panic print what CPU 1 stored)
    flood_cpus = {e.cpu for e in lines if "E2E-FLOOD" in e.payload["msg"]}
    assert 1 in flood_cpus, flood_cpus
    lines_to_the_panic([e.payload["msg"] for e in lines], flooded["token"])


# --------------------------------------------------------------------------- SIGKILL

def user_commit_packets(shm):
    """Complete packets committed on the region's first user channel (0 if not formatted)."""
    with open(shm, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            if struct.unpack_from("<Q", m, 0)[0] != 0x3145434152545649:  # "IVTRACE1"
                return 0
            ch_off = struct.unpack_from("<Q", m, 64)[0]
            nr, nk, csz, _nsub, subsz = struct.unpack_from("<IIIII", m, 92)
            # channel word 0 is commit_pos (docs/abi.md, struct ivt_channel)
            return struct.unpack_from("<Q", m, ch_off + nk * csz)[0] // subsz
        finally:
            m.close()


@pytest.fixture(scope="module")
def killed(tmp_path_factory, e2e_add):
    tmp = tmp_path_factory.mktemp("guest-sigkill")
    shm = g.shm_path("kill")
    try:
        with g.ivtvm.VM(KILL_SCRIPT.format(lo=KLO, hi=KHI), shm=str(shm), shm_size="16M",
                        shm_clear=True, smp=2, modules=["ivtrace"], add=e2e_add,
                        log=str(tmp / "console.log")) as vm:
            vm.wait_for(r"^E2E: writing", timeout=g.TIMEOUT)
            # at 2000 events/s a 64 KiB packet fills in ~0.7 s (guest time)
            wait_for(lambda: user_commit_packets(shm) >= 3, 120, "3 complete user packets")
            before = user_commit_packets(shm)
            os.kill(vm.proc.pid, signal.SIGKILL)
            r = vm.wait(timeout=30)
        summary = g.snapshot(shm, tmp / "snap")
    finally:
        shm.unlink(missing_ok=True)
    print(r.summary())
    return {"boot": r, "packets_before": before, "summary": summary, "out": tmp / "snap"}


def test_sigkill_snapshot_contiguous_from_zero(killed):
    r = killed["boot"]
    assert r.qemu_returncode == -signal.SIGKILL and r.exit_code is None, r.explain()
    assert "E2E: loadgen ended" not in r.console_text
    events, _ = g.read(killed["out"])
    users = g.by_name(events, g.LOADGEN_EVENT)
    seqs = sorted(e.payload["seq"] for e in users)
    assert seqs == list(range(len(seqs))), "user events not contiguous from seq 0"
    # no reader in stream mode: kernel channels fill up and drop (counted); the user channel
    # was paced to stay below its ring's capacity
    user = [c for c in killed["summary"]["channels"] if c["stream_class"] == 1]
    assert len(user) == 1 and not any(user[0]["lost"].values()), user
    # every payload exact; at least the packets seen complete before the kill
    g.check_loadgen(users, 1, len(seqs), KLO, KHI)
    per_packet = (64 * 1024 - 88 - 1) // 80    # the fewest events a full packet holds
    assert len(seqs) >= killed["packets_before"] * per_packet, (len(seqs), killed)
    assert g.by_name(events, "sched_switch"), "no kernel events salvaged"


# --------------------------------------------------------------------------- names after a crash

NAMES_SUBBUFS = 4        # 4 x 4 KiB per CPU: the demo wraps these rings many times
DEMO_SH = Path(__file__).resolve().parents[2] / "vm" / "guest" / "workload" / "demo.sh"
WRAPPED_SCRIPT = r"""
/workload/demo.sh 4
echo "E2E: demo rc=$?"
stty -F /dev/console -echo 2>/dev/null
sleep 0.2
echo c > /proc/sysrq-trigger
sleep 10
echo "E2E: survived the panic"
"""
# (tid field, name field) pairs of the expanded kernel trace that name a thread.
TID_COMM = [("prev_tid", "prev_comm"), ("next_tid", "next_comm"), ("tid", "comm"),
            ("parent_tid", "parent_comm"), ("child_tid", "child_comm")]


def packet_seqs(path):
    """packet_seq_num of every packet of a CTF stream file (struct ivt_packet_hdr)."""
    seqs, data, off = [], path.read_bytes(), 0
    while off + 88 <= len(data):
        size_bits, seq = struct.unpack_from("<QQ", data, off + 40)
        seqs.append(seq)
        off += size_bits // 8
    return seqs


@pytest.fixture(scope="module")
def wrapped(tmp_path_factory, e2e_add):
    """A flight recorder whose rings wrapped many times, then a kernel panic, then salvage."""
    add = list(e2e_add) + [f"{DEMO_SH}:/workload/"]
    opts = (f"mode=overwrite subbuf_size=4096 nr_subbufs={NAMES_SUBBUFS} "
            "events=sched,irq,timer,kmem,syscall,printk")
    return panic_and_salvage(tmp_path_factory, "names", WRAPPED_SCRIPT, add, opts)


def test_wrapped_rings_then_panic(wrapped):
    r = wrapped["boot"]
    assert r.panicked and "sysrq triggered crash" in r.panic_message, r.explain()
    assert g.marks(r.console_text, "E2E: demo rc=") == ["0"], r.explain()
    chans = sorted((wrapped["out"] / "kernel").glob("kernel_chan*"))
    assert chans
    for c in chans:
        seqs = packet_seqs(c)
        # packets 0 .. max were written, the newest NAMES_SUBBUFS kept: wrapped >= 3 times
        assert seqs and max(seqs) + 1 >= (3 + 1) * NAMES_SUBBUFS, (c.name, seqs)
        assert min(seqs) > 0, f"{c.name}: its first packet survived, the ring never wrapped"


def test_salvaged_trace_names_its_threads(wrapped):
    events, _ = g.read(wrapped["out"])
    assert not g.by_name(events, "lttng_statedump_start"), "the state dump was not overwritten?"
    names = {}
    for e in events:
        for tid, comm in TID_COMM:
            if e.payload and tid in e.payload and comm in e.payload and e.payload[tid] > 0:
                names.setdefault(e.payload[tid], set()).add(e.payload[comm])
    named = [t for t, ns in names.items() if any(ns)]
    share = len(named) / len(names)
    print(f"{len(named)} of {len(names)} threads named ({share:.1%})")
    assert len(names) >= 10 and share >= 0.95, {t: ns for t, ns in names.items() if not any(ns)}
    x = wrapped["summary"]["kernel_expansion"]
    # the rings alone could not name them all: the guest's name table did
    assert x["name_table_entries"] > 0 and x["comm_from_table"] > 0, x
