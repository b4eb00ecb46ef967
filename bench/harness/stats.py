"""Statistics shared by the harness (which checks and prints a run) and the report writer
(which puts it into docs/performance.md): computed from a run's measurements, so the page
and the console say the same thing.

Evaluation (bench/README.md, "Method"): per (configuration, workload) the geometric mean of
the repetitions' scores; overhead = (1 - GM(config) / GM(bare)) x 100 with the bare score of
the same run; spread = min..max of the per-repetition overheads, each paired with the bare
score of its own repetition, and the standard deviation of the log scores (sd_log, ~ a
relative spread); se = 100 x sqrt(sd_c^2/n_c + sd_bare^2/n_bare), the standard error of
the overhead (in points, small-overhead approximation).
"""

from __future__ import annotations

import math
import statistics

TARGET_INT_PCT = 1.0


def fnum(v, nd=None):
    """A number for a table: thousands separators, 0-2 decimals by magnitude, '–' for None."""
    if v is None:
        return "–"
    if nd is None:
        nd = 0 if abs(v) >= 1000 else (1 if abs(v) >= 10 else 2)
    return f"{v:,.{nd}f}"


def gmean(v):
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v and min(v) > 0 else None


def sd_log(v):
    return statistics.stdev([math.log(x) for x in v]) if len(v) >= 2 and min(v) > 0 else None


def _host_contention(x: dict, reps: dict, hs: list) -> None:
    """Add the host's share of the runs to x: how long the vCPU thread waited for its host CPU
    (runnable, but other jobs on this machine ran), QEMU's I/O and the host helpers' CPU, and
    the scores adjusted for the wait."""
    # adj = the score per second the vCPU was not kept waiting: score / (1 - wait).
    x["vcpu_wait_pct"] = statistics.mean(h["vcpu_wait_pct"] for h in hs)
    x["vcpu_wait_max_pct"] = max(h["vcpu_wait_pct"] for h in hs)
    x["qemu_io_cpu_pct"] = statistics.mean(h["qemu_io_cpu_pct"] for h in hs)
    x["host_helper_cpu_pct"] = statistics.mean(
        h["helper_cpu_pct"] + h["sink_cpu_pct"] for h in hs)
    adj = [reps[r]["score"] / max(0.05, 1.0 - h["vcpu_wait_pct"] / 100.0)
           for r, h in zip(sorted(reps), hs)]
    x["adj_scores"] = adj
    x["adj_geomean"] = gmean(adj)
    x["adj_sd_log"] = sd_log(adj)


def _overhead(x: dict, reps: dict, bare: dict, bare_scores: list) -> None:
    """Add a configuration's overhead against bare to x: from the geometric means, per
    repetition (each against the bare score of its own repetition) and its standard error."""
    g, s = x["geomean"], x["sd_log"]
    x["overhead_pct"] = 100.0 * (1.0 - g / gmean(bare_scores))
    paired = [100.0 * (1.0 - reps[r]["score"] / bare[r]["score"])
              for r in sorted(reps) if r in bare]
    x["overhead_per_rep_pct"] = paired
    x["overhead_min_pct"] = min(paired) if paired else None
    x["overhead_max_pct"] = max(paired) if paired else None
    sb = sd_log(bare_scores)
    if s is not None and sb is not None:
        x["overhead_se_pct"] = 100.0 * math.sqrt(s * s / len(x["scores"]) +
                                                 sb * sb / len(bare_scores))


def _config_stats(c: str, reps: dict, bare: dict) -> dict:
    """One configuration of one workload: its scores' statistics, events per second, losses,
    host contention (when the runs measured it) and, unless it is bare, its overhead."""
    bare_scores = [bare[r]["score"] for r in sorted(bare)]
    gb = gmean(bare_scores)
    sc = [reps[r]["score"] for r in sorted(reps)]
    g, s = gmean(sc), sd_log(sc)
    x = {"n": len(sc), "scores": sc, "geomean": g, "min": min(sc), "max": max(sc),
         "sd_log": s}
    ev = [reps[r]["events"] / reps[r]["elapsed_s"] for r in sorted(reps)]
    lost = sum(reps[r]["lost"] for r in reps)
    tot = sum(reps[r]["events"] for r in reps)
    hs = [reps[r].get("host") for r in sorted(reps)]
    if all(hs):
        _host_contention(x, reps, hs)
    x["best"] = max(sc)
    x["events_per_s"] = statistics.median(ev)
    x["lost_pct"] = 100.0 * lost / tot if tot > 0 else 0.0
    if c != "bare" and gb and g:
        _overhead(x, reps, bare, bare_scores)
    return x


