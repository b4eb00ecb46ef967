"""guest/kmod: ivtrace.ko in a real guest (QEMU, TCG on these machines), one boot.

The guest (python/ivtools/ivtvm.py, ivshmem-plain backed by a /dev/shm file) runs GUEST_SCRIPT:
  1. insmod ivtrace.ko (discard mode, default groups); the host sends control commands
     through the region (ivshmem-plain: the module polls them); /dev/ivtrace and the console
     exist; ivtrace_test.ko writes 100 events (+10 blobs) through the kernel API;
  2. rmmod/insmod ivtrace.ko twice;
  3. the last load in overwrite mode with every group and vmsync every 10 ms, 100 test events
     again, 5 hypercalls through the kernel API (KVM only: under TCG the module must refuse
     them and keep vmsync off, never execute vmcall, which raises #UD there), a crit-level
     line into the kernel log, a dmesg check (BUG/WARNING/Oops) done in the guest;
  4. a kernel panic (sysrq c), so the host salvages a region whose writer died.
The host then checks the region header and the published event descriptions against
docs/abi.md's kernel table, and reads the region with `ivtrace snapshot` + babeltrace2:
scheduler and state dump events, the test events' exact payloads, the panic line.

Run: /usr/bin/python3 -m pytest tests/kmod (the guest is built by the session fixture
`guest`, tests/conftest.py; `make host` for the snapshot checks).
"""
import json
import mmap
import os
import re
import struct
import subprocess
import time
from pathlib import Path

import pytest

from ivtools import ivtvm

REPO = Path(__file__).resolve().parents[2]
IVTRACE = REPO / "bin" / "ivtrace"

TIMEOUT = float(os.environ.get("IVTRACE_VM_TIMEOUT", "240"))
SMP = 2
TEST_MAGIC = 0x1F7ACE5D  # guest/kmod/tests/ivtrace_test.c
IVT_MAGIC = 0x3145434152545649

# The kernel stream's events as their one definition says (abi/include/ivtrace/kernel_events.h,
# printed as abi/kernel_events.json): id -> (name, group, [(field, type, flags, count)]).
TYPES = {"u8": 1, "u16": 2, "u32": 3, "u64": 4, "s8": 5, "s16": 6, "s32": 7, "s64": 8,
         "string": 9, "bytes": 10, "chars": 11}
FLAGS = {"": 0, "hex": 1, "tid_comm": 2}
GROUPS = {"sched": 0, "irq": 1, "timer": 2, "kmem": 3, "syscall": 4, "printk": 5,
          "always": 0xFFFFFFFF}


def load_kernel_events():
    table = json.loads((REPO / "abi" / "kernel_events.json").read_text())
    return [(e["name"], GROUPS[e["group"]],
             [(f["name"], TYPES[f["type"]], FLAGS[f["flag"]], f["count"]) for f in e["fields"]])
            for e in table]


KERNEL_EVENTS = load_kernel_events()

GUEST_SCRIPT = r"""
M=/lib/modules/$(uname -r)/extra
ok() { "$@"; echo "KMOD-RC $? $*"; }
ok insmod $M/ivtrace.ko
echo "KMOD: control-window"
sleep 3
[ -c /dev/ivtrace ] && echo "KMOD: devnode"
grep -q '^ivtrace0 ' /proc/consoles && echo "KMOD: console"
ok insmod $M/ivtrace_test.ko
echo 100 > /proc/ivtrace-test
echo "KMOD: test1 $(cat /proc/ivtrace-test)"
ok rmmod ivtrace_test
for i in 1 2; do
    ok rmmod ivtrace
    ok insmod $M/ivtrace.ko
done
ok rmmod ivtrace
ok insmod $M/ivtrace.ko mode=overwrite events=all vmsync_ms=10
ok insmod $M/ivtrace_test.ko
echo 100 > /proc/ivtrace-test
echo "KMOD: test2 $(cat /proc/ivtrace-test)"
echo hc 5 > /proc/ivtrace-test
sleep 0.2
echo "KMOD: hc $(cat /proc/ivtrace-test)"
echo "<2>ivtrace-kmod-test: before the crash" > /dev/kmsg
sleep 0.2
echo "KMOD: dmesg-problems $(dmesg | grep -c -E 'BUG|WARNING|Oops|Call Trace|refcount_t')"
dmesg | grep -i ivtrace
echo c > /proc/sysrq-trigger
"""


# struct ivt_control in the region header (docs/abi.md "Host control").
CTL_CMD_SEQ, CTL_CMD, CTL_ARG, CTL_ACK_SEQ, CTL_ACK_STATUS, CTL_GROUPS = 320, 328, 336, 384, 392, 396
CMD_ENABLE, CMD_DISABLE, CMD_STATEDUMP = 2, 3, 6


