"""doorbell: guest -> host notification, in the spirit of seed 004 (KVM iosignalfd: doorbell iops and
round trip), on whatever accelerator this machine gives QEMU:

1. eventfd between two host threads (efd_baseline): the floor under any doorbell;
2. guest -> host doorbells through QEMU's ivshmem-doorbell (dbserver on the host, dbguest in
   the guest, no driver): back-to-back rate, every doorbell counted on the host; round trip
   (guest rings, the host wakes on its eventfd and answers in shared memory), with the host
   blocking (a sleeping host, as ivtrace serve) and busy-reading;
3. ioeventfd under KVM (the in-kernel doorbell of seed 004): measured only where a guest can
   run under KVM; otherwise recorded as "not measurable" with the reason;
4. doorbells per MB of trace at several event rates: ivtrace serve + ivtrace.ko, the guest
   writing kernel-API events (ivtrace_test.ko) at paced rates, counters from `ivtrace ctl list`
   at each phase boundary.

The raw server (bench/doorbell/dbserver) is the project's only ivshmem server besides
`ivtrace serve`: measuring the doorbell itself needs a host that does nothing but answer it.
"""

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ivtools import ivtvm
from ivtools.proc import sh

from . import BenchError, Prerequisite, guests
from .results import ROOT

NAME = "doorbell"
HELP = "guest -> host doorbells: rate, round trip, doorbells per MB of trace"
BUILD = ROOT / "build" / "bench" / "doorbell"
IVTRACE = ROOT / "bin" / "ivtrace"


def efd(n, repeats):
    runs = [json.loads(sh([BUILD / "efd_baseline", n], error=BenchError).stdout) for _ in range(repeats)]
    return {"command": f"{BUILD.relative_to(ROOT)}/efd_baseline {n}", "runs": runs}


def lines(text, key):
    return [json.loads(m) for m in re.findall(rf"^{key} (\{{.*\}})\s*$", text, re.M)]


