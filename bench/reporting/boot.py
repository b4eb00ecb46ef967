"""The boot preset's section of docs/performance.md: what tracing costs each initcall level of
a guest's boot (the hypertracing seed's "boot-up level tracing overhead" table, reproduced),
and how small the function profile is against function_graph's raw events."""

from .common import f1, git_line
from .ftrace import load_note

STATES = {
    "off": "level boundaries only",
    "native": "the boot's tracepoints",
    "graph": "tracepoints + function_graph",
}


def cell(x: dict | None) -> str:
    """mean ± sd (min..max) in ms, or – ."""
    if not x:
        return "–"
    sd = "" if x["sd_ms"] is None else f" ± {f1(x['sd_ms'])}"
    return f"{f1(x['mean_ms'])}{sd} ({f1(x['min_ms'])}..{f1(x['max_ms'])})"


def table(out: list, levels: dict, states: list[str]) -> None:
    head = " | ".join(f"{STATES.get(s, s)} ms" for s in states)
    over = " | ".join(f"{s} overhead %" for s in states if s != "off")
    out.append(f"| level | {head} | {over} |")
    out.append("|---|" + "---:|" * (len(states) + len([s for s in states if s != "off"])))
    for level, row in levels.items():
        if not row:
            continue
        cells = " | ".join(cell(row.get(s)) for s in states)
        ovs = " | ".join(f1((row.get(s) or {}).get("overhead_pct"), 2)
                         for s in states if s != "off")
        name = "**postcore to the exec of /init**" if level == "kernel" else level
        out.append(f"| {name} | {cells} | {ovs} |")
    out.append("")


def ranked(out: list, levels: dict) -> None:
    """The seed's view: the levels by the overhead function_graph adds, the largest last."""
    rows = [(lv, r["graph"]["overhead_pct"]) for lv, r in levels.items()
            if lv != "kernel" and "overhead_pct" in r.get("graph", {})]
    if not rows:
        return
    rows.sort(key=lambda x: x[1])
    out.append("Levels by the overhead of tracepoints + function_graph (mean against mean): "
               + ", ".join(f"{lv} {f1(v, 2)} %" for lv, v in rows) + ".\n")


def sizes(out: list, profiles: list[dict]) -> None:
    if not profiles:
        return
    out.append("The function profile against the raw events it replaces, per graph boot "
               "(`ivtrace boot --derive --ftrace-profile instead` on a copy gives the bytes the "
               "ftrace streams keep without the raw graph events):\n")
    out.append("| graph events | ftrace streams bytes | of them graph events | profile rows | "
               "profile bytes | raw graph bytes / profile | ftrace streams / profile | "
               "derivation s |")
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in profiles:
        out.append(f"| {f1(p['graph_events'], 0)} | {f1(p['ftrace_bytes'], 0)} | "
                   f"{f1(p['graph_bytes'], 0)} | {f1(p['profile_rows'], 0)} | "
                   f"{f1(p['profile_bytes'], 0)} | {f1(p['ratio_vs_graph_bytes'])}x | "
                   f"{f1(p['ratio_vs_ftrace_bytes'])}x | {f1(p['derive_s'])} |")
    out.append("")


def section(out: list, rec: dict, src: str) -> None:
    d = rec["data"]
    p, acc, guest, m = d["params"], rec["accelerator"], rec["guest"], rec["machine"]
    out.append("## Boot: what tracing costs each initcall level\n")
    out.append(f"From `{src}` (run of {rec['date']}, {rec['duration_s']:.0f} s, "
               f"{p['boots']} boots per state). Reproduce: `{rec['command']}`, as root.\n")
    cond = d["conditions"]
    out.append("| | |\n|---|---|")
    out.append(f"| accelerator | **{acc['name']}**: {acc['reason']} |")
    out.append(f"| host | {m['cpu'].get('model_name', '?')}, {m['cpus']} CPUs, kernel "
               f"{m['kernel']}; {m['versions'].get('qemu')} |")
    out.append(f"| guest | Debian kernel {guest['kernel']}, {guest['cpus']} vCPUs, {guest['mem']} |")
    out.append(f"| load | loadavg {cond['before']['loadavg']} before, "
               f"{cond['after']['loadavg']} after |")
    out.append(f"| ivtrace | {git_line(rec['git'])} |")
    out.append("")
    load_note(out, cond)
    out.append("Method (bench/harness/boot.py, docs/boot.md): each boot recorded by `ivtrace "
               "record` with ivtrace.ko ftrace=1 loaded by /init; the states' kernel command "
               "lines: " + "; ".join(f"{s}: `{a}`" for s, a in p["append"].items()) + ". Per "
               "boot, `ivtrace boot --json` gives each phase's duration through the trace's "
               "clock; sub-levels are summed into their level and the kernel's work after the "
               "last initcall into late, so every state measures the same spans (a level's "
               "initcall_level event to the next level's; late to the exec of /init). Mean ± "
               "standard deviation (min..max) over the boots; overhead = mean / mean of the "
               "`off` state - 1. The states ran in an order rotated by one per round. Under "
               "TCG the times are the emulator's and the ratios are the claim. With "
               "function_graph, console to core are not in the trace: ftrace empties its "
               "buffer when the boot tracer starts (at core level), so those cells are empty.\n")
    s = d["summary"]
    table(out, s["levels"], p["states"])
    ranked(out, s["levels"])
    sizes(out, s["profile"])


def not_measured(out: list) -> None:
    out.append("## Boot: what tracing costs each initcall level\n")
    out.append("Not measured yet: `bench/run boot` (as root), then `bench/report`.\n")
