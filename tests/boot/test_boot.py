"""The boot analysis (docs/boot.md) on real guests: two boots.

1. Levels (`ivtrace serve --host-events`, an ivshmem-doorbell guest): ftrace's initcall,
   module, exec and context-switch events from the first moment of boot, no function tracer.
   The kernel trace holds the boot's phases as events, every initcall level in the kernel's
   order, babeltrace2 and Trace Compass read them at the same times; `ivtrace boot` reports
   phases, initcalls, what ran on each vCPU and the host's preemption of the vCPUs during the
   boot (the VM view), which agrees with the VM view's own events; its chart, rendered by
   Debian's headless Chromium, shows the bands and bars.
2. Profile (`ivtrace record`): function_graph on the kernel's init functions. The profile
   stream's counts and times equal, row for row, what the raw funcgraph events give
   (computed here with babeltrace2); instead of the raw events, it leaves every other event
   and every loss as it was.
"""
import shutil

import pytest

import ctf
from boot import boot as b

PHASE_ORDER = ["untraced", "start_kernel", "console", "early", "pure", "pure_sync", "core",
               "core_sync", "postcore", "postcore_sync", "arch", "arch_sync", "subsys",
               "subsys_sync", "fs", "fs_sync", "rootfs", "device", "device_sync", "late",
               "late_sync", "post_initcalls", "userland", "workload"]
LEVELS = ["console", "early", "pure", "core", "postcore", "arch", "subsys", "fs", "rootfs",
          "device", "late"]


@pytest.fixture(scope="module")
def levels_boot(tmp_path_factory, boot_add):
    tmp = tmp_path_factory.mktemp("boot-levels")
    summary, out, log = b.serve_host_events(tmp, boot_add, b.LEVELS_APPEND)
    return {"summary": summary, "out": out, "kernel": out / "kernel", "log": log}


@pytest.fixture(scope="module")
def graph_boot(tmp_path_factory, boot_add):
    tmp = tmp_path_factory.mktemp("boot-graph")
    summary, out, log = b.record(tmp, boot_add, "graph", b.GRAPH_APPEND)
    return {"summary": summary, "out": out, "kernel": out / "kernel", "log": log, "tmp": tmp}


# --------------------------------------------------------------------------- 1. levels

def test_every_level_is_a_boot_phase_in_the_kernels_order(levels_boot):
    ph = b.phases(levels_boot["kernel"])
    names = [n for _, n in ph]
    print(f"\nphases: {names}")
    assert names[0] == "untraced" and names[-1] == "workload", names
    assert set(LEVELS) <= set(names), set(LEVELS) - set(names)
    assert names == sorted(names, key=PHASE_ORDER.index), names
    starts = [c for c, _ in ph]
    assert starts == sorted(starts) and len(set(starts)) == len(starts), starts
    boot = levels_boot["summary"]["boot"]
    assert boot["phases"] == len(ph) and boot["read_errors"] == [], boot


def test_initcalls_and_marks_are_named_events(levels_boot):
    ev = b.derived(levels_boot["kernel"], ("ivtrace:initcall", "ivtrace:boot_mark",
                                          "ftrace:initcall:initcall_start"))
    starts = [e for e in ev if e.name == "ftrace:initcall:initcall_start"]
    calls = [e for e in ev if e.name == "ivtrace:initcall"]
    assert len(calls) == len(starts) > 500, (len(calls), len(starts))
    # The same initcalls at the same times: the derived events name the raw ones.
    assert sorted((e.cycles, e.payload["func"]) for e in calls) == \
        sorted((e.cycles, e.payload["func"]) for e in starts)
    named = [e for e in calls if not e.payload["name"].startswith("0x")]
    print(f"\n{len(calls)} initcalls, {len(named)} named by the guest's kallsyms; e.g. "
          f"{[e.payload['name'] for e in calls[:5]]}")
    assert len(named) >= 0.99 * len(calls)
    phase_names = {n for _, n in b.phases(levels_boot["kernel"])}
    assert {e.payload["level"] for e in calls} <= phase_names
    marks = [(e.payload["kind"], e.payload["name"]) for e in ev if e.name == "ivtrace:boot_mark"]
    print(f"marks: {marks}")
    assert ("exec", "/init") in marks and ("module", "ivtrace") in marks
    assert any(k == "marker" and n.startswith("ivtrace-boot") for k, n in marks), marks


def test_report_has_phases_initcalls_cpus_and_host_preemption(levels_boot):
    r = b.boot_cli(levels_boot["out"], "--json", "--top", "3", "--no-chart")
    assert [s["name"] for s in r["stages"]] == ["untraced", "kernel", "userland", "workload"]
    # Times count from the vCPU's reset, whatever the kernel trace's clock counts (ns since the
    # epoch now): a TCG boot to the workload takes seconds, and the trace starts inside it.
    print(f"\nboot {r['boot_ms']:.1f} ms from the reset, traced from {r['traced_from_ms']:.1f} ms")
    assert 100 < r["boot_ms"] < 600_000, r["boot_ms"]
    assert 0 < r["traced_from_ms"] < r["boot_ms"], r
    assert r["stages"][0]["start_ms"] == 0, r["stages"][0]
    in_boot = [p for p in r["phases"] if p["stage"] != "workload"]
    assert abs(sum(p["share_pct"] for p in in_boot) - 100) < 0.01, in_boot
    assert all(len(v) <= 3 for v in r["initcalls_by_level"].values())
    assert r["initcalls_by_level"]["device"][0]["name"]
    assert {c["cpu"] for c in r["cpus"]} == {0, 1}, r["cpus"]
    assert r["preempted"] is not None, "the VM view was recorded (--host-events)"
    # The report's preemption is the VM view's own intervals that began in the boot.
    end = next(e.payload["end_cycles"] for e in b.derived(levels_boot["kernel"],
               ("ivtrace:boot_summary",)) if e.name == "ivtrace:boot_summary")
    want = {}
    for e in ctf.events(levels_boot["out"] / "vm", lambda n: n == "vcpu_preempted"):
        if e.name == "vcpu_preempted" and e.cycles <= end:
            want[e.cpu] = want.get(e.cpu, 0) + e.payload["duration_ns"]
    got = {p["vcpu"]: p["preempted_ms"] for p in r["preempted"]}
    print(f"\npreempted during the boot (ms): {got}; VM view: "
          f"{ {k: v / 1e6 for k, v in want.items()} }")
    assert got.keys() == want.keys()
    for cpu, ns in want.items():
        assert abs(got[cpu] - ns / 1e6) < 1e-6, (cpu, got, want)
    text = b.boot_cli(levels_boot["out"], "--no-chart").stdout
    for needle in ("untraced", "kernel", "device", "longest initcalls per level",
                   "what ran on each vCPU", "host preemption during the boot"):
        assert needle in text, text


