"""The guest preset's section of docs/performance.md: the hypertracing micro-benchmark
reproduced, ivtrace.ko against LTTng's kernel tracer, ftrace and perf in one guest."""

from .common import f1, git_line

# The hypertracing seed's micro-benchmark (worst case; Intel i7-6700K, KVM): what one
# traced event costs the guest with each tracer, and the range per traced system call.
SEED_PER_PROBE = [("LTTng", 478.1, "lttng-snapshot"), ("ftrace", 314.0, "ft-ring"),
                  ("hypertracing + compression", 243.1, "ivt-flight"),
                  ("perf", 206.4, "perf-record")]
SEED_SYSCALL_NS = (354, 842)

LABELS = {
    "off": "no tracing",
    "ivt-flight": "ivtrace.ko, flight recorder (overwrite), nobody reads",
    "ivt-stream": "ivtrace.ko, discard, `ivtrace record` on the host",
    "lttng-snapshot": "LTTng, snapshot mode (overwrite), nobody reads",
    "lttng-discard": "LTTng, discard, lttng-consumerd → file",
    "ft-ring": "ftrace, its ring (overwrite), nobody reads",
    "ft-pipe": "ftrace, `cat trace_pipe_raw` → file",
    "perf-record": "perf record → file",
    "perf-trace": "perf trace → file",
}
WORKLOADS = {
    "getppid": ("getppid() loop, sys_enter/sys_exit traced", "call", "ns", 1.0),
    "pingpong": ("pipe ping-pong between two processes (sched_switch-heavy)", "round trip",
                 "µs", 1000.0),
    "forkexec": ("fork + exec of a static no-op + wait", "fork+exec", "µs", 1000.0),
}
SHORT = {"ivt-flight": "ivtrace.ko flight", "ivt-stream": "ivtrace.ko stream",
         "lttng-snapshot": "LTTng snapshot", "lttng-discard": "LTTng discard",
         "ft-ring": "ftrace ring", "ft-pipe": "ftrace trace_pipe_raw",
         "perf-record": "perf record", "perf-trace": "perf trace"}
CONSUMER = {"ivt-stream": "host", "lttng-snapshot": "guest", "lttng-discard": "guest",
            "ft-pipe": "guest", "perf-record": "guest", "perf-trace": "guest"}


def med(x, div=1.0, nd=0):
    return "–" if not x else f1(x["median"] / div, nd)


def rng(x, div=1.0, nd=0):
    if not x:
        return "–"
    return f"{f1(x['median'] / div, nd)} ({f1(x['min'] / div, nd)} – {f1(x['max'] / div, nd)})"


def section(rec: dict, src: str, out: list) -> None:
    g = rec["data"]
    s = g["summary"]
    out.append("## In the guest: ivtrace.ko against LTTng, ftrace and perf\n")
    out.append(
        f"The hypertracing seed's micro-benchmark, reproduced: four tracers record the same "
        f"tracepoints of the same guest kernel under the same workloads, one at a time, in "
        f"one boot. From `{src}` (run of {rec['date']}, {rec['duration_s']:.0f} s). "
        f"This run: `{rec['command']}`. Reproduce: `make -C bench guest` (= `bench/run "
        f"guest`, then `bench/report`), as root, on a fresh clone: it builds the guest, "
        f"LTTng's kernel tracer for its kernel and copies LTTng's and perf's user space into "
        f"it (`vm/build --all --tracers`).\n")
    header(rec, g, out)
    seed_table(s, out)
    out.append("### Per workload\n")
    method(g["params"], out)
    for w in WORKLOADS:
        if w in s["table"]:
            workload_table(w, s["table"][w], g["params"], out)
    ratio_table(s, out)
    reading(s, out)
    agreement_table(s, g["params"], g["runs"], out)
    rates_table(s, g["params"], out)
    proof(s, out)
    tcg(rec, g, s, out)
    commands(g, out)


