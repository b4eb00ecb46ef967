#!/bin/sh
# bench/guest/guestbench.sh - runs INSIDE the guest (busybox ash), started by bench/run guest
# (bench/harness/guest.py): the hypertracing micro-benchmark. Four tracers record the same
# tracepoints of the same kernel under the same workloads, one at a time, in one boot.
#
#   guestbench.sh REPS CONFIGS WORKLOADS BUF_KB RATE_BUF_KB RATES RATE_SECS RATE_CONFIGS
#
# CONFIGS (comma list; per repetition in an order rotated by one):
#   off             nothing traces
#   ivt-flight      insmod ivtrace.ko events=sched,syscall mode=overwrite; nobody drains
#   ivt-stream      the same, mode=discard; `ivtrace record` drains it on the host
#   lttng-snapshot  LTTng kernel session in snapshot mode (overwrite channel), nobody reads
#   lttng-discard   LTTng kernel session, discard channel; lttng-consumerd writes /tmp
#   ft-ring         ftrace, the per-CPU ring (overwrite), nobody reads
#   ft-pipe         ftrace, ring in discard mode, one `cat trace_pipe_raw > /tmp/..` per CPU
#   perf-record     perf record -a of the same tracepoints to /tmp/perf.data
#   perf-trace      perf trace -a (syscalls decoded, plus the same tracepoints) to /tmp
# The tracepoints (ivtrace's groups sched + syscall): sched_switch, sched_wakeup,
# sched_wakeup_new, sched_process_fork/exec/exit/free, task_rename, sys_enter, sys_exit.
# LTTng: the seven sched events it has (lttng-modules 2.13 has no task_rename) and every
# system call (--syscall -a, on the same sys_enter/sys_exit tracepoints).
# WORKLOADS: getppid, pingpong, forkexec (gb-work). Every (configuration, workload) run is
# its own tracing session: set up, workload, torn down; so each trace holds one workload.
# BUF_KB: every tracer's per-CPU buffer for these runs (big enough to keep a whole run);
# RATE_BUF_KB, RATES (getppid calls/s, comma list), RATE_SECS, RATE_CONFIGS: the phase that
# finds the event rate each streaming tracer sustains before it drops.
#
# Output (console), parsed by bench/harness/guest.py:
#   GB info ... | GB calib EVH tcgcost ... | GB error ... | GB done
#   GB host recorder-start|recorder-stop|snapshot TOKEN   (the host acts; snapshot: acks)
#   GB begin rep=R config=C workload=W                     (host: sample around the run)
#   GB m rep=R config=C workload=W ops=N wall_ns=T cpu_ns=C consumer_ns=K
#   GB stat rep=R config=C workload=W KEY=VALUE...         (the tracer's own counters)
#   GB ship rep=R config=C workload=W kind=K dir=D         (trace copied to the 9p share)
#   GB rate config=C target_per_s=R achieved_per_s=A ops=N wall_ns=T consumer_ns=K lost=L
# shellcheck shell=dash  # busybox ash, which has `local` as dash does
REPS=${1:-3} CONFIGS=${2:-off,ivt-flight,ivt-stream,lttng-snapshot,lttng-discard,ft-ring,ft-pipe,perf-record,perf-trace}
WORKLOADS=${3:-getppid,pingpong,forkexec} BUF_KB=${4:-32768} RATE_BUF_KB=${5:-1024}
RATES=${6:-} RATE_SECS=${7:-4} RATE_CONFIGS=${8:-ivt-stream,lttng-discard,ft-pipe,perf-record,perf-trace}
N_GETPPID=${GB_GETPPID:-200000} N_PINGPONG=${GB_PINGPONG:-10000} N_FORKEXEC=${GB_FORKEXEC:-200}
T=/sys/kernel/tracing
KO=/lib/modules/$(uname -r)/extra/ivtrace.ko
SHARE=/mnt/host
WORK=/tmp/gb
SCHED="sched_switch sched_wakeup sched_wakeup_new sched_process_fork sched_process_exec
sched_process_exit sched_process_free"
TRACE_EVENTS=task:task_rename            # perf trace: plus every system call, decoded
for e in $SCHED; do TRACE_EVENTS=$TRACE_EVENTS,sched:$e; done
PERF_EVENTS=raw_syscalls:sys_enter,raw_syscalls:sys_exit,$TRACE_EVENTS
LTTNG_SCHED=$(echo $SCHED | tr ' ' ',')
export HOME=/root

