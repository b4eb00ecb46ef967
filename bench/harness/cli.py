"""bench/run PRESET [OPTIONS]: run one preset, write one results file.

Presets:
  native      per-event writer cost (ivtrace, LTTng-UST, ftrace, write(2)), the writer with
              no reader, `ivtrace record` drain throughput and live loss; on this host
  guest       ivtrace.ko against ftrace on the same tracepoints, inside one guest
  evaluation  the seeds' overhead matrix: ivtrace's tracing states against ftrace shipped
              over the network, SSH, 9p and virtio-serial, five workloads, in one guest
              (alias: eval)
  doorbell    guest -> host doorbells: rate, round trip, doorbells per MB of trace
  clocksync   the clock exchange's guest and host CPU, `ivtrace record` with against
              without it, side by side
  ftrace      the ftrace relay against ftrace to a guest file and over virtio-serial (the
              virtio-trace path): events/s carried and cost per event, block I/O and
              function tracing, in one guest
  soak        ivtrace serve for a long time (--duration): guests coming and going, a
              never-idle writer, a disk that fills; memory, descriptors, CPU sampled
  relay       1, 8 and 64 simulated guests through ivtrace serve to disk and to lttng-relayd:
              events/s, MB/s, daemon CPU per GB, memory per guest
  boot        a guest's boot traced off / with its tracepoints / with function_graph: each
              initcall level's duration and overhead, and the function profile's size

Every preset takes --quick (a short smoke run, written as *-quick.json: never cited) and
-o FILE (default bench/results/PRESET/<date>-<host>[-quick].json). A full run written to
bench/results/ is also added to bench/results/history.json. Timings are results, never
pass/fail: the exit status is 0 when everything was measured, 1 when something could not
be measured (the message says what), 2 for bad arguments or a missing prerequisite.
`bench/report` then regenerates docs/performance.md from the results files.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ivtools import ivtvm
from ivtools.relayd import RelaydError

from . import (
    BenchError,
    Prerequisite,
    boot,
    clocksync,
    doorbell,
    evaluation,
    ftrace,
    guest,
    history,
    native,
    relay,
    results,
    soak,
)

PRESETS = {m.NAME: m for m in (native, guest, evaluation, doorbell, clocksync, soak, relay,
                                  ftrace, boot)}
ALIASES = {"eval": "evaluation"}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="preset", required=True, metavar="PRESET")
    for name, mod in PRESETS.items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__,
                           aliases=[a for a, n in ALIASES.items() if n == name],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--quick", action="store_true",
                       help="a short smoke run (*-quick.json; not for quoting)")
        p.add_argument("-o", "--output", type=Path, help="results file (default "
                       f"bench/results/{name}/<date>-<host>[-quick].json)")
        mod.add_arguments(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parser().parse_args(argv)
    preset = ALIASES.get(a.preset, a.preset)
    mod = PRESETS[preset]
    rec = results.new_record(preset, argv[1:], a.quick)
    t0 = time.monotonic()
    try:
        problems = mod.run(a, rec)
    except (Prerequisite, ivtvm.VMError) as e:
        print(f"bench/run {preset}: ERROR: {e}", file=sys.stderr)
        return 2
    except (BenchError, RelaydError) as e:
        print(f"bench/run {preset}: FAILED: could not measure: {e}", file=sys.stderr)
        return 1
    rec["duration_s"] = round(time.monotonic() - t0, 1)
    path = results.write(rec, a.output or results.default_path(rec))
    print(f"bench/run {preset}: wrote {results.rel(path)} ({rec['duration_s']:.0f} s)",
          file=sys.stderr)
    if problems:
        print(f"bench/run {preset}: FAILED: could not measure:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 1
    if not a.quick and a.output is None:
        history.append(results.load(path), path)
        print(f"bench/run {preset}: added to {results.rel(history.INDEX)}; "
              "`bench/report` regenerates docs/performance.md", file=sys.stderr)
    return 0
