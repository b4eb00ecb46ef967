"""clocksync: what the clock exchange costs (docs/kvm.md, "The clock exchange"), guest and
host, with against without it, side by side in one run.

`ivtrace record` on ivshmem-plain (the `make demo` path) records an idle guest with
ivtrace.ko loaded for --seconds, in two settings, alternated over --repeats rounds:

  sync      the default exchange: bursts at 0, 0.5 and 1 s, then every 2 s
            (`--sync-interval 2`);
  no-sync   the early bursts only (`--sync-interval 3600`: at 0, 0.5 and 1 s, and a
            retry of one the guest did not enter), so the mapping still exists but the
            periodic exchange is gone;
  serve     `ivtrace serve` with doorbells (the writer kicked into the exchange on MSI-X
            vector 0), the default exchange (`--sync-interval 2`).

`--hogs N [N ...]` runs every setting once per N, with N busy loops on the host meanwhile
(a loaded host: the exchange must keep its bound when vCPU threads and the recorder lose
their CPU).

Per run: the bound of the recording (the clock's error_ns) and the bound in force at each
sync point (clock_sync.pingpong.bound_in_force: min/median/p99/max), the slow bursts and
their retries, the host's spinning for answers (the sidecar's clock_sync.pingpong
stats.host_spin_ns, the exchange's host cost as the recorder counts it), the recorder
process's CPU time (user + system, from wait4: the exchange plus the drain, so the
difference between the settings is the exchange's share), and the guest's time in the
exchange (writer_spin_ns: the module's resp_spun, measured by the guest on its own clock).
The guest's share is per vCPU: the exchange runs on one vCPU at a time. The goals
(issue 26): guest <= 0.1 % of a vCPU, host <= 1 % of a core.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ivtools import ivtvm

from . import BenchError, guests, hostload
from .results import ROOT

NAME = "clocksync"
HELP = "the clock exchange's guest and host CPU, with against without it"
IVTRACE = ROOT / "bin" / "ivtrace"
SETTINGS = {"sync": 2.0, "no-sync": 3600.0, "serve": 2.0}
HOG = "while True:\n    pass\n"


def add_arguments(ap):
    guests.add_arguments(ap, smp=2)
    ap.add_argument("--seconds", type=int, default=60,
                    help="seconds the guest idles with ivtrace.ko loaded, per run (default 60)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="rounds of (sync, no-sync, serve), alternated (default 2)")
    ap.add_argument("--hogs", type=int, nargs="+", default=[0], metavar="N",
                    help="busy loops on the host during the runs; each setting runs once per "
                         "N given, e.g. --hogs 0 2 (default 0)")
    ap.add_argument("--no-serve", action="store_true",
                    help="leave out the serve-with-doorbells setting")


def cpu_s(ru) -> float:
    return ru.ru_utime + ru.ru_stime


def reap(rec: subprocess.Popen, wait_s: float):
    """Waits for the recorder (it stops by itself when the module closes the region; SIGINT
    after wait_s) and returns its exit status and resource usage (its own, from wait4)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        pid, status, ru = os.wait4(rec.pid, os.WNOHANG)
        if pid:
            return os.waitstatus_to_exitcode(status), ru
        time.sleep(0.1)
    rec.send_signal(signal.SIGINT)
    _, status, ru = os.wait4(rec.pid, 0)
    return os.waitstatus_to_exitcode(status), ru