def header(rec: dict, g: dict, out: list) -> None:
    m, acc, guest, cond = rec["machine"], rec["accelerator"], rec["guest"], g["conditions"]
    t, gi = g.get("tracers", {}), g.get("guest_info", {})
    lm = t.get("lttng_modules", {})
    left = lm.get("probes_left_out") or {}
    out.append("| | |\n|---|---|")
    out.append(f"| accelerator | **{acc['name']}**: {acc['reason']} |")
    out.append(f"| host | {m['cpu'].get('model_name', '?')}, {m['cpus']} CPUs, kernel "
               f"{m['kernel']}; {m['versions'].get('qemu')} |")
    out.append(f"| guest | Debian kernel {guest['kernel']}, {guest['cpus']} vCPU, "
               f"{guest['mem']}; clocksource {gi.get('clocksource', '?')} |")
    out.append(f"| LTTng | {lm.get('source', '?')} from `{lm.get('package', '?')}`, "
               f"built against the guest kernel's headers (`{lm.get('make', '?')}`)"
               + ("; left out, as they do not compile against this kernel: "
                  + ", ".join(f"{k} ({v})" for k, v in left.items()) if left else "")
               + f"; {gi.get('lttng', '?')} (Debian's lttng-tools, in the guest) |")
    out.append(f"| perf | {gi.get('perf', '?')} (Debian's linux-perf, in the guest) |")
    out.append(f"| load | loadavg {' '.join(map(str, cond['loadavg_at_start']))} at the start, "
               f"{' '.join(map(str, cond['loadavg_after']))} after; other QEMUs running at the "
               f"start: {len(cond.get('other_qemus_at_start', []))}; host CPU busy "
               f"{', '.join(f'{v:.0f} %' for v in cond['host_cpu_busy_pct'])} |")
    out.append(f"| ivtrace | {git_line(rec['git'])} |")
    out.append("")
    if not cond.get("quiet", True) or cond.get("other_qemus_at_start"):
        out.append(f"**This run was not made on a quiet machine** (load average "
                   f"{cond['loadavg_at_start'][0]:.2f} at the start against the "
                   f"{cond['max_load']} asked for, after waiting {cond['waited_s']:.0f} s; "
                   f"{len(cond.get('other_qemus_at_start', []))} other QEMU process(es); the "
                   f"host's CPUs were busy "
                   f"{', '.join(f'{v:.0f} %' for v in cond['host_cpu_busy_pct'])} during the "
                   f"run, the guest's included). "
                   f"Other jobs slow the guest down at random moments; they cannot make a "
                   f"tracer cheaper, and every configuration ran in every repetition, so the "
                   f"medians and the per-repetition ratios below still compare the tracers, "
                   f"with a wider spread.\n")


def seed_table(s: dict, out: list) -> None:
    row = s["table"].get("getppid", {})
    perf = (row.get("perf-record") or {}).get("added_cpu_per_event")
    r = (s["ratios"].get("getppid") or {}).get("ivt-flight", {})
    out.append("### Beside the seed's figures\n")
    out.append(
        "The seed (hypertracing, Intel i7-6700K, KVM) measured what one traced event costs "
        "the guest with each tracer. Here: the getppid() loop with sys_enter/sys_exit traced, "
        "added CPU time of the traced task per event it makes (two per call: the probes and "
        "the writes into the buffer, no consumer), median over the repetitions (min – max); "
        "each tracer in its mode with nobody reading (perf has none: its reader's CPU is not "
        "in this figure). The last column is ivtrace's cost divided by that tracer's, paired "
        "per repetition.\n")
    out.append("| tracer | seed: ns per probe | seed: / perf | here: ns per event | "
               "here: / perf | ivtrace.ko / this tracer, here |")
    out.append("|---|---:|---:|---:|---:|---|")
    for name, ns, cfg in SEED_PER_PROBE:
        x = (row.get(cfg) or {}).get("added_cpu_per_event")
        rel = f"{x['median'] / perf['median']:.2f}" if x and perf and perf["median"] > 0 else "–"
        ratio = (r.get(cfg) or {}).get("cpu")
        here_name = f"{name} (here: {LABELS[cfg].split(',')[0]})" if cfg == "ivt-flight" \
            else name
        out.append(f"| {here_name} | {ns:.1f} | {ns / 206.4:.2f} | {rng(x)} | {rel} | "
                   + (f"**{ratio['median']:.2f}** ({ratio['min']:.2f} – {ratio['max']:.2f})"
                      if ratio else "–") + " |")
    out.append("")
    out.append(
        f"Per traced system call the seed reports {SEED_SYSCALL_NS[0]} – {SEED_SYSCALL_NS[1]} ns "
        f"across LTTng, ftrace, perf and hypertracing. Here, the added wall time per getppid() "
        f"call, everything the guest's one vCPU spent on it (consumers in the guest "
        f"included): " + "; ".join(
            f"{SHORT[c]} {med(x.get('added_wall'))} ns" for c, x in row.items() if c != "off")
        + ".\n")


