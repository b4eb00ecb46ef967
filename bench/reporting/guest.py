"""The guest preset's section of docs/performance.md: ivtrace.ko against ftrace on the
same tracepoints, in one guest."""

from .common import f1, git_line

GUEST_LABELS = {
    "off": "no tracing",
    "ivtrace": "ivtrace.ko (sched, irq, timer, syscall)",
    "ftrace": "ftrace, same tracepoints",
    "ivtrace-kmem": "ivtrace.ko + kmem",
    "ftrace-kmem": "ftrace + kmem",
}
GUEST_WORKLOADS = {
    "syscall": "getppid() loop (`ivtwl syscalls`)",
    "forkexec": "fork + exec of a static no-op + wait (`ivtwl forkexec`)",
    "cpu": "integer loop, no system call (`ivtwl cpu`)",
}


def section(rec: dict, src: str, out: list) -> None:
    """The "In the guest" section from one guest-preset results file (`src`, repo-relative)."""
    g = rec["data"]
    m, p, summ = rec["machine"], g["params"], g["summary"]
    out.append("## In the guest: ivtrace.ko against ftrace on the same tracepoints\n")
    out.append(f"From `{src}` (run of {rec['date']}, {rec['duration_s']:.0f} s, one boot). "
               f"Reproduce: `{rec['command']}`, as root. Guest command: "
               f"`{g['guest_command']}`.\n")
    acc, guest, cond = rec["accelerator"], rec["guest"], g["conditions"]
    out.append("| | |\n|---|---|")
    out.append(f"| accelerator | **{acc['name']}**: {acc['reason']} |")
    out.append(f"| host | {m['cpu'].get('model_name', '?')}, {m['cpus']} CPUs, kernel "
               f"{m['kernel']}; {m['versions'].get('qemu')} |")
    out.append(f"| guest | Debian kernel {guest['kernel']}, {guest['cpus']} vCPU, "
               f"{guest['mem']} |")
    out.append(f"| load | loadavg {' '.join(cond['loadavg_before'])} before, "
               f"{' '.join(cond['loadavg_after'])} after |")
    out.append(f"| ivtrace | {git_line(rec['git'])} |")
    out.append("")
    method(p, out)
    tables(summ, p, out)
    reading(summ, acc["name"], out)


def method(p, out):
    out.append(
        f"Method: one guest runs every configuration; per repetition ({p['reps']}) the "
        f"configurations run in a rotated order, and within one each workload runs "
        f"{p['inner']} times. On a machine shared with other jobs interference only adds "
        f"time, so the fastest run is the estimate (\"best\": of all runs; per repetition: "
        f"of its runs, whose median and range show the spread). **Both tracers only record**: a per-CPU ring of "
        f"{p['buf_kb']} KiB in overwrite (flight-recorder) mode, nobody reading, nothing "
        f"dropped; so the figures are the cost of the probes and of the write into the ring, "
        f"not of a consumer (ivtrace's consumer is on the host; ftrace's would be a guest "
        f"process). ftrace: the top tracefs instance, the same tracepoints enabled one by one "
        f"(sched_switch, sched_wakeup, sched_wakeup_new, sched_process_fork/exec/exit/free, "
        f"task_rename, irq_handler_entry/exit, softirq_entry/exit, hrtimer_expire_entry/exit, "
        f"raw_syscalls sys_enter/sys_exit; + kmalloc, kfree, mm_page_alloc, mm_page_free), "
        f"its default clock. ivtrace: `insmod ivtrace.ko events=... mode=overwrite`. "
        f"Times are the guest's CLOCK_MONOTONIC per operation; \"added\" is the traced time "
        f"minus the untraced time (bests; and paired per repetition, median); the last column "
        f"divides ivtrace's added cost by ftrace's (from the bests; from the medians of the "
        f"pairs; and per repetition). Events per operation: "
        f"ftrace's entries + overrun; ivtrace's events in closed packets (counted per packet, "
        f"so within one packet, ~4000 events, per measurement).\n")


