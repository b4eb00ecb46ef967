"""The boot tests' guests and their independent reading (tests/boot).

Real parts only: QEMU (TCG here), the Debian guest kernel with ftrace's boot parameters,
ivtrace.ko ftrace=1 loaded by /init (which starts the relay and, before the command, writes the
`ivtrace-boot` trace_marker line that ends the boot), bin/ivtrace record / serve, and
babeltrace2's Python bindings reading the traces. The profile is recomputed here from the raw
function_graph events as the doc says (docs/boot.md, "The function profile"), with nothing of
ivtrace's code.
"""
import bisect
import functools
import json
import re
import subprocess
from pathlib import Path

import ctf
from e2e import guest as g
from ivtools import bootguest, ivtvm
from serve import serve as s

GUEST = "bootg"

EVENTS = bootguest.EVENTS
LEVELS_APPEND = f"{EVENTS} trace_buf_size=16M"
# function_graph on the kernel's init functions: ~250 k graph events, none lost.
GRAPH_FILTER = "*init*"
GRAPH_APPEND = f"{EVENTS} trace_buf_size=64M ftrace=function_graph ftrace_filter={GRAPH_FILTER}"

STOP_RELAY = bootguest.stop_relay("BOOT")


def check_boot(r):
    print(r.summary())
    assert r.ok and re.search(r"^BOOT: rmmod rc=0", r.console_text, re.M), r.tail(60)
    # Everything ftrace recorded is in the trace (bootguest.stop_relay).
    assert re.search(r"^BOOT: drained, 0 left", r.console_text, re.M), r.tail(60)
    assert not r.kernel_problems, r.kernel_problems


def record(tmp, add, name, append):
    """One guest booted with `append`, recorded by `ivtrace record`; (summary, out dir)."""
    shm = g.shm_path(f"boot-{name}")
    out = tmp / name
    rec = g.Recorder(shm, out)
    try:
        with ivtvm.VM(STOP_RELAY, shm=str(shm), shm_size="16M", shm_clear=True, smp=2,
                        mem="1G", modules=["ivtrace"], modopts={"ivtrace": "ftrace=1"},
                        add=add, append=append,
                        log=str(tmp / f"{name}.console.log")) as vm:
            r = vm.wait(timeout=g.TIMEOUT)
        summary = rec.wait(timeout=300)
    finally:
        rec.stop()
        shm.unlink(missing_ok=True)
    check_boot(r)
    assert rec.rc == 0, rec.stderr()
    return summary, out, rec.stderr()


def serve_host_events(tmp, add, append):
    """One guest served by `ivtrace serve --host-events` (an ivshmem-doorbell guest named
    GUEST, so its vCPU threads are known): (summary, out dir, serve's log)."""
    srv = s.Server(tmp / "serve", "--size", "16M", "--host-events")
    try:
        with ivtvm.VM(STOP_RELAY, doorbell=str(srv.sock), vectors=2, smp=2,
                        modules=["ivtrace"], modopts={"ivtrace": "ftrace=1"}, add=add,
                        append=append, extra_args=["-name", f"{GUEST},debug-threads=on"],
                        log=str(tmp / "serve.console.log")) as vm:
            r = vm.wait(timeout=g.TIMEOUT)
        rc, summaries = srv.stop()
    finally:
        srv.cleanup()
    check_boot(r)
    assert rc == 0, srv.stderr()
    return summaries[GUEST][-1], tmp / "serve" / GUEST, srv.stderr()


def boot_cli(*args, check=True):
    """`ivtrace boot ARGS` (JSON when --json is among them)."""
    p = subprocess.run([str(g.IVTRACE), "boot", *map(str, args)], capture_output=True,
                       text=True, timeout=900)
    assert p.returncode != 101 and "panicked at" not in p.stderr, p.stderr
    if check:
        assert p.returncode == 0, f"ivtrace boot {args}: exit {p.returncode}\n{p.stderr}"
    return json.loads(p.stdout) if "--json" in args and p.returncode == 0 else p


# --------------------------------------------------------------------------- reading

GRAPH = ("ftrace:funcgraph_entry", "ftrace:funcgraph_exit")


