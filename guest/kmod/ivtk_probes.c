// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_probes.c - probes on the kernel's tracepoints, by group.
 *
 * Tracepoints are found by name with for_each_kernel_tracepoint() (the
 * lttng-modules way; no EXPORT_TRACEPOINT_SYMBOL needed) and attached with
 * tracepoint_probe_register(), which takes the probe as a void * and so
 * cannot check its prototype. The build does: IVTK_PROBES below lists
 * every probe with its tracepoint once, and each one is compared with
 * the prototype this kernel's own headers declare for that tracepoint
 * (check_trace_callback_type_<tracepoint>(), which DECLARE_TRACE makes
 * for exactly this), so a tracepoint whose arguments changed fails the
 * build instead of the guest. Version-dependent prototypes are in
 * wrapper/compat.h.
 *
 * Probes may nest in interrupts (the printk one even in NMIs), and run
 * preemptible where the kernel allows it: system call tracepoints may
 * fault since v6.13, and in 7.x every tracepoint runs under SRCU
 * rather than with preemption off. So a probe touches nothing per CPU
 * before it pins itself: each one writes with interrupts off
 * (ivtk_reserve()). A group is attached and detached as a whole, from
 * process context, under ivtk_mutex.
 */
#include <linux/irq.h>
#include <linux/interrupt.h>
#include <linux/hrtimer.h>
#include <linux/kernel.h>
#include <linux/binfmts.h>
#include <linux/compat.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/sched/prio.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/tracepoint.h>

/* The kernel's declarations of the tracepoints probed below. */
#include <trace/events/sched.h>
#include <trace/events/task.h>
#include <trace/events/irq.h>
#include <asm/trace/irq_vectors.h>
#include <trace/events/timer.h>
#include <trace/events/kmem.h>
#include <trace/events/syscalls.h>
#include <trace/events/printk.h>

#include "ivtk.h"

const char *const ivtk_group_names[IVTRACE_NR_GROUPS] = {
	[IVTRACE_GROUP_SCHED] = "sched",
	[IVTRACE_GROUP_IRQ] = "irq",
	[IVTRACE_GROUP_TIMER] = "timer",
	[IVTRACE_GROUP_KMEM] = "kmem",
	[IVTRACE_GROUP_SYSCALL] = "syscall",
	[IVTRACE_GROUP_PRINTK] = "printk",
};

/* Priorities as LTTng records them: 0..139 -> -100..39. */
static __always_inline s8 ivtk_prio(const struct task_struct *t)
{
	return (s8)(t->prio - MAX_RT_PRIO);
}

/*
 * prev_state of sched_switch as lttng-modules (2.10 on) and Linux's own
 * __trace_sched_switch_state() write it: TASK_REPORT_MAX for a preempted
 * task, else the __task_state_index() bit (0: it was running).
 */
static __always_inline u16 ivtk_prev_state(bool preempt, unsigned int state,
					   const struct task_struct *p)
{
	unsigned int idx;

	BUILD_BUG_ON(TASK_REPORT_MAX > U16_MAX);
	if (preempt)
		return TASK_REPORT_MAX;
	idx = __task_state_index(state, p->exit_state);
	return idx ? 1u << (idx - 1) : 0;
}

/* ---- sched ------------------------------------------------------------ */

