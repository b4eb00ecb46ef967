"""boot: what tracing costs each initcall level of a guest's boot (the hypertracing seed's
"boot-up level tracing overhead" table), and how small the function profile is.

Boots the guest --boots times in each of three states, the order rotated by one per round,
each boot recorded by `ivtrace record` with ivtrace.ko ftrace=1 loaded by /init (docs/boot.md):

  off       only the level boundaries: trace_event=initcall:initcall_level and
            sched:sched_process_exec (about 60 events per boot: ftrace's own cost, nothing
            else traced)
  native    the boot's tracepoints: initcall, module, sched, irq, timer, workqueue, block
  graph     native + ftrace=function_graph on the widest filter the relay carries here
            without loss (GRAPH_FILTER)

Per boot, `ivtrace boot --json` gives each phase's duration through the trace's clock; the
sub-levels (core_sync, rootfs, ...) are summed into their level and post_initcalls into late,
so every state measures the same spans: from the level's initcall_level event to the next
level's (late: to the exec of /init). Per level and state the mean and standard deviation
over the boots, and the overhead of native and graph against off (mean against mean). Under
TCG the absolute times are the emulator's; the ratios are the claim.

The graph boots also give the profile's size: the raw function_graph events and bytes of the
ftrace streams against the profile stream (`ivtrace boot --derive --ftrace-profile instead`
on a copy gives the bytes without the raw events). A boot that lost an ftrace event, or
whose recording has no boot phases, is a failure of the run (exit 1).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from ivtools import bootguest, ivtvm
from ivtools.proc import stop_recorder

from . import BenchError, guests, hostload

NAME = "boot"
HELP = "per-level boot overhead of tracing (off / native events / native + function_graph)"
STATES = ["off", "native", "graph"]
LEVELS = ["console", "early", "pure", "core", "postcore", "arch", "subsys", "fs", "device",
          "late"]
CLOCK = "trace_clock=x86-tsc"
OFF_EVENTS = "initcall:initcall_level,sched:sched_process_exec"
NATIVE_EVENTS = "initcall,module,sched,irq,timer,workqueue,block"
# The widest function_graph filter tried whose boot the relay carried with no loss here
# (a wider one, adding *free*,*get*,*put*,*find*, overran a 128 MiB buffer: docs/boot.md).
GRAPH_FILTER = "*init*,*probe*,*register*,*alloc*,*create*,*add*,*setup*"
GUEST_SCRIPT = bootguest.stop_relay("BB")


def add_arguments(ap):
    ap.add_argument("--boots", type=int, default=3, help="boots per state (rotated order)")
    ap.add_argument("--states", default=",".join(STATES))
    ap.add_argument("--buf-mb", type=int, default=96,
                    help="ftrace's per-CPU buffer for the boot (trace_buf_size), MiB")
    ap.add_argument("--graph-filter", default=GRAPH_FILTER,
                    help="ftrace_filter of the graph state")
    ap.add_argument("--timeout", type=float, default=1800, help="one boot, seconds")
    guests.add_arguments(ap, smp=2, mem="1G")


def append_for(state: str, a) -> str:
    if state == "off":
        return f"{CLOCK} trace_event={OFF_EVENTS} trace_buf_size=1M"
    native = f"{CLOCK} trace_event={NATIVE_EVENTS} trace_buf_size={a.buf_mb}M"
    if state == "native":
        return native
    return f"{native} ftrace=function_graph ftrace_filter={a.graph_filter}"


def ivtrace(*args, timeout=1800) -> subprocess.CompletedProcess:
    return subprocess.run([str(guests.IVTRACE), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def record_boot(a, guest, work: Path, state: str, n: int) -> Path:
    """One boot in `state`, recorded into work/STATE-N; the recording's directory."""
    shm = Path(f"/dev/shm/ivt-bootbench-{os.getpid()}")
    out = work / f"{state}-{n}"
    rec = subprocess.Popen([str(guests.IVTRACE), "record", "--shm", str(shm), "-o", str(out),
                            "--force", "--json"], stdout=open(f"{out}.json", "wb"),
                           stderr=open(f"{out}.log", "wb"), stdin=subprocess.DEVNULL)
    vm = ivtvm.VM(GUEST_SCRIPT, shm=str(shm), shm_size="64M", shm_clear=True, smp=a.smp,
                  mem=a.mem, accel=a.accel, modules=["ivtrace"],
                  modopts={"ivtrace": "ftrace=1"}, append=append_for(state, a),
                  add=guest.add("ivtrace.ko", "ivtwl", "ivtrace-ftrace"))
    try:
        vm.start()
        r = vm.wait(timeout=a.timeout)
    finally:
        vm.kill()
        stop_recorder(rec, 300, interrupt_wait_s=120)
        shm.unlink(missing_ok=True)
    drained = re.search(r"^BB: drained, 0 left", r.console_text, re.M)
    if not (r.ok and drained and re.search(r"^BB: rmmod rc=0", r.console_text, re.M)) \
            or r.kernel_problems:
        raise BenchError(f"boot {state} #{n} failed: {r.summary()}\n{r.kernel_problems}\n"
                         f"{r.tail(30)}")
    if rec.returncode != 0:
        raise BenchError(f"ivtrace record of boot {state} #{n} failed (exit {rec.returncode}):"
                         f"\n{Path(f'{out}.log').read_text()[-2000:]}")
    return out


