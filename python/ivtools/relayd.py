"""A real lttng-relayd on free ports of 127.0.0.1, its traces in `out` and its home (health
sockets, log) in a private directory, so it never meets another run's relay. One definition
for the relay preset (bench/harness/relay.py) and the relay tests (tests/relay)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .ports import free_ports


class RelaydError(Exception):
    """lttng-relayd did not start, or left no single directory for a session."""


class Relayd:
    """lttng-relayd on three free ports (control, data, live); `url` is what `--relayd`
    takes, `live_url` what a live viewer connects to. Started at once."""

    def __init__(self, out: Path, home: Path):
        self.out, self.home = Path(out), Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.control, self.data, self.live = free_ports(3)
        self.url = f"net://127.0.0.1:{self.control}:{self.data}"
        self.live_url = f"net://127.0.0.1:{self.live}"
        self.log = self.home / "relayd.log"
        self.proc = None
        self.start()

    def start(self):
        """Starts it (again, after `kill`, on the same ports) and waits until its control
        port accepts connections (15 s at most)."""
        env = dict(os.environ, LTTNG_HOME=str(self.home))
        cmd = ["lttng-relayd", "-C", f"tcp://127.0.0.1:{self.control}",
               "-D", f"tcp://127.0.0.1:{self.data}", "-L", f"tcp://127.0.0.1:{self.live}",
               "-o", str(self.out)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.control), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RelaydError(f"lttng-relayd did not start:\n{self.log.read_text()}") from None
                time.sleep(0.05)

    def kill(self):
        """SIGKILL: the relay vanishes mid-stream."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def pause(self):
        """SIGSTOP: the relay stalls (its sockets stay open, nothing is read)."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def session_dir(self, host: str, session: str) -> Path:
        """The relay's directory of `session` of `host` (HOST/SESSION-DATE)."""
        found = sorted((self.out / host).glob(f"{session}-*"))
        if len(found) != 1:
            raise RelaydError(f"{host}/{session}: expected one session directory, found {found}")
        return found[0]
