// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_sync.c - the clock sync mailbox, answered by spinning.
 *
 * The host measures this guest's TSC against its own clock with NTP's
 * on-wire method (docs/abi.md "Clock"): it posts a request, the guest
 * answers with its TSC when it saw the request (t2) and when it answered
 * (t3), and the truth lies within half the round trip. A round trip
 * through an interrupt or a work item takes tens of microseconds, which
 * would be the bound; so once the guest is in the exchange (the host's
 * kick on MSI-X vector 0, or the control poll of ivshmem-plain), it stays:
 * it answers each request as soon as it appears and spins for the next,
 * so that a round trip is two cache-line transfers (IVT_FEAT_SYNC_SPIN).
 *
 * ivshmem-plain has no interrupt, so the host meets the guest at a time
 * it can predict: a timer every IVT_SYNC_POLL_MS enters the exchange from
 * interrupt context (with no request posted it costs a load and two TSC
 * readings). Its period is exact on the
 * guest's clock and a busy guest does not delay it (a work item waits
 * for the CPU-bound task it shares a CPU with), so the host, knowing one
 * entry's time, spins only through a short window around the next.
 *
 * The spin is bounded in time whatever the host does (abi.h): at most
 * IVT_SYNC_PATIENCE_NS waiting for the next request (a host that stopped
 * answering holds the vCPU that long), at most IVT_SYNC_BUDGET_NS from the
 * first answer to leaving, at most IVT_SYNC_ROUNDS answers. Time is the
 * TSC of this CPU: preemption stays off for the whole exchange (process
 * context: the control work; or the MSI-X handler or the timer), interrupts only from
 * t2 to the answer's store-release, so an interrupt may lengthen one wait
 * (the host keeps the fastest round trips) but never the guest's t3 - t2.
 * Interrupt time counts against the budget, so the bound holds with
 * interrupts taken, on every kernel (7.x runs this work preemptible, and
 * threaded interrupt handlers too, hence the explicit preempt_disable()).
 *
 * Two contexts may enter (the handler and the work): a bit lock lets one
 * in and sends the other away at once, never waiting. A request that
 * arrives while the one inside is leaving is answered at the next kick
 * or poll; the host counts it as a timeout, never as a wrong answer.
 */
#include <linux/bitops.h>
#include <linux/hrtimer.h>
#include <linux/irqflags.h>
#include <linux/kvm_para.h>
#include <linux/math64.h>
#include <linux/preempt.h>
#include <asm/tsc.h>

#include "ivtk.h"
#include "wrapper/compat.h"

/* Bit 0 of d->sync_busy: a context is in the exchange. */
#define IVTK_SYNC_BUSY	0

static struct ivt_sync *ivtk_sync_box(struct ivtk_dev *d)
{
	return &((struct ivt_region_hdr *)d->shm)->sync;
}

/* @ns in TSC ticks (tsc_khz is not 0: ivtk_format() refuses a region without it). */
static u64 ivtk_ns_to_ticks(u64 ns)
{
	return div_u64(ns * tsc_khz, 1000000);
}

void ivtk_sync_init(struct ivtk_dev *d)
{
	d->sync_busy = 0;
	d->sync_patience = ivtk_ns_to_ticks(IVT_SYNC_PATIENCE_NS);
	d->sync_budget = ivtk_ns_to_ticks(IVT_SYNC_BUDGET_NS);
	/* PAUSE is the right spin hint on hardware (and KVM, where a long
	 * PAUSE loop exits to let another vCPU run, which the budget covers),
	 * but under TCG it leaves the translated code (QEMU's helper_pause()
	 * exits the CPU loop), which would cost more than a round trip.
	 */
	d->sync_pause = kvm_para_available();
}

/*
 * Answer request @req: t2 when it was seen, t3 right before the answer is
 * published. Interrupts off in between: nothing may run between the two
 * readings. Returns t3.
 */