def tables(summ, p, out):
    for w, label in GUEST_WORKLOADS.items():
        row = summ.get(w)
        if not row:
            continue
        n = {"syscall": p["syscalls"], "forkexec": p["forks"], "cpu": p["cpu_iters"]}[w]
        unit, div = ("µs", 1000.0) if w == "forkexec" else ("ns", 1.0)
        nd = 2 if w == "cpu" else 1
        out.append(f"**{label}**, {n:,} operations per run, {p['reps']} x {p['inner']} runs "
                   f"per configuration\n")
        out.append(f"| configuration | best {unit}/op | median of repetitions (min-max) | "
                   f"added {unit}/op (best; median of pairs) | overhead | events/op | "
                   f"added cost, ivtrace / ftrace (best; medians; per repetition) |")
        out.append("|---|---:|---:|---:|---:|---:|---|")
        for c in p["configs"]:
            x = row.get(c)
            if not x:
                continue
            vs = next((v for k, v in x.items() if k.startswith("vs_")), None)
            vs_s = "–"
            if vs and w == "cpu":
                vs_s = "both within noise"
            elif vs and vs.get("added_ratio") is not None:
                rr = vs["added_ratio_per_rep"]
                med_s = (f"{vs['added_ratio_of_medians']:.2f}x"
                         if vs["added_ratio_of_medians"] is not None else "–")
                vs_s = (f"**{vs['added_ratio']:.2f}x**; {med_s}; "
                        f"{min(rr):.2f} to {max(rr):.2f}" if rr else f"**{vs['added_ratio']:.2f}x**")
            if "added_ns" in x:
                added_s = f"{f1(x['added_ns'] / div, nd)}; {f1(x['added_median_ns'] / div, nd)}"
                ovh = f"{x['overhead_pct']:.1f} %"
            else:
                added_s = ovh = "–"
            out.append(f"| {GUEST_LABELS.get(c, c)} | {f1(x['best_ns'] / div, nd)} | "
                       f"{f1(x['median_ns'] / div, nd)} ({f1(x['min_ns'] / div, nd)}-"
                       f"{f1(x['max_ns'] / div, nd)}) | {added_s} | {ovh} | "
                       f"{x['events_per_op']:.2f} | {vs_s} |")
        out.append("")


def reading(summ, accel, out):
    lines = []
    for w in ("syscall", "forkexec"):
        row = summ.get(w, {})
        for a, b in (("ivtrace", "ftrace"), ("ivtrace-kmem", "ftrace-kmem")):
            vs = row.get(a, {}).get("vs_" + b)
            if vs and vs.get("added_ratio") is not None:
                r = vs["added_ratio"]
                lines.append(f"{w}, {GUEST_LABELS[a]}: +{row[a]['added_ns']:,.0f} ns/op against "
                             f"ftrace's +{row[b]['added_ns']:,.0f} ns/op "
                             f"({r:.2f}x, i.e. {'cheaper' if r < 1 else 'NOT cheaper'}), "
                             f"{row[a]['events_per_op']:.2f} vs {row[b]['events_per_op']:.2f} "
                             f"events/op")
    noisy = []
    for w in ("syscall", "forkexec"):
        row = summ.get(w, {})
        straddle = [a for a, b in (("ivtrace", "ftrace"), ("ivtrace-kmem", "ftrace-kmem"))
                    if row.get(a, {}).get("vs_" + b, {}).get("added_ratio_per_rep")
                    and max(row[a]["vs_" + b]["added_ratio_per_rep"]) >= 1.0]
        if straddle and "off" in row:
            o = row["off"]
            noisy.append(f"{w}: the per-repetition ratios of {', '.join(straddle)} reach 1 or "
                         f"more, because the untraced time itself moved by "
                         f"{100.0 * (o['max_ns'] - o['min_ns']) / o['min_ns']:.0f} % between "
                         f"repetitions (other jobs on this machine), as much as the effect; "
                         f"the bests are the estimate there")
    if lines:
        out.append("Read: " + "; ".join(lines) + ". "
                   + ("Caveat: " + "; ".join(noisy) + ". " if noisy else "")
                   + "The integer loop makes no system call: "
                   "only timer ticks are traced there, so every configuration costs the same "
                   "within noise (a check that the set-up itself adds nothing). "
                   + ("Under TCG every guest memory access is emulated, so absolute numbers are "
                      "far from KVM's; the ratio compares the two tracers' code paths on equal "
                      "terms (same kernel, same tracepoints, same emulator)."
                      if accel == "tcg" else "") + "\n")
