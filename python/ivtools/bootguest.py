"""A guest whose boot is traced (docs/boot.md): what `make demo-boot`, `bench/run boot` and
tests/boot put on its kernel command line, and how its command ends the recording.

The boot's events reach the host through the ftrace relay, which ivtrace.ko (loaded by /init
with ftrace=1) starts; what ftrace recorded before is a backlog the relay moves first. A
function_graph boot leaves millions of events there, which take the relay (under TCG) longer
than /init takes to reach its command: stopping the relay then would leave the newest part of
the boot (the exec of /init, the boot's marker) in ftrace's buffer, outside the trace. So the
command stops tracing, waits until ftrace's buffer is empty (every CPU's `entries` 0), then
stops the relay and unloads the module (the region closes, the recording ends).
"""

# The boot's own events: initcall levels and initcalls, module loads, execs (pid 1's: user
# space starts), context switches (what ran on each vCPU); ftrace's clock is the TSC, the
# kernel trace's.
EVENTS = ("trace_clock=x86-tsc trace_event=initcall,module:module_load,"
          "sched:sched_process_exec,sched:sched_switch")

DRAIN_S = 600


def stop_relay(tag: str) -> str:
    """The guest command's end: tracing off, ftrace's buffer drained by the relay (at most
    DRAIN_S s), the relay stopped, the module unloaded. Prints `TAG: drained N left` and
    `TAG: rmmod rc=RC`."""
    return rf"""
T=/sys/kernel/tracing
echo 0 > $T/tracing_on
left() {{ cat $T/per_cpu/cpu*/stats | awk '/^entries:/ {{ n += $2 }} END {{ print n + 0 }}'; }}
i=0
while [ "$(left)" != 0 ] && [ $i -lt {DRAIN_S * 5} ]; do sleep 0.2; i=$((i + 1)); done
echo "{tag}: drained, $(left) left"
killall ivtrace-ftrace
while pidof ivtrace-ftrace >/dev/null; do sleep 0.1; done
rmmod ivtrace
echo "{tag}: rmmod rc=$?"
"""
