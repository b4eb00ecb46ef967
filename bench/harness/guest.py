"""guest: the hypertracing micro-benchmark, reproduced. ivtrace.ko against LTTng's kernel
tracer, ftrace and perf, recording the same tracepoints of the same kernel, in ONE guest.

Boots the guest once (python/ivtools/ivtvm.py; auto accelerator, TCG on these machines; one vCPU pinned
to host CPU 0, QEMU's other threads and every host helper on CPU 1) with the tracers built
for its kernel (python/ivtools/tracers.py) and runs bench/guest/guestbench.sh: per repetition every
configuration in a rotated order (off; ivtrace.ko as a flight recorder and streaming to
`ivtrace record` on the host; LTTng in snapshot and discard mode; ftrace's ring and
trace_pipe_raw to a file; perf record and perf trace), each with three workloads (getppid
with sys_enter/sys_exit traced, a pipe ping-pong, fork+exec), every run its own tracing
session. Every trace goes to the host (a 9p share; ivtrace's through its region) and is
counted there by name (tracecount.py), so the tracers' counts can be compared. Then a rate
phase: paced getppid under each streaming tracer with small buffers, for the event rate each
sustains before it drops. Timings never fail a run; a run fails (exit 1) when something
could not be measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ivtools import ivtvm
from ivtools.proc import sayer
from ivtools.qemu_threads import cpu_ns, pin_qemu, vcpu_sched

from . import BenchError, guest_native, guests, tracecount
from .evaluation import ConsoleTail
from .guest_stats import print_summary, summarize
from .hostload import busy_pct, cpu_times, loadavg, steal_pct, top_procs
from .results import ROOT

NAME = "guest"
HELP = "ivtrace.ko against LTTng, ftrace and perf on the same tracepoints, in one guest"
SCRIPT = ROOT / "bench" / "guest" / "guestbench.sh"
IVTRACE = ROOT / "bin" / "ivtrace"
PROOF = ROOT / "build" / "bench" / "guest" / "lttng-proof"
CONFIGS = ["off", "ivt-flight", "ivt-stream", "lttng-snapshot", "lttng-discard", "ft-ring",
           "ft-pipe", "perf-record", "perf-trace"]
WORKLOADS = ["getppid", "pingpong", "forkexec"]
RATE_CONFIGS = ["ivt-stream", "lttng-discard", "ft-pipe", "perf-record", "perf-trace"]
RATES = "20000,50000,100000,200000,400000"
KV = re.compile(r"(\w+)=(\"[^\"]*\"|\S+)")


say = sayer("guest")


def add_arguments(ap):
    ap.add_argument("--reps", type=int, help="repetitions, rotated order (default 5; quick 1)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--getppid", type=int, help="getppid calls per run (default 200000)")
    ap.add_argument("--pingpong", type=int, help="round trips per run (default 10000)")
    ap.add_argument("--forkexec", type=int, help="fork+exec per run (default 200)")
    ap.add_argument("--buf-kb", type=int, default=32768,
                    help="every tracer's per-CPU buffer in the measured runs, KiB (default "
                         "32768: a whole run fits, so flight recorders lose nothing)")
    ap.add_argument("--rates", help=f"getppid calls/s of the rate phase (default {RATES}; "
                                    "'' skips it; quick: one rate)")
    ap.add_argument("--rate-secs", type=float, default=4.0)
    ap.add_argument("--rate-buf-kb", type=int, default=1024,
                    help="per-CPU buffer in the rate phase, KiB (default 1024)")
    ap.add_argument("--rate-configs", default=",".join(RATE_CONFIGS))
    ap.add_argument("--max-load", type=float, default=0.5,
                    help="a quiet machine: 1-minute load average at most this, and no other "
                         "QEMU running (default 0.5)")
    ap.add_argument("--load-wait", type=float,
                    help="wait up to this many s for load <= --max-load (default 1800; quick 0)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin QEMU and host helpers")
    ap.add_argument("--work-dir", default="/var/tmp",
                    help="disk directory for the traces the host counts (default /var/tmp)")
    ap.add_argument("--keep-work", action="store_true", help="keep the work directory")
    ap.add_argument("--timeout", type=float, help="whole-run limit, s")
    guests.add_arguments(ap, smp=1, mem="1G")


def settle_arguments(a) -> None:
    """Quick-mode defaults and the checks argparse cannot express."""
    q = a.quick
    a.reps = a.reps if a.reps is not None else (1 if q else 5)
    a.getppid = a.getppid or (20000 if q else 200000)
    a.pingpong = a.pingpong or (2000 if q else 10000)
    a.forkexec = a.forkexec or (20 if q else 200)
    a.rates = a.rates if a.rates is not None else ("100000" if q else RATES)
    a.rate_secs = 1.0 if q else a.rate_secs
    a.load_wait = a.load_wait if a.load_wait is not None else (0.0 if q else 1800.0)
    a.configs = [c for c in a.configs.split(",") if c]
    a.workloads = [w for w in a.workloads.split(",") if w]
    a.rate_configs = [c for c in a.rate_configs.split(",") if c]
    bad = [c for c in a.configs + a.rate_configs if c not in CONFIGS] + \
        [w for w in a.workloads if w not in WORKLOADS]
    if bad or not a.configs or not a.workloads or "off" not in a.configs:
        raise BenchError(f"unknown or empty configs/workloads {bad}; keep 'off' (the baseline)")
    for kb in (a.buf_kb, a.rate_buf_kb):
        if kb < 1024 or kb & (kb - 1):
            raise BenchError("--buf-kb and --rate-buf-kb: a power of two, at least 1024")
    nrates = len([r for r in a.rates.split(",") if r])
    a.timeout = a.timeout or (900 + a.reps * len(a.configs) * len(a.workloads) * 40
                              + nrates * len(a.rate_configs) * (a.rate_secs + 30))


def shm_size(a) -> int:
    """The ivshmem region: a power of two holding every CPU's buffer plus the header,
    channel table and metadata area."""
    need = max(a.buf_kb, a.rate_buf_kb) * 1024 * a.smp + (4 << 20)
    size = 1 << 20
    while size < need:
        size <<= 1
    return size


class Host:
    """The host side of the boot: `ivtrace record` per ivt-stream run, copies of the region
    for ivt-flight runs, samples of the vCPU's and the recorder's CPU around every run."""

    def __init__(self, a, work: Path, shm: Path):
        self.a, self.work, self.shm = a, work, shm
        self.taskset = [] if a.no_pin else ["taskset", "-c", "1"]
        self.recorders: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, str] = {}
        self.qemu_pid: int | None = None
        self.open: dict[tuple, dict] = {}
        self.samples: dict[tuple, dict] = {}
        for d in ("rec", "snap", "share/acks", "share/runs"):
            (work / d).mkdir(parents=True, exist_ok=True)

    def request(self, what: str, tag: str) -> None:
        if what == "recorder-start":
            out = self.work / "rec" / tag
            cmd = self.taskset + [str(IVTRACE), "record", "--shm", str(self.shm), "-o",
                                  str(out), "--force", "--json"]
            self.commands.setdefault("recorder", " ".join(cmd))
            with open(f"{out}.json", "w") as so, open(f"{out}.log", "w") as se:
                self.recorders[tag] = subprocess.Popen(cmd, stdout=so, stderr=se,
                                                       stdin=subprocess.DEVNULL)
        elif what == "recorder-stop":
            self.stop_recorder(tag)
        elif what == "snapshot":
            # The guest waits for the ack: copy the region now, salvage it after the boot.
            shutil.copyfile(self.shm, self.work / "snap" / f"{tag}.shm")
            (self.work / "share" / "acks" / tag).touch()
        else:
            raise BenchError(f"the guest asked the host for '{what}'")

    def stop_recorder(self, tag: str) -> None:
        """The module is gone: the recorder drains, sees the region closed and exits."""
        p = self.recorders.pop(tag, None)
        if p is None:
            raise BenchError(f"recorder-stop {tag} without a start")
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p.returncode:
            raise BenchError(f"ivtrace record for {tag} exited {p.returncode}: "
                             f"{(self.work / 'rec' / f'{tag}.log').read_text()[-800:]}")

    def recorder_ns(self) -> int:
        pids = [p.pid for p in self.recorders.values() if p.poll() is None]
        return sum(cpu_ns(pid) for pid in pids)

    def begin(self, key: tuple) -> None:
        run, wait, _ = vcpu_sched(self.qemu_pid)
        self.open[key] = {"t": time.monotonic(), "run": run, "wait": wait,
                          "rec": self.recorder_ns()}

    def end(self, key: tuple) -> None:
        a = self.open.pop(key, None)
        if a is None:
            return
        run, wait, _ = vcpu_sched(self.qemu_pid)
        wall = time.monotonic() - a["t"]
        self.samples[key] = {
            "wall_s": round(wall, 3),
            "vcpu_wait_pct": round(100.0 * (wait - a["wait"]) / 1e9 / wall, 2),
            "vcpu_run_pct": round(100.0 * (run - a["run"]) / 1e9 / wall, 1),
            "recorder_ns": self.recorder_ns() - a["rec"]}

    def kill_all(self) -> None:
        for p in self.recorders.values():
            if p.poll() is None:
                p.kill()
                p.wait()


class Follower:
    """Reads the console as the guest runs and acts on its `GB` lines."""

    def __init__(self, host: Host, vm: ivtvm.VM, log: Path, pin: bool):
        self.host, self.vm, self.pin = host, vm, pin
        self.tail = ConsoleTail(log)
        self.pinned: dict | None = None
        self.error: str | None = None
        host.qemu_pid = vm.proc.pid

    def line(self, ln: str) -> None:
        if self.pin and (ln.startswith("IVTRACE-GUEST: booted") or ln.startswith("GB calib")):
            self.pinned = pin_qemu(self.vm.proc.pid, 0, 1)
        m = re.match(r"^GB (begin|m) rep=(\d+) config=(\S+) workload=(\S+)", ln) or \
            re.match(r"^GB (rate) config=(\S+) target_per_s=(\d+)", ln)
        if m and m.group(1) == "rate":
            self.host.end((0, m.group(2), f"rate-{m.group(3)}"))
        elif m:
            key = (int(m.group(2)), m.group(3), m.group(4))
            (self.host.begin if m.group(1) == "begin" else self.host.end)(key)
        hm = re.match(r"^GB host (\S+) (\S+)\s*$", ln)
        if hm:
            self.host.request(hm.group(1), hm.group(2))
        if ln.startswith(("GB m ", "GB rate ", "GB error")):
            print("  " + ln, flush=True)
        if ln.startswith("GB error"):
            self.error = ln[len("GB error "):]

    def until_exit(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            exited = self.vm.proc.poll() is not None
            for ln in self.tail.lines():
                try:
                    self.line(ln)
                except BenchError as e:
                    self.error = str(e)
                    self.vm.kill()
            if exited or self.error:
                break
            time.sleep(0.02)


# --------------------------------------------------------------------------- the boot

def guest_command(a) -> str:
    env = f"GB_GETPPID={a.getppid} GB_PINGPONG={a.pingpong} GB_FORKEXEC={a.forkexec}"
    args = [str(a.reps), ",".join(a.configs), ",".join(a.workloads), str(a.buf_kb),
            str(a.rate_buf_kb), a.rates or "''", f"{a.rate_secs:g}", ",".join(a.rate_configs)]
    return f"{env} sh /bench/guestbench.sh " + " ".join(args)


def make_vm(a, guest, work: Path, shm: Path, command: str) -> ivtvm.VM:
    adds = guest.add("ivtrace.ko", "gb-work", "ev-helper") + guest.tracers.add() + \
        [f"{guest.files['gb-work']}:/usr/local/bin/gb-mark", f"{SCRIPT}:/bench/guestbench.sh"]
    return ivtvm.VM(command, shm=str(shm), shm_size=shm_size(a), shm_clear=True, smp=a.smp,
                    mem=a.mem, accel=a.accel, add=adds, share=str(work / "share"),
                    extra_args=["-name", "ivt-guestbench,debug-threads=on"],
                    log=str(work / "console.log"))


def boot(a, guest, work: Path, shm: Path, command: str):
    """One boot of the whole benchmark: (BootResult or None, Follower, Host, vm)."""
    host = Host(a, work, shm)
    vm = make_vm(a, guest, work, shm, command)
    r = fo = None
    t0 = time.monotonic()
    try:
        vm.start()
        fo = Follower(host, vm, work / "console.log", not a.no_pin)
        fo.until_exit(t0 + a.timeout)
        if not fo.error:
            r = vm.wait(timeout=max(1.0, t0 + a.timeout - time.monotonic()))
    finally:
        vm.kill()
        host.kill_all()
        if fo is not None:
            fo.tail.close()
        shm.unlink(missing_ok=True)
    return r, fo, host, vm


def check_finished(r, fo, text: str) -> None:
    tail = "\n--- console tail ---\n" + "\n".join(text.splitlines()[-30:])
    error = fo.error if fo else None
    if error is None:
        em = re.search(r"^GB error (.*)$", text, re.M)
        error = em.group(1) if em else None
    if error:
        raise BenchError(f"the guest bench failed: {error}{tail}")
    if r is None or not r.ok or "GB done" not in text:
        raise BenchError(f"the guest bench did not finish: "
                         f"{r.summary() if r else 'no result'}{tail}")


# --------------------------------------------------------------------------- the console

def kv(rest: str) -> dict:
    out = {}
    for k, v in KV.findall(rest):
        v = v.strip('"')
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def parse_console(text: str, samples: dict) -> dict:
    """Every GB line the guest printed, as data."""
    runs, stats, ships, rates = [], {}, [], []
    for kind, rest in re.findall(r"^GB (m|stat|ship|rate) (.*)$", text, re.M):
        d = kv(rest)
        if kind == "m":
            d["host"] = samples.get((d["rep"], d["config"], d["workload"]))
            runs.append(d)
        elif kind == "stat":
            stats[(d.pop("rep"), d.pop("config"), d.pop("workload"))] = d
        elif kind == "ship":
            ships.append(d)
        else:
            d["host"] = samples.get((0, d["config"], f"rate-{d['target_per_s']}"))
            rates.append(d)
    for d in runs:
        d["tracer_stat"] = stats.get((d["rep"], d["config"], d["workload"]), {})
    cmds: dict[str, list[str]] = {}
    for cfg, cmd in re.findall(r"^GB cmd (\S+): (.*)$", text, re.M):
        cmds.setdefault(cfg, []).append(cmd)
    wl = re.search(r"^GB info workloads (.*)$", text, re.M)
    cal = re.search(r"^GB calib EVH tcgcost (.*)$", text, re.M)
    info = re.search(r"^GB info (kernel=.*)$", text, re.M)
    ids = re.search(r"^GB info ftrace_ids (.*)$", text, re.M)
    return {"runs": runs, "ships": ships, "rates": rates, "commands": cmds,
            "workload_commands": kv(wl.group(1)) if wl else {},
            "calibration_guest": {k[:-3]: float(v) for k, v in
                                  re.findall(r"(\w+_ns)=(-?[\d.]+)", cal.group(1))}
            if cal else {},
            "guest_info": kv(info.group(1)) if info else {},
            "ftrace_ids": {int(v): k for k, v in kv(ids.group(1)).items()} if ids else {}}


# --------------------------------------------------------------------------- counting

def count_run(kind: str, path: Path, ids: dict) -> dict:
    if kind == "ctf":
        return tracecount.ctf(path)
    if kind == "ftrace-raw":
        return tracecount.ftrace_raw(path, ids)
    if kind == "perf-data":
        return tracecount.perf_data(path)
    if kind == "perf-trace":
        return tracecount.perf_trace(path)
    raise BenchError(f"no counter for a trace of kind {kind}")


def ivtrace_trace(work: Path, tag: str, config: str) -> tuple[Path, dict]:
    """ivtrace's CTF trace of one run: the recorder's output (ivt-stream), or a snapshot
    salvaged from the copy of the region (ivt-flight); and `ivtrace report --json`."""
    if config == "ivt-flight":
        out = work / "snap" / tag
        p = subprocess.run([str(IVTRACE), "snapshot", "--shm", str(work / "snap" / f"{tag}.shm"),
                            "-o", str(out), "--force"], capture_output=True, text=True)
        if p.returncode:
            raise BenchError(f"ivtrace snapshot of {tag} failed: {p.stderr[-800:]}")
        (work / "snap" / f"{tag}.shm").unlink()
    else:
        out = work / "rec" / tag
    p = subprocess.run([str(IVTRACE), "report", "--json", str(out)], capture_output=True,
                       text=True)
    if p.returncode:
        raise BenchError(f"ivtrace report {out} failed: {p.stderr[-800:]}")
    return out, json.loads(p.stdout)


def ivtrace_counts(work: Path, tag: str, config: str) -> dict:
    out, rep = ivtrace_trace(work, tag, config)
    c = tracecount.ctf(out)
    lost = sum(rep.get("lost_by_reason", {}).values()) + rep.get("lost_no_channel", 0)
    overwritten = rep.get("lost_by_reason", {}).get("overwritten", 0)
    c.update(lost=lost - overwritten if config == "ivt-flight" else lost,
             overwritten=overwritten, bytes_per_event=rep.get("bytes_per_event"),
             header_bytes_per_event=rep.get("header_bytes_per_event"))
    return c


def count_all(a, work: Path, parsed: dict) -> None:
    """Each run's trace, counted on the host by name; the trace is deleted after."""
    kinds = {(s["rep"], s["config"], s["workload"]): s for s in parsed["ships"]}
    for d in parsed["runs"]:
        key = (d["rep"], d["config"], d["workload"])
        tag = f"{d['config']}-r{d['rep']}-{d['workload']}"
        if d["config"] == "off":
            continue
        if d["config"].startswith("ivt-"):
            d["counts"] = ivtrace_counts(work, tag, d["config"])
        elif key in kinds:
            path = work / "share" / kinds[key]["dir"]
            d["counts"] = count_run(kinds[key]["kind"], path, parsed["ftrace_ids"])
            d["counts"]["copy_intact"] = check_copy(path, kinds[key], tag)
        else:
            raise BenchError(f"the trace of {tag} never reached the host")
        keep_proof(d, work, tag)
    if not a.keep_work:
        for sub in ("share/runs", "rec", "snap"):
            shutil.rmtree(work / sub, ignore_errors=True)