static void ivtk_sched_switch(void *data, bool preempt,
			      struct task_struct *prev,
			      struct task_struct *next,
			      unsigned int prev_state)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_SCHED_SWITCH,
			 IVT_KEV_SCHED_SWITCH_SIZE);
	if (p) {
		p = ivt_put_u32(p, prev->pid);
		p = ivt_put_u8(p, ivtk_prio(prev));
		p = ivt_put_u16(p, ivtk_prev_state(preempt, prev_state, prev));
		p = ivt_put_u32(p, next->pid);
		p = ivt_put_u8(p, ivtk_prio(next));
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static __always_inline void ivtk_wakeup(u32 id, struct task_struct *t)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	/* sched_wakeup and sched_wakeup_new have the same fields. */
	BUILD_BUG_ON(IVT_KEV_SCHED_WAKEUP_SIZE != IVT_KEV_SCHED_WAKEUP_NEW_SIZE);
	local_irq_save(flags);
	p = ivtk_reserve(&w, id, IVT_KEV_SCHED_WAKEUP_SIZE);
	if (p) {
		p = ivt_put_u32(p, t->pid);
		p = ivt_put_u8(p, ivtk_prio(t));
		p = ivt_put_u16(p, task_cpu(t));
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static void ivtk_sched_wakeup(void *data, struct task_struct *t)
{
	ivtk_wakeup(IVT_KEV_SCHED_WAKEUP, t);
}

static void ivtk_sched_wakeup_new(void *data, struct task_struct *t)
{
	ivtk_wakeup(IVT_KEV_SCHED_WAKEUP_NEW, t);
}

/* Pid namespace levels whose tid sched_process_fork lists (LTTng's cap). */
#define IVTK_PID_NS_LEVELS	32u

/*
 * @t's thread id in each pid namespace from the initial one down to its
 * own (LTTng's vtids). Returns how many.
 */
static u32 ivtk_vtids(struct task_struct *t, u32 *vtids)
{
	struct pid *pid = task_pid(t);
	u32 i, n;

	if (!pid)
		return 0;
	n = min_t(u32, pid->level + 1, IVTK_PID_NS_LEVELS);
	for (i = 0; i < n; i++)
		vtids[i] = pid->numbers[i].nr;
	return n;
}

static void ivtk_sched_process_fork(void *data, struct task_struct *parent,
				    struct task_struct *child)
{
	u32 vtids[IVTK_PID_NS_LEVELS];
	u32 nv = ivtk_vtids(child, vtids);
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_SCHED_PROCESS_FORK,
			 IVT_KEV_SCHED_PROCESS_FORK_SIZE + 4 * nv);
	if (p) {
		p = ivt_put_u32(p, parent->pid);
		p = ivt_put_u32(p, parent->tgid);
		p = ivt_put_u32(p, ivtk_pid_ns_inum(parent));
		p = ivt_put_chars(p, child->comm, TASK_COMM_LEN);
		p = ivt_put_u32(p, child->pid);
		p = ivt_put_bytes(p, vtids, 4 * nv);
		p = ivt_put_u32(p, child->tgid);
		p = ivt_put_u32(p, ivtk_pid_ns_inum(child));
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
	ivtk_name_set(child->pid, child->comm);
}

static void ivtk_sched_process_exec(void *data, struct task_struct *t,
				    pid_t old_pid, struct linux_binprm *bprm)
{
	size_t n = ivtk_strlen(bprm->filename, IVTK_STR_MAX - 1);
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_SCHED_PROCESS_EXEC,
			 IVT_KEV_SCHED_PROCESS_EXEC_SIZE + n);
	if (p) {
		p = ivt_put_string(p, bprm->filename, n);
		p = ivt_put_u32(p, t->pid);
		p = ivt_put_u32(p, old_pid);
		p = ivt_put_chars(p, t->comm, TASK_COMM_LEN);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
	ivtk_name_set(t->pid, t->comm);
}

static __always_inline void ivtk_process(u32 id, struct task_struct *t)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	/* sched_process_exit and _free have the same fields. */
	BUILD_BUG_ON(IVT_KEV_SCHED_PROCESS_EXIT_SIZE !=
		     IVT_KEV_SCHED_PROCESS_FREE_SIZE);
	local_irq_save(flags);
	p = ivtk_reserve(&w, id, IVT_KEV_SCHED_PROCESS_EXIT_SIZE);
	if (p) {
		p = ivt_put_u32(p, t->pid);
		p = ivt_put_u8(p, ivtk_prio(t));
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static IVTK_SCHED_PROCESS_EXIT_PROTO(ivtk_sched_process_exit)
{
	ivtk_process(IVT_KEV_SCHED_PROCESS_EXIT, t);
}

static void ivtk_sched_process_free(void *data, struct task_struct *t)
{
	ivtk_process(IVT_KEV_SCHED_PROCESS_FREE, t);
	ivtk_name_dead(t->pid);
}

static void ivtk_task_rename(void *data, struct task_struct *t,
			     const char *comm)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_TASK_RENAME,
			 IVT_KEV_TASK_RENAME_SIZE);
	if (p) {
		p = ivt_put_u32(p, t->pid);
		/* The new name as __set_task_comm() will store it: at most
		 * 15 bytes and NUL padding.
		 */
		strscpy_pad((char *)p, comm, TASK_COMM_LEN);
		ivtk_commit(w, p + TASK_COMM_LEN);
	}
	local_irq_restore(flags);
	ivtk_name_set(t->pid, comm);
}

/* ---- irq -------------------------------------------------------------- */

static void ivtk_irq_handler_entry(void *data, int irq,
				   struct irqaction *action)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_IRQ_HANDLER_ENTRY,
			 IVT_KEV_IRQ_HANDLER_ENTRY_SIZE);
	if (p) {
		p = ivt_put_u32(p, irq);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static void ivtk_irq_handler_exit(void *data, int irq,
				  struct irqaction *action, int ret)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_IRQ_HANDLER_EXIT,
			 IVT_KEV_IRQ_HANDLER_EXIT_SIZE);
	if (p) {
		p = ivt_put_u32(p, irq);
		p = ivt_put_u32(p, ret);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static void ivtk_softirq_entry(void *data, unsigned int vec)
{
	ivtk_emit_u8(IVT_KEV_SOFTIRQ_ENTRY, vec);
}

static void ivtk_softirq_exit(void *data, unsigned int vec)
{
	ivtk_emit_u8(IVT_KEV_SOFTIRQ_EXIT, vec);
}

/*
 * Every x86 interrupt vector's entry and exit (irq_vectors:*_entry/_exit):
 * @data is the event id, given at registration (ivtk_probes[]).
 */
static void ivtk_irq_vector(void *data, int vector)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, (u32)(uintptr_t)data,
			 IVT_KEV_LOCAL_TIMER_ENTRY_SIZE);
	if (p) {
		p = ivt_put_u32(p, vector);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

/* ---- timer ------------------------------------------------------------ */

static IVTK_HRTIMER_EXPIRE_ENTRY_PROTO(ivtk_hrtimer_expire_entry)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_HRTIMER_EXPIRE_ENTRY,
			 IVT_KEV_HRTIMER_EXPIRE_ENTRY_SIZE);
	if (p) {
		p = ivt_put_u64(p, (unsigned long)t);
		p = ivt_put_u64(p, ivtk_hrtimer_now(now));
		p = ivt_put_u64(p, (unsigned long)t->function);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static void ivtk_hrtimer_expire_exit(void *data, struct hrtimer *t)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_HRTIMER_EXPIRE_EXIT,
			 IVT_KEV_HRTIMER_EXPIRE_EXIT_SIZE);
	if (p) {
		p = ivt_put_u64(p, (unsigned long)t);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

/* ---- kmem ------------------------------------------------------------- */

static IVTK_KMALLOC_PROTO(ivtk_kmalloc)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_KMALLOC,
			 IVT_KEV_KMALLOC_SIZE);
	if (p) {
		p = ivt_put_u64(p, call_site);
		p = ivt_put_u64(p, (unsigned long)ptr);
		p = ivt_put_u32(p, bytes_req);
		p = ivt_put_u32(p, bytes_alloc);
		p = ivt_put_u32(p, (__force u32)gfp_flags);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static void ivtk_kfree(void *data, unsigned long call_site, const void *ptr)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_KFREE,
			 IVT_KEV_KFREE_SIZE);
	if (p) {
		p = ivt_put_u64(p, call_site);
		p = ivt_put_u64(p, (unsigned long)ptr);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static void ivtk_mm_page_alloc(void *data, struct page *page,
			       unsigned int order, gfp_t gfp_flags,
			       int migratetype)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_MM_PAGE_ALLOC,
			 IVT_KEV_MM_PAGE_ALLOC_SIZE);
	if (p) {
		p = ivt_put_u64(p, (unsigned long)page);
		/* A failed allocation has no page: pfn -1, as ftrace says. */
		p = ivt_put_u64(p, page ? page_to_pfn(page) : -1UL);
		p = ivt_put_u32(p, order);
		p = ivt_put_u32(p, (__force u32)gfp_flags);
		p = ivt_put_u32(p, migratetype);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

static void ivtk_mm_page_free(void *data, struct page *page,
			      unsigned int order)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_MM_PAGE_FREE,
			 IVT_KEV_MM_PAGE_FREE_SIZE);
	if (p) {
		p = ivt_put_u64(p, (unsigned long)page);
		p = ivt_put_u64(p, page_to_pfn(page));
		p = ivt_put_u32(p, order);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

/* ---- printk (printk_source=tracepoint) --------------------------------- */

static void ivtk_printk_console(void *data, const char *text, size_t len)
{
	ivtk_write_printk(text, len);
}

/* ---- registration ----------------------------------------------------- */

/*
 * The x86 vectors whose tracepoints this kernel's configuration declares
 * (arch/x86/include/asm/trace/irq_vectors.h has the same conditions).
 */
#ifdef CONFIG_IRQ_WORK
#define IVTK_VECTORS_IRQ_WORK(V)					\
	V(irq_work_entry, IRQ_WORK_ENTRY)				\
	V(irq_work_exit, IRQ_WORK_EXIT)
#else
#define IVTK_VECTORS_IRQ_WORK(V)
#endif
#ifdef CONFIG_SMP
#define IVTK_VECTORS_SMP(V)						\
	V(reschedule_entry, RESCHEDULE_ENTRY)				\
	V(reschedule_exit, RESCHEDULE_EXIT)				\
	V(call_function_single_entry, CALL_FUNCTION_SINGLE_ENTRY)	\
	V(call_function_single_exit, CALL_FUNCTION_SINGLE_EXIT)	\
	V(call_function_entry, CALL_FUNCTION_ENTRY)			\
	V(call_function_exit, CALL_FUNCTION_EXIT)
#else
#define IVTK_VECTORS_SMP(V)
#endif
#ifdef CONFIG_X86_MCE_THRESHOLD
#define IVTK_VECTORS_THRESHOLD(V)					\
	V(threshold_apic_entry, THRESHOLD_APIC_ENTRY)			\
	V(threshold_apic_exit, THRESHOLD_APIC_EXIT)
#else
#define IVTK_VECTORS_THRESHOLD(V)
#endif
#ifdef CONFIG_X86_MCE_AMD
#define IVTK_VECTORS_DEFERRED(V)					\
	V(deferred_error_apic_entry, DEFERRED_ERROR_APIC_ENTRY)	\
	V(deferred_error_apic_exit, DEFERRED_ERROR_APIC_EXIT)
#else
#define IVTK_VECTORS_DEFERRED(V)
#endif
#ifdef CONFIG_X86_THERMAL_VECTOR
#define IVTK_VECTORS_THERMAL(V)						\
	V(thermal_apic_entry, THERMAL_APIC_ENTRY)			\
	V(thermal_apic_exit, THERMAL_APIC_EXIT)
#else
#define IVTK_VECTORS_THERMAL(V)
#endif

/*
 * Every probe, once: P(tracepoint, probe, group) for a probe of its own,
 * V(tracepoint, event) for an x86 vector's entry or exit, written by
 * ivtk_irq_vector() with the event id as its data. Expanded twice below:
 * into the build-time check of each probe's prototype, and into the
 * registration table, so that no probe is registered unchecked.
 */
#define IVTK_PROBES(P, V)						\
	P(sched_switch, ivtk_sched_switch, SCHED)			\
	P(sched_wakeup, ivtk_sched_wakeup, SCHED)			\
	P(sched_wakeup_new, ivtk_sched_wakeup_new, SCHED)		\
	P(sched_process_fork, ivtk_sched_process_fork, SCHED)		\
	P(sched_process_exec, ivtk_sched_process_exec, SCHED)		\
	P(sched_process_exit, ivtk_sched_process_exit, SCHED)		\
	P(sched_process_free, ivtk_sched_process_free, SCHED)		\
	P(task_rename, ivtk_task_rename, SCHED)				\
	P(irq_handler_entry, ivtk_irq_handler_entry, IRQ)		\
	P(irq_handler_exit, ivtk_irq_handler_exit, IRQ)			\
	P(softirq_entry, ivtk_softirq_entry, IRQ)			\
	P(softirq_exit, ivtk_softirq_exit, IRQ)				\
	V(local_timer_entry, LOCAL_TIMER_ENTRY)				\
	V(local_timer_exit, LOCAL_TIMER_EXIT)				\
	IVTK_VECTORS_SMP(V)						\
	IVTK_VECTORS_IRQ_WORK(V)					\
	V(x86_platform_ipi_entry, IPI_ENTRY)				\
	V(x86_platform_ipi_exit, IPI_EXIT)				\
	V(spurious_apic_entry, SPURIOUS_APIC_ENTRY)			\
	V(spurious_apic_exit, SPURIOUS_APIC_EXIT)			\
	V(error_apic_entry, ERROR_APIC_ENTRY)				\
	V(error_apic_exit, ERROR_APIC_EXIT)				\
	IVTK_VECTORS_THRESHOLD(V)					\
	IVTK_VECTORS_DEFERRED(V)					\
	IVTK_VECTORS_THERMAL(V)						\
	P(hrtimer_expire_entry, ivtk_hrtimer_expire_entry, TIMER)	\
	P(hrtimer_expire_exit, ivtk_hrtimer_expire_exit, TIMER)		\
	P(kmalloc, ivtk_kmalloc, KMEM)					\
	P(kfree, ivtk_kfree, KMEM)					\
	P(mm_page_alloc, ivtk_mm_page_alloc, KMEM)			\
	P(mm_page_free, ivtk_mm_page_free, KMEM)			\
	P(sys_enter, ivtk_sys_enter, SYSCALL)				\
	P(sys_exit, ivtk_sys_exit, SYSCALL)				\
	P(console, ivtk_printk_console, PRINTK)

/*
 * The build-time check: the probe's type must be the one the kernel's
 * DECLARE_TRACE gives check_trace_callback_type_<tracepoint>()'s
 * parameter, void (*)(void *data, <TP_PROTO>). C's compatibility rules
 * make any difference an error: a pointer for a value, bool for int, a
 * missing or added argument.
 */
#define IVTK_CHECK_PROBE(_tp, _func, _group)				\
	static_assert(__builtin_types_compatible_p(			\
		typeof(check_trace_callback_type_##_tp),		\
		void (typeof(_func) *)),				\
		#_func "() does not match the TP_PROTO of tracepoint " #_tp	\
		" in these kernel headers: adapt the probe (wrapper/compat.h)");
#define IVTK_CHECK_VECTOR(_tp, _id) IVTK_CHECK_PROBE(_tp, ivtk_irq_vector, IRQ)

IVTK_PROBES(IVTK_CHECK_PROBE, IVTK_CHECK_VECTOR)

struct ivtk_probe {
	const char *tp_name;
	void *func;
	void *data;			/* the probe's first argument */
	u32 group;
	struct tracepoint *tp;		/* found at init, NULL if absent */
	bool registered;		/* under ivtk_mutex */
};

#define IVTK_PROBE_ENTRY(_tp, _func, _group)				\
	{ .tp_name = #_tp, .func = _func, .group = IVTRACE_GROUP_##_group },
#define IVTK_VECTOR_ENTRY(_tp, _id)					\
	{ .tp_name = #_tp, .func = ivtk_irq_vector,			\
	  .data = (void *)(uintptr_t)IVT_KEV_##_id, .group = IVTRACE_GROUP_IRQ },

static struct ivtk_probe ivtk_probes[] = {
	IVTK_PROBES(IVTK_PROBE_ENTRY, IVTK_VECTOR_ENTRY)
};

/* The console tracepoint is the printk group's source only with
 * printk_source=tracepoint; otherwise the console is.
 */
static bool ivtk_probe_wanted(const struct ivtk_probe *p)
{
	return p->func != ivtk_printk_console || ivtk_printk_tracepoint;
}

static void ivtk_find_tracepoint(struct tracepoint *tp, void *priv)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(ivtk_probes); i++)
		if (!strcmp(tp->name, ivtk_probes[i].tp_name))
			ivtk_probes[i].tp = tp;
}

/* Find the built-in tracepoints once, at module load. */
int ivtk_probes_init(void)
{
	unsigned int i, found = 0;

	for_each_kernel_tracepoint(ivtk_find_tracepoint, NULL);
	for (i = 0; i < ARRAY_SIZE(ivtk_probes); i++) {
		if (ivtk_probes[i].tp)
			found++;
		else if (ivtk_probe_wanted(&ivtk_probes[i]))
			pr_warn("ivtrace: tracepoint %s not found; its events (group %s) will be missing\n",
				ivtk_probes[i].tp_name,
				ivtk_group_names[ivtk_probes[i].group]);
	}
	return found ? 0 : -ENOENT;
}

int ivtk_parse_groups(const char *s, u32 *mask)
{
	char *buf, *cur, *tok;
	unsigned int g;
	int ret = 0;

	buf = kstrdup(s ?: "", GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	*mask = 0;
	cur = buf;
	while ((tok = strsep(&cur, ",")) != NULL) {
		tok = strim(tok);
		if (!*tok || !strcmp(tok, "none"))
			continue;
		if (!strcmp(tok, "all")) {
			*mask |= IVTK_GROUPS_ALL;
			continue;
		}
		for (g = 0; g < IVTRACE_NR_GROUPS; g++)
			if (!strcmp(tok, ivtk_group_names[g]))
				break;
		if (g == IVTRACE_NR_GROUPS) {
			pr_err("ivtrace: events=: unknown group '%s' (known: sched,irq,timer,kmem,syscall,printk,all,none)\n",
			       tok);
			ret = -EINVAL;
			break;
		}
		*mask |= BIT(g);
	}
	kfree(buf);
	return ret;
}

static void ivtk_group_detach(u32 group)
{
	unsigned int i;
	int ret;

	for (i = 0; i < ARRAY_SIZE(ivtk_probes); i++) {
		struct ivtk_probe *p = &ivtk_probes[i];

		if (p->group != group || !p->registered)
			continue;
		ret = tracepoint_probe_unregister(p->tp, p->func, p->data);
		WARN_ON_ONCE(ret);
		p->registered = false;
	}
}

static int ivtk_group_attach(u32 group)
{
	unsigned int i;
	int ret;

	for (i = 0; i < ARRAY_SIZE(ivtk_probes); i++) {
		struct ivtk_probe *p = &ivtk_probes[i];

		if (p->group != group || p->registered || !p->tp ||
		    !ivtk_probe_wanted(p))
			continue;
		ret = tracepoint_probe_register(p->tp, p->func, p->data);
		if (ret) {
			pr_err("ivtrace: tracepoint_probe_register(%s) failed: %d\n",
			       p->tp_name, ret);
			ivtk_group_detach(group);
			return ret;
		}
		p->registered = true;
	}
	return 0;
}

/*
 * Enable the groups in @mask (IVT_CMD_ENABLE, events=). Under ivtk_mutex.
 * The printk group has no tracepoint: the console checks ivtk_groups.
 */
int ivtk_groups_enable(u32 mask)
{
	u32 g;
	int ret;

	lockdep_assert_held(&ivtk_mutex);
	for (g = 0; g < IVTRACE_NR_GROUPS; g++) {
		if (!(mask & BIT(g)) || (ivtk_groups & BIT(g)))
			continue;
		ret = ivtk_group_attach(g);
		if (ret)
			return ret;
		WRITE_ONCE(ivtk_groups, ivtk_groups | BIT(g));
	}
	return 0;
}

/*
 * Disable the groups in @mask. Under ivtk_mutex. A probe already running
 * finishes its event; the caller that frees what probes touch must call
 * tracepoint_synchronize_unregister() first.
 */
void ivtk_groups_disable(u32 mask)
{
	u32 g;

	lockdep_assert_held(&ivtk_mutex);
	for (g = 0; g < IVTRACE_NR_GROUPS; g++) {
		if (!(mask & BIT(g)))
			continue;
		ivtk_group_detach(g);
		WRITE_ONCE(ivtk_groups, ivtk_groups & ~BIT(g));
	}
}