def method(p: dict, out: list) -> None:
    ops = p["ops"]
    out.append(
        f"Method: one guest ({p['smp']} vCPU, its thread pinned to host CPU 0; QEMU's other "
        f"threads, `ivtrace record` and the harness on CPU 1), {p['reps']} repetitions; in each "
        f"the configurations run in an order rotated by one and, in each configuration, every "
        f"workload ({ops['getppid']:,} getppid() calls, {ops['pingpong']:,} ping-pong round "
        f"trips, {ops['forkexec']:,} fork+exec) is its own tracing session: set up, run, torn "
        f"down, the trace sent to the host. Every tracer records the same tracepoints: "
        f"sched_switch, sched_wakeup, sched_wakeup_new, sched_process_fork/exec/exit/free, "
        f"task_rename (LTTng 2.13 has no probe for it) and sys_enter/sys_exit (LTTng: every "
        f"system call, on the same two tracepoints), into a per-CPU buffer of "
        f"{p['buf_kb'] // 1024} MiB that holds a whole run. **Wall** is the workload's own "
        f"clock per operation: on one vCPU a consumer in the guest (lttng-consumerd, `cat`, "
        f"perf) runs in it. **CPU** is the workload's processes' CPU time per operation "
        f"(getrusage: the probes and the writes into the buffer in the traced task's "
        f"context, no consumer). Both are adjusted for host contention: under TCG the guest "
        f"cannot tell when the host keeps its vCPU thread waiting for a CPU (its clock runs "
        f"on), so the host samples the thread's schedstat around each run and both are "
        f"scaled by 1 - the share of the run it waited (**vCPU waited**; the raw figures are "
        f"in the results file, and the ratio table gives the raw CPU ratio too). "
        f"Added = traced minus untraced of the same repetition; "
        f"median over the repetitions (min – max). **Consumer**: the consumer's CPU time as a "
        f"share of the run (ivtrace: `ivtrace record` on the host; the others: their guest "
        f"processes). **Events/op**: what the tracer recorded per operation, counted on the "
        f"host in its trace, the consumer's own traced system calls included (a consumer in "
        f"the guest is traced too). **B/event**: bytes per event in the buffer (ivtrace, "
        f"ftrace: the events' own bytes with their headers) or in the files (LTTng: packets; "
        f"perf: perf.data; perf trace: its text).\n")