def control(m, cmd, arg=0, timeout=5.0):
    """Post a command (cmd, arg, then cmd_seq: x86 stores are ordered) and wait for its ack.
    Returns (ack_status, groups_enabled)."""
    seq = struct.unpack_from("<Q", m, CTL_CMD_SEQ)[0] + 1
    struct.pack_into("<I", m, CTL_CMD, cmd)
    struct.pack_into("<Q", m, CTL_ARG, arg)
    struct.pack_into("<Q", m, CTL_CMD_SEQ, seq)
    end = time.monotonic() + timeout
    while struct.unpack_from("<Q", m, CTL_ACK_SEQ)[0] != seq:
        assert time.monotonic() < end, f"command {cmd} not acknowledged in {timeout} s"
        time.sleep(0.01)
    return struct.unpack_from("<iI", m, CTL_ACK_STATUS)


def drive_control(shm):
    """While the guest waits: groups off and on again, a state dump, a bad command."""
    with open(shm, "r+b") as fh:
        m = mmap.mmap(fh.fileno(), 0)
        try:
            assert struct.unpack_from("<Q", m, 0)[0] == IVT_MAGIC
            acks = [control(m, CMD_DISABLE, 0x3F), control(m, CMD_ENABLE, 0x2F),
                    control(m, CMD_STATEDUMP), control(m, 99)]
        finally:
            m.close()
    return acks


@pytest.fixture(scope="module")
def booted(guest):
    """Boot the session's guest build once; return (BootResult, shm path, control acks)."""
    shm = Path(f"/dev/shm/ivt-kmod-{os.getpid()}-{time.monotonic_ns()}")
    try:
        with ivtvm.VM(GUEST_SCRIPT, shm=str(shm), shm_size="16M", shm_clear=True, smp=SMP,
                      add=guest.add("ivtrace.ko", "ivtrace_test.ko")) as vm:
            acks = None
            try:
                vm.wait_for(r"KMOD: control-window", timeout=TIMEOUT)
                acks = drive_control(shm)
            finally:
                r = vm.wait(timeout=TIMEOUT)
        yield r, shm, acks
    finally:
        shm.unlink(missing_ok=True)


def marks(r, key):
    return re.findall(rf"^KMOD: {key}(.*)$", r.console_text, re.M)


def test_load_unload_cycles(booted):
    r, _, _ = booted
    assert r.panicked, r.summary() + "\n" + r.tail(60)
    rcs = re.findall(r"^KMOD-RC (\d+) (.*)$", r.console_text, re.M)
    # insmod, insmod test, rmmod test, 2 x (rmmod, insmod), rmmod, insmod, insmod test
    assert len(rcs) == 10, r.tail(80)
    bad = [(rc, cmd) for rc, cmd in rcs if rc != "0"]
    assert not bad, f"failed: {bad}\n{r.tail(80)}"
    assert marks(r, "devnode") and marks(r, "console"), r.tail(80)


def test_control_commands(booted):
    """ivshmem-plain: the module polls the control words every flush_ms."""
    _, _, acks = booted
    assert acks == [(0, 0), (0, 0x2F), (0, 0x2F), (-22, 0x2F)], acks


def test_dmesg_clean(booted):
    r, _, _ = booted
    probs = marks(r, "dmesg-problems")
    assert probs and probs[0].strip() == "0", r.tail(120)
    # the module's own errors are dev_err/pr_err lines naming it (an unsigned module's
    # "module verification failed" taint line is expected)
    errs = [ln for ln in r.console_text.splitlines()
            if re.search(r"ivtrace.*(failed|error|refus|cannot|too small)", ln, re.I)
            and "module verification failed" not in ln]
    assert not errs, errs


def test_kernel_api_counts(booted):
    r, _, _ = booted
    t1, t2 = marks(r, "test1"), marks(r, "test2")
    assert t1 and t2, r.tail(60)
    m1 = re.match(r" written (\d+) dropped (\d+) errors (\d+)", t1[0])
    m2 = re.match(r" written (\d+) dropped (\d+) errors (\d+)", t2[0])
    # discard mode without a reader may drop, never error; overwrite never drops
    assert int(m1[1]) + int(m1[2]) == 110 and m1[3] == "0", t1
    assert (m2[1], m2[2], m2[3]) == ("110", "0", "0"), t2