die() { echo "GB error $*"; exit 1; }
say() { echo "GB info $*"; }
exec 3>&1   # the console, also where a command's own output goes to /dev/null
say_cmd() { [ -n "$SHOW" ] && echo "GB cmd $SHOW: $*" >&3; return 0; }  # once per config
show() { say_cmd "$@"; "$@"; }

# ---- checks ---------------------------------------------------------------------------
[ -d $T/events/raw_syscalls ] || die "no tracefs at $T"
[ -f "$KO" ] || die "no $KO"
[ -n "$IVTRACE_IVSHMEM" ] || die "no ivshmem device (IVTRACE_IVSHMEM unset)"
grep -q " $SHARE 9p " /proc/mounts || die "the 9p share is not mounted at $SHARE"
command -v lttng-sessiond > /dev/null || die "no lttng-sessiond (vm/build --all --tracers)"
command -v perf > /dev/null || die "no perf (vm/build --all --tracers)"
for e in $SCHED; do [ -f $T/events/sched/$e/enable ] || die "no ftrace event sched/$e"; done
mkdir -p $WORK /var/run /root $SHARE/acks

# ---- small helpers ----------------------------------------------------------------------
cpus() { ls -d /sys/devices/system/cpu/cpu[0-9]* | wc -l; }
pids_of() { # comm... -> pids (shell builtins only: nothing here may exec while tracing)
	local d c want
	for d in /proc/[0-9]*; do
		read -r c < "$d/comm" 2>/dev/null || continue
		for want in "$@"; do [ "$c" = "$want" ] && echo "${d#/proc/}"; done
	done
}
cpu_ns_of() { # pids... -> ns on CPU of every thread (/proc/PID/task/*/schedstat), builtins
	local s=0 p f ns rest
	for p in "$@"; do
		for f in /proc/$p/task/*/schedstat; do
			read -r ns rest < "$f" 2>/dev/null && s=$((s + ns))
		done
	done
	echo $s
}
wait_ack() { # token secs: the host creates $SHARE/acks/TOKEN when done
	local n=0
	while [ ! -e "$SHARE/acks/$1" ]; do
		n=$((n + 1))
		[ $n -gt $(($2 * 20)) ] && die "the host never acknowledged $1"
		sleep 0.05
	done
}
up() { local u rest; read -r u rest < /proc/uptime; echo "$u"; }  # builtins only
rotate() { # list k -> the list rotated left by k, one per line
	echo "$1" | tr ',' '\n' | grep . | awk -v k="$2" '{a[NR - 1] = $0; n = NR}
		END {for (j = 0; j < n; j++) print a[(j + k) % n]}'
}

# ---- ivtrace.ko ---------------------------------------------------------------------------
ivt_on() { # mode buf_kb
	show insmod "$KO" events=sched,syscall mode=$1 subbuf_size=65536 \
		nr_subbufs=$(($2 / 64)) user_channels=0 || die "insmod ivtrace mode=$1"
}
ivt_counts() { ev-helper regionstat | sed -n 's/.*events_closed=\([0-9]*\) lost=\([0-9]*\).*/events=\1 lost=\2/p'; }

# ---- LTTng ------------------------------------------------------------------------------
lttng_on() { # session mode(discard|snapshot) buf_kb outdir
	local s=$1 sub=1024
	[ "$3" -lt 8192 ] && sub=$(($3 / 4))
	if [ "$2" = snapshot ]; then
		show lttng create "$s" --snapshot --output="$4" > /dev/null || die "lttng create $s"
		show lttng enable-channel -k ch --overwrite --subbuf-size=${sub}K \
			--num-subbuf=$(($3 / sub)) -s "$s" > /dev/null || die "lttng enable-channel"
	else
		show lttng create "$s" --output="$4" > /dev/null || die "lttng create $s"
		show lttng enable-channel -k ch --discard --subbuf-size=${sub}K \
			--num-subbuf=$(($3 / sub)) -s "$s" > /dev/null || die "lttng enable-channel"
	fi
	show lttng enable-event -k -c ch -s "$s" "$LTTNG_SCHED" > /dev/null ||
		die "lttng enable-event sched"
	show lttng enable-event -k -c ch -s "$s" --syscall -a > /dev/null ||
		die "lttng enable-event syscalls"
	show lttng start "$s" > /dev/null || die "lttng start $s"
}
lttng_off() { # session mode -> "discarded=N lost_packets=N"
	local l d p
	show lttng stop "$1" > /dev/null || die "lttng stop $1"
	if [ "$2" = snapshot ]; then
		show lttng snapshot record -s "$1" > /dev/null || die "lttng snapshot record"
	fi
	l=$(lttng list "$1")
	d=$(echo "$l" | sed -n 's/.*Discarded events: *\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
	p=$(echo "$l" | sed -n 's/.*Lost packets: *\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
	show lttng destroy "$1" > /dev/null || die "lttng destroy $1"
	echo "discarded=$d lost_packets=$p"
}

# ---- ftrace -----------------------------------------------------------------------------
ft_on() { # overwrite(0|1) buf_kb [reader dir]: the readers start before tracing does
	echo 0 > $T/tracing_on
	echo "$2" > $T/buffer_size_kb
	echo "$1" > $T/options/overwrite
	echo > $T/trace
	for e in $SCHED; do echo 1 > $T/events/sched/$e/enable; done
	echo 1 > $T/events/task/task_rename/enable
	echo 1 > $T/events/raw_syscalls/sys_enter/enable
	echo 1 > $T/events/raw_syscalls/sys_exit/enable
	[ -n "$3" ] && { ft_readers "$3"; sleep 0.2; }
	echo 1 > $T/tracing_on
	say_cmd "cd $T; echo 0 > tracing_on; echo $2 > buffer_size_kb;" \
		"echo $1 > options/overwrite; echo > trace; echo 1 > events/X/enable for X in" \
		"$(echo $SCHED | sed 's,\([a-z_]*\),sched/\1,g') task/task_rename" \
		"raw_syscalls/sys_enter raw_syscalls/sys_exit;" \
		"${3:+for each CPU: cat per_cpu/cpuN/trace_pipe_raw > $3/cpuN.raw &;} echo 1 > tracing_on"
}
ft_counts() { # written = entries + overrun + read; lost = overrun + dropped
	awk '/^entries:/ {e += $2} /^overrun:/ {o += $2} /^dropped events:/ {d += $3}
	     /^read events:/ {r += $3} END {printf "events=%d lost=%d overrun=%d dropped=%d\n",
	     e + o + r, o + d, o, d}' $T/per_cpu/cpu*/stats
}
ft_off() {
	echo 0 > $T/tracing_on
	echo 0 > $T/events/enable
}
ft_readers() { # dir: one `cat trace_pipe_raw` per CPU into dir/cpuN.raw
	local cpu
	mkdir -p "$1"
	for cpu in $T/per_cpu/cpu*; do
		cat "$cpu/trace_pipe_raw" > "$1/${cpu##*/}.raw" &
	done
}
ft_drain() { # let the readers take what the ring still holds, then stop them
	local n=0 p
	while [ "$(awk '/^entries:/ {s += $2} END {print s + 0}' $T/per_cpu/cpu*/stats)" != 0 ] &&
		[ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
	sleep 0.5   # the last page read is written out
	for p in $(pids_of cat); do kill "$p" 2>/dev/null; done
	wait 2> /dev/null
}

# ---- perf -------------------------------------------------------------------------------
perf_record_on() { # buf_kb outfile: started with events disabled, enabled through --control
	rm -f $WORK/pctl $WORK/pack
	mkfifo $WORK/pctl $WORK/pack
	say_cmd perf record -q -D -1 --control fifo:$WORK/pctl,$WORK/pack -m $(($1 / 4)) -a \
		-e "$PERF_EVENTS" -o "$2"
	perf record -q -D -1 --control fifo:$WORK/pctl,$WORK/pack -m $(($1 / 4)) -a \
		-e "$PERF_EVENTS" -o "$2" 2> $WORK/perf.err &
	PERF_PID=$!
	echo enable > $WORK/pctl
	read -r ack < $WORK/pack
	[ "$ack" = ack ] || die "perf record did not acknowledge enable: $(cat $WORK/perf.err)"
}
perf_trace_on() { # buf_kb outfile: ready once its output file has grown
	local n=0
	say_cmd perf trace -a --syscalls -m $(($1 / 4)) -e "$TRACE_EVENTS" -o "$2"
	perf trace -a --syscalls -m $(($1 / 4)) -e "$TRACE_EVENTS" -o "$2" 2> $WORK/perf.err &
	PERF_PID=$!
	while [ ! -s "$2" ]; do
		n=$((n + 1))
		[ $n -gt 300 ] && die "perf trace never started: $(cat $WORK/perf.err)"
		kill -0 $PERF_PID 2>/dev/null || die "perf trace exited: $(cat $WORK/perf.err)"
		cat /proc/uptime /proc/uptime /proc/uptime > /dev/null   # system calls to print
		sleep 0.2
	done
}
wait_caught_up() { # file: perf trace prints what it has read; on SIGINT it stops reading at
	# once, so first make a system call nothing else makes and wait until it is printed
	local n=0
	gb-mark mark   # gb-work under another name: its exec is not one of the workload's
	while ! grep -q 'personality(' "$1"; do
		n=$((n + 1))
		[ $n -gt 600 ] && die "perf trace never caught up with its ring"
		sleep 0.2
	done
}
perf_off() { # config tag
	[ "$1" = perf-trace ] && wait_caught_up "$WORK/$2/trace.txt"
	kill -INT $PERF_PID
	wait $PERF_PID
	PERF_PID=
}

# ---- one configuration: on, the consumers' pids, off ----------------------------------------
# setup CONFIG TAG BUF_KB: tracer on; CONSUMERS = the pids whose CPU is the consumer's
setup() {
	local c=$1 tag=$2 buf=$3 out=$WORK/$2
	CONSUMERS=
	rm -rf "$out"
	case $c in
	off) ;;
	ivt-flight) ivt_on overwrite "$buf" ;;
	ivt-stream)
		ivt_on discard "$buf"
		echo "GB host recorder-start $tag"
		ev-helper hbwait 120 > /dev/null || die "ivtrace record never attached ($tag)" ;;
	lttng-snapshot) lttng_on "gb-$tag" snapshot "$buf" "$out"
		CONSUMERS=$(pids_of lttng-consumerd lttng-sessiond) ;;
	lttng-discard) lttng_on "gb-$tag" discard "$buf" "$out"
		CONSUMERS=$(pids_of lttng-consumerd lttng-sessiond) ;;
	ft-ring) ft_on 1 "$buf" ;;
	ft-pipe) ft_on 0 "$buf" "$out"; CONSUMERS=$(pids_of cat) ;;
	perf-record) mkdir -p "$out"; perf_record_on "$buf" "$out/perf.data"; CONSUMERS=$PERF_PID ;;
	perf-trace) mkdir -p "$out"; perf_trace_on "$buf" "$out/trace.txt"; CONSUMERS=$PERF_PID ;;
	*) die "unknown configuration $c" ;;
	esac
}