def digest(d: Path) -> str:
    """md5 of a directory's files' bytes in the order of their sorted relative paths, as
    guestbench.sh's digest() computes it in the guest (busybox find | sort | xargs cat)."""
    h = hashlib.md5()
    for f in sorted("./" + str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()):
        h.update((d / f).read_bytes())
    return h.hexdigest()


def check_copy(path: Path, ship: dict, tag: str) -> bool | None:
    """Whether the trace the host counts is the one the guest wrote (None: not known): a copy
    damaged on the way over 9p would be counted as the tracer's (events nobody could explain)."""
    want = ship.get("md5")
    if want is None:
        return None
    got = digest(path)
    if got != want:
        say(f"WARNING: the trace of {tag} differs on the host (md5 {got}) from the guest's "
            f"({want}): the copy over the 9p share was damaged")
    return got == want


def keep_proof(d: dict, work: Path, tag: str) -> None:
    """LTTng's trace of the first getppid run in discard mode stays (build/, git-ignored):
    babeltrace2 opens it, proof that LTTng's kernel tracer ran; its first lines go into the
    results."""
    if d["config"] != "lttng-discard" or d["workload"] != "getppid" or PROOF.exists():
        return
    src = work / "share" / "runs" / tag
    PROOF.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, PROOF)
    p = subprocess.run(f"babeltrace2 {PROOF} | head -4", shell=True, capture_output=True,
                       text=True)
    d["babeltrace2"] = {"command": f"babeltrace2 {PROOF.relative_to(ROOT)}",
                        "first_lines": p.stdout.splitlines(), "rc": p.returncode}


