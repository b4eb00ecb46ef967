"""vm/: boot the demo guest under QEMU (auto accelerator: TCG on these machines).

Three boots (~5-10 s each under TCG):
  1. ivshmem-plain: the guest finds 1af4:1110 in sysfs, reads a word the host put in the
     region and writes a known word into BAR2 with busybox devmem; the host sees it in
     /dev/shm. The same boot checks --add (overlay archive), modules= and modopts=.
  2. a guest kernel panic (sysrq c) is reported as panicked and QEMU exits by itself.
  3. ivshmem-doorbell against bench/doorbell's raw server (the product's is `ivtrace serve`,
     tested in tests/serve): the options realize the device, IVPosition is the ID the server
     sent and a guest doorbell write reaches the host's eventfd. Uses the VM context API
     (start / wait_for / wait).
Plus quick checks that need no boot.
"""
import json
import os
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ivtools import ivtvm
from ivtools.proc import wait_until

REPO = Path(__file__).resolve().parents[2]

TIMEOUT = float(os.environ.get("IVTRACE_VM_TIMEOUT", "180"))
SHM_SIZE = 1 << 20
HOST_WORD = 0x600DF00D   # host -> guest, at offset 0x40
GUEST_WORD = 0xC0FFEE42  # guest -> host, at offset 0x100 and at the last word


@pytest.fixture(scope="module")
def kernel():
    """The guest kernel and initramfs only (vm/out; these boots need none of the guest's
    software, so they do not depend on the module building)."""
    return ivtvm.ensure_built()


@pytest.fixture
def shm(tmp_path):
    p = Path(f"/dev/shm/ivt-test-{os.getpid()}-{time.monotonic_ns()}")
    yield p
    p.unlink(missing_ok=True)


GUEST_SCRIPT = r"""#!/bin/sh
dev=
for d in /sys/bus/pci/devices/*; do
    if [ "$(cat $d/vendor)" = 0x1af4 ] && [ "$(cat $d/device)" = 0x1110 ]; then dev=$d; fi
done
[ -n "$dev" ] || { echo "no ivshmem device (1af4:1110)"; exit 10; }
echo "IVSHMEM-DEV $dev"
set -- $(sed -n 3p $dev/resource)
start=$1; end=$2
size=$((end - start + 1))
echo "BAR2 start=$start size=$size"
echo "HOSTWORD $(devmem $((start + 0x40)) 32)"
devmem $((start + 0x100)) 32 0xC0FFEE42 || exit 11
devmem $((start + size - 4)) 32 0xC0FFEE42 || exit 12
echo "READBACK $(devmem $((start + 0x100)) 32)"
p=/sys/module/virtio_net/parameters
echo "NAPI_TX $(cat $p/napi_tx) CSUM $(cat $p/csum)"
echo "ENV $IVTRACE_IVSHMEM"
exit 0
"""


def test_ivshmem_bar2_write_reaches_host(kernel, shm, tmp_path):
    script = tmp_path / "probe.sh"
    script.write_text(GUEST_SCRIPT)
    script.chmod(0o755)
    # Host writes a word first (the region must be shared both ways).
    ivtvm.prepare_shm(shm, SHM_SIZE, clear=True)
    with open(shm, "r+b") as f:
        f.seek(0x40)
        f.write(struct.pack("<I", HOST_WORD))

    r = ivtvm.boot(run="/workload/probe.sh", shm=shm, shm_size=SHM_SIZE,
                   add=[f"{script}:/workload/probe.sh"],
                   modules=["virtio_net"], modopts={"virtio_net": "napi_tx=1 csum=0"},
                   timeout=TIMEOUT, log=tmp_path / "console.log")
    print(r.summary(), f"boot to /init {r.boot_time:.1f} s")
    print(r.tail(30))
    assert r.accel == ivtvm.probe_accel("auto")[0]
    assert not r.timed_out, r.explain()
    assert r.booted and r.powered_off, r.explain()
    assert r.exit_code == 0, r.explain()
    assert not r.panicked and not r.module_errors and not r.kernel_problems, r.summary()
    text = r.console_text
    assert "IVSHMEM-DEV /sys/bus/pci/devices/" in text
    assert "BAR2 start=" in text and f"size={SHM_SIZE}" in text, r.explain()
    assert f"HOSTWORD 0x{HOST_WORD:08X}" in text, r.explain()
    assert f"READBACK 0x{GUEST_WORD:08X}" in text, r.explain()
    # The last lines of the command must not be lost (serial tty hang-up trap, vm/README.md).
    assert "NAPI_TX Y CSUM N" in text, r.explain()          # modopts reached the module
    assert "IVTRACE-GUEST: module-loaded virtio_net napi_tx=1 csum=0" in text
    assert "ENV /sys/bus/pci/devices/" in text
    # The host sees the guest's writes in the backing file (share=on).
    data = shm.read_bytes()
    assert len(data) == SHM_SIZE
    assert struct.unpack_from("<I", data, 0x100)[0] == GUEST_WORD
    assert struct.unpack_from("<I", data, SHM_SIZE - 4)[0] == GUEST_WORD
    assert struct.unpack_from("<I", data, 0x40)[0] == HOST_WORD


