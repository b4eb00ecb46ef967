"""Every lost event, counted twice: what CTF readers are told (babeltrace2's Python bindings:
the counts of the DiscardedEvents messages; the `babeltrace2` command: its warnings) and what
`ivtrace report` recorded by reason. The acceptance of issue 11's item 5 is that they agree.
"""
import json
import subprocess
from pathlib import Path

import ctf

REPO = Path(__file__).resolve().parents[1]
IVTRACE = REPO / "bin" / "ivtrace"


def report(out):
    p = subprocess.run([str(IVTRACE), "report", str(out), "--json"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, f"ivtrace report {out} failed ({p.returncode}):\n{p.stderr}"
    return json.loads(p.stdout)


def account(out):
    """The losses of the recording in `out` as every reader sees them, and by reason."""
    rep = report(out)
    reasons = {k: v for k, v in rep["lost_by_reason"].items() if v}
    if rep["lost_no_channel"]:
        reasons["no_channel"] = rep["lost_no_channel"]
    if rep.get("host_lost") and rep["host_lost"]["missed"]:
        reasons["host_missed"] = rep["host_lost"]["missed"]
    if rep.get("lost_ftrace"):
        reasons["ftrace"] = rep["lost_ftrace"]
    return {
        "bt2": ctf.discarded(out),
        "babeltrace2": ctf.babeltrace2_discarded(out),
        "report_ctf": rep["discarded"],
        "report_recorded": rep["lost_total"],
        "reasons": reasons,
    }


def assert_every_loss_is_in_the_ctf(out, want=()):
    """The four counts agree and every reason in `want` occurred; returns the account."""
    a = account(out)
    print(f"\n{out}: {a}")
    total = sum(a["reasons"].values())
    assert a["report_recorded"] == total, a
    assert a["bt2"] == a["babeltrace2"] == a["report_ctf"] == a["report_recorded"], a
    for reason in want:
        assert a["reasons"].get(reason, 0) > 0, (reason, a)
    return a
