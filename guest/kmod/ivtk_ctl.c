// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_ctl.c - the host's control words, the clock sync mailbox, the
 * MSI-X wake-up and the doorbell to the host.
 *
 * The host writes cmd/arg, store-releases cmd_seq and (doorbell device)
 * kicks MSI-X vector 0. A kick is only a wake-up: ivshmem drops kicks sent
 * before MSI-X is enabled and coalesces bursts, so the work re-reads the
 * control words after MSI-X is set up, on every interrupt, and every
 * poll interval (flush_ms) in any case, which is all ivshmem-plain gets.
 */
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/jiffies.h>
#include <linux/pci.h>
#include <linux/workqueue.h>

#include "ivtk.h"

static struct ivt_region_hdr *ivtk_hdr(struct ivtk_dev *d)
{
	return d->shm;
}

/*
 * Ring the host's doorbell: a packet closed while it slept
 * (ivt_writer_close() saw host_sleeping). Called from ivtk_leave() on
 * @w's CPU, interrupts off, inside @w's write section with no reservation
 * open. The peer id and vector are the host's own words; a wrong value
 * only makes QEMU ignore the write (docs/ivshmem.md "Registers").
 *
 * Right before the MMIO write it records ivtrace_doorbell (seq = this
 * ring's number in the region's doorbells counter), so the host can check
 * causality: the ring's mapped time never comes after the host saw the
 * eventfd fire. If writing that event closes a packet while the host
 * sleeps, this very ring covers it.
 */
void ivtk_ring_host(struct ivt_writer *w)
{
	struct ivtk_dev *d = READ_ONCE(ivtk_dev);
	struct ivt_region_hdr *hdr;
	u32 peer, vec;
	u64 seq;
	u8 *p;

	if (!d || !d->doorbell)
		return;
	hdr = ivtk_hdr(d);
	peer = READ_ONCE(hdr->host_peer_id);
	vec = READ_ONCE(hdr->host_vector);
	seq = ivtk_fetch_add64(&hdr->doorbells, 1) + 1;
	p = ivt_writer_reserve(w, rdtsc(), IVT_KEV_DOORBELL,
			       IVT_KEV_DOORBELL_SIZE);
	if (p) {
		p = ivt_put_u64(p, seq);
		ivt_put_u16(p, vec);
		ivt_writer_commit(w);
	}
	w->wake_host = 0;
	/* writel orders the packet stores before the MMIO write. */
	writel((peer << 16) | (vec & 0xffff), d->regs + IVSHMEM_REG_DOORBELL);
}

/*
 * Ring the host's doorbell for a packet the ftrace relay closed while the
 * host slept (IVTRACE_IOC_DOORBELL). Process context; no event is written:
 * the relay's channels are not this CPU's kernel channel.
 */
void ivtk_ring_doorbell(struct ivtk_dev *d)
{
	struct ivt_region_hdr *hdr = ivtk_hdr(d);
	u32 peer, vec;

	if (!d->doorbell)
		return;
	peer = READ_ONCE(hdr->host_peer_id);
	vec = READ_ONCE(hdr->host_vector);
	ivtk_fetch_add64(&hdr->doorbells, 1);
	/* writel orders the relay's packet stores (made before its ioctl)
	 * before the MMIO write.
	 */
	writel((peer << 16) | (vec & 0xffff), d->regs + IVSHMEM_REG_DOORBELL);
}

/*
 * Answer the clock sync mailbox if the host posted a new request:
 * t2 when the request is seen, t3 just before the answer is published.
 * From the MSI-X handler (lowest latency) and from the control work.
 */
static void ivtk_sync_answer(struct ivtk_dev *d)
{
	struct ivt_sync *s = &ivtk_hdr(d)->sync;
	unsigned long flags;
	u64 req, t2;

	raw_spin_lock_irqsave(&d->sync_lock, flags);
	/* Pairs with the host's store-release of req_seq (after host_t1). */
	req = ivt_load_acquire(&s->req_seq);
	if (req != d->sync_seq) {
		t2 = rdtsc_ordered();
		d->sync_seq = req;
		WRITE_ONCE(s->resp_t2, t2);
		WRITE_ONCE(s->resp_t3, rdtsc_ordered());
		/* Pairs with the host's load-acquire of resp_seq. */
		ivt_store_release(&s->resp_seq, req);
	}
	raw_spin_unlock_irqrestore(&d->sync_lock, flags);
}

static int ivtk_ctl_exec(struct ivtk_dev *d, u64 seq, u32 cmd, u64 arg)
{
	switch (cmd) {
	case IVT_CMD_NONE:
		return 0;
	case IVT_CMD_FLUSH:
		ivtk_flush_all();
		return 0;
	case IVT_CMD_ENABLE:
		if (arg & ~(u64)IVTK_GROUPS_ALL)
			return -EINVAL;
		return ivtk_groups_enable(arg);
	case IVT_CMD_DISABLE:
		if (arg & ~(u64)IVTK_GROUPS_ALL)
			return -EINVAL;
		ivtk_groups_disable(arg);
		return 0;
	case IVT_CMD_SET_MODE:
		if (arg != IVT_MODE_DISCARD && arg != IVT_MODE_OVERWRITE)
			return -EINVAL;
		ivtk_set_mode(d, arg);
		return 0;
	case IVT_CMD_SYNC:
		ivtk_sync_answer(d);
		return 0;
	case IVT_CMD_STATEDUMP:
		ivtk_statedump(d);
		return 0;
	case IVT_CMD_FTRACE:
		/* The relay answers (ivtk_relay.c), or the check refuses it. */
		return ivtk_relay_post(d, seq, arg);
	default:
		return -EINVAL;
	}
}

