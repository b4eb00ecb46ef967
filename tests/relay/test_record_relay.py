"""`ivtrace record --relayd`: the one-region recorder streams to lttng-relayd like serve.

ivtrace-loadgen writes a known stream into a region file (two writer threads); `ivtrace record
-o DIR --relayd URL` records it. The relay's copy of the session (under the --relay-hostname
host) reads in babeltrace2 without a warning and prints event for event what the local copy
prints, with a packet index; the sidecar's relay section says the session completed and
nothing was lost on the way, and the local copy holds every event loadgen wrote.
"""
import json
import signal
import subprocess
import time

from relay import relay as r
from serve import serve as s

EVENTS, THREADS, RATE = 20000, 2, 5000     # per thread: 4 s
NAME, HOST = "recrelay", "hostRec"


def test_record_streams_a_region_to_the_relay_and_keeps_a_local_copy(tmp_path, shm):
    relay = r.Relayd(tmp_path / "relay", tmp_path / "relayd-home")
    out = tmp_path / "out"
    try:
        lg = subprocess.Popen(
            [str(r.LOADGEN), "--shm", str(shm), "--events", str(EVENTS), "--threads",
             str(THREADS), "--channels", str(THREADS), "--rate", str(RATE), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rec = subprocess.Popen(
            [str(s.IVTRACE), "record", "--shm", str(shm), "-o", str(out), "--name", NAME,
             "--relayd", relay.url, "--relay-hostname", HOST, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        written = json.loads(lg.communicate(timeout=120)[0])
        time.sleep(1.5)
        rec.send_signal(signal.SIGINT)
        summary_out, err = rec.communicate(timeout=120)
        assert rec.returncode == 0, err
    finally:
        relay.stop()
    summary = json.loads(summary_out)
    recorded = sum(c["events"] for c in summary["channels"])
    assert recorded == written["written"] == EVENTS * THREADS, (written, summary)
    sent = json.loads((out / "ivtrace.json").read_text())["relay"]
    assert sent["completed"] and sent["session"] == NAME, sent
    assert sent["streams"] and all(st["events_dropped"] + st["events_lost_in_flight"] == 0
                                   for st in sent["streams"]), sent
    d = relay.session_dir(HOST, NAME)
    assert list((d / "user" / "index").glob("*.idx")), f"{d}/user: no packet index"
    want, _ = r.trace_lines(out / "user")
    got, warnings = r.trace_lines(d / "user")
    assert not warnings.strip(), warnings
    assert sorted(got) == sorted(want) and len(got) == EVENTS * THREADS