@functools.lru_cache(maxsize=4)
def read(kernel: str):
    """One pass of bt2 over a kernel trace (it does not change once recorded): its derived
    (`ivtrace:`) and initcall events, and its function_graph events, with their payloads;
    its ftrace streams' (stream class 2) events per name and their discarded events."""
    derived_ev, graph, counts, lost = [], [], {}, 0
    named = ("ivtrace:", "ftrace:initcall:")
    for m in ctf.messages(kernel, lambda n: n.startswith(named) or n in GRAPH):
        if isinstance(m, ctf.Event):
            if m.name.startswith(named):
                derived_ev.append(m)
            elif m.name in GRAPH:
                graph.append(m)
            if m.stream[0] == 2:
                counts[m.name] = counts.get(m.name, 0) + 1
        elif m.stream[0] == 2:
            lost += m.count
    return derived_ev, graph, counts, lost


def derived(kernel, names=("ivtrace:",)):
    """bt2's derived (and initcall) events of the kernel trace whose names start with one of
    `names`."""
    return [e for e in read(str(kernel))[0] if e.name.startswith(names)]


def phases(kernel):
    """(start cycles, name) of every boot phase, in order (the boot stream, bt2)."""
    return [(e.cycles, e.payload["name"]) for e in derived(kernel, ("ivtrace:boot_phase",))
            if e.name == "ivtrace:boot_phase"]


def profile_rows(kernel):
    """The profile stream's rows {(phase, func, tid): (count, total, self, min, max)} and its
    pairing counts."""
    rows, pairing = {}, None
    for e in derived(kernel, ("ivtrace:func_profile", "ivtrace:profile_pairing")):
        p = e.payload
        if e.name == "ivtrace:func_profile":
            key = (p["phase"], p["func"], p["tid"])
            assert key not in rows, f"row {key} twice"
            rows[key] = (p["count"], p["total_cycles"], p["self_cycles"], p["min_cycles"],
                         p["max_cycles"])
        elif e.name == "ivtrace:profile_pairing":
            pairing = p
    return rows, pairing


def profile_from_raw(kernel):
    """The profile computed from the raw funcgraph events (bt2): per task (pid; pid 0 per
    CPU) a stack by depth; an entry at depth d drops what is open at d and above; an exit
    closes the call open at its depth if it is its function; a call counts in the phase of
    its entry, self = its time less its direct callees'."""
    starts = phases(kernel)
    cuts = [c for c, _ in starts]
    stacks, rows = {}, {}
    n = {"calls": 0, "entries": 0, "exits": 0, "unmatched_exits": 0, "unclosed": 0}
    for e in read(str(kernel))[1]:
        p = e.payload
        tid, func, depth = p["common_pid"], p["func"], p["depth"]
        st = stacks.setdefault((tid, e.cpu if tid == 0 else 0), [])
        if e.name == "ftrace:funcgraph_entry":
            n["entries"] += 1
            n["unclosed"] += sum(f is not None for f in st[depth:])
            del st[depth:]
            st.extend([None] * (depth - len(st)))
            st.append([func, e.cycles, 0])
            continue
        n["exits"] += 1
        n["unclosed"] += sum(f is not None for f in st[depth + 1:])
        frame = st[depth] if depth < len(st) else None
        del st[depth:]
        if frame is None or frame[0] != func:
            n["unclosed"] += frame is not None
            n["unmatched_exits"] += 1
            continue
        total = e.cycles - frame[1]
        if st and st[-1] is not None:
            st[-1][2] += total
        n["calls"] += 1
        phase = starts[bisect.bisect_right(cuts, frame[1]) - 1][1]
        key = (phase, func, tid)
        c, t, sf, lo, hi = rows.get(key, (0, 0, 0, total, total))
        rows[key] = (c + 1, t + total, sf + total - frame[2], min(lo, total), max(hi, total))
    n["unclosed"] += sum(f is not None for st in stacks.values() for f in st)
    return rows, n


def ftrace_counts(kernel):
    """Per name, the events of the ftrace streams (stream class 2), and their discarded
    events, as bt2 reads them."""
    _, _, counts, lost = read(str(kernel))
    return counts, lost


def stream_bytes(kernel, prefix):
    return sum(p.stat().st_size for p in Path(kernel).iterdir() if p.name.startswith(prefix))
