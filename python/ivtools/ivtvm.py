"""Launch the ivtrace demo guest under QEMU (Python 3.11 standard library only).

Used by `vm/run` (CLI) and by tests:

    from ivtools import ivtvm
    r = ivtvm.boot(run="echo hi", shm="/dev/shm/ivt-test", shm_size="1M", timeout=120)
    assert r.ok and r.exit_code == 0, r.summary()

For a guest that runs while the host does something (a reader, `ivtrace serve`):

    with ivtvm.VM(run="/workload/demo.sh", shm="ivt0", shm_size="16M") as vm:
        vm.wait_for(r"IVTRACE-GUEST: run ", timeout=60)
        ...                                  # host side work
        r = vm.wait(timeout=120)             # BootResult; QEMU is killed on timeout

QEMU is never left running: timeouts, exceptions, Ctrl-C and interpreter exit all kill it.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import REPO
from .qmp import QMP, QMPError

DEFAULT_OUT = Path(os.environ.get("IVTRACE_VM_OUT", REPO / "vm" / "out"))
QEMU = os.environ.get("IVTRACE_QEMU", "qemu-system-x86_64")

MARK = "IVTRACE-GUEST:"
RE_BOOTED = re.compile(r"^IVTRACE-GUEST: booted\b(.*)$", re.M)
RE_EXIT = re.compile(r"^IVTRACE-GUEST: exit (-?\d+)\s*$", re.M)
RE_DMESG = re.compile(r"^IVTRACE-GUEST: dmesg: (.*)$", re.M)
RE_MODERR = re.compile(r"^IVTRACE-GUEST: module-error (\S+) rc=(\d+)", re.M)
RE_POWEROFF = re.compile(r"^IVTRACE-GUEST: poweroff\s*$", re.M)
RE_PANIC = re.compile(r"Kernel panic - not syncing: ?(.*)")
RE_ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|c|\(B)")

# Process exit codes of `vm/run` when the guest command's own status is unknown.
RC_TIMEOUT = 124
RC_PANIC = 99
RC_NO_MARKER = 98

# Console lines a failure message shows (BootResult.explain, VM.wait_for's errors).
CONSOLE_TAIL = 30

# The guest kernel's watchdogs (pr_emerg / pr_err: shown on the console even with `quiet`).
# Only the kernel's own console lines: /init's "IVTRACE-GUEST: dmesg: ..." relay at the end
# of a run repeats them, and must not be taken for a new stall.
RE_LOCKUP = re.compile(r"^(?:\s*\[\s*\d+\.\d+\]\s*)?"
                       r"(watchdog: BUG: soft lockup - CPU#\d+ stuck for \d+s!.*"
                       r"|rcu: INFO: \S+ (?:self-)?detected stalls?\b.*)$", re.M)
# A kernel log line on the console ("[   12.345678] ..."); any other line is the guest's
# userspace (/init, the test's script) talking, which is what "the guest progressed" means.
RE_KLOG = re.compile(r"^\s*\[\s*\d+\.\d+\]")
# How long a released guest may take to print a userspace line before the release is
# declared a failure (FINDINGS: 5-6 s for rmmod, ~85 s for disabling the kmem event group).
RELEASE_PATIENCE = 120.0


class VMError(Exception):
    """Bad options or a missing prerequisite (message says what to do)."""


class EnvironmentFaultWarning(UserWarning):
    """A guest stalled on a fault of the emulator, not of the guest, and was released
    (docs/kvm.md "TCG threading and patched kernel text"). Issued once per boot that needed
    it, so a test that passed only after a release says so in pytest's warnings summary."""


# --------------------------------------------------------------------------- accelerator

KVM_GET_API_VERSION = 0xAE00


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_identity() -> dict[str, str]:
    """The host CPU's vendor_id, cpu family, model and model name, as the
    first processor of /proc/cpuinfo gives them (benchmark records)."""
    keys = ("vendor_id", "cpu family", "model", "model name")
    ident: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        k, _, v = line.partition(":")
        k, v = k.strip(), v.strip()
        if k in keys and k not in ident:
            ident[k] = v
    return ident


def forced_choice(requested: str, choices: tuple[str, str], env_var: str,
                  what: str, option: str) -> tuple[str, str] | None:
    """(choice, reason) when the caller or the environment variable `env_var` picked one of
    `choices`; None for 'auto' (the caller's word wins over the environment's)."""
    requested = (requested or "auto").lower()
    env = os.environ.get(env_var, "").lower()
    if requested == "auto" and env in choices:
        return env, f"forced by {env_var}={env}"
    if requested in choices:
        return requested, f"forced ({option} {requested})"
    if requested != "auto":
        raise VMError(f"unknown {what} '{requested}' (use auto, {choices[0]} or {choices[1]})")
    return None


