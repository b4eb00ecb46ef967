#!/bin/sh
# bench/guest/ftbench.sh - runs INSIDE the guest (busybox ash), started by bench/run ftrace
# (bench/harness/ftrace.py): what it costs to get ftrace's events out of the guest, by the
# ftrace relay (ivtrace-ftrace into the ivtrace region) against the two usual ways.
#
#   ftbench.sh REPS IOS SYSCALLS BUF_KB CONFIGS LOADS
#
# CONFIGS (comma-separated) from:
#   off        nothing traces (the workload's bare score)
#   ft-ring    ftrace records into its per-CPU ring, nobody reads (overwrite): ftrace's own cost
#   ft-file    + `dd if=per_cpu/cpuN/trace_pipe_raw of=/tmp/...` per CPU (ftrace to a file)
#   ft-vserial + `dd if=per_cpu/cpuN/trace_pipe_raw of=/dev/vportXpY` per CPU: one virtio-serial
#              port per CPU to the host (the virtio-trace path)
#   ft-relay   + ivtrace-ftrace moving the pages into the region (ivtrace.ko ftrace=1 loaded
#              with events=none; `ivtrace record` drains it on the host): from the mapped
#              ring buffer where the kernel maps it (6.10+), else read(2)
#   ft-relay-read  the same relay with read(2) of trace_pipe_raw on every kernel (--read)
# LOADS from:
#   block      ftrace's block events; `dd` of IOS 4 KiB direct reads of the virtio-blk disk
#   function   the function tracer on every kernel function; SYSCALLS getppid() calls
# Per repetition and load: `off` first, then the load's events (or the function tracer) on
# and the traced configurations in an order rotated by one. Per run: ftrace's buffer emptied,
# the reader started, tracing on, the workload, tracing off, the reader drains what ftrace
# holds (up to 10 s), stops. Output: one line per run,
#   FB m rep=R config=C load=L ops=N seconds=S produced=P read=D overrun=O dropped=X bytes=B
# (P, D, O, X: ftrace's own counters of all CPUs, per_cpu/cpuN/stats; B: what the reader
# wrote: file bytes, or the relay's pages x 4096; the host counts what reached it).
REPS=${1:-3} IOS=${2:-3000} SYSCALLS=${3:-100000} BUF_KB=${4:-1024}
CONFIGS=${5:-off,ft-ring,ft-file,ft-vserial,ft-relay,ft-relay-read} LOADS=${6:-block,function}
T=/sys/kernel/tracing
W=/tmp/ftbench

die() { echo "FB error $*"; exit 1; }
[ -d $T/events/block ] || die "no tracefs block events at $T"
[ -b /dev/vda ] || die "no virtio-blk disk /dev/vda"
mkdir -p $W

now() { cut -d' ' -f1 /proc/uptime; }
stat_sum() { awk -v k="$1" -F': ' '$1 == k {s += $2} END {print s + 0}' $T/per_cpu/cpu*/stats; }

# The virtio-serial port named $1 (the host names them ivtft0, ivtft1, ...).
vport() {
	for p in /sys/class/virtio-ports/*; do
		[ "$(cat $p/name 2>/dev/null)" = "$1" ] && { echo /dev/${p##*/}; return; }
	done
	die "no virtio-serial port $1"
}

# The load's events or tracer stay on through all traced runs of a repetition: switching the
# function tracer patches every function's call site, a heavy step under TCG that once hung
# the guest's kernel (a soft lockup) between two runs.
load_on() {
	echo 0 > $T/tracing_on
	case $1 in
	block) echo 1 > $T/events/block/enable ;;
	function) echo > $T/set_ftrace_filter; echo function > $T/current_tracer ;;
	esac
}

load_off() {
	echo 0 > $T/tracing_on
	echo 0 > $T/events/block/enable
	echo nop > $T/current_tracer
}

workload() {
	case $1 in
	block) dd if=/dev/vda of=/dev/null bs=4k count=$IOS iflag=direct 2>/dev/null
	       echo $IOS ;;
	function) ivtwl syscalls $SYSCALLS > /dev/null; echo $SYSCALLS ;;
	esac
}