def test_trace_compass_shows_the_phases_where_babeltrace2_does(levels_boot, tracecompass):
    tc = tracecompass.events(levels_boot["kernel"], "ivtrace:boot_phase")
    bt = [e for e in b.derived(levels_boot["kernel"], ("ivtrace:boot_phase",))
          if e.name == "ivtrace:boot_phase"]
    print(f"\nTrace Compass: {tc['type']}, {tc['read']:,} events, "
          f"{len(tc['matched'])} boot phases")
    assert tc["type"] == "LttngKernelTrace"
    assert [m["fields"]["name"] for m in tc["matched"]] == [e.payload["name"] for e in bt]
    for m, e in zip(tc["matched"], bt):
        assert abs(m["ns"] - e.ns) <= 1000, (m, e)


def test_the_chart_renders_in_a_browser(levels_boot, tmp_path):
    from PIL import Image

    svg = tmp_path / "chart.svg"
    p = b.boot_cli(levels_boot["out"], "--chart", svg, "--png")
    png = svg.with_suffix(".png")
    assert png.is_file(), p.stdout + p.stderr
    shutil.copy(png, levels_boot["out"] / "boot.test.png")
    img = Image.open(png).convert("RGB")
    w, h = img.size
    colors = img.getcolors(maxcolors=w * h)
    count = {c: n for n, c in colors}
    white = count.get((255, 255, 255), 0)
    print(f"\nchart {w}x{h}: {100 * (1 - white / (w * h)):.1f} % drawn, {len(colors)} colors; "
          f"kept as {levels_boot['out'] / 'boot.test.png'}")
    assert w == 1600 and h > 250
    assert white < 0.9 * w * h, "the page is (nearly) empty"
    # The stages' bands (kernel, userland) and at least six initcall levels' colors.
    def n(hexcolor):
        return count.get(tuple(int(hexcolor[i:i + 2], 16) for i in (1, 3, 5)), 0)
    assert n("#3f6fb5") > 500 and n("#3c9a5f") > 500, (n("#3f6fb5"), n("#3c9a5f"))
    levels = ["#17becf", "#9467bd", "#8c564b", "#1f77b4", "#2ca02c", "#bcbd22", "#e377c2",
              "#ff7f0e", "#d62728", "#7f7f7f"]
    drawn = [c for c in levels if n(c) > 50]
    assert len(drawn) >= 6, drawn


# --------------------------------------------------------------------------- 2. profile

def test_profile_equals_what_the_raw_events_give(graph_boot):
    rows, pairing = b.profile_rows(graph_boot["kernel"])
    want, counts = b.profile_from_raw(graph_boot["kernel"])
    print(f"\nprofile: {len(rows):,} rows from {counts['entries']:,} entries and "
          f"{counts['exits']:,} exits ({counts['calls']:,} calls, {counts['unmatched_exits']} "
          f"exits without entry, {counts['unclosed']} calls not closed)")
    assert counts["calls"] > 50_000, counts
    assert rows == want
    for k, v in counts.items():
        assert pairing[k] == v, (k, pairing, counts)
    f = graph_boot["summary"]["ftrace"]
    assert all(c["lost"] == 0 for c in f["cpus"]), f["cpus"]


def test_profile_instead_of_the_raw_events(graph_boot):
    before, lost_before = b.ftrace_counts(graph_boot["kernel"])
    rows_before, _ = b.profile_rows(graph_boot["kernel"])
    raw_bytes = b.stream_bytes(graph_boot["kernel"], "ftrace_chan")
    copy = graph_boot["tmp"] / "instead"
    shutil.copytree(graph_boot["out"], copy)
    b.boot_cli(copy, "--derive", "--ftrace-profile", "instead", "--no-chart")
    after, lost_after = b.ftrace_counts(copy / "kernel")
    graph = {"ftrace:funcgraph_entry", "ftrace:funcgraph_exit"}
    assert graph <= before.keys() and not graph & after.keys(), after
    assert after == {k: v for k, v in before.items() if k not in graph}
    assert lost_after == lost_before
    rows_after, _ = b.profile_rows(copy / "kernel")
    assert rows_after == rows_before
    kept = b.stream_bytes(copy / "kernel", "ftrace_chan")
    profile = (copy / "kernel" / "profile").stat().st_size
    graph_events = sum(before[k] for k in graph)
    print(f"\n{graph_events:,} raw graph events; ftrace streams {raw_bytes:,} bytes -> "
          f"{kept:,} without them; profile {profile:,} bytes: "
          f"{(raw_bytes - kept) / profile:.1f}x smaller than the raw graph events")
    assert profile < raw_bytes - kept
