// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_statedump.c - describe the threads, open files, block devices and
 * interrupts that exist, so that the host can name the thread ids of
 * sched_switch (which carries no names) and the irq numbers of
 * irq_handler_entry, and analyses can name files opened before tracing.
 * Emitted at load and on IVT_CMD_STATEDUMP, with the event names, fields
 * and enum values of lttng-modules 2.10's state dump.
 */
#include <linux/device.h>
#include <linux/fdtable.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/interrupt.h>
#include <linux/irq.h>
#include <linux/irqdesc.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>

#include "ivtk.h"

/* lttng-modules enum lttng_thread_type, lttng_execution_mode/submode,
 * lttng_process_status.
 */
#define LTTNG_USER_THREAD	0
#define LTTNG_KERNEL_THREAD	1
#define LTTNG_MODE_UNKNOWN	5
#define LTTNG_SUBMODE_UNKNOWN	1
#define LTTNG_WAIT_CPU		2
#define LTTNG_ZOMBIE		4
#define LTTNG_WAIT		5
#define LTTNG_DEAD		7
#define LTTNG_UNNAMED		0

static s32 ivtk_thread_status(struct task_struct *t)
{
	unsigned int state = READ_ONCE(t->__state);

	if (t->exit_state == EXIT_ZOMBIE)
		return LTTNG_ZOMBIE;
	if (t->exit_state == EXIT_DEAD)
		return LTTNG_DEAD;
	/* As LTTng: every runnable task is "waiting for a CPU"; the viewer
	 * learns which one runs from the next sched_switch.
	 */
	if (state == TASK_RUNNING)
		return LTTNG_WAIT_CPU;
	if (state & (TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE))
		return LTTNG_WAIT;
	return LTTNG_UNNAMED;
}

/*
 * One lttng_statedump_process_state per thread, seen from its own pid
 * namespace (vtid, vpid, vppid: its ids there; ns_level, ns_inum: that
 * namespace). LTTng writes one event per namespace level; a guest whose
 * threads all live in the initial namespace gets the same events. Under
 * RCU (the thread list and the parent pointer).
 */
static void ivtk_dump_thread(struct task_struct *t)
{
	struct task_struct *parent = rcu_dereference(t->real_parent);
	struct pid_namespace *ns = task_active_pid_ns(t);
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_STATEDUMP_PROCESS_STATE,
			 IVT_KEV_STATEDUMP_PROCESS_STATE_SIZE);
	if (p) {
		p = ivt_put_u32(p, t->pid);
		p = ivt_put_u32(p, ns ? task_pid_nr_ns(t, ns) : 0);
		p = ivt_put_u32(p, t->tgid);
		p = ivt_put_u32(p, ns ? task_tgid_nr_ns(t, ns) : 0);
		p = ivt_put_u32(p, parent->tgid);
		p = ivt_put_u32(p, ns ? task_tgid_nr_ns(parent, ns) : 0);
		p = ivt_put_chars(p, t->comm, TASK_COMM_LEN);
		p = ivt_put_u32(p, t->flags & PF_KTHREAD ?
				 LTTNG_KERNEL_THREAD : LTTNG_USER_THREAD);
		p = ivt_put_u32(p, LTTNG_MODE_UNKNOWN);
		p = ivt_put_u32(p, LTTNG_SUBMODE_UNKNOWN);
		p = ivt_put_u32(p, ivtk_thread_status(t));
		p = ivt_put_u32(p, ns ? ns->level : 0);
		p = ivt_put_u32(p, ns ? ns->ns.inum : 0);
		p = ivt_put_u32(p, task_cpu(t));
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
	ivtk_name_set(t->pid, t->comm);
}

static void ivtk_dump_threads(void)
{
	struct task_struct *g, *t;

	rcu_read_lock();
	for_each_process_thread(g, t)
		ivtk_dump_thread(t);
	rcu_read_unlock();
}

/* An event without payload (the state dump's start and end). */
static void ivtk_emit_empty(u32 id)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, id, 0);
	if (p)
		ivtk_commit(w, p);
	local_irq_restore(flags);
}

/* What iterate_fd() passes to ivtk_dump_fd(). */
struct ivtk_fd_ctx {
	char *page;			/* d_path() buffer, PAGE_SIZE */
	pid_t pid;
};

/* One lttng_statedump_file_descriptor. Called by iterate_fd() with the
 * file table's lock held: nothing here sleeps (d_path() does not).
 */
static int ivtk_dump_fd(const void *arg, struct file *file, unsigned int fd)
{
	const struct ivtk_fd_ctx *ctx = arg;
	const char *path = d_path(&file->f_path, ctx->page, PAGE_SIZE);
	struct ivt_writer *w;
	unsigned long flags;
	size_t n;
	u8 *p;

	if (IS_ERR(path))
		path = "";
	n = ivtk_strlen(path, IVTK_STR_MAX - 1);
	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_STATEDUMP_FILE_DESCRIPTOR,
			 IVT_KEV_STATEDUMP_FILE_DESCRIPTOR_SIZE + n);
	if (p) {
		p = ivt_put_u32(p, ctx->pid);
		p = ivt_put_u32(p, fd);
		p = ivt_put_u32(p, file->f_flags);
		p = ivt_put_u32(p, (__force u32)file->f_mode);
		p = ivt_put_string(p, path, n);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
	return 0;
}

