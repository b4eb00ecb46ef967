"""The ftrace relay (docs/ftrace.md) with real guests: three boots.

Real parts only: QEMU (TCG), the Debian guest kernel and its ftrace, ivtrace.ko ftrace=1 loaded
by /init (it starts guest/ftrace's ivtrace-ftrace), bin/ivtrace record / serve / ctl on the
host, babeltrace2 (bt2) reading the kernel trace.

1. Boot tracing (ivtrace record): the kernel command line sets trace_clock=x86-tsc,
   trace_event=sched,block, ftrace=function_graph on a set of driver-core functions; the
   trace holds ftrace's events from before the first user-space program, function entries
   and exits nest per thread, ftrace's sched_switch lines up with the native probe's (one
   time base), and per CPU recorded + lost equals what ftrace produced.
2. Selection from the host, no guest shell (ivtrace serve, an ivshmem-doorbell guest,
   `ivtrace ctl --socket S --guest G`): list-events, a file off the module's list refused, a
   kprobe on openat's path fetching the file name, a filter `nr_sector > 8` on
   block_rq_issue, block_rq_complete unfiltered; a workload opens known files and reads and
   writes a virtio-blk disk with 4 KiB and larger direct I/O: the kprobe shows those names,
   and block_rq_issue holds exactly the completed requests of more than 8 sectors.
3. Saturation (ivtrace record, `ivtrace ctl --shm`): a 16 KiB ftrace buffer per CPU, the
   raw_syscalls events, two system-call loops: ftrace overwrites what the relay cannot move
   in time, and per CPU the events in the trace plus the discarded events it reports equal
   what ftrace says it produced (its per_cpu stats, read by the guest at the end).
"""
import re
import subprocess

import pytest

import losses
from e2e import guest as g
from serve import serve as s

# Driver-core functions that call each other while devices are probed at boot.
GRAPH_FUNCS = "do_one_initcall,driver_register,bus_add_driver,driver_attach,really_probe,device_add"

STOP_RELAY = r"""
killall ivtrace-ftrace
while pidof ivtrace-ftrace >/dev/null; do sleep 0.1; done
rmmod ivtrace
echo "FT: rmmod rc=$?"
"""


def boot(tmp, add, name, script, append, extra_args=(), host=None):
    """One guest with ivtrace.ko ftrace=1 recorded by `ivtrace record`; `host(vm, shm)` runs
    while the guest does. Returns (boot result, recording summary, output dir)."""
    shm = g.shm_path(f"ftrace-{name}")
    out = tmp / name
    rec = g.Recorder(shm, out)
    try:
        with g.ivtvm.VM(script + STOP_RELAY, shm=str(shm), shm_size="16M", shm_clear=True,
                        smp=2, modules=["ivtrace"], modopts={"ivtrace": "ftrace=1"},
                        add=add, append=append, extra_args=list(extra_args),
                        log=str(tmp / f"{name}.console.log")) as vm:
            if host:
                host(vm, shm)
            r = vm.wait(timeout=g.TIMEOUT)
        summary = rec.wait(timeout=120, boot=r)
    finally:
        rec.stop()
        shm.unlink(missing_ok=True)
    print(r.summary())
    assert r.ok and re.search(r"^FT: rmmod rc=0", r.console_text, re.M), r.explain(60)
    assert not r.kernel_problems, r.kernel_problems
    assert rec.rc == 0, rec.stderr()
    return r, summary, out


@pytest.fixture(scope="module")
def ft_add(guest):
    """ivtrace.ko, the relay and ivtwl from the session's guest build; bin/ivtrace."""
    if not g.IVTRACE.exists():
        pytest.fail(f"{g.IVTRACE} missing (run `make` at the top)")
    return guest.add("ivtrace.ko", "ivtwl", "ivtrace-ftrace")


def ftrace_events(out, names=None):
    """bt2's events of the ftrace streams (stream class 2) of the kernel trace."""
    want = (lambda n: True) if names is None else (lambda n: n in names)
    return [e for e in g.ctf.events(out / "kernel", want) if e.stream[0] == 2]