def probe_accel(requested: str = "auto") -> tuple[str, str]:
    """Return (accel, reason). 'auto' picks KVM only if /dev/kvm opens, answers
    KVM_GET_API_VERSION and the CPU flags show vmx or svm; otherwise TCG."""
    forced = forced_choice(requested, ("kvm", "tcg"), "IVTRACE_ACCEL", "accelerator", "--accel")
    if forced:
        return forced
    if not os.path.exists("/dev/kvm"):
        return "tcg", "/dev/kvm does not exist"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return "tcg", f"/dev/kvm cannot be opened ({e.strerror})"
    try:
        api = fcntl.ioctl(fd, KVM_GET_API_VERSION, 0)
    except OSError as e:
        return "tcg", f"/dev/kvm does not answer KVM_GET_API_VERSION ({e.strerror})"
    finally:
        os.close(fd)
    flags = cpu_flags()
    hw = sorted(flags & {"vmx", "svm"})
    if not hw:
        return "tcg", (f"/dev/kvm opens (API {api}) but /proc/cpuinfo shows neither vmx nor svm: "
                       "a nested/PVM-backed KVM that hangs a stock kernel")
    return "kvm", f"/dev/kvm usable (API {api}) and CPU has {hw[0]}"


def tcg_threading(requested: str, extra_args: Sequence[str]) -> tuple[str, str]:
    """Return (mode, reason): "single" (one host thread runs every vCPU) or "multi" (MTTCG,
    one host thread per vCPU). MTTCG can leave a vCPU running a stale translation of kernel
    text another vCPU patched (docs/kvm.md): only guests whose host threads a test names,
    pins or measures (`debug-threads=on`) get it, unless asked for."""
    forced = forced_choice(requested, ("single", "multi"), "IVTRACE_TCG_THREAD",
                           "TCG threading", "--tcg-thread")
    if forced:
        return forced
    if any("debug-threads=on" in str(a) for a in extra_args):
        return "multi", "the vCPU threads are named (debug-threads=on): one host thread per vCPU"
    return "single", "no test reads the vCPU threads: single-threaded TCG, immune to stale text"


# --------------------------------------------------------------------------- helpers

