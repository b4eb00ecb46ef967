#!/usr/bin/env python3
# /// script
# dependencies = ["matplotlib"]
# ///
"""Per-event writer cost of every tracer in one bench/results/*.json, as a bar chart.

    /usr/bin/python3 bench/plot.py [RESULTS.json] [-o FILE.png]

Bars: p50 (16-event groups) and p99 (single events), ns per event, log scale.
Default input: the newest full run; default output: next to it, same name, .png.
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from report import LABELS, bench_map, pick_results, row_numbers  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    src = pick_results(args.results)
    res = json.loads(src.read_text())
    rows = [(LABELS.get(n, n), row_numbers(b)) for n, b in bench_map(res["native"]).items()
            if n != "empty"]
    rows.sort(key=lambda r: r[1]["g50"])

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [max(r[1]["g50"], 0.1) for r in rows], height=0.4,
            label="p50 (16-event groups)")
    ax.barh([i - 0.2 for i in y], [max(r[1]["p99"], 0.1) for r in rows], height=0.4,
            label="p99 (single events)")
    ax.set_yticks(list(y), [r[0] for r in rows], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("ns per event (net of timing overhead), log scale")
    ax.set_title(f"Per-event writer cost, 4 x u64 payload, one run ({res['date'][:16]})",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    out = Path(args.output) if args.output else src.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"plot: wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