# --------------------------------------------------------------------------- 1. boot

BOOT_SCRIPT = r"""
dmesg | grep -m1 "Run /init" | sed 's/^/FT-DMESG /'
cat /sys/kernel/tracing/current_tracer | sed 's/^/FT-TRACER /'
sleep 1
"""


@pytest.fixture(scope="module")
def boot_trace(tmp_path_factory, ft_add):
    tmp = tmp_path_factory.mktemp("ftrace-boot")
    append = (f"trace_clock=x86-tsc trace_event=sched,block trace_buf_size=16M "
              f"ftrace=function_graph ftrace_filter={GRAPH_FUNCS}")
    r, summary, out = boot(tmp, ft_add, "boot", BOOT_SCRIPT, append)
    events = g.ctf.events(out / "kernel")
    return {"boot": r, "summary": summary, "out": out, "events": events}


def test_boot_tracer_was_function_graph(boot_trace):
    assert g.marks(boot_trace["boot"].console_text, "FT-TRACER ") == ["function_graph"]


def test_first_events_precede_the_first_user_space_program(boot_trace):
    ev = boot_trace["events"]
    ft = [e for e in ev if e.stream[0] == 2]
    native = [e for e in ev if e.stream[0] == 0]
    execs = [e for e in ft if e.name == "ftrace:sched:sched_process_exec"]
    init = [e for e in execs if e.payload["filename"] == "/init" and e.payload["pid"] == 1]
    assert init, "no exec of /init by pid 1 in the trace (trace_event=sched from boot)"
    first = min(e.ns for e in ft)
    assert first < min(e.ns for e in execs) <= init[0].ns
    # The initcalls ran before /init: their graph entries are in the trace.
    before = [e for e in ft if e.ns < init[0].ns and e.name == "ftrace:funcgraph_entry"]
    print(f"\nboot: first ftrace event {first} ns, exec of /init {init[0].ns} ns, "
          f"{len(before)} graph entries before it, first native event {min(e.ns for e in native)} ns")
    assert len(before) > 100, len(before)
    # ... and long before the module (loaded by /init) wrote its first native event.
    assert min(e.ns for e in native) - first > 500_000_000, (first, min(e.ns for e in native))
    # The kernel's own log says when /init started; the trace has that exec after boot began.
    assert g.marks(boot_trace["boot"].console_text, "FT-DMESG "), "no 'Run /init' in dmesg"


def test_function_entries_and_exits_nest_per_thread(boot_trace):
    """Per thread (common_pid), every funcgraph_exit closes the innermost open entry of the
    same function, and every entry's depth is the number of entries open under it."""
    stacks, seen, matched, orphan_exits = {}, set(), 0, 0
    graph = [e for e in boot_trace["events"]
             if e.name in ("ftrace:funcgraph_entry", "ftrace:funcgraph_exit")]
    for e in sorted(graph, key=lambda e: e.ns):
        tid, func, depth = e.payload["common_pid"], e.payload["func"], e.payload["depth"]
        st = stacks.setdefault(tid, [])
        if e.name == "ftrace:funcgraph_entry":
            assert depth == len(st), f"tid {tid}: entry of {func:#x} at depth {depth}, {st}"
            st.append(func)
        elif not st and tid not in seen:
            orphan_exits += 1      # entered before the tracer started
        else:
            assert st and st[-1] == func and depth == len(st) - 1, \
                f"tid {tid}: exit of {func:#x} depth {depth} with open {st}"
            st.pop()
            matched += 1
        seen.add(tid)
    depths = {e.payload["depth"] for e in graph}
    print(f"\nnesting: {matched} exits matched, {orphan_exits} orphan exits, {len(seen)} "
          f"threads, depths up to {max(depths)}")
    assert matched > 500 and orphan_exits <= 2 * len(seen), (matched, orphan_exits)
    assert max(depths) >= 2, f"no nesting seen (depths {depths})"


