"""soak: `ivtrace serve` for a long time under the load a daemon meets, with its memory,
descriptors and CPU sampled every second (hours on demand, minutes in `make test`):

- a steady guest whose writer never lets serve idle (ivtrace-loadgen at a fixed rate into its
  region, never closing it): it runs until the disk fills under it, then reconnects;
- guests connecting and leaving: every --churn seconds a new client connects, a writer bursts
  a fixed number of events into its region and closes it, the client disconnects;
- clients that connect and leave without a region ever being formatted;
- a disk that fills: the output root is a tmpfs of --disk-mb; a cleaner deletes the traces of
  guests that are gone only when the disk is nearly full, so recordings run into ENOSPC
  again and again (each such trace must end 'incomplete' with the reason, never silently).

The clients are the tests' fake ivshmem clients (tests/serve/serve.py: the protocol's
handshake, descriptors kept) and the writers the real libivtrace (ivtrace-loadgen), not QEMU:
the daemon's resources are what is measured, and a TCG guest per churn would measure QEMU.

Checks (the run fails, exit 1, when one does not hold): serve stays up and exits 0 on SIGINT;
its descriptors are back where they started once the guests are gone; its RSS over the second
half grows less than --rss-slack-mib; every guest whose writer finished and whose trace was
finalized recorded every event it wrote but those counted lost (recorded + lost = written);
every recording the full disk stopped says so in its sidecar.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from ivtools.ivshmem import FakeClient

from . import Prerequisite, hostload
from .results import ROOT

NAME = "soak"
HELP = "serve for a long time: guests coming and going, a never-idle writer, a full disk"
IVTRACE = ROOT / "bin" / "ivtrace"
LOADGEN = ROOT / "bin" / "ivtrace-loadgen"
# One geometry for every writer: its region size is what serve hands out (--size).
GEOMETRY = ["--channels", "4", "--subbufs", "64", "--subbuf-size", "16384"]
REGION_SIZE = "8M"


def add_arguments(ap):
    ap.add_argument("--duration", type=float, default=1800.0,
                    help="seconds of soak (default 1800; --quick: 90)")
    ap.add_argument("--disk-mb", type=int, default=256, help="size of the output tmpfs")
    ap.add_argument("--churn", type=float, default=2.0,
                    help="seconds between guests that connect, burst and leave")
    ap.add_argument("--steady-rate", type=int, default=100_000,
                    help="events/s of the never-idle writer")
    ap.add_argument("--burst", type=int, default=20_000, help="events per churning guest")
    ap.add_argument("--rss-slack-mib", type=float, default=8.0,
                    help="RSS growth over the second half that fails the run")


def proc_sample(pid: int) -> dict:
    """RSS (KiB), descriptors, threads and CPU seconds of `pid`."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    field = {ln.split(":")[0]: ln.split()[1] for ln in status if ":" in ln and len(ln.split()) > 1}
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return {"rss_kib": int(field.get("VmRSS", 0)), "threads": int(field.get("Threads", 0)),
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "cpu_s": round((int(stat[11]) + int(stat[12])) / tick, 2)}


