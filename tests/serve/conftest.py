"""Fixtures of the `ivtrace serve` acceptance tests (tests/serve)."""
import pytest

from serve import serve as s


@pytest.fixture(scope="session")
def serve_add(guest):
    """The ivtvm `add=` list: ivtrace.ko and ivtrace_test.ko (the session's guest build,
    tests/conftest.py); bin/ivtrace and bin/ivtrace-loadgen must exist (make)."""
    for f in (s.IVTRACE, s.LOADGEN):
        if not f.exists():
            pytest.fail(f"{f} missing (run `make` at the top)")
    return guest.add("ivtrace.ko", "ivtrace_test.ko")