def test_ftrace_and_native_probes_share_the_time_base(boot_trace):
    """The same context switch seen by ftrace's sched_switch and the native probe's: on the
    guest TSC both, so their times differ by the few microseconds between the two probes
    (every native switch while the relay ran, against the nearest ftrace one of that pair)."""
    ev = boot_trace["events"]
    ftrace = {}
    for e in ev:
        if e.name == "ftrace:sched:sched_switch":
            ftrace.setdefault((e.payload["prev_pid"], e.payload["next_pid"]), []).append(e.ns)
    last = max(max(t) for t in ftrace.values())
    deltas = [min(abs(t - e.ns) for t in ftrace.get((e.payload["prev_tid"],
                                                     e.payload["next_tid"]), [0]))
              for e in ev
              if e.stream[0] == 0 and e.name == "sched_switch" and e.ns < last]
    assert len(deltas) > 50, len(deltas)
    deltas.sort()
    assert deltas[len(deltas) // 2] < 50_000, deltas[len(deltas) // 2]
    assert deltas[int(len(deltas) * 0.9)] < 1_000_000, deltas[int(len(deltas) * 0.9)]


def test_boot_losses_are_accounted(boot_trace):
    f = boot_trace["summary"]["ftrace"]
    for c in f["cpus"]:
        assert c["recorded"] > 0 and not c["no_stats"], c
        # Tracing is still on when the relay stops: what ftrace wrote after the relay's last
        # read is still in its buffer (entries), after the recording's end, not lost.
        # (The saturated test turns tracing off first: there entries is 0.) How many depends on
        # how long the relay's last turn took: up to 16 on a quiet machine, 20-22 under a load of
        # 12; a relay that stopped reading long before the end would leave hundreds.
        assert c["recorded"] + c["lost"] + c["entries"] == c["produced"], c
        assert c["entries"] <= 64, c
        assert c["unknown_type"] == 0 and c["bad_pages"] == 0, c


# --------------------------------------------------------------------------- 2. from the host

# The host's last step turns block_rq_complete on: the guest waits for it in tracefs (the
# BAR's last word, ivtwl hostwait, cannot be mapped while the module maps the BAR).
CONTROL_SCRIPT = r"""
T={token}
for i in 1 2 3; do echo "$T $i" > /tmp/ivt-ft-$T-$i; done
echo "FT: ready"
n=0
until grep -q 1 /sys/kernel/tracing/events/block/block_rq_complete/enable; do
    n=$((n + 1)); [ $n -gt 900 ] && break; sleep 0.2
done
echo "FT: host done after $n waits"
for i in 1 2 3; do cat /tmp/ivt-ft-$T-$i > /dev/null; done
dd if=/dev/vda of=/dev/null bs=4k count=24 iflag=direct 2>/dev/null
dd if=/dev/vda of=/dev/null bs=64k count=12 skip=8 iflag=direct 2>/dev/null
dd if=/dev/zero of=/dev/vda bs=4k count=16 seek=4096 oflag=direct 2>/dev/null
dd if=/dev/zero of=/dev/vda bs=32k count=8 seek=1024 oflag=direct 2>/dev/null
echo "FT: io done"
sleep 1
"""

KPROBE = "ivtopen"
GUEST = "ftg"


@pytest.fixture(scope="module")
def control_trace(tmp_path_factory, ft_add):
    """Through `ivtrace serve` (an ivshmem-doorbell guest: the host kicks the module, the
    relay rings back): `ivtrace ctl --socket S --guest G` as people type it."""
    tmp = tmp_path_factory.mktemp("ftrace-control")
    disk = tmp / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(64 << 20)
    tok = g.token()
    srv = s.Server(tmp / "serve", "--size", "16M")
    state = {}

    def ctl(*words, check=True):
        rc, p = srv.ctl("--guest", GUEST, *words, check=check, json_out=False)
        return p

    try:
        with g.ivtvm.VM(CONTROL_SCRIPT.format(token=tok) + STOP_RELAY, doorbell=str(srv.sock),
                        vectors=2, smp=2, modules=["ivtrace"], modopts={"ivtrace": "ftrace=1"},
                        add=ft_add, append="trace_clock=x86-tsc",
                        extra_args=["-name", f"{GUEST},debug-threads=on",
                                    "-drive", f"file={disk},if=virtio,format=raw"],
                        log=str(tmp / "console.log")) as vm:
            vm.wait_for(r"^FT: ready", timeout=g.TIMEOUT)
            state["list"] = ctl("list-events", "block:*").stdout
            state["refused"] = ctl("ftrace", "write", "trace_clock", "local", check=False)
            state["kprobe"] = ctl("ftrace", "kprobe", KPROBE, "do_sys_openat2",
                                  "name=+0(%si):ustring")
            state["issue"] = ctl("ftrace", "enable", "block:block_rq_issue", "nr_sector > 8")
            state["complete"] = ctl("ftrace", "enable", "block:block_rq_complete")
            r = vm.wait(timeout=g.TIMEOUT)
        rc, summaries = srv.stop()
    finally:
        srv.cleanup()
    print(r.summary())
    assert r.ok and re.search(r"^FT: rmmod rc=0", r.console_text, re.M), r.explain(60)
    assert rc == 0, srv.stderr()
    names = {"block_rq_issue", "block_rq_complete", f"ftrace:kprobes:{KPROBE}"}
    return {"boot": r, "summary": summaries[GUEST][-1], "state": state, "token": tok,
            "events": ftrace_events(tmp / "serve" / GUEST, names)}


def test_host_lists_the_guests_events(control_trace):
    lines = control_trace["state"]["list"].split()
    assert "block:block_rq_issue" in lines and "block:block_rq_complete" in lines, lines[:20]
    assert all(l.startswith("block:") for l in lines), lines


def test_the_module_refuses_files_off_its_list(control_trace):
    p = control_trace["state"]["refused"]
    assert p.returncode != 0 and "EPERM" in p.stdout + p.stderr, (p.stdout, p.stderr)


def test_kprobe_fetches_the_names_the_workload_opened(control_trace):
    tok = control_trace["token"]
    opened = {e.payload["name"] for e in control_trace["events"]
              if e.name == f"ftrace:kprobes:{KPROBE}"}
    want = {f"/tmp/ivt-ft-{tok}-{i}" for i in (1, 2, 3)}
    print(f"\nkprobe: {len(opened)} names, the workload's: {sorted(n for n in opened if tok in n)}")
    assert want <= opened, sorted(n for n in opened if tok in n)


def test_filter_keeps_exactly_the_requests_of_more_than_8_sectors(control_trace):
    ev = control_trace["events"]
    issued = [e.payload for e in ev if e.name == "block_rq_issue"]
    done = [e.payload for e in ev if e.name == "block_rq_complete" and e.payload["nr_sector"]]
    assert issued and all(p["nr_sector"] > 8 for p in issued), [p["nr_sector"] for p in issued]
    small = [p for p in done if p["nr_sector"] <= 8]
    assert len(small) >= 24, "the 4 KiB requests completed but none was seen"
    big = sorted((p["sector"], p["nr_sector"]) for p in done if p["nr_sector"] > 8)
    print(f"\nfilter: {len(issued)} block_rq_issue kept (all > 8 sectors), {len(big)} completions "
          f"> 8 sectors, {len(small)} completions <= 8 sectors")
    assert sorted((p["sector"], p["nr_sector"]) for p in issued) == big
    # LTTng's rwbs bits (Trace Compass's disk analysis reads them): reads and writes both.
    assert {p["rwbs"] & 0b101 for p in issued} == {0b100, 0b001}, {p["rwbs"] for p in issued}


# --------------------------------------------------------------------------- 3. saturation

SATURATE_SCRIPT = r"""
cd /sys/kernel/tracing
echo "FT: ready"
n=0
until grep -q 1 events/raw_syscalls/enable; do
    n=$((n + 1)); [ $n -gt 900 ] && break; sleep 0.2
done
ivtwl syscalls 150000 & ivtwl syscalls 150000 & wait
echo 0 > tracing_on
for i in $(seq 100); do
    n=$(cat per_cpu/cpu*/stats | awk '/^entries:/ {s += $2} END {print s}')
    [ "$n" = 0 ] && break
    sleep 0.1
done
for c in per_cpu/cpu*; do
    echo "FT-STATS ${c#per_cpu/cpu} $(awk -F': ' '{printf "%s=%s;", $1, $2}' $c/stats)"
done
"""


def ctl_shm(shm, *words):
    """`ivtrace ctl --shm`: straight into an ivshmem-plain guest's region."""
    p = subprocess.run([str(g.IVTRACE), "ctl", "--shm", str(shm), *words],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"ivtrace ctl {' '.join(words)}:\n{p.stdout}{p.stderr}"
    return p


@pytest.fixture(scope="module")
def saturated(tmp_path_factory, ft_add):
    tmp = tmp_path_factory.mktemp("ftrace-saturate")

    def host(vm, shm):
        vm.wait_for(r"^FT: ready", timeout=g.TIMEOUT)
        # The size the buffer already has: the command is taken and acknowledged, and the
        # kernel does not resize. A real resize of a buffer the relay waits on, shrink or
        # grow, can trip Linux 6.1's WARN in ring_buffer_nr_dirty_pages (its page
        # accounting; docs/ftrace.md, Limits).
        ctl_shm(shm, "ftrace", "buffer-kb", "16")
        ctl_shm(shm, "ftrace", "enable", "raw_syscalls")

    r, summary, out = boot(tmp, ft_add, "saturate", SATURATE_SCRIPT,
                           "trace_clock=x86-tsc trace_buf_size=16K", host=host)
    stats = {}
    for cpu, text in re.findall(r"^FT-STATS (\d+) (.*)$", r.console_text, re.M):
        kv = dict(x.split("=", 1) for x in text.strip().strip(";").split(";"))
        stats[int(cpu)] = {k: int(v.split()[0]) for k, v in kv.items() if v.split()[0].isdigit()}
    return {"summary": summary, "out": out, "stats": stats}


def test_relay_saturated_recorded_plus_lost_equals_produced(saturated):
    """Per CPU: events in the trace (bt2) + discarded events the trace reports (bt2) ==
    entries + overrun + read + dropped + commit overrun of the guest's per_cpu stats."""
    s = saturated["summary"]
    nk = s["region"]["nr_kernel_channels"]
    recorded, discarded = {}, {}
    for m in g.ctf.messages(saturated["out"] / "kernel", lambda n: False):
        if m.stream[0] != 2:
            continue
        cpu = m.stream[1] - nk
        if isinstance(m, g.ctf.Event):
            recorded[cpu] = recorded.get(cpu, 0) + 1
        else:
            discarded[cpu] = discarded.get(cpu, 0) + m.count
    stats = saturated["stats"]
    assert set(stats) == {0, 1}, stats
    for cpu, st in stats.items():
        produced = (st["entries"] + st["overrun"] + st["read events"] + st["dropped events"]
                    + st["commit overrun"])
        assert st["entries"] == 0, st
        assert recorded.get(cpu, 0) + discarded.get(cpu, 0) == produced, (cpu, st, recorded,
                                                                         discarded)
    for cpu, st in sorted(stats.items()):
        print(f"\ncpu{cpu}: recorded {recorded.get(cpu, 0)} + lost {discarded.get(cpu, 0)} == "
              f"produced (ftrace's stats) {st['overrun'] + st['read events'] + st['entries']}"
              f" + dropped {st['dropped events']} + commit overrun {st['commit overrun']}")
    assert sum(st["overrun"] for st in stats.values()) > 0, "the relay kept up: not saturated"
    assert sum(recorded.values()) > 10_000, recorded


def test_relay_losses_agree_in_every_reader(saturated):
    """ftrace's losses are lost events like the others: bt2's discarded-event counts, the
    babeltrace2 command's warnings and `ivtrace report` (the traces' announcement and the
    recorded total, with ftrace's as a reason of its own) agree (tests/losses.py)."""
    losses.assert_every_loss_is_in_the_ctf(saturated["out"], want=("ftrace",))
