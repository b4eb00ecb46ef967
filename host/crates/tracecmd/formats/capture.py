#!/usr/bin/python3
"""Capture the guest kernel's tracefs format files of the events ivtrace.ko's probes write into
linux-<major.minor>.txt (the native events' layouts `ivtrace export --format trace-cmd`
writes, docs/trace-cmd.md): boots the guest of `make guest` (vm/ivtvm.py) and cats each file.

Usage, from the top of the repository (ivtools on PYTHONPATH, python/README.md):
  PYTHONPATH=python /usr/bin/python3 host/crates/tracecmd/formats/capture.py [OUTPUT]
(default OUTPUT: linux-<major.minor>.txt beside this script)
"""
import re
import sys
from pathlib import Path

from ivtools import ivtvm

HERE = Path(__file__).resolve().parent

EVENTS = """sched/sched_switch sched/sched_wakeup sched/sched_wakeup_new sched/sched_process_fork
sched/sched_process_exec sched/sched_process_exit sched/sched_process_free sched/sched_migrate_task
task/task_rename irq/irq_handler_entry irq/irq_handler_exit irq/softirq_entry irq/softirq_exit
timer/hrtimer_expire_entry timer/hrtimer_expire_exit kmem/kmalloc kmem/kfree kmem/mm_page_alloc
kmem/mm_page_free printk/console raw_syscalls/sys_enter raw_syscalls/sys_exit
syscalls/sys_enter_openat syscalls/sys_exit_openat""".split()
VECTORS = ("local_timer reschedule call_function_single call_function irq_work x86_platform_ipi "
           "spurious_apic error_apic thermal_apic threshold_apic deferred_error_apic").split()
EVENTS += [f"irq_vectors/{v}_{end}" for v in VECTORS for end in ("entry", "exit")]


def script() -> str:
    s = "T=/sys/kernel/tracing; [ -e $T/events ] || mount -t tracefs nodev $T\n"
    s += "uname -a | sed 's/^/UNAME /'\n"
    for f in ["header_page", "header_event"] + [f"{e}/format" for e in EVENTS]:
        name = f.removesuffix("/format")
        s += f'echo "=== {name}"; cat $T/events/{f} || echo "MISSING {name}"\n'
    return s + 'echo "=== END"\n'


def main() -> int:
    r = ivtvm.boot(script(), timeout=300, smp=2)
    text = r.console_text
    if not r.ok or "=== END" not in text:
        print(f"capture failed: {r.explain()}", file=sys.stderr)
        return 1
    missing = re.findall(r"^MISSING (\S+)$", text, re.M)
    if missing:
        print(f"this kernel has no {', '.join(missing)}", file=sys.stderr)
        return 1
    uname = re.search(r"^UNAME (.*)$", text, re.M).group(1)
    version = ".".join(uname.split()[2].split(".")[:2])
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / f"linux-{version}.txt"
    parts = re.split(r"^=== (\S+)\n", text[text.index("=== header_page"):], flags=re.M)
    with open(out, "w") as f:
        f.write("# The Linux tracefs format files of the kernel events ivtrace.ko's probes write, "
                "as the guest\n")
        f.write(f"# kernel's tracefs gives them ({uname}).\n")
        f.write("# Written back to trace-cmd files as the layouts of the native events "
                "(docs/trace-cmd.md).\n")
        f.write("# Captured by formats/capture.py (boots the guest, cats each file); sections "
                "start with\n")
        f.write('# "=== system/event" (or header_page, header_event). Do not edit: re-capture.\n')
        for name, body in zip(parts[1::2], parts[2::2]):
            if name != "END":
                f.write(f"=== {name}\n{body.rstrip()}\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
