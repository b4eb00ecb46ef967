"""The evaluation preset's section of docs/performance.md (tables, reading, plot).

Every number comes from one results file of `bench/run evaluation`; the statistics are
harness/stats.py's (the same the harness prints at the end of a run).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from harness import results
from harness.results import ROOT
from harness.stats import TARGET_INT_PCT, fnum, summarize

from . import plots
from .common import git_line

QUICK_NOTE = ", **quick smoke run: 1 repetition, short workloads; not for quoting**"
LABELS = {
    "bare": "bare (no tracing)",
    "ivt-idle": "ivtrace: module loaded, idle (events=none)",
    "ivt-flight": "ivtrace: flight recorder (overwrite, nobody draining)",
    "ivt-stream": "ivtrace: streaming to disk (`ivtrace record` on the host)",
    "ft-flight": "ftrace: flight recorder (its ring, nobody reading)",
    "ft-net": "ftrace text → virtio-net → host TCP (busybox nc)",
    "ft-ssh": "ftrace text → SSH (host `ssh guest cat trace_pipe`)",
    "ft-9p": "ftrace text → file on a 9p share (NFS-like)",
    "ft-vserial": "ftrace text → virtio-serial port (virtio-trace path)",
}
SHORT = {
    "bare": "bare", "ivt-idle": "ivtrace idle", "ivt-flight": "ivtrace flight rec.",
    "ivt-stream": "ivtrace stream", "ft-flight": "ftrace flight rec.", "ft-net": "ftrace→net",
    "ft-ssh": "ftrace→SSH", "ft-9p": "ftrace→9p", "ft-vserial": "ftrace→vserial",
}
WL_LABELS = {
    "int": "CPU-bound integer loop (`ev-int`, Dhrystone-like)",
    "syscall": "system-call loop (`ev-syscall`)",
    "tar": "tar create + extract in tmpfs (`ev-tar`)",
    "gzip": "gzip compression (`ev-gzip`, zlib level 6)",
    "forkexec": "fork + exec + wait (`ev-forkexec`)",
}
# IVRing's table (seed 000, 2012): dhrystone 2 (UnixBench) in a KVM guest with one
# dedicated vCPU, Xeon X5660 host, SystemTap probes on all sched, timer and kmem tracepoints.
IVRING_2012 = {
    "bare": (29043600, None), "ivt-stream": (28565398, 1.6),
    "ft-9p": (22000508, 24.3), "ft-ssh": (10246792, 64.7),
}
IVRING_NAMES = {"bare": "[0] Bare", "ivt-stream": "[1] IVRing", "ft-9p": "[2] NFS",
                "ft-ssh": "[3] SSH"}

def fpct(x):
    if "overhead_pct" not in x:
        return "–"
    s = f"{x['overhead_pct']:.1f} %"
    return s


def fspread(x):
    if x.get("overhead_min_pct") is None:
        return "–"
    s = f"{x['overhead_min_pct']:.1f} .. {x['overhead_max_pct']:.1f}"
    if x.get("overhead_se_pct") is not None:
        s += f" (±{x['overhead_se_pct']:.1f})"
    return s


def fadj(x):
    if x.get("adj_overhead_pct") is None:
        return "–"
    s = f"{x['adj_overhead_pct']:.1f} %"
    if x.get("adj_overhead_min_pct") is not None and x["n"] > 1:
        s += f" ({x['adj_overhead_min_pct']:.1f} .. {x['adj_overhead_max_pct']:.1f}"
        if x.get("adj_overhead_se_pct") is not None:
            s += f", ±{x['adj_overhead_se_pct']:.1f}"
        s += ")"
    return s


def flost(cfg, x):
    """Flight recorders keep the newest events by design: what wrapped is not a loss."""
    if cfg.endswith("-flight"):
        return (f"({x['lost_pct']:.0f} % overwritten)" if x["lost_pct"] > 0 else "0 %")
    return f"{x['lost_pct']:.1f} %"


def fbest(x):
    return "–" if x.get("best_overhead_pct") is None else f"{x['best_overhead_pct']:.1f} %"


def fwait(x):
    if x.get("vcpu_wait_pct") is None:
        return "–"
    return f"{x['vcpu_wait_pct']:.1f} % (max {x['vcpu_wait_max_pct']:.1f})"


def doorbell_status(src: str | None) -> str:
    if src:
        return (f"measured: `{src}` (`bench/run doorbell`; its own section of this page "
                f"gives the figures)")
    return "**not yet measured** (bench/results/doorbell/ has no full run yet)"


def per_event_ns(guest_src: str | None):
    """Per-event cost of both tracers in the same guest kernel under the same accelerator,
    from the guest preset's run (getppid loop with sys_enter/sys_exit traced: added ns per
    call / events per call; includes the syscall tracepoint slow path)."""
    if not guest_src:
        return None
    g = results.load(ROOT / guest_src)
    out = {"source": guest_src, "accel": g["accelerator"]["name"]}
    table = g["data"].get("summary", {}).get("table")
    if table is not None:  # the four-tracer guest preset: flight recorders, getppid loop
        row = table.get("getppid", {})
        for t, c in (("ivtrace", "ivt-flight"), ("ftrace", "ft-ring")):
            x = (row.get(c) or {}).get("added_wall_per_event")
            if x:
                out[t] = x["median"]
        return out if "ivtrace" in out else None
    row = g["data"].get("summary", {}).get("syscall", {})
    for t in ("ivtrace", "ftrace"):
        x = row.get(t)
        if x and x.get("added_ns") and x.get("events_per_op"):
            out[t] = x["added_ns"] / x["events_per_op"]
    return out if "ivtrace" in out else None


def section_expected(out: list, e) -> None:
    s, p = e.s, e.p
    pe = per_event_ns(e.guest_src)
    if not pe:
        return
    rows = [c for c in ("ivt-flight", "ivt-stream", "ft-flight") if c in p["configs"]]
    if not rows:
        return
    out.append("### What the per-event cost predicts\n")
    out.append(
        f"The in-guest benchmark (`{pe['source']}`, {pe['accel']}, same guest kernel) measured "
        f"what one event costs each tracer on this emulator: ivtrace "
        f"**{pe['ivtrace']:.0f} ns**" + (f", ftrace **{pe['ftrace']:.0f} ns**" if "ftrace" in pe
                                         else "") +
        " (a getppid() loop with sys_enter/sys_exit traced: added time per call / events per "
        "call; it includes the kernel's syscall-tracepoint slow path, so it is an upper "
        "bound for a tracepoint's own cost). Expected overhead = events/s x cost per event; "
        "beside it the measured overheads of this run. Where the measured figure is far "
        "above the expectation, the difference is not the tracer's per-event work.\n")
    out.append("| configuration | workload | events/s (median) | expected overhead | measured "
               "(geomean) | best-of-reps | adjusted |")
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for c in rows:
        ns = pe.get("ivtrace" if c.startswith("ivt") else "ftrace")
        if ns is None:
            continue
        for w in p["workloads"]:
            x = s["workloads"].get(w, {}).get("configs", {}).get(c)
            if not x or "overhead_pct" not in x:
                continue
            exp = x["events_per_s"] * ns / 1e9 * 100.0
            adj = "–" if x.get("adj_overhead_pct") is None else f"{x['adj_overhead_pct']:.1f} %"
            out.append(f"| {SHORT.get(c, c)} | {w} | {fnum(x['events_per_s'])} | {exp:.2f} % | "
                       f"{x['overhead_pct']:.1f} % | {fbest(x)} | {adj} |")
    out.append("")

def part_header(out: list, e) -> None:
    """Where the run comes from, the machine, the method, the exact commands."""
    rec, p, c = e.rec, e.p, e.data["conditions"]
    m, acc, guest = rec["machine"], rec["accelerator"], rec["guest"]
    out.append(f"From `{e.src}` (run of {rec['date']}, {rec['duration_s'] / 60:.0f} min, "
               f"one boot{QUICK_NOTE if e.quick else ''}). "
               f"Reproduce: `{rec['command']}` (or `make eval`, which also reruns the native, "
               f"doorbell and guest benchmarks), as root.\n")
    hyper = "hypervisor" in m["cpu"].get("flags_of_interest", [])
    out.append("| | |\n|---|---|")
    out.append(f"| accelerator | **{acc['name']}**: {acc['reason']} |")
    out.append(f"| host | {m['cpu'].get('model_name', '?')}, {m['cpus']} CPUs, "
               f"{m.get('mem_gib', '?')} GiB, kernel "
               f"{m['kernel']}{' (itself a VM: hypervisor flag)' if hyper else ''} |")
    out.append(f"| guest | Debian kernel {guest['kernel']}, {p['smp']} vCPU, {p['mem']}; "
               f"{e.data.get('guest_info') or ''} |")
    v = m["versions"]
    out.append(f"| versions | {v['qemu']}; {v['babeltrace2']}; {v['gcc']}; {v['rustc']}; "
               f"{v['ivtrace']}; {v['ssh']}; dropbear {v['dropbear']} |")
    pin = p.get("pinning")
    out.append("| pinning | " + (f"QEMU vCPU thread on host CPU {pin['vcpu_cpu']}; QEMU's other "
                                 f"threads (main loop: slirp, 9p, chardev), `ivtrace record`, the "
                                 f"sink and ssh on CPU {pin['other_cpu']}" if pin else "none")
               + " |")
    la = c["loadavg_at_start"]
    out.append(f"| load | loadavg {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} at start (waited "
               f"{c['waited_s']:.0f} s for <= {c['max_load']}), "
               f"{' '.join(f'{x:.2f}' for x in c['loadavg_after'])} after; host CPUs busy "
               f"during the run: {', '.join(f'{x:.0f} %' for x in c['host_cpu_busy_pct'])} |")
    out.append(f"| ivtrace | {git_line(rec['git'])} |")
    out.append("")
    part_method(out, p)
    part_commands(out, e.data["commands"])


def part_method(out: list, p: dict) -> None:
    out.append(
        f"**Method.** One guest, every device present in every configuration (ivshmem, "
        f"virtio-net with QEMU user networking, a 9p share, a virtio-serial port). Per "
        f"repetition ({p['reps']}) the {len(p['configs'])} configurations run in an order "
        f"rotated by one, and so do the workloads; each workload runs {p['secs']:g} s and "
        f"prints one score (higher is better). Overhead = (1 - score/bare) x 100 (IVRing's "
        f"definition), from geometric means over repetitions against the bare score of the "
        f"same run; spread = the per-repetition overheads, each against its own "
        f"repetition's bare score (min .. max), and ± the standard error from the standard "
        f"deviation of the log scores. **Event load** (same set for both tracers): the "
        f"tracepoints of ivtrace's groups sched, irq, timer and kmem — sched_switch, "
        f"sched_wakeup, sched_wakeup_new, sched_process_fork/exec/exit/free, task_rename, "
        f"irq_handler_entry/exit, softirq_entry/exit, hrtimer_expire_entry/exit, kmalloc, "
        f"kfree, mm_page_alloc, mm_page_free (the seeds traced all sched, timer and kmem "
        f"events; irq added). Each tracer has a {p['buf_kb']} KiB per-CPU ring. The ftrace "
        f"transports ship its text (formatted) stream, `cat trace_pipe`, which is what "
        f"ftrace users ship; ivtrace ships binary CTF packets, copied by the host.\n")
    out.append("Configurations:\n")
    for cfg in p["configs"]:
        out.append(f"- `{cfg}`: {LABELS.get(cfg, cfg)}")


def part_commands(out: list, cmds: dict) -> None:
    out.append("")
    script = cmds.get("guest_script", "bench/guest/evalguest.sh")
    out.append("Exact commands: guest `" + cmds["guest"] + "` (`" + script + "`); "
               + "; ".join(f"`{k}`: `{v}`" for k, v in cmds["ivtrace_insmod"].items()) + "; "
               + "; ".join(f"`{k}`: `{v}`" for k, v in cmds["guest_readers"].items())
               + (f"; host recorder `{cmds['host_recorder']}`" if cmds.get("host_recorder") else "")
               + (f"; host ssh `{cmds['host_ssh']}`" if cmds.get("host_ssh") else "")
               + f"; sink `{cmds['sink']}`. QEMU: `{cmds['qemu']}`.\n")


def part_ivring(out: list, e) -> None:
    """The CPU-bound workload beside IVRing's 2012 figures."""
    s, p = e.s, e.p
    # --- the seeds' table: CPU-bound workload, IVRing's figures beside ours
    iw = s["workloads"].get("int")
    if iw:
        out.append("### The CPU-bound workload, in IVRing's format\n")
        out.append(f"{WL_LABELS['int']}: score = loops/s, geometric mean of {p['reps']} "
                   f"run(s) of {p['secs']:g} s. Right-hand columns: **IVRing's own 2012 "
                   f"figures, on their hardware** (dhrystone 2 from UnixBench, KVM, one "
                   f"dedicated vCPU on a Xeon X5660, SystemTap probes on all sched, timer and "
                   f"kmem tracepoints), quoted from the seed for reference; their scores are "
                   f"not comparable to ours, only the percentages are.\n")
        out.append("Columns *adjusted* and *vCPU wait*: see \"Host contention\" below; the "
                   "raw overhead is the measurement, the adjusted one removes the time the "
                   "guest's vCPU thread sat runnable on the host waiting for its CPU (other "
                   "engineers' jobs on this 2-CPU machine).\n")
        out.append("| method (here) | score | overhead | spread: per-rep min .. max (± se) | "
                   "adjusted overhead (min .. max, ± se) | vCPU wait | "
                   "events/s | lost | IVRing 2012: method | score | overhead |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
        for cfg in p["configs"]:
            x = iw["configs"].get(cfg)
            if not x:
                continue
            ref = IVRING_2012.get(cfg)
            refs = (f"{IVRING_NAMES[cfg]} | {ref[0]:,} | "
                    f"{'–' if ref[1] is None else f'{ref[1]:.1f} %'}") if ref else " | | "
            traced = cfg not in ("bare", "ivt-idle")
            evs = fnum(x["events_per_s"]) if traced else "–"
            lost = flost(cfg, x) if traced else "–"
            spread = fspread(x) if cfg != "bare" else "–"
            out.append(f"| {LABELS.get(cfg, cfg)} | {fnum(x['geomean'])} | {fpct(x)} | "
                       f"{spread} | {fadj(x) if cfg != 'bare' else '–'} | {fwait(x)} | "
                       f"{evs} | {lost} | {refs} |")
        out.append("")


def part_matrix(out: list, e) -> None:
    """Every workload x configuration: overhead %."""
    s, p = e.s, e.p
    # --- the thesis's matrix
    out.append("### Every workload: overhead in % of the bare score (the thesis's matrix)\n")
    out.append("Cells: overhead % (geometric means), then the per-repetition min .. max. "
               "Negative = faster than bare (noise). Bare row: the score itself.\n")
    ws = p["workloads"]
    out.append("| configuration | " + " | ".join(
        f"{w} ({s['workloads'][w]['unit']})" for w in ws if w in s["workloads"]) + " |")
    out.append("|---|" + "---:|" * len(ws))
    for cfg in p["configs"]:
        cells = []
        for w in ws:
            x = s["workloads"].get(w, {}).get("configs", {}).get(cfg)
            if not x:
                cells.append("–")
            elif cfg == "bare":
                cells.append(f"{fnum(x['geomean'])} (sd_log {x['sd_log'] or 0:.3f})")
            else:
                sp = (f" [{x['overhead_min_pct']:.1f} .. {x['overhead_max_pct']:.1f}]"
                      if x.get("overhead_min_pct") is not None and x["n"] > 1 else "")
                cells.append(f"**{x['overhead_pct']:.1f}**{sp}")
        out.append(f"| {SHORT.get(cfg, cfg)} | " + " | ".join(cells) + " |")
    out.append("")


def part_adjusted(out: list, e) -> None:
    """The same matrix, contention-adjusted."""
    s, p = e.s, e.p
    ws = p["workloads"]
    if any(x.get("adj_overhead_pct") is not None for ww in s["workloads"].values()
           for x in ww["configs"].values()):
        out.append("Contention-adjusted (see \"Host contention\"): overhead % of "
                   "score / (1 - vCPU wait), and the mean vCPU wait of the configuration's "
                   "runs.\n")
        out.append("| configuration | " + " | ".join(w for w in ws if w in s["workloads"]) + " |")
        out.append("|---|" + "---:|" * len(ws))
        for cfg in p["configs"]:
            cells = []
            for w in ws:
                x = s["workloads"].get(w, {}).get("configs", {}).get(cfg) or {}
                wt = x.get("vcpu_wait_pct")
                wts = "" if wt is None else f" (wait {wt:.0f} %)"
                if cfg == "bare":
                    cells.append(f"–{wts}")
                elif x.get("adj_overhead_pct") is None:
                    cells.append("–")
                else:
                    sp = (f" [{x['adj_overhead_min_pct']:.1f} .. {x['adj_overhead_max_pct']:.1f}]"
                          if x["n"] > 1 and x.get("adj_overhead_min_pct") is not None else "")
                    cells.append(f"**{x['adj_overhead_pct']:.1f}**{sp}{wts}")
            out.append(f"| {SHORT.get(cfg, cfg)} | " + " | ".join(cells) + " |")
        out.append("")


def part_contention(out: list, e) -> None:
    """How much other jobs held the vCPU's host CPU."""
    s = e.s
    # --- host contention
    waits = [x["vcpu_wait_pct"] for ww in s["workloads"].values() for x in ww["configs"].values()
             if x.get("vcpu_wait_pct") is not None]
    if waits:
        out.append("### Host contention and the adjusted figures\n")
        out.append(
            f"Under TCG the guest runs only while QEMU's vCPU thread has a host CPU. This "
            f"machine has 2 CPUs shared with other engineers' builds and guests; the vCPU "
            f"thread is pinned to one of them, but nothing stops other jobs from running "
            f"there too. Around every workload run (between the guest's `EV begin` and "
            f"`EV m` console lines) the harness reads the vCPU thread's "
            f"`/proc/PID/task/TID/schedstat` (time on a CPU, time runnable but waiting for "
            f"one): the **vCPU wait** is the share of the run the guest was frozen by the "
            f"host scheduler, during which the guest's clock ran on and its workload made no "
            f"progress. In this run it was {min(waits):.1f} .. {max(waits):.1f} % per "
            f"configuration (mean over its runs). The **adjusted** score is score / (1 - "
            f"wait), i.e. per second the vCPU was not kept waiting; time the guest spends "
            f"idle (blocked on the host's 9p or network side) is not wait and stays in. It "
            f"removes other jobs' interference, not anything the tracer or the transport does "
            f"inside the guest or in QEMU; the raw overhead remains the measurement, the "
            f"adjusted one is the evidence of what interference did to it.\n")


def part_workloads(out: list, e) -> None:
    """Per workload: scores, spread, event rates, losses."""
    s, p = e.s, e.p
    ws = p["workloads"]
    # --- per workload: scores and event rates
    out.append("### Scores, event rates and losses per workload\n")
    out.append("Events/s: events the tracer wrote during the workload (ftrace: entries + "
               "overrun + read from its per-CPU stats; ivtrace: events in closed packets + "
               "drops, so counted per 64 KiB packet) over the run's time, median of "
               "repetitions. Lost: ftrace overrun + dropped (the reader fell behind and the "
               "ring overwrote unread events); ivtrace drops (discard mode, ring full). In the "
               "flight-recorder states the ring wrapping is the design (the newest events are "
               "kept), shown as overwritten, not lost. The "
               "ftrace readers are guest processes on the same vCPU, so their own work adds "
               "events (each wake-up is a sched_wakeup + 2 sched_switch, each write allocates).\n")
    for w in ws:
        ww = s["workloads"].get(w)
        if not ww:
            continue
        out.append(f"**{WL_LABELS.get(w, w)}**, score in {ww['unit']}\n")
        out.append("| configuration | score (geomean) | min .. max | sd_log | overhead | "
                   "per-rep overheads | best-of-reps overhead | adjusted overhead | vCPU wait | "
                   "host CPU: QEMU I/O threads + helpers | events/s | lost |")
        out.append("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        for cfg in p["configs"]:
            x = ww["configs"].get(cfg)
            if not x:
                continue
            pr = ", ".join(f"{v:.1f}" for v in x.get("overhead_per_rep_pct", [])) or "–"
            traced = cfg not in ("bare", "ivt-idle")
            sdl = "–" if x["sd_log"] is None else f"{x['sd_log']:.3f}"
            evs = fnum(x["events_per_s"]) if traced else "–"
            lost = flost(cfg, x) if traced else "–"
            hc = ("–" if x.get("qemu_io_cpu_pct") is None else
                  f"{x['qemu_io_cpu_pct']:.1f} % + {x['host_helper_cpu_pct']:.1f} %")
            out.append(f"| {SHORT.get(cfg, cfg)} | {fnum(x['geomean'])} | {fnum(x['min'])} .. "
                       f"{fnum(x['max'])} | {sdl} | {fpct(x)} | {pr} | {fbest(x)} | "
                       f"{fadj(x) if cfg != 'bare' else '–'} | {fwait(x)} | {hc} | "
                       f"{evs} | {lost} |")
        out.append("")


def part_transports(out: list, e) -> None:
    """What reached the host through each transport."""
    s, p = e.s, e.p
    # --- what the transports carried
    tr = s.get("transport", {})
    if tr:
        out.append("### What each transport carried (host side, per configuration)\n")
        out.append("Totals over all workloads of a configuration (plus its set-up and "
                   "teardown), per repetition. ivtrace: CTF bytes `ivtrace record` wrote "
                   "and the events and losses of its summary; others: bytes of ftrace text "
                   "that reached the host file.\n")
        out.append("| configuration | transport | bytes per repetition | events (ivtrace) | "
                   "lost (ivtrace) | host helper |")
        out.append("|---|---|---:|---:|---:|---|")
        for cfg in p["configs"]:
            d = tr.get(cfg)
            if not d:
                continue
            reps = d["reps"]
            b = [x.get("bytes", x.get("trace_bytes", 0)) for x in reps]
            evs = [x.get("events") for x in reps if x.get("events") is not None]
            lo = [x.get("lost") for x in reps if x.get("lost") is not None]
            how = sorted({x.get("how") for x in reps if x.get("how")})
            out.append(f"| {SHORT.get(cfg, cfg)} | {d['transport']} | "
                       f"{', '.join(f'{v / 1e6:,.1f} MB' for v in b)} | "
                       f"{', '.join(f'{v:,}' for v in evs) or '–'} | "
                       f"{', '.join(f'{v:,}' for v in lo) or '–'} | {', '.join(how) or '–'} |")
        out.append("")


def part_acceptance(out: list, e) -> None:
    """The acceptance lines."""
    s = e.s
    # --- acceptance
    acc = s.get("acceptance", {})
    out.append("### Acceptance lines\n")
    if "ivt-stream" in acc:
        a = acc["ivt-stream"]
        met = acc.get("ivt_stream_met")
        out.append(f"- ivtrace streaming to disk, CPU-bound workload, full event load: "
                   f"**{a['overhead_pct']:.2f} %** (per-rep {fnum(a['overhead_min_pct'], 2)} .. "
                   f"{fnum(a['overhead_max_pct'], 2)}, ± {fnum(a.get('overhead_se_pct'), 2)}); "
                   f"target <= {acc['target_pct']:.0f} %: "
                   f"{'met' if met else '**not met**'}"
                   f"{' (quick run: not a measurement to quote)' if e.quick else ''}.")
    if "ft-net" in acc:
        a = acc["ft-net"]
        out.append(f"- the network transport (ftrace text over virtio-net), same run, same "
                   f"workload: **{a['overhead_pct']:.1f} %** (per-rep "
                   f"{fnum(a['overhead_min_pct'], 1)} .. {fnum(a['overhead_max_pct'], 1)}).")
    out.append(f"- doorbell figures: {doorbell_status(e.doorbell_src)}.")
    inc = e.data.get("incomplete") or []
    if inc:
        out.append(f"- **incomplete run**: {'; '.join(inc)}")
    out.append("")


def section_discussion(out: list, e) -> None:
    """Reading of the run, every number from the results."""
    iw = e.s["workloads"].get("int", {}).get("configs", {})
    if not iw or "bare" not in iw:
        return
    out.append("### Reading the results\n")
    pe = per_event_ns(e.guest_src)
    cal = e.data.get("calibration") or {}
    g, h = cal.get("guest") or {}, cal.get("host_native") or {}
    for t in (reading_ivtrace(iw, pe), reading_alternatives(iw), reading_where_cost_goes(iw),
              reading_tcg(e, iw, pe, g, h)):
        if t:
            out.append(t + "\n")
    out.extend(calibration_table(e, g, h))


def reading_ivtrace(iw: dict, pe: dict | None) -> str | None:
    """ivtrace streaming on the CPU-bound workload, against its noise and its prediction."""
    noise = iw["bare"].get("sd_log")
    st = iw.get("ivt-stream")
    if st and "overhead_pct" in st:
        se = st.get("overhead_se_pct")
        within = se is not None and abs(st["overhead_pct"]) <= 2 * se
        t = (f"**ivtrace on the CPU-bound workload.** Streaming the full event load to disk "
             f"cost {st['overhead_pct']:.2f} % (per repetition {st['overhead_min_pct']:.2f} .. "
             f"{st['overhead_max_pct']:.2f} %"
             + (f", standard error ±{se:.2f}" if se is not None else "") + ")"
             + (f"; adjusted for host contention {st['adj_overhead_pct']:.2f} %"
                if st.get("adj_overhead_pct") is not None else "")
             + (f"; best run against best run {st['best_overhead_pct']:.2f} %"
                if st.get("best_overhead_pct") is not None else "") + ". ")
        if within:
            t += ("That is within two standard errors of zero: this run cannot tell it from "
                  "no tracing at all. ")
        if noise:
            t += (f"The bare score itself moved by {100 * noise:.1f} % (sd of logs) between "
                  f"repetitions. ")
        if pe:
            t += (f"The workload makes no system call, so only the machine's own activity is "
                  f"traced ({fnum(st['events_per_s'])} events/s: timer ticks, softirqs, the "
                  f"module's flush timer); at {pe['ivtrace']:.0f} ns per event under "
                  f"{pe['accel']} that predicts {st['events_per_s'] * pe['ivtrace'] / 1e7:.3f} "
                  f"%. ")
        met = st["overhead_pct"] <= TARGET_INT_PCT
        t += (f"Target <= {TARGET_INT_PCT:.0f} %: **{'met' if met else 'not met'}**"
              + ("" if met else
                 (" by the raw figure; the per-event cost cannot explain it (see the prediction "
                  "above), the adjusted and best-of figures show how much is other jobs' "
                  "interference" if pe else "")) + ".")
        return t


def reading_alternatives(iw: dict) -> str | None:
    """The other transports of the same events, against ivtrace and the seed's order."""
    st = iw.get("ivt-stream")
    alts = [(c, iw[c]) for c in ("ft-net", "ft-ssh", "ft-9p", "ft-vserial")
            if c in iw and "overhead_pct" in iw[c]]
    if alts and st and "overhead_pct" in st:
        t = ("**The alternatives, same events, same run.** Shipping ftrace's text stream cost "
             + ", ".join(f"{x['overhead_pct']:.1f} % ({SHORT[c]})" for c, x in alts)
             + " on the CPU-bound workload, against IVRing's 24.3 % (NFS) and 64.7 % (SSH) "
               "of 2012. ")
        ov = {c: x["overhead_pct"] for c, x in alts}
        best_alt = min(ov, key=ov.get)
        if st["overhead_pct"] < ov[best_alt]:
            t += (f"ivtrace's streaming state cost less than the cheapest alternative "
                  f"({SHORT[best_alt]}) by {ov[best_alt] - st['overhead_pct']:.1f} points. ")
        else:
            t += (f"**ivtrace's streaming state did not cost less than {SHORT[best_alt]} "
                  f"in this run.** ")
        lossy = [(c, x["lost_pct"]) for c, x in alts if x.get("lost_pct", 0) >= 0.1]
        if lossy:
            t += ("And they did not even deliver every event: " + ", ".join(
                f"{SHORT[c]} lost {v:.1f} %" for c, v in lossy) + " of the events (its reader "
                "fell behind and ftrace's ring overwrote what it had not read yet), where "
                f"ivtrace lost {st.get('lost_pct', 0):.1f} %. ")
        if {"ft-net", "ft-9p", "ft-ssh"} <= set(ov) and \
                min(ov["ft-net"], ov["ft-ssh"]) > ov["ft-9p"] > st["overhead_pct"]:
            t += ("The order is the seed's: the network paths (TCP, SSH) cost the most, the "
                  "file share less, shared memory least.")
        return t


def reading_where_cost_goes(iw: dict) -> str | None:
    """ftrace with and without a reader: where the alternatives' cost comes from."""
    ff = iw.get("ft-flight")
    fn = iw.get("ft-net")
    if ff and fn and "overhead_pct" in ff and "overhead_pct" in fn:
        small = ff["overhead_pct"] < fn["overhead_pct"] / 4
        return (
            f"**Where the alternatives' cost goes.** ftrace recording into its ring with nobody "
            f"reading cost {ff['overhead_pct']:.1f} % here ({fnum(ff['events_per_s'])} events/s)"
            + (": the tracepoints are not the problem" if small else "") +
            f". With a reader the event rate on the same "
            f"workload rose to {fnum(fn['events_per_s'])} events/s (network), because the "
            f"reader is itself traced: every wake-up of `cat`, every read() of trace_pipe, "
            f"every write() into a socket or a 9p file allocates and schedules, and those "
            f"events are formatted and shipped in turn. The reader, the text formatting and "
            f"the guest's network or 9p stack all run on the guest's one vCPU, taking it from "
            f"the workload; on the host, QEMU's I/O threads (slirp, 9p, chardev) ran on the "
            f"other CPU. ivtrace's host side (`ivtrace record`) reads the shared memory from "
            f"the other CPU: no exit, no guest process per event"
            + (f" (streaming {iw['ivt-stream']['overhead_pct']:.1f} % against the flight "
               f"recorder's {iw['ivt-flight']['overhead_pct']:.1f} %, where nobody reads)"
               if "overhead_pct" in iw.get("ivt-stream", {}) and
               "overhead_pct" in iw.get("ivt-flight", {}) else "") + ".")


def calibration_table(e, g: dict, h: dict) -> list:
    """The same primitives in the guest and natively (ev-helper tcgcost)."""
    tbl: list = []
    if g and h:
        names = [("rdtsc", "rdtsc (the event timestamp)"),
                 ("store8", "8-byte store, cached buffer (the event's copy into the ring)"),
                 ("load8", "8-byte load, cached buffer"),
                 ("clock_gettime", "clock_gettime(CLOCK_MONOTONIC), vDSO"),
                 ("getppid", "getppid(2), a system call round trip")]
        tbl.append("**What the emulator makes costlier** (`ev-helper tcgcost`: the same static "
                   "binary in the guest and natively on the host CPU the vCPU thread uses, ns "
                   "per operation, best of 3 rounds, net of the empty loop; stores and loads "
                   "are throughput, back to back):\n")
        tbl.append("| operation | in the guest (" + e.accel + ") | native (host) | ratio |")
        tbl.append("|---|---:|---:|---:|")
        for k, label in names:
            gv, hv = g.get(k), h.get(k)
            if gv is None or hv is None:
                continue
            r = f"{gv / hv:.0f}x" if hv > 0.5 else "–"
            tbl.append(f"| {label} | {gv:.2f} | {hv:.2f} | {r} |")
        tbl.append("")
    return tbl


def reading_tcg(e, iw: dict, pe: dict | None, g: dict, h: dict) -> str | None:
    """What TCG makes costlier than KVM, measured."""
    if e.accel == "tcg":
        t = ("**TCG versus KVM.** Under TCG every guest instruction is translated and every "
             "guest memory access goes through QEMU's software TLB; every virtio notification "
             "is emulated in the vCPU thread (no ioeventfd), which makes the alternatives' "
             "guest I/O costlier too. ")
        if pe:
            t += (f"An ivtrace event cost {pe['ivtrace']:.0f} ns in this guest (syscall slow path "
                  f"included), against the writer's native cost in §1 below. ")
        if g.get("rdtsc") and h.get("rdtsc"):
            r = g["rdtsc"] / h["rdtsc"]
            t += (f"Measured below: `rdtsc`, the event timestamp, costs {g['rdtsc']:.1f} ns in "
                  f"the guest against {h['rdtsc']:.1f} ns natively"
                  + (" (about the same: QEMU answers it from the host's own TSC plus an offset, "
                     "and this host, itself a VM, reads its TSC without an exit)"
                     if r < 1.5 else f" ({r:.1f}x)") + "; ")
            if "store8" in g and "load8" in g:
                t += (f"an 8-byte store {g['store8']:.2f} ns back to back (natively hidden by the "
                      f"pipeline, {h.get('store8', 0):.2f}), a load {g['load8']:.2f} against "
                      f"{h.get('load8', 0):.2f} ns, a system call {g.get('getppid', 0):.0f} "
                      f"against {h.get('getppid', 0):.0f} ns. ")
        t += ("So under TCG an event's memory accesses and the surrounding kernel code cost "
              "several times what they cost natively (KVM runs them natively), not its "
              "timestamp. ")
        stx = iw.get("ivt-stream", {})
        if pe and stx.get("events_per_s") is not None:
            pred = stx["events_per_s"] * pe["ivtrace"] / 1e7
            t += (f"On the CPU-bound workload this accounts for {pred:.3f} % (its event rate "
                  f"times the per-event cost){': negligible' if pred < 0.1 else ''}. ")
        t += ("The ratios between configurations are the comparison; under KVM both sides "
              "shrink.")
        return t


def _err(x: dict, key: str = "") -> tuple[float, float]:
    """The error bar of an overhead (key "" raw, "adj_" adjusted): down to the smallest and up
    to the largest per-repetition overhead, none where they are missing."""
    v = x[key + "overhead_pct"]
    mn, mx = x.get(key + "overhead_min_pct"), x.get(key + "overhead_max_pct")
    return (max(0.0, v - (v if mn is None else mn)), max(0.0, (v if mx is None else mx) - v))


def _plot_int(ax, iw: dict, cfgs: list) -> None:
    """Left panel: the CPU-bound workload's overhead per configuration, raw and adjusted for
    host contention, under IVRing's 2012 percentages (hatched: measured on their hardware)."""
    names, vals, lo, hi, cols, adj = [], [], [], [], [], []
    for c in cfgs:
        x = iw.get(c)
        if not x or "overhead_pct" not in x:
            continue
        names.append(SHORT[c])
        vals.append(x["overhead_pct"])
        e = _err(x)
        lo.append(e[0])
        hi.append(e[1])
        adj.append(x.get("adj_overhead_pct"))
        cols.append("tab:blue" if c.startswith("ivt") else "tab:orange")
    ypos = list(range(len(names)))
    ax.barh(ypos, vals, xerr=[lo, hi], color=cols, capsize=3, label="overhead (raw)")
    ay = [y for y, v in zip(ypos, adj) if v is not None]
    if ay:
        ax.plot([v for v in adj if v is not None], ay, "kD", ms=4,
                label="contention-adjusted")
        ax.legend(fontsize=7, loc="lower right")
    refs = [("IVRing 2012\n(their HW)", 1.6), ("NFS 2012\n(their HW)", 24.3),
            ("SSH 2012\n(their HW)", 64.7)]
    base = len(names)
    for i, (_name, v) in enumerate(refs):
        ax.barh(base + i, v, color="white", edgecolor="gray", hatch="//")
    ax.set_yticks(ypos + [base + i for i in range(len(refs))])
    ax.set_yticklabels(names + [r[0] for r in refs], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    ax.axvline(TARGET_INT_PCT, color="green", lw=0.8, ls="--")
    ax.set_xlabel("overhead % (1 - score/bare) x 100")
    ax.set_title("CPU-bound (ev-int) vs IVRing's 2012 table", fontsize=10)


def _plot_matrix(ax, cmap, s: dict, cfgs: list, ws: list, reps: int) -> None:
    """Right panel: every workload, one bar per configuration (dotted: not ivtrace), whiskers
    per-repetition min..max, a diamond where the contention-adjusted overhead is known."""
    width = 0.8 / max(1, len(cfgs))
    for i, c in enumerate(cfgs):
        xs, ys, el, eh = [], [], [], []
        for j, w in enumerate(ws):
            x = s["workloads"][w]["configs"].get(c)
            if not x or "overhead_pct" not in x:
                continue
            xs.append(j + (i - (len(cfgs) - 1) / 2) * width)
            ys.append(x["overhead_pct"])
            e = _err(x)
            el.append(e[0])
            eh.append(e[1])
            if x.get("adj_overhead_pct") is not None:
                ax.plot(xs[-1], x["adj_overhead_pct"], "kD", ms=3)
        ax.bar(xs, ys, width, yerr=[el, eh], label=SHORT[c], color=cmap(i), capsize=2,
               hatch="" if c.startswith("ivt") else "..")
    ax.set_xticks(range(len(ws)))
    ax.set_xticklabels(ws)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("overhead % vs bare")
    ax.set_title(f"every workload ({reps} reps, geometric mean; whiskers: per-rep "
                 f"min..max; ◆ contention-adjusted)",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2)


def plot(rec: dict, png: Path):
    """Two panels: the CPU-bound workload beside IVRing's 2012 percentages; the matrix as
    grouped bars (overhead %, error bars = per-rep min..max). Returns the PNG path or None."""
    plt = plots.pyplot()
    if plt is None:
        return None
    s = summarize(rec["data"])
    p = rec["data"]["params"]
    cfgs = [c for c in p["configs"] if c != "bare"]
    ws = [w for w in p["workloads"] if w in s["workloads"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.5),
                                   gridspec_kw={"width_ratios": [1, 2.2]})
    _plot_int(ax1, s["workloads"].get("int", {}).get("configs", {}), cfgs)
    _plot_matrix(ax2, plt.get_cmap("tab10"), s, cfgs, ws, p["reps"])
    m = rec["machine"]
    fig.suptitle(f"ivtrace evaluation, {rec['date'][:16]}, {rec['accelerator']['name']}, guest "
                 f"{rec['guest']['kernel']} ({p['smp']} vCPU), host {m['cpu'].get('model_name', '?')}",
                 fontsize=10)
    fig.tight_layout()
    return plots.save(fig, plt, png, 90)


def section(out: list, rec: dict, src: str, png: str | None, guest_src: str | None,
            doorbell_src: str | None) -> None:
    """Append the Evaluation section for the results file `src` (repo-relative); `png` is
    its plot, `guest_src` the guest run the per-event prediction uses, `doorbell_src` the
    doorbell run the acceptance lines point to."""
    data = rec["data"]
    e = SimpleNamespace(rec=rec, data=data, src=src, s=summarize(data), p=data["params"],
                        quick=rec["quick"], accel=rec["accelerator"]["name"],
                        guest_src=guest_src, doorbell_src=doorbell_src)
    out.append("## Evaluation: the seeds' overhead tables, measured here\n")
    part_header(out, e)
    part_ivring(out, e)
    part_matrix(out, e)
    part_adjusted(out, e)
    if png:
        out.append(f"![overhead per configuration and workload](../{png})\n")
    section_expected(out, e)
    part_contention(out, e)
    part_workloads(out, e)
    part_transports(out, e)
    part_acceptance(out, e)
    section_discussion(out, e)


def not_measured(out: list) -> None:
    out.append("## Evaluation: the seeds' overhead tables, measured here\n")
    out.append("Not yet measured: run `make eval` (or `bench/run evaluation`).\n")
