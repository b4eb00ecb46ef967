"""The one report writer (`bench/report`): results files -> docs/performance.md and its
plots. It reads bench/results/ and bench/results/history.json; no harness calls it."""
