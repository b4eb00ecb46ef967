"""The soak preset's section of docs/performance.md: serve's memory, descriptors and CPU over
a long run with guests coming and going, a never-idle writer and a disk that fills, and what
every recording accounted for."""

from __future__ import annotations

from pathlib import Path

from . import plots
from .common import git_line


def buckets(samples: list[dict], n: int = 10) -> list[dict]:
    """`n` equal slices of the run: at each slice's end RSS, descriptors, threads; CPU % and
    the fullest the disk got within the slice."""
    if len(samples) < n:
        return []
    out, step = [], len(samples) / n
    for i in range(n):
        a, b = samples[int(i * step)], samples[min(int((i + 1) * step), len(samples) - 1)]
        part = samples[int(i * step):int((i + 1) * step) + 1]
        dt = max(b["t"] - a["t"], 1e-9)
        out.append({"t_min": b["t"] / 60, "rss_mib": b["rss_kib"] / 1024, "fds": b["fds"],
                    "fds_max": max(s["fds"] for s in part), "threads": b["threads"],
                    "cpu_pct": 100 * (b["cpu_s"] - a["cpu_s"]) / dt,
                    "disk_pct": max(s["disk_used_pct"] for s in part)})
    return out


def section(out: list, rec: dict, src: str, png: str | None) -> None:
    d, m = rec["data"], rec["machine"]
    p, s, acc, c = d["params"], d["summary"], d["accounting"], d["counts"]
    cond = d["conditions"].get("soak", {})
    load = cond.get("before", {}).get("loadavg", "?").split()[:3]
    busy = ", ".join(f"{v:.0f} %" for v in cond.get("cpu_busy_percent", {}).values())
    out.append("## Soak: serve over time\n")
    out.append(f"From `{src}` (run of {rec['date']}, {p['duration_s'] / 60:.0f} minutes). "
               f"Reproduce: `{rec['command']}`, as root. Host: {m['cpu'].get('model_name')}, "
               f"{m['cpus']} CPUs, kernel {m['kernel']}; ivtrace {git_line(rec['git'])}. "
               f"Load average when it started: {' '.join(load)}; the CPUs were busy {busy} over "
               f"the run, serve included (other jobs on the machine count here: the soak "
               f"checks flatness, not speed).\n")
    out.append(f"`ivtrace serve --size {p['region_size']}` with its output on a "
               f"{p['disk_mb']} MiB tmpfs. Meanwhile: one guest whose writer never lets serve "
               f"idle ({p['steady_rate']:,} events/s requested, region never closed) until the "
               f"disk fills under it, then a new one ({c['steady_rounds']} such guests); every "
               f"{p['churn_s']:g} s a guest that connects, writes {p['burst']:,} events, closes "
               f"its region and leaves ({c['churned']}); every 3 s a client that connects and "
               f"leaves before any region exists ({c['idle_clients']}); a cleaner that deletes "
               f"gone guests' traces only when the disk is 95 % full ({c['cleaned']} "
               f"deleted). Clients are the tests' ivshmem clients and writers libivtrace "
               f"(ivtrace-loadgen), not QEMU (bench/harness/soak.py says why).\n")
    out.append("| minute | RSS (MiB) | descriptors (max in slice) | threads | serve CPU % | "
               "disk used, max % |")
    out.append("|---|---|---|---|---|---|")
    for b in buckets(d["samples"]):
        out.append(f"| {b['t_min']:.1f} | {b['rss_mib']:.1f} | {b['fds']} ({b['fds_max']}) | "
                   f"{b['threads']} | {b['cpu_pct']:.1f} | {b['disk_pct']:.0f} |")
    out.append("")
    if png:
        out.append(f"![serve RSS and descriptors over the soak](../{png})\n")
    out.append(f"RSS: {s['rss_kib']['first'] / 1024:.1f} MiB at the start, "
               f"{s['rss_kib']['max'] / 1024:.1f} MiB at most, {s['rss_kib']['last'] / 1024:.1f} "
               f"MiB at the end; over the second half it grew "
               f"{s['rss_growth_second_half_kib'] / 1024:.1f} MiB at most "
               f"({s['rss_slope_second_half_kib_per_min']:+.0f} KiB/min end to end). "
               f"Descriptors: {d['fds_at_start']} before the first guest, at most "
               f"{s['fds']['max']}, {d['fds_after_guests_left']} once the last guest left. "
               f"serve used {s['cpu_pct_mean']:.1f} % of a CPU on average; SIGINT at the end: "
               f"exit {d['serve_exit']}.\n")
    unexplained = acc["disk_full_without_reason"]
    out.append(f"Recordings: {acc['recordings']} traces finalized, {acc['events_recorded']:,} "
               f"events recorded, {acc['events_lost']:,} counted lost. {acc['checked']} guests "
               f"that wrote, closed and left were checked event by event: written = recorded + "
               f"lost for {acc['checked'] - len(acc['mismatches'])} of them. "
               f"{acc['disk_full']} recordings were stopped by the full disk, each with "
               f"`state: incomplete` and the reason in its sidecar"
               f"{' except ' + str(len(unexplained)) if unexplained else ''}"
               f".\n")


def plot(rec: dict, png: Path) -> Path | None:
    plt = plots.pyplot()
    if plt is None:
        return None
    smp = rec["data"]["samples"]
    t = [x["t"] / 60 for x in smp]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.plot(t, [x["rss_kib"] / 1024 for x in smp], color="tab:blue", lw=1)
    ax.set_xlabel("minutes")
    ax.set_ylabel("serve RSS (MiB)", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(t, [x["fds"] for x in smp], color="tab:orange", lw=0.8)
    ax2.set_ylabel("descriptors", color="tab:orange")
    ax2.set_ylim(bottom=0)
    ax.set_title("ivtrace serve under churn, a never-idle writer and a full disk")
    fig.tight_layout()
    return plots.save(fig, plt, png, 110)
