"""Drain throughput of two builds of `ivtrace record`, side by side in one run.

For a change that must not move the drain (a refactor): the same prefill (drain.py's
profiles, their quick sizes) drained by build A and by build B in alternated order
(A B, B A, ...), so load on the shared machine falls on both. The ratio B/A of the
median events per CPU-second (the recorder's own CPU time, less sensitive to other
processes than wall time) is the figure; wall time is kept too, with the load average
of each run. On a loaded machine that ratio moves by 10 % from run to run, so each
build also drains one smaller prefill of each profile under valgrind's callgrind: the
instructions it executed, which load does not change (a VM has no hardware counters).
The traces the two builds write from that smaller prefill are compared too (same_trace.py:
stream files byte for byte, metadata and sidecar apart from this run's clock and times).

    PYTHONPATH=bench:python python3 -m harness.drain_ab --a MAIN_BIN --b BRANCH_BIN

writes bench/results/native/ab/<date>-<host>.json (the native report lists it).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import drain, results, same_trace

KEPT = ("wall_s", "cpu_s", "events_per_s", "events_per_cpu_s", "trace_MB_per_cpu_s",
        "produced", "recorded", "lost", "trace_bytes")


def tools_of(bin_dir: str) -> dict:
    return {"ivtrace": Path(bin_dir) / "ivtrace", "loadgen": Path(bin_dir) / "ivtrace-loadgen"}


def median(v: list) -> float:
    return sorted(v)[len(v) // 2]


def instructions(tools: dict, prof: dict, events: int) -> dict:
    """Instructions of `ivtrace record` draining one prefill of `prof`, per build (callgrind's
    Ir); both builds drain copies of the same region."""
    region = drain.SHM / f"ivbench-ab-{os.getpid()}.region"
    copy = drain.SHM / f"ivbench-ab-{os.getpid()}.copy"
    out = drain.SHM / f"ivbench-ab-{os.getpid()}.out"
    first = next(iter(tools.values()))
    try:
        pre = drain.loadgen_cmd(first, 0, region, events, prof["size"], prof, payload=prof["payload"])
        json.loads(drain.run_checked(pre, "prefill (ivtrace-loadgen)").stdout)
        same = same_trace.record_both({label: t["ivtrace"] for label, t in tools.items()}, region)
        counts = {}
        with tempfile.TemporaryDirectory(prefix="drain-ab-") as tmp:
            for label, t in tools.items():
                shutil.copyfile(region, copy)
                drain.cleanup(out)
                cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
                       str(t["ivtrace"]), "record", "--shm", str(copy), "-o", str(out)]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                m = re.search(r"Collected : (\d+)", r.stderr)
                if r.returncode != 0 or not m:
                    raise drain.DrainError(f"callgrind of {label}: exit {r.returncode}: {r.stderr[-500:]}")
                counts[label] = int(m.group(1))
        return {"events": events, "instructions": counts, "same_output": same}
    finally:
        drain.cleanup(region, copy, out)


def profile_ab(prof: dict, tools: dict, rounds: int, cpus: tuple[int, int]) -> dict:
    runs: dict[str, list] = {label: [] for label in tools}
    labels = list(tools)
    for i in range(rounds):
        for label in labels if i % 2 == 0 else labels[::-1]:
            r = drain.drain_once(tools[label], cpus[0], cpus[1], prof, prof["quick_events"])
            kept = {k: r[k] for k in KEPT}
            kept["loadavg"] = os.getloadavg()[0]
            runs[label].append(kept)
            print(f"drain_ab: {prof['name']} {label} round {i + 1}: "
                  f"{r['events_per_cpu_s'] / 1e6:.2f} M events per CPU-s", file=sys.stderr, flush=True)
    med = {label: median([r["events_per_cpu_s"] for r in rs]) for label, rs in runs.items()}
    ins = instructions(tools, prof, prof["quick_events"] // 8)
    counts = ins["instructions"]
    return {"name": prof["name"], "size": prof["size"], "payload": prof["payload"],
            "events": prof["quick_events"], "runs": runs,
            "median_events_per_cpu_s": med, "ratio_b_over_a": med[labels[1]] / med[labels[0]],
            "callgrind": ins, "instructions_b_over_a": counts[labels[1]] / counts[labels[0]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m harness.drain_ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="directory of build A's ivtrace and ivtrace-loadgen")
    ap.add_argument("--b", required=True, help="directory of build B's")
    ap.add_argument("--labels", default="main,branch", help="names of A and B in the results")
    ap.add_argument("--what", default="", help="the change B makes (goes into the results)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=0, help="CPU of the prefill writer")
    ap.add_argument("--drain-cpu", type=int, default=1, help="CPU of `ivtrace record`")
    ap.add_argument("-o", "--output", type=Path)
    a = ap.parse_args(argv)
    la, lb = a.labels.split(",")
    tools = {la: tools_of(a.a), lb: tools_of(a.b)}
    rec = results.new_record("native", ["ab", *(argv if argv is not None else sys.argv[1:])], False)
    rec["command"] = "PYTHONPATH=bench:python python3 -m harness.drain_ab " + " ".join(
        argv if argv is not None else sys.argv[1:])
    start = time.monotonic()
    rec["data"] = {"ab": {"what": a.what, "a": la, "b": lb, "rounds": a.rounds,
                          "loadavg_before": os.getloadavg(),
                          "profiles": [profile_ab(p, tools, a.rounds, (a.cpu, a.drain_cpu))
                                       for p in drain.PROFILES],
                          "loadavg_after": os.getloadavg()}}
    rec["duration_s"] = round(time.monotonic() - start, 1)
    path = results.write_in(rec, "ab", a.output)
    for p in rec["data"]["ab"]["profiles"]:
        same = p["callgrind"]["same_output"]
        print(f"{p['name']}: {lb}/{la} = {p['ratio_b_over_a']:.3f} (events per CPU-second, "
              f"medians of {a.rounds}); instructions {p['instructions_b_over_a']:.5f}; "
              f"traces: {same['identical']} of {same['files']} files byte-identical, "
              f"{same['same_but_clock']} equal but for clock and times, "
              f"{len(same['differ'])} differ")
    print(f"drain_ab: wrote {results.rel(path)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