def test_guest_panic_is_detected_and_qemu_exits(kernel, tmp_path):
    t0 = time.monotonic()
    r = ivtvm.boot(run="echo c > /proc/sysrq-trigger; sleep 30; echo survived", timeout=TIMEOUT)
    print(r.summary())
    assert r.panicked, r.explain()
    assert not r.timed_out, r.explain()
    assert r.qemu_returncode is not None           # QEMU exited on its own (-no-reboot)
    assert r.exit_code is None and "survived" not in r.console_text
    assert "sysrq" in r.panic_message.lower() or "sysrq" in r.console_text.lower()
    assert r.process_rc == ivtvm.RC_PANIC
    assert time.monotonic() - t0 < TIMEOUT
    assert not ivtvm._LIVE                          # nothing left running


STALL_LINE = "watchdog: BUG: soft lockup - CPU#1 stuck for 23s! [stalltest:1]"
STALL_SCRIPT = f"""echo '<0>{STALL_LINE}' > /dev/kmsg
sleep 4
echo "STALLTEST: after"
sleep 4
"""


def single_step(vm) -> bool:
    """QEMU's own word on whether its vCPUs run one instruction per translated block."""
    return "single step" in ivtvm.qmp_hmp(vm.qmp_path, "info status")


def test_a_stalled_mttcg_guest_is_released_and_says_so(kernel, tmp_path):
    """The MTTCG stall watch (docs/kvm.md): on the kernel's soft-lockup line, ivtvm turns
    QEMU's single-step mode on, waits for the guest's userspace to print, turns it off and
    records an environment fault that the result, its summary and a warning carry.

    Only the detection and the release are deterministic here: the line is the kernel's
    own, printed through its console, but written by the guest's /dev/kmsg rather than by a
    real stale-translation lockup (which comes about once in tens of rmmod rounds)."""
    with pytest.warns(ivtvm.EnvironmentFaultWarning, match="MTTCG stale translation"):
        with ivtvm.VM(STALL_SCRIPT, tcg_thread="multi", log=str(tmp_path / "console.log")) as vm:
            vm.wait_for("soft lockup", timeout=TIMEOUT)
            wait_until(lambda: single_step(vm), 10, "QEMU in single-step mode", interval=0.2)
            vm.wait_for("^STALLTEST: after", timeout=60)
            wait_until(lambda: not single_step(vm), 10, "QEMU out of single-step mode",
                       interval=0.2)
            r = vm.wait(timeout=TIMEOUT)
    print(r.summary())
    assert r.ok, r.explain()
    assert r.tcg_thread == "multi" and len(r.env_faults) == 1, r.env_faults
    assert r.env_faults[0].startswith("environment fault: QEMU MTTCG stale translation"), \
        r.env_faults
    assert STALL_LINE in r.env_faults[0] and r.env_faults[0] in r.summary()
    assert r.env_faults[0] in r.explain()


