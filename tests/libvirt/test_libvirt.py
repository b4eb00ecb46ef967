"""A libvirt domain traced through the packaged `ivtrace serve` (docs/install.md, "libvirt").

Real parts: Debian's libvirtd and virtlogd (libvirt-daemon-system), started directly when
none runs (systemd is not PID 1 here) and stopped afterwards; a transient TCG domain with
the demo guest's kernel and ivtrace.ko (the one guest build), whose <shmem> device is the
documented ivshmem-doorbell snippet pointing at the service's socket; and the installed
/usr/bin/ivtrace run as ivtrace.service runs it (tests/deb/system.py: the unit's
credentials and settings, its directories mapped to this test's). QEMU runs as libvirt's
user (libvirt-qemu) and reaches the socket through its group.

Checks: the guest's trace lands in STATE/<domain name>, babeltrace2 reads the guest's
kernel events (a kernel log line written in the guest among them) and the trace names the
domain (CTF env hostname); the service stops cleanly on SIGTERM and removes its sockets.
Needs root and `make deb` (`make test-deb`).
"""
import grp
import os
import pwd
import shutil
import stat
import tempfile
import time
import xml.sax.saxutils
from pathlib import Path

import bt2
import pytest

import ctf
from deb import system
from deb.system import sh
from ivtools import guestbuild

REPO = Path(__file__).resolve().parents[2]
VIRSH = ["virsh", "-c", "qemu:///system"]
TIMEOUT = float(os.environ.get("IVTRACE_VM_TIMEOUT", "300"))

# The snippet docs/install.md documents; SOCKET is the service's /run/ivtrace/qemu.sock.
SHMEM_XML = """\
<shmem name='ivtrace'>
  <model type='ivshmem-doorbell'/>
  <server path='SOCKET'/>
  <msi vectors='2' ioeventfd='on'/>
</shmem>"""

DOMAIN_XML = """\
<domain type='qemu'>
  <name>NAME</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>KERNEL</kernel>
    <initrd>INITRD</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet ivtrace.modules=ivtrace ivtrace.interactive=0</cmdline>
  </os>
  <cpu mode='maximum' check='none'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='file'>
      <source path='CONSOLE'/>
      <target port='0'/>
    </serial>
    SHMEM
    <memballoon model='none'/>
  </devices>
</domain>"""

# The guest's command (/etc/ivtrace/run, run by the guest's /init): a kernel log line at
# level 3 (above `quiet`), a little work, then rmmod so the region is CLOSED and drained.
GUEST_RUN = """#!/bin/sh
echo '<3>MARKER' > /dev/kmsg
for i in 1 2 3 4 5; do ls /proc > /dev/null; sleep 0.2; done
rmmod ivtrace
echo "IVTRACE-LIBVIRT: rmmod rc=$?"
"""


def virsh_ok():
    return sh([*VIRSH, "version"], check=False, timeout=30).returncode == 0


class Libvirt:
    """libvirtd and virtlogd, started here (and stopped afterwards) unless running."""

    def __init__(self, tag):
        self.pidfiles = []
        self.tag = tag

    def start(self):
        if virsh_ok():
            return self
        for daemon in ("virtlogd", "libvirtd"):
            pidfile = Path(f"/run/{daemon}-{self.tag}.pid")
            sh([f"/usr/sbin/{daemon}", "--daemon", "--pid-file", pidfile], timeout=60)
            self.pidfiles.append(pidfile)
        deadline = time.monotonic() + 60
        while not virsh_ok():
            if time.monotonic() > deadline:
                pytest.fail("libvirtd did not answer on qemu:///system within 60 s")
            time.sleep(0.5)
        return self

    def stop(self):
        for pidfile in reversed(self.pidfiles):
            try:
                pid = int(pidfile.read_text())
                os.kill(pid, 15)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.1)
            except (OSError, ValueError):
                pass
            pidfile.unlink(missing_ok=True)


@pytest.fixture
def libvirt():
    lv = Libvirt(f"ivtrace-packaging-{os.getpid()}").start()
    yield lv
    lv.stop()


@pytest.fixture
def guest_files():
    """vmlinuz and an initrd with ivtrace.ko and the run script, in a directory libvirt's
    QEMU user can reach (libvirt chowns the two files to it while the domain runs)."""
    built = guestbuild.build_guest()
    man = built.manifest
    d = Path(tempfile.mkdtemp(prefix=f"ivtrace-packaging-libvirt-{os.getpid()}-", dir="/var/tmp"))
    d.chmod(0o755)
    marker = f"ivtrace-libvirt-marker-{os.getpid()}"
    run = d / "run"
    run.write_text(GUEST_RUN.replace("MARKER", marker))
    run.chmod(0o755)
    overlay = guestbuild.overlay_initramfs(
        [str(built.files["ivtrace.ko"]), f"{run}:/etc/ivtrace/run"], man["kernel_version"])
    base = Path(man["initramfs_base"]).read_bytes()
    base += b"\0" * ((4 - len(base) % 4) % 4)
    (d / "initrd.img").write_bytes(base + overlay)
    shutil.copy(man["vmlinuz"], d / "vmlinuz")
    yield {"dir": d, "kernel": d / "vmlinuz", "initrd": d / "initrd.img",
           "console": d / "console.log", "marker": marker}
    shutil.rmtree(d, ignore_errors=True)


