"""The clocksync preset's section of docs/performance.md: the clock exchange's guest and host
CPU, with against without it."""


def pct(v, nd=3):
    return "-" if v is None else f"{v:.{nd}f} %"


def section(out: list, rec: dict, src: str) -> None:
    """The Clock exchange section from one clocksync results file (`src`, repo-relative)."""
    d, m = rec["data"], rec["machine"]
    p, s = d["params"], d["summary"]
    out.append("## Clock exchange: its guest and host CPU\n")
    out.append(f"From `{src}` (run of {rec['date']}). Reproduce: `{rec['command']}`, as root. "
               f"Host: {m['cpu'].get('model_name')}, {m['cpus']} CPUs, kernel {m['kernel']}; "
               f"{m['versions'].get('qemu')}; ivtrace {str(rec['git']['commit'])[:12]}; guest "
               f"under {rec['accelerator']['name']}, {rec['guest']['cpus']} vCPUs. `ivtrace "
               f"record` on ivshmem-plain records a guest idling {p['seconds']} s with ivtrace.ko "
               f"loaded, with the periodic exchange (`--sync-interval 2`) and without it "
               f"(`--sync-interval 3600`: the early bursts only, at 0, 0.5 and 1 s, and the "
               f"retry of one the guest did not enter), alternated, "
               f"{p['repeats']} rounds (docs/kvm.md, \"The clock exchange\"); load average "
               f"{p['load_before'][0]:.1f} before the first run.\n")
    out.append("The serve setting is `ivtrace serve` with doorbells: the writer is kicked into "
               "the exchange on MSI-X vector 0. Host busy loops: how many processes spun on the "
               "host's CPUs during the run (a loaded host). Bound: the recording's (the clock's "
               "error_ns, over the whole recording); in force: the bound at each sync point's "
               "time, min/median/p99/max over the points. Slow bursts kept no round trip under "
               "1 us and were retried 50, 100, 200, 400 ms later.\n")
    out.append("| setting | busy loops | s | bursts (slow / retried) | round trips | host spinning "
               "(% of a core) | recorder CPU (% of a core) | guest in the exchange (% of a "
               "vCPU) | bound (ns) | in force min/median/p99/max (ns), points |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for x in d["runs"]:
        out.append(f"| {x['setting']} | {x.get('hogs', 0)} | {x['seconds']:.1f} | {x['bursts']} "
                   f"({slow(x)}) | {x['exchanges']} | {pct(x['host_spin_pct_of_core'])} | "
                   f"{pct(x['recorder_cpu_pct_of_core'])} | {pct(x['guest_pct_of_vcpu'])} | "
                   f"{x['bound_ns']} | {in_force(x)} |")
    out.append("")
    g, h = s["guest_pct_of_vcpu"], s["host_spin_pct_of_core"]
    rc = s["recorder_cpu_pct_of_core"]
    worst = s.get("worst_bound_ns", {})
    out.append(f"Added by the periodic exchange (means over the runs with "
               f"{s.get('hogs_of_means', 0)} busy loops, sync minus no-sync): guest "
               f"{pct(g['added'])} of a vCPU (goal <= 0.1 %), host spinning {pct(h['added'])} "
               f"of a core (goal <= 1 %), the recorder's whole CPU time {pct(rc['added'])} of a "
               f"core. Under serve (its own exchange, no no-sync twin): guest "
               f"{pct(g.get('serve'))}, host spinning {pct(h.get('serve'))}. Largest bound of "
               f"any run: {worst.get('sync')} ns for `record` (make demo's path), "
               f"{worst.get('serve')} ns for serve (goal <= 500 ns). The guest's share is the "
               f"module's own count of its time in the exchange (resp_spun); the host's spinning "
               f"is the recorder's count, and its CPU time (wait4) includes the drain and the "
               f"polls, which both settings share. Without the periodic bursts the recording's "
               f"bound is what the early points extrapolate to over the whole run: the periodic "
               f"exchange is what keeps it under half a microsecond.\n")


def slow(x: dict) -> str:
    if x.get("slow_bursts") is None:
        return "-"
    return f"{x['slow_bursts']} / {x['retries']}"


def in_force(x: dict) -> str:
    b = x.get("bound_in_force") or {}
    if b.get("points") is None:
        return "-"
    return f"{b['min_ns']}/{b['median_ns']}/{b['p99_ns']}/{b['max_ns']}, {b['points']}"
