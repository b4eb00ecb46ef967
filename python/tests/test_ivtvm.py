"""ivtools.ivtvm's failure messages: a failed boot says where the guest stopped."""

import re
import subprocess

from ivtools.ivtvm import CONSOLE_TAIL, QEMU, RE_LOCKUP, BootResult, parse_console, tcg_threading, vcpu_state
from ivtools.proc import wait_until


def result(text, **kw):
    """A BootResult as VM.wait() builds it from a console (what QEMU printed)."""
    fields = dict(console_text=text, accel="tcg", accel_reason="forced", duration=300.0,
                  timed_out=False, qemu_returncode=0, log_path=None)
    fields.update(kw)
    return BootResult(**fields, **parse_console(text))


def test_a_timed_out_boot_shows_the_last_console_lines_and_where_the_rest_is():
    lines = ["IVTRACE-GUEST: booted kernel=6.1.0 cpus=2 uptime=1.0"]
    lines += [f"line {i}" for i in range(1, 50)]
    r = result("\n".join(lines) + "\n", timed_out=True, log_path="/tmp/x/console.log")
    msg = r.explain()
    head, *rest = msg.splitlines()
    assert head == r.summary() and head.startswith("guest TIMEOUT; accel=tcg")
    assert rest[0] == (f"--- console, last {CONSOLE_TAIL} of 50 lines; "
                       "all 50 in /tmp/x/console.log ---")
    assert rest[1:-1] == lines[-CONSOLE_TAIL:]
    assert rest[-1] == "--- end of console ---"


def test_a_short_console_is_shown_whole():
    r = result("SeaBIOS\nBooting from ROM...\n", timed_out=True)
    assert r.explain(60).splitlines()[1:] == [
        "--- console, last 2 of 2 lines ---", "SeaBIOS", "Booting from ROM...",
        "--- end of console ---"]


def test_a_silent_guest_says_so():
    r = result("", timed_out=True, log_path="c.log")
    assert r.explain().splitlines()[1] == "(the console printed nothing; log c.log)"


def test_a_panic_keeps_its_message_in_the_summary_line():
    text = "x\n[   17.6] Kernel panic - not syncing: sysrq triggered crash\n"
    r = result(text)
    assert r.panicked and r.explain().splitlines()[0].endswith("panic: sysrq triggered crash")


def test_a_timeout_names_where_each_vcpu_was(tmp_path):
    """vcpu_state against a real QEMU (two vCPUs, no disk: SeaBIOS waits for a boot device)."""
    sock = tmp_path / "qmp.sock"
    qemu = subprocess.Popen([QEMU, "-machine", "q35", "-accel", "tcg", "-smp", "2", "-m", "64M",
                             "-display", "none", "-nodefaults", "-no-reboot",
                             "-qmp", f"unix:{sock},server=on,wait=off"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        wait_until(sock.exists, 30, f"QEMU's QMP socket {sock}")
        state = vcpu_state(sock)
    finally:
        qemu.kill()
        qemu.wait()
    assert re.fullmatch(r"CPU#0 (halted \(idle\)|running kernel code) at [RE]IP [0-9a-f]+; "
                        r"CPU#1 (halted \(idle\)|running kernel code) at [RE]IP [0-9a-f]+",
                        state), state


def test_a_qemu_that_does_not_answer_is_said_not_to(tmp_path):
    state = vcpu_state(tmp_path / "no-such.sock")
    assert state.startswith("unknown (QEMU's monitor did not answer: "), state


def test_the_vcpu_state_heads_the_console_in_a_failure_message():
    r = result("SeaBIOS\n", timed_out=True, vcpus="CPU#0 halted (idle) at RIP 1")
    assert r.explain().splitlines()[1:3] == ["vCPUs at the timeout: CPU#0 halted (idle) at RIP 1",
                                             "--- console, last 1 of 1 lines ---"]


def test_tcg_threading_is_single_unless_the_vcpu_threads_are_named(monkeypatch):
    monkeypatch.delenv("IVTRACE_TCG_THREAD", raising=False)
    assert tcg_threading("auto", [])[0] == "single"
    assert tcg_threading("auto", ["-name", "g,debug-threads=on"])[0] == "multi"
    assert tcg_threading("multi", []) == ("multi", "forced (--tcg-thread multi)")
    monkeypatch.setenv("IVTRACE_TCG_THREAD", "multi")
    assert tcg_threading("auto", [])[0] == "multi"
    assert tcg_threading("single", [])[0] == "single"   # the caller's word wins over the env


def test_a_released_stall_heads_the_failure_message():
    fault = ("environment fault: QEMU MTTCG stale translation of patched kernel text "
             "('watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [rmmod:1]'); released with "
             "`singlestep on` after 6 s")
    r = result("x\n", tcg_thread="multi", env_faults=[fault])
    assert r.summary().startswith("guest no exit marker; accel=tcg,thread=multi")
    assert r.summary().endswith("; " + fault) and fault in r.explain().splitlines()[0]


def test_the_stall_line_pattern_matches_the_kernels_watchdogs():
    text = ("[  204.774762] watchdog: BUG: soft lockup - CPU#1 stuck for 44s! [rmmod:342]\n"
            "[  210.1] rcu: INFO: rcu_preempt self-detected stall on CPU\n"
            "[  211.2] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n"
            "[  212.3] watchdog: CPU1: Watchdog detected hard LOCKUP\n"
            "IVTRACE-GUEST: dmesg: watchdog: BUG: soft lockup - CPU#1 stuck for 44s! [rmmod:342]\n")
    assert [m.group(1) for m in RE_LOCKUP.finditer(text)] == [
        "watchdog: BUG: soft lockup - CPU#1 stuck for 44s! [rmmod:342]",
        "rcu: INFO: rcu_preempt self-detected stall on CPU",
        "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:"]