def test_hypercalls_only_under_kvm(booted):
    """The hypercall channel and vmsync follow kvm_para_available(): under TCG the API says
    -ENODEV (19), the module says why, and no vmcall runs (it would raise #UD: the dmesg
    check above counts Oops lines); under KVM the 5 calls are made."""
    r, _, _ = booted
    hc = marks(r, "hc")
    assert hc, r.tail(60)
    m = re.search(r"hypercalls (\d+) hypercall_ret (-?\d+)", hc[0])
    assert m, hc
    lines = r.console_text
    if r.accel == "kvm":
        assert (m[1], m[2]) == ("5", "0"), hc
        assert "hypercall channel on (KVM)" in lines and "vmsync every 10 ms" in lines
    else:
        assert (m[1], m[2]) == ("0", "-19"), hc
        assert "hypercall channel off: not a KVM guest" in lines, r.tail(80)
        assert "vmsync off: not a KVM guest" in lines, r.tail(80)


def region(shm):
    with open(shm, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def test_region_header(booted):
    _, shm, _ = booted
    m = region(shm)
    magic, major, _minor, hdr_size, size, features = struct.unpack_from("<QHHIQQ", m, 0)
    assert magic == IVT_MAGIC and major == 1 and hdr_size == 4096 and size == len(m)
    assert features & 0x1 and features & 0x8, hex(features)  # KERNEL, CONTROL
    ch_off, meta_off, pool_off, meta_size, nr, nk, csz, nsub, subsz = \
        struct.unpack_from("<QQQIIIIII", m, 64)
    assert nk == SMP and nr == SMP + 16 and csz == 256 and subsz == 64 << 10
    assert nsub >= 2 and nsub & (nsub - 1) == 0
    assert pool_off + nr * nsub * subsz <= size
    state = struct.unpack_from("<I", m, 192)[0]
    assert state == 1, "the guest panicked: the region stays LIVE"
    assert struct.unpack_from("<I", m, 272)[0] == 100  # flush_interval_ms
    for c in range(nk):
        mode, stream, cpu = struct.unpack_from("<III", m, ch_off + c * 256 + 40)
        assert (mode, stream, cpu) == (1, 0, c)  # overwrite, kernel stream


def meta_records(m):
    meta_off, meta_size = struct.unpack_from("<Q", m, 72)[0], struct.unpack_from("<I", m, 88)[0]
    off, recs = 0, {}
    while off + 88 <= meta_size:
        ln, commit, kind, nf, eid, stream, group = struct.unpack_from("<IIHHIII", m, meta_off + off)
        if commit != 0x434F4D54 or ln < 88 or ln % 8:
            break
        if kind != 1:  # not an event description (the thread name table)
            off += ln
            continue
        name = m[meta_off + off + 24:meta_off + off + 88].split(b"\0")[0].decode()
        fields = []
        for i in range(nf):
            fo = meta_off + off + 88 + 40 * i
            fname = m[fo:fo + 32].split(b"\0")[0].decode()
            ftype, fflags, fcount = struct.unpack_from("<BBH", m, fo + 32)
            fields.append((fname, ftype, fflags, fcount))
        recs[(stream, eid)] = (name, group, fields)
        off += ln
    return recs


def test_kernel_event_table(booted):
    """The descriptions the loaded module publishes are its one definition's table, in order,
    then the test module's events."""
    _, shm, _ = booted
    recs = meta_records(region(shm))
    for eid, (name, group, fields) in enumerate(KERNEL_EVENTS):
        assert recs.get((0, eid)) == (name, group, fields), (eid, recs.get((0, eid)))
    assert recs[(0, 0)][0] == "sched_switch"
    names = {v[0]: k for k, v in recs.items()}
    first = len(KERNEL_EVENTS)
    assert names["ivtrace_test_event"] == (0, first)
    assert names["ivtrace_test_blob"] == (0, first + 1)


def name_table(m):
    """(header, {tid: (dead, comm)}) of the thread name table record (struct ivt_names_rec,
    kind 2) in the metadata area, entries whose seqcount is even only."""
    meta_off, meta_size = struct.unpack_from("<Q", m, 72)[0], struct.unpack_from("<I", m, 88)[0]
    off = 0
    while off + 88 <= meta_size:
        ln, commit, kind = struct.unpack_from("<IIH", m, meta_off + off)
        if commit != 0x434F4D54 or ln < 88 or ln % 8:
            break
        if kind == 2:
            base = meta_off + off
            nr, updates, skipped = struct.unpack_from("<IQQ", m, base + 12)
            entries = {}
            for i in range(nr):
                tid, seq, _ts = struct.unpack_from("<IIQ", m, base + 64 + 32 * i)
                comm = m[base + 64 + 32 * i + 16:base + 64 + 32 * i + 32].split(b"\0")[0]
                if tid and seq % 2 == 0:
                    entries[tid & 0x7FFFFFFF] = (bool(tid >> 31), comm.decode(errors="replace"))
            return {"nr": nr, "updates": updates, "skipped": skipped, "len": ln}, entries
        off += ln
    return None, {}


def test_thread_name_table(booted):
    """The module keeps a thread name table outside the rings (docs/abi.md "Thread name
    table"): the state dump put every thread there, with its name."""
    _, shm, _ = booted
    head, names = name_table(region(shm))
    assert head and head["nr"] == 4096 and head["len"] == 64 + 32 * 4096, head
    assert head["updates"] >= len(names) > 10 and head["skipped"] == 0, head
    assert names.get(1) == (False, "init"), names.get(1)
    assert names.get(2) == (False, "kthreadd"), names.get(2)


@pytest.fixture(scope="module")
def snapshot(booted, tmp_path_factory):
    if not os.access(IVTRACE, os.X_OK):
        pytest.skip(f"{IVTRACE} missing: run `make host` to read the region with ivtrace snapshot")
    pytest.importorskip("bt2", reason="python3-bt2 (babeltrace2's bindings) is not installed")
    import ctf
    _, shm, _ = booted
    out = tmp_path_factory.mktemp("kmod-snapshot")
    p = subprocess.run([str(IVTRACE), "snapshot", "--shm", str(shm), "-o", str(out), "--force"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    evs = ctf.events(out / "kernel")
    assert evs, f"no kernel events in the snapshot\n{p.stderr}"
    return evs


def test_snapshot_events(snapshot):
    counts = {}
    for e in snapshot:
        counts[e.name] = counts.get(e.name, 0) + 1
    for name in ("sched_switch", "sched_wakeup", "irq_softirq_entry", "timer_hrtimer_expire_entry",
                 "lttng_statedump_start",
                 "lttng_statedump_process_state", "lttng_statedump_interrupt", "lttng_statedump_end"):
        assert counts.get(name, 0) > 0, (name, counts)
    # the host names system calls (LTTng style): syscall_entry_<name>, syscall_exit_<name>
    for prefix in ("syscall_entry_", "syscall_exit_"):
        assert any(n.startswith(prefix) for n in counts), (prefix, counts)
    assert any(f"syscall_entry_{n}" in counts for n in ("read", "write", "close")), counts
    # ... and the names the host inserts before thread ids: idle is swapper/<cpu>
    comms = {(e.payload["next_tid"], e.payload["next_comm"]) for e in snapshot
             if e.name == "sched_switch"} | \
            {(e.payload["prev_tid"], e.payload["prev_comm"]) for e in snapshot
             if e.name == "sched_switch"}
    assert any(t == 0 and c.startswith("swapper/") for t, c in comms), sorted(comms)[:10]
    dump = [e.payload for e in snapshot if e.name == "lttng_statedump_process_state"]
    assert any(d["tid"] == 1 and d["name"] == "init" for d in dump), dump[:3]


def test_vmsync_events_only_under_kvm(booted, snapshot):
    """vmsync_gh_guest/vmsync_hg_guest (around the vmsync hypercall, every 10 ms in the last
    load) exist under KVM only, in pairs cnt, cnt + 1."""
    r, _, _ = booted
    gh = [e.payload for e in snapshot if e.name == "vmsync_gh_guest"]
    hg = [e.payload for e in snapshot if e.name == "vmsync_hg_guest"]
    if r.accel != "kvm":
        assert gh == [] and hg == [], (gh[:3], hg[:3])
        return
    assert gh and len(hg) == len(gh)
    assert all(b["cnt"] == a["cnt"] + 1 and b["vm_uid"] == a["vm_uid"] for a, b in zip(gh, hg))


def test_snapshot_test_payloads(snapshot):
    evs = [e.payload for e in snapshot if e.name == "ivtrace_test_event"]
    assert sorted(e["seq"] for e in evs) == list(range(100))
    for e in evs:
        assert e["magic"] == TEST_MAGIC and e["msg"] == "ivtrace test event" and e["cpu"] < SMP
    blobs = [e.payload for e in snapshot if e.name == "ivtrace_test_blob"]
    assert sorted(b["seq"] for b in blobs) == list(range(0, 100, 10))
    for b in blobs:
        n = b["seq"] % 64
        data = b["data"] if isinstance(b["data"], list) else list(b["data"])
        assert len(data) == n and data == [(b["seq"] + k) & 0xFF for k in range(n)], b


def test_snapshot_panic_line(snapshot):
    msgs = [e.payload["msg"] for e in snapshot if e.name == "printk_console"]
    assert any("ivtrace-kmod-test: before the crash" in m for m in msgs), msgs[-10:]
    assert any("Kernel panic - not syncing: sysrq triggered crash" in m for m in msgs), msgs[-10:]
