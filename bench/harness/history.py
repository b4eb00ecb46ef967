"""bench/results/history.json: a small committed index of every full run, kept or not
(date, preset, commit, the results file, headline numbers). bench/results/ keeps only the
runs the documentation cites; the others stay in git history, and this index says what they
measured. `bench/run` appends a line after each full run written to bench/results/."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from . import stats
from .results import RESULTS, rel

INDEX = RESULTS / "history.json"
SCHEMA = "ivtrace-bench-history/1"


def r(v, nd=2):
    """Rounded for the index: nd decimals, or an int for nd=0."""
    if v is None:
        return None
    return int(round(v)) if nd == 0 else round(v, nd)


def native_headline(data: dict) -> dict:
    bm = stats.bench_map(data.get("native", {}))
    iv = stats.row_numbers(bm["ivtrace"]) if "ivtrace" in bm else None
    lt = stats.row_numbers(bm["lttng_ust"]) if "lttng_ust" in bm else None
    profs = data.get("drain", {}).get("profiles", [])
    small = next((p["median"]["events_per_s"] for p in profs if p["name"] == "small"), None)
    large = {stats.payload_of(p): r(p["median"]["trace_MB_per_s"] / 1000)
             for p in profs if p["size"] == 1024}
    return {
        "ivtrace_p50_group_ns": r(iv and iv["g50"], 1),
        "lttng_ust_p50_group_ns": r(lt and lt["g50"], 1),
        "lttng_ust_over_ivtrace": r(lt["g50"] / iv["g50"], 1) if iv and lt else None,
        "ivtrace_batch_ns": r(iv and iv["batch"], 1),
        "drain_small_M_events_per_s": r(small and small / 1e6, 1),
        "drain_1024B_GB_per_s": large,
    }


def guest_headline(data: dict) -> dict:
    table = data.get("summary", {}).get("table")
    if table is not None:  # the four-tracer preset: ns per event in the traced task, getppid
        row = table.get("getppid", {})
        out = {}
        for name, c in (("ivtrace", "ivt-flight"), ("lttng", "lttng-snapshot"),
                        ("ftrace", "ft-ring"), ("perf", "perf-record")):
            x = (row.get(c) or {}).get("added_cpu_per_event")
            out[f"{name}_ns_per_event"] = r(x and x["median"], 0)
        return out
    row = data.get("summary", {}).get("syscall", {})
    out = {}
    for t in ("ivtrace", "ftrace"):
        x = row.get(t) or {}
        if x.get("added_ns") and x.get("events_per_op"):
            out[f"{t}_ns_per_event"] = r(x["added_ns"] / x["events_per_op"], 0)
    vs = (row.get("ivtrace") or {}).get("vs_ftrace") or {}
    out["syscall_added_ivtrace_over_ftrace"] = r(vs.get("added_ratio"))
    return out


def evaluation_headline(data: dict) -> dict:
    iw = stats.summarize(data)["workloads"].get("int", {}).get("configs", {})
    return {"int_overhead_pct": {c: r(x["overhead_pct"]) for c, x in iw.items()
                                 if "overhead_pct" in x}}


def doorbell_headline(data: dict) -> dict:
    db = data.get("ivshmem_doorbell", {})

    def p50(mode):
        v = [x["us"]["p50"] for x in db.get("rtt", []) if x["mode"] == mode]
        return r(statistics.median(v), 1) if v else None

    rates = [x["per_s"] for x in db.get("ring", [])]
    return {"ring_k_per_s": r(statistics.median(rates) / 1e3, 0) if rates else None,
            "rtt_p50_us_host_blocks": p50("host blocks"),
            "rtt_p50_us_host_busy_reads": p50("host busy-reads")}


def clocksync_headline(data: dict) -> dict:
    s = data.get("summary", {})
    return {k: r(s.get(k, {}).get("added"), 3)
            for k in ("guest_pct_of_vcpu", "host_spin_pct_of_core", "recorder_cpu_pct_of_core")}


def ftrace_headline(data: dict) -> dict:
    fn = data.get("summary", {}).get("function", {})
    return {"function_carried_k_per_s": {c: r(x["carried_per_s"] / 1e3, 1)
                                         for c, x in fn.items() if c.startswith("ft-")
                                         and c != "ft-ring" and x.get("carried_per_s")}}


def boot_headline(data: dict) -> dict:
    lv = data.get("summary", {}).get("levels", {})
    kernel = lv.get("kernel", {})
    prof = data.get("summary", {}).get("profile", [])
    return {"kernel_overhead_pct": {s: r(x.get("overhead_pct"), 1) for s, x in kernel.items()
                                    if s != "off"},
            "profile_ratio": [r(p.get("ratio_vs_graph_bytes"), 1) for p in prof]}


def relay_headline(data: dict) -> dict:
    high = [x for x in data.get("runs", []) if x["load"] == "high"]
    return {f"{x['guests']}_{x['sink']}_cpu_s_per_gb": r(x["cpu_s_per_gb"] or 0, 1)
            for x in high}


def soak_headline(data: dict) -> dict:
    s, acc = data.get("summary", {}), data.get("accounting", {})
    return {"minutes": r(data["params"]["duration_s"] / 60, 0),
            "rss_mib_first_last_max": [r(s.get("rss_kib", {}).get(k, 0) / 1024, 1)
                                       for k in ("first", "last", "max")],
            "fds_first_last_max": [s.get("fds", {}).get(k) for k in ("first", "last", "max")],
            "recordings": acc.get("recordings"), "disk_full_stops": acc.get("disk_full"),
            "mismatches": len(acc.get("mismatches", []))}


HEADLINES = {"native": native_headline, "guest": guest_headline,
             "evaluation": evaluation_headline, "doorbell": doorbell_headline,
             "clocksync": clocksync_headline,
             "relay": relay_headline, "soak": soak_headline, "ftrace": ftrace_headline,
             "boot": boot_headline}


def entry(rec: dict, path: Path) -> dict:
    return {"date": rec["date"], "preset": rec["preset"], "file": rel(path),
            "commit": (rec["git"].get("commit") or "")[:12],
            "accelerator": rec["accelerator"]["name"],
            "headline": HEADLINES[rec["preset"]](rec["data"])}


def load() -> list[dict]:
    if not INDEX.is_file():
        return []
    d = json.loads(INDEX.read_text())
    if d.get("schema") != SCHEMA:
        raise ValueError(f"{INDEX}: schema {d.get('schema')!r}, expected {SCHEMA!r}")
    return d["runs"]


def save(runs: list[dict]) -> None:
    runs = sorted(runs, key=lambda e: (e["date"], e["preset"]))
    INDEX.write_text(json.dumps({"schema": SCHEMA, "runs": runs}, indent=1) + "\n")


def append(rec: dict, path: Path) -> None:
    runs = [e for e in load() if e["file"] != rel(path)]
    save(runs + [entry(rec, path)])
