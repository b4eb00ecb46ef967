#!/bin/sh
# bench/guest/evalguest.sh - runs INSIDE the guest (busybox ash), started by
# bench/run evaluation (bench/harness/evaluation.py) through fw_cfg. One boot measures every configuration.
#
#   evalguest.sh REPS SECS WORKLOADS CONFIGS PORT BUF_KB WARM_SECS
#
# WORKLOADS: comma list of int,syscall,tar,gzip,forkexec (bench/guest/workloads)
# CONFIGS:   comma list of
#   bare        nothing traces (no module; every device present, idle)
#   ivt-idle    ivtrace.ko loaded, events=none
#   ivt-flight  ivtrace.ko, the event load, mode=overwrite, nobody draining
#   ivt-stream  ivtrace.ko, the event load, mode=discard, `ivtrace record` on the host
#   ft-flight   ftrace, the same tracepoints, its own ring (overwrite), nobody reading
#   ft-net      ftrace, `cat trace_pipe | nc 10.0.2.2 PORT` (virtio-net, user networking)
#   ft-ssh      ftrace, the host runs `ssh guest cat trace_pipe > file` (dropbear here)
#   ft-9p       ftrace, `cat trace_pipe > /mnt/host/FILE` (virtio-9p share)
#   ft-vserial  ftrace, `cat trace_pipe > /dev/vportNpM` (virtio-serial port to a host socket)
# The event load (ivtrace groups sched,irq,timer,kmem = these 18 ftrace events):
#   sched_switch sched_wakeup sched_wakeup_new sched_process_fork sched_process_exec
#   sched_process_exit sched_process_free task_rename irq_handler_entry irq_handler_exit
#   softirq_entry softirq_exit hrtimer_expire_entry hrtimer_expire_exit kmalloc kfree
#   mm_page_alloc mm_page_free
# Both tracers get a per-CPU ring of BUF_KB KiB.
#
# Per repetition the configurations run in an order rotated by one, and the workloads
# too. Output (console), parsed by run.py:
#   EV begin rep=R config=C workload=W    (host: sample its counters; the workload starts)
#   EV m rep=R config=C workload=W score=S unit=U ops=N elapsed=E events=EV lost=L
#   EV host-start KIND config=C rep=R     (host: start the recorder / the ssh reader)
#   EV host-stop KIND config=C rep=R      (host: collect it)
#   EV stat config=C rep=R ...            (tracer counters after the configuration)
#   EV calib EVH tcgcost ...             (rdtsc, store, load, clock_gettime, getppid costs)
#   EV info ... | EV warm ... | EV error ... | EV done
# shellcheck disable=SC2046  # `set -- $(counts ...)` splits the counts into $1 $2 on purpose
REPS=${1:-3} SECS=${2:-10} WORKLOADS=${3:-int,syscall,tar,gzip,forkexec}
CONFIGS=${4:-bare,ivt-idle,ivt-flight,ivt-stream,ft-flight,ft-net,ft-9p,ft-vserial}
PORT=${5:-0} BUF_KB=${6:-4096} WARM=${7:-2}
T=/sys/kernel/tracing
KO=/lib/modules/$(uname -r)/extra/ivtrace.ko
HOSTIP=10.0.2.2
SHARE=/mnt/host
VPORT_NAME=org.ivtrace.eval.trace
IVT_GROUPS=sched,irq,timer,kmem
EVENTS="sched/sched_switch sched/sched_wakeup sched/sched_wakeup_new sched/sched_process_fork
sched/sched_process_exec sched/sched_process_exit sched/sched_process_free task/task_rename
irq/irq_handler_entry irq/irq_handler_exit irq/softirq_entry irq/softirq_exit
timer/hrtimer_expire_entry timer/hrtimer_expire_exit
kmem/kmalloc kmem/kfree kmem/mm_page_alloc kmem/mm_page_free"
IVT_OPTS="subbuf_size=65536 nr_subbufs=$((BUF_KB / 64)) user_channels=0"

die() { echo "EV error $*"; exit 1; }

# ---- checks: every transport present, or fail loudly ----------------------------------
need() { # config-substring what test...
	case ",$CONFIGS," in *",$1"*) shift; w=$1; shift; "$@" || die "$w" ;; esac
}
[ -d $T/events ] || die "no tracefs at $T"
for e in $EVENTS; do [ -f $T/events/$e/enable ] || die "no ftrace event $e"; done
need ivt "no $KO" [ -f "$KO" ]
need ivt "no ivshmem device (IVTRACE_IVSHMEM unset)" [ -n "$IVTRACE_IVSHMEM" ]
need ft-9p "9p share not mounted at $SHARE" grep -q " $SHARE 9p " /proc/mounts
VPORT=
for p in /sys/class/virtio-ports/*; do
	[ "$(cat "$p/name" 2>/dev/null)" = $VPORT_NAME ] && VPORT=/dev/${p##*/}
