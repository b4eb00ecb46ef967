"""Shared fixtures for ivtrace's end-to-end tests.

Run with babeltrace2's Python bindings available: `/usr/bin/python3 -m pytest tests`
(`make test` does). The tests drive the real tools in bin/ (built by `make`) and
use babeltrace2 as the independent reader of what ivtrace writes.
"""

import os
import pathlib
import uuid

import pytest

from common import IVTRACE, LOADGEN, REPO, abi, assert_no_panic, run  # noqa: F401  (for tests that import them from here)


@pytest.fixture(scope="session")
def tools():
    missing = [p for p in (IVTRACE, LOADGEN) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"{', '.join(map(str, missing))} missing: run `make` first")
    return {"ivtrace": str(IVTRACE), "loadgen": str(LOADGEN)}


@pytest.fixture(scope="session")
def guest():
    """The guest, built once per session by the one guest build (python/ivtools/guestbuild.py
    build_guest, what `make guest` runs): kernel and initramfs, ivtrace.ko for that kernel,
    the static tools and the workloads. `guest.add("ivtrace.ko", ...)` is an ivtvm `add=`
    list. A failed build fails the tests that boot a guest; nothing older is reused.

    IVTRACE_GUEST_KERNEL=SPEC (python/ivtools/buildroot.py: trixie, trixie-backports, an ABI name) builds
    the guest of that kernel instead; the tests' VMs boot it when IVTRACE_VM_OUT names its
    directory (vm/out/kernels/<ver>), which is checked."""
    from ivtools import guestbuild

    kernel = os.environ.get("IVTRACE_GUEST_KERNEL")
    try:
        built = guestbuild.build_guest(kernel=kernel)
    except guestbuild.BuildError as e:
        pytest.fail(f"building the guest failed: {e}")
    out = pathlib.Path(built.manifest["vmlinuz"]).parent
    booted = pathlib.Path(os.environ.get("IVTRACE_VM_OUT", REPO / "vm" / "out")).resolve()
    if kernel and booted != out.resolve():
        pytest.fail(f"IVTRACE_GUEST_KERNEL={kernel} built {out}; set IVTRACE_VM_OUT={out} so "
                    "that the tests boot it")
    return built


@pytest.fixture
def shm():
    """A unique /dev/shm path for one test's region, removed afterwards."""
    path = pathlib.Path("/dev/shm") / f"ivtrace-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield path
    path.unlink(missing_ok=True)
