#!/usr/bin/python3
"""Host end of the evaluation's network and virtio-serial transports: receive the guest's
ftrace text stream and write it to disk, counting bytes and lines per segment.

    sink.py --dir DIR --tcp-port 0 --unix SOCK [--keep]

* TCP (127.0.0.1, the guest reaches it as 10.0.2.2 through QEMU user networking): every
  connection is one segment; its first line names it (`IVTEVAL config=C rep=R`).
* Unix socket SOCK (QEMU connects to it: `-chardev socket,path=SOCK`, a virtserialport):
  one byte stream; segments are delimited by `IVTEVAL-BEGIN config=C rep=R` and
  `IVTEVAL-END ...` lines written by the guest between its `cat trace_pipe` runs.

Each segment is written to DIR/<config>-r<rep>.<transport>.txt, fsync'd when it ends, then
deleted unless --keep (the figure of interest is the guest's cost, the bytes and lines
are recorded). On start it prints `SINK port=P` on stdout; on SIGTERM/SIGINT it closes
everything and writes DIR/sink.json: {"segments": [{transport, config, rep, bytes, lines,
seconds}], "errors": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

RE_HDR = re.compile(rb"IVTEVAL(?:-BEGIN)? config=(\S+) rep=(\d+)")


class Segment:
    def __init__(self, d: Path, transport: str, config: str, rep: int, keep: bool):
        self.transport, self.config, self.rep, self.keep = transport, config, rep, keep
        self.path = d / f"{config}-r{rep}.{transport}.txt"
        self.f = open(self.path, "wb", buffering=1 << 20)
        self.bytes = self.lines = 0
        self.t0 = time.monotonic()

    def write(self, b: bytes) -> None:
        self.f.write(b)
        self.bytes += len(b)
        self.lines += b.count(b"\n")

    def close(self, out: list) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        if not self.keep:
            self.path.unlink(missing_ok=True)
        out.append({"transport": self.transport, "config": self.config, "rep": self.rep,
                    "bytes": self.bytes, "lines": self.lines,
                    "seconds": round(time.monotonic() - self.t0, 3),
                    "file": str(self.path) if self.keep else None})


class TcpConn:
    """One guest connection: buffer until the header line names it, then stream to disk."""

    def __init__(self, sock, n, sink):
        self.sock, self.n, self.sink = sock, n, sink
        self.head = b""
        self.seg: Segment | None = None

    def data(self, b: bytes) -> None:
        if self.seg is None:
            self.head += b
            if b"\n" not in self.head and len(self.head) < 4096:
                return
            line, _, rest = self.head.partition(b"\n")
            m = RE_HDR.match(line)
            cfg, rep = (m.group(1).decode(), int(m.group(2))) if m else (f"tcp{self.n}", 0)
            if not m:
                self.sink.errors.append(f"tcp connection {self.n}: no IVTEVAL header line")
                rest = self.head
            self.seg = Segment(self.sink.dir, "tcp", cfg, rep, self.sink.keep)
            self.head = b""
            b = rest
        if b:
            self.seg.write(b)

    def close(self) -> None:
        if self.seg is None and self.head:
            self.data(b"\n")  # header-less short stream
        if self.seg is not None:
            self.seg.close(self.sink.segments)
        self.sink.sel.unregister(self.sock)
        self.sock.close()


class SerialStream:
    """The virtio-serial byte stream: split at IVTEVAL-BEGIN / IVTEVAL-END lines."""

    def __init__(self, sock, sink):
        self.sock, self.sink = sock, sink
        self.pending = b""
        self.seg: Segment | None = None
        self.outside = 0  # bytes seen outside any segment

    def data(self, b: bytes) -> None:
        buf = self.pending + b
        self.pending = b""
        while buf:
            i = buf.find(b"IVTEVAL-")
            if i < 0:
                # keep a tail that might be the start of a marker
                keep = min(len(buf), 8)
                self._emit(buf[:-keep] if keep < len(buf) else b"")
                self.pending = buf[-keep:] if keep < len(buf) else buf
                return
            self._emit(buf[:i])
            j = buf.find(b"\n", i)
            if j < 0:
                self.pending = buf[i:]
                return
            line = buf[i:j]
            buf = buf[j + 1:]
            if line.startswith(b"IVTEVAL-BEGIN"):
                if self.seg:
                    self.seg.close(self.sink.segments)
                m = RE_HDR.match(line)
                cfg, rep = (m.group(1).decode(), int(m.group(2))) if m else ("vserial?", 0)
                self.seg = Segment(self.sink.dir, "vserial", cfg, rep, self.sink.keep)
            elif line.startswith(b"IVTEVAL-END"):
                if self.seg:
                    self.seg.close(self.sink.segments)
                self.seg = None

    def _emit(self, b: bytes) -> None:
        if not b:
            return
        if self.seg is not None:
            self.seg.write(b)
        else:
            self.outside += len(b)

    def close(self) -> None:
        self._emit(self.pending)
        if self.seg is not None:
            self.seg.close(self.sink.segments)
            self.seg = None
        self.sink.sel.unregister(self.sock)
        self.sock.close()


class Sink:
    def __init__(self, d: Path, keep: bool):
        self.dir, self.keep = d, keep
        self.sel = selectors.DefaultSelector()
        self.segments: list = []
        self.errors: list = []
        self.conns = 0
        self.serial: SerialStream | None = None
        self.stop = False

    def run(self, tcp_port: int, unix_path: str | None) -> None:
        tl = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tl.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tl.bind(("127.0.0.1", tcp_port))
        tl.listen(8)
        self.sel.register(tl, selectors.EVENT_READ, ("tcp-listen", None))
        ul = None
        if unix_path:
            Path(unix_path).unlink(missing_ok=True)
            ul = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            ul.bind(unix_path)
            ul.listen(1)
            self.sel.register(ul, selectors.EVENT_READ, ("unix-listen", None))
        print(f"SINK port={tl.getsockname()[1]}", flush=True)
        while not self.stop:
            for key, _ in self.sel.select(timeout=0.5):
                kind, obj = key.data
                if kind == "tcp-listen":
                    s, _ = tl.accept()
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
                    self.conns += 1
                    self.sel.register(s, selectors.EVENT_READ, ("conn", TcpConn(s, self.conns, self)))
                elif kind == "unix-listen":
                    s, _ = ul.accept()
                    if self.serial is not None:
                        self.errors.append("a second virtio-serial connection (ignored)")
                        s.close()
                        continue
                    self.serial = SerialStream(s, self)
                    self.sel.register(s, selectors.EVENT_READ, ("conn", self.serial))
                else:
                    try:
                        b = key.fileobj.recv(1 << 20)
                    except OSError as e:
                        self.errors.append(f"recv: {e}")
                        b = b""
                    if b:
                        obj.data(b)
                    else:
                        obj.close()
        for key in list(self.sel.get_map().values()):
            kind, obj = key.data
            if kind == "conn":
                obj.close()
        tl.close()
        if ul:
            ul.close()
            Path(unix_path).unlink(missing_ok=True)
        out = {"segments": self.segments, "errors": self.errors, "tcp_connections": self.conns,
               "serial_bytes_outside_segments": self.serial.outside if self.serial else 0}
        (self.dir / "sink.json").write_text(json.dumps(out, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--tcp-port", type=int, default=0)
    ap.add_argument("--unix")
    ap.add_argument("--keep", action="store_true", help="keep the received trace files")
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    sink = Sink(d, a.keep)

    def stop(*_):
        sink.stop = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sink.run(a.tcp_port, a.unix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
