"""relay: many guests through one `ivtrace serve`, to disk and to LTTng's relay daemon.

For 1, 8 and 64 simulated guests (ivtrace-loadgen --ivshmem-socket: QEMU's handshake with
serve, the region formatted by libivtrace, 2 writer threads each), serve records into a
directory on tmpfs ("disk"), or into that directory and a local lttng-relayd at once
("relay"; the relay writes to tmpfs too). Two loads, each the same aggregate event rate
split over the guests, so the daemon's CPU per GB of trace can be compared as guests are
added: a low one (--rate, default 128 k events/s) where the daemon's fixed cost per guest
shows, and a high one (--high-rate, default 1 M events/s) where the data does. The
simulated guests ring no doorbell (libivtrace's writer has none): serve polls them with
its backoff (50 us to 20 ms), which is the per-guest fixed cost a doorbell guest mostly
does not have.

Measured per run: events and bytes recorded per second of the writers' run, the serve
process's CPU time (all its threads, from /proc/PID/task/*/schedstat) per GB recorded, its
peak resident memory (VmHWM) above an idle serve's, per guest, the relay queues' high
water, and every loss (the writers', serve's, on the way to the relay).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ivtools.qemu_threads import cpu_ns
from ivtools.relayd import Relayd

from . import BenchError, Prerequisite, hostload
from .results import ROOT

NAME = "relay"
HELP = "1, 8 and 64 guests through ivtrace serve to disk and to lttng-relayd: rate, CPU/GB, memory"
IVTRACE = ROOT / "bin" / "ivtrace"
LOADGEN = ROOT / "bin" / "ivtrace-loadgen"
THREADS = 2
EVENT_SIZE = 32


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def serve(tmp: Path, relay: Relayd | None) -> tuple[subprocess.Popen, Path]:
    sock = tmp / "s.sock"
    cmd = [str(IVTRACE), "serve", "--socket", str(sock), "-o", str(tmp / "traces"),
           "--size", "4M", "--json"]
    if relay:
        cmd += ["--relayd", relay.url, "--relay-hostname", "bench", "--relay-buffer", "16M"]
    out = open(tmp / "serve.json", "wb")
    err = open(tmp / "serve.log", "wb")
    p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    end = time.monotonic() + 10
    while not sock.exists():
        if p.poll() is not None or time.monotonic() > end:
            raise BenchError(f"serve did not start: {(tmp / 'serve.log').read_text()}")
        time.sleep(0.05)
    return p, sock


def one_run(guests: int, sink: str, events: int, rate: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"ivt-bench-relay-{guests}-", dir="/dev/shm"))
    relay = Relayd(tmp / "relay", tmp) if sink == "relay" else None
    srv, sock = serve(tmp, relay)
    try:
        time.sleep(0.5)
        rss0 = status_kb(srv.pid, "VmRSS")
        c0 = cpu_ns(srv.pid)
        t0 = time.monotonic()
        sims = [subprocess.Popen([str(LOADGEN), "--ivshmem-socket", str(sock), "--events",
                                  str(events), "--threads", str(THREADS), "--channels",
                                  str(THREADS), "--rate", str(rate), "--size", str(EVENT_SIZE),
                                  "--subbufs", "8", "--subbuf-size", "65536", "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                for _ in range(guests)]
        outs = [json.loads(p.communicate(timeout=600)[0]) for p in sims]
        writers_s = time.monotonic() - t0
        hwm = status_kb(srv.pid, "VmHWM")
        srv.send_signal(signal.SIGINT)
        cpu_s = exit_cpu_s(srv) - c0 / 1e9
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
        relay_cpu = exit_cpu_s(relay.proc, signal.SIGTERM) if relay else None
    sums = [json.loads(line) for line in (tmp / "serve.json").read_text().splitlines() if line]
    shutil.rmtree(tmp, ignore_errors=True)
    r = summarize(guests, sink, events, rate, outs, sums, writers_s, cpu_s, rss0, hwm)
    r["relayd_cpu_s"] = relay_cpu
    return r


def exit_cpu_s(p: subprocess.Popen, sig: int | None = None) -> float:
    """Waits for `p` (signalled with `sig` first) and returns the CPU time of all its
    threads over its life (user + system, from wait4's rusage)."""
    if sig is not None:
        p.send_signal(sig)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime


def summarize(guests, sink, events, rate, outs, sums, writers_s, cpu_s, rss0, hwm) -> dict:
    recorded = sum(c["events"] for s in sums for c in s["channels"])
    nbytes = sum(c["bytes"] for s in sums for c in s["channels"])
    lost = sum(sum(c["lost"].values()) for s in sums for c in s["channels"])
    rel = [s.get("relay") or {} for s in sums]
    relay_lost = sum(st["events_dropped"] + st["events_lost_in_flight"]
                     for r in rel for st in r.get("streams", []))
    return {
        "guests": guests, "sink": sink, "events_per_thread": events, "threads": THREADS,
        "rate_per_thread": rate, "offered_per_s": rate * THREADS * guests if rate else None,
        "attempted": sum(o["attempted"] for o in outs), "recorded": recorded,
        "lost_local": lost, "lost_relay": relay_lost, "bytes": nbytes,
        "writers_s": round(writers_s, 3), "events_per_s": recorded / writers_s,
        "mb_per_s": nbytes / writers_s / 1e6, "serve_cpu_s": cpu_s,
        "cpu_s_per_gb": cpu_s / (nbytes / 1e9) if cpu_s and nbytes else None,
        "rss_idle_kb": rss0, "rss_peak_kb": hwm,
        "rss_per_guest_kb": (hwm - rss0) / guests,
        "relay_queue_high_water": max((r.get("queue_high_water", 0) for r in rel), default=0),
        "recordings": len(sums),
    }


def add_arguments(ap):
    ap.add_argument("--guests", default="1,8,64", help="guest counts (default 1,8,64)")
    ap.add_argument("--rate", type=int, default=128000,
                    help="paced load: aggregate events/s over all guests (default 128000)")
    ap.add_argument("--high-rate", type=int, default=1000000,
                    help="high load: aggregate events/s over all guests (default 1000000)")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each run (default 5)")
    ap.add_argument("--wait", type=float, default=600,
                    help="longest wait for a quiet machine (load < 0.5) first (default 600 s)")


def run(a, rec) -> list[str]:
    for tool in (IVTRACE, LOADGEN):
        if not tool.exists():
            raise Prerequisite(f"{tool} missing: run make")
    if not shutil.which("lttng-relayd"):
        raise Prerequisite("lttng-relayd missing: scripts/deps.sh installs lttng-tools")
    data = rec["data"]
    conditions = data.setdefault("conditions", {})
    data["quiet"] = hostload.wait_for_quiet(0.5, 5 if a.quick else a.wait,
                                           lambda m: print(f"relay: {m}", flush=True))
    counts = [int(n) for n in a.guests.split(",")]
    if a.quick:
        counts = [n for n in counts if n <= 8]
    secs = 2.0 if a.quick else a.seconds
    runs = []
    for n in counts:
        for load, rate in (("low", a.rate), ("high", a.high_rate)):
            per_thread = max(1, rate // (n * THREADS))
            for sink in ("disk", "relay"):
                with hostload.Section(conditions, f"{load}-{n}-{sink}"):
                    runs.append({"load": load, **one_run(n, sink, int(per_thread * secs),
                                                         per_thread)})
                r = runs[-1]
                print(f"relay: {load}, {n} guests -> {sink}: "
                      f"{r['events_per_s'] / 1e6:.2f} M events/s, "
                      f"{r['cpu_s_per_gb'] or 0:.1f} CPU s/GB, "
                      f"lost {r['lost_local']} + {r['lost_relay']}", flush=True)
    data["runs"] = runs
    data["event_size"] = EVENT_SIZE
    return []
