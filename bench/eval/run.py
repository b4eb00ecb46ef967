#!/usr/bin/python3
"""The evaluation harness: the seeds' overhead tables, measured here, in one command.

    bench/eval/run [--quick] [--reps N] [--secs S] [--configs a,b] [--workloads a,b] ...
    make eval            # native + doorbell + this matrix, then docs/performance.md
    make test            # includes bench/eval/run --quick (a smoke test)

Boots ONE real guest (vm/ivtvm.py; auto accelerator, TCG on these machines) with every
transport device present (ivshmem, virtio-net user networking, a 9p share, a virtio-serial
port), and runs bench/eval/guest/evalguest.sh in it: per repetition every configuration
(ivtrace's tracing states and the alternatives) in a rotated order, each running every
workload (bench/eval/workloads: int, syscall, tar, gzip, forkexec) for SECS seconds.
The host side: `ivtrace record` for the streaming state, a TCP + virtio-serial sink
(sink.py) and an ssh client for the alternatives, all pinned to the CPU the vCPU is not on.

Overhead = (1 - score/bare) x 100 against the bare score of the same run (geometric means
over repetitions; spread: min..max of the per-repetition paired overheads and the standard
deviation of log scores). Results: bench/results/eval/<date>-<host>[-quick].json (schema in
bench/eval/README.md); a full run also regenerates docs/performance.md and the plots.

Exit status: 0 measured; 1 something could not be measured (a transport, a state, a
workload; the message says which); 2 bad arguments or a missing prerequisite.
Timings are results, never pass/fail.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "vm"))
sys.path.insert(0, str(HERE))
import guestbuild  # noqa: E402
import ivtvm  # noqa: E402
import evalreport  # noqa: E402

KMOD = ROOT / "guest" / "kmod"
WL_OUT = ROOT / "build" / "bench" / "guest"
DROPBEAR = ROOT / "build" / "eval" / "dropbear"
IVTRACE = ROOT / "bin" / "ivtrace"
RESULTS = HERE.parent / "results" / "eval"
GUEST_SCRIPT = HERE.parent / "guest" / "evalguest.sh"

WORKLOADS = ["int", "syscall", "tar", "gzip", "forkexec"]
CONFIGS = ["bare", "ivt-idle", "ivt-flight", "ivt-stream", "ft-flight", "ft-net", "ft-ssh",
           "ft-9p", "ft-vserial"]
VPORT_NAME = "org.ivtrace.eval.trace"
RE_M = re.compile(r"^EV m rep=(\d+) config=(\S+) workload=(\S+) score=(\S+) unit=(\S+) "
                  r"ops=(\d+) elapsed=(\S+) events=(-?\d+) lost=(-?\d+)\s*$", re.M)
RE_STAT = re.compile(r"^EV stat config=(\S+) rep=(\d+) (.*)$", re.M)
BUILD_WARNINGS: list[str] = []
RE_HOST = re.compile(r"^EV host-(start|stop) (\S+) config=(\S+) rep=(\d+)\s*$")


class EvalError(Exception):
    """Something could not be measured (exit 1)."""


def say(msg: str) -> None:
    print(f"eval: {msg}", flush=True)


def sh(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def first_line(cmd) -> str:
    try:
        p = sh(cmd, timeout=30)
        return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr) else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "not found"


# --------------------------------------------------------------------------- prerequisites

def build_all(need_ssh: bool, reuse_stale: bool) -> None:
    """The host tools (make all) and the guest (guestbuild.build_guest). A failed build is an
    error; with --reuse-stale-binaries the files of an earlier build are used and recorded."""
    p = sh(["make", "-C", str(ROOT), "all"], timeout=1800)
    if p.returncode:
        if not (reuse_stale and IVTRACE.exists()):
            raise SystemExit(f"eval: building the host tools (make all) failed:\n"
                             f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
        say("WARNING: make all failed; using the existing bin/ivtrace (recorded)")
        BUILD_WARNINGS.append("host tools (make all): build failed, used existing bin/ivtrace")
    try:
        guest = guestbuild.build_guest(reuse_stale=reuse_stale)
    except guestbuild.BuildError as e:
        raise SystemExit(f"eval: {e}") from e
    BUILD_WARNINGS.extend(f"{x['part']}: build failed, used existing {', '.join(x['files'])}"
                          for x in guest.stale)
    if need_ssh:
        prepare_dropbear()


def prepare_dropbear() -> None:
    """dropbear (the guest's SSH server, with its shared libraries) and the keys. Debian's
    dropbear-bin is fetched with apt-get download and unpacked under build/eval/dropbear
    (never installed on the host)."""
    root = DROPBEAR / "root"
    if not (root / "usr/sbin/dropbear").is_file():
        debs = DROPBEAR / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        pk = ["dropbear-bin", "libtomcrypt1", "libtommath1"]
        p = sh(["apt-get", "download"] + pk, cwd=debs, timeout=600)
        if p.returncode:
            sh(["apt-get", "update", "-q"], timeout=600)
            p = sh(["apt-get", "download"] + pk, cwd=debs, timeout=600)
        if p.returncode:
            raise SystemExit(f"eval: apt-get download {' '.join(pk)} failed (needed for the "
                             f"SSH transport; --configs without ft-ssh skips it):\n{p.stderr}")
        for deb in sorted(debs.glob("*.deb")):
            p = sh(["dpkg-deb", "-x", str(deb), str(root)])
            if p.returncode:
                raise SystemExit(f"eval: dpkg-deb -x {deb} failed: {p.stderr}")
    env = dict(os.environ, LD_LIBRARY_PATH=str(root / "usr/lib/x86_64-linux-gnu"))
    hk = DROPBEAR / "dropbear_ed25519_host_key"
    if not hk.is_file():
        p = sh([str(root / "usr/bin/dropbearkey"), "-t", "ed25519", "-f", str(hk)], env=env)
        if p.returncode:
            raise SystemExit(f"eval: dropbearkey failed: {p.stderr}")
    ck = DROPBEAR / "client_key"
    if not ck.is_file():
        p = sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ivtrace-eval",
                "-f", str(ck)])
        if p.returncode:
            raise SystemExit(f"eval: ssh-keygen failed (openssh-client): {p.stderr}")
    ak = DROPBEAR / "authorized_keys"
    ak.write_text(Path(str(ck) + ".pub").read_text())
    ak.chmod(0o600)
    hk.chmod(0o600)


def dropbear_adds() -> list[str]:
    """--add specs: the dropbear binary, the libraries ldd resolves for it, the loader, keys."""
    root = DROPBEAR / "root"
    env = dict(os.environ, LD_LIBRARY_PATH=str(root / "usr/lib/x86_64-linux-gnu"))
    p = sh(["ldd", str(root / "usr/sbin/dropbear")], env=env)
    if p.returncode:
        raise SystemExit(f"eval: ldd dropbear failed: {p.stderr}")
    adds = [f"{root / 'usr/sbin/dropbear'}:/usr/sbin/dropbear"]
    for line in p.stdout.splitlines():
        m = re.search(r"=>\s*(\S+)", line) or re.match(r"\s*(/\S+)", line)
        if not m or not m.group(1).startswith("/"):
            continue
        src = Path(m.group(1))
        name = src.name
        real = src.resolve()
        if "ld-linux" in name:
            adds.append(f"{real}:/lib64/{name}")
            adds.append(f"{real}:/lib/x86_64-linux-gnu/{name}")
        else:
            adds.append(f"{real}:/lib/x86_64-linux-gnu/{name}")
    adds += [f"{DROPBEAR / 'dropbear_ed25519_host_key'}:/etc/dropbear/dropbear_ed25519_host_key",
             f"{DROPBEAR / 'authorized_keys'}:/root/.ssh/authorized_keys"]
    return adds


# --------------------------------------------------------------------------- machine

def cpu_times() -> list[list[int]]:
    rows = []
    for line in Path("/proc/stat").read_text().splitlines():
        if re.match(r"cpu\d+ ", line):
            rows.append([int(x) for x in line.split()[1:]])
    return rows


def steal_pct(a, b) -> list[float]:
    """Per host CPU: time this (virtual) machine's CPU was taken by its own hypervisor."""
    out = []
    for x, y in zip(a, b):
        d = [j - i for i, j in zip(x, y)]
        out.append(round(100.0 * (d[7] if len(d) > 7 else 0) / (sum(d) or 1), 2))
    return out


def busy_pct(a, b) -> list[float]:
    out = []
    for x, y in zip(a, b):
        d = [j - i for i, j in zip(x, y)]
        tot = sum(d) or 1
        idle = d[3] + (d[4] if len(d) > 4 else 0)
        out.append(round(100.0 * (tot - idle) / tot, 1))
    return out


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def top_procs(n=6) -> list[str]:
    p = sh(["ps", "-eo", "pcpu,etime,comm", "--sort=-pcpu"])
    return [" ".join(l.split()) for l in p.stdout.splitlines()[1:n + 1]]


def machine(man: dict, accel: str, why: str, a) -> dict:
    cpu = ivtvm.cpu_identity()
    flags = ivtvm.cpu_flags()
    git = sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip()
    dirty = sh(["git", "-C", str(ROOT), "status", "--porcelain", "--", "guest/kmod", "abi",
                "host", "bench/eval", "vm"]).stdout.splitlines()
    mem_kb = next((int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines()
                   if l.startswith("MemTotal")), 0)
    return {
        "host": socket.gethostname(),
        "host_cpu": cpu, "host_cpus": os.cpu_count(), "host_mem_gib": round(mem_kb / 2**20, 1),
        "host_hypervisor_flag": "hypervisor" in flags,
        "host_vmx_svm": sorted(flags & {"vmx", "svm"}),
        "host_kernel": platform.release(), "host_kernel_version": platform.version(),
        "accel": accel, "accel_reason": why,
        "guest_kernel": man["kernel_version"], "guest_cpus": a.smp, "guest_mem": a.mem,
        "versions": {
            "qemu": first_line([ivtvm.QEMU, "--version"]),
            "babeltrace2": first_line(["babeltrace2", "--version"]),
            "gcc": first_line(["gcc", "--version"]),
            "rustc": first_line(["rustc", "--version"]),
            "python": sys.version.split()[0],
            "ivtrace": first_line([str(IVTRACE), "--version"]),
            "ssh": first_line(["ssh", "-V"]),
            "dropbear": (sorted(p.name for p in (DROPBEAR / "debs").glob("dropbear-bin_*.deb"))
                         or ["none"])[0],
        },
        "ivtrace_git": {"commit": git,
                        "uncommitted": sorted({l[3:] for l in dirty if l.strip()})},
    }


def wait_for_quiet(max_load: float, max_wait: float) -> dict:
    """Wait (up to max_wait s) until the 1-minute load average is <= max_load."""
    t0 = time.monotonic()
    first = loadavg()
    while loadavg()[0] > max_load and time.monotonic() - t0 < max_wait:
        say(f"load average {loadavg()[0]:.2f} > {max_load}: waiting (other jobs on this "
            f"machine; {max_wait - (time.monotonic() - t0):.0f} s left)")
        time.sleep(30)
    la = loadavg()
    return {"max_load": max_load, "waited_s": round(time.monotonic() - t0, 1),
            "loadavg_first_seen": first, "loadavg_at_start": la,
            "quiet": la[0] <= max_load, "top_at_start": top_procs()}


# --------------------------------------------------------------------------- pinning

def qemu_threads(pid: int) -> dict[int, str]:
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(t.name)] = (t / "comm").read_text().strip()
        except OSError:
            pass
    return out