# One CPU's copy: dd reads with read(2), page by page, as a reader that stops must to get the
# last, partly filled page (busybox cat uses sendfile, i.e. splice, and ftrace splices whole
# pages only). ftrace's read sometimes returns 0 (end of file) while it still holds events:
# dd then ends and the loop starts another, as a reader that polls would read again.
copier() {
	while :; do dd if=$1 bs=4096 2>/dev/null || break; sleep 0.01; done
}

# (Shell functions share variables: the loops here use names of their own.)
reader_start() {
	READERS=
	case $1 in
	ft-file | ft-vserial)
		for cpudir in $T/per_cpu/cpu*; do
			n=${cpudir##*/cpu}
			if [ $1 = ft-file ]; then out=$W/cpu$n.raw; else out=$(vport ivtft$n); fi
			copier $cpudir/trace_pipe_raw > $out &
			READERS="$READERS $!"
		done ;;
	ft-relay | ft-relay-read)
		if [ "$1" = ft-relay-read ]; then
			ivtrace-ftrace --flush-ms 100 --read 2>$W/relay.log &
		else
			ivtrace-ftrace --flush-ms 100 2>$W/relay.log &
		fi
		READERS=$!
		sleep 1
		grep "pages" $W/relay.log | sed "s/^/FB info $1: /" ;;
	esac
}

# Let the reader move what ftrace still holds (entries 0), at most 10 s, then stop it.
reader_stop() {
	case $1 in off | ft-ring) return ;; esac
	i=0
	while [ "$(stat_sum entries)" != 0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	[ $i -lt 100 ] || echo "FB info $1: ftrace still holds $(stat_sum entries) events after 10 s"
	kill $READERS 2>/dev/null
	wait $READERS 2>/dev/null
	killall dd 2>/dev/null	# the copies' (the workload's ended)
}

reader_bytes() {
	case $1 in
	ft-file) cat $W/cpu*.raw | wc -c; rm -f $W/cpu*.raw ;;
	ft-relay | ft-relay-read) echo $(( $(sed -n 's/.*: \([0-9]*\) pages.*/\1/p' $W/relay.log | awk '{s += $1} END {print s + 0}') * 4096 )) ;;
	*) echo 0 ;;
	esac
}

run() { # rep config load
	r=$1 c=$2 l=$3
	echo > $T/trace
	reader_start $c
	[ $c != off ] && echo 1 > $T/tracing_on
	t0=$(now)
	ops=$(workload $l)
	t1=$(now)
	echo 0 > $T/tracing_on
	reader_stop $c
	e=$(stat_sum entries) o=$(stat_sum overrun) d=$(stat_sum "read events")
	x=$(( $(stat_sum "dropped events") + $(stat_sum "commit overrun") ))
	b=$(reader_bytes $c)
	echo "FB m rep=$r config=$c load=$l ops=$ops seconds=$(awk "BEGIN {print $t1 - $t0}") produced=$((e + o + d + x)) read=$d overrun=$o dropped=$x bytes=$b"
}

echo 0 > $T/tracing_on
echo $BUF_KB > $T/buffer_size_kb
echo "FB info kernel=$(uname -r) cpus=$(nproc) clock=$(cat $T/trace_clock) buf_kb=$BUF_KB"
for l in $(echo $LOADS | tr ',' ' '); do workload $l > /dev/null; done	# warm-up (TCG)
TRACED=$(echo "$CONFIGS" | tr ',' '\n' | grep -v '^off$')
ntr=$(echo "$TRACED" | grep -c .)
r=1
while [ $r -le "$REPS" ]; do
	# Per load: the untraced run, then the traced ones in an order rotated by one per rep.
	order=$(echo "$TRACED" | awk -v k=$(( (r - 1) % ntr )) -v n=$ntr \
		'{a[NR - 1] = $0} END {for (j = 0; j < n; j++) print a[(j + k) % n]}')
	for l in $(echo $LOADS | tr ',' ' '); do
		echo "$CONFIGS" | tr ',' '\n' | grep -qx off && run $r off $l
		load_on $l
		for c in $order; do run $r $c $l; done
		load_off
	done
	r=$((r + 1))
done
echo "FB done"
