// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_hypercall.c - the hypercall channel and vmsync, KVM guests only.
 *
 * A hypercall is the one way a guest event reaches the host at the moment
 * it happens: `vmcall` (Intel) or `vmmcall` (AMD) exits to KVM, which
 * traces kvm_exit, kvm_hypercall (RAX = nr, RBX, RCX, RDX, RSI) and,
 * when the vCPU resumes, kvm_entry. The host aggregates the three into one
 * event with the exit's cost (docs/kvm.md "The hypercall channel"). The
 * numbers are ivtrace's own (IVT_HC_* in ivtrace/abi.h), far above KVM's:
 * KVM answers them with -KVM_ENOSYS and does nothing else.
 *
 * Under TCG there is no hypervisor to catch the instruction: `vmcall`
 * raises #UD in the guest. So everything here is gated on
 * kvm_para_available() (CPUID leaf 0x40000000 says "KVMKVMKVM"), decided
 * once at load: without it ivtrace_hypercall() returns -ENODEV and vmsync
 * stays off, and no hypercall instruction is ever executed.
 *
 * vmsync (LTTng's addon, for Trace Compass's virtual machine analysis):
 * every vmsync_ms, on one vCPU with interrupts off, the guest writes
 * vmsync_gh_guest(cnt, vm_uid), makes the IVT_HC_VMSYNC hypercall with
 * a0 = cnt, a1 = vm_uid, and writes vmsync_hg_guest(cnt + 1, vm_uid); the
 * host writes vmsync_gh_host at the kvm_hypercall and vmsync_hg_host(cnt
 * + 1) at that vCPU's next kvm_entry.
 */
#include <linux/kvm_para.h>
#include <linux/moduleparam.h>
#include <linux/random.h>
#include <linux/workqueue.h>

#include "ivtk.h"

static unsigned int vmsync_ms = 1000;
module_param(vmsync_ms, uint, 0444);
MODULE_PARM_DESC(vmsync_ms, "KVM guests: a vmsync exchange (vmsync_gh_guest, hypercall, vmsync_hg_guest) this often, for Trace Compass's VM analysis (default 1000; 0: off; always off without KVM)");

static ulong vm_uid;
module_param(vm_uid, ulong, 0444);
MODULE_PARM_DESC(vm_uid, "this guest's id in vmsync events (default 0: random at load)");

/* Set once at load, read-only afterwards. */
static bool ivtk_kvm;
static u64 ivtk_vm_uid;

/* The next exchange's count; only the (serialized) work touches it. */
static u32 ivtk_vmsync_cnt;
static struct delayed_work ivtk_vmsync_work;
static bool ivtk_vmsync_on;

void ivtk_hypercall_init(void)
{
	ivtk_kvm = kvm_para_available();
	ivtk_vm_uid = vm_uid ? vm_uid : get_random_u64();
	if (ivtk_kvm)
		pr_info("ivtrace: hypercall channel on (KVM)\n");
	else
		pr_info("ivtrace: hypercall channel off: not a KVM guest (vmcall would raise #UD)\n");
}

int ivtrace_hypercall(unsigned long nr, unsigned long a0, unsigned long a1,
		      unsigned long a2, unsigned long a3)
{
	if (!ivtk_kvm)
		return -ENODEV;
	if (nr < IVT_HC_EVENT_FIRST || nr > IVT_HC_EVENT_LAST)
		return -EINVAL;
	/* KVM answers -KVM_ENOSYS: the number is ours, the trace is the point. */
	kvm_hypercall4(nr, a0, a1, a2, a3);
	return 0;
}
EXPORT_SYMBOL_GPL(ivtrace_hypercall);

/* One vmsync event on this CPU's channel. Interrupts are off. */
static void ivtk_vmsync_event(u32 id, u32 cnt)
{
	struct ivt_writer *w;
	u8 *p;

	p = ivtk_reserve(&w, id, IVT_KEV_VMSYNC_GH_GUEST_SIZE);
	if (p) {
		p = ivt_put_u32(p, cnt);
		p = ivt_put_u64(p, ivtk_vm_uid);
		ivtk_commit(w, p);
	}
}

/*
 * One exchange: both events and the hypercall on the same vCPU, nothing
 * in between (interrupts off), so the host's kvm_hypercall and next
 * kvm_entry of that vCPU bracket what the guest wrote.
 */
static void ivtk_vmsync_once(void)
{
	u32 cnt = ivtk_vmsync_cnt;
	unsigned long flags;

	local_irq_save(flags);
	ivtk_vmsync_event(IVT_KEV_VMSYNC_GH_GUEST, cnt);
	kvm_hypercall2(IVT_HC_VMSYNC, cnt, ivtk_vm_uid);
	ivtk_vmsync_event(IVT_KEV_VMSYNC_HG_GUEST, cnt + 1);
	local_irq_restore(flags);
	ivtk_vmsync_cnt = cnt + 2;
}

static void ivtk_vmsync_fn(struct work_struct *work)
{
	ivtk_vmsync_once();
	queue_delayed_work(ivtk_wq, &ivtk_vmsync_work, msecs_to_jiffies(vmsync_ms));
}

/* From ivtk_start(), once the writers are live. */
void ivtk_vmsync_start(struct ivtk_dev *d)
{
	if (!vmsync_ms)
		return;
	if (!ivtk_kvm) {
		dev_info(&d->pdev->dev, "vmsync off: not a KVM guest (no hypercall under TCG)\n");
		return;
	}
	INIT_DELAYED_WORK(&ivtk_vmsync_work, ivtk_vmsync_fn);
	ivtk_vmsync_on = true;
	queue_delayed_work(ivtk_wq, &ivtk_vmsync_work, 0);
	dev_info(&d->pdev->dev, "vmsync every %u ms, vm_uid %llu\n", vmsync_ms,
		 ivtk_vm_uid);
}

/* From ivtk_stop(), before the writers stop: no exchange runs after it. */
void ivtk_vmsync_stop(void)
{
	if (!ivtk_vmsync_on)
		return;
	cancel_delayed_work_sync(&ivtk_vmsync_work);
	ivtk_vmsync_on = false;
}