def pin_qemu(pid: int, vcpu_cpu: int, other_cpu: int) -> dict:
    """vCPU threads ("CPU n/TCG" or "CPU n/KVM", named with -name debug-threads=on) on
    vcpu_cpu, every other QEMU thread (main loop, RCU, workers for 9p/slirp) on other_cpu."""
    done = {"vcpu": [], "other": []}
    try:
        for tid, comm in qemu_threads(pid).items():
            is_vcpu = comm.startswith("CPU ")
            try:
                os.sched_setaffinity(tid, {vcpu_cpu if is_vcpu else other_cpu})
                done["vcpu" if is_vcpu else "other"].append(comm)
            except OSError:
                pass
    except OSError:
        pass
    return done


def thread_sched(pid: int) -> tuple[int, int, int]:
    """(vCPU run ns, vCPU run-queue wait ns, other QEMU threads' run ns) from
    /proc/PID/task/*/schedstat: what the host scheduler gave the guest, and what QEMU's
    I/O side (slirp, 9p, chardev, ivshmem needs none) cost."""
    run = wait = other = 0
    try:
        for t in Path(f"/proc/{pid}/task").iterdir():
            try:
                comm = (t / "comm").read_text().strip()
                r, w, _ = (int(x) for x in (t / "schedstat").read_text().split())
            except (OSError, ValueError):
                continue
            if comm.startswith("CPU "):
                run += r
                wait += w
            else:
                other += r
    except OSError:
        pass
    return run, wait, other


