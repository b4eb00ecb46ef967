#!/bin/sh
# bench/guest/guestbench.sh - runs INSIDE the demo guest (busybox ash), started by
# bench/run guest (bench/harness/guest.py): the cost of ivtrace.ko's probes against ftrace recording the same
# tracepoints, on the same guest kernel, in one boot.
#
#   guestbench.sh REPS SYSCALLS FORKS CPU_ITERS INNER BUF_KB CONFIGS
#
# CONFIGS (comma-separated) from: off ivtrace ftrace ivtrace-kmem ftrace-kmem
#   off            nothing traces
#   ivtrace        insmod ivtrace.ko events=sched,irq,timer,syscall mode=overwrite
#   ftrace         the same tracepoints enabled in tracefs (top instance), tracing_on
#   *-kmem         the same plus kmem (kmalloc, kfree, mm_page_alloc, mm_page_free)
# Both tracers only record into a per-CPU ring of BUF_KB KiB in overwrite mode (flight
# recorder): nobody reads during the measurement, nothing is dropped.
# Per repetition the configurations run in a rotated order; in each, every workload runs
# INNER times (ivtwl syscalls / forkexec / cpu). Output: one line per measurement,
#   GB m rep=R config=C workload=W i=I ns_per_op=X events=E
# (E: events the tracer recorded during that run: ftrace entries+overrun, ivtrace
# events_closed deltas), plus GB info lines.
REPS=${1:-3} SYSCALLS=${2:-300000} FORKS=${3:-300} CPU_ITERS=${4:-20000000} INNER=${5:-3}
BUF_KB=${6:-512} CONFIGS=${7:-off,ivtrace,ftrace,ivtrace-kmem,ftrace-kmem}
T=/sys/kernel/tracing
KO=/lib/modules/$(uname -r)/extra/ivtrace.ko
IVT_SUBBUFS=$((BUF_KB / 64))
EV_BASE="sched/sched_switch sched/sched_wakeup sched/sched_wakeup_new sched/sched_process_fork
sched/sched_process_exec sched/sched_process_exit sched/sched_process_free task/task_rename
irq/irq_handler_entry irq/irq_handler_exit irq/softirq_entry irq/softirq_exit
timer/hrtimer_expire_entry timer/hrtimer_expire_exit raw_syscalls/sys_enter raw_syscalls/sys_exit"
EV_KMEM="kmem/kmalloc kmem/kfree kmem/mm_page_alloc kmem/mm_page_free"

die() { echo "GB error $*"; exit 1; }
[ -d $T/events ] || die "no tracefs at $T"
[ -f "$KO" ] || die "no $KO"
for e in $EV_BASE $EV_KMEM; do [ -f $T/events/$e/enable ] || die "no ftrace event $e"; done

ftrace_events() { # total written since the last clear: entries + overrun, all CPUs
	awk '/^entries:/ {s += $2} /^overrun:/ {s += $2} END {print s + 0}' $T/per_cpu/cpu*/stats
}
ivtrace_events() {
	ivtwl regionstat | sed -n 's/.*events_closed=\([0-9]*\).*/\1/p'
}
events_now() {
	case $1 in
	off) echo 0 ;;
	ivtrace*) ivtrace_events ;;
	ftrace*) ftrace_events ;;
	esac
}

setup() {
	case $1 in
	off) ;;
	ivtrace) insmod "$KO" events=sched,irq,timer,syscall mode=overwrite nr_subbufs=$IVT_SUBBUFS \
		|| die "insmod ivtrace" ;;
	ivtrace-kmem) insmod "$KO" events=sched,irq,timer,syscall,kmem mode=overwrite \
		nr_subbufs=$IVT_SUBBUFS || die "insmod ivtrace" ;;
	ftrace | ftrace-kmem)
		echo 0 > $T/tracing_on
		echo $BUF_KB > $T/buffer_size_kb
		echo 1 > $T/options/overwrite
		echo > $T/trace
		for e in $EV_BASE; do echo 1 > $T/events/$e/enable; done
		if [ "$1" = ftrace-kmem ]; then
			for e in $EV_KMEM; do echo 1 > $T/events/$e/enable; done
		fi
		echo 1 > $T/tracing_on ;;
	*) die "unknown config $1" ;;
	esac
}

teardown() {
	case $1 in
	ivtrace*)
		echo "GB info config=$1 $(ivtwl regionstat)"
		rmmod ivtrace || die "rmmod ivtrace" ;;
	ftrace*)
		echo 0 > $T/tracing_on
		for e in $EV_BASE $EV_KMEM; do echo 0 > $T/events/$e/enable; done
		echo "GB info config=$1 ftrace_events=$(ftrace_events) dropped=$(awk '/^dropped events:/ {s += $3} END {print s + 0}' $T/per_cpu/cpu*/stats)"
		echo > $T/trace ;;
	esac
}

measure() { # config rep workload i command...
	c=$1 r=$2 w=$3 i=$4
	shift 4
	e0=$(events_now "$c")
	out=$("$@") || die "$* failed"
	e1=$(events_now "$c")
	ns=$(echo "$out" | sed -n 's/.*ns_per_op=\([0-9.]*\).*/\1/p')
	echo "GB m rep=$r config=$c workload=$w i=$i ns_per_op=$ns events=$((e1 - e0))"
}

echo "GB info kernel=$(uname -r) cpus=$(nproc) tracefs_clock=$(cat $T/trace_clock) buf_kb=$BUF_KB"
ncfg=$(echo "$CONFIGS" | tr ',' '\n' | grep -c .)
r=1
while [ $r -le "$REPS" ]; do
	# rotate the order by one each repetition
	order=$(echo "$CONFIGS" | tr ',' '\n' | awk -v k=$(( (r - 1) % ncfg )) -v n=$ncfg \
		'{a[NR - 1] = $0} END {for (j = 0; j < n; j++) print a[(j + k) % n]}')
	for c in $order; do
		setup "$c"
		echo "GB info rep=$r config=$c ready"
		i=1
		while [ $i -le "$INNER" ]; do
			measure "$c" $r syscall $i ivtwl syscalls "$SYSCALLS"
			measure "$c" $r forkexec $i ivtwl forkexec "$FORKS" /usr/local/bin/ivtwl nop
			measure "$c" $r cpu $i ivtwl cpu "$CPU_ITERS"
			i=$((i + 1))
		done
		teardown "$c"
	done
	r=$((r + 1))
done
echo "GB done"
