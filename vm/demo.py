#!/usr/bin/python3
"""The guest demo behind `make demo` (run it through vm/demo, which installs packages first).

Steps: build the host tools and libivtrace (make all), the guest (guestbuild.build_guest: the
kernel and its headers, ivtrace.ko for that kernel, the static tools and the workload), the
module and the workload baked into the guest's initramfs (vm/build --add);
start `bin/ivtrace record` on the ivshmem backing file; boot the guest with ivtrace.ko loaded,
run /workload/demo.sh for ~10 s, unload the module (the region is marked CLOSED and the
recorder stops by itself); print a summary of the trace and how to open it.

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from ivtools import REPO, guestbuild, ivtvm
from ivtools.proc import say, stop_recorder

IVTRACE = REPO / "bin" / "ivtrace"
WORKLOAD = REPO / "vm" / "guest" / "workload"
GROUPS = "sched,irq,timer,kmem,syscall,printk"
TOTAL = 6


class DemoError(Exception):
    def __init__(self, what: str, hint: str, log: Path | None = None):
        super().__init__(what)
        self.hint, self.log = hint, log


T0 = time.monotonic()


def step(n: int, msg: str) -> None:
    say(f"== [{n}/{TOTAL}] {msg}   (+{time.monotonic() - T0:.0f} s)")


def run(cmd: list, what: str, hint: str, log: Path, heartbeat: float = 20.0) -> str:
    """Run cmd with its output going to `log`; print a line every `heartbeat` s while it runs.
    Returns the output; raises DemoError with the last lines of the log if it fails."""
    cmd = [str(c) for c in cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    with open(log, "ab") as f:
        f.write(f"\n$ {' '.join(cmd)}\n".encode())
        f.flush()
        p = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        while True:
            try:
                p.wait(timeout=heartbeat)
                break
            except subprocess.TimeoutExpired:
                say(f"   ... {what}: {time.monotonic() - t:.0f} s so far (log: {rel(log)})")
            except KeyboardInterrupt:
                p.terminate()
                raise
    text = log.read_text(errors="replace")
    if p.returncode != 0:
        raise DemoError(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}", hint, log)
    return text


def rel(p: Path | str) -> str:
    try:
        return str(Path(p).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


# --------------------------------------------------------------------------- build

def build(args, log: Path) -> dict:
    step(2, "host tools and libivtrace: make all")
    run(["make", "all"], "make all",
        "the Rust toolchain (rustup) and build-essential are needed: run scripts/deps.sh", log)
    if not IVTRACE.exists():
        raise DemoError(f"{rel(IVTRACE)} was not built", "run `make all` and read its errors", log)

    step(3, "the guest (make guest): Debian kernel and headers (cached in vm/out), ivtrace.ko "
            "for that kernel, static tools, workload")
    try:
        guest = guestbuild.build_guest(log_file=log)
    except guestbuild.BuildError as e:
        raise DemoError(f"building the guest failed: {e}",
                        "run `make guest` to see the whole error", log) from e
    say(f"   guest kernel {guest.kernel_version}, headers {guest.manifest['headers']}")

    step(4, "the guest initramfs with the module and the workload baked in (vm/build --add)")
    adds = guest.add("ivtrace.ko", "ivtrace-loadgen-static", "ivtwl") + \
        [f"{WORKLOAD / 'demo.sh'}:/workload/"]
    cmd = [REPO / "vm" / "build", "--no-update"]
    for a in adds:
        cmd += ["--add", a]
    run(cmd, "vm/build --add", "run the vm/build command in the log by hand to see why", log)
    return ivtvm.load_manifest()


# --------------------------------------------------------------------------- record

def record(args, man: dict, out: Path, logdir: Path) -> dict:
    shm = Path(f"/dev/shm/{args.shm_name}")
    shm.unlink(missing_ok=True)  # a stale CLOSED region would stop the recorder at once
    out.parent.mkdir(parents=True, exist_ok=True)
    summary_f = logdir / "record.json"
    rec_err = logdir / "record.log"
    accel, why = ivtvm.probe_accel(args.accel)  # what ivtvm.VM will pick, said up front

    step(5, f"record: bin/ivtrace record --shm {shm} -o {rel(out)}, boot the guest "
            f"({accel}), run the workload for {args.seconds} s")
    rec_cmd = [str(IVTRACE), "record", "--shm", str(shm), "-o", str(out), "--force", "--json"]
    with open(summary_f, "wb") as so, open(rec_err, "wb") as se:
        rec = subprocess.Popen(rec_cmd, cwd=REPO, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
    script = (f"/workload/demo.sh {args.seconds}\nrc=$?\n"
              "rmmod ivtrace || { echo 'demo: rmmod ivtrace failed'; rc=1; }\n"
              "echo \"demo: ivtrace.ko unloaded, region closed\"\nexit $rc\n")
    vm = ivtvm.VM(script, shm=str(shm), shm_size=args.shm_size, shm_clear=True, smp=args.smp,
                  mem=args.mem, accel=args.accel, modules=["ivtrace"],
                  modopts={"ivtrace": f"events={GROUPS}"}, initrd="built",
                  log=str(logdir / "guest-console.log"), build=False)
    stop = threading.Event()

    def echo_guest():
        seen = 0
        while not stop.is_set():
            lines = vm.console_text.splitlines()
            for ln in lines[seen:]:
                if ln.startswith(("workload:", "demo:", "IVTRACE-GUEST:")) or "Kernel panic" in ln:
                    say(f"   guest| {ln}")
            seen = len(lines)
            stop.wait(0.5)

    t = threading.Thread(target=echo_guest, daemon=True)
    try:
        vm.start()
        t.start()
        r = vm.wait(timeout=args.seconds + args.boot_timeout)
    except BaseException:
        vm.kill()
        stop_recorder(rec, 0)
        shm.unlink(missing_ok=True)
        raise
    finally:
        if t.is_alive():
            time.sleep(0.6)  # let it print the last console lines
        stop.set()
        if t.is_alive():
            t.join()
    how = stop_recorder(rec, 20)
    say(f"   guest: {r.summary()}")
    say(f"   recorder: {how}, exit {rec.returncode}")
    shm.unlink(missing_ok=True)
    if not r.booted:
        raise DemoError("the guest did not boot",
                        f"see {rel(logdir / 'guest-console.log')}; try `vm/run --run 'uname -a'`")
    if r.module_errors:
        raise DemoError(f"ivtrace.ko did not load: {r.module_errors}",
                        f"see {rel(logdir / 'guest-console.log')} (dmesg lines of ivtrace)")
    if rec.returncode not in (0,):
        raise DemoError(f"the recorder failed (exit {rec.returncode})",
                        f"see {rel(rec_err)}", rec_err)
    if not r.ok:
        say(f"   WARNING: the guest run was not clean ({r.summary()}); the trace holds what "
            "was recorded")
    return {"boot": r, "accel": accel, "accel_reason": why, "recorder": how,
            "record": json.loads(summary_f.read_text() or "{}"), "kernel": man["kernel_version"]}


# --------------------------------------------------------------------------- summary

def trace_dirs(out: Path) -> list[Path]:
    return sorted(p.parent for p in out.rglob("metadata"))


def bt2_check(path: Path) -> tuple[bool, str]:
    """Can babeltrace2 read `path`? (the counter sink reads every event)"""
    if not shutil.which("babeltrace2"):
        return False, "babeltrace2 is not installed"
    p = subprocess.run(["babeltrace2", str(path), "-c", "sink.utils.counter"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode == 0:
        # the counter prints running totals, then the final one
        m = re.findall(r"^\s*(\d+) Event messages", p.stdout, re.M)
        return True, f"babeltrace2 reads {int(m[-1]):,} events" if m else "babeltrace2 reads it"
    last = (p.stderr.strip().splitlines() or ["?"])[-1]
    return False, f"exit {p.returncode}: {last.strip()[:160]}"


def report_from_record(rec: dict) -> dict:
    """The totals of `ivtrace report --json` from the recorder's own summary (no per-type
    counts), for when the report cannot read the trace."""
    chans = rec.get("channels", [])
    events = sum(c["events"] for c in chans)
    reasons: dict = {}
    for c in chans:
        for k, v in c["lost"].items():
            reasons[k] = reasons.get(k, 0) + v
    return {"events": events, "discarded": sum(reasons.values()), "lost_by_reason": reasons,
            "lost_no_channel": rec.get("lost_no_channel", 0),
            "bytes_per_event": sum(c["bytes"] for c in chans) / max(1, events),
            "header_bytes_per_event": sum(c["header_bytes"] for c in chans) / max(1, events),
            "event_types": []}


def _report(res: dict, out: Path) -> dict:
    """`ivtrace report --json` of the trace or, when the report cannot read it, the recorder's
    own totals (with a warning: still say what the recorder saw, and whether babeltrace2
    reads the trace)."""
    p = subprocess.run([str(IVTRACE), "report", str(out), "--json"], capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0:
        say(f"  WARNING: `ivtrace report` failed: {p.stderr.strip()[:300]}")
        say("  (events per type are missing below; the recorder's own totals follow)")
        return report_from_record(res["record"])
    return json.loads(p.stdout)


def _say_totals(res: dict, rep: dict) -> None:
    """The guest and the run, then what was recorded: events, rate, losses by reason, size."""
    r = res["boot"]
    lost = rep["discarded"]
    say(f"  guest          Debian kernel {res['kernel']}, {res['smp']} vCPUs, QEMU ran "
        f"{r.duration:.1f} s (boot {r.boot_time or 0:.1f} s), workload exit {r.exit_code}")
    say(f"  accelerator    {res['accel']}: {res['accel_reason']}")
    if rep.get("span_s"):
        say(f"  recorded       {rep['events']:,} events over {rep['span_s']:.2f} s "
            f"({rep['events_per_s'] / 1000:.1f} k/s), recorder {res['recorder']}")
    else:
        say(f"  recorded       {rep['events']:,} events, recorder {res['recorder']}")
    reasons = ", ".join(f"{k} {v}" for k, v in rep["lost_by_reason"].items() if v)
    say(f"  lost           {lost:,}" + (f" ({reasons})" if reasons else "")
        + (f"; no free user channel: {rep['lost_no_channel']}" if rep["lost_no_channel"] else ""))
    say(f"  bytes/event    {rep['bytes_per_event']:.1f} on average, "
        f"{rep['header_bytes_per_event']:.1f} of them the event header")


def _say_event_types(rep: dict) -> None:
    """Events per type, most first; LTTng's per-call system call events folded into one line."""
    say("")
    say("  events per type:")
    streams = {0: "kernel", 1: "user"}
    sys_entry, sys_exit = {}, {}
    width = max([40] + [len(e["name"]) + 2 for e in rep["event_types"]])
    for e in sorted(rep["event_types"], key=lambda e: -e["count"]):
        m = re.fullmatch(r"syscall_(entry|exit)_(\w+)", e["name"])
        if m and e["count"]:
            d = sys_entry if m.group(1) == "entry" else sys_exit
            d[m.group(2)] = d.get(m.group(2), 0) + e["count"]
        elif e["count"]:
            say(f"    {streams.get(e['stream_class'], e['stream_class']):<7}"
                f"{e['name']:<{width}}{e['count']:>12,}")
    if sys_entry or sys_exit:
        # LTTng names system calls per call (syscall_entry_<name>): one line for them all
        top = sorted(sys_entry.items(), key=lambda kv: -kv[1])[:6]
        say(f"    kernel syscall_entry_* / syscall_exit_*   {sum(sys_entry.values()):>12,} / "
            f"{sum(sys_exit.values()):,} ({len(set(sys_entry) | set(sys_exit))} system calls; "
            f"most: {', '.join(f'{n} {c:,}' for n, c in top)})")
    zero = [e["name"] for e in rep["event_types"] if not e["count"]]
    if zero:
        say(f"    (none of: {', '.join(zero)})")


