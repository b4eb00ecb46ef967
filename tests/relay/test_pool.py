"""`ivtrace serve`'s drain pool: many guests on few threads, fairly.

One serve with a single drain thread (`--drain-threads 1`) records PACED simulated guests
writing at a modest rate and one FLOODING guest writing as fast as it can into a small ring
(no relay: this is about the pool). The flooding guest loses events (its ring overflows,
every loss counted: recorded + lost = written); the paced guests, which share the one drain
thread with it, lose nothing. serve runs a fixed number of threads whatever the number of
guests (no thread per guest).
"""
import time
from pathlib import Path

import pytest

from relay import relay as r
from serve import serve as s

PACED = 12
RATE, EVENTS = 2000, 8000          # per thread: 4 s
FLOOD_EVENTS = 3_000_000


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool")
    srv = s.Server(tmp / "out", "--size", "4M", "--drain-threads", "1")
    m = {}
    try:
        flood = s.subprocess.Popen(
            [str(r.LOADGEN), "--ivshmem-socket", str(srv.sock), "--events", str(FLOOD_EVENTS),
             "--threads", "1", "--channels", "1", "--subbufs", "4", "--subbuf-size", "16384",
             "--json"], stdout=s.subprocess.PIPE, stderr=s.subprocess.PIPE, text=True)
        paced = [r.SimGuest(srv.sock, EVENTS, 2, RATE) for _ in range(PACED)]
        time.sleep(1.5)
        m["threads"] = len(list(Path(f"/proc/{srv.pid}/task").iterdir()))
        m["paced"] = [g.wait() for g in paced]
        out, _ = flood.communicate(timeout=300)
        m["flood"] = s.json.loads(out)
        time.sleep(1)
        m["rc"], m["sum"] = srv.stop()
        m["log"] = srv.stderr()
    finally:
        srv.cleanup()
    yield m


def lost(summary):
    return sum(sum(c["lost"].values()) for c in summary["channels"])


def events(summary):
    return sum(c["events"] for c in summary["channels"])


def test_serve_runs_a_fixed_number_of_threads(run):
    # main, one drain thread, the poller: whatever the guests (13 here).
    assert run["threads"] <= 4, run["threads"]
    assert run["rc"] == 0, run["log"]
    assert len(run["sum"]) == PACED + 1


def test_a_flooding_guest_loses_only_its_own_events(run):
    by_written = sorted(run["sum"].values(), key=lambda v: events(v[0]) + lost(v[0]))
    flood = by_written[-1][0]
    assert events(flood) + lost(flood) == FLOOD_EVENTS
    assert lost(flood) > 0, "the flooding guest was expected to overflow its small ring"
    for (summary,) in by_written[:-1]:
        assert lost(summary) == 0, summary["serve"]["guest"]
        assert events(summary) == 2 * EVENTS
    print(f"\nflooding guest: {events(flood)} recorded, {lost(flood)} lost (counted); "
          f"{PACED} paced guests: nothing lost, one drain thread")
