"""The ftrace preset's section of docs/performance.md: getting ftrace's events out of a
guest, by the ftrace relay against ftrace to a guest file and over virtio-serial."""

from .common import f1, git_line

LABELS = {
    "off": "no tracing",
    "ft-ring": "ftrace into its ring, nobody reads",
    "ft-file": "ftrace, trace_pipe_raw to a guest file",
    "ft-vserial": "ftrace, trace_pipe_raw over virtio-serial (virtio-trace path)",
    "ft-relay": "ftrace, the ivtrace relay into the region",
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
    h = d.get("host", {})
    out.append(f"What reached the host: the relay's runs read {h.get('relay_read_in_guest')} "
               f"events out of ftrace and the recording holds {h.get('relay_recorded')} of "
               f"them decoded; the virtio-serial runs brought {h.get('vserial_bytes')} bytes.\n")


def table(out: list, load: str, rows: dict) -> None:
    out.append(f"### {LOADS.get(load, load)}\n")
    out.append("| configuration | workload s | events produced | read | lost % | carried (events/s) "
               "| ns/event vs off | ns/event vs ring | slowdown % |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, x in rows.items():
        out.append(f"| {LABELS.get(c, c)} | {f1(x['seconds'], 2)} | {f1(x['produced'], 0)} | "
                   f"{f1(x['read'], 0)} | {f1(x['lost_pct'])} | {f1(x['carried_per_s'], 0)} | "
                   f"{f1(x.get('ns_per_event_vs_off'), 0)} | "
                   f"{f1(x.get('ns_per_event_vs_ft-ring'), 0)} | {f1(x.get('slowdown_pct'))} |")
    out.append("")


def not_measured(out: list) -> None:
    out.append("## The ftrace relay against the usual ways out of a guest\n")
    out.append("Not measured yet: `bench/run ftrace` (as root), then `bench/report`.\n")
