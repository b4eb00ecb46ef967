"""The guest kernel trace in lttng-modules' layout, checked on a real guest.

A guest (QEMU, Debian kernel, ivtrace.ko with every event group) runs the demo workload,
vm/guest/workload/demo.sh, as `make demo` does, while `ivtrace record` drains it; babeltrace2
(bt2) reads the kernel trace, and its event classes are compared with what lttng-modules 2.10
writes on x86-64:
  - every syscall_entry_<name> / syscall_exit_<name> with abi/syscalls/lttng-x86_64.tsv, the
    table of LTTng's system call events (derived from an lttng-modules 2.10 trace's metadata):
    event name, field names in order, field types (size, sign, base, strings, arrays);
  - the scheduler, interrupt (x86 vectors included), memory and state dump events with
    LTTNG_FIELDS below (the same facts for those events, in our words);
  - the values: path names are the strings the workload used, a preempted task's prev_state
    is TASK_REPORT_MAX, the state dump names threads in the initial pid namespace and the
    files they had open.
"""
from pathlib import Path

import pytest

from e2e import guest as g

bt2 = pytest.importorskip("bt2", reason="python3-bt2 (babeltrace2's bindings) is not installed")

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "vm" / "guest" / "workload"
TABLE = REPO / "abi" / "syscalls" / "lttng-x86_64.tsv"
SECONDS = 6
GROUPS = "sched,irq,timer,kmem,syscall,printk"
TASK_REPORT_MAX = 0x100           # Linux 6.1: TASK_REPORT_IDLE << 1
INIT_PID_NS = 0xEFFFFFFC          # Linux: PROC_PID_INIT_INO
COMM = "comm16"                   # a char[16] field, however bt2 presents it

# lttng-modules 2.10's fields of the non-syscall events we write (x86-64), as bt2 presents
# them (a sequence's length field is a member of its own: `_vtids_length`, then `vtids`).
LTTNG_FIELDS = {
    "sched_switch": [("prev_comm", COMM), ("prev_tid", "s32"), ("prev_prio", "s32"),
                     ("prev_state", "s64"), ("next_comm", COMM), ("next_tid", "s32"),
                     ("next_prio", "s32")],
    "sched_wakeup": [("comm", COMM), ("tid", "s32"), ("prio", "s32"), ("target_cpu", "s32")],
    "sched_wakeup_new": [("comm", COMM), ("tid", "s32"), ("prio", "s32"),
                         ("target_cpu", "s32")],
    "sched_process_exit": [("comm", COMM), ("tid", "s32"), ("prio", "s32")],
    "sched_process_free": [("comm", COMM), ("tid", "s32"), ("prio", "s32")],
    "irq_handler_entry": [("irq", "s32"), ("name", "string")],
    "irq_handler_exit": [("irq", "s32"), ("ret", "s32")],
    "irq_softirq_entry": [("vec", "u32")],
    "irq_softirq_exit": [("vec", "u32")],
    "timer_hrtimer_expire_entry": [("hrtimer", "u64x"), ("now", "s64"), ("function", "u64x")],
    "timer_hrtimer_expire_exit": [("hrtimer", "u64x")],
    "kmem_kmalloc": [("call_site", "u64x"), ("ptr", "u64x"), ("bytes_req", "u64"),
                     ("bytes_alloc", "u64"), ("gfp_flags", "u32")],
    "kmem_kfree": [("call_site", "u64x"), ("ptr", "u64x")],
    "kmem_mm_page_alloc": [("page", "u64x"), ("pfn", "u64"), ("order", "u32"),
                           ("gfp_flags", "u32"), ("migratetype", "s32")],
    "kmem_mm_page_free": [("page", "u64x"), ("pfn", "u64"), ("order", "u32")],
    "printk_console": [("_msg_length", "u64"), ("msg", "string")],
    "sched_process_exec": [("filename", "string"), ("tid", "s32"), ("old_tid", "s32")],
    "lttng_statedump_start": [],
    "lttng_statedump_end": [],
    "lttng_statedump_process_state": [
        ("tid", "s32"), ("vtid", "s32"), ("pid", "s32"), ("vpid", "s32"), ("ppid", "s32"),
        ("vppid", "s32"), ("name", COMM), ("type", "s32"), ("mode", "s32"),
        ("submode", "s32"), ("status", "s32"), ("ns_level", "s32"), ("ns_inum", "u32"),
        ("cpu", "u32")],
    "lttng_statedump_file_descriptor": [("pid", "s32"), ("fd", "s32"), ("flags", "u32"),
                                        ("fmode", "u32x"), ("filename", "string")],
    "lttng_statedump_block_device": [("dev", "u32"), ("diskname", "string")],
    "lttng_statedump_interrupt": [("irq", "u32"), ("name", "string"), ("action", "string")],
}
# lttng-modules' x86 interrupt vector events (instrumentation/events/arch/x86/irq_vectors.h):
# one `int vector` each; `ipi` is Linux's x86_platform_ipi.
LTTNG_FIELDS.update({
    f"x86_irq_vectors_{kind}_{side}": [("vector", "s32")]
    for kind in ("local_timer", "reschedule", "spurious_apic", "error_apic", "ipi", "irq_work",
                 "call_function", "call_function_single", "threshold_apic",
                 "deferred_error_apic", "thermal_apic")
    for side in ("entry", "exit")})
