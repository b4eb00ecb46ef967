"""ftrace: getting ftrace's events out of a guest, three ways, in one guest (docs/ftrace.md).

Boots the guest once (auto accelerator) with a virtio-blk disk, one virtio-serial port per
vCPU and ivtrace.ko ftrace=1 (events=none: the native probes stay off; the relay is started
by the bench script, not the module), `ivtrace record` draining the region on the host, and
runs bench/guest/ftbench.sh: configurations off / ft-ring (ftrace records, nobody reads) /
ft-file (trace_pipe_raw copied to a guest file) / ft-vserial (trace_pipe_raw to the host
through virtio-serial, the virtio-trace path) / ft-relay (the relay into the region: from
the mapped ring buffer where the kernel has one, 6.10+) / ft-relay-read (the same relay with
read(2) of trace_pipe_raw: side by side with ft-relay on one kernel, what the mapping
changes; `--kernel trixie-backports` runs it all on another guest kernel), each
under two loads: block (ftrace's block events, 4 KiB direct reads of the disk) and function
(the function tracer on every kernel function, a getppid() loop). Per run, ftrace's own
counters say how many events were produced, read by the transport and lost.

Figures (bench/reporting/ftrace.py): events/s each transport carried (read / workload
seconds); per-event cost, the time the run took beyond `off` (and beyond `ft-ring`: the
transport's share) divided by the events produced; the workload's slowdown.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
from pathlib import Path

from ivtools import ivtvm

from . import BenchError, guests, hostload
from .results import ROOT

NAME = "ftrace"
HELP = "the ftrace relay against ftrace to a guest file and over virtio-serial, in one guest"
SCRIPT = ROOT / "bench" / "guest" / "ftbench.sh"
CONFIGS = ["off", "ft-ring", "ft-file", "ft-vserial", "ft-relay", "ft-relay-read"]
RELAYS = ("ft-relay", "ft-relay-read")
LOADS = ["block", "function"]
RE_M = re.compile(r"^FB m rep=(\d+) config=(\S+) load=(\S+) ops=(\d+) seconds=([\d.]+) "
                  r"produced=(\d+) read=(\d+) overrun=(\d+) dropped=(\d+) bytes=(\d+)", re.M)


def add_arguments(ap):
    ap.add_argument("--reps", type=int, default=3, help="repetitions (rotated order)")
    ap.add_argument("--ios", type=int, default=3000, help="4 KiB direct reads per block run")
    ap.add_argument("--syscalls", type=int, default=100000, help="getppid() per function run")
    ap.add_argument("--buf-kb", type=int, default=1024, help="ftrace's per-CPU buffer, KiB")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--loads", default=",".join(LOADS))
    ap.add_argument("--timeout", type=float, default=1800, help="the whole boot, seconds")
    ap.add_argument("--kernel", metavar="SPEC",
                    help="the guest kernel (python/ivtools/buildroot.py: trixie, trixie-backports, an ABI "
                         "name); default: the default guest's")
    guests.add_arguments(ap, smp=2)


class PortSink:
    """The host end of one virtio-serial port: a listening Unix socket QEMU connects to;
    everything the guest writes goes to a file on disk, counted."""

    def __init__(self, path: Path, out: Path):
        self.path, self.out, self.bytes = path, out, 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(1)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn, open(self.out, "wb") as f:
            while True:
                b = conn.recv(1 << 16)
                if not b:
                    return
                f.write(b)
                self.bytes += len(b)

    def close(self):
        self.sock.close()


def med(v):
    return statistics.median(v) if v else None


def summarize(ms: list[dict]) -> dict:
    """Per load and configuration: the median over repetitions of the workload time, the
    events produced / read / lost, events/s carried, and the added time per event produced
    against `off` and against `ft-ring` (the transport's own share)."""
    out = {}
    for load in sorted({m["load"] for m in ms}):
        rows = {}
        for c in CONFIGS:
            xs = [m for m in ms if m["load"] == load and m["config"] == c]
            if not xs:
                continue
            rows[c] = {
                "runs": len(xs),
                "seconds": med([x["seconds"] for x in xs]),
                "ops_per_s": med([x["ops"] / x["seconds"] for x in xs if x["seconds"] > 0]),
                "produced": med([x["produced"] for x in xs]),
                "read": med([x["read"] for x in xs]),
                "lost_pct": med([100.0 * (x["produced"] - x["read"]) / x["produced"]
                                 for x in xs if x["produced"]]),
                "carried_per_s": med([x["read"] / x["seconds"] for x in xs if x["seconds"] > 0]),
                "bytes": med([x["bytes"] for x in xs]),
            }
        for c, row in rows.items():
            for base in ("off", "ft-ring"):
                b = rows.get(base)
                if c != base and b and row["produced"]:
                    row[f"ns_per_event_vs_{base}"] = (
                        1e9 * (row["seconds"] - b["seconds"]) / row["produced"])
            if "off" in rows and c != "off" and rows["off"]["seconds"]:
                row["slowdown_pct"] = 100.0 * (row["seconds"] / rows["off"]["seconds"] - 1)
        out[load] = rows
    return out


def qemu_args(work: Path, disk: Path, smp: int, sinks: list) -> list[str]:
    args = ["-drive", f"file={disk},if=virtio,format=raw", "-device", "virtio-serial-pci"]
    for n in range(smp):
        sock = work / f"vport{n}.sock"
        sinks.append(PortSink(sock, work / f"vport{n}.raw"))
        args += ["-chardev", f"socket,id=ivtft{n},path={sock}",
                 "-device", f"virtserialport,chardev=ivtft{n},name=ivtft{n}"]
    return args


def recorder(shm: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([str(guests.IVTRACE), "record", "--shm", str(shm), "-o", str(out),
                             "--force", "--json"], stdout=open(out.with_suffix(".json"), "wb"),
                            stderr=open(out.with_suffix(".log"), "wb"), stdin=subprocess.DEVNULL)


def host_recorded(out: Path) -> dict:
    """What the relay's channels brought to the host (the recording's sidecar)."""
    try:
        f = json.loads((out / "ivtrace.json").read_text()).get("ftrace") or {}
    except (OSError, ValueError):
        return {}
    return {"recorded": sum(c["recorded"] for c in f.get("cpus", [])),
            "lost": sum(c["lost"] for c in f.get("cpus", [])),
            "produced": sum(c["produced"] for c in f.get("cpus", []))}


def boot(a, guest, work: Path, command: str) -> tuple:
    disk = work / "disk.img"
    with open(disk, "wb") as f:
        f.truncate(256 << 20)
    shm = Path(f"/dev/shm/ivt-ftbench-{os.getpid()}")
    sinks: list = []
    extra = qemu_args(work, disk, a.smp, sinks)
    rec = recorder(shm, work / "rec")
    vm = ivtvm.VM(command, shm=str(shm), shm_size="64M", shm_clear=True, smp=a.smp,
                  out=guests.guest_out(guest), build=False,
                  mem=a.mem, accel=a.accel, modules=["ivtrace"],
                  modopts={"ivtrace": "ftrace=1 events=none ftrace_relay= printk_source=console"},
                  append="trace_clock=x86-tsc", extra_args=extra, quiet=False,
                  add=guest.add("ivtrace.ko", "ivtwl", "ivtrace-ftrace") +
                  [f"{SCRIPT}:/bench/ftbench.sh"])
    try:
        vm.start()
        r = vm.wait(timeout=a.timeout)
    finally:
        vm.kill()
        rec.send_signal(2)
        try:
            rec.wait(timeout=120)
        except subprocess.TimeoutExpired:
            rec.kill()
        for s in sinks:
            s.close()
        shm.unlink(missing_ok=True)
    return r, sinks, vm


def first_oops(text: str) -> str:
    """The guest kernel's first complaint (a soft lockup, an oops) with its backtrace: the
    console's tail only repeats the complaint."""
    m = re.search(r"^.*(BUG:|WARNING:|Oops).*$", text, re.M)
    if not m:
        return ""
    return "the guest kernel's first complaint:\n" + "\n".join(
        text[m.start():].splitlines()[:60]) + "\n...\n"


def run(a, rec) -> list[str]:
    if a.quick:
        a.reps, a.ios, a.syscalls = 1, 500, 3000
    guest = guests.build(a, rec, host_tools=True, kernel=a.kernel)
    args = [str(a.reps), str(a.ios), str(a.syscalls), str(a.buf_kb), a.configs, a.loads]
    command = "sh /bench/ftbench.sh " + " ".join(args)
    work = Path(tempfile.mkdtemp(prefix="ivt-ftbench-"))
    before = hostload.snapshot()
    print(f"ftrace bench: configs {a.configs}, loads {a.loads}, {a.reps} reps", flush=True)
    try:
        r, sinks, vm = boot(a, guest, work, command)
        guests.describe(rec, guest, (vm.accel, vm.accel_reason), a.smp, a.mem)
        text = r.console_text
        errs = re.findall(r"^FB error (.*)$", text, re.M)
        if errs or "FB done" not in text or not r.ok:
            raise BenchError(f"the ftrace bench failed: {errs or r.summary()}\n"
                             f"{first_oops(text)}{r.tail(40)}")
        host = host_recorded(work / "rec")
        vserial = sum(s.bytes for s in sinks)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ms = [{"rep": int(m[0]), "config": m[1], "load": m[2], "ops": int(m[3]),
           "seconds": float(m[4]), "produced": int(m[5]), "read": int(m[6]),
           "overrun": int(m[7]), "dropped": int(m[8]), "bytes": int(m[9])}
          for m in RE_M.findall(text)]
    for m in ms:
        print(f"  {m}")
    relay_read = sum(m["read"] for m in ms if m["config"] in RELAYS)
    rec["data"] = {
        "guest_command": command,
        "qemu_command": r.cmd,
        "params": {"reps": a.reps, "ios": a.ios, "syscalls": a.syscalls, "buf_kb": a.buf_kb,
                   "configs": a.configs.split(","), "loads": a.loads.split(","),
                   "smp": a.smp, "mem": a.mem},
        "guest_info": re.findall(r"^FB info (.*)$", text, re.M),
        "conditions": {"before": before, "after": hostload.snapshot()},
        "measurements": ms,
        "host": {"relay_recorded": host.get("recorded"), "relay_read_in_guest": relay_read,
                 "relay_host_lost": host.get("lost"), "vserial_bytes": vserial},
        "summary": summarize(ms),
    }
    return problems_of(rec["data"])


def problems_of(d: dict) -> list[str]:
    """What could not be measured: a transport that carried nothing, a relay recording
    without its ftrace section, virtio-serial ports that brought no byte."""
    problems = []
    for load, rows in d["summary"].items():
        for c, row in rows.items():
            if c not in ("off", "ft-ring") and not row["read"]:
                problems.append(f"{c} read no event of ftrace's under the {load} load")
    if set(RELAYS) & set(d["params"]["configs"]) and d["host"]["relay_recorded"] is None:
        problems.append("the recording of the relay's channels has no ftrace section")
    if "ft-vserial" in d["params"]["configs"] and not d["host"]["vserial_bytes"]:
        problems.append("the virtio-serial ports brought no byte to the host")
    return problems
