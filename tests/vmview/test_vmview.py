"""The VM view on a real guest (issue 12's acceptance): one TCG boot under `ivtrace serve
--host-events` (python/ivtools/vmview_demo.py's scenario, what `make demo-vmview` shows).

The guest spins `vmspin` on its CPU 0; on the host vCPU 0's thread is pinned alone to one CPU,
then a hog (`vmview-hog`) is pinned to that CPU for a known time. Each phase (quiet, hog) is
measured by the kernel's scheduler statistics of the vCPU thread (schedstat's run-queue wait)
and by the VM view ivtrace derived (DIR/vm, read with babeltrace2's Python bindings). Then the
VM view is checked against the guest's own events, merged by babeltrace2: no guest event of
CPU 0 inside a preempted interval of vCPU 0 (the vCPU ran no guest code then), and each
interval's guest thread is the one the guest's last context switch on CPU 0 put there.

Real parts only: QEMU (TCG here), the Debian guest kernel with ivtrace.ko, bin/ivtrace serve
reading the host's tracefs, babeltrace2's bindings. The machine is shared: the quiet phase's
"near zero" is asserted only when nothing else ran on vCPU 0's host CPU during the phase
(/proc/stat's busy time of that CPU less the vCPU's own run time); the agreement with
schedstat is asserted always.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from common import wait_for
from ivtools import vmview_demo as vmview

REPO = Path(__file__).resolve().parents[2]

QUIET_S, HOG_S = 3.0, 4.0
TOLERANCE = 0.05  # the bound: preempted time within 5 % of schedstat's wait


@pytest.fixture(scope="module")
def scenario(guest, tmp_path_factory):
    if not vmview.IVTRACE.exists():
        pytest.fail(f"{vmview.IVTRACE} missing (run `make` at the top)")
    pytest.importorskip("bt2", reason="python3-bt2 (babeltrace2's bindings) is not installed")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the scenario pins vCPU 0 and the rest of QEMU to two different host CPUs")
    out = tmp_path_factory.mktemp("vmview")
    phases = [vmview.Phase("quiet", QUIET_S, False), vmview.Phase("hog", HOG_S, True)]
    try:
        r = vmview.run(out, guest.add("ivtrace.ko", "ivtwl"), phases)
        iv = vmview.vm_intervals(r.out)
    except Exception as e:  # one readable failure (with what serve and the guest said)
        pytest.fail(f"the scenario failed: {type(e).__name__}: {e}\n{tails(out)}")
    for p in r.phases:
        print(f"\n{p.name}: schedstat wait {p.schedstat_wait_ns / 1e6:.1f} ms, ivtrace preempted "
              f"{vmview.preempted_ns(iv, 0, p.start_ns, p.end_ns) / 1e6:.1f} ms (untraced at most "
              f"{vmview.preempted_ns(iv, 0, p.start_ns, p.end_ns, 'runnable_untraced') / 1e6:.1f}"
              f" ms), hog on CPU {p.hog_cpu_ns / 1e6:.1f} ms, others on the CPU "
              f"{p.others_ns / 1e6:.0f} ms; load {r.loadavg:.2f}")
    return r, iv


def tails(out, lines=25):
    """The last lines of serve's log and the guest's console in `out`."""
    parts = []
    for name in ("serve.log", "console.log"):
        f = out / name
        text = f.read_text(errors="replace").splitlines()[-lines:] if f.exists() else ["(none)"]
        parts.append(f"--- {name} (last {lines} lines)\n" + "\n".join(text))
    return "\n".join(parts)


def vm_view_section(r):
    return r.serve_summary["serve"]["vm_view"]


def test_the_recording_is_clean(scenario):
    r, iv = scenario
    assert r.boot.exit_code == 0 and not r.boot.panicked, r.boot.explain()
    s = r.serve_summary["serve"]
    assert s["host_event_stats"]["missed"] == 0, s["host_event_stats"]
    assert s["host_event_stats"]["vcpu_names"], "QEMU names its vCPU threads (debug-threads=on)"
    v = vm_view_section(r)
    assert v["dir"] and v["read_errors"] == [], v
    assert sorted(vcpu for _, vcpu in v["vcpu_threads"]) == [0, 1], v["vcpu_threads"]
    assert {tid for tid, _ in v["vcpu_threads"]} == set(r.vcpu_threads.values())
    # This machine's kernel traces neither the switches away from the idle task on one CPU
    # nor some wake-ups there (docs/kvm.md "The VM view"): counted, never guessed at.
    print(f"\nVM view counters: {v['counters']}")
    assert any(i.vcpu == 0 and i.state == "preempted" for i in iv)


def test_the_clock_passes_its_self_check(scenario):
    """Every guest event before its vCPU's switch-out, every switch-in before the guest's next
    event, mapped with the measured clock, within its bound (issue 26's self-check)."""
    r, _ = scenario
    sidecar = json.loads((r.out / "ivtrace.json").read_text())
    c = sidecar["self_check"]
    print(f"\nself-check: {c['pairs']} pairs, {c['violations']} violations, largest lead "
          f"{c['largest_lead_ns']} ns, bound {c['bound_ns']} ns; kinds {c['kinds']}")
    assert c["bound_ns"] == sidecar["clock"]["error_ns"] and not sidecar["clock"]["coarse"]
    kinds = {(k["cause"], k["effect"]): k for k in c["kinds"]}
    assert kinds[("guest event", "vCPU switch-out")]["pairs"] > 100, c
    assert kinds[("vCPU switch-in", "guest event")]["pairs"] > 100, c
    # The switch-in side holds the mapping to its bound (largest lead ~2 us at most here).
    assert kinds[("vCPU switch-in", "guest event")]["violations"] == 0, c
    p = subprocess.run([str(vmview.IVTRACE), "report", str(r.out)], capture_output=True,
                       text=True, check=True)
    assert f"{c['pairs']} pairs, {c['violations']} violations" in p.stdout, p.stdout


def test_the_self_check_finds_no_violation(scenario):
    """0 violations on every kind (issue 26's acceptance for tests/vmview). Stretches whose end
    the host trace does not show (this host kernel traces no switch-in from idle on one CPU,
    nor some wake-ups there: docs/kvm.md) are not checked, and counted; stretches the host
    trace got wrong (the guest ran through them while the stretches around them hold) are
    counted apart, never dropped: the report says how many of each."""
    r, _ = scenario
    c = json.loads((r.out / "ivtrace.json").read_text())["self_check"]
    print(f"\nself-check: {c['pairs']} pairs, {c['violations']} violations beyond {c['bound_ns']} "
          f"ns, largest lead {c['largest_lead_ns']} ns; host record missing "
          f"{c['host_record_missing']} stretches (leads up to "
          f"{c['host_record_missing_largest_lead_ns']} ns), open-ended "
          f"{c['stretches_open_ended']} (the guest ran in {c['open_ended_guest_ran']})")
    assert c["violations"] == 0, c
    set_aside = sum(k["host_record_missing"] for k in c["kinds"])
    assert set_aside >= c["host_record_missing"], c
    assert c["open_ended_guest_ran"] <= c["stretches_open_ended"], c
    p = subprocess.run([str(vmview.IVTRACE), "report", str(r.out)], capture_output=True,
                       text=True, check=True)
    if c["host_record_missing"]:
        assert f"{c['host_record_missing']} stretches the host trace got wrong" in p.stdout
    if c["stretches_open_ended"]:
        assert f"{c['stretches_open_ended']} stretches not checked" in p.stdout, p.stdout


def phase(r, name):
    return next(p for p in r.phases if p.name == name)


def check_against_schedstat(r, iv, p, floor_ns):
    """The preempted time of vCPU 0 in phase `p` is schedstat's run-queue wait within 5 %
    (or `floor_ns`, for a wait near zero); and schedstat's wait lies between it and it plus the
    waits whose end the host kernel did not trace, give or take the same margin. (Each wake-up
    is traced a little after the kernel starts counting: on this PVM host a remote wake-up's
    IPI is a hypervisor exit, tens of us; docs/kvm.md "The VM view".)"""
    ours = vmview.preempted_ns(iv, 0, p.start_ns, p.end_ns)
    unseen = vmview.preempted_ns(iv, 0, p.start_ns, p.end_ns, "runnable_untraced")
    ref = p.schedstat_wait_ns
    margin = max(TOLERANCE * ref, floor_ns)
    assert abs(ours - ref) <= margin, (p.name, ours, ref)
    assert ours - margin <= ref <= ours + unseen + margin, (p.name, ours, unseen, ref)
    return ours


def test_with_the_hog_preempted_time_matches_schedstat(scenario):
    r, iv = scenario
    p = phase(r, "hog")
    ours = check_against_schedstat(r, iv, p, 5e6)
    assert p.hog_cpu_ns > 0.2 * HOG_S * 1e9, "the hog ran on vCPU 0's CPU"
    assert ours > 0.1 * HOG_S * 1e9, "vCPU 0 lost a share of its CPU to the hog"


def test_without_the_hog_preempted_time_matches_schedstat(scenario):
    r, iv = scenario
    p = phase(r, "quiet")
    # Near zero, both: within 2 % of the phase's length of each other.
    ours = check_against_schedstat(r, iv, p, 0.02 * QUIET_S * 1e9)
    # Quiet is measured on vCPU 0's host CPU itself, during the phase: the 1-minute load
    # average lags behind a load that has just begun.
    if p.others_ns <= vmview.QUIET_OTHERS_NS:
        assert ours < 0.02 * QUIET_S * 1e9, f"near zero on a quiet host: {ours / 1e6:.1f} ms"
    else:
        print(f"\nthe host was busy (other tasks ran {p.others_ns / 1e6:.0f} ms on vCPU 0's "
              f"CPU): vCPU 0 waited {ours / 1e6:.1f} ms without the hog; 'near zero' not asserted")


def test_the_hog_takes_the_cpu_only_while_it_runs(scenario):
    """Who took vCPU 0's CPU: the hog, during the hog phase, and never in the quiet one."""
    r, iv = scenario
    took = {}
    for p in r.phases:
        took[p.name] = sum(1 for i in iv if i.vcpu == 0 and i.state == "preempted"
                           and p.start_ns <= i.end_ns < p.end_ns
                           and i.taken_by == vmview.HOG_NAME)
    assert took["quiet"] == 0 and took["hog"] > 10, took


def merged(trace):
    """(guest events of CPU 0 as (ns, name, payload), vCPU 0's preempted intervals) from
    babeltrace2 reading the whole recording (guest kernel, host, VM view) at once."""
    import bt2

    from ctf import value

    guest, intervals = [], []
    for msg in bt2.TraceCollectionMessageIterator(str(trace)):
        if type(msg) is not bt2._EventMessageConst:
            continue
        ev = msg.event
        env = ev.stream.trace.environment
        cpu = int(ev.packet.context_field["cpu_id"])
        if cpu != 0:
            continue
        ns = msg.default_clock_snapshot.ns_from_origin
        if "ivtrace_vm_view" in env and ev.name == "vcpu_preempted":
            p = ev.payload_field
            intervals.append((ns, ns + int(p["duration_ns"]), str(p["guest_comm"])))
        elif "ivtrace_host_trace" not in env and "ivtrace_vm_view" not in env \
                and str(env["domain"]) == "kernel":
            guest.append((ns, ev.name, {k: value(v) for k, v in ev.payload_field.items()}
                          if ev.name == "sched_switch" else None))
    return guest, intervals


def test_intervals_sit_between_the_right_guest_events(scenario):
    r, _ = scenario
    bound = json.loads((r.out / "ivtrace.json").read_text())["clock"]["error_ns"]
    guest, intervals = merged(r.out)
    assert guest and intervals
    assert all(a[0] <= b[0] for a, b in zip(guest, guest[1:])), "time-ordered"
    inside, checked, wrong_thread = [], 0, []
    g = 0
    last_switch = None
    for start, end, comm in intervals:
        while g < len(guest) and guest[g][0] <= start - bound:
            if guest[g][1] == "sched_switch":
                last_switch = guest[g]
            g += 1
        if end - start <= 2 * bound + 100_000:
            continue  # too short to tell from the clock's error bound
        checked += 1
        k = g
        while k < len(guest) and guest[k][0] < end - bound:
            if guest[k][0] > start + bound:
                inside.append((start, end, guest[k][:2]))
            k += 1
        near = any(x[1] == "sched_switch" for x in guest[g:k] if x[0] <= start + bound)
        if last_switch and not near and comm != last_switch[2]["next_comm"]:
            wrong_thread.append((start, comm, last_switch[2]["next_comm"]))
    print(f"\n{checked} preempted intervals of vCPU 0 checked (clock bound {bound} ns)")
    assert checked > 20
    assert not inside, f"guest events of CPU 0 inside preempted intervals: {inside[:5]}"
    assert not wrong_thread, wrong_thread[:5]


def test_the_report_names_who_lost_time_and_who_took_it(scenario):
    r, _ = scenario
    p = subprocess.run([str(vmview.IVTRACE), "report", str(r.out), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)["vm_view"]
    assert v["errors"] == []
    s = v["summary"]
    assert s["guest_threads"][0]["comm"] == vmview.SPIN, s["guest_threads"][:3]
    tasks = s["host_tasks"]
    if vmview.HOG_NAME not in {t["comm"] for t in tasks}:
        # A busy host: the report keeps the ten tasks that took the most; then they all took
        # at least what the VM view credits the hog with (its vcpu_host_ran events).
        hog_ns = host_ran_ns(r.out, vmview.HOG_NAME)
        print(f"\nthe hog ({hog_ns / 1e6:.1f} ms) is not among the report's ten host tasks")
        assert hog_ns > 0, "the VM view credits the hog with nothing"
        assert len(tasks) == 10 and min(t["ns"] for t in tasks) >= hog_ns, tasks
    assert s == vm_view_section(r)["summary"], "the report reads back what serve derived"
    text = subprocess.run([str(vmview.IVTRACE), "report", str(r.out)], capture_output=True,
                          text=True, timeout=300).stdout
    assert "guest threads that lost the most time to the host" in text and vmview.SPIN in text


def host_ran_ns(trace, comm: str) -> int:
    """The time the VM view says host task `comm` ran while a vCPU thread waited."""
    import bt2

    total = 0
    for msg in bt2.TraceCollectionMessageIterator(str(trace / "vm")):
        if type(msg) is bt2._EventMessageConst and msg.event.name == "vcpu_host_ran":
            p = msg.event.payload_field
            if str(p["host_comm"]) == comm:
                total += int(p["duration_ns"])
    return total


QMP_SCRIPT = r"""
cp "$(command -v ivtwl)" /tmp/vmspin
taskset -c 0 /tmp/vmspin cpu 1000000000000 >/dev/null &
spin=$!
sleep 3
kill $spin
echo "VMVIEW: rmmod"
rmmod ivtrace
echo "VMVIEW: rmmod rc=$?"
echo "VMVIEW: done"
"""


def test_qmp_names_vcpu_threads_qemu_does_not_name(guest, tmp_path):
    """Without `debug-threads=on` every QEMU thread is `qemu-system-x86`: `ivtrace record
    --host-events --qmp PATH` takes the vCPU threads from QMP's query-cpus-fast instead, and
    the VM view has both vCPUs."""
    from e2e import guest as g

    shm, qmp, out = g.shm_path("vmview-qmp"), tmp_path / "qmp.sock", tmp_path / "rec"
    try:
        with vmview.ivtvm.VM(QMP_SCRIPT, shm=str(shm), shm_size="16M", shm_clear=True, smp=2,
                             tcg_thread="multi",  # the vCPU threads are what it maps
                             modules=["ivtrace"], add=guest.add("ivtrace.ko", "ivtwl"),
                             extra_args=["-qmp", f"unix:{qmp},server=on,wait=off"],
                             log=str(tmp_path / "console.log")) as vm:
            wait_for(qmp.exists, 60, f"QEMU's QMP socket {qmp}")
            p = subprocess.Popen([str(vmview.IVTRACE), "record", "--shm", str(shm), "-o",
                                  str(out), "--host-events", "--qemu-pid", str(vm.proc.pid),
                                  "--qmp", str(qmp)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            r = vm.wait(timeout=g.TIMEOUT)
            if r.timed_out:
                p.terminate()  # the region never closed: the recorder would wait on
            err = p.communicate(timeout=120)[1]
    finally:
        shm.unlink(missing_ok=True)
    assert r.exit_code == 0 and p.returncode == 0, r.explain() + "\n" + err
    assert "no `CPU n/...` thread names" in err, err
    assert "vCPU threads: qmp query-cpus-fast" in err, err
    assert (out / "vm" / "vm_vcpu0").is_file() and (out / "vm" / "vm_vcpu1").is_file(), err
    env = (out / "vm" / "metadata").read_text()
    assert 'ivtrace_vcpu_source = "qmp query-cpus-fast";' in env