def parse_size(v: int | str) -> int:
    if isinstance(v, int):
        return v
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B)?\s*", str(v), re.I)
    if not m:
        raise VMError(f"bad size '{v}' (use e.g. 1048576, 4M, 1G)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2).upper()]


def qemu_escape(s: str) -> str:
    """QEMU option values: a literal ',' is written ',,'."""
    return s.replace(",", ",,")


def shm_path(shm: str | os.PathLike) -> Path:
    s = str(shm)
    return Path(s) if "/" in s else Path("/dev/shm") / s


def prepare_shm(path: Path, size: int, clear: bool = False) -> None:
    """Create/size the ivshmem backing file. QEMU needs a power-of-two size (it aborts otherwise)."""
    if size < 4096 or size & (size - 1):
        raise VMError(f"ivshmem size {size} is not a power of two >= 4096 "
                      "(QEMU asserts is_power_of_2 on the BAR size)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if clear:
            os.ftruncate(fd, 0)
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


def load_manifest(out: Path = DEFAULT_OUT) -> dict:
    f = Path(out) / "guest.json"
    if not f.is_file():
        raise VMError(f"{f} not found: build the guest first with vm/build")
    return json.loads(f.read_text())


def ensure_built(out: Path = DEFAULT_OUT) -> dict:
    """Build the guest if it is not there; if it is, only refresh the base initramfs when /init
    or the builder changed (no apt, no network)."""
    from . import guestbuild
    try:
        if (Path(out) / "guest.json").is_file():
            return guestbuild.build(out=Path(out), offline=True, final=False)
        return guestbuild.build(out=Path(out))
    except guestbuild.BuildError as e:
        raise VMError(f"building the guest failed: {e}") from e


_LIVE: set[VM] = set()


@atexit.register
def _kill_all() -> None:
    for vm in list(_LIVE):
        vm.kill()


# --------------------------------------------------------------------------- result

@dataclass
class BootResult:
    console_text: str            # serial console, \r and ANSI escapes removed
    exit_code: int | None        # the guest command's exit status (None: no "exit" marker)
    accel: str                   # "tcg" or "kvm"
    accel_reason: str
    duration: float              # seconds from QEMU start to QEMU exit
    panicked: bool               # "Kernel panic - not syncing" seen
    timed_out: bool              # QEMU was killed by the timeout
    qemu_returncode: int | None
    booted: bool                 # /init printed its "booted" marker
    powered_off: bool            # /init reached poweroff
    kernel_problems: list[str] = field(default_factory=list)  # dmesg BUG/WARNING/Oops lines
    module_errors: list[str] = field(default_factory=list)
    panic_message: str = ""
    boot_time: float | None = None  # seconds from QEMU start to the "booted" marker
    cmd: list[str] = field(default_factory=list)
    log_path: str | None = None
    vcpus: str = ""              # where each vCPU was when the timeout struck (vcpu_state)
    tcg_thread: str = ""         # "single" / "multi" under TCG, "" under KVM
    env_faults: list[str] = field(default_factory=list)  # stalls released (VM._release)

    @property
    def ok(self) -> bool:
        return (self.booted and self.exit_code == 0 and not self.panicked and not self.timed_out
                and not self.module_errors)

    @property
    def process_rc(self) -> int:
        """Exit status `vm/run` uses: the guest command's, else 124 timeout / 99 panic / 98."""
        if self.timed_out:
            return RC_TIMEOUT
        if self.panicked:
            return RC_PANIC
        if self.exit_code is None:
            return RC_NO_MARKER
        return self.exit_code & 0xFF

    def summary(self) -> str:
        state = ("TIMEOUT" if self.timed_out else "PANIC" if self.panicked else
                 f"exit {self.exit_code}" if self.exit_code is not None else "no exit marker")
        accel = f"{self.accel},thread={self.tcg_thread}" if self.tcg_thread else self.accel
        s = (f"guest {state}; accel={accel} ({self.accel_reason}); "
             f"{self.duration:.1f} s; qemu rc={self.qemu_returncode}")
        if self.panic_message:
            s += f"; panic: {self.panic_message}"
        if self.kernel_problems:
            s += f"; {len(self.kernel_problems)} kernel problem line(s)"
        if self.module_errors:
            s += f"; module errors: {', '.join(self.module_errors)}"
        for fault in self.env_faults:
            s += f"; {fault}"
        return s

    def tail(self, n: int = 40) -> str:
        """The console's last `n` lines, headed by the count and the log's path."""
        return console_tail(self.console_text, n, self.log_path)

    def explain(self, n: int = CONSOLE_TAIL) -> str:
        """The summary and the console's last `n` lines: the message of a failed assertion
        about this boot, so that it shows where the guest stopped (a timed-out guest's
        summary alone says nothing of that)."""
        vcpus = f"\nvCPUs at the timeout: {self.vcpus}" if self.vcpus else ""
        return f"{self.summary()}{vcpus}\n{self.tail(n)}"


def parse_console(text: str) -> dict:
    m = RE_EXIT.findall(text)
    pm = RE_PANIC.search(text)
    return {
        "exit_code": int(m[-1]) if m else None,
        "booted": bool(RE_BOOTED.search(text)),
        "powered_off": bool(RE_POWEROFF.search(text)),
        "panicked": pm is not None,
        "panic_message": pm.group(1).strip() if pm else "",
        "kernel_problems": RE_DMESG.findall(text),
        "module_errors": [f"{n} rc={rc}" for n, rc in RE_MODERR.findall(text)],
    }


# --------------------------------------------------------------------------- the VM

class VM:
    """One QEMU process running the demo guest. Options: see boot()."""

    def __init__(self, run: str | None = None, *,
                 script: str | os.PathLike | None = None,
                 run_via: str = "fw_cfg",
                 shm: str | os.PathLike | None = None,
                 shm_size: int | str = "16M",
                 shm_clear: bool = False,
                 doorbell: str | os.PathLike | None = None,
                 vectors: int = 2,
                 modules: Sequence[str] = (),
                 modopts: dict[str, str] | str | None = None,
                 add: Sequence[str] = (),
                 accel: str = "auto",
                 tcg_thread: str = "auto",
                 smp: int = 2,
                 mem: str = "512M",
                 append: str = "",
                 quiet: bool = True,
                 panic_on_oops: bool = False,
                 share: str | os.PathLike | None = None,
                 share_mount: str = "/mnt/host",
                 net: bool = False,
                 extra_args: Sequence[str] = (),
                 log: str | os.PathLike | None = None,
                 echo: bool = False,
                 interactive: bool = False,
                 initrd: str = "base",
                 out: str | os.PathLike = DEFAULT_OUT,
                 build: bool = True):
        self.opts = dict(locals())
        del self.opts["self"]
        self.proc: subprocess.Popen | None = None
        self.tmp: Path | None = None
        self.cmd: list[str] = []
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._eof = False
        self._reader: threading.Thread | None = None
        self._logf = None
        self.t0 = 0.0
        self.t_end: float | None = None
        self.t_booted: float | None = None
        self.timed_out = False
        self.vcpus = ""
        self.accel, self.accel_reason = probe_accel(accel)
        self.tcg_thread, why = ("", "") if self.accel == "kvm" else \
            tcg_threading(tcg_thread, extra_args)
        self.env_faults: list[str] = []
        self._lockup_scan = 0           # console offset the stall watch has read up to
        self._releasing = False
        self._releaser: threading.Thread | None = None
        if why:
            self.accel_reason += f"; thread={self.tcg_thread}: {why}"
        if not echo:
            print(f"ivtvm: accelerator {self.accel}: {self.accel_reason}", file=sys.stderr, flush=True)

    # ---- command line
    def build_command(self) -> list[str]:
        """Prepare the per-boot files (run script, overlay initrd, shm file); return QEMU's argv."""
        try:
            return self._build_command()
        except BaseException:
            self._cleanup()
            raise

    def _build_command(self) -> list[str]:
        o = self.opts
        out = Path(o["out"])
        man = ensure_built(out) if o["build"] else load_manifest(out)
        self.tmp = Path(tempfile.mkdtemp(prefix="ivtvm-"))
        a = self.accel
        accel = a if a == "kvm" else f"tcg,thread={self.tcg_thread}"
        cmd = [QEMU, "-machine", "q35", "-accel", accel, "-cpu", "host" if a == "kvm" else "max",
               "-smp", str(o["smp"]), "-m", str(o["mem"]),
               "-nographic", "-no-reboot",
               "-kernel", man["vmlinuz"], "-initrd", str(self._initrd(man))]
        app = ["console=ttyS0", "panic=-1"] + self._module_args()
        cmd += self._run_args(app)
        cmd += self._ivshmem_args()
        cmd += self._share_and_net_args(app)
        if o["append"]:
            app.append(o["append"])
        cmd += ["-append", " ".join(app)]
        # What a timeout reports of the vCPUs (vcpu_state) comes through this socket.
        cmd += ["-qmp", f"unix:{qemu_escape(str(self.qmp_path))},server=on,wait=off"]
        cmd += list(o["extra_args"])
        self.cmd = cmd
        return cmd

    @property
    def qmp_path(self) -> Path:
        assert self.tmp is not None, "build_command() first"
        return self.tmp / "qmp.sock"

    def _initrd(self, man: dict) -> Path:
        """The initramfs to boot: base, the vm/build one or a path, with the add= files
        appended as a second archive for this boot only."""
        o = self.opts
        choice = o["initrd"]
        initrd = Path(man["initramfs_base"] if choice == "base" else
                      man["initramfs"] if choice == "built" else choice)
        if not initrd.is_file():
            raise VMError(f"initramfs {initrd} not found (run vm/build)")
        if not o["add"]:
            return initrd
        from . import guestbuild
        try:
            overlay = guestbuild.overlay_initramfs(list(o["add"]), man["kernel_version"])
        except guestbuild.BuildError as e:
            raise VMError(str(e)) from e
        data = initrd.read_bytes()
        data += b"\0" * ((4 - len(data) % 4) % 4)
        combined = self.tmp / "initrd.img"
        combined.write_bytes(data + overlay)
        return combined

    def _module_args(self) -> list[str]:
        """Kernel command line: quiet, oops=panic, the modules /init loads and their options."""
        o = self.opts
        app = []
        if o["quiet"]:
            app.append("quiet")
        if o["panic_on_oops"]:
            app.append("oops=panic")
        mods = list(o["modules"])
        if mods:
            app.append("ivtrace.modules=" + ",".join(mods))
        mo = o["modopts"]
        if isinstance(mo, dict):
            mo = ";".join(f"{k}:{v}" for k, v in mo.items())
        if mo:
            app.append(cmdline_param("ivtrace.modopts", mo))
        return app

    def _run_args(self, app: list[str]) -> list[str]:
        """The guest's command: through fw_cfg (a file, QEMU args returned) or the kernel
        command line (appended to `app`)."""
        o = self.opts
        run, script = o["run"], o["script"]
        if run is not None and script is not None:
            raise VMError("give run= or script=, not both")
        if script is not None:
            run = Path(script).read_text()
        if run is None:
            if not o["interactive"]:
                app.append("ivtrace.interactive=0")  # nobody could type into the shell: just boot
            return []
        if o["run_via"] == "fw_cfg":
            f = self.tmp / "run.sh"
            f.write_text(run if run.endswith("\n") else run + "\n")
            return ["-fw_cfg", f"name=opt/ivtrace/run,file={qemu_escape(str(f))}"]
        if o["run_via"] == "cmdline":
            app.append(cmdline_param("ivtrace.run", run))
            return []
        raise VMError("run_via must be 'fw_cfg' or 'cmdline'")

    def _ivshmem_args(self) -> list[str]:
        """ivshmem-plain on a /dev/shm file (share=on, power-of-two size: docs/ivshmem.md)
        and/or ivshmem-doorbell on a server socket that must already listen."""
        o = self.opts
        cmd = []
        if o["shm"] is not None:
            p = shm_path(o["shm"])
            size = parse_size(o["shm_size"])
            prepare_shm(p, size, clear=o["shm_clear"])
            cmd += ["-object", f"memory-backend-file,id=ivshm0,size={size},share=on,"
                               f"mem-path={qemu_escape(str(p))}",
                    "-device", "ivshmem-plain,memdev=ivshm0"]
        if o["doorbell"] is not None:
            sock = Path(o["doorbell"])
            try:
                is_sock = stat.S_ISSOCK(sock.stat().st_mode)
            except OSError:
                is_sock = False
            if not is_sock:
                raise VMError(f"doorbell socket {sock} does not exist (or is not a socket): start "
                              "the ivshmem server (ivtrace serve) before QEMU, which blocks "
                              "until it has the version, id and shm messages")
            cmd += ["-chardev", f"socket,id=ivsh,path={qemu_escape(str(sock))}",
                    "-device", f"ivshmem-doorbell,chardev=ivsh,vectors={int(o['vectors'])}"]
        return cmd

    def _share_and_net_args(self, app: list[str]) -> list[str]:
        """A 9p share of a host directory, and user-mode networking (or none)."""
        o = self.opts
        cmd = []
        if o["share"] is not None:
            d = Path(o["share"]).resolve()
            if not d.is_dir():
                raise VMError(f"share {d} is not a directory")
            cmd += ["-virtfs", f"local,path={qemu_escape(str(d))},mount_tag=host0,"
                               "security_model=none,id=host0"]
            app.append(f"ivtrace.9p=host0:{o['share_mount']}")
        if o["net"]:
            cmd += ["-nic", "user,model=virtio-net-pci"]
            app.append("ivtrace.net=dhcp")
        else:
            cmd += ["-nic", "none"]
        return cmd

    # ---- process
    def start(self) -> VM:
        cmd = self.build_command()
        if shutil.which(cmd[0]) is None:
            self._cleanup()
            raise VMError(f"{cmd[0]} not found: run vm/build (it installs qemu-system-x86)")
        if self.opts["log"]:
            self._logf = open(self.opts["log"], "wb")
        interactive = self.opts["interactive"]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdin=None if interactive else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=not interactive)
        _LIVE.add(self)
        self._reader = threading.Thread(target=self._read, name="ivtvm-console", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        echo = self.opts["echo"]
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            if self._logf:
                self._logf.write(chunk)
                self._logf.flush()
            if echo:
                try:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                except (OSError, ValueError):
                    pass
            with self._cond:
                self._buf += chunk
                if self.t_booted is None and b"IVTRACE-GUEST: booted" in self._buf:
                    self.t_booted = time.monotonic()
                self._watch_stalls()
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    # ---- MTTCG stalls (docs/kvm.md "TCG threading and patched kernel text")
    def _watch_stalls(self) -> None:
        """Called by the console reader, self._cond held: on a soft-lockup or RCU-stall line
        of an MTTCG guest, release it (self._release) in a thread of its own. Single-threaded
        guests cannot stall this way: their console is not scanned."""
        if self.tcg_thread != "multi":
            return
        end = self._buf.rfind(b"\n") + 1
        if end <= self._lockup_scan:
            return
        new = clean_console(bytes(self._buf[self._lockup_scan:end]))
        self._lockup_scan = end
        if self._releasing or self.tmp is None:
            return
        m = RE_LOCKUP.search(new)
        if m:
            self._releasing = True
            self._releaser = threading.Thread(target=self._release, name="ivtvm-release",
                                              args=(m.group(1).strip(), end, self.qmp_path),
                                              daemon=True)
            self._releaser.start()

    def _release(self, line: str, offset: int, sock: Path) -> None:
        """A vCPU may be looping on a stale translation of patched text (an int3 that memory
        no longer holds). `singlestep on` changes the flags of every translated-block lookup,
        so stale blocks stop matching; once the guest's userspace prints again it goes off."""
        t0 = time.monotonic()
        try:
            qmp_hmp(sock, "singlestep on")
        except (OSError, ValueError, QMPError) as e:
            self._record(f"guest stalled ('{line}'); the release failed: QMP: {e}")
            return
        progressed = self._wait_userspace(offset, t0 + RELEASE_PATIENCE)
        took = time.monotonic() - t0
        try:
            qmp_hmp(sock, "singlestep off")
        except (OSError, ValueError, QMPError):
            pass  # QEMU exited meanwhile: nothing left to switch back
        if progressed:
            self._record(f"environment fault: QEMU MTTCG stale translation of patched kernel "
                         f"text ('{line}'); released with `singlestep on` after {took:.0f} s")
        else:
            self._record(f"guest stalled ('{line}') and printed nothing in {took:.0f} s of "
                         "`singlestep on`: not (only) QEMU's stale-translation fault")

    def _wait_userspace(self, offset: int, deadline: float) -> bool:
        """True once the console has a line after byte `offset` that is not a kernel log line
        (the guest's userspace ran), False at the deadline or when QEMU exits."""
        with self._cond:
            while True:
                end = self._buf.rfind(b"\n") + 1
                lines = clean_console(bytes(self._buf[offset:end])).splitlines()
                if any(ln.strip() and not RE_KLOG.match(ln) for ln in lines):
                    return True
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))

    def _record(self, fault: str) -> None:
        with self._cond:
            self.env_faults.append(fault)
            self._releasing = False
        print(f"ivtvm: {fault}", file=sys.stderr, flush=True)

    @property
    def console_text(self) -> str:
        with self._cond:
            raw = bytes(self._buf)
        return clean_console(raw)

    def _tail(self, n: int) -> str:
        """The console's last `n` lines (caller may hold self._cond: it is re-entrant)."""
        return console_tail(self.console_text, n, self.opts["log"])

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match:
        """Block until the console matches `pattern` (regex, multiline). Raises TimeoutError
        (QEMU left running: use wait()/kill()) or VMError if QEMU exited first."""
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                m = rx.search(clean_console(bytes(self._buf)))
                if m:
                    return m
                if self._eof:
                    raise VMError(f"QEMU exited before /{pattern}/ appeared:\n"
                                  + self._tail(CONSOLE_TAIL))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"/{pattern}/ not seen on the console within {timeout} s\n"
                                       + self._tail(CONSOLE_TAIL))
                self._cond.wait(min(left, 0.5))

    def wait(self, timeout: float | None = 120.0) -> BootResult:
        """Wait for QEMU to exit (killing it after `timeout` s); return the result."""
        assert self.proc is not None, "start() first"
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.vcpus = vcpu_state(self.qmp_path)
            self.kill()
        except BaseException:
            self.kill()
            raise
        finally:
            if self.t_end is None:
                self.t_end = time.monotonic()
        return self._result()

    def kill(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                if self.opts["interactive"]:
                    p.terminate()
                else:
                    os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                try:
                    if self.opts["interactive"]:
                        p.kill()
                    else:
                        os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        if self.t_end is None and self.proc is not None:
            self.t_end = time.monotonic()
        if self._reader is not None:
            self._reader.join(timeout=5)
            if not self._reader.is_alive() and self.proc and self.proc.stdout:
                self.proc.stdout.close()  # the reader is done with it
        _LIVE.discard(self)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._logf:
            self._logf.close()
            self._logf = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _result(self) -> BootResult:
        self.kill()  # joins the reader; no-op if already exited
        if self._releaser is not None:
            self._releaser.join(timeout=10)  # QEMU is gone: it records what it saw at once
        text = self.console_text
        info = parse_console(text)
        for fault in self.env_faults:
            warnings.warn(EnvironmentFaultWarning(fault), stacklevel=3)
        return BootResult(
            console_text=text, accel=self.accel, accel_reason=self.accel_reason,
            duration=(self.t_end or time.monotonic()) - self.t0, timed_out=self.timed_out,
            qemu_returncode=self.proc.returncode if self.proc else None,
            boot_time=(self.t_booted - self.t0) if self.t_booted else None,
            cmd=list(self.cmd), log_path=str(self.opts["log"]) if self.opts["log"] else None,
            vcpus=self.vcpus, tcg_thread=self.tcg_thread, env_faults=list(self.env_faults),
            **info)

    def __enter__(self) -> VM:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def qmp_hmp(sock: str | os.PathLike, command: str, timeout: float = 5.0) -> str:
    """Run a human monitor command (`info registers -a`) through a QEMU's QMP socket; its
    output. Raises OSError or QMPError when QEMU does not answer as QMP should."""
    q = QMP(sock, timeout=timeout)
    try:
        return str(q.cmd("human-monitor-command", **{"command-line": command}))
    finally:
        q.close()


RE_CPU = re.compile(r"^CPU#(\d+)", re.M)
RE_REGS = re.compile(r"\b([RE]IP)=([0-9a-f]+).*?\bCPL=(\d).*?\bHLT=(\d)", re.S)


def vcpu_state(sock: str | os.PathLike) -> str:
    """Where each vCPU of a running QEMU is: "CPU#0 halted (idle) at RIP ...; CPU#1 running
    kernel code at RIP ...". A guest that stopped printing is either idle, waiting for
    something that never comes (a lost interrupt, a timer), or spinning (a lockup): this
    tells which. Never raises: a QEMU that does not answer is said to."""
    try:
        regs = qmp_hmp(sock, "info registers -a")
    except (OSError, ValueError, QMPError) as e:
        return f"unknown (QEMU's monitor did not answer: {e})"
    parts = []
    starts = [m.start() for m in RE_CPU.finditer(regs)] + [len(regs)]
    for a, b in zip(starts, starts[1:]):
        cpu, m = RE_CPU.match(regs, a).group(1), RE_REGS.search(regs, a, b)
        if m is None:
            parts.append(f"CPU#{cpu} (registers not understood)")
            continue
        ip, addr, cpl, hlt = m.groups()
        what = "halted (idle)" if hlt == "1" else \
            f"running {'kernel' if cpl == '0' else 'user'} code"
        parts.append(f"CPU#{cpu} {what} at {ip} {addr}")
    return "; ".join(parts) or f"unknown (no CPU in `info registers -a`: {regs[:200]!r})"


def console_tail(text: str, n: int, log_path: str | os.PathLike | None = None) -> str:
    """The last `n` lines of a console, headed by how many there are and where the whole
    console was written (if it was)."""
    lines = text.splitlines()
    if not lines:
        return "(the console printed nothing" + (f"; log {log_path})" if log_path else ")")
    where = f"; all {len(lines)} in {log_path}" if log_path else ""
    shown = lines[-n:]
    return "\n".join([f"--- console, last {len(shown)} of {len(lines)} lines{where} ---",
                      *shown, "--- end of console ---"])


def clean_console(raw: bytes) -> str:
    return RE_ANSI.sub("", raw.decode("utf-8", "replace").replace("\r", ""))


def cmdline_param(key: str, value: str) -> str:
    """key=value for the kernel command line, double-quoted when it has blanks. The kernel has no
    escape for a double quote inside a quoted value and no newlines: those are refused."""
    if '"' in value or "\n" in value:
        raise VMError(f"{key}: a kernel command line value cannot contain '\"' or a newline; "
                      "pass the command through fw_cfg (run_via='fw_cfg', the default)")
    return f'{key}="{value}"' if re.search(r"\s", value) else f"{key}={value}"


def boot(run: str | None = None, *, timeout: float | None = 120.0, **kw) -> BootResult:
    """Boot the guest, run `run` (a shell script/command, passed via fw_cfg), power off.

    Keyword options (all optional): script (host file with the command), run_via ('fw_cfg' |
    'cmdline'), shm (name under /dev/shm or a path), shm_size (power of two, '16M'), shm_clear,
    doorbell (ivshmem server socket), vectors (2), modules (names or guest paths), modopts
    ({name: "k=v k2=v2"}), add (["SRC[:DEST]", ...] appended to the initramfs), accel ('auto' |
    'kvm' | 'tcg'), tcg_thread ('auto' | 'single' | 'multi', see tcg_threading), smp, mem,
    append (extra kernel args), quiet, panic_on_oops, share (host dir
    mounted with 9p at share_mount), net, extra_args (QEMU args), log (console file), echo,
    initrd ('base' | 'built' | path), out, build.
    """
    vm = VM(run, **kw)
    vm.start()
    try:
        return vm.wait(timeout=timeout)
    finally:
        vm.kill()


# --------------------------------------------------------------------------- CLI

def _parser() -> argparse.ArgumentParser:
    """vm/run's command line: what to run in the guest, the devices, the machine, the console."""
    ap = argparse.ArgumentParser(
        prog="vm/run",
        description="Boot the ivtrace demo guest under QEMU. The exit status is the guest "
                    f"command's ({RC_TIMEOUT} timeout, {RC_PANIC} kernel panic, {RC_NO_MARKER} no "
                    "exit marker). Arguments after '--' go to QEMU.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--run", "-c", metavar="CMD", help="shell command run in the guest (via fw_cfg)")
    g.add_argument("--script", metavar="FILE", help="host file with a shell script to run in the guest")
    ap.add_argument("--run-via", choices=("fw_cfg", "cmdline"), default="fw_cfg")
    ap.add_argument("--shm", metavar="NAME|PATH", help="ivshmem-plain backed by /dev/shm/NAME")
    ap.add_argument("--shm-size", default="16M", help="power of two (default 16M)")
    ap.add_argument("--shm-clear", action="store_true", help="zero the shm file first")
    ap.add_argument("--doorbell", metavar="SOCK", help="ivshmem-doorbell on this server socket")
    ap.add_argument("--vectors", type=int, default=2)
    ap.add_argument("--module", "-M", action="append", default=[], metavar="NAME|/PATH.ko",
                    help="module for the guest to load (repeatable, in order)")
    ap.add_argument("--modopts", metavar="NAME:OPTS;...", help='e.g. "ivtrace:size=1M verbose=1"')
    ap.add_argument("--add", action="append", default=[], metavar="SRC[:DEST]",
                    help="append a host file/dir to the initramfs for this boot (see vm/build)")
    ap.add_argument("--out", default=str(DEFAULT_OUT),
                    help="the guest build to boot (default vm/out; `vm/build --kernel SPEC` "
                         "builds others in vm/out/kernels/<ver>)")
    ap.add_argument("--initrd", default="built",
                    help="'built' (vm/out/initramfs.cpio.gz, default), 'base' or a path")
    ap.add_argument("--accel", default="auto", choices=("auto", "kvm", "tcg"))
    ap.add_argument("--tcg-thread", default="auto", choices=("auto", "single", "multi"),
                    help="TCG only: one host thread for all vCPUs (single) or one per vCPU "
                         "(multi, MTTCG); auto: multi only with `-name ...,debug-threads=on` "
                         "(docs/kvm.md)")
    ap.add_argument("--smp", type=int, default=2)
    ap.add_argument("--mem", default="512M")
    ap.add_argument("--append", default="", help="extra kernel command line")
    ap.add_argument("--verbose", "-v", action="store_true", help="no 'quiet' (full kernel log)")
    ap.add_argument("--panic-on-oops", action="store_true")
    ap.add_argument("--share", metavar="DIR", help="host dir mounted in the guest with 9p")
    ap.add_argument("--share-mount", default="/mnt/host")
    ap.add_argument("--net", action="store_true", help="user-mode network, DHCP in the guest")
    ap.add_argument("--timeout", type=float, default=None,
                    help="kill QEMU after this many seconds (default 600 with a command, none interactive)")
    ap.add_argument("--log", metavar="FILE", help="also write the console to FILE")
    ap.add_argument("--no-build", action="store_true", help="do not check/refresh vm/out first")
    ap.add_argument("--dry-run", action="store_true", help="print the QEMU command and exit")
    ap.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    ap.add_argument("qemu_args", nargs="*", help=argparse.SUPPRESS)
    return ap


def _vm_from_args(a: argparse.Namespace, interactive: bool) -> VM:
    """The VM the command line describes, its console echoed to this terminal."""
    return VM(a.run, script=a.script, run_via=a.run_via, shm=a.shm, shm_size=a.shm_size,
              shm_clear=a.shm_clear, doorbell=a.doorbell, vectors=a.vectors, modules=a.module,
              modopts=a.modopts, add=a.add, accel=a.accel, tcg_thread=a.tcg_thread, smp=a.smp,
              mem=a.mem, append=a.append,
              quiet=not a.verbose, panic_on_oops=a.panic_on_oops, share=a.share,
              share_mount=a.share_mount, net=a.net, extra_args=a.qemu_args, log=a.log,
              echo=True, interactive=interactive, initrd=a.initrd, out=a.out,
              build=not a.no_build)


def _run(vm: VM, timeout: float | None, interactive: bool) -> BootResult | int:
    """Boot the guest and wait for it: its result, or vm/run's exit status when it failed to
    boot (2) or was interrupted (130). QEMU is killed on every way out."""
    try:
        vm.start()
        print(f"vm/run: {shlex.join(vm.cmd)}", file=sys.stderr, flush=True)
        if interactive:
            print("vm/run: interactive console; Ctrl-A x quits QEMU", file=sys.stderr, flush=True)
        return vm.wait(timeout=timeout)
    except VMError as e:
        print(f"vm/run: ERROR: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        vm.kill()
        print("\nvm/run: interrupted, QEMU killed", file=sys.stderr)
        return 130
    finally:
        vm.kill()


def _dry_run(vm: VM) -> int:
    """--dry-run: print the QEMU command and clean up what building it made."""
    try:
        cmd = vm.build_command()
        print(shlex.join(cmd))
        vm._cleanup()
        return 0
    except VMError as e:
        print(f"vm/run: ERROR: {e}", file=sys.stderr)
        return 2
    finally:
        vm.kill()


def _report(r: BootResult, as_json: bool) -> None:
    """The result's summary on stderr, and with --json the whole result on stdout."""
    print(f"\nvm/run: {r.summary()}", file=sys.stderr)
    if r.boot_time is not None:
        print(f"vm/run: boot to /init: {r.boot_time:.1f} s", file=sys.stderr)
    if as_json:
        d = {k: v for k, v in r.__dict__.items() if k != "console_text"}
        print(json.dumps(d, indent=2))


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    has_cmd = a.run is not None or a.script is not None
    interactive = not has_cmd and sys.stdin.isatty()
    timeout = a.timeout if a.timeout is not None else (None if interactive else 600.0)
    vm = _vm_from_args(a, interactive)
    print(f"vm/run: accelerator {vm.accel}: {vm.accel_reason}", file=sys.stderr, flush=True)  # noqa
    if a.dry_run:
        return _dry_run(vm)
    r = _run(vm, timeout, interactive)
    if isinstance(r, int):
        return r
    _report(r, a.json)
    return r.process_rc


if __name__ == "__main__":
    sys.exit(main())
