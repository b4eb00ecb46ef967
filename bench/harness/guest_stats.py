"""The guest preset's statistics, computed once from a run's measurements and stored in its
results (`summary`), so the console, the results and docs/performance.md say the same.

Per run (one configuration, one workload, one repetition): wall ns per operation (what the
guest's one vCPU spent, the tracer's consumer included when it is a guest process), CPU ns
per operation of the workload's own processes (the probes and the writes into the buffer,
done in the traced task's context; no consumer), the consumer's CPU ns per operation
(ivtrace: `ivtrace record` on the host; the others: their guest processes), and the events
the tracer recorded, counted on the host. Added cost = traced - untraced of the SAME
repetition (the configurations of one repetition run back to back), per operation and
per event; spread: median and min..max over the repetitions.

Contention: this machine is shared, and under TCG the guest cannot tell when the host keeps
its vCPU thread waiting for a CPU: its clock runs on and the waiting counts in its wall and
CPU times. The host samples the vCPU thread's schedstat around every run; `wall`, `cpu` and
the guest consumer's time are scaled by (1 - the share of the run the vCPU waited), the
raw values are kept as `wall_raw` and `cpu_raw`.
"""

from __future__ import annotations

import statistics

# ivtrace's two modes and the configurations of the other tracers they compare with:
# flight recorders with flight recorders, streaming to a file with streaming to a file.
TRACERS = {"ivt": "ivtrace.ko", "lttng": "LTTng (lttng-modules)", "ft": "ftrace",
           "perf": "perf"}
PAIRS = {"ivt-flight": ["lttng-snapshot", "ft-ring", "perf-record"],
         "ivt-stream": ["lttng-discard", "ft-pipe", "perf-record", "perf-trace"]}
STREAMING = {"ivt-stream", "lttng-discard", "ft-pipe", "perf-record", "perf-trace"}


def tracer_of(config: str) -> str:
    return TRACERS[config.split("-")[0]]


