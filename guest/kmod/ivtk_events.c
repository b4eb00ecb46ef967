// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_events.c - the kernel stream's wire events, exactly the table of
 * docs/abi.md "Kernel stream": ids 0..25 in this order, names (LTTng's),
 * groups, fields in payload order. ivtk_region.c publishes them as
 * metadata records; the probes in ivtk_probes.c write their payloads.
 *
 * A field flagged IVT_FF_TID_COMM is a thread id the host expands with the
 * thread's name (prev_tid -> prev_comm), which keeps names off the wire.
 */
#include <linux/build_bug.h>
#include <linux/kernel.h>
#include <linux/sched.h>

#include "ivtk.h"

#define FLD(n, t)	{ .name = #n, .type = IVT_FT_##t }
#define FHEX(n, t)	{ .name = #n, .type = IVT_FT_##t, .flags = IVT_FF_HEX }
#define FTID(n)		{ .name = #n, .type = IVT_FT_U32, .flags = IVT_FF_TID_COMM }
#define FCHARS(n, c)	{ .name = #n, .type = IVT_FT_CHARS, .count = (c) }

static const struct ivtrace_field f_sched_switch[] = {
	FTID(prev_tid), FLD(prev_prio, S8), FLD(prev_state, U16),
	FTID(next_tid), FLD(next_prio, S8),
};

static const struct ivtrace_field f_sched_wakeup[] = {
	FTID(tid), FLD(prio, S8), FLD(target_cpu, U16),
};

static const struct ivtrace_field f_irq_entry[] = { FLD(irq, U32) };
static const struct ivtrace_field f_irq_exit[] = { FLD(irq, U32), FLD(ret, S32) };
static const struct ivtrace_field f_softirq[] = { FLD(vec, U8) };

static const struct ivtrace_field f_hrtimer_entry[] = {
	FHEX(hrtimer, U64), FLD(now, S64), FHEX(function, U64),
};

static const struct ivtrace_field f_hrtimer_exit[] = { FHEX(hrtimer, U64) };

static const struct ivtrace_field f_kmalloc[] = {
	FHEX(call_site, U64), FHEX(ptr, U64), FLD(bytes_req, U32),
	FLD(bytes_alloc, U32), FLD(gfp_flags, U32),
};

static const struct ivtrace_field f_kfree[] = { FHEX(call_site, U64), FHEX(ptr, U64) };

static const struct ivtrace_field f_page_alloc[] = {
	FLD(pfn, U64), FLD(order, U32), FLD(gfp_flags, U32), FLD(migratetype, S32),
};

static const struct ivtrace_field f_page_free[] = { FLD(pfn, U64), FLD(order, U32) };

static const struct ivtrace_field f_sys_entry[] = {
	FLD(id, U16), FHEX(args0, U64), FHEX(args1, U64), FHEX(args2, U64),
	FHEX(args3, U64), FHEX(args4, U64), FHEX(args5, U64),
};

static const struct ivtrace_field f_sys_exit[] = { FLD(id, U16), FLD(ret, S64) };
static const struct ivtrace_field f_printk[] = { FLD(msg, STRING) };

static const struct ivtrace_field f_fork[] = {
	FTID(parent_tid), FLD(parent_pid, U32), FCHARS(child_comm, TASK_COMM_LEN),
	FLD(child_tid, U32), FLD(child_pid, U32),
};

static const struct ivtrace_field f_exec[] = {
	FLD(filename, STRING), FLD(tid, U32), FLD(old_tid, U32),
	FCHARS(comm, TASK_COMM_LEN),
};

static const struct ivtrace_field f_process[] = { FTID(tid), FLD(prio, S8) };

static const struct ivtrace_field f_rename[] = {
	FLD(tid, U32), FCHARS(newcomm, TASK_COMM_LEN),
};

static const struct ivtrace_field f_unused[] = { FLD(unused, U8) };

static const struct ivtrace_field f_process_state[] = {
	FLD(tid, U32), FLD(pid, U32), FLD(ppid, U32), FCHARS(name, TASK_COMM_LEN),
	FLD(type, S32), FLD(mode, S32), FLD(submode, S32), FLD(status, S32),
	FLD(cpu, S32),
};

static const struct ivtrace_field f_interrupt[] = {
	FLD(irq, U32), FLD(name, STRING), FLD(action, STRING),
};

static const struct ivtrace_field f_doorbell[] = { FLD(seq, U64), FLD(vector, U16) };

#define EV(_id, _name, _group, _f, _size)				\
	[_id] = { .name = _name, .group = IVTRACE_GROUP_##_group,	\
		  .fields = _f, .nr_fields = ARRAY_SIZE(_f),		\
		  .wire_size = _size }

/* wire_size: payload bytes (docs/abi.md's column minus the 4-byte header
 * and the padding to 4), 0 for events with a string.
 */
const struct ivtk_event_desc ivtk_events[IVTK_NR_EVENTS] = {
	EV(IVTK_EV_SCHED_SWITCH, "sched_switch", SCHED, f_sched_switch, 12),
	EV(IVTK_EV_SCHED_WAKEUP, "sched_wakeup", SCHED, f_sched_wakeup, 7),
	EV(IVTK_EV_IRQ_HANDLER_ENTRY, "irq_handler_entry", IRQ, f_irq_entry, 4),
	EV(IVTK_EV_IRQ_HANDLER_EXIT, "irq_handler_exit", IRQ, f_irq_exit, 8),
	EV(IVTK_EV_SOFTIRQ_ENTRY, "irq_softirq_entry", IRQ, f_softirq, 1),
	EV(IVTK_EV_SOFTIRQ_EXIT, "irq_softirq_exit", IRQ, f_softirq, 1),
	EV(IVTK_EV_HRTIMER_EXPIRE_ENTRY, "timer_hrtimer_expire_entry", TIMER,
	   f_hrtimer_entry, 24),
	EV(IVTK_EV_HRTIMER_EXPIRE_EXIT, "timer_hrtimer_expire_exit", TIMER,
	   f_hrtimer_exit, 8),
	EV(IVTK_EV_KMALLOC, "kmem_kmalloc", KMEM, f_kmalloc, 28),
	EV(IVTK_EV_KFREE, "kmem_kfree", KMEM, f_kfree, 16),
	EV(IVTK_EV_MM_PAGE_ALLOC, "kmem_mm_page_alloc", KMEM, f_page_alloc, 20),
	EV(IVTK_EV_MM_PAGE_FREE, "kmem_mm_page_free", KMEM, f_page_free, 12),
	EV(IVTK_EV_SYSCALL_ENTRY, "syscall_entry", SYSCALL, f_sys_entry, 50),
	EV(IVTK_EV_SYSCALL_EXIT, "syscall_exit", SYSCALL, f_sys_exit, 10),
	EV(IVTK_EV_PRINTK_CONSOLE, "printk_console", PRINTK, f_printk, 0),
	EV(IVTK_EV_SCHED_WAKEUP_NEW, "sched_wakeup_new", SCHED, f_sched_wakeup, 7),
	EV(IVTK_EV_SCHED_PROCESS_FORK, "sched_process_fork", SCHED, f_fork, 32),
	EV(IVTK_EV_SCHED_PROCESS_EXEC, "sched_process_exec", SCHED, f_exec, 0),
	EV(IVTK_EV_SCHED_PROCESS_EXIT, "sched_process_exit", SCHED, f_process, 5),
	EV(IVTK_EV_SCHED_PROCESS_FREE, "sched_process_free", SCHED, f_process, 5),
	EV(IVTK_EV_TASK_RENAME, "task_rename", SCHED, f_rename, 20),
	EV(IVTK_EV_STATEDUMP_START, "lttng_statedump_start", ALWAYS, f_unused, 1),
	EV(IVTK_EV_STATEDUMP_END, "lttng_statedump_end", ALWAYS, f_unused, 1),
	EV(IVTK_EV_STATEDUMP_PROCESS_STATE, "lttng_statedump_process_state",
	   ALWAYS, f_process_state, 48),
	EV(IVTK_EV_STATEDUMP_INTERRUPT, "lttng_statedump_interrupt", ALWAYS,
	   f_interrupt, 0),
	EV(IVTK_EV_DOORBELL, "ivtrace_doorbell", ALWAYS, f_doorbell, 10),
};

static_assert(TASK_COMM_LEN == 16, "comm fields are char[16] on the wire");
static_assert(IVTK_NR_EVENTS == IVTRACE_KAPI_FIRST_ID,
	      "kernel API ids follow the kernel events");
