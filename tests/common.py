"""What any test module may import (conftest.py holds the fixtures): the tools' paths, the
region ABI's constants, `run`, which fails the test with a command's output when the command
fails or hangs, and `wait_for`, which fails it when a condition never comes. Import from here,
not from conftest: pytest imports every conftest.py under the one name `conftest`, so which one
that name means depends on the order of collection."""

import json
import pathlib

import pytest

from ivtools.proc import sh, wait_until

REPO = pathlib.Path(__file__).resolve().parent.parent
BIN = REPO / "bin"
IVTRACE = BIN / "ivtrace"
LOADGEN = BIN / "ivtrace-loadgen"
VECTORS = json.loads((REPO / "abi" / "vectors.json").read_text())


def abi(name: str) -> int:
    """A size, offset or constant of the region ABI (abi/vectors.json)."""
    return VECTORS[name]


def run(cmd, timeout=120, check=True, **kw):
    """Run a command (ivtools.proc.sh); fail the test with its output if it fails (with
    `check`) or runs past `timeout` s (always)."""
    return sh(cmd, timeout=timeout, check=check, error=pytest.fail.Exception, **kw)


def wait_for(cond, timeout, what):
    """`cond()`'s first true value within `timeout` s (ivtools.proc.wait_until); else the test
    fails, saying what it waited for."""
    return wait_until(cond, timeout, what, error=pytest.fail.Exception)


def assert_no_panic(p):
    """A Rust panic exits 101 and prints 'panicked at'; neither may happen."""
    assert p.returncode != 101 and "panicked at" not in p.stderr, p.stderr
