"""A control-socket slowloris cannot take serve's control slots for good (issue 23, case 8).

serve answers at most 8 control connections at once. On main, a request had a 5 s timeout
per read, not per request: 8 clients that each trickle a byte every 3 s held all 8 slots as
long as they kept trickling, and no `ctl list` was answered. Now the whole request line has
one deadline (5 s): the tricklers are answered with an error when it passes, and `ctl list`
gets through.
"""
import socket
import threading
import time

from hostile.helpers import Server, need_tools

TRICKLERS = 8          # serve's control slots (MAX_CONTROLS)
TRICKLE_FOR_S = 40     # how long each keeps trickling, a byte every 3 s


def trickle(path, stop, replies):
    """One client: `{"op":"list"` a byte at a time, every 3 s, never a newline; it ends at
    serve's reply (or when serve closes on it)."""
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(str(path))
    c.settimeout(1.0)
    end = time.monotonic() + TRICKLE_FOR_S
    try:
        for b in b'{"op":"list"' * 4:
            if stop.is_set() or time.monotonic() > end:
                break
            try:
                got = c.recv(4096)
                if got:
                    replies.append(got)
                break                           # a reply, or serve closed
            except TimeoutError:
                pass
            try:
                c.sendall(bytes([b]))
            except OSError:
                pass                            # closed: the reply is read above
            stop.wait(2.0)
    finally:
        c.close()


def test_trickling_clients_do_not_starve_the_control_socket(tmp_path):
    need_tools()
    srv = Server(tmp_path / "traces")
    stop = threading.Event()
    replies = []
    try:
        srv.ctl("list")                         # serve is up and answering
        ctl_path = f"{srv.sock}.ctl"
        threads = [threading.Thread(target=trickle, args=(ctl_path, stop, replies))
                   for _ in range(TRICKLERS)]
        for t in threads:
            t.start()
        time.sleep(1.0)                         # every slot is taken
        t0 = time.monotonic()
        answered = None
        while time.monotonic() - t0 < 25:
            rc, v = srv.ctl("list", check=False)
            if rc == 0:
                answered = time.monotonic() - t0
                break
            time.sleep(0.5)
        assert answered is not None, (
            f"no `ctl list` answered in 25 s while {TRICKLERS} clients trickled:\n{srv.stderr()}")
        for t in threads:                       # each ends at its reply
            t.join(timeout=TRICKLE_FOR_S)
        print(f"\nctl list answered after {answered:.1f} s with {TRICKLERS} tricklers; "
              f"{len(replies)} tricklers got a reply")
        assert len(replies) == TRICKLERS
        assert all(b"no whole request line" in r for r in replies), replies
    finally:
        stop.set()
        srv.cleanup()
