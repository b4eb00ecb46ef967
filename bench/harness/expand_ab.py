"""The kernel stream's expansion by two builds of ivtrace, side by side in one run.

The drain stages a guest's kernel packets as they come (DIR/.kernel-wire) and expands them
into DIR/kernel/ when the recording ends (docs/abi.md "What the host writes"): a change to
the expansion (the nanosecond clock, docs/ctf.md "Time") costs there, not in the drain
(harness.drain_ab). This measures it on a real guest's staged kernel trace: a recording
whose recorder was killed (SIGKILL) while the guest ran, so its kernel stream is still
staged. Build A and build B each run `ivtrace recover` on a fresh copy of it, in alternated
order (A B, B A, ...), pinned to one CPU: the expansion's own seconds and events per second
(the sidecar's `kernel_expansion`), and the recover process's CPU time. Then each build
recovers one copy under valgrind's callgrind: the instructions it executed, which load on
the shared machine does not change.

    PYTHONPATH=bench:python python3 -m harness.expand_ab --a MAIN_BIN --b BRANCH_BIN --staged DIR

writes bench/results/native/expand_ab/<date>-<host>.json (the native report lists it).
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

from harness import drain, results


def median(v: list) -> float:
    return sorted(v)[len(v) // 2]


def fresh_copy(staged: Path, tmp: Path) -> Path:
    """A copy of the staged recording that `recover` may change."""
    out = tmp / "rec"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(staged, out, symlinks=True)
    return out


def recover_once(ivtrace: Path, staged: Path, tmp: Path, cpu: int) -> dict:
    """One `ivtrace recover` of a fresh copy: what the expansion reports and the CPU time."""
    d = fresh_copy(staged, tmp)
    _, wall, cpu_s = drain.run_timed(["taskset", "-c", str(cpu), ivtrace, "recover", d],
                                     "ivtrace recover")
    x = json.loads((d / "ivtrace.json").read_text())["kernel_expansion"]
    return {"events": x["events"], "seconds": x["seconds"], "events_per_s": x["events_per_s"],
            "bytes_in": x["bytes_in"], "bytes_out": x["bytes_out"], "wall_s": wall,
            "cpu_s": cpu_s, "loadavg": os.getloadavg()[0]}


def instructions(ivtrace: Path, staged: Path, tmp: Path) -> int:
    """Instructions of one `ivtrace recover` (callgrind's Ir)."""
    d = fresh_copy(staged, tmp)
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
           str(ivtrace), "recover", str(d)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    m = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode != 0 or not m:
        raise drain.DrainError(f"callgrind of {ivtrace}: exit {r.returncode}: {r.stderr[-500:]}")
    return int(m.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m harness.expand_ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="directory of build A's ivtrace")
    ap.add_argument("--b", required=True, help="directory of build B's")
    ap.add_argument("--staged", required=True, type=Path,
                    help="a recording whose kernel stream is staged (DIR/.kernel-wire)")
    ap.add_argument("--labels", default="main,branch", help="names of A and B in the results")
    ap.add_argument("--what", default="", help="the change B makes (goes into the results)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=1, help="CPU of `ivtrace recover`")
    ap.add_argument("-o", "--output", type=Path)
    args = argv if argv is not None else sys.argv[1:]
    a = ap.parse_args(args)
    if not (a.staged / ".kernel-wire").is_dir():
        ap.error(f"{a.staged}: no .kernel-wire/ (kill the recorder while the guest runs)")
    la, lb = a.labels.split(",")
    bins = {la: Path(a.a) / "ivtrace", lb: Path(a.b) / "ivtrace"}
    rec = results.new_record("native", ["ab", "expand", *args], False)
    rec["command"] = "PYTHONPATH=bench:python python3 -m harness.expand_ab " + " ".join(args)
    start = time.monotonic()
    runs: dict[str, list] = {la: [], lb: []}
    before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="expand-ab-", dir="/var/tmp") as tmp:
        for i in range(a.rounds):
            for label in (la, lb) if i % 2 == 0 else (lb, la):
                r = recover_once(bins[label], a.staged, Path(tmp), a.cpu)
                runs[label].append(r)
                print(f"expand_ab: {label} round {i + 1}: {r['events_per_s'] / 1e6:.2f} M events/s",
                      file=sys.stderr, flush=True)
        counts = {label: instructions(b, a.staged, Path(tmp)) for label, b in bins.items()}
    med = {k: median([r["events_per_s"] for r in v]) for k, v in runs.items()}
    cpu = {k: median([r["cpu_s"] for r in v]) for k, v in runs.items()}
    rec["data"] = {"ab": {"what": a.what, "a": la, "b": lb, "rounds": a.rounds,
                          "staged": str(a.staged), "loadavg_before": before,
                          "loadavg_after": os.getloadavg(), "runs": runs,
                          "median_events_per_s": med, "median_cpu_s": cpu,
                          "ratio_b_over_a": med[lb] / med[la],
                          "instructions": counts,
                          "instructions_b_over_a": counts[lb] / counts[la]}}
    rec["duration_s"] = round(time.monotonic() - start, 1)
    path = results.write_in(rec, "expand_ab", a.output)
    events = runs[la][0]["events"]
    print(f"expansion of {events:,} kernel events: {lb}/{la} = {med[lb] / med[la]:.3f} "
          f"(events per second, medians of {a.rounds}); recover CPU {cpu[la]:.3f} s / "
          f"{cpu[lb]:.3f} s; instructions {counts[lb] / counts[la]:.4f}")
    print(f"expand_ab: wrote {results.rel(path)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
