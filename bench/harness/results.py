"""One results schema for every preset (`ivtrace-bench/2`, described in bench/README.md).

A results file is one JSON object:

    schema       "ivtrace-bench/2"
    preset       native | guest | evaluation | doorbell | soak
    quick        a short smoke run (written as *-quick.json, never cited, never in history)
    date         ISO 8601, when the run started; duration_s
    command      how to reproduce it, from the repository root (bench/run PRESET ...)
    argv         the arguments exactly as given
    machine      host name, CPU, CPU count, memory, kernel, tool versions; `details`: what
                 only one preset records (clocksource, mitigations, ...)
    accelerator  {name: none | tcg | kvm, reason}: `none` for a preset that runs on the host
    guest        {kernel, cpus, mem} of a guest preset, else null
    git          {commit, uncommitted: paths with changes when it ran}
    build        {stale: the parts of the guest build that failed and whose earlier files were
                 measured instead (bench/run --reuse-stale-binaries); empty otherwise}
    data         the preset's own measurements

Paths are written relative to the repository; the harness's temporary directories are
written as $WORK (the evaluation's and the guest preset's work directory), $TMP (a per-boot
directory) and $SHM (the guest preset's ivshmem region file).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
SCHEMA = "ivtrace-bench/2"
PRESETS = ("native", "guest", "evaluation", "doorbell", "clocksync", "soak", "relay", "ftrace",
           "boot")
# Presets that run on the host alone (their record has no guest).
HOST_PRESETS = ("native", "soak", "relay")

# Per-run temporary directories, named after a pid or a random suffix: never useful in a
# committed document, so they are written as placeholders.
TEMP_DIRS = [
    # wherever --work-dir put them (default /var/tmp)
    (re.compile(r"(?:/[\w.+-]+)*/ivtrace-eval-\d+"), "$WORK"),
    (re.compile(r"(?:/[\w.+-]+)*/ivtrace-guest-\d+"), "$WORK"),
    (re.compile(r"/dev/shm/ivt-guestbench-\d+"), "$SHM"),
    (re.compile(r"/tmp/ivtvm-[A-Za-z0-9_]+"), "$TMP"),
    (re.compile(r"/tmp/ivt-ftbench-[A-Za-z0-9_]+"), "$TMP"),
    (re.compile(r"/dev/shm/ivt-ftbench-\d+"), "$SHM"),
    (re.compile(r"/var/tmp/ivt-bootbench-[A-Za-z0-9_]+"), "$WORK"),
    (re.compile(r"/dev/shm/ivt-bootbench-\d+"), "$SHM"),
    (re.compile(r"/tmp/ivt-clocksync-[A-Za-z0-9_]+"), "$TMP"),
    (re.compile(r"/dev/shm/ivt-clocksync-\d+"), "$SHM"),
]


def portable(obj, root: Path | str = ROOT):
    """`obj` with every path under `root` made relative to it and the harness's temporary
    directories replaced by placeholders (strings, lists and dicts, recursively)."""
    if isinstance(obj, str):
        s = obj.replace(str(root).rstrip("/") + "/", "")
        for rx, name in TEMP_DIRS:
            s = rx.sub(name, s)
        return s
    if isinstance(obj, list):
        return [portable(x, root) for x in obj]
    if isinstance(obj, dict):
        return {k: portable(v, root) for k, v in obj.items()}
    return obj


def first_line(cmd: list[str]) -> str | None:
    """The first line a tool prints (stdout, else stderr), or None when it cannot run."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (p.stdout or p.stderr).strip().splitlines()
    return lines[0] if lines else None


def dpkg_version(pkg: str) -> str | None:
    return first_line(["dpkg-query", "-W", "-f=${Version}", pkg])


def cpu_identity() -> dict:
    """The first processor of /proc/cpuinfo: vendor, family, model, name, and the flags that
    tell how this machine is virtualized and how it keeps time."""
    info: dict = {}
    flags: list[str] = []
    for line in Path("/proc/cpuinfo").read_text().splitlines():
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


def versions() -> dict:
    ivtrace = ROOT / "bin" / "ivtrace"
    return {
        "gcc": first_line(["gcc", "--version"]),
        "rustc": first_line(["rustc", "--version"]),
        "python": sys.version.split()[0],
        "qemu": first_line(["qemu-system-x86_64", "--version"]),
        "babeltrace2": dpkg_version("babeltrace2"),
        "lttng-ust": dpkg_version("liblttng-ust-dev"),
        "lttng-tools": dpkg_version("lttng-tools"),
        "trace-cmd": dpkg_version("trace-cmd"),
        "ssh": first_line(["ssh", "-V"]),
        "ivtrace": first_line([str(ivtrace), "--version"]) if ivtrace.exists() else None,
    }


def machine() -> dict:
    mem_kb = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text()
                   .splitlines() if line.startswith("MemTotal")), 0)
    return {
        "host": socket.gethostname(),
        "cpu": cpu_identity(),
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "versions": versions(),
        "details": {},
    }


def git_state() -> dict:
    """The commit the tree was at, and every path with uncommitted changes."""
    commit = first_line(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    p = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"],
                       capture_output=True, text=True)
    return {"commit": commit,
            "uncommitted": sorted({line[3:] for line in p.stdout.splitlines() if line.strip()})}


def command_line(preset: str, args: list[str]) -> str:
    return shlex.join(["bench/run", preset, *args])


def new_record(preset: str, args: list[str], quick: bool) -> dict:
    """The envelope of a run that starts now; the preset fills in `data` (and accelerator,
    guest, build for the guest presets)."""
    return {
        "schema": SCHEMA,
        "preset": preset,
        "quick": quick,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "duration_s": None,
        "command": command_line(preset, args),
        "argv": list(args),
        "machine": machine(),
        "accelerator": {"name": "none", "reason": "runs on the host, no guest"},
        "guest": None,
        "git": git_state(),
        "build": {"stale": []},
        "data": {},
    }


def default_path(rec: dict) -> Path:
    date = datetime.datetime.fromisoformat(rec["date"])
    name = f"{date:%Y-%m-%dT%H%M%S}-{rec['machine']['host']}" + ("-quick" if rec["quick"] else "")
    return RESULTS / rec["preset"] / f"{name}.json"


def write_in(rec: dict, subdir: str, output: Path | None = None) -> Path:
    """Writes a side-by-side run's record to `output`, or under its preset's results in
    `subdir` with the default name; the path written."""
    default = default_path(rec)
    return write(rec, output or default.parent / subdir / default.name)


def write(rec: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(rec), indent=1) + "\n")
    return path


def load(path: Path) -> dict:
    rec = json.loads(Path(path).read_text())
    if rec.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {rec.get('schema')!r}, expected {SCHEMA!r}")
    return rec


def newest(preset: str) -> Path | None:
    """The newest full (not quick) run of a preset in bench/results/<preset>/ (the run the
    documentation cites); None when there is none."""
    files = sorted(p for p in (RESULTS / preset).glob("*.json") if not p.stem.endswith("-quick"))
    return files[-1] if files else None


def rel(path: Path | str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
