"""Recognise and release a guest that QEMU's multi-threaded TCG left on stale kernel text.

Under MTTCG (QEMU 7.2, one host thread per vCPU) a vCPU can keep running a translated block
of kernel text that another vCPU has since patched (text_poke_bp_batch: every static key,
static call or tracepoint change, so modprobe/rmmod and enabling ftrace events). Linux 6.1's
int3 handler then moves RIP back onto the old `int3` for ever: the kernel's watchdogs report a
soft lockup and an RCU stall, and the guest never finishes. QMP's `singlestep on` changes the
flags of every translated-block lookup, so the stale blocks stop matching and the vCPUs run
what memory holds; the guest goes on within seconds. docs/kvm.md tells the whole story; under
KVM none of this can happen.

StallWatcher reads the console of a running ivtvm.VM and, on the kernel's own report of a
lockup, holds `singlestep on` for a few seconds and turns it off again. Each release is a
Release the BootResult carries (BootResult.env_faults), so that a test whose guest needed one
says so instead of passing silently.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# The kernel's own reports of a CPU that stopped making progress (Linux 6.1 wording), at the
# start of a console line (after an optional printk time stamp): `/init` echoes dmesg lines as
# "IVTRACE-GUEST: dmesg: ..." at the end of a run, and those must not start a release.
RE_STALL = re.compile(
    r"^(?:\[\s*\d+\.\d+\]\s*)?("
    r"watchdog: BUG: soft lockup - CPU#\d+ stuck for \d+s!.*"
    r"|rcu: INFO: rcu_\w+ (?:self-)?detected stalls? on CPUs?.*)$", re.M)

# How long `singlestep on` stays on: the stalls of notes on this fault went on within 5-6 s.
HOLD_S = 6.0
# A guest that stalls more often than this is not rescued further (each release is recorded;
# the test's timeout then ends the boot as it would have without the watcher).
MAX_RELEASES = 4


@dataclass
class Release:
    """One rescue of a stalled guest: when, on which kernel line, and what the monitor said."""
    line: str             # the kernel's report that started it
    at: float             # seconds from QEMU's start to the release
    held: float           # seconds `singlestep on` stayed on
    console_bytes: int    # what the console printed while it was on (the guest moving again)
    error: str = ""       # the monitor's refusal, if any (then the guest was not released)

    def describe(self) -> str:
        if self.error:
            return (f"environment fault: QEMU MTTCG stale translation suspected at {self.at:.0f} s "
                    f"({self.line}); release failed: {self.error}")
        return (f"environment fault: QEMU MTTCG stale translation, released after {self.at:.0f} s "
                f"(kernel: {self.line}; singlestep held {self.held:.1f} s, console printed "
                f"{self.console_bytes} bytes meanwhile)")


def is_stall_line(line: str) -> bool:
    """Whether a kernel log line (as /init echoes it, without the console's prefix) is a
    lockup or stall report: the lines a release accounts for."""
    return RE_STALL.search(line.strip()) is not None


class StallWatcher(threading.Thread):
    """Watches `vm`'s console (ivtvm.VM: its _cond, _buf, _eof and t0) and releases the guest
    through `monitor(command)` (a human monitor command sent over QMP) on each stall report."""

    def __init__(self, vm, monitor: Callable[[str], str], hold: float = HOLD_S):
        super().__init__(name="ivtvm-stall-watch", daemon=True)
        self.vm, self.monitor, self.hold = vm, monitor, hold
        self.releases: list[Release] = []
        self._scanned = 0  # bytes of the console already looked at (whole lines only)

    def run(self) -> None:
        while len(self.releases) < MAX_RELEASES:
            line = self._next_report()
            if line is None:
                return
            self.releases.append(self._release(line))
            if self.releases[-1].error:
                return

    def _next_report(self) -> str | None:
        """Block until a whole console line reports a stall (its text) or QEMU exits (None)."""
        vm = self.vm
        while True:
            with vm._cond:
                while not vm._eof and vm._buf.rfind(b"\n", self._scanned) < 0:
                    vm._cond.wait(0.5)
                if vm._eof:
                    return None
                end = vm._buf.rfind(b"\n", self._scanned) + 1
                chunk = bytes(vm._buf[self._scanned:end])
            self._scanned = end
            m = RE_STALL.search(chunk.decode("utf-8", "replace").replace("\r", ""))
            if m:
                return m.group(1).strip()

    def _release(self, line: str) -> Release:
        """`singlestep on` for `hold` s (or until QEMU exits), then off; then skip what the
        console printed meanwhile (the rest of this report), so one stall is one release."""
        vm = self.vm
        at = time.monotonic() - vm.t0
        with vm._cond:
            before = len(vm._buf)
        try:
            self.monitor("singlestep on")
        except Exception as e:  # noqa: BLE001 - any monitor failure is recorded, not raised
            return Release(line, at, 0.0, 0, error=f"`singlestep on`: {e}")
        t_on = time.monotonic()
        with vm._cond:
            vm._cond.wait_for(lambda: vm._eof, timeout=self.hold)
        held = time.monotonic() - t_on
        error = ""
        try:
            self.monitor("singlestep off")
        except Exception as e:  # noqa: BLE001
            error = "" if vm._eof else f"`singlestep off`: {e}"
        with vm._cond:
            after = len(vm._buf)
            end = vm._buf.rfind(b"\n") + 1
        self._scanned = max(self._scanned, end)
        return Release(line, at, held, after - before, error)