# The levels every state's trace holds (function_graph's starts at core: docs/boot.md); their
# sum is the "kernel" row.
COMMON = LEVELS[LEVELS.index("postcore"):]


def levels_of(report: dict) -> dict:
    """Milliseconds per level: sub-levels summed into their level, post_initcalls into late;
    "kernel": postcore to the exec of /init, when every one of those levels is there."""
    ms = {}
    for p in report["phases"]:
        level = p["level"] or ("late" if p["name"] == "post_initcalls" else None)
        if level in LEVELS:
            ms[level] = ms.get(level, 0.0) + p["duration_ms"]
    if all(lv in ms for lv in COMMON):
        ms["kernel"] = sum(ms[lv] for lv in COMMON)
    return ms


def profile_size(out: Path, sidecar: dict) -> dict:
    """The raw graph events and bytes against the profile, and the bytes the ftrace streams
    keep once the profile stands instead of the raw events (on a copy)."""
    boot = sidecar.get("boot") or {}
    copy = out.parent / f"{out.name}-instead"
    shutil.copytree(out, copy)
    p = ivtrace("boot", copy, "--derive", "--ftrace-profile", "instead", "--no-chart", "--json")
    if p.returncode != 0:
        raise BenchError(f"ivtrace boot --derive --ftrace-profile instead failed:\n{p.stderr}")
    after = json.loads((copy / "ivtrace.json").read_text()).get("boot") or {}
    kept = sum(f.stat().st_size for f in (copy / "kernel").iterdir()
               if f.name.startswith("ftrace_chan"))
    shutil.rmtree(copy, ignore_errors=True)
    profile = boot.get("written", {}).get("profile_bytes")
    raw = boot.get("ftrace_bytes")
    return {"graph_events": boot.get("graph_events"), "profile_rows": boot.get("profile_rows"),
            "profile_bytes": profile, "ftrace_bytes": raw, "ftrace_bytes_without_graph": kept,
            "graph_bytes": None if raw is None else raw - kept,
            "ratio_vs_graph_bytes": None if not profile or raw is None else (raw - kept) / profile,
            "ratio_vs_ftrace_bytes": None if not profile or raw is None else raw / profile,
            "derive_s": boot.get("seconds"), "instead_check": after.get("profile_rows")}


