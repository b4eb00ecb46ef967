"""The relay preset's section of docs/performance.md: many guests through one `ivtrace serve`,
to disk and to lttng-relayd."""


def kib(v):
    return "-" if v is None else f"{v / 1024:.1f}"


def section(out: list, rec: dict, src: str) -> None:
    d, m = rec["data"], rec["machine"]
    q = d.get("quiet", {})
    out.append("## Many guests, one daemon, to disk and to lttng-relayd\n")
    quiet = ("quiet" if q.get("quiet") else "NOT quiet: other jobs ran on this machine, so "
             "CPU figures are upper bounds of the cost and a loss may be the machine's")
    out.append(f"From `{src}` (run of {rec['date']}). Reproduce: `{rec['command']}`, as root. "
               f"Host: {m['cpu'].get('model_name')}, {m['cpus']} CPUs, kernel {m['kernel']}; "
               f"lttng-tools {m['versions'].get('lttng-tools')}; ivtrace "
               f"{str(rec['git']['commit'])[:12]}. Load average when it started: "
               f"{q.get('loadavg_at_start')} ({quiet}).\n")
    out.append("Each guest is simulated: `ivtrace-loadgen --ivshmem-socket` does QEMU's "
               "handshake with `ivtrace serve`, formats the region it receives with libivtrace "
               "and writes from 2 threads (2 channels, 8 x 64 KiB packets each, "
               f"{d.get('event_size', 32)}-byte payloads). \"disk\": serve writes the traces "
               "to tmpfs; \"relay\": the same, and streams every packet to a local "
               "lttng-relayd (its output on tmpfs too). Each run offers one aggregate rate "
               "(low, high) split over the guests, so CPU per GB compares as guests are added. "
               "The simulated guests ring no doorbell (libivtrace's writer has none), so serve "
               "polls each of them with its backoff (50 us to 20 ms): that per-guest fixed "
               "cost shows at the low rate. Rates are recorded events (bytes) over the "
               "writers' run time; CPU is the serve process's (all threads, its whole life, "
               "from wait4); memory per guest is the peak resident size above an idle serve's, "
               "divided by the guests.\n")
    out.append("| load | guests | sink | offered ev/s | recorded M ev/s | MB/s | serve CPU s | "
               "CPU s per GB | relayd CPU s | memory per guest (MiB) | relay queue peak (MiB) "
               "| lost (writers + serve) | lost on the way to the relay |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in d["runs"]:
        off = "-" if not r["offered_per_s"] else f"{r['offered_per_s']:,}"
        cpg = "-" if r["cpu_s_per_gb"] is None else f"{r['cpu_s_per_gb']:.2f}"
        rcpu = "-" if r.get("relayd_cpu_s") is None else f"{r['relayd_cpu_s']:.2f}"
        out.append(f"| {r['load']} | {r['guests']} | {r['sink']} | {off} | "
                   f"{r['events_per_s'] / 1e6:.2f} | {r['mb_per_s']:.1f} | "
                   f"{r['serve_cpu_s']:.2f} | {cpg} | {rcpu} | "
                   f"{r['rss_per_guest_kb'] / 1024:.2f} | "
                   f"{r['relay_queue_high_water'] / 2**20:.1f} | {r['lost_local']:,} | "
                   f"{r['lost_relay']:,} |")
    out.append("")
    high = {(r["guests"], r["sink"]): r for r in d["runs"] if r["load"] == "high"}
    if (1, "disk") in high and (64, "disk") in high:
        a1, a64 = high[(1, "disk")], high[(64, "disk")]
        r64 = high.get((64, "relay"), a64)
        out.append(f"At the high rate the daemon's CPU per GB goes from {a1['cpu_s_per_gb']:.1f} s "
                   f"(1 guest) to {a64['cpu_s_per_gb']:.1f} s (64 guests) to disk, and "
                   f"{r64['cpu_s_per_gb']:.1f} s with the relay as well: the growth is the "
                   "polling of 64 guests that ring no doorbell (at the low rate that fixed cost "
                   "is most of it). 64 guests at "
                   f"{(a64['offered_per_s'] or 0) / 1e6:.2f} M events/s in all "
                   f"({a64['mb_per_s']:.0f} MB/s): {a64['lost_local'] + r64['lost_local']} "
                   f"events lost by the writers, {r64['lost_relay']} on the way to the relay; "
                   f"memory per guest {r64['rss_per_guest_kb'] / 1024:.2f} MiB "
                   "(drain state, stream buffers, relay queue in use; the region mapping is "
                   "the guest's memory). tests/relay checks zero loss at 192 k events/s with "
                   "64 guests and a QEMU guest streaming to a relay.\n")
