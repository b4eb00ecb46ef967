/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * ivtrace/kernel_events.h - the kernel stream's wire events: the one
 * definition.
 *
 * The guest kernel module registers these events on the kernel stream
 * (class 0) in this order, so an event's id is its position here, and
 * writes their payloads with the encoders of ivtrace/payload.h. Everything
 * else is derived from this table or checked against it:
 *
 *   - the module's event table and payload sizes (guest/kmod/ivtk_events.c,
 *     IVT_KEV_<ID>_SIZE below), by the preprocessor;
 *   - abi/kernel_events.json, printed by abi/tests/kernel_events.c;
 *     `make -C abi test` fails when the committed file is stale;
 *   - the table in docs/abi.md "Kernel stream", rendered from that JSON by
 *     abi/tools/kernel_events_doc.py (`make -C abi test` checks it too);
 *   - the host's Rust model of the events (KERNEL_EVENTS of the test utilities),
 *     compared with the JSON by a host unit test.
 *
 * IVT_KERNEL_EVENTS(EV, F, END) expands, for each event in id order,
 *   EV(ID, name, GROUP, "what the host makes of it")
 *   F(field, TYPE, FLAG, count)	once per field, in payload order
 *   END(ID)
 * TYPE is the IVT_FT_<TYPE> suffix; FLAG is PLAIN, HEX (IVT_FF_HEX) or TID
 * (IVT_FF_TID_COMM: the host inserts the thread's name before it); count is
 * the byte count of a CHARS field, else 0; GROUP is the IVTRACE_GROUP_<GROUP>
 * suffix (guest/kmod/include/ivtrace_kapi.h), ALWAYS for events no group
 * switches off.
 */
#ifndef IVTRACE_KERNEL_EVENTS_H
#define IVTRACE_KERNEL_EVENTS_H

#include "abi.h"
#include "payload.h"

#define IVT_KF_PLAIN	0u
#define IVT_KF_HEX	IVT_FF_HEX
#define IVT_KF_TID	IVT_FF_TID_COMM

#define IVT_KERNEL_EVENTS(EV, F, END)					\
	EV(SCHED_SWITCH, sched_switch, SCHED,				\
	   "prev_comm, next_comm; prios s32, prev_state s64")		\
		F(prev_tid, S32, TID, 0)				\
		F(prev_prio, S8, PLAIN, 0)				\
		F(prev_state, U16, PLAIN, 0)				\
		F(next_tid, S32, TID, 0)				\
		F(next_prio, S8, PLAIN, 0)				\
	END(SCHED_SWITCH)						\
	EV(SCHED_WAKEUP, sched_wakeup, SCHED, "comm; prio, target_cpu s32") \
		F(tid, S32, TID, 0)					\
		F(prio, S8, PLAIN, 0)					\
		F(target_cpu, U16, PLAIN, 0)				\
	END(SCHED_WAKEUP)						\
	EV(IRQ_HANDLER_ENTRY, irq_handler_entry, IRQ,			\
	   "`name` (string) after irq: the state dump's `action`")	\
		F(irq, S32, PLAIN, 0)					\
	END(IRQ_HANDLER_ENTRY)						\
	EV(IRQ_HANDLER_EXIT, irq_handler_exit, IRQ, "")			\
		F(irq, S32, PLAIN, 0)					\
		F(ret, S32, PLAIN, 0)					\
	END(IRQ_HANDLER_EXIT)						\
	EV(SOFTIRQ_ENTRY, irq_softirq_entry, IRQ, "vec u32")		\
		F(vec, U8, PLAIN, 0)					\
	END(SOFTIRQ_ENTRY)						\
	EV(SOFTIRQ_EXIT, irq_softirq_exit, IRQ, "vec u32")		\
		F(vec, U8, PLAIN, 0)					\
	END(SOFTIRQ_EXIT)						\
	EV(HRTIMER_EXPIRE_ENTRY, timer_hrtimer_expire_entry, TIMER, "")	\
		F(hrtimer, U64, HEX, 0)					\
		F(now, S64, PLAIN, 0)					\
		F(function, U64, HEX, 0)				\
	END(HRTIMER_EXPIRE_ENTRY)					\
	EV(HRTIMER_EXPIRE_EXIT, timer_hrtimer_expire_exit, TIMER, "")	\
		F(hrtimer, U64, HEX, 0)					\
	END(HRTIMER_EXPIRE_EXIT)					\
	EV(KMALLOC, kmem_kmalloc, KMEM, "bytes_req, bytes_alloc u64")	\
		F(call_site, U64, HEX, 0)				\
		F(ptr, U64, HEX, 0)					\
		F(bytes_req, U32, PLAIN, 0)				\
		F(bytes_alloc, U32, PLAIN, 0)				\
		F(gfp_flags, U32, PLAIN, 0)				\
	END(KMALLOC)							\
	EV(KFREE, kmem_kfree, KMEM, "")					\
		F(call_site, U64, HEX, 0)				\
		F(ptr, U64, HEX, 0)					\
	END(KFREE)							\
	EV(MM_PAGE_ALLOC, kmem_mm_page_alloc, KMEM, "")			\
		F(page, U64, HEX, 0)					\
		F(pfn, U64, PLAIN, 0)					\
		F(order, U32, PLAIN, 0)					\
		F(gfp_flags, U32, PLAIN, 0)				\
		F(migratetype, S32, PLAIN, 0)				\
	END(MM_PAGE_ALLOC)						\
	EV(MM_PAGE_FREE, kmem_mm_page_free, KMEM, "")			\
		F(page, U64, HEX, 0)					\
		F(pfn, U64, PLAIN, 0)					\
		F(order, U32, PLAIN, 0)					\
	END(MM_PAGE_FREE)						\
	EV(SYSCALL_ENTRY, syscall_entry, SYSCALL,			\
	   "`syscall_entry_<name>` with LTTng's fields (\"System calls\")") \
		F(id, U16, PLAIN, 0)					\
		F(args, BYTES, PLAIN, 0)				\
		F(strings, BYTES, PLAIN, 0)				\
	END(SYSCALL_ENTRY)						\
	EV(SYSCALL_EXIT, syscall_exit, SYSCALL,				\
	   "`syscall_exit_<name>` with LTTng's fields (\"System calls\")") \
		F(id, U16, PLAIN, 0)					\
		F(ret, S64, PLAIN, 0)					\
		F(args, BYTES, PLAIN, 0)				\
		F(data, BYTES, PLAIN, 0)				\
	END(SYSCALL_EXIT)						\
	EV(PRINTK_CONSOLE, printk_console, PRINTK,			\
	   "msg as LTTng's u64-counted text sequence")			\
		F(msg, STRING, PLAIN, 0)				\
	END(PRINTK_CONSOLE)						\
	EV(SCHED_WAKEUP_NEW, sched_wakeup_new, SCHED,			\
	   "comm; prio, target_cpu s32")				\
		F(tid, S32, TID, 0)					\
		F(prio, S8, PLAIN, 0)					\
		F(target_cpu, U16, PLAIN, 0)				\
	END(SCHED_WAKEUP_NEW)						\
	EV(SCHED_PROCESS_FORK, sched_process_fork, SCHED,		\
	   "parent_comm; vtids as LTTng's u8-counted s32 sequence")	\
		F(parent_tid, S32, TID, 0)				\
		F(parent_pid, S32, PLAIN, 0)				\
		F(parent_ns_inum, U32, PLAIN, 0)			\
		F(child_comm, CHARS, PLAIN, 16)				\
		F(child_tid, S32, PLAIN, 0)				\
		F(vtids, BYTES, PLAIN, 0)				\
		F(child_pid, S32, PLAIN, 0)				\
		F(child_ns_inum, U32, PLAIN, 0)				\
	END(SCHED_PROCESS_FORK)						\
	EV(SCHED_PROCESS_EXEC, sched_process_exec, SCHED,		\
	   "comm (the new name, for the host's naming) left out")	\
		F(filename, STRING, PLAIN, 0)				\
		F(tid, S32, PLAIN, 0)					\
		F(old_tid, S32, PLAIN, 0)				\
		F(comm, CHARS, PLAIN, 16)				\
	END(SCHED_PROCESS_EXEC)						\
	EV(SCHED_PROCESS_EXIT, sched_process_exit, SCHED, "comm; prio s32") \
		F(tid, S32, TID, 0)					\
		F(prio, S8, PLAIN, 0)					\
	END(SCHED_PROCESS_EXIT)						\
	EV(SCHED_PROCESS_FREE, sched_process_free, SCHED, "comm; prio s32") \
		F(tid, S32, TID, 0)					\
		F(prio, S8, PLAIN, 0)					\
	END(SCHED_PROCESS_FREE)						\
	EV(TASK_RENAME, task_rename, SCHED, "")				\
		F(tid, S32, PLAIN, 0)					\
		F(newcomm, CHARS, PLAIN, 16)				\
	END(TASK_RENAME)						\
	EV(STATEDUMP_START, lttng_statedump_start, ALWAYS, "")		\
	END(STATEDUMP_START)						\
	EV(STATEDUMP_END, lttng_statedump_end, ALWAYS, "")		\
	END(STATEDUMP_END)						\
	EV(STATEDUMP_PROCESS_STATE, lttng_statedump_process_state, ALWAYS, "") \
		F(tid, S32, PLAIN, 0)					\
		F(vtid, S32, PLAIN, 0)					\
		F(pid, S32, PLAIN, 0)					\
		F(vpid, S32, PLAIN, 0)					\
		F(ppid, S32, PLAIN, 0)					\
		F(vppid, S32, PLAIN, 0)					\
		F(name, CHARS, PLAIN, 16)				\
		F(type, S32, PLAIN, 0)					\
		F(mode, S32, PLAIN, 0)					\
		F(submode, S32, PLAIN, 0)				\
		F(status, S32, PLAIN, 0)				\
		F(ns_level, S32, PLAIN, 0)				\
		F(ns_inum, U32, PLAIN, 0)				\
		F(cpu, U32, PLAIN, 0)					\
	END(STATEDUMP_PROCESS_STATE)					\
	EV(STATEDUMP_INTERRUPT, lttng_statedump_interrupt, ALWAYS, "")	\
		F(irq, U32, PLAIN, 0)					\
		F(name, STRING, PLAIN, 0)				\
		F(action, STRING, PLAIN, 0)				\
	END(STATEDUMP_INTERRUPT)					\
	EV(DOORBELL, ivtrace_doorbell, ALWAYS, "")			\
		F(seq, U64, PLAIN, 0)					\
		F(vector, U16, PLAIN, 0)				\
	END(DOORBELL)							\
	EV(STATEDUMP_FILE_DESCRIPTOR, lttng_statedump_file_descriptor,	\
	   ALWAYS, "")							\
		F(pid, S32, PLAIN, 0)					\
		F(fd, S32, PLAIN, 0)					\
		F(flags, U32, PLAIN, 0)					\
		F(fmode, U32, HEX, 0)					\
		F(filename, STRING, PLAIN, 0)				\
	END(STATEDUMP_FILE_DESCRIPTOR)					\
	EV(STATEDUMP_BLOCK_DEVICE, lttng_statedump_block_device, ALWAYS, "") \
		F(dev, U32, PLAIN, 0)					\
		F(diskname, STRING, PLAIN, 0)				\
	END(STATEDUMP_BLOCK_DEVICE)					\
	IVT_KEV_VECTOR(EV, F, END, LOCAL_TIMER, local_timer)		\
	IVT_KEV_VECTOR(EV, F, END, RESCHEDULE, reschedule)		\
	IVT_KEV_VECTOR(EV, F, END, CALL_FUNCTION_SINGLE, call_function_single) \
	IVT_KEV_VECTOR(EV, F, END, CALL_FUNCTION, call_function)	\
	IVT_KEV_VECTOR(EV, F, END, IRQ_WORK, irq_work)			\
	IVT_KEV_VECTOR(EV, F, END, IPI, ipi)				\
	IVT_KEV_VECTOR(EV, F, END, SPURIOUS_APIC, spurious_apic)	\
	IVT_KEV_VECTOR(EV, F, END, ERROR_APIC, error_apic)		\
	IVT_KEV_VECTOR(EV, F, END, THRESHOLD_APIC, threshold_apic)	\
	IVT_KEV_VECTOR(EV, F, END, DEFERRED_ERROR_APIC, deferred_error_apic) \
	IVT_KEV_VECTOR(EV, F, END, THERMAL_APIC, thermal_apic)	\
	EV(VMSYNC_GH_GUEST, vmsync_gh_guest, ALWAYS,			\
	   "before the vmsync hypercall (KVM only, docs/kvm.md)")	\
		F(cnt, U32, PLAIN, 0)					\
		F(vm_uid, U64, PLAIN, 0)				\
	END(VMSYNC_GH_GUEST)						\
	EV(VMSYNC_HG_GUEST, vmsync_hg_guest, ALWAYS,			\
	   "after it, cnt + 1 (KVM only)")				\
		F(cnt, U32, PLAIN, 0)					\
		F(vm_uid, U64, PLAIN, 0)				\
	END(VMSYNC_HG_GUEST)

/*
 * An x86 interrupt vector's entry and exit (IRQ group), as lttng-modules
 * names them: x86_irq_vectors_<kind>_entry / _exit, one field `vector`
 * (int). Linux's tracepoints are <tracepoint>_entry / _exit; `ipi` is
 * Linux's x86_platform_ipi. Trace Compass shows them as IRQs of the CPU
 * they ran on. Ordered by how often a guest takes them: the first three
 * get the last compact ids.
 */
#define IVT_KEV_VECTOR(EV, F, END, ID, kind)				\
	EV(ID##_ENTRY, x86_irq_vectors_##kind##_entry, IRQ, "")	\
		F(vector, S32, PLAIN, 0)				\
	END(ID##_ENTRY)							\
	EV(ID##_EXIT, x86_irq_vectors_##kind##_exit, IRQ, "")		\
		F(vector, S32, PLAIN, 0)				\
	END(ID##_EXIT)

/* Internal helpers, don't use directly: the expansions below. */
#define __IVT_KEV_NOTHING(...)
#define __IVT_KEV_ID(id, name, group, doc)	IVT_KEV_##id,
#define __IVT_KEV_SIZE_OPEN(id, name, group, doc) IVT_KEV_##id##_SIZE = 0
#define __IVT_KEV_SIZE_FIELD(field, type, flag, count) \
	+ IVT_FT_##type##_SIZE + (count)
#define __IVT_KEV_SIZE_CLOSE(id)		,
#define __IVT_KEV_NR_OPEN(id, name, group, doc)	IVT_KEV_##id##_NR_FIELDS = 0
#define __IVT_KEV_NR_FIELD(field, type, flag, count) + 1

/* The kernel stream's event ids: IVT_KEV_SCHED_SWITCH = 0, ... */
enum ivt_kernel_event {
	IVT_KERNEL_EVENTS(__IVT_KEV_ID, __IVT_KEV_NOTHING, __IVT_KEV_NOTHING)
	IVT_KEV_COUNT
};

/*
 * IVT_KEV_<ID>_SIZE: payload bytes of the event's fixed part (a STRING
 * field counts its NUL, a BYTES field its length word; their text and
 * bytes come on top). What a probe reserves for an event without strings.
 */
enum ivt_kernel_event_size {
	IVT_KERNEL_EVENTS(__IVT_KEV_SIZE_OPEN, __IVT_KEV_SIZE_FIELD,
			  __IVT_KEV_SIZE_CLOSE)
};

/* IVT_KEV_<ID>_NR_FIELDS: the event's number of fields. */
enum ivt_kernel_event_nr_fields {
	IVT_KERNEL_EVENTS(__IVT_KEV_NR_OPEN, __IVT_KEV_NR_FIELD,
			  __IVT_KEV_SIZE_CLOSE)
};

#endif /* IVTRACE_KERNEL_EVENTS_H */