FORK_FIELDS = [("parent_comm", COMM), ("parent_tid", "s32"), ("parent_pid", "s32"),
               ("parent_ns_inum", "u32"), ("child_comm", COMM), ("child_tid", "s32"),
               ("_vtids_length", "u8"), ("vtids", "s32[]"), ("child_pid", "s32"),
               ("child_ns_inum", "u32")]
# The families the workload must exercise (file, directory, memory, process, signal, time).
DEMO_SYSCALLS = ["openat", "read", "write", "close", "newfstatat", "getdents64", "mkdir",
                 "unlink", "mmap", "brk", "clone", "execve", "wait4", "exit_group", "pipe2",
                 "rt_sigaction", "rt_sigprocmask", "clock_nanosleep", "clock_gettime"]


def lttng_syscalls():
    """{event name: [(field, type)]} from the committed table, both sides of every call."""
    out = {}
    for line in TABLE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        nr, name, nargs, entry, exit_, source = line.split("\t")
        if source == "generic":
            ent = [(f"args{i}", "u64x") for i in range(int(nargs))]
            ext = [("ret", "s64")]
        else:
            def cols(c):
                return [] if c == "-" else [(f.split(":")[0], f.split(":")[2])
                                            for f in c.split(",")]
            ent, ext = cols(entry), cols(exit_)
        out[f"syscall_entry_{name}"] = (ent, source)
        out[f"syscall_exit_{name}"] = (ext, source)
    return out


def ftype(fc):
    """A bt2 field class as the table spells types: s32, u64x, string, u32[2]."""
    if isinstance(fc, bt2._StringFieldClassConst):
        return "string"
    if isinstance(fc, bt2._StaticArrayFieldClassConst):
        elem = ftype(fc.element_field_class)
        return COMM if (elem, fc.length) == ("u8", 16) else f"{elem}[{fc.length}]"
    if isinstance(fc, bt2._DynamicArrayFieldClassConst):
        return f"{ftype(fc.element_field_class)}[]"
    if isinstance(fc, bt2._IntegerFieldClassConst):
        sign = "s" if isinstance(fc, bt2._SignedIntegerFieldClassConst) else "u"
        hexa = "x" if fc.preferred_display_base == 16 else ""
        return f"{sign}{fc.field_value_range}{hexa}"
    return type(fc).__name__


def comm_type(t):
    # bt2's CTF source presents a UTF-8 char[16] as a string.
    return COMM if t in ("string", COMM) else t


