"""Guest-written counters are clamped to what CTF readers accept, and the clamping is
reported (issue 10: a loss counter of 2^64-1 went into events_discarded, which babeltrace2
takes for "unknown" and aborts on, refusing the whole trace).
"""
import subprocess

from hostile.helpers import IVTRACE, babeltrace2, loadgen, need_tools, record, sidecar
from regionfile import Region

CTF_DISCARDED_MAX = (1 << 63) - 1


def test_a_loss_counter_of_2_64_minus_1_is_clamped_and_reported(shm, tmp_path):
    need_tools()
    stats = loadgen(shm, "--events", 5_000, "--threads", 2, "--size", 32, "--channels", 2)
    r = Region(shm)
    r.u64(r.channel(0, "lost_full"), (1 << 64) - 1)
    r.close()
    out = tmp_path / "t"
    p = record("--shm", shm, "-o", out)
    assert p.returncode == 0, p.stderr
    rc, lines, err = babeltrace2(out)
    assert rc == 0, err
    assert lines == stats["attempted"] - stats["dropped"]
    d = sidecar(out)
    assert d["clamped"] == [{"channel": 0, "field": "events_discarded",
                             "value": (1 << 64) - 1, "written": CTF_DISCARDED_MAX}], d["clamped"]
    rep = subprocess.run([str(IVTRACE), "report", str(out)], capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    assert "clamped" in rep.stdout, rep.stdout
