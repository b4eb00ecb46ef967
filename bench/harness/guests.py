"""What the guest presets (guest, evaluation, doorbell) share: the build (the one guest
build, guestbuild.build_guest, plus the host tools where a preset runs them), the options
that pick the accelerator and allow stale binaries, and the record of both in the results."""

from __future__ import annotations

import subprocess

from ivtools import guestbuild

from . import Prerequisite
from .results import ROOT

IVTRACE = ROOT / "bin" / "ivtrace"


def add_arguments(ap, smp: int = 1, mem: str = "512M") -> None:
    ap.add_argument("--accel", default="auto", choices=("auto", "kvm", "tcg"))
    ap.add_argument("--smp", type=int, default=smp, help=f"guest vCPUs (default {smp})")
    ap.add_argument("--mem", default=mem, help=f"guest memory (default {mem})")
    ap.add_argument("--reuse-stale-binaries", action="store_true",
                    help="when a build fails, measure the files of an earlier build (listed "
                         "in the results' build.stale); without it a failed build is an error")


def build(a, rec: dict, host_tools: bool, tracers: bool = False,
          kernel: str | None = None) -> guestbuild.GuestBuild:
    """The host tools (make all, when the preset runs bin/ivtrace) and the guest (with the
    tracers ivtrace.ko is compared with, when asked; for another kernel than the default
    guest's, kernel=, a spec of ivtools.buildroot, booted from guest_out()). Failures are
    errors, unless --reuse-stale-binaries finds files of an earlier build: then those are
    measured and listed in rec["build"]["stale"]."""
    stale = rec["build"]["stale"]
    if host_tools:
        p = subprocess.run(["make", "-C", str(ROOT), "all"], capture_output=True, text=True,
                           timeout=1800)
        if p.returncode:
            if not (a.reuse_stale_binaries and IVTRACE.exists()):
                raise Prerequisite("building the host tools (make all) failed:\n"
                                   f"{(p.stdout + p.stderr)[-3000:]}")
            stale.append({"part": "the host tools (make all)", "files": ["bin/ivtrace"],
                          "error": f"make all failed (exit {p.returncode})"})
    try:
        guest = guestbuild.build_guest(reuse_stale=a.reuse_stale_binaries, tracers=tracers,
                                       kernel=kernel)
    except guestbuild.BuildError as e:
        raise Prerequisite(str(e)) from e
    stale.extend(guest.stale)
    return guest


def guest_out(guest: guestbuild.GuestBuild):
    """The directory of the guest's build, for ivtvm's out= (vm/out, or vm/out/kernels/<ver>)."""
    from pathlib import Path
    return Path(guest.manifest["vmlinuz"]).parent


def describe(rec: dict, guest: guestbuild.GuestBuild, accel: tuple[str, str], smp: int,
             mem: str) -> None:
    """The accelerator the guest runs under (name, why) and the guest, into the results."""
    rec["accelerator"] = {"name": accel[0], "reason": accel[1]}
    rec["guest"] = {"kernel": guest.kernel_version, "cpus": smp, "mem": mem}
