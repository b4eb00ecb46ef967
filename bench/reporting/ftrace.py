"""The ftrace preset's section of docs/performance.md: getting ftrace's events out of a
guest, by the ftrace relay against ftrace to a guest file and over virtio-serial."""

from .common import f1, git_line, ratio

LABELS = {
    "off": "no tracing",
    "ft-ring": "ftrace into its ring, nobody reads",
    "ft-file": "ftrace, trace_pipe_raw to a guest file",
    "ft-vserial": "ftrace, trace_pipe_raw over virtio-serial (virtio-trace path)",
    "ft-relay": "ftrace, the ivtrace relay into the region",
    "ft-relay-read": "ftrace, the relay with read(2) (no mapping)",
}
LOADS = {
    "block": "block I/O: ftrace's block events, 4 KiB direct reads of a virtio-blk disk",
    "function": "function tracing: the function tracer on every kernel function, getppid()",
}


def section(out: list, rec: dict, src: str) -> None:
    d = rec["data"]
    p, acc, guest, m = d["params"], rec["accelerator"], rec["guest"], rec["machine"]
    out.append("## The ftrace relay against the usual ways out of a guest\n")
    out.append(f"From `{src}` (run of {rec['date']}, {rec['duration_s']:.0f} s, one boot). "
               f"Reproduce: `{rec['command']}`, as root. Guest command: "
               f"`{d['guest_command']}`.\n")
    cond = d["conditions"]
    out.append("| | |\n|---|---|")
    out.append(f"| accelerator | **{acc['name']}**: {acc['reason']} |")
    out.append(f"| host | {m['cpu'].get('model_name', '?')}, {m['cpus']} CPUs, kernel "
               f"{m['kernel']}; {m['versions'].get('qemu')} |")
    out.append(f"| guest | Debian kernel {guest['kernel']}, {guest['cpus']} vCPU, {guest['mem']} |")
    out.append(f"| load | loadavg {cond['before']['loadavg']} before, "
               f"{cond['after']['loadavg']} after |")
    out.append(f"| ivtrace | {git_line(rec['git'])} |")
    out.append("")
    load_note(out, cond)
    out.append(
        f"Method (bench/harness/ftrace.py, bench/guest/ftbench.sh): one guest, every "
        f"configuration in it; per repetition ({p['reps']}) and load the untraced run, then "
        f"the load's events or the function tracer on and the traced configurations in a "
        f"rotated order. Per run ftrace's buffer ({p['buf_kb']} KiB per CPU, overwrite) is "
        f"emptied, the reader started, tracing turned on for the workload and off after it, "
        f"then the reader moves what ftrace still holds and stops. ftrace's own per-CPU "
        f"counters give the events produced and read (what the reader took out of the "
        f"ring); the rest ftrace overwrote. \"carried\" is read events per second of "
        f"workload; \"ns/event\" the run's time beyond the untraced run (and beyond ftrace "
        f"recording alone, the reader's share) per event produced. Medians over "
        f"repetitions. ft-vserial: one virtio-serial port per vCPU, the host writes the "
        f"bytes to disk; ft-relay: `ivtrace record` drains the region to disk.\n")
    for load, rows in d["summary"].items():
        table(out, load, rows)
    in_short(out, d["summary"])
    h = d.get("host", {})
    out.append(f"What reached the host: the relay's runs read {h.get('relay_read_in_guest')} "
               f"events out of ftrace and the recording holds {h.get('relay_recorded')} of "
               f"them decoded; the virtio-serial runs brought {h.get('vserial_bytes')} bytes.\n")


def load_note(out: list, cond: dict) -> None:
    """Say so when other jobs shared the machine: the configurations ran in one guest in a
    rotated order, so they compare with each other; their absolute times do not travel."""
    before = float(cond["before"]["loadavg"].split()[0])
    others = sorted({t.split()[-1] for t in cond["before"].get("top", [])
                  if float(t.split()[1]) >= 10 and t.split()[-1] != "python3"})
    if before < 0.5 and not others:
        return
    out.append(f"**Not a quiet machine**: the 1-minute load average was {before} when the run "
               f"started (busy: {', '.join(others) or 'see the results file'}). The "
               f"configurations ran in one guest, interleaved, so they compare with each "
               f"other; their absolute times hold for this run only.\n")


def in_short(out: list, summary: dict) -> None:
    """The relay against the two copies, side by side, per load."""
    lines = []
    for load, rows in summary.items():
        relay = rows.get("ft-relay")
        if not relay:
            continue
        for other in ("ft-file", "ft-vserial"):
            o = rows.get(other)
            if not o:
                continue
            t = ratio(relay["seconds"], o["seconds"])
            c = ratio(relay["carried_per_s"], o["carried_per_s"])
            lines.append(f"- {load}: the relay against {LABELS[other].split(', ', 1)[1]}: "
                         f"workload time x{f1(t, 2)}, events carried per second "
                         f"x{f1(c, 2)}, lost {f1(relay['lost_pct'])} % against "
                         f"{f1(o['lost_pct'])} %")
    lines += mapping_lines(summary)
    if lines:
        out.append("In short (medians of this run):\n")
        out.extend(lines)
        out.append("")
    out.append("With the function tracer on, each transport's own kernel work is traced "
               "too, so the configurations produce different numbers of events for the same "
               "workload: the workload's time and what was carried say more than the cost "
               "per event. ftrace overwrote what a transport did not read in time (lost %); "
               "ft-ring reads nothing by design.\n")


def mapping_lines(summary: dict) -> list[str]:
    """The relay from ftrace's mapped ring buffer (ft-relay, 6.10+) against the same relay
    with read(2) (ft-relay-read), per load."""
    lines = []
    for load, rows in summary.items():
        m, r = rows.get("ft-relay"), rows.get("ft-relay-read")
        if not (m and r):
            continue
        lines.append(f"- {load}: the relay from the mapped ring buffer against read(2): "
                     f"workload time x{f1(ratio(m['seconds'], r['seconds']), 2)}, ns/event "
                     f"beyond ftrace recording {f1(m.get('ns_per_event_vs_ft-ring'), 0)} "
                     f"against {f1(r.get('ns_per_event_vs_ft-ring'), 0)}, events carried per "
                     f"second x{f1(ratio(m['carried_per_s'], r['carried_per_s']), 2)}, lost "
                     f"{f1(m['lost_pct'])} % against {f1(r['lost_pct'])} %")
    return lines


def table(out: list, load: str, rows: dict) -> None:
    out.append(f"### {LOADS.get(load, load)}\n")
    out.append("| configuration | workload s | events produced | read | lost % | carried (events/s) "
               "| ns/event vs off | ns/event vs ring | slowdown % |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, x in rows.items():
        out.append(f"| {LABELS.get(c, c)} | {f1(x['seconds'], 2)} | {f1(x['produced'], 0)} | "
                   f"{f1(x['read'], 0)} | {f1(None if c == 'ft-ring' else x['lost_pct'])} | "
                   f"{f1(x['carried_per_s'], 0)} | "
                   f"{f1(x.get('ns_per_event_vs_off'), 0)} | "
                   f"{f1(x.get('ns_per_event_vs_ft-ring'), 0)} | {f1(x.get('slowdown_pct'))} |")
    out.append("")


def not_measured(out: list) -> None:
    out.append("## The ftrace relay against the usual ways out of a guest\n")
    out.append("Not measured yet: `bench/run ftrace` (as root), then `bench/report`.\n")
