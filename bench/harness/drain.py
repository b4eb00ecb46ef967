"""Drain throughput and live loss of `ivtrace record` (loopback, /dev/shm).

drain   Prefill a region with ivtrace-loadgen while no reader runs (the ring
        is large enough to hold every event: the prefill must drop nothing),
        then time `ivtrace record` draining it into a /dev/shm directory,
        pinned to one CPU. Two profiles: small events (events/s) and large
        events (MB/s). Wall time of the record process, start to exit.
live    Start `ivtrace record` (it waits for the region), then run
        ivtrace-loadgen at a fixed --rate; report produced, recorded, lost.

Part of the native preset (native.py, `bench/run native`).
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHM = Path("/dev/shm")

# Rings sized so a whole profile fits: a prefill must never drop. In-ring
# event bytes (event_bytes()) for loadgen's payload { u16 thread, u64 seq,
# data }: binary data is a u32 length + the bytes, text data the bytes + NUL:
# small/binary 28 B (37,445 per 1 MiB packet), large/binary 1044 B (1,004 per
# packet), large/text 1040 B. Binary is the bulk case (the recorder checks
# lengths only); text shows the recorder's per-byte string validation.
PROFILES = [
    {"name": "small", "size": 8, "payload": "binary", "events": 36_000_000,
     "quick_events": 8_000_000, "subbufs": 1024, "subbuf_size": 1 << 20},
    {"name": "large", "size": 1024, "payload": "binary", "events": 1_000_000,
     "quick_events": 200_000, "subbufs": 1024, "subbuf_size": 1 << 20},
    {"name": "large-text", "size": 1024, "payload": "text", "events": 1_000_000,
     "quick_events": 200_000, "subbufs": 1024, "subbuf_size": 1 << 20},
]
RUNS, QUICK_RUNS = 5, 1

# Live: the writer at a fixed rate into loadgen's default ring (8 x 256 KiB)
# and into a larger one (32 x 1 MiB), the reader draining concurrently.
LIVE_RINGS = [{"subbufs": 8, "subbuf_size": 256 << 10}, {"subbufs": 32, "subbuf_size": 1 << 20}]
LIVE_SIZE = 32
LIVE_SECONDS = 3
LIVE_RATES = [1_000_000, 5_000_000, 20_000_000, 0]  # 0: unthrottled


class DrainError(Exception):
    pass


def tree_bytes(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def event_bytes(size, payload="binary"):
    data = 4 + size if payload == "binary" else size + 1
    return (4 + 2 + 8 + data + 3) // 4 * 4


def loadgen_total(stats, key):
    """A total from ivtrace-loadgen --json ({"total": {...}})."""
    tot = stats.get("total") if isinstance(stats.get("total"), dict) else stats
    return tot.get(key)


def summarize_sidecar(raw):
    """Totals of an `ivtrace record` sidecar (DIR/ivtrace.json, host/crates/ctf sidecar.rs)."""
    if not isinstance(raw, dict):
        return {"events": None, "lost": None, "bytes": None, "elapsed_s": None}
    chans = raw.get("channels") or []
    lost_by = {}
    for c in chans:
        for k, v in (c.get("lost") or {}).items():
            lost_by[k] = lost_by.get(k, 0) + v
    lost_by["no_channel"] = raw.get("lost_no_channel", 0)
    skipped = {}
    for c in chans:
        for k, v in (c.get("skipped_packets") or {}).items():
            skipped[k] = skipped.get(k, 0) + v
    return {
        "events": sum(c.get("events", 0) for c in chans),
        "lost": sum(lost_by.values()),
        "lost_by_reason": lost_by,
        "skipped_packets": skipped,
        "bytes": sum(c.get("bytes", 0) for c in chans),
        "packets": sum(c.get("packets", 0) for c in chans),
        "elapsed_s": raw.get("elapsed_s"),
        "stop_reason": raw.get("stop_reason"),
        "warnings": raw.get("warnings"),
    }


def record_summary(out_dir):
    """The recorder's JSON summary (DIR/ivtrace.json), with totals."""
    try:
        raw = json.loads((Path(out_dir) / "ivtrace.json").read_text())
    except (OSError, ValueError):
        raw = None
    return {**summarize_sidecar(raw), "raw": raw}