# --------------------------------------------------------------------------- the run

def other_qemus() -> list[str]:
    """Other QEMU processes, their paths cut to the file name: they are other checkouts'
    and other runs' directories, which a committed results file must not name."""
    p = subprocess.run(["pgrep", "-a", "qemu"], capture_output=True, text=True)
    return [re.sub(r"/[^\s,=]*/", "", ln)[:160] for ln in p.stdout.splitlines()]


def wait_for_quiet(a) -> dict:
    """Wait (up to --load-wait s) for a quiet machine: load average <= --max-load and no
    other QEMU (other developers' guests); what was seen goes into the results."""
    t0 = time.monotonic()
    first = (loadavg(), other_qemus())
    while time.monotonic() - t0 < a.load_wait and (loadavg()[0] > a.max_load or other_qemus()):
        say(f"waiting for a quiet machine: load {loadavg()[0]:.2f} (> {a.max_load}?), "
            f"{len(other_qemus())} other QEMU(s); {a.load_wait - (time.monotonic() - t0):.0f} "
            f"s left")
        time.sleep(30)
    la, qs = loadavg(), other_qemus()
    quiet = la[0] <= a.max_load and not qs
    if not quiet:
        say(f"WARNING: not a quiet machine (load {la[0]:.2f}, {len(qs)} other QEMU(s)); "
            "measuring anyway, and the results say so")
    return {"max_load": a.max_load, "waited_s": round(time.monotonic() - t0, 1),
            "loadavg_first_seen": first[0], "loadavg_at_start": la, "quiet": quiet,
            "other_qemus_first_seen": first[1], "other_qemus_at_start": qs,
            "top_at_start": top_procs()}


