"""The native preset's sections of docs/performance.md: the acceptance lines, the machine,
per-event cost (§1), no reader (§1b), drain (§2), live (§2b) and the discussion."""

import re

from harness.stats import bench_map, row_numbers

from .common import f1, git_line, ratio

TARGET_P50_NS = 20.0
TARGET_VS_LTTNG = 4.0
TARGET_DRAIN_GBPS = 1.0
TARGET_DRAIN_MEVPS = 30.0

LABELS = {
    "ivtrace": "ivtrace (no reader, ring holds the round)",
    "ivtrace_live": "ivtrace (`ivtrace record` draining)",
    "ivtrace_busy": "ivtrace (no reader, other CPU copying memory)",
    "lttng_ust": "LTTng-UST",
    "trace_marker": "ftrace trace_marker",
    "trace_marker_raw": "ftrace trace_marker_raw",
    "write_tmpfs": "write(2) 32 B, tmpfs",
    "write_disk": "write(2) 32 B, disk",
    "rdtsc": "rdtsc alone (reference)",
    "getppid": "getppid(2) (reference)",
}


def verdict(ok):
    return "met" if ok else "**missed**"


# ---- sections --------------------------------------------------------------------

def section_summary(res, out):
    native, drain = res.get("native"), res.get("drain")
    out.append("## Summary: the acceptance lines\n")
    out.append("| line | target | measured (this run) | |")
    out.append("|---|---|---|---|")
    if native:
        bm = bench_map(native)
        iv, lt = bm.get("ivtrace"), bm.get("lttng_ust")
        if iv:
            n = row_numbers(iv)
            out.append(f"| ivtrace per-event p50 | <= {TARGET_P50_NS:.0f} ns | "
                       f"{f1(n['g50'])} ns (p50 of 16-event groups); {f1(n['p50'])} ns "
                       f"(p50 of single events, 10 ns resolution) | "
                       f"{verdict(n['g50'] <= TARGET_P50_NS and n['p50'] <= TARGET_P50_NS + .5)} |")
        if iv and lt:
            a, b = row_numbers(iv), row_numbers(lt)
            rs = [ratio(b["g50"], a["g50"]), ratio(b["batch"], a["batch"])]
            out.append(f"| ivtrace vs LTTng-UST, same run | >= {TARGET_VS_LTTNG:.0f}x faster | "
                       f"{f1(rs[0])}x (p50, 16-event groups), {f1(rs[1])}x (batch median); "
                       f"single-event p50 {f1(ratio(b['p50'], a['p50']))}x, mean "
                       f"{f1(ratio(b['mean'], a['mean']))}x (see §1) | "
                       f"{verdict(min(r or 0 for r in rs) >= TARGET_VS_LTTNG)} |")
    if drain:
        prof = {p["name"]: p for p in drain["profiles"]}
        if "large" in prof:
            m = prof["large"]["median"]
            gbps = m["trace_MB_per_s"] / 1000
            cpu = (m.get("trace_MB_per_cpu_s") or 0) / 1000
            out.append(f"| drain, large events, one CPU | >= {TARGET_DRAIN_GBPS:.0f} GB/s | "
                       f"{f1(gbps, 2)} GB/s of trace written, wall clock (median of "
                       f"{len(prof['large']['runs'])}); {f1(cpu, 2)} GB per CPU-second of the "
                       f"recorder (it had the CPU {f1(m.get('cpu_percent'), 0)} % of the time) | "
                       f"{verdict(gbps >= TARGET_DRAIN_GBPS)} (wall); "
                       f"{verdict(cpu >= TARGET_DRAIN_GBPS)} (CPU time) |")
        if "small" in prof:
            m = prof["small"]["median"]
            mev = m["events_per_s"] / 1e6
            cpu = (m.get("events_per_cpu_s") or 0) / 1e6
            out.append(f"| drain, small events, one CPU | >= {TARGET_DRAIN_MEVPS:.0f} M events/s | "
                       f"{f1(mev)} M events/s, wall clock (median of "
                       f"{len(prof['small']['runs'])}); {f1(cpu)} M events per CPU-second "
                       f"(CPU {f1(m.get('cpu_percent'), 0)} % of the time) | "
                       f"{verdict(mev >= TARGET_DRAIN_MEVPS)} (wall); "
                       f"{verdict(cpu >= TARGET_DRAIN_MEVPS)} (CPU time) |")
        lost = sum(p["lost_total"] for p in drain["profiles"])
        complete = all(p["recorded_all"] for p in drain["profiles"])
        out.append(f"| drain loss | 0 | lost {lost}; every produced event recorded: "
                   f"{'yes' if complete else 'NO'} | {verdict(lost == 0 and complete)} |")
    out.append("")


