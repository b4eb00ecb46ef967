"""The doorbell preset's section of docs/performance.md: doorbell rate and round trip,
the eventfd floor, doorbells per MB of trace."""


def med(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def rng(v, fmt="{:.1f}"):
    v = sorted(v)
    if not v:
        return "-"
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(v[0])}-{fmt.format(v[-1])}"


def section(out: list, rec: dict, src: str) -> None:
    """The Doorbells section from one doorbell-preset results file (`src`, repo-relative)."""
    d, m = rec["data"], rec["machine"]
    out.append("## Doorbells: guest -> host notification\n")
    out.append(f"From `{src}` (run of {rec['date']}). Reproduce: `{rec['command']}`, as root. "
               f"Host: {m['cpu'].get('model_name')}, {m['cpus']} CPUs, kernel {m['kernel']}; "
               f"{m['versions'].get('qemu')}; ivtrace {str(rec['git']['commit'])[:12]}. In the "
               f"spirit of seed 004 (KVM iosignalfd: doorbell rate and round trip), on the "
               f"accelerator this machine gives QEMU.\n")
    db = d["ivshmem_doorbell"]
    out.append(f"Accelerator: **{db['accel']}** ({db['accel_reason']}).\n")
    out.append("| path | rate (doorbells/s) | round trip p50 (us) | p99 (us) | min (us) |")
    out.append("|---|---|---|---|---|")
    e = d["eventfd_threads"]["runs"]
    out.append(f"| eventfd, two host threads, blocking (`efd_baseline`) | "
               f"{rng([r['rate']['writes_per_s'] / 1e6 for r in e], '{:.2f}')} M writes/s "
               f"({rng([r['rate']['writes_per_wakeup'] for r in e])} per wake-up) | "
               f"{rng([r['rtt']['us']['p50'] for r in e])} | {rng([r['rtt']['us']['p99'] for r in e])} | "
               f"{rng([r['rtt']['us']['min'] for r in e])} |")
    rings = db["ring"]
    for mode in ("host blocks", "host busy-reads"):
        rt = [r for r in db["rtt"] if r["mode"] == mode]
        rate = (f"{rng([r['per_s'] / 1e3 for r in rings], '{:.0f}')} k (every one counted: "
                f"{all(r['counted_by_host'] == r['doorbells'] for r in rings)})"
                if mode == "host blocks" else "")
        out.append(f"| ivshmem-doorbell, guest user space -> host ({db['accel']}), {mode} | {rate} | "
                   f"{rng([r['us']['p50'] for r in rt])} | {rng([r['us']['p99'] for r in rt])} | "
                   f"{rng([r['us']['min'] for r in rt])} |")
    k = d["kvm_ioeventfd"]
    out.append(f"| ioeventfd under KVM | {'-' if not k['measurable'] else ''} | "
               f"{k['reason'] if not k['measurable'] else ''} | | |")
    out.append("")
    out.append("Rate: `dbguest ring N` writes the doorbell register (BAR0 + 12) N times back to "
               "back from guest user space (BAR0 mapped through sysfs, no driver); the host's "
               "eventfd counter must add up to N. Round trip: the guest stores a sequence number "
               "in the shared memory, rings, and spins until the host, woken on its eventfd, "
               "copies it back (`dbserver`, a minimal ivshmem server in C). Under TCG the "
               "doorbell write is emulated in the vCPU thread, which writes the eventfd itself "
               "(no VM exit to speak of), so the rate is bounded by QEMU's MMIO dispatch and "
               "write(2), and a blocking host's wake-up dominates the round trip, as in the "
               "eventfd baseline.\n")
    t = d["trace_rates"]
    out.append(f"**Doorbells per MB of trace** (`ivtrace serve`, guest ivtrace.ko with "
               f"{t['subbuf_size'] // 1024} KiB packets and flush_ms {t['flush_ms']}; the "
               f"guest's kernel events plus ivtrace_test.ko events paced every 100 ms; counters "
               f"from `ivtrace ctl list` at each phase boundary):\n")
    out.append("| phase | events/s | MB/s | packets | doorbells | doorbells/s | doorbells per MB "
               "| doorbells per packet | lost |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in t["phases"]:
        dpm = "-" if r["doorbells_per_mb"] is None else f"{r['doorbells_per_mb']:.1f}"
        dpp = "-" if r["doorbells_per_packet"] is None else f"{r['doorbells_per_packet']:.2f}"
        out.append(f"| {r['phase']} | {r['events_per_s']:,.0f} | {r['mb_per_s']:.2f} | "
                   f"{r['packets']} | {r['doorbells']} | {r['doorbells_per_s']:.1f} | {dpm} | "
                   f"{dpp} | {r['lost']} |")
    n = t["notification"]
    out.append("")
    out.append(f"Whole run: {n['doorbells_received']} doorbells for {n['completed_packets']} "
               f"completed packets. Zero doorbells per event: the guest rings only when it "
               f"completes a packet while the host sleeps, so doorbells per MB can never exceed "
               f"packets per MB (1 MB / packet size, {1e6 / t['subbuf_size']:.1f} here); an idle "
               f"guest rings at the pace of its flush timer (a few per second), and a host that "
               f"keeps up drains each packet and sleeps again before the next one, so at these "
               f"rates nearly every packet rings. A host that cannot keep up never sleeps and "
               f"gets no doorbell at all. Clock mapping of that run: {t['clock']['method']}, "
               f"error <= {t['clock']['error_ns'] / 1000:.1f} us.\n")
