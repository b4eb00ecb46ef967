"""An ivshmem client that is not QEMU, for `ivtrace serve`'s tests and the soak benchmark:
it connects to the server's socket and reads the handshake QEMU reads (protocol version,
peer id, then -1 with the shared memory's descriptor, then the peers' eventfds;
docs/ivshmem.md), keeping the descriptors, and can then send anything or hang up."""

import array
import os
import socket
import struct


class FakeClient:
    """An ivshmem client that is not QEMU: reads the handshake (keeping the descriptors)."""

    def __init__(self, path, read_handshake=True, vectors=2, timeout=30.0):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A server that stops answering fails the caller (TimeoutError) instead of hanging it.
        self.s.settimeout(timeout)
        self.s.connect(str(path))
        self.msgs = []
        self.fds = []
        if read_handshake:
            for _ in range(3 + 2 * vectors):
                data, anc, _, _ = self.s.recvmsg(8, socket.CMSG_SPACE(4))
                fds = array.array("i")
                for level, kind, d in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(d[:len(d) - len(d) % 4])
                self.fds += list(fds)
                self.msgs.append((struct.unpack("<q", data)[0], len(fds)))

    def send(self, data):
        self.s.sendall(data)

    def close(self):
        self.s.close()
        for fd in self.fds:
            os.close(fd)
        self.fds = []
