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
    out.append("| setting | s | bursts | round trips | host spinning (% of a core) | recorder CPU "
               "(% of a core) | guest in the exchange (% of a vCPU) | bound (ns) |")
    out.append("|---|---|---|---|---|---|---|---|")
    for x in d["runs"]:
        out.append(f"| {x['setting']} | {x['seconds']:.1f} | {x['bursts']} | {x['exchanges']} | "
                   f"{pct(x['host_spin_pct_of_core'])} | {pct(x['recorder_cpu_pct_of_core'])} | "
                   f"{pct(x['guest_pct_of_vcpu'])} | {x['bound_ns']} |")
    out.append("")
    g, h = s["guest_pct_of_vcpu"], s["host_spin_pct_of_core"]
    rc = s["recorder_cpu_pct_of_core"]
    out.append(f"Added by the periodic exchange (means, sync minus no-sync): guest "
               f"{pct(g['added'])} of a vCPU (goal <= 0.1 %), host spinning {pct(h['added'])} "
               f"of a core (goal <= 1 %), the recorder's whole CPU time {pct(rc['added'])} of a "
               f"core. The guest's share is the module's own count of its time in the exchange "
               f"(resp_spun); the host's spinning is the recorder's count, and its CPU time "
               f"(wait4) includes the drain and the polls, which both settings share. Without "
               f"the periodic bursts the recording's bound is what the early points extrapolate "
               f"to over the whole run (the bound column): the periodic exchange is what keeps "
               f"it under a microsecond.\n")
