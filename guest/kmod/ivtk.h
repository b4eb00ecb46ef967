/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ivtk.h - internals of ivtrace.ko, the guest kernel side of ivtrace.
 *
 * The module binds one ivshmem PCI device, formats its BAR2 as an ivtrace
 * region (docs/abi.md) and writes the kernel stream into per-CPU channels.
 * Every event is written by ivtk_reserve() / ivtk_commit() below, with
 * interrupts off on the writing CPU; an NMI that nests in a write is
 * dropped and counted by the shared writer protocol (ivtrace/writer.h).
 *
 * Files: ivtk_main.c (parameters, PCI driver, start/stop order),
 * ivtk_region.c (layout, format, metadata records, channel retirement),
 * ivtk_events.c (the kernel event table), ivtk_cpu.c (per-CPU writers,
 * flush timers, CPU hotplug), ivtk_probes.c (tracepoint probes, groups),
 * ivtk_syscalls.c (system call probes), ivtk_names.c (thread name table
 * for crash salvage), ivtk_statedump.c, ivtk_console.c,
 * ivtk_ctl.c (host control, MSI-X, doorbell), ivtk_sync.c (the clock
 * sync mailbox, answered by spinning), ivtk_cdev.c
 * (/dev/ivtrace), ivtk_kapi.c (API for other modules, include/ivtrace_kapi.h),
 * ivtk_relay.c (the ftrace relay's channels, requests and formats).
 */
#ifndef IVTK_H
#define IVTK_H

#include <linux/types.h>
#include <linux/percpu.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/hrtimer.h>
#include <linux/cpuhotplug.h>
#include <linux/miscdevice.h>
#include <linux/pci.h>
#include <linux/pid_namespace.h>
#include <linux/compiler.h>
#include <asm/msr.h>

#include "wrapper/compat.h"
#include <ivtrace/abi.h>
#include <ivtrace/writer.h>
#include <ivtrace/payload.h>
#include <ivtrace/kernel_events.h>
#include <ivtrace_kapi.h>

#ifndef CONFIG_X86
#error "ivtrace.ko timestamps with the x86 TSC"
#endif

#define IVTK_NAME		"ivtrace"

/* ivshmem BAR0 registers (QEMU docs/specs/ivshmem-spec.rst). */
#define IVSHMEM_REG_IVPOSITION	8
#define IVSHMEM_REG_DOORBELL	12

#define IVTK_META_SIZE		(256u << 10)	/* metadata area bytes */
#define IVTK_META_SIZE_FTRACE	(1024u << 10)	/* ... with the ftrace relay's formats */
/* One ftrace page event (extended header, u32 length, the page) must fit
 * in an empty packet, whose last byte stays unused (ivtrace/writer.h).
 */
#define IVTK_FTRACE_SUBBUF_MIN	8192u
#define IVTK_NAMES_NR		4096u		/* thread name table entries (128 KiB) */
#define IVTK_STR_MAX		256u		/* file names, irq names */
#define IVTK_CONSOLE_MAX	2048u		/* one console line */

/* The kernel stream's events: IVT_KEV_* of ivtrace/kernel_events.h. */
#define IVTK_NR_EVENTS		IVT_KEV_COUNT

#define IVTK_GROUPS_ALL		((1u << IVTRACE_NR_GROUPS) - 1)

struct ivtk_event_desc {
	const char *name;
	u32 group;			/* IVTRACE_GROUP_* */
	const struct ivtrace_field *fields;
	unsigned int nr_fields;
};

/*
 * The bound device. One at a time: ivtk_dev points to it while a region
 * is formatted and live. Allocated with devm_kzalloc; everything that can
 * reach it asynchronously (probes, console, timers, work, interrupt,
 * /dev/ivtrace) is stopped before remove() returns.
 */
struct ivtk_dev {
	struct pci_dev *pdev;
	void __iomem *regs;		/* BAR0: ivshmem registers (UC) */
	void *shm;			/* BAR2: the region, mapped write-back */
	phys_addr_t shm_phys;
	u64 shm_len;			/* power of two */
	/*
	 * Private copy of the layout we formatted. Shared memory is never
	 * read back as an offset, a size or an index.
	 */
	struct ivt_layout layout;
	unsigned int gen;		/* tells /dev/ivtrace files of an older binding apart */

	/* Parameters captured at probe time. */
	u32 subbuf_size, nr_subbufs, user_channels, mode, flush_ms, groups;
	u32 nr_ftrace;			/* ftrace relay channels (0: no relay) */

	bool doorbell;			/* ivshmem-doorbell: MSI-X + BAR0 doorbell */
	int irq;			/* MSI-X vector 0, or -1 (poll only) */
	int hp_state;			/* cpuhp dynamic state, or 0 */
	int hp_dead_state;		/* cpuhp state closing a dead CPU's packet */
	bool console_on, cdev_on, ctl_on;

	struct delayed_work ctl_work;	/* control poll, every poll_jiffies */
	unsigned long poll_jiffies;
	u64 ctl_seq;			/* last cmd_seq acted on (private) */
	/* Clock sync (ivtk_sync.c): bit 0 of sync_busy lets one context in. */
	unsigned long sync_busy;
	u64 sync_seq;			/* last req_seq answered (private) */
	u64 sync_patience, sync_budget;	/* IVT_SYNC_*_NS in TSC ticks */
	u64 sync_spun;			/* TSC ticks spent in the exchange */
	bool sync_pause;		/* spin with PAUSE (not under TCG) */
	struct hrtimer sync_timer;	/* no MSI-X: enters every sync_period */
	ktime_t sync_period;
	bool sync_timer_on;

	struct miscdevice misc;		/* /dev/ivtrace */
};

/*
 * ivtk_mutex (ivtk_main.c) protects ivtk_dev, the enabled groups (probe
 * registration) and the kernel API registrations. Process context only.
 * It nests outside tracepoints_mutex (tracepoint_probe_register),
 * console_lock (register_console), cpu_hotplug_lock (cpuhp_setup_state),
 * misc_mtx (misc_register) and ivtk_files_lock (ivtk_cdev.c). Nothing
 * that runs in a probe, an interrupt, a timer, a cpuhp callback or a
 * /dev/ivtrace file operation takes it. The other locks: d->sync_busy
 * (a bit lock only ever tried, never waited for) and desc->lock (irq
 * descriptors, taken by the state dump; takes nothing of ours).
 */
extern struct mutex ivtk_mutex;
extern struct ivtk_dev *ivtk_dev;
extern bool ivtk_live;			/* writers may write (load-acquire) */
extern u32 ivtk_groups;			/* groups enabled (READ_ONCE) */
extern const char *const ivtk_group_names[IVTRACE_NR_GROUPS];
extern const struct ivtk_event_desc ivtk_events[IVTK_NR_EVENTS];

DECLARE_PER_CPU(struct ivt_writer, ivtk_writer);

/* ---- write path ------------------------------------------------------ */

void ivtk_ring_host(struct ivt_writer *w);

/* Internal helper: leave the write path, ringing the host if a packet
 * closed while it slept. No reservation is open here, so the ring can
 * still write its ivtrace_doorbell event in the same write section.
 */
static __always_inline void ivtk_leave(struct ivt_writer *w)
{
	if (unlikely(w->wake_host)) {
		w->wake_host = 0;
		ivtk_ring_host(w);
	}
	ivt_writer_exit(w);
}

/*
 * Reserve @len payload bytes for event @id on this CPU's channel.
 * Interrupts must be off. Returns where to write the payload (then call
 * ivtk_commit() with *@wp), or NULL when nothing is to be written: no live
 * region, or the event was dropped and counted.
 */
static __always_inline u8 *ivtk_reserve(struct ivt_writer **wp, u32 id,
					u32 len)
{
	struct ivt_writer *w;
	u8 *p;

	/* Pairs with the store-release in ivtk_start(): a writer that sees
	 * the region live sees its CPU's writer bound to it.
	 */
	if (unlikely(!smp_load_acquire(&ivtk_live)))
		return NULL;
	w = this_cpu_ptr(&ivtk_writer);
	if (unlikely(!ivt_writer_enter(w)))
		return NULL;
	p = ivt_writer_reserve(w, rdtsc(), id, len);
	if (unlikely(!p)) {
		ivtk_leave(w);
		return NULL;
	}
	*wp = w;
	return p;
}

/*
 * Commit the event reserved last, whose payload the probe wrote up to
 * @end. A probe that wrote another layout than its event's one definition
 * (ivtrace/kernel_events.h, from which the reservation's size comes) warns
 * once: every guest test fails on a WARNING in dmesg.
 */
static __always_inline void ivtk_commit(struct ivt_writer *w, const u8 *end)
{
	WARN_ON_ONCE(end != w->pkt + w->cur_end);
	ivt_writer_commit(w);
	ivtk_leave(w);
}

/* Payloads are written with ivt_put_*() (ivtrace/payload.h). */

/* Write an event whose payload is one u8 (softirq vector, state dump
 * start and end), interrupts off as every event (see the top).
 */
static __always_inline void ivtk_emit_u8(u32 id, u8 v)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, id, sizeof(v));
	if (p) {
		p = ivt_put_u8(p, v);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

/* The inode number of @t's pid namespace (LTTng's ns_inum), 0 if it has
 * none (a task being torn down). Callers hold RCU or a reference to @t.
 */
static inline u32 ivtk_pid_ns_inum(struct task_struct *t)
{
	struct pid_namespace *ns = task_active_pid_ns(t);

	return ns ? ns->ns.inum : 0;
}

/* Length of @s for an IVT_FT_STRING field, capped at @max. */
static inline size_t ivtk_strlen(const char *s, size_t max)
{
	return s ? strnlen(s, max) : 0;
}

/* Write a printk_console event (ivtk_console.c). */
void ivtk_write_printk(const char *s, size_t n);
extern bool ivtk_printk_tracepoint;	/* printk_source=tracepoint */

/* ---- ivtk_region.c ---------------------------------------------------- */

int ivtk_region_setup(struct ivtk_dev *d);
void ivtk_region_close(struct ivtk_dev *d);
int ivtk_meta_publish(struct ivtk_dev *d, u32 id, u32 group, const char *name,
		      const struct ivtrace_field *fields, unsigned int nr);
int ivtk_meta_publish_ftrace(struct ivtk_dev *d, u32 what, const char *system,
			     const char *text, u32 len);
struct ivt_channel *ivtk_channel(struct ivtk_dev *d, u32 chan);
void ivtk_set_mode(struct ivtk_dev *d, u32 mode);
void ivtk_retire_user_channels(struct ivtk_dev *d, pid_t tgid);
u32 ivtk_fetch_add32(u32 *p, u32 v);
u64 ivtk_fetch_add64(u64 *p, u64 v);

/* ---- ivtk_cpu.c ------------------------------------------------------- */

void ivtk_writers_init(struct ivtk_dev *d);
int ivtk_cpus_start(struct ivtk_dev *d);
void ivtk_cpus_stop(struct ivtk_dev *d);
void ivtk_flush_all(void);

/* ---- ivtk_probes.c ---------------------------------------------------- */

int ivtk_probes_init(void);
int ivtk_parse_groups(const char *s, u32 *mask);
int ivtk_groups_enable(u32 mask);
void ivtk_groups_disable(u32 mask);

/* ---- ivtk_syscalls.c: the sys_enter / sys_exit probes ------------------ */

struct pt_regs;
void ivtk_sys_enter(void *data, struct pt_regs *regs, long id);
void ivtk_sys_exit(void *data, struct pt_regs *regs, long ret);

/* ---- ivtk_names.c: the thread name table ------------------------------ */

int ivtk_names_start(struct ivtk_dev *d);
void ivtk_names_stop(void);
void ivtk_name_set(u32 tid, const char *comm);
void ivtk_name_dead(u32 tid);

/* ---- ivtk_statedump.c, ivtk_console.c --------------------------------- */

void ivtk_statedump(struct ivtk_dev *d);
void ivtk_console_register(struct ivtk_dev *d);
void ivtk_console_unregister(struct ivtk_dev *d);

/* ---- ivtk_ctl.c ------------------------------------------------------- */

void ivtk_ctl_init(struct ivtk_dev *d);
int ivtk_ctl_start(struct ivtk_dev *d);
void ivtk_ctl_stop(struct ivtk_dev *d);
void ivtk_ring_doorbell(struct ivtk_dev *d);

/* ---- ivtk_sync.c ------------------------------------------------------ */

void ivtk_sync_init(struct ivtk_dev *d);
void ivtk_sync_exchange(struct ivtk_dev *d);
void ivtk_sync_start(struct ivtk_dev *d, unsigned int period_ms);
void ivtk_sync_stop(struct ivtk_dev *d);

/* ---- ivtk_cdev.c ------------------------------------------------------ */

int ivtk_cdev_register(struct ivtk_dev *d);
void ivtk_cdev_unregister(struct ivtk_dev *d);

/* ---- ivtk_relay.c ----------------------------------------------------- */

void ivtk_relay_bind(struct ivtk_dev *d);
void ivtk_relay_unbind(struct ivtk_dev *d);
int ivtk_relay_post(struct ivtk_dev *d, u64 seq, u64 arg);
void ivtk_relay_cancel(void);
long ivtk_relay_ioctl(const void *file, unsigned int gen, unsigned int cmd,
		      unsigned long arg);
void ivtk_relay_release(const void *file);
void ivtk_relay_spawn(struct ivtk_dev *d, const char *path);

/* ---- ivtk_hypercall.c: hypercall channel and vmsync (KVM only) -------- */

void ivtk_hypercall_init(void);
void ivtk_vmsync_start(struct ivtk_dev *d);
void ivtk_vmsync_stop(void);

/* ---- ivtk_kapi.c ------------------------------------------------------ */

int ivtk_kapi_publish_all(struct ivtk_dev *d);
void ivtk_kapi_exit(void);
bool ivtk_fields_valid(const struct ivtrace_field *f, unsigned int nr);

#endif /* IVTK_H */
