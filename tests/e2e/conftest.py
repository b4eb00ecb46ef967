"""Fixtures of the end-to-end guest tests (tests/e2e)."""
import pytest

from e2e import guest as g


@pytest.fixture(scope="session")
def e2e_add(guest):
    """The ivtvm `add=` list: ivtrace.ko, the static loadgen and ivtwl (the session's guest
    build, tests/conftest.py); bin/ivtrace must exist (make)."""
    if not g.IVTRACE.exists():
        pytest.fail(f"{g.IVTRACE} missing (run `make` at the top)")
    return guest.add("ivtrace.ko", "ivtrace-loadgen-static", "ivtwl")