def tcg_doorbells(dbguest, ring_n, rtt_n, timeout, vm_opts):
    """dbserver + a guest without any driver, ringing BAR0 from user space."""
    tmp = Path(tempfile.mkdtemp(prefix="ivt-db-"))
    sock = tmp / "db.sock"
    srv = subprocess.Popen([str(BUILD / "dbserver"), str(sock), str(1 << 20)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not sock.exists():
            if srv.poll() is not None:
                raise BenchError(f"dbserver failed: {srv.stderr.read()}")
            time.sleep(0.02)
        script = "\n".join([
            f'echo "DB: $(dbguest ring {ring_n} 1)"',
            f'echo "DB: $(dbguest ring {ring_n} 2)"',
            f'echo "DB: $(dbguest rtt {rtt_n} 0 3)"',
            f'echo "DB: $(dbguest rtt {rtt_n} 1 4)"',
            f'echo "DB: $(dbguest rtt {rtt_n} 0 5)"',
            f'echo "DB: $(dbguest rtt {rtt_n} 1 6)"',
        ])
        r = ivtvm.boot(script, doorbell=str(sock), vectors=2, add=[str(dbguest)],
                       timeout=timeout, **vm_opts)
        out, err = srv.communicate(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    if r.exit_code != 0:
        raise BenchError(f"guest failed: {r.explain()}")
    results = lines(r.console_text, "DB:")
    counted = json.loads(out.strip().splitlines()[-1])["doorbells_per_phase"]
    rings = [x for x in results if x["test"] == "ring"]
    for i, x in enumerate(rings):
        x["counted_by_host"] = counted[1 + i]
    rtts = [x for x in results if x["test"] == "rtt"]
    return {"accel": r.accel, "accel_reason": r.accel_reason, "ring": rings, "rtt": rtts,
            "command": "bench/run doorbell (dbserver on the host, dbguest in the guest)",
            "qemu": " ".join(r.cmd)}


def kvm_ioeventfd():
    accel, reason = ivtvm.probe_accel("auto")
    if accel != "kvm":
        return {"measurable": False,
                "reason": f"not measurable: no guest runs under KVM here ({reason}); "
                          "under TCG QEMU signals the eventfd itself from the vCPU thread "
                          "(memory_region_dispatch_write_eventfds), which is what section 2 "
                          "measures"}
    return {"measurable": False,
            "reason": "KVM usable, but this harness only runs the TCG path so far; rerun "
                      "section 2 with IVTRACE_ACCEL=kvm to get the in-kernel ioeventfd path"}


def trace_rates(guest, phase_s, timeout, vm_opts):
    """ivtrace serve + ivtrace.ko: doorbells per MB of trace at paced event rates."""
    tmp = Path(tempfile.mkdtemp(prefix="ivt-dbr-"))
    sock = tmp / "s.sock"
    out = tmp / "traces"
    # (name, events per write, writes per phase step): "echo K; usleep 100 ms" ~ 10 K ev/s
    phases = [("idle", 0), ("1k/s", 100), ("10k/s", 1000), ("100k/s", 10000), ("max", None)]
    steps = []
    for name, k in phases:
        steps.append(f'echo "DBPH: {name}"')
        if k is None:
            steps.append(f'end=$(( $(date +%s) + {phase_s} )); '
                         f'while [ $(date +%s) -lt $end ]; do echo 200000 > /proc/ivtrace-test; done')
        elif k == 0:
            steps.append(f"sleep {phase_s}")
        else:
            steps.append(f'end=$(( $(date +%s) + {phase_s} )); '
                         f'while [ $(date +%s) -lt $end ]; do echo {k} > /proc/ivtrace-test; '
                         f'usleep 100000; done')
    steps.append('echo "DBPH: end"')
    steps.append("sleep 1")
    srv = subprocess.Popen([str(IVTRACE), "serve", "--socket", str(sock), "-o", str(out),
                            "--size", "64M", "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    snaps = []
    try:
        while not sock.exists():
            if srv.poll() is not None:
                raise BenchError(f"serve failed: {srv.stderr.read()}")
            time.sleep(0.05)

        def snap(label):
            p = subprocess.run([str(IVTRACE), "ctl", "--socket", str(sock), "--json", "list"],
                               capture_output=True, text=True, timeout=60)
            g = json.loads(p.stdout)["guests"][0]
            snaps.append({"phase": label, "t": time.monotonic(), **{
                k: g[k] for k in ("events", "bytes", "packets", "doorbells", "lost")}})

        with ivtvm.VM("\n".join(steps), doorbell=str(sock), vectors=2, **vm_opts,
                      modules=["ivtrace", "ivtrace_test"],
                      add=guest.add("ivtrace.ko", "ivtrace_test.ko"),
                      extra_args=["-name", "dbrate,debug-threads=on"]) as vm:
            for name, _ in phases + [("end", None)]:
                vm.wait_for(rf"^DBPH: {re.escape(name)}$", timeout=timeout)
                snap(name)
            r = vm.wait(timeout=timeout)
        srv.send_signal(2)
        stdout, _ = srv.communicate(timeout=120)
    finally:
        if srv.poll() is None:
            srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = json.loads(stdout.strip().splitlines()[-1])
    rows = []
    for a, b in zip(snaps, snaps[1:]):
        dt = b["t"] - a["t"]
        d = {k: b[k] - a[k] for k in ("events", "bytes", "packets", "doorbells", "lost")}
        mb = d["bytes"] / 1e6
        rows.append({"phase": a["phase"], "seconds": round(dt, 2),
                     "events_per_s": d["events"] / dt, "mb_per_s": mb / dt,
                     "packets": d["packets"], "doorbells": d["doorbells"],
                     "doorbells_per_s": d["doorbells"] / dt,
                     "doorbells_per_mb": d["doorbells"] / mb if mb > 0 else None,
                     "doorbells_per_packet": d["doorbells"] / d["packets"] if d["packets"] else None,
                     "lost": d["lost"]})
    return {"accel": r.accel, "subbuf_size": 65536, "flush_ms": 100, "phases": rows,
            "notification": summary["notification"], "clock": summary["clock"],
            "command": "bench/run doorbell (ivtrace serve --size 64M; guest: ivtrace.ko, "
                       "ivtrace_test.ko writes K events every 100 ms)"}


def add_arguments(ap):
    guests.add_arguments(ap, smp=2)


def run(a, rec) -> list[str]:
    q = a.quick
    guest = guests.build(a, rec, host_tools=True)
    p = subprocess.run(["make", "-C", str(ROOT / "bench" / "doorbell"), "host"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise Prerequisite(f"make -C bench/doorbell host failed:\n{p.stdout}{p.stderr}")
    guests.describe(rec, guest, ivtvm.probe_accel(a.accel), a.smp, a.mem)
    vm_opts = {"accel": a.accel, "smp": a.smp, "mem": a.mem}
    data = rec["data"]
    print("doorbell: eventfd baseline", flush=True)
    data["eventfd_threads"] = efd(20000 if q else 200000, 1 if q else 3)
    print("doorbell: ivshmem-doorbell, guest -> host", flush=True)
    data["ivshmem_doorbell"] = tcg_doorbells(guest.files["dbguest"], 20000 if q else 100000,
                                             500 if q else 2000, 600, vm_opts)
    data["kvm_ioeventfd"] = kvm_ioeventfd()
    print("doorbell: doorbells per MB of trace", flush=True)
    data["trace_rates"] = trace_rates(guest, 3 if q else 8, 600, vm_opts)
    return []
