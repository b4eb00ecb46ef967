"""Fixtures of `make test-kernels` (tests/kernels): the guest kernels users run, each built,
booted and recorded, and the table of what each one gave.

IVTRACE_TEST_KERNELS (comma-separated kernel specs, python/ivtools/buildroot.py) replaces the default three:
the host release's newest kernel (bookworm's 6.1), trixie's and trixie-backports' newest.
"""
import os
import sys
from pathlib import Path

import pytest

from ivtools import REPO, buildroot, guestbuild

SPECS = [s for s in os.environ.get("IVTRACE_TEST_KERNELS",
                                   "bookworm,trixie,trixie-backports").split(",") if s]
SUMMARY = REPO / "build" / "kernels" / "summary.txt"

# One row per kernel, filled in by the tests (the boot, then DKMS), printed at the end.
ROWS: dict[str, dict] = {}
# Boots that died before ivtrace.ko was loaded and were retried, with their console.
RETRIES: list[str] = []


class KernelUnderTest:
    """A resolved kernel spec, its guest build and its row of the table."""

    def __init__(self, spec: str):
        self.spec = spec
        apt = guestbuild.Apt(allow_update=True, force_update=False)
        try:
            self.kernel = guestbuild.resolve_kernel(apt, spec)
            # The host release's newest kernel is the default guest (vm/out, `make guest`).
            default = self.kernel.release is None and self.kernel.version == \
                guestbuild.kernel_version(apt, None)
            self.guest = guestbuild.build_guest(kernel=None if default else spec)
        except guestbuild.BuildError as e:
            pytest.fail(f"building the guest of kernel {spec} failed: {e}")
        self.version = self.kernel.version
        self.out = Path(self.guest.manifest["vmlinuz"]).parent
        self.row = ROWS.setdefault(self.version, {"spec": spec, "kernel": self.version})
        where = (f"built in the {self.kernel.release} build root" if self.kernel.release
                 else "built on this host")
        print(f"kernel {spec}: {self.version} ({where})", file=sys.stderr)

    @property
    def root(self) -> buildroot.BuildRoot:
        """The build root of the kernel's release (the host's own release has one too, for
        DKMS: the packaged module is built where a guest of that release would build it)."""
        return buildroot.BuildRoot(self.kernel.release or buildroot.host_codename())


@pytest.fixture(scope="module", params=SPECS)
def kut(request):
    return KernelUnderTest(request.param)


def table() -> str:
    head = ("kernel", "spec", "events", "lost", "dmesg problems", "boots", "relay", "dkms")
    rows = [(r["kernel"], r["spec"], str(r.get("events", "-")), str(r.get("lost", "-")),
             str(r.get("dmesg_problems", "-")), str(r.get("boots", "-")), r.get("relay", "-"),
             r.get("dkms", "-")) for r in ROWS.values()]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), "-+-".join("-" * w for w in widths)]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    text = "guest kernels (make test-kernels):\n" + table() + "\n"
    if RETRIES:
        text += "\nretried boots (died before ivtrace.ko was loaded):\n" + "\n".join(RETRIES) + "\n"
    else:
        text += "no boot was retried\n"
    terminalreporter.write_sep("=", "guest kernels")
    terminalreporter.write(text)
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(text)