def proc_cpu_s(pid: int | None) -> float:
    """utime + stime of a process (all its threads), seconds."""
    if not pid:
        return 0.0
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class Sampler:
    """Host-side counters around every workload run (between the guest's `EV begin` and
    `EV m` lines): evidence of host contention (the vCPU thread waiting for its CPU) and the
    host CPU each transport costs (QEMU's I/O threads, the sink, the recorder or ssh)."""

    def __init__(self, qemu_pid: int, sink_pid: int, host: "Host"):
        self.qemu, self.sink, self.host = qemu_pid, sink_pid, host
        self.open: dict[tuple, dict] = {}
        self.done: dict[tuple, dict] = {}

    def snap(self) -> dict:
        run, wait, other = thread_sched(self.qemu)
        helper = sum(proc_cpu_s(p.pid) for p in list(self.host.proc.values())
                     if p.poll() is None)
        return {"t": time.monotonic(), "run": run, "wait": wait, "other": other,
                "sink": proc_cpu_s(self.sink), "helper": helper, "cpu": cpu_times()}

    def begin(self, key: tuple) -> None:
        self.open[key] = self.snap()

    def end(self, key: tuple) -> None:
        a = self.open.pop(key, None)
        if a is None:
            return
        b = self.snap()
        wall = b["t"] - a["t"]
        self.done[key] = {
            "wall_s": round(wall, 3),
            "vcpu_run_pct": round(100.0 * (b["run"] - a["run"]) / 1e9 / wall, 1),
            "vcpu_wait_pct": round(100.0 * (b["wait"] - a["wait"]) / 1e9 / wall, 2),
            "qemu_io_cpu_pct": round(max(0.0, 100.0 * (b["other"] - a["other"]) / 1e9 / wall), 1),
            "sink_cpu_pct": round(100.0 * (b["sink"] - a["sink"]) / wall, 1),
            "helper_cpu_pct": round(max(0.0, 100.0 * (b["helper"] - a["helper"]) / wall), 1),
            "host_cpu_busy_pct": busy_pct(a["cpu"], b["cpu"]),
            "host_cpu_steal_pct": steal_pct(a["cpu"], b["cpu"]),
        }


