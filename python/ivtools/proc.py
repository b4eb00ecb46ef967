"""Running commands, waiting for a condition and printing progress: one `sh`, one
`wait_until`, one `say` and one `stop_recorder` for vm/, bench/ and tests/.

`sh` raises the caller's own error class (a benchmark's BenchError, the guest build's
BuildError, a test's failure) so that each room reports a failed command its own way with
one message: what failed, its exit status and the end of what it printed.
"""

from __future__ import annotations

import functools
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

# How much of a failed command's stdout and stderr an error message keeps (the end of each).
TAIL_CHARS = 3000


class CommandError(Exception):
    """A command failed (exit status not 0) or ran past its timeout."""


def say(msg: str = "", *, who: str = "") -> None:
    """One line of progress on stdout, flushed at once so that a pipe or a CI log shows it
    when it happens; `who` prefixes it ("eval: ...")."""
    print(f"{who}: {msg}" if who else msg, flush=True)


def sayer(who: str) -> Callable[..., None]:
    """`say` with a fixed prefix, for a module that prints many lines as `who`."""
    return functools.partial(say, who=who)


def sh(cmd: Sequence, *, check: bool = True, timeout: float | None = None, what: str = "",
       error: type[Exception] = CommandError, **kw) -> subprocess.CompletedProcess:
    """Run `cmd` (a list; each item str()-ed), stdout and stderr captured as text, and return
    the CompletedProcess. With `check`, an exit status other than 0 raises `error`; a command
    still running after `timeout` s is killed and raises `error` whatever `check` says.
    `what` names the command in the message (default: the command line). Other keywords go
    to subprocess.run (cwd, env, stdin; stderr=subprocess.STDOUT merges the two streams)."""
    cmd = [str(c) for c in cmd]
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    try:
        p = subprocess.run(cmd, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise error(f"{_name(cmd, what)} timed out after {timeout:g} s (a hang?)"
                    f"{_output(e.stdout, e.stderr)}") from None
    if check and p.returncode != 0:
        raise error(f"{_name(cmd, what)} failed (exit {p.returncode})"
                    f"{_output(p.stdout, p.stderr)}")
    return p


def wait_until(cond: Callable[[], T], timeout: float, what: str, *,
               error: type[Exception] = TimeoutError, interval: float = 0.05) -> T:
    """Call `cond` every `interval` s until it returns something true, and return that; after
    `timeout` s raise `error` ("timed out after N s waiting for WHAT")."""
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise error(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def stop_recorder(rec: subprocess.Popen, wait_s: float, *, interrupt_wait_s: float = 30) -> str:
    """Let a recorder (`ivtrace record`/`serve`) finish on its own within `wait_s`; if not,
    SIGINT it (it flushes what was committed) and wait `interrupt_wait_s` more; kill it last.
    Says which of the three happened, for the caller's log."""
    try:
        rec.wait(timeout=wait_s)
        return "stopped by itself (region closed)"
    except subprocess.TimeoutExpired:
        pass
    rec.send_signal(signal.SIGINT)
    try:
        rec.wait(timeout=interrupt_wait_s)
        return "stopped with SIGINT (flushed what was committed)"
    except subprocess.TimeoutExpired:
        rec.kill()
        rec.wait()
        return f"killed (did not stop within {interrupt_wait_s:g} s of SIGINT)"


def _name(cmd: list[str], what: str) -> str:
    line = f"`{shlex.join(cmd)}`"
    return f"{what} ({line})" if what else line


def _output(stdout, stderr) -> str:
    """The end of each stream that printed something, under a `--- stdout` / `--- stderr`
    line (TimeoutExpired hands over bytes, or None for a stream nobody captured)."""
    parts = []
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        if text and text.strip():
            parts.append(f"\n--- {name}\n{text.strip()[-TAIL_CHARS:]}")
    return "".join(parts)