def measure(a, out: Path, state: str, n: int) -> dict:
    sidecar = json.loads((out / "ivtrace.json").read_text())
    p = ivtrace("boot", out, "--json", "--no-chart")
    if p.returncode != 0:
        raise BenchError(f"ivtrace boot of {state} #{n} failed:\n{p.stderr}")
    report = json.loads(p.stdout)
    cpus = (sidecar.get("ftrace") or {}).get("cpus", [])
    m = {"state": state, "boot": n, "levels_ms": levels_of(report),
         "boot_ms": report["boot_ms"], "traced_from_ms": report["traced_from_ms"],
         "clock_hz": report["clock_hz"],
         "ftrace_recorded": sum(c["recorded"] for c in cpus),
         "ftrace_lost": sum(c["lost"] for c in cpus),
         "phases": [p["name"] for p in report["phases"]]}
    if state == "graph":
        m["profile"] = profile_size(out, sidecar)
    return m


def summarize(ms: list[dict]) -> dict:
    """Per level and state: mean, sd, n of the durations; overheads against off."""
    rows = {}
    for level in LEVELS + ["kernel"]:
        row = {}
        for s in STATES:
            v = [m["levels_ms"][level] for m in ms if m["state"] == s and level in m["levels_ms"]]
            if v:
                row[s] = {"n": len(v), "mean_ms": statistics.mean(v),
                          "sd_ms": statistics.stdev(v) if len(v) > 1 else None,
                          "min_ms": min(v), "max_ms": max(v)}
        off = row.get("off", {}).get("mean_ms")
        for s in ("native", "graph"):
            if s in row and off:
                row[s]["overhead_pct"] = 100.0 * (row[s]["mean_ms"] / off - 1.0)
        rows[level] = row
    sizes = [m["profile"] for m in ms if m.get("profile")]
    return {"levels": rows, "profile": sizes}


def problems_of(ms: list[dict], states: list[str]) -> list[str]:
    problems = []
    for m in ms:
        if m["ftrace_lost"]:
            problems.append(f"{m['state']} boot #{m['boot']} lost {m['ftrace_lost']} ftrace "
                            f"events (a narrower --graph-filter or a bigger --buf-mb)")
        if not m["levels_ms"]:
            problems.append(f"{m['state']} boot #{m['boot']} has no initcall level")
    for s in states:
        if not any(m["state"] == s for m in ms):
            problems.append(f"no {s} boot was measured")
    return problems


def run(a, rec) -> list[str]:
    if a.quick:
        a.boots = 1
    states = [s for s in a.states.split(",") if s]
    bad = [s for s in states if s not in STATES]
    if bad:
        raise BenchError(f"unknown states {bad} (known: {STATES})")
    guest = guests.build(a, rec, host_tools=True)
    work = Path(tempfile.mkdtemp(prefix="ivt-bootbench-", dir="/var/tmp"))
    before = hostload.snapshot()
    ms, accel = [], None
    print(f"boot bench: {a.boots} boots per state, states {states}", flush=True)
    try:
        for n in range(a.boots):
            order = states[n % len(states):] + states[:n % len(states)]
            for state in order:
                t0 = time.monotonic()
                out = record_boot(a, guest, work, state, n)
                m = measure(a, out, state, n)
                m["wall_s"] = round(time.monotonic() - t0, 1)
                ms.append(m)
                print(f"  {state} #{n}: {m['wall_s']} s, kernel {m['levels_ms'].get('kernel')} ms, "
                      f"{m['ftrace_recorded']} ftrace events, {m['ftrace_lost']} lost"
                      + (f", profile {m['profile']}" if "profile" in m else ""), flush=True)
                shutil.rmtree(out, ignore_errors=True)
        accel = ivtvm.probe_accel(a.accel)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    guests.describe(rec, guest, accel, a.smp, a.mem)
    rec["data"] = {
        "params": {"boots": a.boots, "states": states, "buf_mb": a.buf_mb,
                   "graph_filter": a.graph_filter, "smp": a.smp, "mem": a.mem,
                   "append": {s: append_for(s, a) for s in states}},
        "conditions": {"before": before, "after": hostload.snapshot()},
        "measurements": ms,
        "summary": summarize(ms),
    }
    return problems_of(ms, states)