def domain_xml(name, files, socket):
    q = xml.sax.saxutils.escape
    shmem = SHMEM_XML.replace("SOCKET", q(str(socket)))
    return (DOMAIN_XML.replace("NAME", q(name)).replace("KERNEL", q(str(files["kernel"])))
            .replace("INITRD", q(str(files["initrd"])))
            .replace("CONSOLE", q(str(files["console"])))
            .replace("SHMEM", shmem.replace("\n", "\n    ")))


def wait_domain_gone(name, files, timeout):
    """A transient domain disappears when its QEMU exits (the guest powered off)."""
    deadline = time.monotonic() + timeout
    while sh([*VIRSH, "domstate", name], check=False, timeout=30).returncode == 0:
        if time.monotonic() > deadline:
            sh([*VIRSH, "destroy", name], check=False, timeout=60)
            console = files["console"].read_text(errors="replace") if files["console"].exists() else ""
            pytest.fail(f"domain {name} still running after {timeout} s\n{console[-3000:]}")
        time.sleep(1)


def trace_env(path, key):
    """Entry `key` of the CTF trace's environment at `path`, as babeltrace2 reads it."""
    for msg in bt2.TraceCollectionMessageIterator(str(path)):
        if type(msg) is bt2._StreamBeginningMessageConst:
            return str(msg.stream.trace.environment[key])
    pytest.fail(f"babeltrace2 found no stream in {path}")


def test_libvirt_domain_is_traced_through_the_packaged_serve(libvirt, guest_files, unit_dirs,
                                                            tmp_path):
    system.install_packages()
    caps = sh([*VIRSH, "capabilities"]).stdout
    name = f"ivtrace-packaging-{os.getpid()}"
    run, state = unit_dirs["/run/ivtrace"], unit_dirs["/var/lib/ivtrace"]
    socket = run / "qemu.sock"
    unit = system.Unit(unit_dirs, tmp_path / "serve.log").start(ready=run / "ctl.sock")
    xml_file = tmp_path / "domain.xml"
    xml_file.write_text(domain_xml(name, guest_files, socket))
    try:
        sh([*VIRSH, "create", xml_file], timeout=120)
        qemu_user = qemu_process_user(name)
        st = socket.stat()
        during = (st.st_uid, grp.getgrgid(st.st_gid).gr_name, stat.S_IMODE(st.st_mode))
        wait_domain_gone(name, guest_files, TIMEOUT)
    finally:
        sh([*VIRSH, "destroy", name], check=False, timeout=60)
        rc = unit.stop()
    console = guest_files["console"].read_text(errors="replace")
    assert "IVTRACE-LIBVIRT: rmmod rc=0" in console, console[-3000:]
    assert rc == 0, unit.output()
    assert qemu_user == "libvirt-qemu", f"QEMU ran as {qemu_user} (secmodel: {caps[-600:]})"
    assert f"[{name}] connected" in unit.output(), unit.output()
    trace = state / name
    assert trace.is_dir(), f"no {trace}: {sorted(p.name for p in state.iterdir())}\n{unit.output()}"
    events = ctf.events(trace / "kernel")
    assert len(events) > 100, unit.output()
    printk = [str(e.payload.get("msg", "")) for e in events if e.name == "printk_console"]
    assert any(guest_files["marker"] in m for m in printk), f"{len(events)} kernel events"
    # The guest's trace is the domain (hostname); the host's trace is this host's, named
    # after the domain it watched.
    assert trace_env(trace / "kernel", "hostname") == name
    assert trace_env(trace / "host", "trace_name") == f"{name}-host"
    for sock in ("qemu.sock", "ctl.sock"):
        assert not (run / sock).exists(), f"{sock} left behind after SIGTERM"
    # While QEMU ran, the socket was still serve's: root, group libvirt-qemu, 0660 (libvirt
    # did not relabel it, so the service's settings are what gives QEMU access).
    assert during == (0, "libvirt-qemu", 0o660), during


def qemu_process_user(name):
    """The user of the domain's QEMU process (libvirt writes its pid file)."""
    pidfile = Path(f"/run/libvirt/qemu/{name}.pid")
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = int(pidfile.read_text())
    return pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