def serve_run(a, guest, tmp: Path) -> dict:
    """`ivtrace serve` with doorbells records the idle guest; its sidecar's clock_sync."""
    sock, out = tmp / "serve.sock", tmp / "trace-serve"
    cmd = [str(IVTRACE), "serve", "--socket", str(sock), "-o", str(out), "--size", "16M",
           "--sync-interval", str(SETTINGS["serve"])]
    se = open(tmp / "serve.log", "w+")
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=se, stdin=subprocess.DEVNULL)
    try:
        while not sock.exists():
            if srv.poll() is not None:
                se.seek(0)
                raise BenchError(f"serve: ivtrace serve failed: {se.read()[-2000:]}")
            time.sleep(0.05)
        r = ivtvm.boot(f"sleep {a.seconds}\nrmmod ivtrace\n", doorbell=str(sock), vectors=2,
                       smp=a.smp, mem=a.mem, accel=a.accel, modules=["ivtrace"],
                       initrd="built", add=guest.add("ivtrace.ko"), timeout=a.seconds + 300)
        srv.send_signal(signal.SIGINT)
        rc, ru = reap(srv, 120)
    finally:
        if srv.returncode is None and srv.poll() is None:
            srv.kill()
    se.seek(0)
    sidecars = sorted(out.rglob("ivtrace.json"))
    if rc != 0 or not r.ok or len(sidecars) != 1:
        raise BenchError(f"serve: guest {r.summary()}, serve exit {rc}, sidecars {sidecars}: "
                         f"{se.read()[-2000:]}")
    side = json.loads(sidecars[0].read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {**measures("serve", side, cpu_s(ru), r.accel), "load_after": hostload.loadavg()}


def one_run(a, guest, setting: str, tmp: Path) -> dict:
    if setting == "serve":
        return serve_run(a, guest, tmp)
    shm = Path(f"/dev/shm/ivt-clocksync-{os.getpid()}")
    shm.unlink(missing_ok=True)
    out = tmp / f"trace-{setting}"
    cmd = [str(IVTRACE), "record", "--shm", str(shm), "-o", str(out), "--force", "--json",
           "--sync-interval", str(SETTINGS[setting])]
    so, se = open(tmp / "record.json", "w+"), open(tmp / "record.log", "w+")
    rec = subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
    script = f"sleep {a.seconds}\nrmmod ivtrace\n"
    try:
        r = ivtvm.boot(script, shm=str(shm), shm_size="16M", shm_clear=True, smp=a.smp,
                       mem=a.mem, accel=a.accel, modules=["ivtrace"], initrd="built",
                       add=guest.add("ivtrace.ko"), timeout=a.seconds + 300)
        rc, ru = reap(rec, 30)
    finally:
        if rec.returncode is None and rec.poll() is None:
            rec.kill()
        shm.unlink(missing_ok=True)
    so.seek(0)
    se.seek(0)
    if rc != 0 or not r.ok:
        raise BenchError(f"{setting}: guest {r.summary()}, recorder exit {rc}: {se.read()[-2000:]}")
    side = json.loads(so.read())
    shutil.rmtree(out, ignore_errors=True)
    return {**measures(setting, side, cpu_s(ru), r.accel), "load_after": hostload.loadavg()}


def measures(setting: str, side: dict, recorder_cpu_s: float, accel: str) -> dict:
    pp = (side.get("clock_sync") or {}).get("pingpong")
    if pp is None:
        raise BenchError(f"{setting}: the recording has no clock exchange (clock_sync.pingpong "
                         "missing from the summary): is ivtrace.ko the one of this tree?")
    secs = side["elapsed_s"] if "elapsed_s" in side else pp["span_ns"] / 1e9
    st = pp["stats"]
    spread = pp.get("bound_in_force") or {}
    return {"setting": setting, "sync_interval_s": SETTINGS[setting], "accel": accel,
            "seconds": secs, "bursts": st["bursts"], "exchanges": st["exchanges"],
            "points": len(pp["points"]), "host_spin_ns": st["host_spin_ns"],
            "host_spin_pct_of_core": 100 * st["host_spin_ns"] / 1e9 / secs,
            "writer_spin_ns": pp["writer_spin_ns"],
            "guest_pct_of_vcpu": 100 * pp["writer_spin_ns"] / 1e9 / secs,
            "recorder_cpu_s": recorder_cpu_s,
            "recorder_cpu_pct_of_core": 100 * recorder_cpu_s / secs,
            "bound_ns": (side.get("clock") or {}).get("error_ns"),
            "bound_in_force": {k: spread.get(k) for k in
                               ("points", "min_ns", "median_ns", "p99_ns", "max_ns")},
            "slow_bursts": st.get("slow_bursts"), "retries": st.get("retries"),
            "min_rtt_ns": st.get("min_rtt_ns"),
            "realtime": st.get("realtime")}


def summary(runs: list[dict]) -> dict:
    quiet = min((x.get("hogs", 0) for x in runs), default=0)

    def mean(setting, key):
        """Over the runs of the quietest host (the costs compare settings, not loads)."""
        v = [x[key] for x in runs if x["setting"] == setting and x.get("hogs", 0) == quiet
             and x[key] is not None]
        return sum(v) / len(v) if v else None

    keys = ("host_spin_pct_of_core", "guest_pct_of_vcpu", "recorder_cpu_pct_of_core")
    s = {k: {st: mean(st, k) for st in SETTINGS} for k in keys}
    for k in keys:
        a, b = s[k]["sync"], s[k]["no-sync"]
        s[k]["added"] = None if a is None or b is None else a - b
    s["goals"] = {"guest_pct_of_vcpu_max": 0.1, "host_pct_of_core_max": 1.0,
                  "bound_ns_max": 500}
    s["hogs_of_means"] = quiet
    s["worst_bound_ns"] = {st: max((x["bound_ns"] for x in runs if x["setting"] == st
                                    and x["bound_ns"] is not None), default=None)
                           for st in ("sync", "serve")}
    return s


@contextlib.contextmanager
def busy_loops(n: int):
    """`n` processes spinning on the host's CPUs while the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def run(a, rec) -> list[str]:
    guest = guests.build(a, rec, host_tools=True)
    guests.describe(rec, guest, ivtvm.probe_accel(a.accel), a.smp, a.mem)
    seconds = 15 if a.quick else a.seconds
    a.seconds = seconds
    tmp = Path(tempfile.mkdtemp(prefix="ivt-clocksync-"))
    runs = []
    load_before = hostload.loadavg()
    try:
        for i in range(1 if a.quick else a.repeats):
            order = ["sync", "no-sync"] if i % 2 == 0 else ["no-sync", "sync"]
            order += [] if a.no_serve else ["serve"]
            for n in a.hogs:
                with busy_loops(n):
                    for setting in order:
                        print(f"clocksync: round {i + 1}, {setting}, {n} host busy loops, "
                              f"{seconds} s", flush=True)
                        runs.append({**one_run(a, guest, setting, tmp), "hogs": n})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rec["data"].update({
        "params": {"seconds": seconds, "repeats": 1 if a.quick else a.repeats, "hogs": a.hogs,
                   "sync_interval_s": SETTINGS, "guest": "idle (sleep), ivtrace.ko loaded",
                   "load_before": load_before},
        "command": "bench/run clocksync (ivtrace record --shm, --sync-interval 2 against "
                   "3600, and ivtrace serve with doorbells; the guest idles with ivtrace.ko "
                   f"loaded; host busy loops: {' and '.join(map(str, a.hogs))})",
        "runs": runs, "summary": summary(runs)})
    return []