# teardown CONFIG TAG: tracer off; its counters (KEY=VALUE ...) into $WORK/stat. With SHIP
# set, a flight recorder's buffer is kept for the host to count (ivtrace: the host copies
# the region; ftrace: the ring is read out into files).
teardown() {
	local c=$1 tag=$2 out=$WORK/$2 st=$WORK/stat
	case $c in
	off) echo "events=0 lost=0" > $st ;;
	ivt-*)
		ivt_counts > $st
		if [ "$c" = ivt-flight ] && [ -n "$SHIP" ]; then
			echo "GB host snapshot $tag"
			wait_ack "$tag" 120
		fi
		rmmod ivtrace || die "rmmod ivtrace"
		[ "$c" = ivt-stream ] && echo "GB host recorder-stop $tag" ;;
	lttng-*) lttng_off "gb-$tag" "${c#lttng-}" > $st ;;
	ft-ring)
		echo 0 > $T/tracing_on
		ft_counts > $st
		[ -n "$SHIP" ] && { ft_readers "$out"; ft_drain; }
		ft_off ;;
	ft-pipe)
		echo 0 > $T/tracing_on
		ft_drain
		ft_counts > $st
		ft_off ;;
	perf-*) perf_off "$c" "$tag"; echo "perf_stderr_lines=$(grep -c . $WORK/perf.err)" > $st ;;
	esac
}

