"""The page's plots, drawn from results files (matplotlib, Agg): the native per-event bar
chart here; the evaluation's two panels are in evaluation.py. A plot is written only when
its bytes change, so regenerating the page leaves an unchanged plot untouched."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from harness.stats import bench_map, row_numbers

from .native import LABELS


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None (the page is written without plots)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib is not installed: no plots", file=sys.stderr)
        return None
    matplotlib.rcParams["svg.hashsalt"] = "ivtrace"
    return plt


def save(fig, plt, png: Path, dpi: int) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    data = buf.getvalue()
    if not png.is_file() or png.read_bytes() != data:
        png.write_bytes(data)
    return png


def native(rec: dict, png: Path) -> Path | None:
    """Bars: p50 (16-event groups) and p99 (single events), ns per event, log scale."""
    plt = pyplot()
    if plt is None:
        return None
    rows = [(LABELS.get(n, n), row_numbers(b)) for n, b in
            bench_map(rec["data"]["native"]).items() if n != "empty"]
    rows.sort(key=lambda r: r[1]["g50"])
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [max(r[1]["g50"], 0.1) for r in rows], height=0.4,
            label="p50 (16-event groups)")
    ax.barh([i - 0.2 for i in y], [max(r[1]["p99"], 0.1) for r in rows], height=0.4,
            label="p99 (single events)")
    ax.set_yticks(list(y), [r[0] for r in rows], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("ns per event (net of timing overhead), log scale")
    ax.set_title(f"Per-event writer cost, 4 x u64 payload, one run ({rec['date'][:16]})",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    return save(fig, plt, png, 110)
