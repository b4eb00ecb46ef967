"""Trace Compass, headless, as a reader of ivtrace's traces; and the recordings it reads.

- `TraceCompass`: Trace Compass 6.2's core jars (scripts/install-tracecompass) plus our own
  driver, TcReport.java, compiled here with javac; `.kernel(dir)`, `.disks(dir)`,
  `.experiment(dirs)` and `.events(dir, prefix)` return what Trace Compass computed
  (TcReport.java says what is in them).
- `record_demo` and `record_serve`: a real guest (QEMU, the Debian kernel, ivtrace.ko) running
  the demo workload (vm/guest/workload/demo.sh) recorded by `ivtrace record`, as `make demo`
  does, or by `ivtrace serve` (guest and host traces of one recording).
- `babeltrace1_times` / `babeltrace2_times`: the first and last event times the other two CTF
  readers compute from the same clock block; `babeltrace2_event_times`: every event's of a name.
"""
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from e2e import guest as g
from serve import serve as s

REPO = Path(__file__).resolve().parents[2]

INSTALL = REPO / "scripts" / "install-tracecompass"
CLASSPATH = REPO / "build" / "tracecompass" / "classpath"
DRIVER = Path(__file__).resolve().parent / "TcReport.java"
WORKLOAD = REPO / "vm" / "guest" / "workload"
GROUPS = "sched,irq,timer,kmem,syscall,printk"  # what vm/demo records
TC_TIMEOUT = 900  # s; the analysis of a few-second trace takes ~10 s on a quiet machine


def _run(cmd, what, timeout, **kw):
    cmd = [str(c) for c in cmd]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} timed out after {timeout} s: {' '.join(cmd)}")
    if p.returncode != 0:
        pytest.fail(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n"
                    f"--- stderr\n{p.stderr[-4000:]}")
    return p


class TraceCompass:
    """Trace Compass's core libraries and TcReport, ready to run."""

    def __init__(self, workdir: Path):
        _run([sys.executable, INSTALL], "scripts/install-tracecompass", 900)
        self.classpath = CLASSPATH.read_text().strip()
        self.classes = workdir / "classes"
        self.classes.mkdir(parents=True, exist_ok=True)
        _run(["javac", "-d", self.classes, "-cp", self.classpath, DRIVER], "javac TcReport", 300)
        self.workdir = workdir

    def run(self, mode, dirs):
        """TcReport's JSON. Each run gets its own java.io.tmpdir: Trace Compass keeps its
        index and state history there, named after the trace directory, and would reuse
        another trace's files of the same name."""
        tmp = tempfile.mkdtemp(prefix=f"tc-{mode}-", dir=self.workdir)
        p = _run(["java", f"-Djava.io.tmpdir={tmp}", "-cp", f"{self.classes}:{self.classpath}",
                  "TcReport", mode, *dirs], f"Trace Compass ({mode})", TC_TIMEOUT)
        return json.loads(p.stdout)

    def kernel(self, trace_dir):
        return self.run("kernel", [trace_dir])

    def disks(self, trace_dir):
        return self.run("disks", [trace_dir])

    def experiment(self, trace_dirs):
        return self.run("experiment", trace_dirs)

    def events(self, trace_dir, prefix):
        return self.run("events", [trace_dir, prefix])


# --------------------------------------------------------------------------- recordings

def guest_files():
    """ivtvm `add=` list: ivtrace.ko, the static loadgen, ivtwl, and the demo workload."""
    return g.build_all() + [f"{WORKLOAD / 'demo.sh'}:/workload/"]


def demo_script(seconds):
    return (f"/workload/demo.sh {seconds}\necho \"TC: workload rc=$?\"\n"
            "rmmod ivtrace\necho \"TC: rmmod rc=$?\"\n")


