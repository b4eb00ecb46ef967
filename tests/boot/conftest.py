"""Fixtures of the boot tests (tests/boot): the two recorded boots, once per module, and
Trace Compass."""
import pytest

from boot import boot as b
from tracecompass import tc as t


@pytest.fixture(scope="session")
def boot_add(guest):
    """ivtrace.ko, the relay and ivtwl from the session's guest build; bin/ivtrace."""
    if not b.g.IVTRACE.exists():
        pytest.fail(f"{b.g.IVTRACE} missing (run `make` at the top)")
    return guest.add("ivtrace.ko", "ivtwl", "ivtrace-ftrace")


@pytest.fixture(scope="session")
def tracecompass(tmp_path_factory):
    """Trace Compass 6.2's core jars (installed if missing) and TcReport, compiled."""
    return t.TraceCompass(tmp_path_factory.mktemp("tracecompass"))