digest() { # dir -> md5 of its files' bytes, in the order of their sorted paths: the host
	# computes the same over its copy, so a trace damaged on the way (9p) is caught, not counted
	(cd "$1" && find . -type f | sort | xargs cat | md5sum | cut -d' ' -f1)
}
ship() { # config tag rep workload: the trace to the host's share, then gone from here
	local c=$1 tag=$2 out=$WORK/$2 kind md5=
	case $c in off | ivt-stream) return ;; ivt-flight) kind=ivtrace-snapshot ;;
	lttng-*) kind=ctf ;; ft-*) kind=ftrace-raw ;; perf-record) kind=perf-data ;;
	perf-trace) kind=perf-trace ;; esac
	if [ "$c" != ivt-flight ]; then
		mkdir -p "$SHARE/runs/$tag"
		cp -r "$out"/. "$SHARE/runs/$tag/" || die "copying $out to the share failed"
		md5="md5=$(digest "$out")"
	fi
	rm -rf "$out"
	echo "GB ship rep=$3 config=$c workload=$4 kind=$kind dir=runs/$tag $md5 up=$(up)"
}

# ---- one run: CONFIG REP WORKLOAD --------------------------------------------------------
workload() {
	case $1 in
	getppid) gb-work getppid "$N_GETPPID" ;;
	pingpong) gb-work pingpong "$N_PINGPONG" ;;
	forkexec) gb-work forkexec "$N_FORKEXEC" /usr/local/bin/gb-work ;;
	*) die "unknown workload $1" ;;
	esac
}