done
need ft-vserial "no virtio-serial port named $VPORT_NAME" [ -c "$VPORT" ]
IP=$(ip -4 -o addr show eth0 2>/dev/null | awk '{print $4}')
need ft-net "eth0 has no address (user networking)" [ -n "$IP" ]
need ft-ssh "eth0 has no address (user networking)" [ -n "$IP" ]
need ft-ssh "no dropbear" [ -x /usr/sbin/dropbear ]

if [ -x /usr/sbin/dropbear ] && [ -n "$IP" ]; then
	# -s: keys only; -F -E: foreground, log to stderr; host key made on the host
	/usr/sbin/dropbear -F -E -s -p 22 -r /etc/dropbear/dropbear_ed25519_host_key \
		> /tmp/dropbear.log 2>&1 &
	sleep 0.5
	kill -0 $! 2>/dev/null || die "dropbear did not start: $(tail -3 /tmp/dropbear.log)"
fi

echo "EV info kernel=$(uname -r) cpus=$(nproc) mem_kb=$(awk '/MemTotal/ {print $2}' /proc/meminfo) tracefs_clock=$(sed 's/.*\[\(.*\)\].*/\1/' $T/trace_clock) ip=${IP:-none} vport=${VPORT:-none} buf_kb=$BUF_KB ivtrace_opts=\"$IVT_OPTS\" clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"

# ---- counters --------------------------------------------------------------------------
ft_counts() { # "events lost": written = entries + overrun + read; lost = overrun + dropped
	awk '/^entries:/ {e += $2} /^overrun:/ {o += $2} /^dropped events:/ {d += $3}
	     /^read events:/ {r += $3} END {print e + o + r, o + d}' $T/per_cpu/cpu*/stats
}
ivt_counts() { # "events lost": events = in closed packets + dropped
	ev-helper regionstat | sed -n 's/.*events_closed=\([0-9]*\) lost=\([0-9]*\).*/\1 \2/p' |
		awk '{print $1 + $2, $2}'
}
counts() {
	case $1 in
	bare | ivt-idle) echo "0 0" ;;
	ivt-*) ivt_counts ;;
	ft-*) ft_counts ;;
	esac
}

# ---- configurations --------------------------------------------------------------------
ft_on() {
	echo 0 > $T/tracing_on
	echo $BUF_KB > $T/buffer_size_kb
	echo 1 > $T/options/overwrite
	echo > $T/trace
	for e in $EVENTS; do echo 1 > $T/events/$e/enable; done
	echo 1 > $T/tracing_on
}
ft_off() {
	echo 0 > $T/tracing_on
	for e in $EVENTS; do echo 0 > $T/events/$e/enable; done
	echo > $T/trace
}
reader_pids() { # processes reading trace_pipe (busybox here has no pgrep)
	for d in /proc/[0-9]*; do
		case "$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)" in
		*"cat $T/trace_pipe"*) echo "${d#/proc/}" ;;
		esac
	done
}
wait_gone() { # pid secs
	n=0
	while kill -0 "$1" 2>/dev/null && [ $n -lt $(($2 * 10)) ]; do sleep 0.1; n=$((n + 1)); done
	kill -0 "$1" 2>/dev/null && { kill -9 "$1" 2>/dev/null; return 1; }
	return 0
}

