"""Fixtures of the Trace Compass tests (tests/tracecompass): Trace Compass itself and the
guest files, once per session."""
import pytest

from tracecompass import tc as t


@pytest.fixture(scope="session")
def tracecompass(tmp_path_factory):
    """Trace Compass 6.2's core jars (installed if missing) and our driver, compiled."""
    return t.TraceCompass(tmp_path_factory.mktemp("tracecompass"))


@pytest.fixture(scope="session")
def tc_add():
    """Builds the guest, ivtrace.ko, the static loadgen and ivtwl; the ivtvm `add=` list."""
    return t.guest_files()