def workload_table(w: str, rows: dict, p: dict, out: list) -> None:
    label, op, unit, div = WORKLOADS[w]
    nd = 0 if unit == "ns" else 1
    out.append(f"**{label}**, per {op} ({unit}):\n")
    extra = " | added per event, CPU (ns)" if w == "getppid" else ""
    out.append(f"| configuration | wall | added, wall | added, CPU{extra} | consumer | "
               f"events/op | lost | B/event | vCPU waited |")
    out.append("|---|---:|---:|---:|" + ("---:|" if extra else "") + "---:|---:|---:|---:|---:|")
    for c in p["configs"]:
        x = rows.get(c)
        if not x:
            continue
        cons = (f"{med(x['consumer_pct'], 1, 1)} % ({CONSUMER[c]})" if c in CONSUMER else "–")
        per_ev = f" | {rng(x.get('added_cpu_per_event'))}" if extra else ""
        out.append(f"| {LABELS[c]} | {rng(x['wall'], div, nd)} | {med(x.get('added_wall'), div, nd)}"
                   f" | {rng(x.get('added_cpu'), div, nd)}{per_ev} | {cons} | "
                   f"{med(x['events_per_op'], 1, 2) if c != 'off' else '–'} | {x['lost']:,} | "
                   f"{med(x.get('bytes_per_event'), 1, 1)} | {med(x.get('vcpu_wait_pct'), 1, 0)} % |")
    out.append("")


def ratio_table(s: dict, out: list) -> None:
    out.append("### ivtrace's added cost as a ratio to each other tracer\n")
    out.append("ivtrace.ko's added cost per operation divided by the other tracer's, paired "
               "per repetition: median (min – max). **CPU**: in the traced task (the probes "
               "and the writes); **wall**: everything the guest spent, its consumer included. "
               "Below 1: ivtrace costs the guest less.\n")
    out.append("| workload | ivtrace.ko | against | CPU | wall | CPU, not adjusted |")
    out.append("|---|---|---|---:|---:|---:|")
    for w, by in s["ratios"].items():
        for ivt, others in by.items():
            for o, v in others.items():
                out.append(f"| {w} | {SHORT[ivt]} | {SHORT[o]} | {ratio_cell(v.get('cpu'))} | "
                           f"{ratio_cell(v.get('wall'))} | {ratio_cell(v.get('cpu_raw'), False)} |")
    out.append("")


def reading(s: dict, out: list) -> None:
    """What the tables say, every number from them."""
    row = s["table"].get("getppid", {})
    per = {c: (row.get(c) or {}).get("added_cpu_per_event") for c in
           ("ivt-flight", "lttng-snapshot", "ft-ring", "perf-record")}
    if not all(per.values()):
        return
    order = sorted(per, key=lambda c: per[c]["median"])
    seed_order = ["perf-record", "ivt-flight", "ft-ring", "lttng-snapshot"]
    t = ("Read: per event in the traced task, " + ", ".join(
        f"{SHORT[c]} {per[c]['median']:.0f} ns" for c in order) + " (getppid loop, median). "
         + ("The seed's order was perf, hypertracing, ftrace, LTTng; here it is "
            + ", ".join(SHORT[c] for c in order) + ". " if order != seed_order else
            "The order is the seed's. "))
    cons = [(c, row[c]["consumer_pct"]["median"]) for c in
            ("lttng-discard", "ft-pipe", "perf-record", "perf-trace")
            if row.get(c) and row[c].get("consumer_pct")]
    st = row.get("ivt-stream")
    if cons and st:
        t += ("Streaming to a file, the consumers in the guest took " + ", ".join(
            f"{v:.0f} % ({SHORT[c]})" for c, v in cons) + " of the vCPU during the getppid "
            f"runs, which is why their wall cost exceeds their CPU cost; ivtrace's consumer "
            f"ran on the host ({st['consumer_pct']['median']:.0f} % of a host CPU) and its "
            f"added wall time per call stayed at {st['added_wall']['median']:.0f} ns. ")
    rates = s.get("rates") or {}
    if rates:
        t += "Paced, with a small buffer: " + "; ".join(
            rate_words(SHORT[c], x) for c, x in rates.items()) + ".\n"
    out.append(t if t.endswith("\n") else t + "\n")


def rate_words(name: str, x: dict) -> str:
    ok, drop = x.get("sustained_events_per_s"), x.get("first_drop_events_per_s")
    if not drop:
        return f"{name} lost nothing up to {ok:,} events/s, the fastest the guest ran under it"
    return (f"{name} lost events from {drop:,} events/s on"
            + (f" (though none at {ok:,}/s)" if ok and ok > drop else ""))