def run_checked(cmd, what, timeout=600):
    cmd = [str(c) for c in cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise DrainError(f"{what} failed (exit {p.returncode}): {shlex.join(cmd)}\n"
                         f"{p.stderr.strip()[-2000:]}")
    return p


def run_timed(cmd, what, timeout=600):
    """Run cmd; return (stdout, wall seconds, CPU seconds (user + system) of the child).

    The CPU time is what the drain costs one thread whatever else shares its
    CPU; wall time is what it took on the machine as it was.
    """
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter_ns()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                os.wait4(p.pid, 0)
                raise DrainError(f"{what} did not finish within {timeout} s: {shlex.join(cmd)}")
            time.sleep(0.0005)
        wall = (time.perf_counter_ns() - t0) / 1e9
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise DrainError(f"{what} failed (exit {p.returncode}): {shlex.join(cmd)}\n"
                             f"{err.read().strip()[-2000:]}")
        return out.read(), wall, ru.ru_utime + ru.ru_stime


def loadgen_cmd(tools, cpu, shm, events, size, ring, threads=1, rate=None, payload="binary"):
    cmd = ["taskset", "-c", cpu, tools["loadgen"], "--shm", shm, "--create",
           "--events", events, "--size", size, "--payload", payload,
           "--threads", threads, "--channels", threads,
           "--subbufs", ring["subbufs"], "--subbuf-size", ring["subbuf_size"], "--json"]
    if rate:
        cmd += ["--rate", rate]
    return [str(c) for c in cmd]


def record_cmd(tools, cpu, shm, out):
    return [str(c) for c in ["taskset", "-c", cpu, tools["ivtrace"], "record",
                             "--shm", shm, "-o", out]]


def cleanup(*paths):
    for p in paths:
        p = Path(p)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def drain_once(tools, cpu, drain_cpu, prof, events):
    shm = SHM / f"ivbench-drain-{os.getpid()}.region"
    out = SHM / f"ivbench-drain-{os.getpid()}.out"
    cleanup(shm, out)
    try:
        pre = loadgen_cmd(tools, cpu, shm, events, prof["size"], prof, payload=prof["payload"])
        stats = json.loads(run_checked(pre, "prefill (ivtrace-loadgen)").stdout)
        dropped = loadgen_total(stats, "dropped")
        if dropped:
            raise DrainError(f"the prefill dropped {dropped} events: the ring "
                             f"({prof['subbufs']} x {prof['subbuf_size']} B) is too small")
        rec = record_cmd(tools, drain_cpu, shm, out)
        stdout, wall, cpu_s = run_timed(rec, "ivtrace record")
        summ = record_summary(out)
        trace_bytes = tree_bytes(out)
        return {
            "prefill_command": shlex.join(pre), "record_command": shlex.join(rec),
            "produced": events, "prefill_dropped": dropped, "loadgen": stats,
            "recorded": summ["events"], "lost": summ["lost"],
            "lost_by_reason": summ.get("lost_by_reason"),
            "skipped_packets": summ.get("skipped_packets"),
            "wall_s": wall, "record_elapsed_s": summ["elapsed_s"], "cpu_s": cpu_s,
            "cpu_percent": 100.0 * cpu_s / wall,
            "trace_bytes": trace_bytes,
            "events_per_s": events / wall,
            "trace_MB_per_s": trace_bytes / wall / 1e6,
            "events_per_cpu_s": events / cpu_s if cpu_s else None,
            "trace_MB_per_cpu_s": trace_bytes / cpu_s / 1e6 if cpu_s else None,
            "payload_bytes": loadgen_total(stats, "payload_bytes"),
            "payload_MB_per_s": (loadgen_total(stats, "payload_bytes") or 0) / wall / 1e6,
            "record_elapsed_events_per_s": (summ["events"] or 0) / summ["elapsed_s"]
            if summ["elapsed_s"] else None,
            "event_MB_per_s": events * event_bytes(prof["size"], prof["payload"]) / wall / 1e6,
            "record_stdout": stdout.strip()[-2000:],
            "record_summary": summ["raw"],
        }
    finally:
        cleanup(shm, out)


def reread(ivtrace, region, cpu):
    """Drain an already written, closed region; what did the recorder find?"""
    out = SHM / f"ivbench-reread-{os.getpid()}.out"
    cleanup(out)
    cmd = record_cmd({"ivtrace": ivtrace}, cpu, region, out)
    try:
        run_checked(cmd, "ivtrace record (re-reading the no-reader region)", timeout=120)
        summ = record_summary(out)
        return {"command": shlex.join(cmd), "recorded": summ["events"], "lost": summ["lost"],
                "trace_bytes": tree_bytes(out), "record_summary": summ["raw"]}
    finally:
        cleanup(out)


def profile_once(tools, cpu, drain_cpu, prof, events, top=14):
    """Where a drain spends its CPU time: `perf record -e cpu-clock` (a software
    clock, so it works without a PMU, as in this guest) around one drain."""
    if not shutil.which("perf"):
        return {"skipped": "perf is not installed (linux-perf)"}
    shm = SHM / f"ivbench-prof-{os.getpid()}.region"
    out = SHM / f"ivbench-prof-{os.getpid()}.out"
    data = SHM / f"ivbench-prof-{os.getpid()}.perf"
    cleanup(shm, out, data)
    try:
        run_checked(loadgen_cmd(tools, cpu, shm, events, prof["size"], prof,
                                payload=prof["payload"]), "prefill")
        rec = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4999", "-o", data, "--",
               *record_cmd(tools, drain_cpu, shm, out)]
        run_checked(rec, "perf record of ivtrace record")
        rep = run_checked(["perf", "report", "-i", data, "--stdio", "--no-children",
                           "--sort", "dso,symbol", "-g", "none"], "perf report")
        rows = []
        for line in rep.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[0].endswith("%") and not line.startswith("#"):
                sym = " ".join(parts[3:])
                while sym.endswith(" -"):
                    sym = sym[:-2]
                rows.append({"percent": float(parts[0][:-1]), "dso": parts[1], "symbol": sym})
        return {"command": shlex.join(map(str, rec)), "events": events, "top": rows[:top]}
    except DrainError as e:
        return {"skipped": str(e)[:500]}
    finally:
        cleanup(shm, out, data)


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def run_drain(tools, cpu, drain_cpu, quick=False):
    res = {"method": "prefill with no reader, then time `ivtrace record` (wall, process "
                     "start to exit) draining to /dev/shm; record pinned to one CPU",
           "profiles": []}
    for prof in PROFILES:
        events = prof["quick_events"] if quick else prof["events"]
        runs = []
        for i in range(QUICK_RUNS if quick else RUNS):
            print(f"drain: {prof['name']} run {i + 1}: {events} events of {prof['size']} B "
                  f"({prof['payload']})",
                  file=sys.stderr, flush=True)
            runs.append(drain_once(tools, cpu, drain_cpu, prof, events))
        keys = ("wall_s", "cpu_s", "cpu_percent", "events_per_s", "trace_MB_per_s",
                "payload_MB_per_s", "event_MB_per_s", "events_per_cpu_s", "trace_MB_per_cpu_s")
        res["profiles"].append({
            "name": prof["name"], "size": prof["size"], "payload": prof["payload"],
            "events": events, "event_bytes": event_bytes(prof["size"], prof["payload"]),
            "ring": {"subbufs": prof["subbufs"], "subbuf_size": prof["subbuf_size"]},
            "runs": runs,
            "median": {k: median([r[k] for r in runs]) for k in keys},
            "min_events_per_s": min(r["events_per_s"] for r in runs),
            "lost_total": sum((r["lost"] or 0) for r in runs),
            "recorded_all": all(r["recorded"] == r["produced"] for r in runs),
            "profile": profile_once(tools, cpu, drain_cpu, prof, events),
        })
    return res