def host_calibration(guest) -> dict:
    cmd = (["taskset", "-c", "0"] if (os.cpu_count() or 1) >= 2 else []) + \
        [str(guest.files["ev-helper"]), "tcgcost"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return {k[:-3]: float(v) for k, v in re.findall(r"(\w+_ns)=(-?[\d.]+)", p.stdout)}


def native_tracers(a, guest, work: Path) -> dict:
    say("natively first: the getppid loop under ftrace and perf on this host's kernel")
    try:
        return guest_native.calibrate(guest.files["gb-work"], work,
                                      ops=200000 if a.quick else 1000000,
                                      rounds=1 if a.quick else 5)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}


def params(a, fo) -> dict:
    return {"reps": a.reps, "configs": a.configs, "workloads": a.workloads,
            "ops": {"getppid": a.getppid, "pingpong": a.pingpong, "forkexec": a.forkexec},
            "buf_kb": a.buf_kb, "rates": a.rates, "rate_secs": a.rate_secs,
            "rate_buf_kb": a.rate_buf_kb, "rate_configs": a.rate_configs,
            "smp": a.smp, "mem": a.mem, "shm_size": shm_size(a),
            "pinning": None if a.no_pin else {"vcpu_cpu": 0, "other_cpu": 1,
                                              "applied": fo.pinned}}