def ratio_cell(v, bold: bool = True) -> str:
    if not v:
        return "–"
    m = f"**{v['median']:.2f}**" if bold else f"{v['median']:.2f}"
    return f"{m} ({v['min']:.2f} – {v['max']:.2f})"


def agreement_table(s: dict, p: dict, runs: list, out: list) -> None:
    ops = p["ops"]
    out.append("### The tracers' event counts agree\n")
    out.append(
        f"Every trace of every run was counted on the host (babeltrace2's bindings for LTTng's "
        f"and ivtrace's CTF, `perf script` for perf.data, perf trace's text, and ftrace's raw "
        f"pages read with the layout tracefs describes). The events each workload itself makes "
        f"are known: {ops['getppid']:,} getppid entries and exits by the workload's own "
        f"process; {ops['forkexec'] + 1:,} execs "
        f"of gb-work (the children and the workload itself); at least "
        f"{2 * ops['pingpong']:,} context switches for {ops['pingpong']:,} round trips (more "
        f"when anything else runs). Per configuration: the counts over the repetitions "
        f"(min – max), the events the tracer reported lost, and whether every repetition is "
        f"within them. Every tracer traces the whole guest, so a getppid call counts as the "
        f"workload's only when the task that made it is the one that exec'd gb-work (perf's "
        f"sample tid, ftrace's common_pid, and in the CTF traces the CPU's current task "
        f"followed through sched_switch and sched_process_exec); calls by any other task are "
        f"shown apart (getppid_by_others), not charged to the workload.\n")
    out.append("| workload | configuration | counted | lost | agrees |")
    out.append("|---|---|---|---:|---|")
    for w, rows in s["agreement"].items():
        for c, reps in rows.items():
            keys = [k for k in reps[0] if k not in ("rep", "lost", "off_by", "agrees")]
            cells = "; ".join(f"{k} {span([x[k] for x in reps])}" for k in keys)
            ok = all(x["agrees"] for x in reps)
            out.append(f"| {w} | {c} | {cells} | {sum(x['lost'] for x in reps):,} | "
                       f"{'yes' if ok else '**no**'} |")
    out.append("")
    disagreements(s, runs, out)


def disagreements(s: dict, runs: list, out: list) -> None:
    """Where the counts did not agree, said as such, with the perf records printed twice."""
    bad = [x for x in s.get("incomplete", []) if "off what the workload makes" in x]
    dup: dict = {}
    included = False  # counted by a counter that took the copies for events
    for d in runs:
        n = (d.get("counts") or {}).get("duplicate_records")
        if n:
            dup.setdefault(d["config"], []).append(f"{d['workload']} rep {d['rep']}: {n:,}")
            included |= not d["counts"].get("duplicates_counted_once")
    if not bad and not dup:
        return
    if bad:
        out.append("**Where the counts did not agree.** " + " ".join(f"{x}." for x in bad)
                   + (PERF_TRACE_SILENT if any("under perf-trace" in x for x in bad) else ""))
    if dup:
        out.append(
            ("\n" if bad else "") + "perf record wrote records twice into its perf.data (the same task, CPU, "
            "nanosecond time, event and fields, which no two real events share): "
            + "; ".join(f"{c}: {', '.join(v)}" for c, v in dup.items()) + ". " + PERF_COPIES
            + (" The counts above include those copies: this run was counted before the "
               "counter took each record once (bench/harness/tracecount.py)." if included else
               " Each was counted once."))
    out.append("")


