"""ivtools.proc against real commands: what `sh` returns, raises and says."""

import subprocess

import pytest

from ivtools.proc import CommandError, say, sayer, sh, stop_recorder, wait_until


class Boom(Exception):
    pass


def test_sh_returns_the_output_of_a_command_that_succeeds():
    p = sh(["sh", "-c", 'echo out; echo err >&2', "x"])
    assert (p.returncode, p.stdout, p.stderr) == (0, "out\n", "err\n")


def test_sh_items_need_not_be_strings():
    assert sh(["printf", "%s-%s", 1, 2.5]).stdout == "1-2.5"


def test_a_failure_raises_the_callers_error_with_status_and_output():
    with pytest.raises(Boom) as e:
        sh(["sh", "-c", "echo partial; echo 'why it failed' >&2; exit 3"], what="the step",
           error=Boom)
    msg = str(e.value)
    assert msg.startswith("the step (`sh -c ") and "failed (exit 3)" in msg
    assert "--- stdout\npartial" in msg and "--- stderr\nwhy it failed" in msg


def test_without_check_the_caller_reads_the_status():
    assert sh(["sh", "-c", "exit 5"], check=False).returncode == 5


def test_a_hang_is_killed_and_raised_even_without_check():
    with pytest.raises(CommandError, match=r"(?s)timed out after 0.3 s .*--- stdout\nbefore"):
        sh(["sh", "-c", "echo before; exec sleep 30"], timeout=0.3, check=False)


def test_merged_streams_keep_the_end_of_a_long_output():
    with pytest.raises(CommandError) as e:
        sh(["sh", "-c", "seq 1 5000; echo last >&2; exit 1"], stderr=subprocess.STDOUT)
    msg = str(e.value)
    assert msg.endswith("5000\nlast") and "\n1\n" not in msg and "--- stderr" not in msg


def test_say_prefixes_and_flushes(capsys):
    say("plain")
    sayer("eval")("with a prefix")
    say()
    assert capsys.readouterr().out == "plain\neval: with a prefix\n\n"


def test_wait_until_returns_the_first_true_value():
    calls = iter([0, None, "", "found", "later"])
    assert wait_until(lambda: next(calls), 5, "a value", interval=0.01) == "found"


def test_wait_until_raises_the_callers_error_naming_what_it_waited_for():
    with pytest.raises(Boom, match=r"timed out after 0.1 s waiting for the moon"):
        wait_until(lambda: False, 0.1, "the moon", error=Boom, interval=0.01)


def _python(code: str) -> subprocess.Popen:
    """A child that prints "ready" once its signal handling is set, then runs `code`."""
    p = subprocess.Popen(["python3", "-c", f"import signal, sys, time\n{code}"],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_recorder_that_ends_by_itself_is_only_waited_for():
    p = _python("print('ready', flush=True)")
    assert stop_recorder(p, 10) == "stopped by itself (region closed)"
    assert p.returncode == 0


def test_a_recorder_still_running_is_interrupted_and_flushes():
    # The handler set explicitly: a shell's background job starts its children with SIGINT
    # ignored, and Python then keeps it ignored (as `make test &` does).
    p = _python("signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                "print('ready', flush=True)\n"
                "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    sys.exit(3)")
    assert stop_recorder(p, 0.2) == "stopped with SIGINT (flushed what was committed)"
    assert p.returncode == 3


def test_a_recorder_deaf_to_sigint_is_killed_and_says_so():
    p = _python("signal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                "time.sleep(60)")
    assert stop_recorder(p, 0.1, interrupt_wait_s=0.3) == \
        "killed (did not stop within 0.3 s of SIGINT)"
    assert p.returncode == -9