/*
 * The open files of every process (threads share their leader's table).
 * task_lock() keeps ->files from being released under us (exit_files()
 * takes it); iterate_fd() holds the table's lock while it calls us.
 */
static void ivtk_dump_files(void)
{
	struct ivtk_fd_ctx ctx;
	struct task_struct *t;

	ctx.page = (char *)__get_free_page(GFP_KERNEL);
	if (!ctx.page) {
		pr_warn("ivtrace: state dump: no memory for file names; files not dumped\n");
		return;
	}
	rcu_read_lock();
	for_each_process(t) {
		task_lock(t);
		if (t->files) {
			ctx.pid = t->tgid;
			iterate_fd(t->files, 0, ivtk_dump_fd, &ctx);
		}
		task_unlock(t);
	}
	rcu_read_unlock();
	free_page((unsigned long)ctx.page);
}

/* One lttng_statedump_block_device for a disk or partition. */
static void ivtk_dump_block_device(struct device *dev)
{
	const char *name = dev_name(dev);
	size_t n = ivtk_strlen(name, IVTK_STR_MAX - 1);
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_STATEDUMP_BLOCK_DEVICE,
			 IVT_KEV_STATEDUMP_BLOCK_DEVICE_SIZE + n);
	if (p) {
		p = ivt_put_u32(p, dev->devt);	/* the kernel dev_t, as LTTng */
		p = ivt_put_string(p, name, n);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}

/*
 * Block devices (disks and partitions: class "block"). Linux does not
 * export its block class, but every registered device is on the devices
 * kset, which our own PCI device belongs to: walk that list under its
 * lock (nothing here sleeps).
 */
static void ivtk_dump_block_devices(struct ivtk_dev *d)
{
	struct kset *devices = d->pdev->dev.kobj.kset;
	struct kobject *k;

	if (!devices)
		return;
	spin_lock(&devices->list_lock);
	list_for_each_entry(k, &devices->list, entry) {
		struct device *dev = kobj_to_dev(k);

		if (dev->class && dev->class->name &&
		    !strcmp(dev->class->name, "block") && dev->devt)
			ivtk_dump_block_device(dev);
	}
	spin_unlock(&devices->list_lock);
}

/* One lttng_statedump_interrupt per action. Called with desc->lock held
 * and interrupts off.
 */
static void ivtk_dump_action(unsigned int irq, const char *chip,
			     const char *action)
{
	size_t nc = ivtk_strlen(chip, IVTK_STR_MAX - 1);
	size_t na = ivtk_strlen(action, IVTK_STR_MAX - 1);
	struct ivt_writer *w;
	u8 *p;

	p = ivtk_reserve(&w, IVT_KEV_STATEDUMP_INTERRUPT,
			 IVT_KEV_STATEDUMP_INTERRUPT_SIZE + nc + na);
	if (p) {
		p = ivt_put_u32(p, irq);
		p = ivt_put_string(p, chip, nc);
		p = ivt_put_string(p, action, na);
		ivtk_commit(w, p);
	}
}

/*
 * Interrupt descriptors are looked up with irq_get_irq_data() (exported;
 * irq_to_desc() is not) under RCU, which keeps a sparse descriptor alive
 * (free_desc() frees it with call_rcu()); desc->lock keeps its action
 * list still while we walk it, as __free_irq() unlinks under it.
 */
static void ivtk_dump_irqs(void)
{
	unsigned int irq, nr = ivtk_nr_irqs();

	for (irq = 0; irq < nr; irq++) {
		struct irqaction *action;
		struct irq_data *data;
		struct irq_desc *desc;
		struct irq_chip *chip;
		unsigned long flags;

		rcu_read_lock();
		data = irq_get_irq_data(irq);
		if (!data) {
			rcu_read_unlock();
			continue;
		}
		desc = irq_data_to_desc(data);
		raw_spin_lock_irqsave(&desc->lock, flags);
		chip = irq_desc_get_chip(desc);
		for (action = desc->action; action; action = action->next)
			ivtk_dump_action(irq, chip && chip->name ? chip->name : "",
					 action->name);
		raw_spin_unlock_irqrestore(&desc->lock, flags);
		rcu_read_unlock();
		cond_resched();
	}
}

/* Process context, @d bound; events land on whichever CPUs it runs on. */
void ivtk_statedump(struct ivtk_dev *d)
{
	ivtk_emit_empty(IVT_KEV_STATEDUMP_START);
	ivtk_dump_threads();
	ivtk_dump_files();
	ivtk_dump_block_devices(d);
	ivtk_dump_irqs();
	ivtk_emit_empty(IVT_KEV_STATEDUMP_END);
}