# Why perf's counts can be off with nothing reported lost: two races in the guest's perf
# (6.1) between its reads of the ring's head, which a loaded host widens (the vCPU runs in
# bursts; its timer interrupts, and what they wake, land between perf's reads). Found in
# the guest's own perf.data (the copies at two file offsets) and in perf's sources.
PERF_COPIES = (
    "They are perf's, not the kernel's: perf record reads the ring's head once, then again "
    "to decide how much to write, and takes the first value as where its next write starts, "
    "so records the kernel added between the two reads are written again (a contiguous "
    "block, the same bytes at two places in the file). In a trial on this machine they came "
    "only with the host loaded (4 of 6 traces; none of 4 on a quiet host).")
PERF_TRACE_SILENT = (
    " perf trace reports losses only in `LOST n events` lines (the kernel's count of "
    "records that did not fit). It can also lose records without any: after reading what "
    "the ring held it sets its read position to the ring's head as read again at that "
    "moment, so what the kernel wrote in between (an interrupt, or a whole time slice of "
    "another task when perf trace is preempted there) is skipped without a trace. Its "
    "short counts with nothing reported lost are most likely those.")


def span(v: list) -> str:
    lo, hi = min(v), max(v)
    return f"{lo:,}" if lo == hi else f"{lo:,} – {hi:,}"


def rates_table(s: dict, p: dict, out: list) -> None:
    if not s.get("rates"):
        return
    out.append("### Events per second before it drops\n")
    out.append(
        f"getppid() paced at a fixed rate for {p['rate_secs']:g} s under each tracer that "
        f"streams to a file, with a per-CPU buffer of {p['rate_buf_kb']} KiB (so the buffer "
        f"cannot hide a consumer that falls behind): events/s offered (two per call, as "
        f"achieved), events the tracer reported lost, and its consumer's CPU share. "
        f"Flight recorders overwrite instead of dropping, so they have no such limit.\n")
    rates = sorted({pt["target_calls_per_s"] for x in s["rates"].values() for pt in x["points"]})
    out.append("| configuration | " + " | ".join(f"target {2 * r:,}/s" for r in rates)
               + " | sustained without loss |")
    out.append("|---|" + "---:|" * len(rates) + "---:|")
    for c, x in s["rates"].items():
        by = {pt["target_calls_per_s"]: pt for pt in x["points"]}
        cells = []
        for r in rates:
            pt = by.get(r)
            cells.append("–" if not pt else
                         f"{pt['events_per_s']:,}, lost {pt['lost_pct']:.1f} %, consumer "
                         f"{pt['consumer_pct']:.0f} %")
        sus = x["sustained_events_per_s"]
        out.append(f"| {LABELS[c]} | " + " | ".join(cells) + " | "
                   + (f"{sus:,}/s" if sus else "none measured") + " |")
    out.append("")


def proof(s: dict, out: list) -> None:
    pr = s.get("lttng_proof")
    if not pr:
        return
    out.append("### LTTng really ran: its trace opens in babeltrace2\n")
    out.append(f"The trace of LTTng's first getppid run in discard mode is kept by the run "
               f"(git-ignored, build/) and read with `{pr['command']}` (exit {pr['rc']}); its "
               f"first events:\n")
    out.append("```")
    out.extend(pr["first_lines"])
    out.append("```\n")


