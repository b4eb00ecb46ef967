"""bench/harness/same_trace.py: two recordings of one region by the same build compare equal
(apart from this run's clock values and the times converted with them), and a changed
stream byte or metadata line is caught.

Uses the built bin/ivtrace and bin/ivtrace-loadgen (a prefill in /dev/shm); a few seconds.
"""
import os
import subprocess
from pathlib import Path

import pytest

from harness import same_trace

REPO = Path(__file__).resolve().parents[2]
IVTRACE = REPO / "bin" / "ivtrace"
LOADGEN = REPO / "bin" / "ivtrace-loadgen"


@pytest.fixture(scope="module")
def region():
    if not (IVTRACE.exists() and LOADGEN.exists()):
        pytest.skip("bin/ivtrace and bin/ivtrace-loadgen are not built (make all)")
    shm = Path(f"/dev/shm/ivt-same-trace-{os.getpid()}.region")
    subprocess.run([str(LOADGEN), "--shm", str(shm), "--create", "--events", "3000",
                    "--threads", "2", "--size", "8-200", "--payload", "text"],
                   check=True, capture_output=True, timeout=120)
    yield shm
    shm.unlink(missing_ok=True)


def two_recordings(region: Path, tmp: Path) -> tuple[Path, Path]:
    outs = same_trace.record_each({"a": IVTRACE, "b": IVTRACE}, region, tmp)
    return outs["a"], outs["b"]


def test_one_build_twice_is_the_same_trace(region, tmp_path):
    a, b = two_recordings(region, tmp_path)
    r = same_trace.compare(a, b)
    assert r["differ"] == [], r["differ"]
    # The user streams count nanoseconds converted with each run's own clock measurement:
    # equal event for event apart from times, which must not be a vacuous comparison.
    assert r["files"] >= 4 and r["identical"] + r["same_but_clock"] == r["files"], r
    assert len(same_trace.events_apart_from_times(a / "user")) >= 3000


def test_a_changed_stream_byte_or_metadata_line_is_a_difference(region, tmp_path):
    a, b = two_recordings(region, tmp_path)
    stream = b / "user" / "user_chan0"
    data = bytearray(stream.read_bytes())
    data[-1] ^= 0xFF
    stream.write_bytes(bytes(data))
    meta = b / "user" / "metadata"
    meta.write_text(meta.read_text().replace("loadgen:payload", "loadgen:paylaod", 1))
    differ = same_trace.compare(a, b)["differ"]
    assert any("user_chan0" in d for d in differ), differ
    assert any("metadata" in d and "paylaod" in d for d in differ), differ
