#!/usr/bin/env python3
"""Run the ivtrace benchmarks and write bench/results/<date>-<host>.json.

Sections (all by default, or pick with --only):
  native    per-event writer cost, one process pinned to one CPU: ivtrace,
            ivtrace while `ivtrace record` drains, LTTng-UST, ftrace
            trace_marker and trace_marker_raw, write(2) to tmpfs and to disk,
            getppid(2), in rotating order over several rounds (bench/native)
  noreader  ivtrace with no reader: a small ring fills, then every event is
            dropped and counted; cost before/after full, and the kept region
            re-read by `ivtrace record` (same run of ivbench as native)
  drain     `ivtrace record` draining a prefilled region to /dev/shm, one
            CPU, small and large events (bench/drain)
  live      a writer at fixed rates while `ivtrace record` drains
            concurrently, loss per rate: ivbench (recorder attached before the
            first event) and ivtrace-loadgen (started the way a user would,
            recorder first; bench/drain)

Needs root. Starts lttng-sessiond (if none runs), mounts tracefs (if not
mounted) and undoes what it did. Fails loudly, exit 2, when a tracer cannot
be measured. Timings are recorded, never judged: bench/report.py turns the
JSON into docs/performance.md.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "drain"))
import drain  # noqa: E402  (bench/drain/drain.py)

SCHEMA = 1
TRACEFS = Path("/sys/kernel/tracing")


class BenchError(Exception):
    """A tracer or tool cannot be measured: the run stops with this message."""


def sh(cmd, check=True, **kw):
    """Run cmd (a list), return CompletedProcess with text stdout/stderr."""
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise BenchError(f"`{shlex.join(map(str, cmd))}` failed (exit {p.returncode}):\n"
                         f"{p.stderr.strip() or p.stdout.strip()}")
    return p


def first_line(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        out = (p.stdout or p.stderr).strip().splitlines()
        return out[0] if out else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def dpkg_version(pkg):
    return first_line(["dpkg-query", "-W", "-f=${Version}", pkg])


def read(path, default=None):
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


# ---- machine and load ------------------------------------------------------

def cpuinfo():
    info, flags = {}, []
    for line in (read("/proc/cpuinfo", "") or "").splitlines():
        if ":" not in line:
            if info:
                break
            continue
        k, v = (s.strip() for s in line.split(":", 1))
        if k == "flags":
            flags = v.split()
        elif k in ("vendor_id", "cpu family", "model", "model name", "stepping", "microcode"):
            info[k.replace(" ", "_")] = v
    info["flags_of_interest"] = [f for f in flags if f in (
        "hypervisor", "constant_tsc", "nonstop_tsc", "tsc_known_freq", "rdtscp", "vmx", "svm")]
    return info


def dmesg_lines(pattern):
    p = subprocess.run(["dmesg"], capture_output=True, text=True)
    return [l.strip() for l in p.stdout.splitlines() if re.search(pattern, l)][:8]


def git_state():
    rev = first_line(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                            "abi", "guest/lib", "host", "bench"],
                           capture_output=True, text=True).stdout.splitlines()
    return {"commit": rev, "uncommitted_files": len(dirty),
            "uncommitted_in": sorted({"/".join(l[3:].split("/")[:2]) for l in dirty})}


def machine_info():
    vuln = {}
    vdir = Path("/sys/devices/system/cpu/vulnerabilities")
    if vdir.is_dir():
        for f in sorted(vdir.iterdir()):
            vuln[f.name] = read(f)
    mem_kb = int(re.search(r"MemTotal:\s+(\d+)", read("/proc/meminfo", "MemTotal: 0")).group(1))
    return {
        "hostname": socket.gethostname(),
        "cpu": cpuinfo(),
        "online_cpus": os.cpu_count(),
        "mem_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "clocksource": read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "dmesg_hypervisor_tsc": dmesg_lines(r"Hypervisor detected|tsc: Detected|TSC doesn't|PMU"),
        "vulnerabilities": vuln,
        "root_fs": first_line(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "/"]),
        "versions": {
            "gcc": first_line(["gcc", "--version"]),
            "rustc": first_line(["rustc", "--version"]),
            "python": sys.version.split()[0],
            "lttng-ust": dpkg_version("liblttng-ust-dev"),
            "lttng-tools": dpkg_version("lttng-tools"),
            "babeltrace2": dpkg_version("babeltrace2"),
            "trace-cmd": dpkg_version("trace-cmd"),
        },
        "ivtrace_git": git_state(),
    }


def cpu_times():
    """Per-CPU (busy, total, steal) jiffies from /proc/stat (guest/guest_nice are
    already counted in user/nice)."""
    out = {}
    for line in read("/proc/stat", "").splitlines():
        m = re.match(r"cpu(\d+)\s+(.*)", line)
        if m:
            v = [int(x) for x in m.group(2).split()][:8]
            v += [0] * (8 - len(v))
            idle = v[3] + v[4]
            out[int(m.group(1))] = (sum(v) - idle, sum(v), v[7])
    return out


def busy_percent(t0, t1, field=0):
    return {f"cpu{c}": round(100.0 * (t1[c][field] - t0[c][field]) /
                             max(1, t1[c][1] - t0[c][1]), 1)
            for c in t0 if c in t1}


def load_snapshot():
    ps = subprocess.run(["ps", "-eo", "pid,pcpu,etimes,comm", "--sort=-pcpu"],
                        capture_output=True, text=True).stdout.splitlines()[1:7]
    return {
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "loadavg": read("/proc/loadavg"),
        "top": [" ".join(l.split()) for l in ps],
    }


class Section:
    """Times a section and records the CPU use of every CPU while it ran."""

    def __init__(self, result, name):
        self.result, self.name = result, name

    def __enter__(self):
        print(f"== {self.name}", file=sys.stderr, flush=True)
        self.load = load_snapshot()
        self.t0, self.c0 = time.time(), cpu_times()
        return self

    def __exit__(self, *exc):
        self.result.setdefault("conditions", {})[self.name] = {
            "before": self.load, "after": load_snapshot(),
            "seconds": round(time.time() - self.t0, 1),
            "cpu_busy_percent": busy_percent(self.c0, t1 := cpu_times()),
            "cpu_steal_percent": busy_percent(self.c0, t1, field=2),
        }
        return False


# ---- tracefs and LTTng -------------------------------------------------------

class Tracefs:
    """Mount tracefs if needed; remove our instance (and unmount) afterwards."""

    def __init__(self, instance):
        self.instance = TRACEFS / "instances" / instance
        self.mounted = False

    def __enter__(self):
        if not (TRACEFS / "trace_marker").exists():
            TRACEFS.mkdir(parents=True, exist_ok=True)
            sh(["mount", "-t", "tracefs", "nodev", TRACEFS])
            self.mounted = True
        return self

    def __exit__(self, *exc):
        if self.instance.exists():
            try:
                (self.instance / "tracing_on").write_text("0")
                self.instance.rmdir()
            except OSError as e:
                print(f"run: could not remove {self.instance}: {e}", file=sys.stderr)
        if self.mounted:
            sh(["umount", TRACEFS], check=False)
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
        self.info["sessiond"] = "started by run.py" if self.started_pids else "already running"
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


def run_native(args, tools, result):
    keep = Path(f"/dev/shm/ivbench-noreader-{os.getpid()}.region")
    out_json = Path(f"/dev/shm/ivbench-{os.getpid()}.json")
    cmd = ["taskset", "-c", str(args.cpu), args.ivbench,
           "--cpu", args.cpu, "--drain-cpu", args.drain_cpu,
           "--recorder", tools["ivtrace"], "--json", out_json]
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

    with Tracefs("ivbench"), Lttng(args.drain_cpu, 4 << 20, 8) as lt:
        print(f"run: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        run_ivbench(cmd, "ivbench")
    native = json.loads(out_json.read_text())
    out_json.unlink()
    native["command"] = shlex.join(cmd)
    native["lttng"] = lt.info
    result["native"] = native

    if "noreader" in args.only:
        nr = native.get("noreader", {})
        try:
            nr["reread_by_record"] = drain.reread(tools["ivtrace"], keep, args.drain_cpu)
        finally:
            keep.unlink(missing_ok=True)


def repo_relative(obj):
    """Commands in the results name tools relative to the repository root."""
    if isinstance(obj, str):
        return obj.replace(str(ROOT) + "/", "")
    if isinstance(obj, list):
        return [repo_relative(x) for x in obj]
    if isinstance(obj, dict):
        return {k: repo_relative(v) for k, v in obj.items()}
    return obj


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


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ivbench", default=str(ROOT / "build/bench/ivbench"))
    ap.add_argument("--bin", default=str(ROOT / "bin"),
                    help="where ivtrace and ivtrace-loadgen are")
    ap.add_argument("--only", default="native,noreader,drain,live",
                    help="comma-separated sections (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer samples, smaller drains")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=0, help="CPU for writers (0)")
    ap.add_argument("--drain-cpu", type=int, default=1, help="CPU for readers/daemons (1)")
    ap.add_argument("-o", "--out", default=str(HERE / "results"))
    args = ap.parse_args()
    args.only = set(args.only.split(","))
    args.ivbench = str(Path(args.ivbench).resolve())

    tools = {"ivtrace": Path(args.bin) / "ivtrace", "loadgen": Path(args.bin) / "ivtrace-loadgen"}
    try:
        if os.geteuid() != 0:
            raise BenchError("run as root (tracefs, mlockall, lttng-sessiond)")
        for name, path in [*tools.items(), ("ivbench", Path(args.ivbench))]:
            if not os.access(path, os.X_OK):
                raise BenchError(f"{path} is missing; build it first (`make` at the top, "
                                 f"`make -C bench build`)")
        started = datetime.datetime.now().astimezone()
        result = {
            "schema": SCHEMA,
            "date": started.isoformat(timespec="seconds"),
            "argv": sys.argv,
            "reproduce": "make bench" if not args.quick else "make -C bench quick",
            "machine": machine_info(),
        }
        if args.only & {"native", "noreader"}:
            with Section(result, "native"):
                run_native(args, tools, result)
        if "drain" in args.only:
            with Section(result, "drain"):
                result["drain"] = drain.run_drain(tools, args.cpu, args.drain_cpu, args.quick)
        if "live" in args.only:
            with Section(result, "live"):
                result["live_steady"] = run_live_steady(args, tools)
                result["live"] = drain.run_live(tools, args.cpu, args.drain_cpu, args.quick)
    except (BenchError, drain.DrainError) as e:
        print(f"run: error: {e}", file=sys.stderr)
        return 2

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "-quick" if args.quick else ""
    path = out / f"{started:%Y-%m-%dT%H%M%S}-{socket.gethostname()}{tag}.json"
    path.write_text(json.dumps(repo_relative(result), indent=1) + "\n")
    print(f"run: wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
