"""The VM view demo (`make demo-vmview`) and the scenario tests/vmview measures.

A real guest (QEMU, TCG here, the Debian kernel, ivtrace.ko) served by `bin/ivtrace serve
--host-events` spins a CPU-bound program, `vmspin`, on its CPU 0. On the host, vCPU 0's thread
(`CPU 0/TCG`, named because QEMU runs with `-name NAME,debug-threads=on`) is pinned to one
host CPU and every other QEMU thread to another; then, for a known time, a CPU hog is pinned
to vCPU 0's CPU. While the hog runs, the host's scheduler shares that CPU between the two, so
vCPU 0 waits for it about half of the time: the guest's `vmspin` loses that time without
knowing. Each phase is measured twice: by the kernel's own scheduler statistics of the vCPU
thread (`/proc/PID/task/TID/schedstat`, second field: time spent waiting on a run queue) and
by the VM view ivtrace derives from the host trace (`DIR/vm/`: vCPU 0's preempted intervals
that ended in the phase, read with babeltrace2's Python bindings).

Usage: vm/demo-vmview [-o out/vmview] [--hog-seconds 4] [--quiet-seconds 3]
Python 3.11 standard library, plus python3-bt2 (babeltrace2's bindings) for the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import REPO, ivtvm
from .proc import say, wait_until
from .qemu_threads import pin_qemu, schedstat, vcpu_threads

IVTRACE = REPO / "bin" / "ivtrace"
NAME = "vmview"
SPIN = "vmspin"  # the guest program's name (comm)

# The guest copies the workload helper under a name of its own (exec sets comm to the file
# name), spins it on CPU 0, sleeps while the host runs its phases, then unloads ivtrace.ko:
# the region closes and serve finalizes the trace (guest, host and VM view).
GUEST_SCRIPT = r"""
cp "$(command -v ivtwl)" /tmp/{spin}
taskset -c 0 /tmp/{spin} cpu 1000000000000 >/dev/null &
spin=$!
echo "VMVIEW: spinning pid=$spin"
sleep {seconds}
kill $spin
wait $spin 2>/dev/null
rmmod ivtrace
echo "VMVIEW: done"
"""

TRACEFS = "/sys/kernel/tracing"
HOG_NAME = "vmview-hog"
# A busy loop for argv[1] seconds of wall time, named HOG_NAME (prctl PR_SET_NAME) so the host
# trace tells it from every other python3.
HOG = ("import ctypes, sys, time\n"
       f"ctypes.CDLL(None).prctl(15, b'{HOG_NAME}', 0, 0, 0)\n"
       "end = time.monotonic() + float(sys.argv[1])\n"
       "while time.monotonic() < end: pass\n")


# A phase with less than this of other work on vCPU 0's host CPU is quiet (ticks of 10 ms
# on the CPU's busy time, kernel threads and interrupts: a few ticks even when nothing else runs).
QUIET_OTHERS_NS = 60_000_000


@dataclass
class Phase:
    name: str
    seconds: float
    hog: bool
    # Host time (ns, CLOCK_REALTIME base like the traces) at its start and end.
    start_ns: int = 0
    end_ns: int = 0
    # The vCPU thread's run-queue wait during the phase (schedstat), ns.
    schedstat_wait_ns: int = 0
    hog_pid: int = 0
    hog_cpu_ns: int = 0
    # What else ran on vCPU 0's host CPU (the hog, other tasks, interrupts), ns: the CPU's
    # busy time (/proc/stat, 10 ms ticks) less vCPU 0's own run time (schedstat).
    others_ns: int = 0


@dataclass
class Run:
    out: Path  # the guest's trace directory, OUTROOT/NAME
    loadavg: float = 0.0  # the host's 1-minute load average when the phases began
    qemu_pid: int = 0
    vcpu_threads: dict = field(default_factory=dict)  # vcpu -> tid
    vcpu0_cpu: int = 1
    other_cpu: int = 0  # the host CPU of QEMU's other threads
    phases: list = field(default_factory=list)
    console: str = ""
    serve_log: str = ""
    serve_summary: dict = field(default_factory=dict)
    boot: object = None


def realtime_offset_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of 64 paired reads (the host time
    base ivtrace's traces use is CLOCK_MONOTONIC plus this offset)."""
    best = None
    for _ in range(64):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]


