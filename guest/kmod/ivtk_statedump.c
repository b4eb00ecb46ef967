// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_statedump.c - describe the threads and interrupts that exist, so
 * the host can name the thread ids of sched_switch (which carries no
 * names) and the irq numbers of irq_handler_entry. Emitted at load and on
 * IVT_CMD_STATEDUMP, with LTTng's event names and enum values
 * (lttng-modules src/lttng-statedump-impl.c).
 */
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

static void ivtk_dump_thread(struct task_struct *t)
{
	struct ivt_writer *w;
	unsigned long flags;
	u8 *p;

	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_STATEDUMP_PROCESS_STATE,
			 IVT_KEV_STATEDUMP_PROCESS_STATE_SIZE);
	if (p) {
		p = ivt_put_u32(p, t->pid);
		p = ivt_put_u32(p, t->tgid);
		p = ivt_put_u32(p, rcu_dereference(t->real_parent)->tgid);
		p = ivt_put_chars(p, t->comm, TASK_COMM_LEN);
		p = ivt_put_u32(p, t->flags & PF_KTHREAD ?
				 LTTNG_KERNEL_THREAD : LTTNG_USER_THREAD);
		p = ivt_put_u32(p, LTTNG_MODE_UNKNOWN);
		p = ivt_put_u32(p, LTTNG_SUBMODE_UNKNOWN);
		p = ivt_put_u32(p, ivtk_thread_status(t));
		ivt_put_u32(p, task_cpu(t));
		ivtk_commit(w);
	}
	local_irq_restore(flags);
}

static void ivtk_dump_threads(void)
{
	struct task_struct *g, *t;

	rcu_read_lock();
	for_each_process_thread(g, t)
		ivtk_dump_thread(t);
	rcu_read_unlock();
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
		ivt_put_string(p, action, na);
		ivtk_commit(w);
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
	unsigned int irq;

	for (irq = 0; irq < nr_irqs; irq++) {
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

/* Process context; events land on whichever CPUs it runs on. */
void ivtk_statedump(void)
{
	ivtk_emit_u8(IVT_KEV_STATEDUMP_START, 0);
	ivtk_dump_threads();
	ivtk_dump_irqs();
	ivtk_emit_u8(IVT_KEV_STATEDUMP_END, 0);
}
