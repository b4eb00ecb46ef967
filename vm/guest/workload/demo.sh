#!/bin/sh
# /workload/demo.sh [SECONDS] - about SECONDS (default 10) of ordinary activity in the
# ivtrace demo guest (busybox ash), for `make demo` and the in-guest benchmark:
#   - processes with known names: three forked children named db-writer, web-worker and
#     cache-sweeper (ivtwl kids: the name is theirs from the fork on), and per round two
#     exec'd workers, compress-job and report-gen (copies of ivtwl: exec names them);
#   - file work in tmpfs: dd from /dev/urandom, a text file, tar + gzip + gunzip of ~2 MB,
#     sha256sum, each busybox applet a process of its own;
#   - user-space events through /dev/ivtrace: ivtrace-loadgen-static, 2 threads, paced;
#   - kernel log markers (printk), "ivtrace-demo: ...", at each phase.
# Needs ivtrace.ko loaded (for /dev/ivtrace) and ivtwl + ivtrace-loadgen-static on PATH.
# Prints "workload: ..." progress lines; exit 0, or 1 if a step failed.
SECS=${1:-${WORKLOAD_SECONDS:-10}}
W=/tmp/workload
RC=0

# `quiet` keeps notice-level lines off the consoles; ivtrace's printk console is one of them.
dmesg -n 7
say() {
	echo "workload: $*"
	echo "<5>ivtrace-demo: $*" > /dev/kmsg
}
fail() {
	echo "workload: FAILED: $*"
	RC=1
}
uptime_s() { cut -d. -f1 /proc/uptime; }

rm -rf "$W" && mkdir -p "$W" || exit 1
say "start, $SECS s of processes, files and user events"
start=$(uptime_s)

# User-space events for most of the run (2 threads x 1000 events/s, 16-128 payload bytes).
LGN=$(( (SECS - 2) * 1000 ))
[ "$LGN" -ge 1000 ] || LGN=1000
if [ -c /dev/ivtrace ]; then
	ivtrace-loadgen-static --shm /dev/ivtrace --events "$LGN" --threads 2 --rate 1000 \
		--size 16-128 > "$W/loadgen.out" 2>&1 &
	LG=$!
else
	fail "/dev/ivtrace missing: is ivtrace.ko loaded?"
	LG=
fi

# Long-lived named children, forked (their names are in sched_process_fork).
ivtwl kids --ms $(( (SECS - 2) * 1000 )) db-writer web-worker cache-sweeper > "$W/kids.out" &
KIDS=$!

# Short-lived exec'd workers, named by their file names.
for n in compress-job report-gen; do
	cp /usr/local/bin/ivtwl "$W/$n" || fail "cp ivtwl"
done

round=0
while [ $(( $(uptime_s) - start )) -lt $(( SECS - 2 )) ]; do
	round=$((round + 1))
	"$W/compress-job" spin 300 &
	j1=$!
	"$W/report-gen" spin 200 &
	j2=$!
	dd if=/dev/urandom of="$W/random.bin" bs=64k count=16 2>/dev/null || fail "dd"
	seq 1 100000 > "$W/numbers.txt" || fail "seq"
	tar -cf "$W/archive.tar" -C "$W" random.bin numbers.txt || fail "tar"
	gzip -f -1 "$W/archive.tar" || fail "gzip"
	gunzip -c "$W/archive.tar.gz" | tar -xf - -C "$W" -O > /dev/null || fail "gunzip | tar -x"
	sha256sum "$W/archive.tar.gz" "$W/numbers.txt" > "$W/sums" || fail "sha256sum"
	wait "$j1" "$j2" || fail "workers"
	rm -f "$W/archive.tar.gz"
	say "round $round: dd, tar, gzip, gunzip, sha256sum, compress-job, report-gen"
done

wait "$KIDS" || fail "ivtwl kids"
sed 's/^/workload: /' "$W/kids.out"
if [ -n "$LG" ]; then
	wait "$LG" || fail "ivtrace-loadgen-static"
	grep -E '^total|^region drops' "$W/loadgen.out" | sed 's/^/workload: loadgen /'
fi
say "done after $round rounds, $(( $(uptime_s) - start )) s"
rm -rf "$W"
exit $RC
