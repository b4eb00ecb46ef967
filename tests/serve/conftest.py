"""Fixtures of the `ivtrace serve` acceptance tests (tests/serve): the build, once per session."""
import pytest

from serve import serve as s


@pytest.fixture(scope="session")
def serve_add():
    """Builds ivtrace.ko and ivtrace_test.ko; the ivtvm `add=` list."""
    return s.build()