def section_machine(rec, out):
    m = rec["machine"]
    details = m.get("details", {})
    nat = rec["data"].get("native", {})
    cpu = m["cpu"]
    cpuid = nat.get("cpuid_exit_cycles_p50")
    out.append("## Machine and conditions\n")
    out.append("| | |")
    out.append("|---|---|")
    out.append(f"| CPU | {cpu.get('model_name')} ({cpu.get('vendor_id')}, family "
               f"{cpu.get('cpu_family')} model {cpu.get('model')}), {m['cpus']} vCPUs, "
               f"{m['mem_gib']} GiB |")
    out.append(f"| kernel | {m['kernel']} ({m['kernel_version']}), clocksource "
               f"{details.get('clocksource')} |")
    if nat:
        out.append(f"| TSC | {nat['tsc_hz'] / 1e6:,.1f} MHz (calibrated against "
                   f"CLOCK_MONOTONIC_RAW); resolution {nat.get('tsc_tick_cycles')} cycles "
                   f"= {nat.get('tsc_tick_cycles', 0) / nat['tsc_hz'] * 1e9:.1f} ns |")
    virt = ("KVM guest (hypervisor flag)" if "hypervisor" in cpu.get("flags_of_interest", [])
            else "no hypervisor flag")
    if cpuid:
        sig = ("at or above 10k cycles: a nested guest (a plain first-level exit costs "
               "~1-2k cycles)" if cpuid >= 10000 else
               "just under the 10k cycles a nested guest's exit costs and far above a plain "
               "first-level exit (~1-2k cycles): probably nested")
        us = cpuid / nat["tsc_hz"] * 1e6
        virt += f"; CPUID exit p50 {cpuid:,.0f} cycles ({us:.1f} µs), {sig}"
    dm = "; ".join(x.split("] ", 1)[-1] for x in details.get("dmesg_hypervisor_tsc", [])[:3])
    out.append(f"| virtualization | {virt}. dmesg: {dm} |")
    v = m["versions"]
    out.append(f"| versions | {v.get('gcc')}; {v.get('rustc')}; lttng-ust {v.get('lttng-ust')}, "
               f"lttng-tools {v.get('lttng-tools')}; babeltrace2 {v.get('babeltrace2')} |")
    vul = details.get("vulnerabilities", {})
    keys = [k for k in ("spectre_v2", "spec_rstack_overflow", "retbleed", "meltdown") if k in vul]
    if keys:
        out.append("| mitigations (syscall cost) | " +
                   "; ".join(f"{k}: {vul[k]}" for k in keys) + " |")
    out.append(f"| ivtrace | {git_line(rec['git'])} |")
    for name, c in rec["data"].get("conditions", {}).items():
        busy = ", ".join(f"{k} {v}%" for k, v in c["cpu_busy_percent"].items())
        steal = ", ".join(f"{k} {v}%" for k, v in c.get("cpu_steal_percent", {}).items())
        out.append(f"| load during {name} ({c['seconds']} s) | CPU busy: {busy}; "
                   f"steal: {steal or '–'}; loadavg "
                   f"before {c['before']['loadavg'].split()[0]}, after "
                   f"{c['after']['loadavg'].split()[0]} |")
    out.append("")
    out.append("The writer CPU (0) is expected to be ~100 % busy during `native`; the other "
               "CPU carries the readers (lttng-consumerd, `ivtrace record`) and whatever else "
               "runs on the shared machine. The JSON lists the busiest processes before and "
               "after each section.\n")


