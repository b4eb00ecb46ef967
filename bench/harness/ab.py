"""A change's drain against an earlier binary's, in one run (bench/results/ab/README.md).

    PYTHONPATH=bench:python /usr/bin/python3 -m harness.ab --before OLD/ivtrace \\
        --after bin/ivtrace --change "issue 25: sinks" [--pairs 7] [--profile small]

Per pair: one prefill (drain.py's profile, ivtrace-loadgen, no reader), copied, then
`ivtrace record` of each binary drains its own copy (the same packets), in turn and
alternating which goes first. The ratio after/before is taken pair by pair, of the
recorder's CPU time (wait4: user + system) and of its wall time; the file goes to
bench/results/ab/. A measurement, never a pass/fail check.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import sys

from . import drain
from .drain import SHM, cleanup, loadgen_cmd, record_cmd, run_checked, run_timed
from .hostload import loadavg
from .results import RESULTS, ROOT


def one_pair(tools: dict, binaries: dict, prof: dict, events: int, first: str) -> dict:
    """Both binaries draining copies of one prefill; returns {name: (wall, cpu)}."""
    base = SHM / f"ivbench-ab-{os.getpid()}"
    region = base.with_suffix(".region")
    copies = {n: SHM / f"ivbench-ab-{os.getpid()}-{n}.region" for n in binaries}
    outs = {n: SHM / f"ivbench-ab-{os.getpid()}-{n}.out" for n in binaries}
    try:
        run_checked(loadgen_cmd(tools, "0", region, events, prof["size"], prof,
                                payload=prof["payload"]), "prefill (ivtrace-loadgen)")
        order = sorted(binaries, key=lambda n: n != first)
        for n in order:
            shutil.copyfile(region, copies[n])
        times = {}
        for n in order:
            cmd = record_cmd({**tools, "ivtrace": binaries[n]}, "1", copies[n], outs[n])
            _, wall, cpu = run_timed(cmd, f"ivtrace record ({n})")
            times[n] = (wall, cpu)
        return times
    finally:
        cleanup(region, *copies.values(), *outs.values())


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="harness.ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the earlier ivtrace binary")
    ap.add_argument("--after", required=True, help="the changed ivtrace binary")
    ap.add_argument("--change", required=True, help="what the change is (for the page)")
    ap.add_argument("--loadgen", default=str(ROOT / "bin" / "ivtrace-loadgen"))
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--profile", default="small", choices=[p["name"] for p in drain.PROFILES])
    ap.add_argument("--events", type=int, help="default: the profile's quick size")
    args = ap.parse_args(argv)
    prof = next(p for p in drain.PROFILES if p["name"] == args.profile)
    events = args.events or prof["quick_events"]
    tools = {"loadgen": args.loadgen}
    binaries = {"before": args.before, "after": args.after}
    load_before = loadavg()
    pairs = [one_pair(tools, binaries, prof, events, "before" if i % 2 == 0 else "after")
             for i in range(args.pairs)]
    cpu = [p["after"][1] / p["before"][1] for p in pairs]
    wall = [p["after"][0] / p["before"][0] for p in pairs]
    now = datetime.datetime.now(datetime.UTC)
    rec = {
        "change": args.change,
        "what": f"`ivtrace record` draining {events:,} {prof['name']} events "
                f"({prof['size']} B {prof['payload']}), recorder CPU time after/before "
                f"(wall time: {statistics.median(wall):.3f})",
        "pairs": args.pairs, "ratio": spread(cpu), "wall_ratio": spread(wall),
        "runs": pairs, "load": f"loadavg {load_before} before, {loadavg()} after",
        "command": "PYTHONPATH=bench:python /usr/bin/python3 -m harness.ab "
                   + shlex.join(a for a in (argv if argv is not None else sys.argv[1:])),
        "date": now.isoformat(timespec="seconds"),
    }
    out = RESULTS / "ab" / f"{now:%Y-%m-%dT%H%M%S}-drain.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"{out}: CPU after/before {rec['ratio']}, wall {rec['wall_ratio']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