@pytest.fixture(scope="module")
def demo(tmp_path_factory, e2e_add):
    tmp = tmp_path_factory.mktemp("lttng-layout")
    shm = g.shm_path("layout")
    rec = g.Recorder(shm, tmp / "trace")
    script = (f"/workload/demo.sh {SECONDS}\necho \"LAYOUT: demo rc=$?\"\n"
              "rmmod ivtrace\necho \"LAYOUT: rmmod rc=$?\"\n")
    add = list(e2e_add) + [f"{WORKLOAD / 'demo.sh'}:/workload/"]
    try:
        with g.ivtvm.VM(script, shm=str(shm), shm_size="64M", shm_clear=True, smp=2,
                        modules=["ivtrace"], modopts={"ivtrace": f"events={GROUPS}"}, add=add,
                        log=str(tmp / "console.log")) as vm:
            r = vm.wait(timeout=g.TIMEOUT + SECONDS)
        summary = rec.wait(timeout=60, boot=r)
    finally:
        rec.stop()
        shm.unlink(missing_ok=True)
    text = r.console_text
    assert "LAYOUT: demo rc=0" in text and "LAYOUT: rmmod rc=0" in text, r.explain(60)
    assert g.lost(summary) == {}, g.lost(summary)
    kernel = g.trace_dirs(tmp / "trace")
    kernel = [d for d in kernel if d.name == "kernel"][0]
    classes, values = {}, {}
    for msg in bt2.TraceCollectionMessageIterator(str(kernel)):
        if type(msg) is bt2._StreamBeginningMessageConst:
            for ec in msg.stream.cls.values():
                pfc = ec.payload_field_class
                classes[ec.name] = [(n, ftype(m.field_class)) for n, m in pfc.items()] \
                    if pfc is not None else []
        elif type(msg) is bt2._EventMessageConst:
            ev = msg.event
            if ev.name in WANT_VALUES:
                values.setdefault(ev.name, []).append(
                    {k: g.ctf.value(v) for k, v in ev.payload_field.items()})
    return {"classes": classes, "values": values, "console": text}


WANT_VALUES = {"syscall_entry_openat", "syscall_entry_execve", "syscall_exit_pipe2",
               "sched_switch", "lttng_statedump_process_state",
               "lttng_statedump_file_descriptor"}


def test_every_syscall_has_lttngs_name_fields_and_types(demo):
    table = lttng_syscalls()
    seen = {n: f for n, f in demo["classes"].items() if n.startswith("syscall_")}
    assert "syscall_entry_unknown" not in seen and "syscall_exit_unknown" not in seen
    checked = []
    for name, fields in sorted(seen.items()):
        assert name in table, f"{name}: not an LTTng x86-64 system call event"
        want, source = table[name]
        assert fields == want, f"{name} ({source}): ours {fields}, LTTng's {want}"
        checked.append(name)
    for call in DEMO_SYSCALLS:
        assert f"syscall_entry_{call}" in seen, f"the demo made no {call}?"
        assert f"syscall_exit_{call}" in seen or call == "exit_group", call
    print(f"{len(checked)} syscall event classes match LTTng's table")


def test_scheduler_irq_kmem_and_state_dump_events_have_lttngs_fields(demo):
    classes = demo["classes"]
    for name, want in list(LTTNG_FIELDS.items()) + [("sched_process_fork", FORK_FIELDS)]:
        assert name in classes, f"{name} not declared"
        ours = [(n, comm_type(t)) for n, t in classes[name]]
        assert ours == [(n, comm_type(t)) for n, t in want], f"{name}: {ours}"


def test_path_names_hold_the_real_strings(demo):
    v = demo["values"]
    opened = {e["filename"] for e in v["syscall_entry_openat"]}
    assert "/tmp/workload/random.bin" in opened, sorted(opened)[:40]
    assert all(isinstance(f, str) for f in opened)
    execs = {e["filename"] for e in v["syscall_entry_execve"]}
    assert {"/tmp/workload/compress-job", "/tmp/workload/report-gen"} <= execs, sorted(execs)
    # pipe2's exit carries the two descriptors the call wrote (gunzip | tar)
    pipes = [e for e in v["syscall_exit_pipe2"] if e["ret"] == 0]
    assert pipes and all(len(e["fildes"]) == 2 and e["fildes"][0] != e["fildes"][1]
                         for e in pipes), pipes[:3]


def test_a_preempted_task_has_prev_state_task_report_max(demo):
    states = {e["prev_state"] for e in demo["values"]["sched_switch"]}
    assert TASK_REPORT_MAX in states, sorted(states)
    assert 1 in states  # TASK_INTERRUPTIBLE: a task that went to sleep


def test_state_dump_has_namespaces_and_open_files(demo):
    v = demo["values"]
    procs = v["lttng_statedump_process_state"]
    assert len(procs) > 10
    for p in procs:
        assert (p["vtid"], p["vpid"]) == (p["tid"], p["pid"]), p
        assert (p["ns_level"], p["ns_inum"]) == (0, INIT_PID_NS), p
    fds = v["lttng_statedump_file_descriptor"]
    names = {f["filename"] for f in fds}
    pids = {p["pid"] for p in procs}
    assert fds and all(f["pid"] in pids for f in fds)
    assert any(n.startswith("/dev/") for n in names), sorted(names)[:20]
