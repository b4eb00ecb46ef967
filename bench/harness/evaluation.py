"""evaluation: the seeds' overhead tables, measured here, in one command.

Boots ONE real guest (python/ivtools/ivtvm.py; auto accelerator, TCG on these machines) with every
transport device present (ivshmem, virtio-net user networking, a 9p share, a virtio-serial
port), and runs bench/guest/evalguest.sh in it: per repetition every configuration
(ivtrace's tracing states and the alternatives) in a rotated order, each running every
workload (bench/guest/workloads: int, syscall, tar, gzip, forkexec) for SECS seconds.
The host side: `ivtrace record` for the streaming state, a TCP + virtio-serial sink
(sink.py) and an ssh client for the alternatives, all pinned to the CPU the vCPU is not on.

Overhead = (1 - score/bare) x 100 against the bare score of the same run (geometric means
over repetitions; spread: min..max of the per-repetition paired overheads and the standard
deviation of log scores; stats.py). Fails (exit 1, saying which) when a configuration, a
workload or a transport could not be measured; timings never fail a run. --quick: every
state and transport once, short workloads (`make test-eval`, part of `make test`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ivtools import ivtvm, proc
from ivtools.ports import free_ports
from ivtools.proc import sayer
from ivtools.qemu_threads import pin_qemu, vcpu_sched

from . import BenchError, guests, hostload, stats
from .hostload import busy_pct, cpu_times, loadavg, steal_pct, top_procs
from .results import ROOT

NAME = "evaluation"
HELP = "the seeds' overhead matrix: ivtrace's states vs ftrace over net/SSH/9p/virtio-serial"
HERE = Path(__file__).resolve().parent
DROPBEAR = ROOT / "build" / "bench" / "dropbear"
IVTRACE = ROOT / "bin" / "ivtrace"
GUEST_SCRIPT = ROOT / "bench" / "guest" / "evalguest.sh"

WORKLOADS = ["int", "syscall", "tar", "gzip", "forkexec"]
CONFIGS = ["bare", "ivt-idle", "ivt-flight", "ivt-stream", "ft-flight", "ft-net", "ft-ssh",
           "ft-9p", "ft-vserial"]
VPORT_NAME = "org.ivtrace.eval.trace"
RE_M = re.compile(r"^EV m rep=(\d+) config=(\S+) workload=(\S+) score=(\S+) unit=(\S+) "
                  r"ops=(\d+) elapsed=(\S+) events=(-?\d+) lost=(-?\d+)\s*$", re.M)
RE_STAT = re.compile(r"^EV stat config=(\S+) rep=(\d+) (.*)$", re.M)
RE_HOST = re.compile(r"^EV host-(start|stop) (\S+) config=(\S+) rep=(\d+)\s*$")


class EvalError(BenchError):
    """Something could not be measured (exit 1)."""


say = sayer("eval")
sh = functools.partial(proc.sh, check=False, error=EvalError)  # the callers read the exit status


# --------------------------------------------------------------------------- dropbear (SSH)

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
            raise EvalError(f"apt-get download {' '.join(pk)} failed (needed for the "
                             f"SSH transport; --configs without ft-ssh skips it):\n{p.stderr}")
        for deb in sorted(debs.glob("*.deb")):
            p = sh(["dpkg-deb", "-x", str(deb), str(root)])
            if p.returncode:
                raise EvalError(f"dpkg-deb -x {deb} failed: {p.stderr}")
    env = dict(os.environ, LD_LIBRARY_PATH=str(root / "usr/lib/x86_64-linux-gnu"))
    hk = DROPBEAR / "dropbear_ed25519_host_key"
    if not hk.is_file():
        p = sh([str(root / "usr/bin/dropbearkey"), "-t", "ed25519", "-f", str(hk)], env=env)
        if p.returncode:
            raise EvalError(f"dropbearkey failed: {p.stderr}")
    ck = DROPBEAR / "client_key"
    if not ck.is_file():
        p = sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ivtrace-eval",
                "-f", str(ck)])
        if p.returncode:
            raise EvalError(f"ssh-keygen failed (openssh-client): {p.stderr}")
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
        raise EvalError(f"ldd dropbear failed: {p.stderr}")
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


# --------------------------------------------------------------------------- QEMU's CPU time

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

    def __init__(self, qemu_pid: int, sink_pid: int, host: Host):
        self.qemu, self.sink, self.host = qemu_pid, sink_pid, host
        self.open: dict[tuple, dict] = {}
        self.done: dict[tuple, dict] = {}

    def snap(self) -> dict:
        run, wait, other = vcpu_sched(self.qemu)
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

def add_arguments(ap):
    ap.add_argument("--reps", type=int, help="repetitions (default 5; quick 1)")
    ap.add_argument("--secs", type=float, help="seconds per workload run (default 6; quick 1.5)")
    ap.add_argument("--warm", type=float, help="warm-up seconds per workload, before the first "
                                               "repetition (default 2; quick 0.5)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--buf-kb", type=int, default=4096,
                    help="per-CPU ring of both tracers, KiB, multiple of 64 (default 4096)")
    ap.add_argument("--shm-size", default="16M")
    ap.add_argument("--no-pin", action="store_true", help="do not pin QEMU and host helpers")
    ap.add_argument("--max-load", type=float, default=1.5)
    ap.add_argument("--load-wait", type=float,
                    help="wait up to this many s for load <= --max-load (default 1800; quick 0)")
    ap.add_argument("--work-dir", default="/var/tmp",
                    help="disk directory for the host's trace files (default /var/tmp)")
    ap.add_argument("--keep-traces", action="store_true", help="keep every received trace")
    ap.add_argument("--keep-work", action="store_true", help="keep the work directory")
    ap.add_argument("--timeout", type=float, help="whole-run limit, s")
    ap.add_argument("-v", "--verbose", action="store_true")
    guests.add_arguments(ap, smp=1)


def settle_arguments(a) -> None:
    """Quick-mode defaults and the checks argparse cannot express."""
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
        raise BenchError(f"unknown or empty workloads/configs: {bad}")
    if "bare" not in a.configs:
        raise BenchError("the bare configuration is the baseline: keep it in --configs")
    if a.buf_kb % 64 or a.buf_kb < 128:
        raise BenchError("--buf-kb must be a multiple of 64, at least 128")
    if not q and a.reps < 3:
        say(f"note: {a.reps} repetition(s); the method asks for >= 3 in a full run")
    per_cfg = len(a.workloads) * (a.secs + 1.5) + 6
    a.timeout = a.timeout or (600 + 3 * a.reps * len(a.configs) * per_cfg
                              + len(a.workloads) * a.warm)


class Setup:
    """The host side of one run: pinning, the work directory, the region, the sink, the
    recorder/ssh helpers, and what the guest is given."""

    def __init__(self, a, guest):
        self.a, self.guest = a, guest
        self.pin = (not a.no_pin) and (os.cpu_count() or 1) >= 2
        self.vcpu_cpu, self.other_cpu = 0, 1
        self.taskset = ["taskset", "-c", str(self.other_cpu)] if self.pin else []
        self.work = Path(a.work_dir) / f"ivtrace-eval-{os.getpid()}"
        for d in ("share", "rec", "ssh", "sink"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        self.shm = Path(f"/dev/shm/ivt-eval-{os.getpid()}")
        self.sock = self.work / "vserial.sock"
        [self.ssh_port] = free_ports(1)
        self.host = Host(a, self.work, self.shm, self.ssh_port, self.taskset)
        self.sink = self.sink_cmd = self.port = None

    def start_sink(self) -> None:
        self.sink_cmd = self.taskset + [sys.executable, str(HERE / "sink.py"), "--dir",
                                        str(self.work / "sink"), "--unix", str(self.sock)] + \
            (["--keep"] if self.a.keep_traces else [])
        self.sink = subprocess.Popen(self.sink_cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.sink.stdout.readline()
        m = re.match(r"SINK port=(\d+)", line)
        if not m:
            self.sink.kill()
            raise EvalError(f"the sink did not start: {line}{self.sink.stderr.read()}")
        self.port = int(m.group(1))

    def host_calibration(self) -> dict:
        """The guest's primitives, natively, on the CPU the vCPU thread will use."""
        hc = sh((["taskset", "-c", str(self.vcpu_cpu)] if self.pin else []) +
                [str(self.guest.files["ev-helper"]), "tcgcost"])
        return {k: float(v) for k, v in re.findall(r"(\w+)_ns=(-?[\d.]+)", hc.stdout)}

    def guest_command(self) -> str:
        a = self.a
        args = [str(a.reps), f"{a.secs:g}", ",".join(a.workloads), ",".join(a.configs),
                str(self.port), str(a.buf_kb), f"{a.warm:g}"]
        return "sh /bench/evalguest.sh " + " ".join(args)

    def vm(self, command: str) -> ivtvm.VM:
        a = self.a
        adds = self.guest.add("ivtrace.ko", *(n for n in self.guest.files if n.startswith("ev-")))
        adds.append(f"{GUEST_SCRIPT}:/bench/evalguest.sh")
        if "ft-ssh" in a.configs:
            adds += dropbear_adds()
        extra = ["-name", "ivt-eval,debug-threads=on",
                 "-nic", f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22",
                 "-device", "virtio-serial-pci",
                 "-chardev", f"socket,id=evs,path={self.sock}",
                 "-device", f"virtserialport,chardev=evs,name={VPORT_NAME}"]
        return ivtvm.VM(command, shm=str(self.shm), shm_size=a.shm_size, shm_clear=True,
                        smp=a.smp, mem=a.mem, accel=a.accel, add=adds,
                        share=str(self.work / "share"), append="ivtrace.net=dhcp",
                        extra_args=extra, initrd="base", log=str(self.work / "console.log"))

    def stop(self) -> None:
        self.host.join()
        self.host.kill_all()
        if self.sink is not None:
            self.sink.send_signal(signal.SIGTERM)
            try:
                self.sink.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.sink.kill()
        self.shm.unlink(missing_ok=True)


