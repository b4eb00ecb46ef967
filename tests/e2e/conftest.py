"""Fixtures of the end-to-end guest tests (tests/e2e): the build, once per session."""
import pytest

from e2e import guest as g


@pytest.fixture(scope="session")
def e2e_add():
    """Builds the guest, ivtrace.ko, the static loadgen and ivtwl; the ivtvm `add=` list."""
    return g.build_all()