def record_demo(tmp: Path, add, seconds):
    """`make demo`'s recording, shorter: `ivtrace record` of the demo workload. Returns the
    output directory, the boot result and the host's wall clock before and after (ns)."""
    shm = g.shm_path("tracecompass")
    out = tmp / "demo"
    before = time.time_ns()
    rec = g.Recorder(shm, out)
    try:
        with g.ivtvm.VM(demo_script(seconds), shm=str(shm), shm_size="64M", shm_clear=True,
                        smp=2, modules=["ivtrace"], modopts={"ivtrace": f"events={GROUPS}"},
                        add=add, log=str(tmp / "demo-console.log")) as vm:
            r = vm.wait(timeout=g.TIMEOUT)
        summary = rec.wait(timeout=60, boot=r)
    finally:
        rec.stop()
        shm.unlink(missing_ok=True)
    return {"out": out, "boot": r, "summary": summary, "rc": rec.rc, "stderr": rec.stderr(),
            "before_ns": before, "after_ns": time.time_ns()}


def record_serve(tmp: Path, add, seconds, name, extra=()):
    """One `ivtrace serve` recording of the demo workload: OUT/<name>/{kernel,user,host}
    (and vm/ with `extra=("--host-events",)`)."""
    out = tmp / "serve"
    before = time.time_ns()
    srv = s.Server(out, "--size", "64M", *extra)
    try:
        with s.ivtvm.VM(demo_script(seconds), doorbell=str(srv.sock), vectors=2, smp=2,
                        modules=["ivtrace"], modopts={"ivtrace": f"events={GROUPS}"},
                        add=add, extra_args=["-name", f"{name},debug-threads=on"],
                        log=str(tmp / "serve-console.log")) as vm:
            r = vm.wait(timeout=s.TIMEOUT)
        rc, summaries = srv.stop()
    finally:
        srv.cleanup()
    return {"out": out / name, "boot": r, "rc": rc, "summaries": summaries,
            "stderr": srv.stderr(), "before_ns": before, "after_ns": time.time_ns()}


# --------------------------------------------------------------------------- other readers

def babeltrace2_times(trace_dir):
    """(first, last) event time in ns since the epoch, as babeltrace2 computes them."""
    import bt2
    first = last = None
    for msg in bt2.TraceCollectionMessageIterator(str(trace_dir)):
        if type(msg) is bt2._EventMessageConst:
            ns = msg.default_clock_snapshot.ns_from_origin
            first = ns if first is None else first
            last = ns
    return first, last


def babeltrace2_event_times(trace_dir, name=None):
    """Every `name` event's (every event's, without a name) time in ns since the epoch, in
    order, as babeltrace2 computes it (exact integer arithmetic from the clock block)."""
    import bt2
    return [msg.default_clock_snapshot.ns_from_origin
            for msg in bt2.TraceCollectionMessageIterator(str(trace_dir))
            if type(msg) is bt2._EventMessageConst and name in (None, msg.event.name)]


def babeltrace1_event_times(trace_dir):
    """Every event's time in ns since the epoch, in order, as babeltrace 1 prints them."""
    p = _run(["babeltrace", "--clock-seconds", "--no-delta", trace_dir], "babeltrace 1", 600)
    stamps = re.findall(r"^\[(\d+)\.(\d{9})\]", p.stdout, re.M)
    assert stamps, f"babeltrace 1 printed no event of {trace_dir}:\n{p.stdout[:500]}"
    return [int(sec) * 1_000_000_000 + int(ns) for sec, ns in stamps]


def babeltrace1_times(trace_dir):
    """(first, last) event time in ns since the epoch, as babeltrace 1 prints them."""
    stamps = babeltrace1_event_times(trace_dir)
    return stamps[0], stamps[-1]


def clock_block(trace_dir):
    """The `clock { ... }` block of a trace's metadata, as {key: text}."""
    text = (Path(trace_dir) / "metadata").read_text()
    m = re.search(r"^clock \{(.*?)^\};", text, re.M | re.S)
    assert m, f"no clock block in {trace_dir}/metadata"
    return dict(re.findall(r"^\s*(\w+) = ([^;]*);", m.group(1), re.M))


def iso(ns):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9)) + " UTC"
