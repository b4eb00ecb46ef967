"""The one report writer (`bench/report`): results files -> docs/performance.md and its
plots. It reads bench/results/ and bench/results/history.json; no harness calls it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness (results, stats)
