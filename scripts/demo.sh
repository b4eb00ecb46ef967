#!/usr/bin/env bash
# scripts/demo.sh - the loopback demo: a program writes trace events into a
# /dev/shm region, `ivtrace record` drains it into a CTF trace, `ivtrace report`
# summarizes it. No VM needed; the guest demo is vm/demo.
set -euo pipefail
cd "$(dirname "$0")/.."

SHM=/dev/shm/ivtrace-demo-$$
OUT=${IVTRACE_DEMO_OUT:-out/demo-loopback}
trap 'rm -f "$SHM"; [ -n "${REC:-}" ] && kill "$REC" 2>/dev/null || true' EXIT

rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
echo "== recording $SHM into $OUT"
bin/ivtrace record --shm "$SHM" -o "$OUT" &
REC=$!
bin/ivtrace-loadgen --shm "$SHM" --events 1000000 --threads 2 --size 1-256 --rate 500000
wait "$REC"; REC=

echo
echo "== report"
bin/ivtrace report "$OUT"

cat <<EOF

The trace is in $OUT (CTF 1.8). Open it with:
  babeltrace2 $OUT | head           # text, one event per line
  babeltrace2 $OUT -c sink.utils.counter
  Trace Compass: File > Open Trace..., select $OUT/user/metadata
EOF