class Soak:
    """The server, its clients and writers, and what they saw."""

    def __init__(self, a, work: Path):
        self.a = a
        self.work = work
        self.disk = work / "disk"
        self.sock = work / "s.sock"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.written: dict[str, dict] = {}   # guest name -> the writer's summary
        self.failures: list[str] = []
        self.counts = {"churned": 0, "steady_rounds": 0, "idle_clients": 0, "cleaned": 0}

    # -- serve -------------------------------------------------------------------------------
    def start_server(self):
        self.disk.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.a.disk_mb}M,mode=0700",
                        "ivtrace-soak", str(self.disk)], check=True)
        self.out = open(self.work / "serve.json", "wb")
        self.err = open(self.work / "serve.log", "wb")
        self.serve = subprocess.Popen(
            [str(IVTRACE), "serve", "--socket", str(self.sock), "-o", str(self.disk / "traces"),
             "--size", REGION_SIZE, "--json"], stdout=self.out, stderr=self.err,
            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.sock.exists():
            if self.serve.poll() is not None or time.monotonic() > deadline:
                raise Prerequisite(f"serve did not start: {self.log()[-2000:]}")
            time.sleep(0.05)

    def log(self) -> str:
        return (self.work / "serve.log").read_text(errors="replace")

    def ctl_list(self) -> list[dict]:
        p = subprocess.run([str(IVTRACE), "ctl", "--socket", str(self.sock), "--json", "list"],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0 or not p.stdout.strip():
            return []
        return json.loads(p.stdout.strip().splitlines()[-1]).get("guests", [])

    def guest(self, name: str) -> dict | None:
        return next((g for g in self.ctl_list() if g["name"] == name), None)

    def wait_state(self, name: str, prefixes: tuple, timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.stop.is_set():
            g = self.guest(name)
            if g and g["state"].startswith(prefixes):
                return g
            time.sleep(0.2)
        return None

    def wait_finalized(self, name: str, timeout: float) -> None:
        """Until guest `name` has a trace and waits for the next format (its recording of
        the closed region is finalized)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.stop.is_set():
            g = self.guest(name)
            if not g or g["state"] == "done" or (g["traces"] and g["state"].startswith("waiting")):
                return
            time.sleep(0.2)

    # -- clients -----------------------------------------------------------------------------
    def connect(self) -> tuple[FakeClient, dict] | None:
        """A new client and its registry entry: the one whose region is the memfd this client
        was handed (same inode), whatever other workers connect meanwhile."""
        try:
            c = FakeClient(self.sock)
        except OSError as e:
            self.failures.append(f"a client could not connect: {e}")
            return None
        ino = os.fstat(c.fds[0]).st_ino
        end = time.monotonic() + 10
        while time.monotonic() < end:
            for g in self.ctl_list():
                try:
                    mine = g["state"] != "done" and os.stat(g["shm"]).st_ino == ino
                except OSError:
                    mine = False
                if mine:
                    return c, g
            time.sleep(0.05)
        c.close()
        return None

    def writer(self, shm: str, *args) -> subprocess.Popen:
        return subprocess.Popen([str(LOADGEN), "--shm", shm, "--json", *GEOMETRY, "--size", "24",
                                 *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)

    def churn(self):
        """Guests that connect, burst, close their region and leave."""
        while not self.stop.wait(self.a.churn):
            got = self.connect()
            if not got:
                continue
            c, g = got
            lg = self.writer(g["shm"], "--events", self.a.burst, "--threads", "2")
            out, _ = lg.communicate(timeout=300)
            if lg.returncode == 0:
                with self.lock:
                    self.written[g["name"]] = json.loads(out)
            self.wait_finalized(g["name"], 60)
            c.close()
            self.counts["churned"] += 1

    def steady(self):
        """One guest whose writer never idles, until its recording ends (a full disk)."""
        while not self.stop.is_set():
            got = self.connect()
            if not got:
                continue
            c, g = got
            lg = self.writer(g["shm"], "--events", 10**12, "--threads", "4", "--rate",
                             self.a.steady_rate, "--no-close")
            while not self.stop.wait(1.0):
                s = self.guest(g["name"])
                if not s or s["state"] == "done":
                    break
            lg.send_signal(signal.SIGKILL)
            lg.wait()
            c.close()
            self.counts["steady_rounds"] += 1

    def idle(self):
        """Clients that connect and leave before any region is formatted."""
        while not self.stop.wait(3.0):
            try:
                FakeClient(self.sock).close()
                self.counts["idle_clients"] += 1
            except OSError:
                pass

    def cleaner(self):
        """Deletes the traces of gone guests, but only when the disk is nearly full."""
        while not self.stop.wait(5.0):
            st = os.statvfs(self.disk)
            if st.f_bavail > st.f_blocks * 0.05:
                continue
            live = {t for g in self.ctl_list() if g["state"] != "done" for t in g["traces"]}
            root = self.disk / "traces"
            for d in sorted(root.iterdir(), key=lambda p: p.stat().st_mtime) if root.exists() else []:
                if str(d) not in live:
                    shutil.rmtree(d, ignore_errors=True)
                    self.counts["cleaned"] += 1

    # -- run ---------------------------------------------------------------------------------
    def sample_until(self, duration: float) -> list[dict]:
        t0 = time.monotonic()
        samples = []
        while time.monotonic() - t0 < duration:
            if self.serve.poll() is not None:
                self.failures.append(f"serve exited ({self.serve.returncode}) during the soak")
                break
            st = os.statvfs(self.disk)
            s = proc_sample(self.serve.pid)
            s["t"] = round(time.monotonic() - t0, 1)
            s["disk_used_pct"] = round(100 * (1 - st.f_bavail / max(st.f_blocks, 1)), 1)
            samples.append(s)
            time.sleep(1.0)
        return samples

    def finish(self) -> int | None:
        self.serve.send_signal(signal.SIGINT)
        try:
            return self.serve.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.serve.kill()
            self.serve.wait()
            return None

    def teardown(self):
        if self.serve.poll() is None:
            self.serve.kill()
            self.serve.wait()
        subprocess.run(["umount", "-l", str(self.disk)])


def account(summaries: list[dict], written: dict) -> dict:
    """Per finished recording: written vs recorded + lost; the disk-full stops."""
    out = {"recordings": len(summaries), "checked": 0, "mismatches": [], "disk_full": 0,
           "disk_full_without_reason": [], "events_recorded": 0, "events_lost": 0}
    for d in summaries:
        name = d["serve"]["guest"]
        rec = sum(c["events"] for c in d["channels"])
        lost = sum(sum(c["lost"].values()) for c in d["channels"]) + d.get("lost_no_channel", 0)
        out["events_recorded"] += rec
        out["events_lost"] += lost
        if d["state"] == "incomplete":
            out["disk_full"] += 1
            if "No space left" not in d["stop_reason"]:
                out["disk_full_without_reason"].append((name, d["stop_reason"]))
            continue
        w = written.get(name)
        if w and d["state"] == "finalized" and d["stop_reason"].startswith("region closed"):
            out["checked"] += 1
            if rec + lost != w["attempted"]:
                out["mismatches"].append({"guest": name, "written": w["attempted"],
                                          "recorded": rec, "lost": lost})
    return out


def summarize(samples: list[dict]) -> dict:
    """First, last, max; the second half's RSS growth and slope; CPU %."""
    if len(samples) < 4:
        return {}
    half = samples[len(samples) // 2:]
    span_min = max((half[-1]["t"] - half[0]["t"]) / 60, 1e-9)
    cpu = samples[-1]["cpu_s"] - samples[0]["cpu_s"]
    out = {k: {"first": samples[0][k], "last": samples[-1][k],
               "max": max(s[k] for s in samples)} for k in ("rss_kib", "fds", "threads")}
    out["rss_growth_second_half_kib"] = half[-1]["rss_kib"] - min(s["rss_kib"] for s in half)
    out["rss_slope_second_half_kib_per_min"] = round(
        (half[-1]["rss_kib"] - half[0]["rss_kib"]) / span_min, 1)
    out["cpu_pct_mean"] = round(100 * cpu / max(samples[-1]["t"] - samples[0]["t"], 1e-9), 1)
    out["disk_full_samples"] = sum(1 for s in samples if s["disk_used_pct"] >= 99)
    return out


def check(data: dict, slack_mib: float) -> list[str]:
    problems = list(data["failures"])
    s, acc = data["summary"], data["accounting"]
    if data["serve_exit"] != 0:
        problems.append(f"serve exit {data['serve_exit']} after SIGINT (want 0)")
    if s and s["rss_growth_second_half_kib"] > slack_mib * 1024:
        problems.append(f"serve's RSS grew {s['rss_growth_second_half_kib']} KiB over the "
                        f"second half (more than {slack_mib} MiB)")
    if data["fds_after_guests_left"] > data["fds_at_start"]:
        problems.append(f"descriptors: {data['fds_at_start']} at the start, "
                        f"{data['fds_after_guests_left']} once every guest left")
    for m in acc["mismatches"]:
        problems.append(f"guest {m['guest']}: wrote {m['written']}, recorded {m['recorded']} "
                        f"+ lost {m['lost']}")
    for name, why in acc["disk_full_without_reason"]:
        problems.append(f"guest {name} stopped without saying why: {why}")
    if acc["checked"] == 0:
        problems.append("no guest's recording could be checked (no churn completed)")
    return problems


def run(a, rec) -> list[str]:
    if os.geteuid() != 0:
        raise Prerequisite("the soak mounts a tmpfs for its full disk: run as root")
    for f in (IVTRACE, LOADGEN):
        if not os.access(f, os.X_OK):
            raise Prerequisite(f"{f} missing: run `make` first")
    duration = 90.0 if a.quick and a.duration == 1800.0 else a.duration
    work = Path(tempfile.mkdtemp(prefix="ivt-soak-"))
    soak = Soak(a, work)
    conditions: dict = {}
    try:
        soak.start_server()
        time.sleep(0.5)
        fds_start = proc_sample(soak.serve.pid)["fds"]
        workers = [threading.Thread(target=f, daemon=True)
                   for f in (soak.churn, soak.steady, soak.idle, soak.cleaner)]
        for w in workers:
            w.start()
        with hostload.Section(conditions, "soak"):
            samples = soak.sample_until(duration)
        soak.stop.set()
        for w in workers:
            w.join(timeout=120)
        time.sleep(2)
        fds_end = proc_sample(soak.serve.pid)["fds"] if soak.serve.poll() is None else -1
        serve_exit = soak.finish()
        summaries = [json.loads(line) for line in (work / "serve.json").read_text().splitlines()
                     if line.strip()]
        log_tail = soak.log()[-4000:]
    finally:
        soak.teardown()
        shutil.rmtree(work, ignore_errors=True)
    data = {
        "params": {"duration_s": duration, "disk_mb": a.disk_mb, "churn_s": a.churn,
                   "steady_rate": a.steady_rate, "burst": a.burst, "region_size": REGION_SIZE,
                   "geometry": " ".join(GEOMETRY)},
        "conditions": conditions,
        "samples": samples, "summary": summarize(samples), "counts": soak.counts,
        "fds_at_start": fds_start, "fds_after_guests_left": fds_end, "serve_exit": serve_exit,
        "accounting": account(summaries, soak.written), "failures": soak.failures,
        "serve_log_tail": log_tail,
    }
    rec["data"] = data
    return check(data, a.rss_slack_mib)