/* Act on a new command, if any. Under ivtk_mutex. */
static void ivtk_ctl_poll(struct ivtk_dev *d)
{
	struct ivt_control *c = &ivtk_hdr(d)->control;
	u64 seq, arg;
	u32 cmd;
	int ret;

	/* Pairs with the host's store-release of cmd_seq: cmd and arg are
	 * the ones it wrote before.
	 */
	seq = ivt_load_acquire(&c->cmd_seq);
	if (seq == d->ctl_seq)
		return;
	d->ctl_seq = seq;
	cmd = READ_ONCE(c->cmd);
	arg = READ_ONCE(c->arg);
	/* The host moved on: an ftrace request still unanswered is void. */
	ivtk_relay_cancel();
	ret = ivtk_ctl_exec(d, seq, cmd, arg);
	dev_dbg(&d->pdev->dev, "control #%llu: cmd %u arg 0x%llx -> %d\n",
		seq, cmd, arg, ret);
	if (ret == -EINPROGRESS)
		return;
	WRITE_ONCE(c->ack_status, ret);
	WRITE_ONCE(c->groups_enabled, READ_ONCE(ivtk_groups));
	/* Pairs with the host's load-acquire of ack_seq. */
	ivt_store_release(&c->ack_seq, seq);
}

static void ivtk_ctl_work(struct work_struct *work)
{
	struct ivtk_dev *d = container_of(to_delayed_work(work),
					  struct ivtk_dev, ctl_work);

	ivtk_sync_answer(d);
	mutex_lock(&ivtk_mutex);
	ivtk_ctl_poll(d);
	mutex_unlock(&ivtk_mutex);
	queue_delayed_work(ivtk_wq, &d->ctl_work, d->poll_jiffies);
}

/* MSI-X vector 0: the host posted a command or a sync request. */
static irqreturn_t ivtk_irq(int irq, void *data)
{
	struct ivtk_dev *d = data;

	ivtk_sync_answer(d);
	mod_delayed_work(ivtk_wq, &d->ctl_work, 0);
	return IRQ_HANDLED;
}

void ivtk_ctl_init(struct ivtk_dev *d)
{
	INIT_DELAYED_WORK(&d->ctl_work, ivtk_ctl_work);
	raw_spin_lock_init(&d->sync_lock);
	d->irq = -1;
	d->poll_jiffies = msecs_to_jiffies(d->flush_ms ?: 100);
}

/* MSI-X for the doorbell device (no INTx there: docs/ivshmem.md "MSI-X"). */
static int ivtk_irq_setup(struct ivtk_dev *d)
{
	struct pci_dev *pdev = d->pdev;
	int nvec, irq, ret;

	/* MSI is a bus-master write: without this no interrupt arrives. */
	pci_set_master(pdev);
	nvec = pci_alloc_irq_vectors(pdev, 1, 1, PCI_IRQ_MSIX);
	if (nvec < 0) {
		dev_warn(&pdev->dev, "no MSI-X vector (%d): control is polled every %u ms\n",
			 nvec, jiffies_to_msecs(d->poll_jiffies));
		return 0;
	}
	irq = pci_irq_vector(pdev, 0);
	ret = devm_request_irq(&pdev->dev, irq, ivtk_irq, 0, IVTK_NAME, d);
	if (ret) {
		dev_err(&pdev->dev, "request_irq(%d) failed: %d\n", irq, ret);
		return ret;
	}
	d->irq = irq;
	return 0;
}

int ivtk_ctl_start(struct ivtk_dev *d)
{
	struct ivt_control *c = &ivtk_hdr(d)->control;
	int ret;

	WRITE_ONCE(c->groups_enabled, READ_ONCE(ivtk_groups));
	if (d->doorbell) {
		ret = ivtk_irq_setup(d);
		if (ret)
			return ret;
	}
	d->ctl_on = true;
	/* Interrupts are wake-ups: look at the control words now, since a
	 * kick sent before MSI-X was enabled is lost.
	 */
	queue_delayed_work(ivtk_wq, &d->ctl_work, 0);
	return 0;
}

/* Not under ivtk_mutex: the work takes it. */
void ivtk_ctl_stop(struct ivtk_dev *d)
{
	if (d->irq >= 0)
		devm_free_irq(&d->pdev->dev, d->irq, d);
	d->irq = -1;
	if (d->ctl_on)
		cancel_delayed_work_sync(&d->ctl_work);
	d->ctl_on = false;
}