def _native_method(nat, out):
    """The heading and how the writer cost is measured: the process, the rounds, the timing
    and the TSC's resolution, which quantizes the single-event percentiles."""
    p = nat["params"]
    tick_ns = nat.get("tsc_tick_cycles", 1) / nat["tsc_hz"] * 1e9
    out.append("## 1. Per-event writer cost, side by side\n")
    out.append(f"One process (`bench/native/ivbench`), pinned to CPU {nat['cpu']}, memory "
               f"locked (`mlockall`, so no page fault lands in a timed loop), every tracer "
               f"writing the same 4 x u64 payload (32 bytes). {p['rounds']} rounds; each round "
               f"runs every tracer once, the order rotated by one each round so drift and "
               f"background load spread over all of them. Per tracer and round: "
               f"{p['warmup']:,} untimed warm-up events, {p['samples']:,} single events timed "
               f"one by one, {p['groups']:,} groups of {p['group_events']} events timed per "
               f"group, and {p['batches']} batches of {p['batch']:,} events timed as a whole.\n")
    out.append(f"Timing: `lfence; rdtsc; lfence` before, `rdtscp; lfence` after. The empty "
               f"timed region (the `empty` row, same loops with no write) costs "
               f"{nat['overhead_single_cycles']['p50']:.0f} cycles at p50 per single sample "
               f"and is subtracted: net percentile = (raw percentile - empty p50) / events per "
               f"sample; net mean = (raw mean - empty mean) / events per sample. Batches: "
               f"(batch cycles / events) - the empty batch ({nat['empty_batch_ns_per_event']:.2f} "
               f"ns/event). **This TSC advances in steps of {nat.get('tsc_tick_cycles')} cycles "
               f"({tick_ns:.1f} ns)**, so single-event percentiles are quantized to "
               f"{tick_ns:.0f} ns; the 16-event groups resolve {tick_ns / 16:.2f} ns per event "
               f"(their p50 is the per-event figure to read; their tails are diluted 16x, so "
               f"tails come from single events). Means are not quantized.\n")