class RawServer:
    """bench/doorbell/dbserver, the project's one raw ivshmem server (the product's is
    `ivtrace serve`, which would take the doorbells for itself), for one QEMU: version 0, the
    guest's id, -1 + shm fd, then host-peer and own-id eventfds. On QEMU's exit it prints the
    doorbells it counted per vector."""

    GUEST_ID, VECTORS = 3, 2  # not 0: IVPosition reads 0 before any server sent an id

    def __init__(self, binary, path):
        self.path = str(path)
        self.proc = subprocess.Popen([str(binary), self.path, str(SHM_SIZE), str(self.GUEST_ID)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while not Path(self.path).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail(f"dbserver did not start: {self.proc.stderr.read()}")
            time.sleep(0.02)

    def doorbells_per_vector(self):
        """After QEMU exited: the count of every vector, from dbserver's JSON line."""
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])["doorbells_per_vector"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        Path(self.path).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def dbserver():
    """Build bench/doorbell's host side (dbserver) and return its path."""
    p = subprocess.run(["make", "-C", str(REPO / "bench" / "doorbell"), "host"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"make -C bench/doorbell host failed:\n{p.stdout}\n{p.stderr}"
    return REPO / "build" / "bench" / "doorbell" / "dbserver"


DOORBELL_SCRIPT = r"""
d=$IVTRACE_IVSHMEM
[ -n "$d" ] || exit 10
bar0=$(sed -n 1p $d/resource | cut -d' ' -f1)
echo "IVPOS $(devmem $((bar0 + 8)) 32)"
echo "RING"
devmem $((bar0 + 12)) 32 $(( (1 << 16) | 1 ))
devmem $((bar0 + 12)) 32 $(( (1 << 16) | 1 ))
sleep 1
"""


def test_ivshmem_doorbell_reaches_host(kernel, dbserver):
    sockdir = Path(tempfile.mkdtemp(prefix="ivt-sock-"))  # short path: sun_path is 108 bytes
    srv = RawServer(dbserver, sockdir / "ivsh.sock")
    try:
        with ivtvm.VM(run=DOORBELL_SCRIPT, doorbell=srv.path, vectors=srv.VECTORS) as vm:
            vm.wait_for(r"^RING$", timeout=TIMEOUT)
            r = vm.wait(timeout=TIMEOUT)
        print(r.summary())
        assert r.exit_code == 0 and not r.panicked, r.explain()
        assert f"IVPOS 0x{srv.GUEST_ID:08X}" in r.console_text, r.explain()
        assert "ivshmem-doorbell,chardev=ivsh,vectors=2" in " ".join(r.cmd)
        assert srv.doorbells_per_vector() == [0, 2]
    finally:
        srv.close()
        sockdir.rmdir()


def test_missing_doorbell_socket_is_a_clear_error(tmp_path):
    with pytest.raises(ivtvm.VMError, match="ivtrace serve"):
        ivtvm.VM(doorbell=tmp_path / "nosock", build=False).build_command()


# ---------------------------------------------------------------- no boot needed

def test_accel_probe_picks_tcg_without_vmx_svm(monkeypatch):
    monkeypatch.delenv("IVTRACE_ACCEL", raising=False)
    accel, why = ivtvm.probe_accel("auto")
    has_hw = bool(ivtvm.cpu_flags() & {"vmx", "svm"})
    if not has_hw:
        assert accel == "tcg", why
    assert why
    assert ivtvm.probe_accel("tcg")[0] == "tcg"
    assert ivtvm.probe_accel("kvm")[0] == "kvm"
    monkeypatch.setattr(ivtvm, "cpu_flags", lambda: {"fpu", "sse2"})
    assert ivtvm.probe_accel("auto")[0] == "tcg"


def test_options_are_validated(tmp_path):
    assert ivtvm.parse_size("16M") == 16 << 20
    assert ivtvm.parse_size(4096) == 4096
    with pytest.raises(ivtvm.VMError):
        ivtvm.prepare_shm(tmp_path / "x", 3 << 20)      # not a power of two: QEMU would abort
    assert ivtvm.cmdline_param("ivtrace.run", "/workload/demo.sh") == "ivtrace.run=/workload/demo.sh"
    assert ivtvm.cmdline_param("ivtrace.modopts", "a:b c") == 'ivtrace.modopts="a:b c"'
    with pytest.raises(ivtvm.VMError):
        ivtvm.cmdline_param("ivtrace.run", 'echo "x"')
    assert ivtvm.qemu_escape("/a,b") == "/a,,b"