run_one() {
	local c=$1 r=$2 w=$3 tag=$1-r$2-$3 k0 k1 res
	SHOW=
	case "$SHOWN" in *" $c "*) ;; *) SHOW=$c SHOWN="$SHOWN $c " ;; esac
	echo "GB info run $tag setup up=$(up)"
	setup "$c" "$tag" "$BUF_KB"
	k0=$(cpu_ns_of $CONSUMERS)
	echo "GB begin rep=$r config=$c workload=$w up=$(up)"
	res=$(workload "$w") || die "$w failed under $c (rep $r): $res"
	k1=$(cpu_ns_of $CONSUMERS)
	echo "GB m rep=$r config=$c workload=$w ${res#GBW workload=$w } consumer_ns=$((k1 - k0)) up=$(up)"
	SHIP=1
	teardown "$c" "$tag"
	echo "GB stat rep=$r config=$c workload=$w $(cat $WORK/stat) up=$(up)"
	ship "$c" "$tag" "$r" "$w"
	SHOW=
}

# ---- the rate phase: CONFIG RATE -------------------------------------------------------------
rate_lost() { # config tag: events the tracer dropped
	case $1 in
	perf-record) # samples lost per event (lines without %), plus PERF_RECORD_LOST records
		# (each stands for one or more lost events: a lower bound, enough to see a drop)
		perf report -i "$WORK/$2/perf.data" --stats 2>/dev/null | awk '
			/^ *LOST_SAMPLES events:/ && !/%/ {s += $3}
			/^ *LOST events:/ && !r {r = $3} END {print s + r}' ;;
	perf-trace) grep -o 'LOST [0-9]* events' "$WORK/$2/trace.txt" | awk '{s += $2} END {print s + 0}' ;;
	lttng-*) sed -n 's/.*discarded=\([0-9]*\).*/\1/p' $WORK/stat ;;
	*) sed -n 's/.*lost=\([0-9]*\).*/\1/p' $WORK/stat ;;
	esac
}