def _against_bare(cfgs: dict, rows: dict) -> None:
    """Add to each configuration the overheads that need bare's own summary: best against
    best, and the scores adjusted for host contention against bare's adjusted scores."""
    b = cfgs.get("bare", {})
    for c, x in cfgs.items():
        if c != "bare" and b.get("best"):
            # interference only ever slows a run down: best against best
            x["best_overhead_pct"] = 100.0 * (1.0 - x["best"] / b["best"])
    for c, x in cfgs.items():
        if c == "bare" or not x.get("adj_geomean") or not b.get("adj_geomean"):
            continue
        x["adj_overhead_pct"] = 100.0 * (1.0 - x["adj_geomean"] / b["adj_geomean"])
        bmap = dict(zip(sorted(rows["bare"]), b["adj_scores"]))
        paired = [100.0 * (1.0 - v / bmap[r])
                  for r, v in zip(sorted(rows[c]), x["adj_scores"]) if r in bmap]
        x["adj_overhead_min_pct"] = min(paired) if paired else None
        x["adj_overhead_max_pct"] = max(paired) if paired else None
        if x.get("adj_sd_log") is not None and b.get("adj_sd_log") is not None:
            x["adj_overhead_se_pct"] = 100.0 * math.sqrt(
                x["adj_sd_log"] ** 2 / x["n"] + b["adj_sd_log"] ** 2 / b["n"])


def _transport(res: dict) -> dict:
    """Per configuration, what each repetition's transport carried (bytes, events, losses)."""
    out = {}
    for t in res.get("transport", []):
        d = out.setdefault(t["config"], {"transport": t["transport"], "reps": []})
        d["reps"].append({k: t.get(k) for k in ("rep", "bytes", "trace_bytes", "events", "lost",
                                                  "lines", "seconds", "rc", "how")
                          if t.get(k) is not None})
    return out


def _acceptance(workloads: dict) -> dict:
    """The int workload's overheads of the configurations the target is about, and whether
    ivt-stream meets it."""
    iw = workloads.get("int", {}).get("configs", {})
    acc = {"target_pct": TARGET_INT_PCT}
    for c in ("ivt-stream", "ivt-flight", "ivt-idle", "ft-net"):
        if c in iw and "overhead_pct" in iw[c]:
            acc[c] = {k: iw[c].get(k) for k in (
                "overhead_pct", "overhead_min_pct", "overhead_max_pct", "overhead_se_pct",
                "adj_overhead_pct", "adj_overhead_min_pct", "adj_overhead_max_pct",
                "adj_overhead_se_pct", "best_overhead_pct", "vcpu_wait_pct",
                "events_per_s")}
    if "ivt-stream" in acc:
        acc["ivt_stream_met"] = acc["ivt-stream"]["overhead_pct"] <= TARGET_INT_PCT
    return acc


def summarize(res: dict) -> dict:
    """An evaluation run's summary: per workload and configuration the statistics of the
    module docstring, the transports' counts and the acceptance target."""
    p = res["params"]
    by = {}
    units = {}
    for m in res["measurements"]:
        by.setdefault(m["workload"], {}).setdefault(m["config"], {})[m["rep"]] = m
        units[m["workload"]] = m["unit"]
    out = {"workloads": {}}
    for w in p["workloads"]:
        rows = by.get(w, {})
        bare = rows.get("bare", {})
        cfgs = {c: _config_stats(c, rows[c], bare) for c in p["configs"] if rows.get(c)}
        _against_bare(cfgs, rows)
        out["workloads"][w] = {"unit": units.get(w), "configs": cfgs}
    out["transport"] = _transport(res)
    out["acceptance"] = _acceptance(out["workloads"])
    return out


# ---- native per-event figures

def bench_map(native):
    return {b["name"]: b for b in native.get("benches", [])}


def row_numbers(b):
    g, s, bt = b["group"]["net_ns"], b["single"]["net_ns"], b["batch"]
    return {
        "g50": g["p50"], "gmean": g["mean"], "p50": s["p50"], "p99": s["p99"],
        "p999": s["p99.9"], "mean": s["mean"], "tmean": s.get("mean_under_10us"),
        "batch": bt.get("ns_per_event_net_median", bt.get("ns_per_event_net_mean")),
        "over": b["single"].get("over_10us"), "n": b["single"]["n"],
    }


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def payload_of(p):
    """A drain profile's payload kind (older results did not record it)."""
    if p.get("payload"):
        return p["payload"]
    run = p["runs"][0]
    if run.get("loadgen", {}).get("payload"):
        return run["loadgen"]["payload"]
    # Binary data carries a u32 length, text data a NUL: 3 bytes more per event.
    per_event = run["trace_bytes"] / max(1, run["produced"])
    return "binary" if per_event >= 18 + p["size"] else "text"