setup() { # config rep
	c=$1 r=$2
	case $c in
	bare) ;;
	ivt-idle) insmod "$KO" events=none $IVT_OPTS || die "insmod ivtrace events=none" ;;
	ivt-flight) insmod "$KO" events=$IVT_GROUPS mode=overwrite $IVT_OPTS || die "insmod ivtrace" ;;
	ivt-stream)
		insmod "$KO" events=$IVT_GROUPS mode=discard $IVT_OPTS || die "insmod ivtrace"
		echo "EV host-start recorder config=$c rep=$r"
		ev-helper hbwait 120 > /dev/null || die "ivtrace record never attached (rep $r)" ;;
	ft-flight) ft_on ;;
	ft-net)
		ft_on
		( echo "IVTEVAL config=$c rep=$r"; exec cat $T/trace_pipe ) | nc $HOSTIP "$PORT" &
		NCPID=$! ;;
	ft-ssh)
		ft_on
		echo "EV host-start ssh config=$c rep=$r"
		n=0
		while [ -z "$(reader_pids)" ]; do
			n=$((n + 1))
			[ $n -gt 1200 ] && die "the host's ssh reader never started (rep $r)"
			sleep 0.1
		done ;;
	ft-9p)
		ft_on
		cat $T/trace_pipe > "$SHARE/$c-r$r.txt" & ;;
	ft-vserial)
		ft_on
		echo "IVTEVAL-BEGIN config=$c rep=$r" > "$VPORT"
		cat $T/trace_pipe > "$VPORT" & ;;
	*) die "unknown config $c" ;;
	esac
	case $c in ft-net | ft-9p | ft-vserial | ft-ssh)
		sleep 0.5
		[ -n "$(reader_pids)" ] || die "$c: the trace_pipe reader is not running (rep $r)" ;;
	esac
	sleep 1   # let the set-up settle (state dump, first packets, connection)
}

teardown() { # config rep
	c=$1 r=$2
	case $c in
	ivt-*)
		echo "EV stat config=$c rep=$r $(ev-helper regionstat)"
		rmmod ivtrace || die "rmmod ivtrace"
		[ $c = ivt-stream ] && echo "EV host-stop recorder config=$c rep=$r" ;;
	ft-*)
		echo 0 > $T/tracing_on
		set -- $(ft_counts)
		fev=$1 flost=$2
		for p in $(reader_pids); do kill "$p"; done
		case $c in
		ft-net) wait_gone "$NCPID" 10 || echo "EV info config=$c rep=$r nc had to be killed" ;;
		ft-vserial) sleep 0.2; echo "IVTEVAL-END config=$c rep=$r" > "$VPORT" ;;
		ft-ssh) echo "EV host-stop ssh config=$c rep=$r" ;;
		esac
		echo "EV stat config=$c rep=$r ftrace_events=$fev ftrace_lost=$flost"
		ft_off ;;
	esac
}

measure() { # config rep workload
	c=$1 r=$2 w=$3
	set -- $(counts "$c")
	e0=$1 l0=$2
	echo "EV begin rep=$r config=$c workload=$w"
	case $w in
	int) out=$(ev-int -t "$SECS") ;;
	syscall) out=$(ev-syscall -t "$SECS" -d /tmp) ;;
	tar) out=$(ev-tar -t "$SECS" -d /tmp) ;;
	gzip) out=$(ev-gzip -t "$SECS" -d /tmp) ;;
	forkexec) out=$(ev-forkexec -t "$SECS") ;;
	*) die "unknown workload $w" ;;
	esac
	[ $? -eq 0 ] || die "workload $w failed under $c (rep $r): $out"
	set -- $(counts "$c")
	s=$(echo "$out" | sed -n 's/^EVWL workload=[^ ]* \(score=.*\)$/\1/p')
	[ -n "$s" ] || die "workload $w printed no score under $c: $out"
	echo "EV m rep=$r config=$c workload=$w $s events=$(($1 - e0)) lost=$(($2 - l0))"
}

rotate() { # list k -> the list rotated left by k, one per line
	echo "$1" | tr ',' '\n' | grep . | awk -v k="$2" '{a[NR - 1] = $0; n = NR}
		END {for (j = 0; j < n; j++) print a[(j + k) % n]}'
}

# ---- warm-up (page cache, first-run effects), not recorded --------------------------------
if [ "$WARM" != 0 ]; then
	for w in $(echo "$WORKLOADS" | tr ',' ' '); do
		case $w in
		int) o=$(ev-int -t "$WARM") ;;
		syscall) o=$(ev-syscall -t "$WARM") ;;
		tar) o=$(ev-tar -t "$WARM") ;;
		gzip) o=$(ev-gzip -t "$WARM") ;;
		forkexec) o=$(ev-forkexec -t "$WARM") ;;
		esac || die "warm-up $w failed: $o"
		echo "EV warm $o"
	done
fi

# ---- what the emulator makes costlier: the primitives of an event, in this guest -------------
echo "EV calib $(ev-helper tcgcost)"

r=1
while [ $r -le "$REPS" ]; do
	for c in $(rotate "$CONFIGS" $((r - 1))); do
		echo "EV info rep=$r config=$c start uptime=$(cut -d' ' -f1 /proc/uptime)"
		setup "$c" $r
		for w in $(rotate "$WORKLOADS" $((r - 1))); do
			measure "$c" $r "$w"
		done
		teardown "$c" $r
	done
	r=$((r + 1))
done
echo "EV done"