def two_cpus() -> tuple[int, int]:
    """(vCPU 0's host CPU, the rest of QEMU's): two CPUs this process may run on (a cpuset
    may leave out CPUs 0 and 1)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError(f"the scenario pins vCPU 0 and the rest of QEMU to two host CPUs; "
                           f"this process may run on {cpus} only")
    return cpus[-1], cpus[0]


def cpu_busy_ns(cpu: int) -> int:
    """Time host CPU `cpu` ran anything (tasks, interrupts), from /proc/stat: ticks, 10 ms."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            user, nice, system, _idle, _iowait, irq, softirq = map(int, line.split()[1:8])
            return (user + nice + system + irq + softirq) * 10**9 // os.sysconf("SC_CLK_TCK")
    raise RuntimeError(f"/proc/stat has no line for CPU {cpu}")


def hog(cpu: int, seconds: float) -> subprocess.Popen:
    """A CPU-bound process pinned to `cpu` from its start, busy for `seconds` of wall time."""
    return subprocess.Popen([sys.executable, "-c", HOG, str(seconds)],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def measure(r: Run, phase: Phase, offset: int) -> None:
    """Runs one phase: its host-time window and the vCPU 0 thread's schedstat wait in it."""
    tid = r.vcpu_threads[0]
    run0, w0 = schedstat(r.qemu_pid, tid)
    busy0 = cpu_busy_ns(r.vcpu0_cpu)
    phase.start_ns = time.monotonic_ns() + offset
    if phase.hog:
        h = hog(r.vcpu0_cpu, phase.seconds)
        phase.hog_pid = h.pid
        while h.poll() is None:
            try:
                phase.hog_cpu_ns = schedstat(h.pid)[0]
            except OSError:
                pass
            time.sleep(0.05)
    else:
        time.sleep(phase.seconds)
    run1, w1 = schedstat(r.qemu_pid, tid)
    phase.end_ns = time.monotonic_ns() + offset
    phase.schedstat_wait_ns = w1 - w0
    phase.others_ns = max(0, cpu_busy_ns(r.vcpu0_cpu) - busy0 - (run1 - run0))


class Server:
    """`bin/ivtrace serve --host-events` in the background."""

    def __init__(self, outroot: Path, log: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="ivt-vmview-"))  # sun_path is short
        self.sock = self.dir / "s.sock"
        self.log, self.json = log, log.with_suffix(".json")
        cmd = [str(IVTRACE), "serve", "--socket", str(self.sock), "-o", str(outroot),
               "--host-events", "--json"]
        with open(self.log, "wb") as se, open(self.json, "wb") as so:
            self.proc = subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while not self.sock.exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"ivtrace serve did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> dict:
        """SIGINT (every trace finalized); the guest's summary line."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in self.dir.iterdir():
            p.unlink()
        self.dir.rmdir()
        lines = [json.loads(ln) for ln in self.json.read_text().splitlines() if ln.strip()]
        return next((d for d in lines if d.get("serve", {}).get("guest") == NAME), {})


def mount_tracefs() -> None:
    """serve --host-events reads the host's tracefs, which a fresh machine may not have
    mounted: mount it where the kernel documents it, as trace-cmd does."""
    if Path(TRACEFS, "trace_marker").exists():
        return
    try:
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"tracefs is not mounted at {TRACEFS} and mounting it failed ({e}): "
                           f"run as root, or `mount -t tracefs nodev {TRACEFS}`") from e


def run(outroot: Path, add: list, phases: list[Phase], accel: str = "auto",
        timeout: float = 300) -> Run:
    """Boots the guest under serve, runs `phases` on the host, returns what was measured
    (the trace in outroot/NAME once the guest and serve are done)."""
    r = Run(out=outroot / NAME)
    r.vcpu0_cpu, r.other_cpu = two_cpus()
    mount_tracefs()
    outroot.mkdir(parents=True, exist_ok=True)
    srv = Server(outroot, outroot / "serve.log")
    seconds = 4 + sum(p.seconds for p in phases) + 6
    script = GUEST_SCRIPT.format(spin=SPIN, seconds=int(seconds))
    try:
        with ivtvm.VM(script, doorbell=str(srv.sock), vectors=2, smp=2, accel=accel,
                      modules=["ivtrace"], add=add, log=str(outroot / "console.log"),
                      extra_args=["-name", f"{NAME},debug-threads=on"]) as vm:
            vm.wait_for(r"^VMVIEW: spinning", timeout=timeout)
            statedump = r.out / "host" / "host_statedump"
            wait_until(statedump.exists, 60, f"{statedump} (host events recorded)",
                       error=RuntimeError)
            r.qemu_pid = vm.proc.pid
            r.vcpu_threads = vcpu_threads(r.qemu_pid)
            pin_qemu(r.qemu_pid, r.vcpu0_cpu, r.other_cpu, vcpus={0})  # vCPU 0 alone
            time.sleep(1.0)  # the pinning settles
            r.loadavg = os.getloadavg()[0]
            offset = realtime_offset_ns()
            for p in phases:
                measure(r, p, offset)
                r.phases.append(p)
            vm.wait_for(r"^VMVIEW: done", timeout=timeout)
            r.boot = vm.wait(timeout=timeout)
            r.console = r.boot.console_text
        summary = r.out / "ivtrace.json"
        wait_until(summary.exists, 120, f"{summary} (serve finalized the trace)", error=RuntimeError)
    finally:
        r.serve_summary = srv.stop()
        r.serve_log = srv.log.read_text(errors="replace")
    return r


# --------------------------------------------------------------------------- reading

@dataclass
class Interval:
    vcpu: int
    state: str  # preempted, blocked, hypervisor, runnable_untraced
    start_ns: int
    end_ns: int
    guest_tid: int
    guest_comm: str
    host_tid: int
    taken_by: str


def vm_intervals(trace: Path) -> list[Interval]:
    """The VM view's intervals (DIR/vm), times in ns from the epoch (babeltrace2's clock
    snapshot of the start event plus the duration it carries)."""
    import bt2

    out = []
    for msg in bt2.TraceCollectionMessageIterator(str(trace / "vm")):
        if type(msg) is not bt2._EventMessageConst:
            continue
        ev = msg.event
        if ev.name not in ("vcpu_preempted", "vcpu_blocked", "vcpu_hypervisor",
                           "vcpu_runnable_untraced"):
            continue
        p = ev.payload_field
        start = msg.default_clock_snapshot.ns_from_origin
        out.append(Interval(
            vcpu=int(ev.packet.context_field["cpu_id"]), state=ev.name[5:], start_ns=start,
            end_ns=start + int(p["duration_ns"]), guest_tid=int(ev.common_context_field["tid"]),
            guest_comm=str(p["guest_comm"]), host_tid=int(p["host_tid"]),
            taken_by=str(p["taken_by_comm"])))
    return out


def preempted_ns(intervals: list[Interval], vcpu: int, start_ns: int, end_ns: int,
                 state: str = "preempted") -> int:
    """vCPU `vcpu`'s preempted time in the intervals that ended in [start, end): what the
    kernel's schedstat counts for the same window (it adds a wait when the wait ends).
    state="runnable_untraced": the waits whose end the host kernel did not trace, at most
    this much more."""
    return sum(i.end_ns - i.start_ns for i in intervals
               if i.vcpu == vcpu and i.state == state and start_ns <= i.end_ns < end_ns)


# --------------------------------------------------------------------------- the demo

def demo(args) -> int:
    say("== [2/4] host tools (make all) and the guest (make guest)")
    subprocess.run(["make", "all"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    from . import guestbuild
    guest = guestbuild.build_guest()
    out = Path(args.output).resolve()
    if out.exists():
        subprocess.run(["rm", "-rf", "--", str(out)], check=True)
    phases = [Phase("quiet", args.quiet_seconds, False), Phase("hog", args.hog_seconds, True)]
    say(f"== [3/4] guest under `ivtrace serve --host-events`: {SPIN} spins on guest CPU 0; "
        f"{args.quiet_seconds:g} s quiet, then a hog pinned to vCPU 0's host CPU for "
        f"{args.hog_seconds:g} s")
    r = run(out, guest.add("ivtrace.ko", "ivtwl"), phases, accel=args.accel)
    say(f"   QEMU pid {r.qemu_pid}, vCPU threads {r.vcpu_threads}; vCPU 0 on host CPU "
        f"{r.vcpu0_cpu}, the rest of QEMU on CPU {r.other_cpu}")
    say("== [4/4] what ivtrace says")
    report = subprocess.run([str(IVTRACE), "report", str(r.out)], capture_output=True, text=True)
    vm_part = report.stdout[report.stdout.find("VM view"):] if "VM view" in report.stdout else \
        report.stdout + report.stderr
    say(f"$ bin/ivtrace report {r.out}   (its VM view part)")
    say(vm_part.rstrip())
    try:
        iv = vm_intervals(r.out)
    except ImportError:
        say("\n(python3-bt2 is missing: no per-phase comparison)")
        return 0
    say("\n  phase   length   vCPU 0 waited (schedstat)   ivtrace: vCPU 0 preempted   diff"
        "     untraced (at most)")
    for p in r.phases:
        ours = preempted_ns(iv, 0, p.start_ns, p.end_ns)
        unseen = preempted_ns(iv, 0, p.start_ns, p.end_ns, "runnable_untraced")
        ref = p.schedstat_wait_ns
        diff = f"{(ours - ref) / ref * 100:+.1f} %" if ref else "-"
        say(f"  {p.name:<7} {p.seconds:>4.1f} s   {ref / 1e6:>18.1f} ms   {ours / 1e6:>21.1f} ms"
            f"   {diff:>7}   {unseen / 1e6:8.1f} ms")
    say("  (untraced: waits whose end the host kernel did not trace, see docs/kvm.md)")
    for p in [p for p in r.phases if p.hog]:
        waits = [i for i in iv if i.vcpu == 0 and i.state == "preempted"
                 and p.start_ns <= i.end_ns < p.end_ns]
        by_hog = [i for i in waits if i.taken_by == HOG_NAME]
        say(f"  {p.name}: {HOG_NAME} ran {p.hog_cpu_ns / 1e6:.1f} ms on host CPU {r.vcpu0_cpu} "
            f"(its schedstat); it took the CPU from vCPU 0 in {len(by_hog)} of {len(waits)} "
            f"waits, {sum(i.end_ns - i.start_ns for i in by_hog) / 1e6:.1f} ms of them")
    for p in [p for p in r.phases if not p.hog and p.others_ns > QUIET_OTHERS_NS]:
        say(f"  ({p.name}: other host tasks ran {p.others_ns / 1e6:.0f} ms on CPU "
            f"{r.vcpu0_cpu} too)")
    lost = {}
    for i in iv:
        if i.vcpu == 0 and i.state == "preempted":
            lost[i.guest_comm] = lost.get(i.guest_comm, 0) + i.end_ns - i.start_ns
    top = sorted(lost.items(), key=lambda kv: -kv[1])[:3]
    say("  guest threads on vCPU 0 that lost time: "
        + ", ".join(f"{c or '?'} {ns / 1e6:.1f} ms" for c, ns in top))
    say(f"\n  open it: babeltrace2 {r.out} | grep -E 'vcpu_preempted|vmspin' | less")
    say(f"           bin/ivtrace report {r.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vm/demo-vmview", description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="out/vmview", help="output root (default out/vmview)")
    ap.add_argument("--hog-seconds", type=float, default=4.0)
    ap.add_argument("--quiet-seconds", type=float, default=3.0)
    ap.add_argument("--accel", default="auto", help="auto (default), kvm or tcg")
    ap.add_argument("--no-deps", action="store_true", help="(handled by vm/demo-vmview)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("demo-vmview: needs root (tracefs for the host events, pinning QEMU's threads)",
              file=sys.stderr)
        return 2
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