static u64 ivtk_sync_answer(struct ivtk_dev *d, struct ivt_sync *s, u64 req)
{
	unsigned long flags;
	u64 t2, t3;

	local_irq_save(flags);
	t2 = rdtsc_ordered();
	d->sync_seq = req;
	WRITE_ONCE(s->resp_t2, t2);
	t3 = rdtsc_ordered();
	WRITE_ONCE(s->resp_t3, t3);
	/* Pairs with the host's load-acquire of resp_seq: t2 and t3 first. */
	ivt_store_release(&s->resp_seq, req);
	local_irq_restore(flags);
	return t3;
}

/*
 * Spin for the host's next request. Returns it, or d->sync_seq when the
 * patience since @last or the budget since @first ran out. Unsigned
 * differences: a TSC that went backwards reads as a huge wait, i.e. leave.
 */
static u64 ivtk_sync_next(struct ivtk_dev *d, struct ivt_sync *s, u64 first, u64 last)
{
	u64 req, now;

	for (;;) {
		/* Pairs with the host's store-release of req_seq (after host_t1). */
		req = ivt_load_acquire(&s->req_seq);
		if (req != d->sync_seq)
			return req;
		now = rdtsc();
		if (now - last > d->sync_patience || now - first > d->sync_budget)
			return req;
		if (d->sync_pause)
			cpu_relax();
		else
			barrier();
	}
}

/*
 * Answer the mailbox if the host posted a new request, then keep
 * answering while it goes on (the header comment). From the MSI-X handler,
 * the control work and IVT_CMD_SYNC; never waits for the other context.
 */
void ivtk_sync_exchange(struct ivtk_dev *d)
{
	struct ivt_sync *s = ivtk_sync_box(d);
	unsigned int answered = 0;
	u64 req, first, last, in, out;

	preempt_disable();
	if (test_and_set_bit_lock(IVTK_SYNC_BUSY, &d->sync_busy)) {
		preempt_enable();
		return;
	}
	in = rdtsc();
	/* Pairs with the host's store-release of req_seq (after host_t1). */
	req = ivt_load_acquire(&s->req_seq);
	if (req != d->sync_seq) {
		first = ivtk_sync_answer(d, s, req);
		last = first;
		while (++answered < IVT_SYNC_ROUNDS) {
			req = ivtk_sync_next(d, s, first, last);
			if (req == d->sync_seq)
				break;
			last = ivtk_sync_answer(d, s, req);
		}
	}
	/* The exchange's cost, for the host to report. */
	out = rdtsc();
	if (out > in)
		d->sync_spun += out - in;
	WRITE_ONCE(s->resp_spun, d->sync_spun);
	clear_bit_unlock(IVTK_SYNC_BUSY, &d->sync_busy);
	preempt_enable();
}

/* The poll timer: enter the exchange, then the same time next period. */
static enum hrtimer_restart ivtk_sync_tick(struct hrtimer *t)
{
	struct ivtk_dev *d = container_of(t, struct ivtk_dev, sync_timer);

	ivtk_sync_exchange(d);
	hrtimer_forward_now(t, d->sync_period);
	return HRTIMER_RESTART;
}

/*
 * Start the poll timer, every @period_ms, for a device the host cannot
 * kick. It keeps its phase (hrtimer_forward_now() skips periods it
 * missed, it never drifts), which is what the host predicts.
 */
void ivtk_sync_start(struct ivtk_dev *d, unsigned int period_ms)
{
	d->sync_period = ms_to_ktime(period_ms);
	ivtk_hrtimer_setup(&d->sync_timer, ivtk_sync_tick, CLOCK_MONOTONIC,
			   HRTIMER_MODE_ABS);
	hrtimer_start(&d->sync_timer, ktime_add(ktime_get(), d->sync_period),
		      HRTIMER_MODE_ABS);
	d->sync_timer_on = true;
}

/* Stop the poll timer; its callback has finished when this returns. */
void ivtk_sync_stop(struct ivtk_dev *d)
{
	if (d->sync_timer_on)
		hrtimer_cancel(&d->sync_timer);
	d->sync_timer_on = false;
}
