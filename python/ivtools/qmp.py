"""A minimal QMP client (QEMU's JSON monitor on a Unix socket): enough to migrate a guest,
hot-plug vCPUs and ask where a hung guest's vCPUs are (ivtvm.vcpu_state). One command at a
time; asynchronous events are skipped."""
import json
import socket
import time


class QMPError(RuntimeError):
    pass


class QMP:
    def __init__(self, path, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(str(path))
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.sock.settimeout(timeout)
        self.file = self.sock.makefile("rwb")
        try:
            self._read()  # the greeting
            self.cmd("qmp_capabilities")
        except BaseException:
            self.close()  # a QEMU that exits as we connect: no descriptor left behind
            raise

    def _read(self):
        line = self.file.readline()
        if not line:
            raise QMPError("QEMU closed the QMP connection")
        return json.loads(line)

    def cmd(self, name, **args):
        msg = {"execute": name}
        if args:
            msg["arguments"] = args
        self.file.write(json.dumps(msg).encode() + b"\n")
        self.file.flush()
        while True:
            r = self._read()
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise QMPError(f"{name}: {r['error'].get('desc', r['error'])}")
            # an event ({"event": ...}): not the answer

    def close(self):
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass
