/* SPDX-License-Identifier: GPL-2.0 */
/*
 * wrapper/compat.h - every kernel-version difference ivtrace.ko depends on.
 *
 * Core code never tests LINUX_VERSION_CODE; it uses the names below. Each
 * shim says which kernel changed what. Built and tested against Debian's
 * 6.1 (6.1.0-56-amd64); the other branches follow the upstream changes
 * named beside them.
 */
#ifndef IVTK_WRAPPER_COMPAT_H
#define IVTK_WRAPPER_COMPAT_H

#include <linux/version.h>
#include <linux/timer.h>
#include <linux/hrtimer.h>

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

/*
 * hrtimer_setup() replaced hrtimer_init() plus setting ->function in v6.13
 * ("hrtimers: Introduce hrtimer_setup() to replace hrtimer_init()");
 * hrtimer_init() is gone in 7.x.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
#define ivtk_hrtimer_setup(t, fn, clock, mode)	hrtimer_setup(t, fn, clock, mode)
#else
static inline void ivtk_hrtimer_setup(struct hrtimer *t,
				      enum hrtimer_restart (*fn)(struct hrtimer *),
				      clockid_t clock, enum hrtimer_mode mode)
{
	hrtimer_init(t, clock, mode);
	t->function = fn;
}
#endif

#endif /* IVTK_WRAPPER_COMPAT_H */