def tcg(rec: dict, g: dict, s: dict, out: list) -> None:
    cal = g.get("calibration") or {}
    gc, hc = cal.get("guest") or {}, cal.get("host_native") or {}
    out.append("### What TCG does to the absolute numbers, and why the ratios hold\n")
    if rec["accelerator"]["name"] != "tcg":
        out.append(f"This run used {rec['accelerator']['name']}: the guest's instructions "
                   f"ran on the CPU, as in the seed.\n")
    else:
        out.append(
            "Under TCG QEMU translates every guest instruction and sends every guest memory "
            "access through its software TLB; a system call, an interrupt, a context switch "
            "are emulated end to end. The seed ran under KVM, where the guest's own code runs "
            "natively. So every absolute figure here is several times the seed's, for every "
            "tracer alike. The same static program measures the primitives an event is made "
            "of, in this guest and natively on the host CPU its vCPU thread uses (`ev-helper "
            "tcgcost`, ns per operation, best of 3 rounds, net of the empty loop):\n")
        out.append("| operation | guest (TCG) | native | ratio |")
        out.append("|---|---:|---:|---:|")
        for k, label in (("rdtsc", "rdtsc (the timestamp)"),
                         ("store8", "8-byte store into a cached buffer"),
                         ("load8", "8-byte load"), ("clock_gettime", "clock_gettime, vDSO"),
                         ("getppid", "getppid(2), a system call")):
            gv, hv = gc.get(k), hc.get(k)
            if gv is not None and hv is not None:
                out.append(f"| {label} | {gv:.2f} | {hv:.2f} | "
                           f"{f'{gv / hv:.0f}x' if hv > 0.5 else '–'} |")
        out.append("")
        native_table(g, s, rec["machine"]["kernel"], out)
        out.append(
            "An event of any of these tracers is the same few things: the tracepoint's call "
            "into the probe, a timestamp, a reservation in a per-CPU buffer (a few loads, a "
            "compare, a store of the new position), the payload's stores and a commit. The "
            "timestamp costs about what it costs natively; the loads, stores and branches "
            "around it cost what TCG makes them cost, the same for every tracer in this boot: "
            "same kernel, same tracepoints, same emulator, same host CPU. What differs between "
            "the tracers is how many of these operations one event takes (LTTng's syscall "
            "probe decodes each system call's arguments; ftrace's and perf's events carry all "
            "six raw arguments; ivtrace's fixed-size records carry the id and the six "
            "arguments and its sched_switch is 16 bytes), and that count is what TCG scales "
            "alike. The ratios therefore compare the tracers' code paths; their absolute "
            "values are not KVM's. Two things TCG does not scale alike, and the table keeps "
            "apart: a consumer in the guest shares the vCPU with the workload (wall against "
            "CPU), and ivtrace's consumer runs on the host, where it costs the guest nothing "
            "(the consumer column).\n")


def native_table(g: dict, s: dict, kernel: str, out: list) -> None:
    """ftrace and perf also run on this host's own kernel: the same workload binary natively
    gives each its own TCG factor."""
    nat = (g.get("calibration") or {}).get("tracers_native") or {}
    row = s["table"].get("getppid", {})
    if "ft-ring" not in nat:
        return
    out.append(
        f"Two of the tracers also run on this host's own kernel (Linux {kernel}, not the "
        f"guest's), so their per-event cost can be measured natively "
        f"with the same binary (`{nat['command']}`; ftrace in a tracefs instance of its own, "
        f"perf record of the task; {len(nat['runs']['off'])} alternating rounds, medians): "
        f"ns per event in the traced task.\n")
    out.append("| tracer | native (this host) | guest (TCG) | TCG factor |")
    out.append("|---|---:|---:|---:|")
    for c in ("ft-ring", "perf-record"):
        n = nat[c]["added_cpu_per_event"]
        x = (row.get(c) or {}).get("added_cpu_per_event")
        if x:
            out.append(f"| {SHORT[c]} | {n:.0f} | {x['median']:.0f} | "
                       f"{x['median'] / n:.1f}x |")
    out.append("")


def commands(g: dict, out: list) -> None:
    out.append("### Exact commands\n")
    out.append(f"Guest: `{g['guest_command']}` (`{g['guest_script']}`, busybox sh, in the "
               f"guest started by `bench/run guest`); workloads: "
               + "; ".join(f"{k}: `{v}`" for k, v in g.get("workload_commands", {}).items())
               + ".\n")
    for c, cmds in g.get("commands", {}).items():
        out.append(f"- **{c}**: " + "; ".join(f"`{x}`" for x in cmds)
                   + (f"; host: `{g['host_commands']['recorder']}`"
                      if c == "ivt-stream" and g.get("host_commands", {}).get("recorder")
                      else ""))
    out.append("")
    out.append(f"QEMU: `{' '.join(g['qemu_command'])}`\n")