def record(rec: dict, a, guest, boot_out: tuple, parsed: dict, before: dict) -> None:
    """Everything the run measured and how, into the results' data."""
    r, fo, host, command, cpu0, cpu1 = boot_out
    rec["data"].update({
        "guest_command": command, "guest_script": "bench/guest/guestbench.sh",
        "qemu_command": r.cmd, "host_commands": host.commands,
        "commands": parsed["commands"], "workload_commands": parsed["workload_commands"],
        "params": params(a, fo), "tracers": guest.tracers.info,
        "guest_info": parsed["guest_info"],
        "boot": {"duration_s": round(r.duration, 1), "boot_time_s": r.boot_time,
                 "kernel_problems": r.kernel_problems},
        "conditions": {**before["conditions"], "loadavg_after": loadavg(),
                       "top_after": top_procs(), "other_qemus_at_end": other_qemus(),
                       "host_cpu_busy_pct": busy_pct(cpu0, cpu1),
                       "host_cpu_steal_pct": steal_pct(cpu0, cpu1)},
        "calibration": {"what": "ns per operation, best of 3 rounds, net of an empty loop "
                                "(ev-helper tcgcost)",
                        "host_native": before["host_cal"], "guest": parsed["calibration_guest"],
                        "tracers_native": before["native"]},
        "runs": parsed["runs"], "rates": parsed["rates"],
    })


