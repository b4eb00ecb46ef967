// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_cpu.c - per-CPU writers, flush timers and CPU hotplug.
 *
 * Every possible CPU has a kernel channel and a writer bound to it at
 * format time; a CPU that comes online later just writes. A channel is
 * only ever written by its own CPU with interrupts off, which is the
 * single-writer exclusion ivtrace/writer.h asks for.
 *
 * A pinned timer per online CPU closes a partly filled packet once it has
 * stayed open for a whole flush interval, so the host sees a quiet CPU's
 * events within two intervals (discard mode; in overwrite mode packets
 * fill up, keeping the longest history). Hotplug starts the timer when a CPU comes
 * online and stops it (and closes the CPU's packet) when it goes away.
 *
 * A CPU going down still runs after its online-state teardown (the
 * scheduler switching to the stopper and to idle, interrupts until they
 * are migrated away) and writes those events into a new open packet.
 * Once the CPU is dead, a second state's teardown closes that packet from
 * the control CPU, so the host sees everything the CPU wrote while it is
 * away, and a CPU that never returns leaves no open packet behind.
 */
#include <linux/cpu.h>
#include <linux/jiffies.h>
#include <linux/smp.h>
#include <linux/timer.h>

#include "ivtk.h"

DEFINE_PER_CPU(struct ivt_writer, ivtk_writer);

struct ivtk_flush {
	struct timer_list timer;
	u64 seen_seq;		/* packet that held events at the last tick */
	bool seen;
};

static DEFINE_PER_CPU(struct ivtk_flush, ivtk_flush);
static unsigned long ivtk_flush_jiffies;	/* 0: no flush timer */

void ivtk_writers_init(struct ivtk_dev *d)
{
	unsigned int cpu;

	for_each_possible_cpu(cpu)
		ivt_writer_init(per_cpu_ptr(&ivtk_writer, cpu), d->shm,
				&d->layout, cpu, cpu, 0, 0);
}

/* Close this CPU's open packet if it holds events. Interrupts off. */
static void ivtk_flush_local(void *unused)
{
	struct ivt_writer *w = this_cpu_ptr(&ivtk_writer);

	if (!ivt_writer_enter(w))
		return;
	ivt_writer_flush(w);
	ivtk_leave(w);
}

/* IVT_CMD_FLUSH and teardown: every online CPU closes its packet (an
 * offline CPU closed its own when it went down).
 */
void ivtk_flush_all(void)
{
	on_each_cpu(ivtk_flush_local, NULL, 1);
}

static void ivtk_flush_tick(struct timer_list *t)
{
	struct ivtk_flush *f = ivtk_from_timer(f, t, timer);
	struct ivt_writer *w;
	unsigned long flags;

	local_irq_save(flags);
	w = this_cpu_ptr(&ivtk_writer);
	/*
	 * A timer interrupts nothing that is inside the write path (writers
	 * run with interrupts off), so a busy writer here was left busy by
	 * a bug: every later event of this CPU is dropped as "nested" (the
	 * channel is in effect disabled, and says so in lost_nested).
	 */
	if (WARN_ON_ONCE(w->busy)) {
		local_irq_restore(flags);
		return;
	}
	if (ivt_writer_enter(w)) {
		if (!w->pkt || !w->count || w->mode == IVT_MODE_OVERWRITE) {
			/* Nothing to flush; or a flight recorder, whose
			 * history closing half-empty packets would shorten
			 * (a snapshot reads the open packet's committed
			 * prefix anyway).
			 */
			f->seen = false;
		} else if (f->seen && f->seen_seq == w->seq) {
			/* Open with events since the last tick: flush. */
			ivt_writer_flush(w);
			f->seen = false;
		} else {
			f->seen = true;
			f->seen_seq = w->seq;
		}
		ivtk_leave(w);
	}
	local_irq_restore(flags);
	mod_timer(t, jiffies + ivtk_flush_jiffies);
}

/* cpuhp: runs on @cpu as it comes online. */
static int ivtk_cpu_online(unsigned int cpu)
{
	struct ivtk_flush *f = per_cpu_ptr(&ivtk_flush, cpu);

	f->seen = false;
	if (!ivtk_flush_jiffies)
		return 0;
	timer_setup(&f->timer, ivtk_flush_tick, TIMER_PINNED);
	f->timer.expires = jiffies + ivtk_flush_jiffies;
	add_timer_on(&f->timer, cpu);
	return 0;
}

/* cpuhp: runs on @cpu before it goes down (and for each online CPU when
 * the state is removed at unbind).
 */
static int ivtk_cpu_offline(unsigned int cpu)
{
	struct ivtk_flush *f = per_cpu_ptr(&ivtk_flush, cpu);
	unsigned long flags;

	if (ivtk_flush_jiffies)
		timer_delete_sync(&f->timer);
	local_irq_save(flags);
	if (smp_processor_id() == cpu) {
		ivtk_flush_local(NULL);
		local_irq_restore(flags);
	} else {
		local_irq_restore(flags);
		smp_call_function_single(cpu, ivtk_flush_local, NULL, 1);
	}
	return 0;
}

/* cpuhp (BP, dead): runs on the control CPU after @cpu is dead. The
 * channel has one writer, @cpu, and it is gone: closing its packet here
 * cannot race with it (nor with the host, which only reads committed
 * bytes). Not called at unbind (the state is removed without calls),
 * where every CPU is still alive.
 */
static int ivtk_cpu_dead(unsigned int cpu)
{
	struct ivt_writer *w = per_cpu_ptr(&ivtk_writer, cpu);
	unsigned long flags;

	local_irq_save(flags);
	if (ivt_writer_enter(w)) {
		ivt_writer_flush(w);
		ivtk_leave(w);
	}
	local_irq_restore(flags);
	return 0;
}

int ivtk_cpus_start(struct ivtk_dev *d)
{
	int ret;

	ivtk_flush_jiffies = d->flush_ms ? msecs_to_jiffies(d->flush_ms) : 0;
	ret = cpuhp_setup_state(CPUHP_AP_ONLINE_DYN, "ivtrace:online",
				ivtk_cpu_online, ivtk_cpu_offline);
	if (ret < 0) {
		dev_err(&d->pdev->dev, "cpuhp_setup_state failed: %d\n", ret);
		return ret;
	}
	d->hp_state = ret;
	ret = cpuhp_setup_state_nocalls(CPUHP_BP_PREPARE_DYN, "ivtrace:dead",
					NULL, ivtk_cpu_dead);
	if (ret < 0) {
		dev_err(&d->pdev->dev, "cpuhp_setup_state (dead) failed: %d\n", ret);
		cpuhp_remove_state(d->hp_state);
		d->hp_state = 0;
		return ret;
	}
	d->hp_dead_state = ret;
	return 0;
}

/* Stop the timers and close every online CPU's packet. */
void ivtk_cpus_stop(struct ivtk_dev *d)
{
	if (d->hp_dead_state > 0)
		cpuhp_remove_state_nocalls(d->hp_dead_state);
	d->hp_dead_state = 0;
	if (d->hp_state > 0)
		cpuhp_remove_state(d->hp_state);
	d->hp_state = 0;
}

