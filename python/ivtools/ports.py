"""Free TCP ports on the loopback address, for servers a test or a benchmark starts (QEMU's
migration stream, the guest's SSH forward, lttng-relayd)."""

from __future__ import annotations

import socket


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now (the kernel's choice). Another
    process may take one before the caller binds it: bind soon."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