def prepare(a, rec):
    """The build, the accelerator, pinning, a quiet machine, the native figures."""
    settle_arguments(a)
    say("building (host tools, the guest, LTTng and perf for the guest kernel)")
    guest = guests.build(a, rec, host_tools=True, tracers=True)
    accel = ivtvm.probe_accel(a.accel)
    guests.describe(rec, guest, accel, a.smp, a.mem)
    if not a.no_pin and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})  # the console reader and helpers off the vCPU's CPU
    else:
        a.no_pin = True
    work = Path(a.work_dir) / f"ivtrace-guest-{os.getpid()}"
    before = {"conditions": wait_for_quiet(a), "host_cal": host_calibration(guest)}
    before["native"] = native_tracers(a, guest, work)
    say(f"{accel[0]} ({accel[1]}); guest {guest.kernel_version}, {a.smp} vCPU, {a.mem}; "
        f"{a.reps} rep(s) x {len(a.configs)} configurations x {len(a.workloads)} workloads; "
        f"rates {a.rates or 'none'}; work dir {work}")
    return guest, work, before


def run(a, rec) -> list[str]:
    guest, work, before = prepare(a, rec)
    shm = Path(f"/dev/shm/ivt-guestbench-{os.getpid()}")
    shutil.rmtree(PROOF, ignore_errors=True)
    command = guest_command(a)
    cpu0 = cpu_times()
    r, fo, host, vm = boot(a, guest, work, shm, command)
    cpu1 = cpu_times()
    check_finished(r, fo, vm.console_text)
    parsed = parse_console(vm.console_text, host.samples)
    say("counting every trace on the host (babeltrace2, perf script, ftrace pages)")
    count_all(a, work, parsed)
    record(rec, a, guest, (r, fo, host, command, cpu0, cpu1), parsed, before)
    rec["data"]["summary"] = summarize(rec["data"])
    print_summary(rec["data"])
    if not a.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return rec["data"]["summary"]["incomplete"]
