"""native: the per-event writer cost and the drain, on this host (no guest).

Sections (all by default, or pick with --only):
  native    per-event writer cost, one process pinned to one CPU: ivtrace,
            ivtrace while `ivtrace record` drains, LTTng-UST, ftrace
            trace_marker and trace_marker_raw, write(2) to tmpfs and to disk,
            getppid(2), in rotating order over several rounds (bench/native)
  noreader  ivtrace with no reader: a small ring fills, then every event is
            dropped and counted; cost before/after full, and the kept region
            re-read by `ivtrace record` (same run of ivbench as native)
  drain     `ivtrace record` draining a prefilled region to /dev/shm, one
            CPU, small and large events (drain.py)
  live      a writer at fixed rates while `ivtrace record` drains
            concurrently, loss per rate: ivbench (recorder attached before the
            first event) and ivtrace-loadgen (started the way a user would,
            recorder first; drain.py)

Needs root and `make -C bench build` (bench/Makefile does it). Starts lttng-sessiond (if
none runs) and stops it after; mounts tracefs (if not mounted) and leaves it mounted; uses
its own tracefs instance, ivbench-PID. Fails (exit 1) when a tracer cannot be measured.
"""

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ivtools import proc

from . import BenchError, Prerequisite, drain, hostload
from .results import ROOT, first_line

NAME = "native"
HELP = "per-event writer cost, no-reader cost, drain throughput, live loss (this host)"
TRACEFS = Path("/sys/kernel/tracing")


sh = functools.partial(proc.sh, error=BenchError)


def read(path, default=None):
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def dmesg_lines(pattern):
    p = subprocess.run(["dmesg"], capture_output=True, text=True)
    return [line.strip() for line in p.stdout.splitlines() if re.search(pattern, line)][:8]


def host_details():
    """What the per-event figures depend on beyond the CPU: the clocksource, how the kernel
    saw its hypervisor and TSC, the CPU vulnerability mitigations (syscall cost), the disk."""
    vuln = {}
    vdir = Path("/sys/devices/system/cpu/vulnerabilities")
    if vdir.is_dir():
        for f in sorted(vdir.iterdir()):
            vuln[f.name] = read(f)
    return {
        "clocksource": read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "dmesg_hypervisor_tsc": dmesg_lines(r"Hypervisor detected|tsc: Detected|TSC doesn't|PMU"),
        "vulnerabilities": vuln,
        "root_fs": first_line(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "/"]),
    }


# ---- tracefs and LTTng -------------------------------------------------------

class Tracefs:
    """Mount tracefs if needed and remove our instance afterwards. The mount stays: other
    runs on this machine (ivtrace serve --host-events, another bench) may use it by then."""

    def __init__(self, instance):
        self.instance = TRACEFS / "instances" / instance

    def __enter__(self):
        if not (TRACEFS / "trace_marker").exists():
            TRACEFS.mkdir(parents=True, exist_ok=True)
            sh(["mount", "-t", "tracefs", "nodev", TRACEFS])
        return self

    def __exit__(self, *exc):
        if self.instance.exists():
            try:
                (self.instance / "tracing_on").write_text("0")
                self.instance.rmdir()
            except OSError as e:
                print(f"run: could not remove {self.instance}: {e}", file=sys.stderr)
        return False


def sessiond_pids():
    p = subprocess.run(["pgrep", "-x", "lttng-sessiond"], capture_output=True, text=True)
    return {int(x) for x in p.stdout.split()}