class Follower:
    """Reads the guest's console as it runs and acts on its lines: host helpers start and
    stop, samples around each workload run, pinning once QEMU's threads exist, 9p share
    files sized and dropped."""

    def __init__(self, s: Setup, vm: ivtvm.VM):
        self.s, self.vm = s, vm
        self.tail = ConsoleTail(s.work / "console.log")
        self.sampler = Sampler(vm.proc.pid, s.sink.pid, s.host)
        self.pins: list[dict] = []
        self.share_files: dict[str, int] = {}
        self.error: str | None = None

    def line(self, ln: str) -> None:
        s, a = self.s, self.s.a
        bm = re.match(r"^EV (begin|m) rep=(\d+) config=(\S+) workload=(\S+)", ln)
        if bm:
            key = (int(bm.group(2)), bm.group(3), bm.group(4))
            (self.sampler.begin if bm.group(1) == "begin" else self.sampler.end)(key)
        if s.pin and (ln.startswith("IVTRACE-GUEST: booted") or " start uptime=" in ln):
            self.pins.append(pin_qemu(self.vm.proc.pid, s.vcpu_cpu, s.other_cpu))
        sm = re.match(r"^EV stat config=(ft-9p) rep=(\d+) ", ln)
        if sm:  # the guest's reader is gone: size the share file, then drop it
            f = s.work / "share" / f"{sm.group(1)}-r{sm.group(2)}.txt"
            if f.exists():
                self.share_files[f.name] = f.stat().st_size
                if not a.keep_traces:
                    f.unlink()
        hm = RE_HOST.match(ln)
        if hm:
            (s.host.start if hm.group(1) == "start" else s.host.stop)(
                hm.group(2), hm.group(3), int(hm.group(4)))
        if ln.startswith(("EV m ", "EV error", "EV warm")) or \
                (" start uptime=" in ln and a.verbose):
            print("  " + ln, flush=True)
        if ln.startswith("EV error"):
            self.error = ln[len("EV error "):]

    def until_exit(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            exited = self.vm.proc.poll() is not None
            for ln in self.tail.lines():
                self.line(ln)
            if exited:
                break
            time.sleep(0.02)


def boot_and_follow(s: Setup, command: str, t0: float):
    """One boot of the whole matrix; returns (BootResult or None, Follower, console text)."""
    vm = s.vm(command)
    r = None
    fo = None
    try:
        vm.start()
        fo = Follower(s, vm)
        deadline = t0 + s.a.timeout
        try:
            fo.until_exit(deadline)
            r = vm.wait(timeout=max(1.0, deadline - time.monotonic()))
        except EvalError as e:
            fo.error = str(e)
    finally:
        vm.kill()
        if fo is not None:
            fo.tail.close()
        s.stop()
    return r, fo, vm


def check_finished(r, fo, text: str) -> None:
    error = fo.error
    if error is None:
        em = re.search(r"^EV error (.*)$", text, re.M)
        error = em.group(1) if em else None
    tail = "\n--- console tail ---\n" + "\n".join(text.splitlines()[-25:])
    if error:
        raise EvalError(f"the guest reported: {error}{tail}")
    if r is None or not r.ok or "EV done" not in text:
        raise EvalError(f"the guest run did not finish: "
                        f"{r.summary() if r else 'no result'}{tail}")


def transports(s: Setup, sinkres: dict, share_files: dict) -> list[dict]:
    """What reached the host per configuration and repetition, by transport."""
    out = []
    for (kind, cfg, rep), inf in sorted(s.host.info.items()):
        out.append({"transport": "ivtrace-record" if kind == "recorder" else "ssh",
                    "config": cfg, "rep": rep, **{k: v for k, v in inf.items() if k != "out"}})
    for x in sinkres.get("segments", []):
        out.append({"transport": x["transport"], "config": x["config"], "rep": x["rep"],
                    "bytes": x["bytes"], "lines": x["lines"], "seconds": x["seconds"]})
    for name, size in sorted(share_files.items()):
        mm = re.match(r"(\S+)-r(\d+)\.txt$", name)
        if mm:
            out.append({"transport": "9p", "config": mm.group(1), "rep": int(mm.group(2)),
                        "bytes": size})
    return out


def measurements(text: str, sampler: Sampler) -> list[dict]:
    ms = [{"rep": int(x[0]), "config": x[1], "workload": x[2], "score": float(x[3]),
           "unit": x[4], "ops": int(x[5]), "elapsed_s": float(x[6]), "events": int(x[7]),
           "lost": int(x[8])} for x in RE_M.findall(text)]
    for m_ in ms:
        h = sampler.done.get((m_["rep"], m_["config"], m_["workload"]))
        if h:
            m_["host"] = h
    return ms


def tracer_stats(text: str) -> list[dict]:
    out = []
    for cfg, rep, rest in RE_STAT.findall(text):
        kv = dict(re.findall(r"(\w+)=(\d+)", rest))
        out.append({"config": cfg, "rep": int(rep), **{k: int(v) for k, v in kv.items()}})
    return out


def commands(s: Setup, r, command: str) -> dict:
    a, port = s.a, s.port
    opts = f"subbuf_size=65536 nr_subbufs={a.buf_kb // 64} user_channels=0"
    return {
        "qemu": shlex.join(r.cmd),
        "guest": command,
        "guest_script": "bench/guest/evalguest.sh",
        "workloads": {"int": "ev-int -t SECS", "syscall": "ev-syscall -t SECS -d /tmp",
                      "tar": "ev-tar -t SECS -d /tmp", "gzip": "ev-gzip -t SECS -d /tmp",
                      "forkexec": "ev-forkexec -t SECS"},
        "sink": shlex.join(s.sink_cmd),
        **{f"host_{k}": v for k, v in s.host.commands.items()},
        "guest_readers": {
            "ft-net": f"( echo IVTEVAL ...; exec cat /sys/kernel/tracing/trace_pipe ) | "
                      f"nc 10.0.2.2 {port}",
            "ft-9p": "cat /sys/kernel/tracing/trace_pipe > /mnt/host/CONFIG-rREP.txt",
            "ft-vserial": f"cat /sys/kernel/tracing/trace_pipe > /dev/vportNpM "
                          f"(name {VPORT_NAME})",
            "ft-ssh": "(host) ssh root@guest 'cat /sys/kernel/tracing/trace_pipe' > FILE",
        },
        "ivtrace_insmod": {
            "ivt-idle": f"insmod ivtrace.ko events=none {opts}",
            "ivt-flight": f"insmod ivtrace.ko events=sched,irq,timer,kmem mode=overwrite {opts}",
            "ivt-stream": f"insmod ivtrace.ko events=sched,irq,timer,kmem mode=discard {opts}",
        },
    }


def read_sink(work: Path) -> dict:
    try:
        return json.loads((work / "sink" / "sink.json").read_text())
    except (OSError, ValueError):
        return {}


def quiet_conditions(a) -> dict:
    if a.load_wait > 0:
        c = hostload.wait_for_quiet(a.max_load, a.load_wait, say)
    else:
        c = {"max_load": a.max_load, "waited_s": 0, "loadavg_at_start": loadavg(),
             "quiet": loadavg()[0] <= a.max_load, "top_at_start": top_procs()}
    if not c["quiet"]:
        say(f"WARNING: load average {c['loadavg_at_start'][0]:.2f} above {a.max_load}; "
            "measuring anyway (recorded in the results)")
    return c


def versions_for(rec: dict) -> None:
    v = rec["machine"]["versions"]
    v["dropbear"] = (sorted(p.name for p in (DROPBEAR / "debs").glob("dropbear-bin_*.deb"))
                     or ["none"])[0]


def run(a, rec) -> list[str]:
    settle_arguments(a)
    say("building (host tools, the guest" + (", dropbear for the SSH transport"
                                             if "ft-ssh" in a.configs else "") + ")")
    guest = guests.build(a, rec, host_tools=True)
    if "ft-ssh" in a.configs:
        prepare_dropbear()
    versions_for(rec)
    accel = ivtvm.probe_accel(a.accel)
    guests.describe(rec, guest, accel, a.smp, a.mem)
    s = Setup(a, guest)
    if s.pin:
        os.sched_setaffinity(0, {s.other_cpu})  # this script (console reader) off the vCPU's CPU
    conditions = quiet_conditions(a)
    host_calib = s.host_calibration()
    s.start_sink()
    command = s.guest_command()
    t0 = time.monotonic()
    cpu0 = cpu_times()
    say(f"{accel[0]} ({accel[1]}); guest {guest.kernel_version}, {a.smp} vCPU, {a.mem}; "
        f"{a.reps} rep(s) x {len(a.configs)} configurations x {len(a.workloads)} workloads x "
        f"{a.secs:g} s; pinning " + (f"vCPU -> CPU {s.vcpu_cpu}, QEMU I/O + host helpers -> "
                                     f"CPU {s.other_cpu}" if s.pin else "off")
        + f"; work dir {s.work}")
    r, fo, vm = boot_and_follow(s, command, t0)
    cpu1 = cpu_times()
    text = vm.console_text
    sinkres = read_sink(s.work)
    for f in (s.work / "share").glob("*.txt"):
        fo.share_files.setdefault(f.name, f.stat().st_size)
    if not a.keep_work:
        shutil.rmtree(s.work, ignore_errors=True)
    check_finished(r, fo, text)
    gc = re.search(r"^EV calib EVH tcgcost (.*)$", text, re.M)
    ev_info = re.findall(r"^EV info (kernel=.*)$", text, re.M)
    data = rec["data"]
    data.update({
        "guest_info": ev_info[0] if ev_info else None,
        "conditions": {**conditions, "loadavg_after": loadavg(), "top_after": top_procs(),
                       "host_cpu_busy_pct": busy_pct(cpu0, cpu1),
                       "host_cpu_steal_pct": steal_pct(cpu0, cpu1)},
        "params": {"reps": a.reps, "secs": a.secs, "warm_secs": a.warm,
                   "workloads": a.workloads, "configs": a.configs, "buf_kb": a.buf_kb,
                   "smp": a.smp, "mem": a.mem, "shm_size": a.shm_size, "quick": a.quick,
                   "pinning": ({"vcpu_cpu": s.vcpu_cpu, "other_cpu": s.other_cpu,
                                "applied": fo.pins[-1] if fo.pins else None}
                               if s.pin else None)},
        "commands": commands(s, r, command),
        "boot": {"duration_s": round(r.duration, 1), "boot_time_s": r.boot_time,
                 "kernel_problems": r.kernel_problems},
        "calibration": {
            "what": "ns per operation, best of 3 rounds, net of an empty loop "
                    "(ev-helper tcgcost)",
            "host_native": host_calib,
            "guest": ({k: float(v) for k, v in re.findall(r"(\w+)_ns=(-?[\d.]+)", gc.group(1))}
                      if gc else {}),
        },
        "measurements": measurements(text, fo.sampler),
        "tracer_stats": tracer_stats(text),
        "transport": transports(s, sinkres, fo.share_files),
        "sink_errors": sinkres.get("errors", []),
    })
    data["summary"] = stats.summarize(data)
    data["incomplete"] = check_complete(data)
    print(text_table(rec), flush=True)
    return data["incomplete"]

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


def text_table(rec: dict) -> str:
    """The matrix as plain text for the console: overhead % per configuration and workload."""
    s = rec["data"]["summary"]
    p = rec["data"]["params"]
    ws = p["workloads"]
    lines = [f"overhead % vs bare (geometric mean of {p['reps']} rep(s); per-rep min..max), "
             f"{rec['accelerator']['name']}:"]
    lines.append(f"{'':<22}" + "".join(f"{w:>22}" for w in ws))
    for c in p["configs"]:
        cells = []
        for w in ws:
            x = s["workloads"].get(w, {}).get("configs", {}).get(c)
            if not x:
                cells.append(f"{'–':>22}")
            elif c == "bare":
                cells.append(f"{stats.fnum(x['geomean']) + ' ' + s['workloads'][w]['unit']:>22}")
            else:
                sp = (f" [{x['overhead_min_pct']:.0f}..{x['overhead_max_pct']:.0f}]"
                      if p["reps"] > 1 and x.get("overhead_min_pct") is not None else "")
                cells.append(f"{x['overhead_pct']:>8.1f}{sp:<14}")
        lines.append(f"{c:<22}" + "".join(cells))
    lines.append("contention-adjusted overhead % (score / (1 - vCPU run-queue wait)), and the "
                 "mean vCPU wait %:")
    for c in p["configs"]:
        cells = []
        for w in ws:
            x = s["workloads"].get(w, {}).get("configs", {}).get(c) or {}
            v = x.get("adj_overhead_pct")
            wt = x.get("vcpu_wait_pct")
            cells.append(f"{'' if v is None else f'{v:.1f}':>8}"
                         f"{'' if wt is None else f'  (w {wt:.0f} %)':<14}")
        lines.append(f"{c:<22}" + "".join(cells))
    return "\n".join(lines)


