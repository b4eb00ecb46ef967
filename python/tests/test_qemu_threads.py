"""ivtools.qemu_threads against a real process whose threads carry QEMU's vCPU thread names
(`CPU n/TCG`, as `-name NAME,debug-threads=on` gives them). The same functions against a
real QEMU: tests/vmview (the VM view scenario) and the guest and evaluation benchmarks."""

import json
import os
import subprocess
import sys

import pytest

from ivtools import qemu_threads as qt

# Three threads named like QEMU's (two vCPUs, one worker), the first one busy; prints
# {name: tid} and lives until its stdin closes.
CHILD = r"""
import json, sys, threading, time
tids = {}
def thread(name, busy):
    tids[name] = threading.get_native_id()
    with open(f"/proc/self/task/{tids[name]}/comm", "w") as f:
        f.write(name)
    end = time.monotonic() + 0.2
    while busy and time.monotonic() < end:
        pass
    threading.Event().wait()
for name, busy in (("CPU 0/TCG", True), ("CPU 1/TCG", False), ("worker", False)):
    threading.Thread(target=thread, args=(name, busy), daemon=True).start()
while len(tids) < 3:
    time.sleep(0.01)
time.sleep(0.3)
print(json.dumps(tids), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def fake_qemu():
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        yield p.pid, json.loads(p.stdout.readline())
    finally:
        p.stdin.close()
        p.wait(timeout=10)


def test_vcpu_threads_are_told_apart_by_name(fake_qemu):
    pid, tids = fake_qemu
    assert qt.vcpu_threads(pid) == {0: tids["CPU 0/TCG"], 1: tids["CPU 1/TCG"]}
    names = qt.threads(pid)
    assert names[tids["worker"]] == "worker" and pid in names
    assert [qt.vcpu_index(n) for n in ("CPU 12/KVM", "CPU 0/TCG", "qemu-system-x86", "CPUs")] \
        == [12, 0, None, None]


def test_schedstat_splits_vcpu_time_from_the_rest(fake_qemu):
    pid, tids = fake_qemu
    run0, wait0 = qt.schedstat(pid, tids["CPU 0/TCG"])
    assert run0 > 0, "the busy vCPU thread ran"
    vrun, vwait, other = qt.vcpu_sched(pid)
    assert vrun >= run0 and vwait >= wait0
    assert qt.cpu_ns(pid) >= vrun + other - 1e6 and other > 0


def test_pinning_one_vcpu_alone(fake_qemu):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"pinning needs two CPUs; this process may run on {cpus}")
    pid, tids = fake_qemu
    done = qt.pin_qemu(pid, cpus[-1], cpus[0], vcpus={0})
    assert done["vcpu"] == ["CPU 0/TCG"] and "CPU 1/TCG" in done["other"]
    assert os.sched_getaffinity(tids["CPU 0/TCG"]) == {cpus[-1]}
    for name in ("CPU 1/TCG", "worker"):
        assert os.sched_getaffinity(tids[name]) == {cpus[0]}
    everything = qt.pin_qemu(pid, cpus[0], cpus[-1])
    assert sorted(everything["vcpu"]) == ["CPU 0/TCG", "CPU 1/TCG"]


def test_a_vcpu_qemu_does_not_have_is_an_error(fake_qemu):
    pid, _ = fake_qemu
    cpu = min(os.sched_getaffinity(0))
    with pytest.raises(RuntimeError, match=r"no thread for vCPU \[7\].*debug-threads=on"):
        qt.pin_qemu(pid, cpu, cpu, vcpus={7})


def test_a_process_that_ended_has_no_threads_and_no_time():
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True, check=True)
    pid = int(p.stdout)
    assert qt.threads(pid) == {} and qt.cpu_ns(pid) == 0 and qt.vcpu_sched(pid) == (0, 0, 0)
    with pytest.raises(OSError):
        qt.schedstat(pid)