def live_once(tools, cpu, drain_cpu, rate, ring):
    shm = SHM / f"ivbench-live-{os.getpid()}.region"
    out = SHM / f"ivbench-live-{os.getpid()}.out"
    cleanup(shm, out)
    events = (rate or 10_000_000) * LIVE_SECONDS
    rec_cmd = record_cmd(tools, drain_cpu, shm, out)
    gen_cmd = loadgen_cmd(tools, cpu, shm, events, LIVE_SIZE, ring, rate=rate)
    rec = subprocess.Popen(rec_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)  # let the recorder start waiting for the region
        t0 = time.perf_counter()
        gen = run_checked(gen_cmd, "ivtrace-loadgen", timeout=LIVE_SECONDS * 20 + 60)
        wall = time.perf_counter() - t0
        deadline = time.monotonic() + 120
        while not (w := os.wait4(rec.pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                rec.kill()
                raise DrainError("ivtrace record did not exit after the writer closed:\n"
                                 + rec.stderr.read())
            time.sleep(0.001)
        rec.returncode = os.waitstatus_to_exitcode(w[1])
        rec_cpu = w[2].ru_utime + w[2].ru_stime
        if rec.returncode != 0:
            raise DrainError(f"ivtrace record failed (exit {rec.returncode}):\n{rec.stderr.read()}")
        stats = json.loads(gen.stdout)
        summ = record_summary(out)
        loop_ns = loadgen_total(stats, "elapsed_ns")
        return {
            "rate": rate or "unthrottled", "ring": ring, "events": events, "writer_wall_s": wall,
            "achieved_rate": events / (loop_ns / 1e9) if loop_ns else events / wall,
            "loadgen_dropped": loadgen_total(stats, "dropped"), "recorded": summ["events"],
            "lost": summ["lost"], "trace_bytes": tree_bytes(out),
            "record_cpu_s": rec_cpu, "record_cpu_percent_of_writer_time": 100.0 * rec_cpu / wall,
            "loadgen_command": shlex.join(gen_cmd), "record_command": shlex.join(rec_cmd),
            "loadgen": stats, "record_summary": summ["raw"],
        }
    finally:
        if rec.returncode is None:
            rec.kill()
            rec.wait()
        cleanup(shm, out)


def run_live(tools, cpu, drain_cpu, quick=False):
    res = {"method": f"`ivtrace record` started first (it waits for the region), then "
                     f"ivtrace-loadgen --rate R for ~{LIVE_SECONDS} s of --size {LIVE_SIZE} "
                     f"events ({event_bytes(LIVE_SIZE)} B in the ring), 1 writer thread on "
                     f"CPU {cpu}, the recorder on CPU {drain_cpu}",
           "size": LIVE_SIZE, "runs": []}
    for ring in (LIVE_RINGS[:1] if quick else LIVE_RINGS):
        for rate in (LIVE_RATES[:2] + [0] if quick else LIVE_RATES):
            print(f"live: ring {ring['subbufs']} x {ring['subbuf_size'] >> 10} KiB, rate "
                  f"{rate or 'unthrottled'}", file=sys.stderr, flush=True)
            res["runs"].append(live_once(tools, cpu, drain_cpu, rate, ring))
    return res