def spread(v: list[float]) -> dict | None:
    v = [x for x in v if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def per_run(d: dict) -> dict:
    """One run's figures per operation. `own_events`: the events the workload itself makes
    per operation, where the trace says exactly (getppid: its entries and exits)."""
    ops = d["ops"]
    c = d.get("counts") or {}
    by = c.get("by_name", {})
    consumer = d["consumer_ns"]
    if d["config"] == "ivt-stream":
        consumer = (d.get("host") or {}).get("recorder_ns", 0)
    ev = c.get("events", 0)
    lost = c.get("lost", 0) or 0
    own = None
    if d["workload"] == "getppid" and by.get("getppid_entry"):
        own = (by["getppid_entry"] + by.get("getppid_exit", 0)) / ops
    wait = (d.get("host") or {}).get("vcpu_wait_pct")
    ran = 1.0 - min(0.95, (wait or 0.0) / 100.0)
    if d["config"] != "ivt-stream":
        consumer *= ran  # a guest process: its clock ran on while the vCPU waited too
    wall = d["wall_ns"] * ran
    return {"wall": wall / ops, "cpu": d["cpu_ns"] * ran / ops,
            "wall_raw": d["wall_ns"] / ops, "cpu_raw": d["cpu_ns"] / ops,
            "consumer": consumer / ops, "consumer_pct": 100.0 * consumer / wall,
            "events": ev, "lost": lost, "events_per_op": (ev + lost) / ops,
            "own_events": own, "bytes_per_event": c.get("bytes_per_event"),
            "vcpu_wait_pct": wait}


def added(row: dict, x: dict, o: dict, reps: list) -> None:
    """Traced - untraced of the same repetition: wall (all the guest spent, the consumer
    included when it is a guest process) and cpu (the traced task's own); per operation,
    and per event of the workload where that number is exact."""
    paired = [r for r in reps if r in o]
    for k in ("wall", "cpu", "wall_raw", "cpu_raw"):
        per_rep = {r: x[r][k] - o[r][k] for r in paired}
        row[f"added_{k}"] = spread(list(per_rep.values()))
        row[f"added_{k}_per_rep"] = per_rep
        row[f"added_{k}_best"] = min(x[r][k] for r in reps) - min(o[r][k] for r in o)
        row[f"added_{k}_per_event"] = spread([per_rep[r] / x[r]["own_events"] for r in paired
                                              if x[r]["own_events"]])


def config_row(runs: dict, off: dict) -> dict:
    """One configuration under one workload: every repetition paired with off's."""
    reps = sorted(runs)
    x = {r: per_run(runs[r]) for r in reps}
    row = {k: spread([x[r][k] for r in reps]) for k in
           ("wall", "cpu", "wall_raw", "cpu_raw", "consumer", "consumer_pct",
            "events_per_op", "own_events", "bytes_per_event", "vcpu_wait_pct")}
    row["lost"] = sum(x[r]["lost"] for r in reps)
    row["events"] = sum(x[r]["events"] for r in reps)
    if off:
        added(row, x, {r: per_run(off[r]) for r in off}, reps)
    row["per_rep"] = x
    return row


def ratios(table: dict) -> dict:
    """ivtrace's added cost per operation / each other tracer's, paired per repetition:
    `cpu` in the traced task (probes and buffer writes), `wall` all the guest spent (both
    contention-adjusted), `cpu_raw` as measured."""
    out = {}
    for w, rows in table.items():
        for ivt, others in PAIRS.items():
            a = rows.get(ivt)
            for other in others:
                b = rows.get(other)
                if not a or not b or "added_wall_per_rep" not in a:
                    continue
                for k in ("wall", "cpu", "cpu_raw"):
                    pa, pb = a[f"added_{k}_per_rep"], b[f"added_{k}_per_rep"]
                    v = [pa[r] / pb[r] for r in pa if r in pb and pb[r] > 0]
                    out.setdefault(w, {}).setdefault(ivt, {}).setdefault(other, {})[k] = \
                        spread(v)
    return out


# --------------------------------------------------------------------------- counts agree

def signature(w: str, counts: dict) -> dict:
    """The events the workload itself makes, counted in one trace: getppid N entries and N
    exits by the workload's process (tracecount.Workload: every tracer traces the whole guest);
    fork+exec N + 1 execs of gb-work (the children and the workload itself); ping-pong
    at least 2 switches per round trip (more when anything else runs). Wake-ups are shown,
    not checked: a writer preempted right after its write finds its peer awake."""
    b = counts.get("by_name", {})
    if w == "getppid":  # the workload's own calls; other tasks' are shown beside, apart
        return {"getppid_entry": b.get("getppid_entry", 0),
                "getppid_exit": b.get("getppid_exit", 0),
                "getppid_by_others": b.get("getppid_other_entry", 0)}
    if w == "forkexec":
        return {"exec_gb_work": b.get("exec_gb_work", 0),
                "sched_process_fork": b.get("sched_process_fork", 0)}
    return {"sched_switch": b.get("sched_switch", 0), "sched_wakeup": b.get("sched_wakeup", 0)}


def distance(w: str, x: dict, n: int) -> int:
    """How many events the signature is off what the workload makes (0: exact or, for the
    ping-pong's lower bound, at or above it)."""
    if w == "getppid":
        return max(abs(x["getppid_entry"] - n), abs(x["getppid_exit"] - n))
    if w == "forkexec":
        return abs(x["exec_gb_work"] - (n + 1))
    return max(0, 2 * n - x["sched_switch"])


def agreement(runs: list[dict]) -> tuple[dict, list[str]]:
    """Per workload and configuration, every repetition's signature counts and whether they
    are what the workload makes, within the events that tracer reported lost."""
    table: dict = {}
    bad: list[str] = []
    for d in runs:
        if d["config"] == "off" or "counts" not in d:
            continue
        x = {"rep": d["rep"], **signature(d["workload"], d["counts"]),
             "lost": d["counts"].get("lost", 0) or 0}
        x["off_by"] = distance(d["workload"], x, d["ops"])
        x["agrees"] = x["off_by"] <= x["lost"]
        table.setdefault(d["workload"], {}).setdefault(d["config"], []).append(x)
        if not x["agrees"]:
            bad.append(f"{d['workload']} under {d['config']} (rep {d['rep']}): {x} is "
                       f"{x['off_by']} events off what the workload makes ({d['ops']} "
                       f"operations), beyond the {x['lost']} the tracer reported lost")
    return table, bad


# --------------------------------------------------------------------------- rates

def rate_table(rates: list[dict]) -> dict:
    """Per streaming configuration: offered and achieved event rates, drops, and the highest
    rate it kept up with (no event lost) and the lowest where it dropped."""
    out: dict = {}
    for d in rates:
        ev_s = 2.0 * d["achieved_per_s"]
        lost = d.get("lost", 0) or 0
        total = 2.0 * d["ops"]
        consumer = d["consumer_ns"]
        if d["config"] == "ivt-stream":
            consumer = (d.get("host") or {}).get("recorder_ns", 0)
        out.setdefault(d["config"], {"points": []})["points"].append({
            "target_calls_per_s": d["target_per_s"], "events_per_s": round(ev_s),
            "lost": lost, "lost_pct": round(100.0 * lost / (total + lost), 3) if total else 0,
            "consumer_pct": round(100.0 * consumer / d["wall_ns"], 1),
            "vcpu_wait_pct": (d.get("host") or {}).get("vcpu_wait_pct")})
    for x in out.values():
        pts = sorted(x["points"], key=lambda p: p["target_calls_per_s"])
        ok = [p["events_per_s"] for p in pts if p["lost"] == 0]
        drops = [p["events_per_s"] for p in pts if p["lost"] > 0]
        x["points"] = pts
        x["sustained_events_per_s"] = max(ok) if ok else None
        x["first_drop_events_per_s"] = min(drops) if drops else None
    return out


# --------------------------------------------------------------------------- all of it

def check_complete(data: dict) -> list[str]:
    p = data["params"]
    have = {(d["config"], d["workload"], d["rep"]) for d in data["runs"]}
    bad = [f"no measurement of {w} under {c} (rep {r})" for c in p["configs"]
           for w in p["workloads"] for r in range(1, p["reps"] + 1) if (c, w, r) not in have]
    for d in data["runs"]:
        if d["config"] != "off" and not (d.get("counts") or {}).get("events"):
            bad.append(f"{d['config']} recorded no event during {d['workload']} (rep {d['rep']})")
    nrates = len([x for x in (p.get("rates") or "").split(",") if x])
    if len(data.get("rates", [])) != nrates * len(p.get("rate_configs", [])):
        bad.append(f"the rate phase has {len(data.get('rates', []))} of "
                   f"{nrates * len(p.get('rate_configs', []))} points")
    native = (data.get("calibration") or {}).get("tracers_native") or {}
    if native.get("error"):
        bad.append(f"the native calibration failed: {native['error']}")
    if "lttng-discard" in p["configs"] and "getppid" in p["workloads"] and not any(
            (d.get("babeltrace2") or {}).get("first_lines") for d in data["runs"]):
        bad.append("babeltrace2 did not open LTTng's trace (build/bench/guest/lttng-proof)")
    return bad


def summarize(data: dict) -> dict:
    p = data["params"]
    by: dict = {}
    for d in data["runs"]:
        by.setdefault(d["workload"], {}).setdefault(d["config"], {})[d["rep"]] = d
    table = {w: {c: config_row(rows[c], rows.get("off", {}) if c != "off" else {})
                 for c in p["configs"] if c in rows} for w, rows in by.items()}
    agree, disagree = agreement(data["runs"])
    proof = next((d["babeltrace2"] for d in data["runs"] if d.get("babeltrace2")), None)
    return {"table": table, "ratios": ratios(table), "agreement": agree,
            "rates": rate_table(data.get("rates", [])), "lttng_proof": proof,
            "incomplete": check_complete(data) + disagree}


def fmt(v, nd=0) -> str:
    return "–" if v is None else f"{v:,.{nd}f}"


def print_summary(data: dict) -> None:
    s = data["summary"]
    for w, rows in s["table"].items():
        print(f"  {w}: wall ns/op (median) | added wall/op | added cpu/op [min..max] | "
              f"consumer % | events/op | lost | B/event")
        for c, x in rows.items():
            aw, ac = x.get("added_wall"), x.get("added_cpu")
            print(f"    {c:<15}{fmt(x['wall']['median']):>10} | {fmt(aw and aw['median']):>9}"
                  f" | {fmt(ac and ac['median']):>9} [{fmt(ac and ac['min'])}.."
                  f"{fmt(ac and ac['max'])}] | {fmt(x['consumer_pct']['median'], 1):>5} | "
                  f"{fmt(x['events_per_op']['median'], 2):>6} | {x['lost']:>7} | "
                  f"{fmt((x['bytes_per_event'] or {}).get('median'), 1)}")
    for w, r in s["ratios"].items():
        for ivt, others in r.items():
            for o, v in others.items():
                if v.get("cpu"):
                    print(f"  {w}: {ivt} / {o} added cost: cpu {fmt(v['cpu']['median'], 2)} "
                          f"[{fmt(v['cpu']['min'], 2)}..{fmt(v['cpu']['max'], 2)}]"
                          + (f", wall {fmt(v['wall']['median'], 2)}" if v.get("wall") else ""))
    for c, x in s["rates"].items():
        print(f"  rate {c}: sustained {fmt(x['sustained_events_per_s'])} events/s, first "
              f"drop at {fmt(x['first_drop_events_per_s'])}")
    for b in s["incomplete"]:
        print(f"  PROBLEM: {b}")