class Lttng:
    """A discard-mode UST session with ivbench:event4 enabled, output in /dev/shm.

    Starts lttng-sessiond (pinned to the drain CPU, so its consumer daemon
    runs there) when none is running, and stops exactly that daemon after.
    """

    def __init__(self, drain_cpu, subbuf_size, num_subbuf):
        self.name = f"ivbench-{os.getpid()}"
        self.out = Path(f"/dev/shm/ivbench-lttng-{os.getpid()}")
        self.drain_cpu = drain_cpu
        self.subbuf_size, self.num_subbuf = subbuf_size, num_subbuf
        self.started_pids = set()
        self.commands = []
        self.info = {}

    def lttng(self, *args, check=True):
        cmd = ["lttng", *map(str, args)]
        self.commands.append(shlex.join(cmd))
        return sh(cmd, check=check)

    def __enter__(self):
        if not shutil.which("lttng-sessiond") or not shutil.which("lttng"):
            raise BenchError("lttng-tools is not installed (scripts/deps.sh installs it)")
        before = sessiond_pids()
        if not before:
            cmd = ["taskset", "-c", str(self.drain_cpu), "lttng-sessiond", "--daemonize",
                   "--no-kernel"]
            self.commands.append(shlex.join(cmd))
            sh(cmd)
            time.sleep(0.5)
            self.started_pids = sessiond_pids() - before
            if not self.started_pids:
                raise BenchError("lttng-sessiond --daemonize did not leave a daemon running")
        self.info["sessiond"] = "started by bench/run" if self.started_pids else "already running"
        shutil.rmtree(self.out, ignore_errors=True)
        self.lttng("create", self.name, "--output", self.out)
        try:
            self.lttng("enable-channel", "-u", "-s", self.name, "--discard",
                       "--subbuf-size", self.subbuf_size, "--num-subbuf", self.num_subbuf,
                       "ivbch")
            self.lttng("enable-event", "-u", "-s", self.name, "-c", "ivbch", "ivbench:event4")
            self.lttng("start", self.name)
        except BenchError:
            self.lttng("destroy", self.name, check=False)
            raise
        self.info.update(channel={"mode": "discard", "subbuf_size": self.subbuf_size,
                                  "num_subbuf": self.num_subbuf, "buffers": "per-uid",
                                  "output": str(self.out)})
        return self

    def __exit__(self, *exc):
        self.lttng("stop", self.name, check=False)
        listing = self.lttng("list", self.name, check=False).stdout
        m = re.search(r"Discarded events:\s*(\d+)", listing)
        self.info["discarded_events"] = int(m.group(1)) if m else None
        m = re.search(r"Lost packets:\s*(\d+)", listing)
        self.info["lost_packets"] = int(m.group(1)) if m else None
        self.info["trace_bytes"] = drain.tree_bytes(self.out)
        self.lttng("destroy", self.name, check=False)
        shutil.rmtree(self.out, ignore_errors=True)
        for pid in self.started_pids:
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
        self.info["commands"] = self.commands
        return False


# ---- sections ------------------------------------------------------------------

