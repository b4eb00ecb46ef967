"""Fixtures of the package tests (`make test-deb`): the packages of build/deb installed on
this machine, once per session, and a fresh state directory per test."""
import os
import shutil
from pathlib import Path

import pytest

from deb import system


@pytest.fixture(scope="session")
def packages():
    """{package: version} of the packages `make deb` built, installed with apt-get."""
    return system.install_packages()


@pytest.fixture
def unit_dirs():
    """Test stand-ins for the unit's /run/ivtrace and /var/lib/ivtrace (names carry the
    branch and pid: nothing another run uses). sun_path is 108 bytes: /run keeps it short."""
    tag = f"ivtrace-packaging-{os.getpid()}"
    run = Path("/run") / tag
    state = Path("/var/tmp") / f"{tag}-state"
    for d in (run, state):
        shutil.rmtree(d, ignore_errors=True)
    yield {"/run/ivtrace": run, "/var/lib/ivtrace": state}
    for d in (run, state):
        shutil.rmtree(d, ignore_errors=True)
