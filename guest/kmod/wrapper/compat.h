/* SPDX-License-Identifier: GPL-2.0 */
/*
 * wrapper/compat.h - every kernel-version difference ivtrace.ko depends on.
 *
 * Core code never tests LINUX_VERSION_CODE; it uses the names below. Each
 * shim says which kernel changed what. Built and tested against Debian's
 * 6.1 (bookworm), 6.12 (trixie) and the newest 7.x of trixie-backports
 * (docs/guest-kernel.md "Kernels"); the other branches follow the upstream
 * changes named beside them.
 *
 * A version switch is a guess about a prototype; the probes are checked
 * against the kernel's own tracepoint prototypes at build time
 * (ivtk_probes.c, IVTK_PROBES), so a wrong guess fails the build, never
 * the guest. Distribution kernels also take API changes into a stable
 * series (Debian's 6.12.117 has system_dfl_wq, upstream 6.12.0 does not):
 * where both names exist, the older one is used until the kernel that
 * needs the newer one.
 */
#ifndef IVTK_WRAPPER_COMPAT_H
#define IVTK_WRAPPER_COMPAT_H

#include <linux/version.h>
#include <linux/irqnr.h>
#include <linux/ktime.h>
#include <linux/timer.h>
#include <linux/workqueue.h>

/*
 * sched_switch gained its 4th argument, prev_state, in v5.18
 * ("sched/tracing: Don't re-read p->state when emitting sched_switch
 * event"); __task_state_index() exists since v5.14. Older kernels are not
 * supported.
 */
#if LINUX_VERSION_CODE < KERNEL_VERSION(5, 18, 0)
#error "ivtrace.ko needs Linux >= 5.18 (4-argument sched_switch tracepoint)"
#endif

/*
 * kmalloc: v6.1 folded kmalloc_node into kmalloc and added the `node`
 * argument ("mm/slab_common: unify NUMA and UMA version of
 * tracepoints").
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 1, 0)
#define IVTK_KMALLOC_PROTO(probe)					\
	void probe(void *data, unsigned long call_site, const void *ptr,	\
		   size_t bytes_req, size_t bytes_alloc, gfp_t gfp_flags,	\
		   int node)
#else
#define IVTK_KMALLOC_PROTO(probe)					\
	void probe(void *data, unsigned long call_site, const void *ptr,	\
		   size_t bytes_req, size_t bytes_alloc, gfp_t gfp_flags)
#endif

/*
 * sched_process_exit gained `group_dead` (the thread group's last thread
 * exits) in v6.16 ("exit: move and extend sched_process_exit()
 * tracepoint"), and fires before exit_mm() since then.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 16, 0)
#define IVTK_SCHED_PROCESS_EXIT_PROTO(probe)				\
	void probe(void *data, struct task_struct *t, bool group_dead)
#else
#define IVTK_SCHED_PROCESS_EXIT_PROTO(probe)				\
	void probe(void *data, struct task_struct *t)
#endif

/*
 * hrtimer_expire_entry passes the time it expires the timer at by value
 * since v7.1; before, a pointer to it. A probe with the other prototype
 * dereferences a ktime_t as an address: the page fault in
 * ivtk_hrtimer_expire_entry that crashed 7.x guests before the probes
 * were type-checked. ivtk_hrtimer_now() reads it either way.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(7, 1, 0)
#define IVTK_HRTIMER_EXPIRE_ENTRY_PROTO(probe)				\
	void probe(void *data, struct hrtimer *t, ktime_t now)
#define ivtk_hrtimer_now(now)	(now)
#else
#define IVTK_HRTIMER_EXPIRE_ENTRY_PROTO(probe)				\
	void probe(void *data, struct hrtimer *t, ktime_t *now)
#define ivtk_hrtimer_now(now)	(*(now))
#endif

/*
 * nr_irqs is no longer exported since v6.13 ("genirq: Unexport nr_irqs"):
 * irq_get_nr_irqs() reads it.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
#define ivtk_nr_irqs()		irq_get_nr_irqs()
#else
#define ivtk_nr_irqs()		((unsigned int)nr_irqs)
#endif

/*
 * The workqueue for work that may run on any CPU (the control poll, the
 * vmsync exchange): an unbound one. v6.17 added system_dfl_wq
 * ("workqueue: Add system_percpu_wq and system_dfl_wq") to replace
 * system_unbound_wq and system_wq, which 7.x marks deprecated: queueing
 * on them prints "work func ... enqueued on deprecated workqueue" once.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
#define ivtk_wq			system_dfl_wq
#else
#define ivtk_wq			system_unbound_wq
#endif

/* <asm/unaligned.h> moved to <linux/unaligned.h> in v6.12. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 12, 0)
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

/* from_timer() was renamed timer_container_of() in v6.16. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 16, 0)
#define ivtk_from_timer(var, t, field)	timer_container_of(var, t, field)
#else
#define ivtk_from_timer(var, t, field)	from_timer(var, t, field)
#endif

#endif /* IVTK_WRAPPER_COMPAT_H */