rate_one() {
	local c=$1 rate=$2 tag=rate-$1-$2 k0 k1 res lost
	setup "$c" "$tag" "$RATE_BUF_KB"
	k0=$(cpu_ns_of $CONSUMERS)
	echo "GB begin rep=0 config=$c workload=rate-$rate"
	res=$(gb-work rate "$rate" "$RATE_SECS") || die "gb-work rate $rate failed under $c"
	k1=$(cpu_ns_of $CONSUMERS)
	SHIP=
	teardown "$c" "$tag"
	lost=$(rate_lost "$c" "$tag")
	rm -rf "${WORK:?}/$tag"
	echo "GB rate config=$c ${res#GBW workload=rate } consumer_ns=$((k1 - k0)) lost=${lost:-0} $(cat $WORK/stat)"
}

# ---- the run ------------------------------------------------------------------------------
lttng-sessiond --daemonize --kmod-probes=sched || die "lttng-sessiond did not start"
say "kernel=$(uname -r) cpus=$(cpus) mem_kb=$(awk '/MemTotal/ {print $2}' /proc/meminfo)" \
	"clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)" \
	"trace_clock=$(sed 's/.*\[\(.*\)\].*/\1/' $T/trace_clock) buf_kb=$BUF_KB" \
	"lttng=\"$(lttng --version | head -1)\" perf=\"$(perf --version)\"" \
	"lttng_modules=\"$(cat /sys/module/lttng_tracer/version 2>/dev/null)\""
ids=
for e in $SCHED; do ids="$ids $e=$(cat $T/events/sched/$e/id)"; done
say "ftrace_ids$ids task_rename=$(cat $T/events/task/task_rename/id)" \
	"sys_enter=$(cat $T/events/raw_syscalls/sys_enter/id) sys_exit=$(cat $T/events/raw_syscalls/sys_exit/id)"
for w in $(echo "$WORKLOADS" | tr ',' ' '); do # warm-up: TCG translates code on first use
	workload "$w" > /dev/null || die "warm-up $w failed"
done
echo "GB calib $(ev-helper tcgcost)"
say "workloads getppid=\"gb-work getppid $N_GETPPID\" pingpong=\"gb-work pingpong $N_PINGPONG\"" \
	"forkexec=\"gb-work forkexec $N_FORKEXEC /usr/local/bin/gb-work\"" \
	"rate=\"gb-work rate CALLS_PER_S $RATE_SECS\""

r=1
while [ $r -le "$REPS" ]; do
	for c in $(rotate "$CONFIGS" $((r - 1))); do
		for w in $(rotate "$WORKLOADS" $((r - 1))); do
			run_one "$c" $r "$w"
		done
	done
	r=$((r + 1))
done
i=0
for rate in $(echo "$RATES" | tr ',' ' '); do
	for c in $(rotate "$RATE_CONFIGS" $i); do
		rate_one "$c" "$rate"
	done
	i=$((i + 1))
done
echo "GB done"