def _native_table(nat, bm, out):
    """One row per tracer (the empty bench is the overhead, not a row), LTTng-UST's cost
    relative to each."""
    p = nat["params"]
    out.append("| tracer | p50 (16-groups) | p50 | p99 | p99.9 | mean | mean of samples "
               "<= 10 µs | samples > 10 µs | batch (median) | M ev/s | LTTng-UST / this "
               "(p50 grp, batch) |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    lt = bm.get("lttng_ust")
    ltn = row_numbers(lt) if lt else None
    for name, b in bm.items():
        if name == "empty":
            continue
        n = row_numbers(b)
        rel = "–"
        if ltn:
            rel = " / ".join(f1(ratio(ltn[k], n[k])) + "x" if ratio(ltn[k], n[k]) else "–"
                             for k in ("g50", "batch"))
        mev = 1e3 / n["batch"] if n["batch"] > 0 else None
        out.append(f"| {LABELS.get(name, name)} | {f1(n['g50'])} | {f1(n['p50'])} | "
                   f"{f1(n['p99'])} | {f1(n['p999'])} | {f1(n['mean'])} | {f1(n['tmean'])} | "
                   f"{f1(n['over'], 0)} | "
                   f"{f1(n['batch'])} | {f1(mev)} | {rel} |")
    out.append("\nAll values ns/event, net of the timing overhead. Single-event columns "
               f"(p50, p99, p99.9, mean) from {p['rounds'] * p['samples']:,} samples per tracer; "
               f"\"samples > 10 µs\" counts the single samples an interrupt or a context switch "
               f"hit: they move the mean, not the percentiles, so the mean is also given "
               f"without them. Batch: median over "
               f"{p['rounds'] * p['batches']} batches of {p['batch']:,} events.\n")


def _row_extra(name, b, nat):
    """What a row's results file says about its set-up (ring, file system, channel, tracefs
    instance), as a sentence after the row's description; "" for the others."""
    extra = ""
    if name in ("write_tmpfs", "write_disk"):
        extra = f" File system: {b.get('filesystem')} ({b.get('file')})."
    if name == "ivtrace":
        r = b.get("region", {})
        extra = (f" Ring: {r.get('subbufs')} x {r.get('subbuf_size', 0) >> 10} KiB, one "
                 f"channel, {r.get('event_bytes')} bytes per event; {b.get('ring')}.")
    if name == "ivtrace_live":
        extra = (f" Ring: {b.get('region', {}).get('subbufs')} x "
                 f"{b.get('region', {}).get('subbuf_size', 0) >> 10} KiB; {b.get('ring')}; "
                 f"events dropped per round: {b.get('lost_per_round')}.")
    if name == "lttng_ust":
        lt_info = nat.get("lttng", {})
        ch = lt_info.get("channel", {})
        extra = (f" Channel: {ch.get('num_subbuf')} x {ch.get('subbuf_size', 0) >> 20} MiB, "
                 f"{ch.get('buffers')} buffers, discard; sessiond "
                 f"{lt_info.get('sessiond')}; discarded events at the end: "
                 f"{lt_info.get('discarded_events')}.")
    if name.startswith("trace_marker"):
        st = b.get("cpu_stats", {})
        clock = re.search(r"\[([^\]]+)\]", b.get("trace_clock", ""))
        extra = (f" Instance {b.get('tracefs_instance')}, buffer {b.get('buffer_size_kb')} "
                 f"KiB/CPU, overwrite={b.get('overwrite')}, clock "
                 f"{clock.group(1) if clock else b.get('trace_clock')}; "
                 f"CPU stats after the run (both marker rows): entries {st.get('entries')}, "
                 f"overrun {st.get('overrun')}.")
    return extra


def _native_rows(nat, bm, out):
    """What each row is: the bench's own description and its set-up."""
    out.append("What each row is:\n")
    for name, b in bm.items():
        out.append(f"- `{name}`: {b['what']}.{_row_extra(name, b, nat)}")
    out.append("")


def _native_spread(nat, bm, out):
    """Each tracer's p50 in each round and its place in that round's order: drift shows here."""
    p = nat["params"]
    out.append("Spread across rounds (p50 of 16-event groups, ns/event; position = place in "
               "that round's order):\n")
    out.append("| tracer | " + " | ".join(f"round {i + 1}" for i in range(p["rounds"])) + " |")
    out.append("|---|" + "---:|" * p["rounds"])
    for name, b in bm.items():
        cells = [f"{f1(r['group_net_ns']['p50'])} (pos {r['position']})" for r in b["rounds"]]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("")


def section_native(res, out):
    """Section 1: the per-event writer cost of every tracer, side by side (ivbench's JSON)."""
    nat = res["native"]
    bm = bench_map(nat)
    _native_method(nat, out)
    _native_table(nat, bm, out)
    _native_rows(nat, bm, out)
    _native_spread(nat, bm, out)


def section_noreader(res, out):
    nr = res.get("native", {}).get("noreader")
    if not nr:
        return
    b, a = nr["before_full"]["net_ns"], nr["after_full"]["net_ns"]
    r = nr["region"]
    out.append("## 1b. Writer cost with no reader (the ring fills, then drops)\n")
    out.append(f"ivtrace, discard mode, ring {r['subbufs']} x {r['subbuf_size'] >> 10} KiB "
               f"(~{nr['capacity_events']:,} events of {r['event_bytes']} bytes), nobody "
               f"reading. Each round writes {nr['rounds'][0]['produced']:,} events timed one "
               f"by one into a fresh region: the first ones fill the ring, the rest are dropped "
               f"and counted. Then a fresh region takes 9 timed batches of 10 % of the ring "
               f"each (they fit), is filled up, and takes 40 timed batches of "
               f"{nr['rounds'][0].get('batch_full_events', 0):,} events into the full ring (all "
               f"dropped); the batch column is the median.\n")
    out.append("| phase | samples | p50 | p99 | p99.9 | mean | mean of samples <= 10 µs | "
               "batch ns/event |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    fill = sum(x["batch_fill_ns_per_event_net"] for x in nr["rounds"]) / len(nr["rounds"])
    full = sum(x["batch_full_ns_per_event_net"] for x in nr["rounds"]) / len(nr["rounds"])
    out.append(f"| ring has room | {nr['samples_before_full']:,} | {f1(b['p50'])} | "
               f"{f1(b['p99'])} | {f1(b['p99.9'])} | {f1(b['mean'])} | "
               f"{f1(b.get('mean_under_10us'))} | {f1(fill)} |")
    out.append(f"| ring full, event dropped | {nr['samples_after_full']:,} | {f1(a['p50'])} | "
               f"{f1(a['p99'])} | {f1(a['p99.9'])} | {f1(a['mean'])} | "
               f"{f1(a.get('mean_under_10us'))} | {f1(full)} |")
    out.append("\n(ns/event, net of the timing overhead as in §1; single-event columns are "
               "quantized to the TSC step.)\n")
    out.append("| round | produced | committed | lost (ivt_stats) | produced - committed | "
               "first drop at |")
    out.append("|---|---:|---:|---:|---:|---:|")
    for i, x in enumerate(nr["rounds"]):
        out.append(f"| {i + 1} | {x['produced']:,} | {x['committed']:,} | {x['lost']:,} | "
                   f"{x['produced'] - x['committed']:,} | {x['first_drop_index']:,} |")
    out.append(f"\nlost == produced - committed in every round and batch: "
               f"**{'yes' if nr['lost_equals_produced_minus_committed'] else 'NO'}**.")
    rr = nr.get("reread_by_record")
    if rr:
        last = nr["rounds"][-1]
        out.append(f" The last round's region, drained afterwards by `{rr['command']}`: "
                   f"{f1(rr.get('recorded'), 0)} events recorded (writer committed "
                   f"{last['committed']:,}), {f1(rr.get('lost'), 0)} reported lost "
                   f"(writer counted {last['lost']:,}).")
    out.append("")


def section_drain(res, out):
    d = res.get("drain")
    if not d:
        return
    out.append("## 2. Drain throughput of `ivtrace record` (one CPU, to tmpfs)\n")
    out.append(f"Method: {d['method']}. Two rates per run: by wall clock (what the "
               f"recorder achieved on the machine as it was) and by the recorder's CPU time "
               f"(user + system, from wait4: what one drain thread costs; the two differ when "
               f"other processes share the drain CPU, see the CPU % column). MB = 10^6 bytes. "
               f"\"trace\" = bytes of the files "
               f"`ivtrace record` wrote (CTF streams + metadata); \"event\" = in-ring event "
               f"bytes (4-byte compact header + loadgen's u16 thread and u64 seq + the data: "
               f"binary = u32 length and `--size` bytes, text = `--size` bytes and a NUL; "
               f"padded to 4); \"payload\" = loadgen's payload bytes (the fields without "
               f"header and padding). Binary data is the bulk case: the recorder checks its "
               f"length only. Text data is a string, and the recorder validates every byte "
               f"of it (UTF-8, NUL) before it lets it into the CTF trace.\n")
    out.append("| profile | events | wall s | CPU s | CPU % | M events/s | trace MB/s | "
               "event MB/s | payload MB/s | M events / CPU-s | trace MB / CPU-s | lost | "
               "all recorded |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for p in d["profiles"]:
        m = p["median"]
        out.append(f"| {p['name']}: --size {p['size']} --payload {p.get('payload', 'text')} "
                   f"({p['event_bytes']} B/event), ring "
                   f"{p['ring']['subbufs']} x {p['ring']['subbuf_size'] >> 10} KiB | "
                   f"{p['events']:,} | {m['wall_s']:.3f} | {f1(m.get('cpu_s'), 3)} | "
                   f"{f1(m.get('cpu_percent'), 0)} | {m['events_per_s'] / 1e6:.1f} | "
                   f"{m['trace_MB_per_s']:,.0f} | {m['event_MB_per_s']:,.0f} | "
                   f"{m['payload_MB_per_s']:,.0f} | "
                   f"{f1((m.get('events_per_cpu_s') or 0) / 1e6)} | "
                   f"{f1(m.get('trace_MB_per_cpu_s'), 0)} | {p['lost_total']} | "
                   f"{'yes' if p['recorded_all'] else 'NO'} |")
    out.append(f"\nMedians over {len(d['profiles'][0]['runs'])} runs per profile (each column "
               f"its own median).")
    out.append("Per run, M events/s wall (CPU %): " + "; ".join(
        f"{p['name']}: " + ", ".join(
            f"{r['events_per_s'] / 1e6:.1f} ({r.get('cpu_percent', 0):.0f} %)" for r in p["runs"])
        for p in d["profiles"]))
    for p in d["profiles"]:
        top = (p.get("profile") or {}).get("top")
        if top:
            out.append(f"\nWhere one {p['name']}-event drain spends its CPU time "
                       f"(`{p['profile']['command']}`, {p['profile']['events']:,} events): " +
                       ", ".join(f"`{r['symbol']}` ({r['dso']}) {r['percent']:.1f} %"
                                 for r in top[:8]) + ".")
    out.append("\nCommands (one run):\n")
    out.append("```")
    for p in d["profiles"]:
        out.append(p["runs"][0]["prefill_command"])
        out.append(p["runs"][0]["record_command"])
    out.append("```\n")


def live_table(out, runs, produced_key, dropped_key, cpu_key=None):
    head = "| ring | target rate | events | achieved rate (M/s) | dropped (writer) | recorded | " \
           "lost (recorder) | loss % |" + (" recorder CPU % |" if cpu_key else "")
    out.append(head)
    out.append("|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if cpu_key else ""))
    for r in runs:
        rate = r["rate"] if isinstance(r["rate"], str) else (
            "unthrottled" if not r["rate"] else f"{r['rate'] / 1e6:g} M/s")
        dropped, n = r.get(dropped_key), r[produced_key]
        loss = (100.0 * dropped / n) if isinstance(dropped, int) and n else None
        ring = r.get("ring") or {"subbufs": r.get("subbufs"), "subbuf_size": r.get("subbuf_size")}
        ring = f"{ring.get('subbufs')} x {(ring.get('subbuf_size') or 0) >> 10} KiB"
        out.append(f"| {ring} | {rate} | {n:,} | {r['achieved_rate'] / 1e6:.2f} | "
                   f"{f1(dropped, 0)} | {f1(r.get('recorded'), 0)} | {f1(r.get('lost'), 0)} | "
                   f"{f1(loss, 3)} |" + (f" {f1(r.get(cpu_key), 0)} |" if cpu_key else ""))


def section_live(res, out):
    st, lv = res.get("live_steady"), res.get("live")
    if not (st or lv):
        return
    out.append("### 2b. Live: writer and reader at the same time\n")
    if st:
        out.append(f"**Steady state** (`bench/native`, {st['method']}):\n")
        live_table(out, st["runs"], "produced", "lost_full")
        out.append(f"\nCommand: `{st['command']}`\n")
    if lv:
        out.append(f"**With ivtrace-loadgen**, started the way a user would ({lv['method']}). "
                   f"`ivtrace record` looks for a region that does not exist yet every 50 ms, "
                   f"so the first tens of milliseconds of writing happen before it attaches; "
                   f"at high rates a small ring overflows in that window:\n")
        live_table(out, lv["runs"], "events", "loadgen_dropped",
                   "record_cpu_percent_of_writer_time")
        out.append(f"\nCommand (one run): `{lv['runs'][0]['record_command']}` then "
                   f"`{lv['runs'][0]['loadgen_command']}`\n")


def section_discussion(res, out):
    nat = res.get("native", {})
    bm = bench_map(nat) if nat else {}
    num = {k: row_numbers(v) for k, v in bm.items()}
    out.append("## Discussion\n")
    discuss_writer(num, out)
    discuss_reader(num, bm, out)
    discuss_noreader(nat, out)
    discuss_syscall_tracers(num, out)
    discuss_drain(res, out)
    discuss_live(res, out)
    out.append(
        "- **Measurement limits.** This guest's TSC ticks in 10 ns steps, so single-event "
        "percentiles move in 10 ns jumps; the 16-event group p50 and the means are the precise "
        "figures, single-event p99/p99.9 the honest tails. The machine is a shared 2-vCPU VM: "
        "other engineers' builds and VMs preempt the benches; the per-round table, the "
        "interrupt counts, the robust means, the batch medians and the CPU-time drain rates "
        "are there so that load shows as load and not as a tracer's cost.")
    out.append("")


def discuss_writer(num, out):
    iv, lt, rd = num.get("ivtrace"), num.get("lttng_ust"), num.get("rdtsc")
    if iv and lt:
        line = (f"- **Writer.** `ivt_write()` of 32 bytes costs {f1(iv['g50'])} ns at the median "
                f"and {f1(iv['batch'])} ns back to back, against {f1(lt['g50'])} and "
                f"{f1(lt['batch'])} ns for LTTng-UST in the same run: "
                f"{f1(ratio(lt['g50'], iv['g50']))}x and {f1(ratio(lt['batch'], iv['batch']))}x. ")
        if rd:
            line += (f"A bare `rdtsc` costs {f1(rd['g50'])} / {f1(rd['batch'])} ns on this CPU, "
                     f"so the timestamp is nearly the whole cost: the rest of the fast path "
                     f"(a TLS check, a compare chain, a 4-byte compact header, the 32-byte copy "
                     f"and a plain store of commit_pos, which is what a store-release compiles "
                     f"to on x86) overlaps with it. What limits ivtrace here is the TSC read, "
                     f"not the ring. ")
        line += ("LTTng-UST pays for an RCU read-side section, a per-CPU buffer lookup, a "
                 "compare-and-swap reservation and `clock_gettime()` for each timestamp.")
        out.append(line)


def discuss_reader(num, bm, out):
    iv = num.get("ivtrace")
    if iv and "ivtrace_live" in num:
        lv = num["ivtrace_live"]
        lost = bm["ivtrace_live"].get("lost_per_round")
        line = (f"- **Reader running.** With `ivtrace record` draining on the other CPU the "
                f"writer costs {f1(lv['g50'])} ns (p50) / {f1(lv['batch'])} ns (batch), "
                f"against {f1(iv['g50'])} / {f1(iv['batch'])} ns with no reader")
        if "ivtrace_busy" in num:
            bz = num["ivtrace_busy"]
            line += (f" and {f1(bz['g50'])} / {f1(bz['batch'])} ns with a plain memory-copy "
                     f"loop on the other CPU instead (the control)")
        line += (f". Events the writer dropped per round while the recorder drained: {lost} "
                 f"(non-zero means the recorder fell behind a writer running flat out; the "
                 f"recorder shares its CPU with whatever else runs on the machine). "
                 f"LTTng-UST's row always has lttng-consumerd draining, so `ivtrace_live` is "
                 f"the like-for-like row.")
        out.append(line)


def discuss_noreader(nat, out):
    nr = nat.get("noreader")
    if nr:
        b, a = nr["before_full"]["net_ns"], nr["after_full"]["net_ns"]
        fill = sum(x["batch_fill_ns_per_event_net"] for x in nr["rounds"]) / len(nr["rounds"])
        full = sum(x["batch_full_ns_per_event_net"] for x in nr["rounds"]) / len(nr["rounds"])
        am, bm_ = a.get("mean_under_10us"), b.get("mean_under_10us")
        rises = full > fill * 1.1
        lat = am is not None and bm_ is not None and am > bm_ * 1.1
        rr = nr.get("reread_by_record") or {}
        last = nr["rounds"][-1]
        agrees = rr.get("recorded") == last["committed"] and rr.get("lost") == last["lost"]
        out.append(f"- **No reader.** Once the ring is full every event is dropped and counted: "
                   f"{f1(full)} ns per dropped event in batches against {f1(fill)} ns while "
                   f"the ring had room (single events, robust mean: {f1(am)} vs {f1(bm_)} ns), "
                   + ("so back to back the cost does not rise when the reader is missing"
                      if not rises else "**so the cost rises when the ring is full**") +
                   (f"; timed one by one (serialized: latency rather than throughput) a drop "
                    f"takes {f1(am - bm_)} ns more, the packet-open slow path being on the "
                    f"critical path. " if lat else ". ") +
                   f"Each dropped event goes through the packet-open slow path and re-reads the "
                   f"reader's `consumed` word, which is what lets the writer resume as soon as a "
                   f"reader frees a packet. lost == produced - committed in every round: "
                   f"{'yes' if nr['lost_equals_produced_minus_committed'] else 'NO'}; "
                   f"`ivtrace record` reading the full ring afterwards "
                   + ("agrees (events and lost)." if agrees else
                      f"**disagrees**: {rr.get('recorded')} recorded, {rr.get('lost')} lost."))


def discuss_syscall_tracers(num, out):
    if "trace_marker" in num:
        t = num["trace_marker"]
        g = num.get("getppid")
        out.append(f"- **System-call tracers** (trace_marker {f1(t['g50'])} ns, write(2) "
                   f"{f1(num.get('write_tmpfs', {}).get('g50'))} ns to tmpfs) pay for a kernel "
                   f"entry"
                   + (f" (getppid alone: {f1(g['g50'])} ns with this guest's mitigations)" if g
                      else "") + ", an order of magnitude over the in-process tracers.")


def discuss_drain(res, out):
    d = res.get("drain")
    if d:
        prof = {p["name"]: p for p in d["profiles"]}
        parts = []
        for name in ("small", "large", "large-text"):
            p = prof.get(name)
            if not p:
                continue
            m = p["median"]
            parts.append(f"{name} events: {m['events_per_s'] / 1e6:.1f} M events/s and "
                         f"{m['trace_MB_per_s'] / 1000:.2f} GB/s by wall clock, "
                         f"{(m.get('events_per_cpu_s') or 0) / 1e6:.1f} M events and "
                         f"{(m.get('trace_MB_per_cpu_s') or 0) / 1000:.2f} GB per CPU-second "
                         f"(the recorder had its CPU {f1(m.get('cpu_percent'), 0)} % of the time)")
        line = "- **Drain.** " + "; ".join(parts) + ". "
        for name in ("small", "large", "large-text"):
            top = (prof.get(name, {}).get("profile") or {}).get("top") or []
            if top:
                line += (f"Where the {name} drain spends its CPU (perf, cpu-clock): " +
                         ", ".join(f"{r['symbol']} {r['percent']:.0f} %" for r in top[:4]) +
                         ". ")
        line += ("The recorder copies whole packets (one sub-buffer = one CTF packet) with "
                 "pread, walks the event headers to validate them (`packet::walk`; for string "
                 "fields it also checks every byte), and writes the packet to the output "
                 "file: per byte it is two kernel copies plus tmpfs page allocation, per "
                 "event the header walk, per string byte the validation. When the wall-clock "
                 "and the CPU-time rates differ, the difference is other processes sharing "
                 "the drain CPU, not the recorder.")
        out.append(line)


def discuss_live(res, out):
    st = res.get("live_steady")
    if st:
        def rate_of(r):
            return r["achieved_rate"]
        clean = [r for r in st["runs"] if r["rate"] and not r.get("lost_full")]
        lossy = [r for r in st["runs"] if r["rate"] and r.get("lost_full")]
        flat = [r for r in st["runs"] if not r["rate"]]
        line = "- **Live loss.** With the recorder attached first, "
        if clean:
            best = max(clean, key=rate_of)
            line += (f"no event was lost up to {best['achieved_rate'] / 1e6:.1f} M events/s "
                     f"({best['achieved_rate'] * best['event_bytes'] / 1e6:,.0f} MB/s into a "
                     f"{best['subbufs']} x {best['subbuf_size'] >> 10} KiB ring)")
        if lossy:
            worst = min(lossy, key=rate_of)
            line += ("; " if clean else "") + (
                f"loss started at {worst['achieved_rate'] / 1e6:.1f} M events/s in a "
                f"{worst['subbufs']} x {worst['subbuf_size'] >> 10} KiB ring "
                f"({100.0 * worst['lost_full'] / worst['produced']:.2f} %)")
        if flat:
            f0 = flat[-1]
            kept = 100.0 * (f0.get("recorded") or 0) / f0["produced"]
            line += (f". A writer running flat out produced {f0['achieved_rate'] / 1e6:.0f} M "
                     f"events/s; the recorder kept {kept:.0f} % "
                     f"of them, the rest were counted as lost (no silent loss)")
        line += (". `ivtrace record` sleeps up to 5 ms when it finds nothing to do and shares "
                 "its CPU with the rest of the machine; the ring must cover those gaps, which "
                 "is why the larger ring loses less. The loadgen table adds the recorder's "
                 "start-up (it polls for the region file every 50 ms).")
        out.append(line)