def run_ivbench(cmd, what):
    """Run ivbench (its progress and errors go to our stderr); remove the files
    it leaves when it fails midway (they are named after its pid, which
    taskset keeps as it execs)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    rc = p.wait()
    for d in ("/dev/shm", "/var/tmp"):
        for f in Path(d).glob(f"ivbench-{p.pid}.*"):
            shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink(missing_ok=True)
    if rc != 0:
        raise BenchError(f"{what} failed (exit {rc}); see above")


def run_native(args, tools, data):
    keep = Path(f"/dev/shm/ivbench-noreader-{os.getpid()}.region")
    out_json = Path(f"/dev/shm/ivbench-{os.getpid()}.json")
    instance = f"ivbench-{os.getpid()}"  # not shared with a concurrent run
    cmd = ["taskset", "-c", str(args.cpu), args.ivbench,
           "--cpu", args.cpu, "--drain-cpu", args.drain_cpu,
           "--recorder", tools["ivtrace"], "--json", out_json,
           "--tracefs", TRACEFS / "instances" / instance]
    if args.quick:
        cmd += ["--rounds", 2, "--samples", 50000, "--groups", 10000,
                "--batch", 20000, "--batches", 10]
    else:
        cmd += ["--rounds", args.rounds]
    if "noreader" in args.only:
        cmd += ["--noreader", "--keep-noreader", keep]
        if args.quick:
            cmd += ["--noreader-events", 300000]
    if "native" not in args.only:
        cmd += ["--bench", "ivtrace"]
    cmd = [str(c) for c in cmd]

    with Tracefs(instance), Lttng(args.drain_cpu, 4 << 20, 8) as lt:
        print(f"run: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        run_ivbench(cmd, "ivbench")
    native = json.loads(out_json.read_text())
    out_json.unlink()
    native["command"] = shlex.join(cmd)
    native["lttng"] = lt.info
    data["native"] = native

    if "noreader" in args.only:
        nr = native.get("noreader", {})
        try:
            nr["reread_by_record"] = drain.reread(tools["ivtrace"], keep, args.drain_cpu)
        finally:
            keep.unlink(missing_ok=True)


def run_live_steady(args, tools):
    """ivbench's paced writer with the recorder attached before the first event."""
    out_json = Path(f"/dev/shm/ivbench-live-{os.getpid()}.json")
    rates = "1000000,5000000,0" if args.quick else "1000000,5000000,20000000,0"
    rings = "8x262144" if args.quick else "8x262144,32x1048576"
    cmd = [str(c) for c in [
        "taskset", "-c", args.cpu, args.ivbench, "--cpu", args.cpu, "--drain-cpu", args.drain_cpu,
        "--recorder", tools["ivtrace"], "--bench", "empty", "--rounds", 1, "--samples", 1000,
        "--groups", 100, "--batch", 1000, "--batches", 1, "--live-rates", rates,
        "--live-rings", rings, "--live-seconds", 1 if args.quick else 3, "--json", out_json]]
    print(f"run: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    run_ivbench(cmd, "ivbench --live-rates")
    live = json.loads(out_json.read_text())["live_rates"]
    out_json.unlink()
    live["command"] = shlex.join(cmd)
    for r in live["runs"]:
        summ = drain.summarize_sidecar(r.get("recorder_summary"))
        r.update(recorded=summ["events"], lost=summ["lost"])
    return live


def add_arguments(ap):
    ap.add_argument("--ivbench", default=str(ROOT / "build/bench/ivbench"))
    ap.add_argument("--bin", default=str(ROOT / "bin"),
                    help="where ivtrace and ivtrace-loadgen are")
    ap.add_argument("--only", default="native,noreader,drain,live",
                    help="comma-separated sections (default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=0, help="CPU for writers (0)")
    ap.add_argument("--drain-cpu", type=int, default=1, help="CPU for readers/daemons (1)")


def run(args, rec) -> list[str]:
    args.only = set(args.only.split(","))
    args.ivbench = str(Path(args.ivbench).resolve())
    tools = {"ivtrace": Path(args.bin) / "ivtrace", "loadgen": Path(args.bin) / "ivtrace-loadgen"}
    if os.geteuid() != 0:
        raise Prerequisite("run as root (tracefs, mlockall, lttng-sessiond)")
    for path in [*tools.values(), Path(args.ivbench)]:
        if not os.access(path, os.X_OK):
            raise Prerequisite(f"{path} is missing; build it first (`make` at the top, "
                               f"`make -C bench build`)")
    rec["machine"]["details"] = host_details()
    data = rec["data"]
    conditions = data.setdefault("conditions", {})
    try:
        if args.only & {"native", "noreader"}:
            with hostload.Section(conditions, "native"):
                run_native(args, tools, data)
        if "drain" in args.only:
            with hostload.Section(conditions, "drain"):
                data["drain"] = drain.run_drain(tools, args.cpu, args.drain_cpu, args.quick)
        if "live" in args.only:
            with hostload.Section(conditions, "live"):
                data["live_steady"] = run_live_steady(args, tools)
                data["live"] = drain.run_live(tools, args.cpu, args.drain_cpu, args.quick)
    except drain.DrainError as e:
        raise BenchError(str(e)) from e
    return []
