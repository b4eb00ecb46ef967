"""Issue 14's fault acceptance: lttng-relayd killed (SIGKILL) and restarted mid-run on the same
ports and output directory, then stalled (SIGSTOP, as a network that stops moving) and let go,
while `ivtrace serve` streams GUESTS simulated guests to it.

The guests never wait for the relay (they finish on time, nothing lost in their regions); the
daemon's queues hold what the relay cannot take; each session resumes after the restart (a
new connection, the same session name and directory, the stream files continued as
`<name>_r1`); and nothing is lost silently: per stream, the relay's copy holds at most what
the local copy holds, and at least that minus what the daemon counted lost on the way.
"""
import time

import pytest

from relay import relay as r
from serve import serve as s

GUESTS = 4
THREADS = 2
RATE = 20000           # events/s per writer thread
EVENTS = 200000        # per thread: 10 s
KILL_AT, RESTART_AT = 2.0, 4.0
STALL_AT, UNSTALL_AT = 5.5, 7.5


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("relay-restart")
    relay = r.Relayd(tmp / "relay", tmp / "relayd-home")
    srv = s.Server(tmp / "out", "--size", "16M", "--relayd", relay.url,
                   "--relay-buffer", "64M", "--relay-hostname", "hostR")
    m = {}
    try:
        t0 = time.monotonic()
        sims = [r.SimGuest(srv.sock, EVENTS, THREADS, RATE) for _ in range(GUESTS)]
        time.sleep(KILL_AT)
        relay.kill()
        m["killed_at"] = time.monotonic() - t0
        time.sleep(RESTART_AT - KILL_AT)
        relay.start()
        m["restarted_at"] = time.monotonic() - t0
        time.sleep(STALL_AT - RESTART_AT)
        relay.pause()
        time.sleep(UNSTALL_AT - STALL_AT)
        relay.resume()
        m["sims"] = [g.wait() for g in sims]
        m["sims_s"] = time.monotonic() - t0
        time.sleep(1)
        m["rc"], m["sum"] = srv.stop()
        m["log"] = srv.stderr()
    finally:
        srv.cleanup()
        relay.stop()
    m["relay"], m["out"] = relay, tmp / "out"
    yield m


def test_the_guests_never_waited_for_the_relay(run):
    assert run["sims_s"] < EVENTS / RATE + 5, run["sims_s"]
    assert sum(g["dropped"] for g in run["sims"]) == 0
    assert run["rc"] == 0, run["log"]
    assert len(run["sum"]) == GUESTS


def test_every_session_resumed_after_the_restart(run):
    for name, (summary,) in run["sum"].items():
        rel = summary["relay"]
        assert rel["connects"] >= 2 and rel["completed"], (name, rel)
        d = run["relay"].session_dir("hostR", name)
        assert list((d / "user").glob("user_chan*_r1")), f"{d}: no resumed stream file"


def test_nothing_is_lost_silently(run):
    total_lost = 0
    for name, (summary,) in run["sum"].items():
        counted = {st["stream"]: st["events_dropped"] + st["events_lost_in_flight"]
                   for st in summary["relay"]["streams"]}
        d = run["relay"].session_dir("hostR", name)
        relay_ev, _ = r.stream_counts(d / "user")
        local_ev, _ = r.stream_counts(run["out"] / name / "user")
        for (cls, inst), n in local_ev.items():
            got = relay_ev.get((cls, inst), 0)
            lost = counted.get(f"user_chan{inst}", 0)
            total_lost += lost
            assert n - lost <= got <= n, (name, inst, n, got, lost)
    print(f"\nrelay killed at {run['killed_at']:.1f} s, back at {run['restarted_at']:.1f} s, "
          f"stalled {STALL_AT}-{UNSTALL_AT} s: {total_lost} events counted lost on the way")