def _say_how_to_open(res: dict, out: Path) -> None:
    """Where the trace is and how to open it (babeltrace2 on the whole and on each trace, with
    whether it reads them; Trace Compass; ivtrace report), the console log, the same boot."""
    dirs = trace_dirs(out)
    say(f"  trace          {rel(out)}/  ({', '.join(rel(d) for d in dirs)}, ivtrace.json)")
    say("  open it:")
    ok_whole, why_whole = bt2_check(out)
    if ok_whole:
        say(f"    babeltrace2 {rel(out)} | less              # every event as text ({why_whole})")
    for d in dirs:
        ok, why = bt2_check(d)
        say(f"    babeltrace2 {rel(d)} | less" + " " * max(1, 22 - len(rel(d)))
            + (f"# {why}" if ok else f"# FAILS: {why}"))
    if not ok_whole:
        say(f"    (babeltrace2 {rel(out)}, both traces at once, fails: {why_whole})")
    kdir = next((d for d in dirs if d.name == "kernel"), None)
    if kdir is not None:
        meta = (kdir / "metadata").read_text(errors="replace")
        lttng = 'domain = "kernel"' in meta and "lttng-modules" in meta
        say(f"    Trace Compass: File > Open Trace..., select {rel(kdir)}/metadata"
            + (" (an LTTng kernel trace: Control Flow and Resources views)" if lttng else
               " (opens as a generic CTF trace: thread ids, no names yet)"))
    say(f"    bin/ivtrace report {rel(out)}                 # counts, losses, rates per channel")
    say(f"  guest console: {rel(res['logdir'] / 'guest-console.log')}")
    say(f"  boot the same guest yourself: vm/run --initrd built --shm ivt0 --shm-size "
        f"{res['shm_size']} -M ivtrace --modopts 'ivtrace:events={GROUPS}' "
        "--run '/workload/demo.sh 10; rmmod ivtrace'")


def summarize(res: dict, out: Path) -> None:
    """Step 6: what the run recorded, its events by type, and how to open the trace."""
    step(6, "summary")
    rep = _report(res, out)
    say("")
    _say_totals(res, rep)
    if not rep["event_types"]:
        say("")
        say("  events per channel (from the recorder's summary):")
        for c in res["record"].get("channels", []):
            say(f"    {c['file']:<30}{c['events']:>12,}")
    else:
        _say_event_types(rep)
    say("")
    _say_how_to_open(res, out)
    say(f"== done in {time.monotonic() - T0:.0f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="vm/demo",
        description="Record a real guest into a CTF trace: build everything, boot the demo "
                    "guest with ivtrace.ko and a ~10 s workload, print a summary.")
    ap.add_argument("-o", "--output", default="out/demo", help="trace directory (default out/demo)")
    ap.add_argument("--seconds", type=int, default=10, help="workload duration (default 10)")
    ap.add_argument("--accel", default="auto", help="auto (default), kvm or tcg")
    ap.add_argument("--smp", type=int, default=2)
    ap.add_argument("--mem", default="512M")
    ap.add_argument("--shm-size", default="64M", help="ivshmem region, a power of two (64M)")
    ap.add_argument("--shm-name", default=f"ivtrace-demo-{os.getpid()}")
    ap.add_argument("--boot-timeout", type=float, default=300,
                    help="seconds allowed on top of --seconds for boot and shutdown")
    ap.add_argument("--no-build", action="store_true", help="skip the build steps (2-4)")
    ap.add_argument("--no-deps", action="store_true", help="(vm/demo) skip scripts/deps.sh")
    args = ap.parse_args(argv)
    if args.seconds < 3:
        ap.error("--seconds must be at least 3")
    os.chdir(REPO)
    out = (REPO / args.output).resolve() if not os.path.isabs(args.output) else Path(args.output)
    logdir = out.parent / f"{out.name}-logs"
    logdir.mkdir(parents=True, exist_ok=True)
    blog = logdir / "build.log"
    blog.write_text("")
    try:
        if args.no_build:
            man = ivtvm.load_manifest()
        else:
            man = build(args, blog)
        res = record(args, man, out, logdir)
        res.update(smp=args.smp, logdir=logdir, shm_size=args.shm_size)
        summarize(res, out)
    except DemoError as e:
        say(f"\ndemo: ERROR: {e}")
        if e.log is not None and e.log.exists():
            tail = e.log.read_text(errors="replace").splitlines()[-25:]
            say(f"--- last lines of {rel(e.log)}:")
            say("\n".join(tail))
            say("---")
        say(f"demo: next step: {e.hint}")
        return 1
    except (ivtvm.VMError, OSError) as e:
        say(f"\ndemo: ERROR: {e}")
        say("demo: next step: run `vm/build` and `vm/run --run 'uname -a'` to check the guest")
        return 1
    except KeyboardInterrupt:
        say("\ndemo: interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