class ConsoleTail:
    """New complete lines of the console log file (written by ivtvm as QEMU prints)."""

    def __init__(self, path: Path):
        self.path, self.f, self.part = path, None, b""

    def lines(self) -> list[str]:
        if self.f is None:
            try:
                self.f = open(self.path, "rb")
            except OSError:
                return []
        data = self.part + self.f.read()
        *full, self.part = data.split(b"\n")
        return [ivtvm.clean_console(x).strip("\r") for x in full]

    def close(self) -> None:
        if self.f:
            self.f.close()


# --------------------------------------------------------------------------- host helpers

def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


class Host:
    """The host side of one run: recorder and ssh reader per configuration."""

    def __init__(self, a, work: Path, shm: Path, ssh_port: int, taskset: list[str]):
        self.a, self.work, self.shm, self.ssh_port, self.taskset = a, work, shm, ssh_port, taskset
        self.proc: dict[tuple, subprocess.Popen] = {}
        self.threads: list[threading.Thread] = []
        self.info: dict[tuple, dict] = {}
        self.commands: dict[str, str] = {}

    def start(self, kind: str, config: str, rep: int) -> None:
        key = (kind, config, rep)
        if kind == "recorder":
            out = self.work / "rec" / f"{config}-r{rep}"
            cmd = self.taskset + [str(IVTRACE), "record", "--shm", str(self.shm), "-o", str(out),
                                  "--force", "--json"]
            so = open(self.work / "rec" / f"{config}-r{rep}.json", "w")
            se = open(self.work / "rec" / f"{config}-r{rep}.log", "w")
        elif kind == "ssh":
            out = self.work / "ssh" / f"{config}-r{rep}.txt"
            cmd = self.taskset + [
                "ssh", "-T", "-p", str(self.ssh_port), "-i", str(DROPBEAR / "client_key"),
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=60",
                "root@127.0.0.1", "cat /sys/kernel/tracing/trace_pipe"]
            so = open(out, "wb")
            se = open(self.work / "ssh" / f"{config}-r{rep}.log", "w")
        else:
            raise EvalError(f"the guest asked for an unknown host helper '{kind}'")
        self.commands[kind] = shlex.join(cmd) + (f" > {out.name}" if kind == "ssh" else "")
        self.info[key] = {"out": str(out), "t0": time.monotonic()}
        self.proc[key] = subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
        so.close()
        se.close()

    def stop(self, kind: str, config: str, rep: int) -> None:
        """Collect a helper in a thread: the guest goes on with the next configuration at
        once, and the console must keep being followed meanwhile."""
        key = (kind, config, rep)
        p = self.proc.get(key)
        if p is None:
            raise EvalError(f"host-stop {kind} for {config} rep {rep} without a start")
        t = threading.Thread(target=self._finish, args=(kind, config, rep, p), daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        for t in self.threads:
            t.join()

    def _finish(self, kind: str, config: str, rep: int, p: subprocess.Popen) -> None:
        key = (kind, config, rep)
        how = "exited by itself"
        try:
            p.wait(timeout=60 if kind == "recorder" else 15)
        except subprocess.TimeoutExpired:
            how = "stopped with SIGINT"
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                how = "killed"
                p.kill()
                p.wait()
        self.proc.pop(key, None)
        inf = self.info[key]
        inf.update(rc=p.returncode, how=how, seconds=round(time.monotonic() - inf.pop("t0"), 2))
        out = Path(inf["out"])
        if kind == "recorder":
            js = self.work / "rec" / f"{config}-r{rep}.json"
            try:
                s = json.loads(js.read_text() or "{}")
            except ValueError:
                s = {}
            chans = s.get("channels", [])
            inf.update(events=sum(c.get("events", 0) for c in chans),
                       lost=sum(sum(c.get("lost", {}).values()) for c in chans),
                       trace_bytes=dir_bytes(out) if out.exists() else 0,
                       stop_reason=s.get("stop_reason"), elapsed_s=s.get("elapsed_s"),
                       warnings=s.get("warnings", [])[:5])
            if not self.a.keep_traces:
                shutil.rmtree(out, ignore_errors=True)
        else:
            inf.update(bytes=out.stat().st_size if out.exists() else 0)
            inf["stderr"] = (self.work / "ssh" / f"{config}-r{rep}.log").read_text()[-500:]
            if not self.a.keep_traces:
                out.unlink(missing_ok=True)

    def kill_all(self) -> None:
        for p in list(self.proc.values()):
            if p.poll() is None:
                p.kill()
                p.wait()


# --------------------------------------------------------------------------- the run

def run_eval(a) -> dict:
    man = ivtvm.ensure_built()
    kver = man["kernel_version"]
    need_ssh = "ft-ssh" in a.configs
    say(f"building (host tools, ivtrace.ko for {kver}, workloads"
        + (", dropbear for the SSH transport" if need_ssh else "") + ")")
    build_all(need_ssh, a.reuse_stale_binaries)

    accel, why = ivtvm.probe_accel(a.accel)
    info = machine(man, accel, why, a)
    ncpu = os.cpu_count() or 1
    pin = (not a.no_pin) and ncpu >= 2
    vcpu_cpu, other_cpu = 0, 1
    taskset = ["taskset", "-c", str(other_cpu)] if pin else []
    if pin:
        os.sched_setaffinity(0, {other_cpu})  # this script (console reader) off the vCPU's CPU

    conditions = wait_for_quiet(a.max_load, a.load_wait) if a.load_wait > 0 else {
        "max_load": a.max_load, "waited_s": 0, "loadavg_at_start": loadavg(),
        "quiet": loadavg()[0] <= a.max_load, "top_at_start": top_procs()}
    if not conditions["quiet"]:
        say(f"WARNING: load average {conditions['loadavg_at_start'][0]:.2f} above "
            f"{a.max_load}; measuring anyway (recorded in the results)")

    # the same primitives natively, on the CPU the vCPU thread will use (before it runs)
    hc = sh((["taskset", "-c", str(vcpu_cpu)] if pin else []) +
            [str(WL_OUT / "ev-helper"), "tcgcost"])
    host_calib = {k: float(v) for k, v in re.findall(r"(\w+)_ns=(-?[\d.]+)", hc.stdout)}

    base = Path(a.work_dir)
    work = base / f"ivtrace-eval-{os.getpid()}"
    for d in ("share", "rec", "ssh", "sink"):
        (work / d).mkdir(parents=True, exist_ok=True)
    shm = Path(f"/dev/shm/ivt-eval-{os.getpid()}")
    sock = work / "vserial.sock"
    ssh_port = free_port()

    sink_cmd = taskset + [sys.executable, str(HERE / "sink.py"), "--dir", str(work / "sink"),
                          "--unix", str(sock)] + (["--keep"] if a.keep_traces else [])
    sink = subprocess.Popen(sink_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = sink.stdout.readline()
    m = re.match(r"SINK port=(\d+)", line)
    if not m:
        sink.kill()
        raise SystemExit(f"eval: the sink did not start: {line}{sink.stderr.read()}")
    port = int(m.group(1))

    guest_args = [str(a.reps), f"{a.secs:g}", ",".join(a.workloads), ",".join(a.configs),
                  str(port), str(a.buf_kb), f"{a.warm:g}"]
    guest_cmd = "sh /bench/evalguest.sh " + " ".join(guest_args)
    adds = [str(KMOD / "ivtrace.ko"), f"{GUEST_SCRIPT}:/bench/evalguest.sh"]
    adds += [str(WL_OUT / n) for n in ("ev-int", "ev-syscall", "ev-tar", "ev-gzip",
                                        "ev-forkexec", "ev-nop", "ev-helper")]
    if need_ssh:
        adds += dropbear_adds()
    extra = ["-name", "ivt-eval,debug-threads=on",
             "-nic", f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{ssh_port}-:22",
             "-device", "virtio-serial-pci",
             "-chardev", f"socket,id=evs,path={sock}",
             "-device", f"virtserialport,chardev=evs,name={VPORT_NAME}"]
    host = Host(a, work, shm, ssh_port, taskset)
    date = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.monotonic()
    cpu0 = cpu_times()
    say(f"{accel} ({why}); guest {kver}, {a.smp} vCPU, {a.mem}; {a.reps} rep(s) x "
        f"{len(a.configs)} configurations x {len(a.workloads)} workloads x {a.secs:g} s; "
        f"pinning {'vCPU -> CPU %d, QEMU I/O + host helpers -> CPU %d' % (vcpu_cpu, other_cpu) if pin else 'off'}; "
        f"work dir {work}")
    vm = ivtvm.VM(guest_cmd, shm=str(shm), shm_size=a.shm_size, shm_clear=True, smp=a.smp,
                  mem=a.mem, accel=a.accel, add=adds, share=str(work / "share"),
                  append="ivtrace.net=dhcp", extra_args=extra, initrd="base",
                  log=str(work / "console.log"))
    pins = []
    share_files: dict[str, int] = {}
    error = None
    r = None
    tail = ConsoleTail(work / "console.log")
    sampler = None
    try:
        vm.start()
        sampler = Sampler(vm.proc.pid, sink.pid, host)
        deadline = t0 + a.timeout
        while time.monotonic() < deadline:
            exited = vm.proc.poll() is not None
            for ln in tail.lines():
                bm = re.match(r"^EV (begin|m) rep=(\d+) config=(\S+) workload=(\S+)", ln)
                if bm:
                    key = (int(bm.group(2)), bm.group(3), bm.group(4))
                    (sampler.begin if bm.group(1) == "begin" else sampler.end)(key)
                if pin and (ln.startswith("IVTRACE-GUEST: booted") or " start uptime=" in ln):
                    pins.append(pin_qemu(vm.proc.pid, vcpu_cpu, other_cpu))
                sm = re.match(r"^EV stat config=(ft-9p) rep=(\d+) ", ln)
                if sm:  # the guest's reader is gone: size the share file, then drop it
                    f = work / "share" / f"{sm.group(1)}-r{sm.group(2)}.txt"
                    if f.exists():
                        share_files[f.name] = f.stat().st_size
                        if not a.keep_traces:
                            f.unlink()
                hm = RE_HOST.match(ln)
                if hm:
                    (host.start if hm.group(1) == "start" else host.stop)(
                        hm.group(2), hm.group(3), int(hm.group(4)))
                if ln.startswith("EV m ") or ln.startswith("EV error") or \
                        ln.startswith("EV warm") or (" start uptime=" in ln and a.verbose):
                    print("  " + ln, flush=True)
                if ln.startswith("EV error"):
                    error = ln[len("EV error "):]
            if exited:
                break
            time.sleep(0.02)
        r = vm.wait(timeout=max(1.0, deadline - time.monotonic()))
    except EvalError as e:
        error = str(e)
    finally:
        vm.kill()
        tail.close()
        host.join()
        host.kill_all()
        sink.send_signal(signal.SIGTERM)
        try:
            sink.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sink.kill()
        shm.unlink(missing_ok=True)
    cpu1 = cpu_times()
    text = vm.console_text
    if error is None:
        em = re.search(r"^EV error (.*)$", text, re.M)
        error = em.group(1) if em else None
    sinkres = {}
    try:
        sinkres = json.loads((work / "sink" / "sink.json").read_text())
    except (OSError, ValueError):
        pass
    for f in (work / "share").glob("*.txt"):
        share_files.setdefault(f.name, f.stat().st_size)
    if not a.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    if error:
        raise EvalError(f"the guest reported: {error}\n--- console tail ---\n"
                        + "\n".join(text.splitlines()[-25:]))
    if r is None or not r.ok or "EV done" not in text:
        raise EvalError(f"the guest run did not finish: "
                        f"{r.summary() if r else 'no result'}\n--- console tail ---\n"
                        + "\n".join(text.splitlines()[-25:]))

    ms = [{"rep": int(x[0]), "config": x[1], "workload": x[2], "score": float(x[3]),
           "unit": x[4], "ops": int(x[5]), "elapsed_s": float(x[6]), "events": int(x[7]),
           "lost": int(x[8])} for x in RE_M.findall(text)]
    for m_ in ms:
        h = sampler.done.get((m_["rep"], m_["config"], m_["workload"])) if sampler else None
        if h:
            m_["host"] = h
    stats = []
    for cfg, rep, rest in RE_STAT.findall(text):
        kv = dict(re.findall(r"(\w+)=(\d+)", rest))
        stats.append({"config": cfg, "rep": int(rep), **{k: int(v) for k, v in kv.items()}})
    transport = []
    for (kind, cfg, rep), inf in sorted(host.info.items()):
        transport.append({"transport": "ivtrace-record" if kind == "recorder" else "ssh",
                          "config": cfg, "rep": rep,
                          **{k: v for k, v in inf.items() if k != "out"}})
    for s in sinkres.get("segments", []):
        transport.append({"transport": s["transport"], "config": s["config"], "rep": s["rep"],
                          "bytes": s["bytes"], "lines": s["lines"], "seconds": s["seconds"]})
    for name, size in sorted(share_files.items()):
        mm = re.match(r"(\S+)-r(\d+)\.txt$", name)
        if mm:
            transport.append({"transport": "9p", "config": mm.group(1), "rep": int(mm.group(2)),
                              "bytes": size})
    ev_info = re.findall(r"^EV info (kernel=.*)$", text, re.M)
    gc = re.search(r"^EV calib EVH tcgcost (.*)$", text, re.M)
    calibration = {
        "what": "ns per operation, best of 3 rounds, net of an empty loop (ev-helper tcgcost)",
        "host_native": host_calib,
        "guest": ({k: float(v) for k, v in re.findall(r"(\w+)_ns=(-?[\d.]+)", gc.group(1))}
                  if gc else {}),
    }
    params = {"reps": a.reps, "secs": a.secs, "warm_secs": a.warm, "workloads": a.workloads,
              "configs": a.configs, "buf_kb": a.buf_kb, "smp": a.smp, "mem": a.mem,
              "shm_size": a.shm_size, "quick": a.quick,
              "pinning": ({"vcpu_cpu": vcpu_cpu, "other_cpu": other_cpu,
                           "applied": pins[-1] if pins else None} if pin else None)}
    res = {
        "schema": "ivtrace-eval/1",
        "date": date.isoformat(timespec="seconds"),
        "argv": sys.argv,
        "reproduce": "bench/eval/run " + shlex.join(sys.argv[1:]),
        "duration_s": round(time.monotonic() - t0, 1),
        "machine": info,
        "guest_info": ev_info[0] if ev_info else None,
        "conditions": {**conditions, "loadavg_after": loadavg(), "top_after": top_procs(),
                       "host_cpu_busy_pct": busy_pct(cpu0, cpu1),
                       "host_cpu_steal_pct": steal_pct(cpu0, cpu1)},
        "params": params,
        "commands": {
            "qemu": shlex.join(r.cmd),
            "guest": guest_cmd,
            "guest_script": "bench/eval/guest/evalguest.sh",
            "workloads": {"int": "ev-int -t SECS", "syscall": "ev-syscall -t SECS -d /tmp",
                          "tar": "ev-tar -t SECS -d /tmp", "gzip": "ev-gzip -t SECS -d /tmp",
                          "forkexec": "ev-forkexec -t SECS"},
            "sink": shlex.join(sink_cmd),
            **{f"host_{k}": v for k, v in host.commands.items()},
            "guest_readers": {
                "ft-net": f"( echo IVTEVAL ...; exec cat /sys/kernel/tracing/trace_pipe ) | "
                          f"nc 10.0.2.2 {port}",
                "ft-9p": "cat /sys/kernel/tracing/trace_pipe > /mnt/host/CONFIG-rREP.txt",
                "ft-vserial": f"cat /sys/kernel/tracing/trace_pipe > /dev/vportNpM "
                              f"(name {VPORT_NAME})",
                "ft-ssh": "(host) ssh root@guest 'cat /sys/kernel/tracing/trace_pipe' > FILE",
            },
            "ivtrace_insmod": {
                "ivt-idle": f"insmod ivtrace.ko events=none subbuf_size=65536 "
                            f"nr_subbufs={a.buf_kb // 64} user_channels=0",
                "ivt-flight": f"insmod ivtrace.ko events=sched,irq,timer,kmem mode=overwrite "
                              f"subbuf_size=65536 nr_subbufs={a.buf_kb // 64} user_channels=0",
                "ivt-stream": f"insmod ivtrace.ko events=sched,irq,timer,kmem mode=discard "
                              f"subbuf_size=65536 nr_subbufs={a.buf_kb // 64} user_channels=0",
            },
        },
        "boot": {"duration_s": round(r.duration, 1), "boot_time_s": r.boot_time,
                 "kernel_problems": r.kernel_problems},
        "calibration": calibration,
        "measurements": ms,
        "tracer_stats": stats,
        "transport": transport,
        "sink_errors": sinkres.get("errors", []),
        "build_warnings": BUILD_WARNINGS,
    }
    res["summary"] = evalreport.summarize(res)
    return res


def check_complete(res: dict) -> list[str]:
    """What could not be measured: every (config, workload, rep) must have a score; every
    traced configuration must have seen events; every transport must have carried bytes."""
    p = res["params"]
    have = {(m["config"], m["workload"], m["rep"]) for m in res["measurements"]}
    bad = []
    for c in p["configs"]:
        for w in p["workloads"]:
            for rep in range(1, p["reps"] + 1):
                if (c, w, rep) not in have:
                    bad.append(f"no score for {w} under {c} (rep {rep})")
    for c in p["configs"]:
        if c in ("bare", "ivt-idle"):
            continue
        n = sum(m["events"] for m in res["measurements"] if m["config"] == c)
        if n <= 0:
            bad.append(f"{c}: the tracer recorded no event during the workloads")
    want = {"ivt-stream": "ivtrace-record", "ft-net": "tcp", "ft-ssh": "ssh", "ft-9p": "9p",
            "ft-vserial": "vserial"}
    for c, t in want.items():
        if c not in p["configs"]:
            continue
        for rep in range(1, p["reps"] + 1):
            seg = [x for x in res["transport"] if x["config"] == c and x["rep"] == rep
                   and x["transport"] == t]
            if not seg:
                bad.append(f"{c} rep {rep}: nothing arrived through {t}")
                continue
            x = seg[0]
            size = x.get("bytes", x.get("trace_bytes", 0))
            if size <= 0 or (t == "ivtrace-record" and x.get("events", 0) <= 0):
                bad.append(f"{c} rep {rep}: {t} carried no trace data ({x})")
            if t in ("ivtrace-record", "ssh") and x.get("rc") not in (0, None) and \
                    not (t == "ssh" and x.get("rc") in (255, 143, 130) and size > 0):
                bad.append(f"{c} rep {rep}: the host's {t} exited {x.get('rc')} "
                           f"({x.get('how')}): {x.get('stderr', '')}")
    for e in res.get("sink_errors", []):
        bad.append(f"sink: {e}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/eval/run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke mode: 1 repetition, short workloads, every transport and state "
                         "once; *-quick.json; does not touch docs/performance.md")
    ap.add_argument("--reps", type=int, help="repetitions (default 5; quick 1)")
    ap.add_argument("--secs", type=float, help="seconds per workload run (default 6; quick 1.5)")
    ap.add_argument("--warm", type=float, help="warm-up seconds per workload, before the first repetition (default 2; quick 0.5)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--buf-kb", type=int, default=4096,
                    help="per-CPU ring of both tracers, KiB, multiple of 64 (default 4096)")
    ap.add_argument("--shm-size", default="16M")
    ap.add_argument("--smp", type=int, default=1, help="guest vCPUs (default 1, as IVRing's)")
    ap.add_argument("--mem", default="512M")
    ap.add_argument("--accel", default="auto", choices=("auto", "kvm", "tcg"))
    ap.add_argument("--no-pin", action="store_true", help="do not pin QEMU and host helpers")
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--load-wait", type=float,
                    help="wait up to this many s for load <= --max-load (default 1800; quick 0)")
    ap.add_argument("--work-dir", default="/var/tmp",
                    help="disk directory for the host's trace files (default /var/tmp)")
    ap.add_argument("--keep-traces", action="store_true", help="keep every received trace")
    ap.add_argument("--keep-work", action="store_true", help="keep the work directory")
    ap.add_argument("--timeout", type=float, help="whole-run limit, s")
    ap.add_argument("--no-report", action="store_true",
                    help="do not regenerate docs/performance.md (full runs do by default)")
    ap.add_argument("-o", "--output", help="results file (default bench/results/eval/...)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--reuse-stale-binaries", action="store_true",
                    help="when a build fails, measure the binaries of an earlier build "
                         "(recorded in the results); without it a failed build is an error")
    a = ap.parse_args()
    q = a.quick
    a.reps = a.reps if a.reps is not None else (1 if q else 5)
    a.secs = a.secs if a.secs is not None else (1.5 if q else 6.0)
    a.warm = a.warm if a.warm is not None else (0.5 if q else 2.0)
    a.load_wait = a.load_wait if a.load_wait is not None else (0.0 if q else 1800.0)
    a.workloads = [w for w in a.workloads.split(",") if w]
    a.configs = [c for c in a.configs.split(",") if c]
    bad = [w for w in a.workloads if w not in WORKLOADS] + \
          [c for c in a.configs if c not in CONFIGS]
    if bad or not a.workloads or not a.configs:
        ap.error(f"unknown or empty workloads/configs: {bad}")
    if "bare" not in a.configs:
        ap.error("the bare configuration is the baseline: keep it in --configs")
    if a.buf_kb % 64 or a.buf_kb < 128:
        ap.error("--buf-kb must be a multiple of 64, at least 128")
    if not q and a.reps < 3:
        say(f"note: {a.reps} repetition(s); the method asks for >= 3 in a full run")
    per_cfg = len(a.workloads) * (a.secs + 1.5) + 6
    a.timeout = a.timeout or (600 + 3 * a.reps * len(a.configs) * per_cfg
                              + len(a.workloads) * a.warm)
    if os.geteuid() != 0:
        say("note: not root; building the guest or the module may fail")

    t0 = time.monotonic()
    try:
        res = run_eval(a)
    except EvalError as e:
        print(f"eval: FAILED: could not measure: {e}", file=sys.stderr)
        return 1
    except ivtvm.VMError as e:
        print(f"eval: FAILED: {e}", file=sys.stderr)
        return 2
    missing = check_complete(res)
    res["incomplete"] = missing
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = (f"{datetime.datetime.fromisoformat(res['date']).strftime('%Y-%m-%dT%H%M%S')}-"
            f"{socket.gethostname()}" + ("-quick" if q else ""))
    out = Path(a.output) if a.output else RESULTS / f"{name}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    say(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} "
        f"({res['duration_s']:.0f} s)")
    print(evalreport.text_table(res), flush=True)
    if missing:
        print("eval: FAILED: could not measure:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    if not q and not a.no_report and not a.output:
        png = evalreport.plot(res, out)
        if png:
            say(f"plot {png.relative_to(ROOT)}")
        p = sh([sys.executable, str(HERE.parent / "report.py")])
        sys.stderr.write(p.stderr)
        if p.returncode:
            print(f"eval: report.py failed:\n{p.stdout}", file=sys.stderr)
            return 1
    say(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
