"""Host events mount tracefs when it is missing (a fresh machine without systemd, a
container), as trace-cmd does, instead of failing: tests/serve/test_serve_faults.py failed on
such a machine. The test unmounts tracefs (and debugfs, whose tracing/ would automount it) in a
private mount namespace of its own, so nothing else on the machine notices.
"""
import subprocess

from hostile.helpers import IVTRACE, loadgen, need_tools, sidecar

SCRIPT = """
umount -l /sys/kernel/tracing 2>/dev/null
umount -l /sys/kernel/debug 2>/dev/null
if [ -e /sys/kernel/tracing/events/header_page ]; then echo "tracefs still mounted"; exit 99; fi
exec "$@"
"""


def test_host_events_mount_tracefs_when_it_is_missing(shm, tmp_path):
    need_tools()
    loadgen(shm, "--events", 10_000, "--threads", 1, "--size", 16, "--no-close")
    qemu = subprocess.Popen(["sleep", "60"])   # stands in for the QEMU whose threads we trace
    out = tmp_path / "t"
    try:
        p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", SCRIPT,
                            "sh", str(IVTRACE), "record", "--shm", str(shm), "-o", str(out),
                            "--host-events", "--qemu-pid", str(qemu.pid), "--duration", "1"],
                           capture_output=True, text=True, timeout=60)
    finally:
        qemu.kill()
        qemu.wait()
    print(p.stderr)
    assert p.returncode == 0, p.stderr
    assert (out / "host" / "metadata").exists()
    assert "host events:" in p.stderr
    assert sidecar(out)["state"] == "finalized"
