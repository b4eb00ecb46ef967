"""`make demo-boot` (vm/demo-boot): a guest's boot traced from its first moment, analysed.

Builds the host tools and the guest, boots the demo guest under `ivtrace record` with ftrace's
boot parameters (the initcall, module and scheduler events; function_graph on the kernel's init
functions) and ivtrace.ko loaded by /init with ftrace=1, then prints `ivtrace boot`'s report,
the chart's path (SVG and, with Chromium, PNG) and the function profile's size beside the raw
events it aggregates (docs/boot.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ivtools import REPO, bootguest, guestbuild, ivtvm
from ivtools.proc import say, stop_recorder

IVTRACE = REPO / "bin" / "ivtrace"
# function_graph on the kernel's init functions: ~250 k graph events, none lost here.
APPEND = f"{bootguest.EVENTS} trace_buf_size=64M ftrace=function_graph ftrace_filter=*init*"
# After /init's `ivtrace-boot` marker (the boot's end): ftrace drained, the relay stopped, the
# module unloaded (the region closes, the recorder ends and derives the boot's streams).
SCRIPT = bootguest.stop_relay("demo-boot")
T0 = time.monotonic()


class DemoError(Exception):
    pass


def step(n: int, msg: str) -> None:
    say(f"== [{n}/5] {msg}   (+{time.monotonic() - T0:.0f} s)")


def build() -> guestbuild.GuestBuild:
    step(2, "host tools (make all) and the guest (make guest; both kept when up to date)")
    p = subprocess.run(["make", "-C", str(REPO), "all"], capture_output=True, text=True)
    if p.returncode:
        raise DemoError(f"make all failed:\n{(p.stdout + p.stderr)[-2000:]}")
    try:
        return guestbuild.build_guest()
    except guestbuild.BuildError as e:
        raise DemoError(f"building the guest failed: {e} (run `make guest` to see why)") from e


def record(guest: guestbuild.GuestBuild, out: Path, accel: str) -> None:
    shm = Path(f"/dev/shm/ivtrace-demo-boot-{os.getpid()}")
    step(3, f"record the boot: bin/ivtrace record -o {out}; kernel command line: {APPEND}")
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.record.log"
    with open(log, "wb") as err:
        rec = subprocess.Popen([str(IVTRACE), "record", "--shm", str(shm), "-o", str(out),
                                "--force"], stdout=subprocess.DEVNULL, stderr=err,
                               stdin=subprocess.DEVNULL)
    vm = ivtvm.VM(SCRIPT, shm=str(shm), shm_size="16M", shm_clear=True, smp=2, mem="1G",
                  accel=accel, modules=["ivtrace"], modopts={"ivtrace": "ftrace=1"},
                  append=APPEND, add=guest.add("ivtrace.ko", "ivtwl", "ivtrace-ftrace"),
                  log=str(out.parent / f"{out.name}.console.log"))
    try:
        vm.start()
        r = vm.wait(timeout=600)
    finally:
        vm.kill()
        stop_recorder(rec, 300, interrupt_wait_s=60)
        shm.unlink(missing_ok=True)
    say(f"   guest: {r.summary()}")
    for line in r.console_text.splitlines():
        if line.startswith("demo-boot:"):
            say(f"   guest| {line}")
    if "demo-boot: rmmod rc=0" not in r.console_text or r.kernel_problems:
        raise DemoError(f"the guest's boot did not finish cleanly: {r.kernel_problems}\n"
                        f"{r.tail(20)}")
    if rec.returncode != 0:
        raise DemoError(f"ivtrace record failed (exit {rec.returncode}): see {log}")


def report(out: Path) -> None:
    step(4, f"bin/ivtrace boot {out} --png")
    p = subprocess.run([str(IVTRACE), "boot", str(out), "--png", "--top", "3"],
                       capture_output=True, text=True, timeout=600)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        raise DemoError(f"ivtrace boot failed (exit {p.returncode}): {p.stderr.strip()}")
    for line in p.stderr.splitlines():
        say(f"   {line}")


def sizes(out: Path) -> None:
    """The profile beside the raw events: the ftrace streams, then the same trace with the
    profile instead of function_graph's raw events (on a copy)."""
    step(5, "the function profile's size beside the raw trace's")
    boot = json.loads((out / "ivtrace.json").read_text()).get("boot") or {}
    copy = out.parent / f"{out.name}-instead"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(out, copy)
    p = subprocess.run([str(IVTRACE), "boot", str(copy), "--derive", "--ftrace-profile",
                        "instead", "--no-chart"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise DemoError(f"ivtrace boot --derive --ftrace-profile instead failed: {p.stderr}")
    kernel = copy / "kernel"
    kept = sum(f.stat().st_size for f in kernel.iterdir() if f.name.startswith("ftrace_chan"))
    raw, profile = boot.get("ftrace_bytes", 0), boot.get("written", {}).get("profile_bytes", 0)
    graph = raw - kept
    say(f"   function_graph: {boot.get('graph_events', 0):,} raw events, {graph:,} bytes of "
        f"the ftrace streams ({raw:,} bytes with the other events)")
    say(f"   profile:        {boot.get('profile_rows', 0):,} rows, {profile:,} bytes "
        f"({out / 'kernel' / 'profile'}): {graph / max(profile, 1):.1f}x smaller than the "
        "raw graph events")
    say(f"   the trace with the profile instead of the raw events: {copy}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vm/demo-boot", description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="out/demo-boot",
                    help="recording directory (default out/demo-boot)")
    ap.add_argument("--accel", default="auto", help="auto (default), kvm or tcg")
    ap.add_argument("--no-deps", action="store_true", help="(vm/demo-boot) skip scripts/deps.sh")
    args = ap.parse_args(argv)
    out = Path(args.output)
    out = out if out.is_absolute() else REPO / out
    try:
        guest = build()
        record(guest, out, args.accel)
        report(out)
        sizes(out)
    except (DemoError, ivtvm.VMError, OSError) as e:
        say(f"\ndemo-boot: ERROR: {e}")
        return 1
    except KeyboardInterrupt:
        say("\ndemo-boot: interrupted")
        return 130
    say(f"== done in {time.monotonic() - T0:.0f} s; open {out / 'boot.svg'} in a browser, "
        f"{out / 'kernel'} in Trace Compass or babeltrace2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
