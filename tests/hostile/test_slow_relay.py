"""A slow relay costs only the relay copy (issue 23, case 4).

The relay here is a real lttng-relayd behind a proxy that delivers each of its answers 1.5 s
late. Closing a guest's relay session waits for the relay to take the session's last packets
(up to CLOSE_GRACE + 2 s = 7 s). On main that wait ran on a drain worker: with one drain thread,
another guest busy at the same moment was not drained for those seconds and its ring
overflowed (losses it has none of with a prompt relay). Now the worker starts the close and
gives its turns to other guests until the relay took the packets or the close gave up; the
busy guest loses nothing locally, and every event its relay copy could not take is counted.
"""
import socket
import threading
import time
from collections import deque

from hostile.helpers import need_tools
from relay import relay as r
from serve import serve as s

BUSY_EVENTS, BUSY_RATE = 150_000, 10_000       # per thread, 2 threads: 15 s
SHORT_EVENTS, SHORT_RATE = 10_000, 1_500       # per thread: 7 s (its relay session connects)


LATE_S = 1.5


def pump(src, dst, delay):
    """Copies src to dst, each chunk `delay` seconds after it arrived (order kept)."""
    due, cv = deque(), threading.Condition()

    def read():
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with cv:
                due.append((time.monotonic() + delay, data))
                cv.notify()
            if not data:
                return

    threading.Thread(target=read, daemon=True).start()
    while True:
        with cv:
            while not due:
                cv.wait()
            at, data = due.popleft()
        time.sleep(max(0.0, at - time.monotonic()))
        try:
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)
        except OSError:
            return


class LateProxy:
    """Listens on a free port of 127.0.0.1 and connects each client to `port`; what the
    upstream answers reaches the client `LATE_S` late."""

    def __init__(self, port):
        self.up = port
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.up))
            threading.Thread(target=pump, args=(c, u, 0.0), daemon=True).start()
            threading.Thread(target=pump, args=(u, c, LATE_S), daemon=True).start()

    def close(self):
        self.lsock.close()


def events(summary):
    return sum(c["events"] for c in summary["channels"])


def lost(summary):
    return sum(sum(c["lost"].values()) for c in summary["channels"])


def test_a_stalled_relay_does_not_stall_the_other_guests(tmp_path):
    need_tools()
    relay = r.Relayd(tmp_path / "relay", tmp_path / "relayd-home")
    control, data = LateProxy(relay.control), LateProxy(relay.data)
    url = f"net://127.0.0.1:{control.port}:{data.port}"
    # 2 MiB regions: about 2 s of the busy guest's events, drained in time by one prompt
    # drain thread, overflowing within the seconds a worker waited for the relay on main.
    srv = s.Server(tmp_path / "out", "--drain-threads", "1", "--relayd", url,
                   "--relay-buffer", "1M", "--size", "2M")
    try:
        busy = r.SimGuest(srv.sock, BUSY_EVENTS, 2, BUSY_RATE)
        time.sleep(1.0)
        short = r.SimGuest(srv.sock, SHORT_EVENTS, 2, SHORT_RATE)
        short.wait()
        busy.wait()
        time.sleep(1)
        rc, sums = srv.stop()
    finally:
        srv.cleanup()
        control.close()
        data.close()
        relay.stop()
    assert rc == 0
    by_size = sorted((v[-1] for v in sums.values()), key=lambda d: events(d) + lost(d))
    short_sum, busy_sum = by_size
    assert events(short_sum) + lost(short_sum) == 2 * SHORT_EVENTS
    assert events(busy_sum) + lost(busy_sum) == 2 * BUSY_EVENTS
    relay_lost = sum(st.get("events_dropped", 0) + st.get("events_lost", 0)
                     for st in (busy_sum.get("relay") or {}).get("streams", []))
    print(f"\nbusy guest: {events(busy_sum)} recorded, {lost(busy_sum)} lost locally, "
          f"{relay_lost} lost on the stalled relay copy (counted); short guest: "
          f"{events(short_sum)} recorded, its relay close: "
          f"{(short_sum.get('relay') or {}).get('completed')}")
    assert lost(busy_sum) == 0, "the stalled relay cost the busy guest local events"
