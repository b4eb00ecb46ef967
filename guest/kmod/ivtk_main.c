// SPDX-License-Identifier: GPL-2.0
/*
 * ivtrace.ko - guest->host tracing over QEMU ivshmem.
 *
 * Binds an ivshmem PCI device (1af4:1110, ivshmem-plain or
 * ivshmem-doorbell), formats its BAR2 as an ivtrace region and writes the
 * guest kernel's events into it: scheduler, interrupts, timers, memory,
 * system calls and the kernel log. The host reads the same pages
 * (/dev/shm/NAME) with `ivtrace record`; see docs/abi.md.
 *
 *	qemu-system-x86_64 ... \
 *	  -object memory-backend-file,id=ivt,size=16M,share=on,mem-path=/dev/shm/ivt \
 *	  -device ivshmem-plain,memdev=ivt
 *	insmod ivtrace.ko events=sched,irq,printk mode=overwrite
 *
 * Start order (ivtk_start) and the reverse (ivtk_stop) are the heart of
 * clean unload: nothing may write into the BAR once remove() returns.
 */
#include <linux/io.h>
#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/tracepoint.h>
#include <asm/pgtable.h>

#include "ivtk.h"

#define PCI_VENDOR_ID_IVSHMEM	PCI_VENDOR_ID_REDHAT_QUMRANET	/* 0x1af4 */
#define PCI_DEVICE_ID_IVSHMEM	0x1110

static unsigned int subbuf_size = 64 << 10;
module_param(subbuf_size, uint, 0444);
MODULE_PARM_DESC(subbuf_size, "bytes per sub-buffer (= CTF packet), power of two, 4096..16M (default 65536)");

static unsigned int nr_subbufs;
module_param(nr_subbufs, uint, 0444);
MODULE_PARM_DESC(nr_subbufs, "sub-buffers per channel, power of two >= 2 (default 0: fill the BAR)");

static unsigned int user_channels = 16;
module_param(user_channels, uint, 0444);
MODULE_PARM_DESC(user_channels, "channels for user-space writers through /dev/ivtrace (default 16)");

static char *mode = "discard";
module_param(mode, charp, 0444);
MODULE_PARM_DESC(mode, "discard (stream, drop newest when full) or overwrite (flight recorder)");

static unsigned int flush_ms = 100;
module_param(flush_ms, uint, 0444);
MODULE_PARM_DESC(flush_ms, "close a partly filled packet this old, and poll host commands this often (default 100; 0: never flush)");

static char *events = "sched,irq,timer,kmem,printk";
module_param(events, charp, 0444);
MODULE_PARM_DESC(events, "event groups at load: sched,irq,timer,kmem,syscall,printk, all or none (default: all but syscall)");

static bool ftrace;
module_param(ftrace, bool, 0444);
MODULE_PARM_DESC(ftrace, "relay the guest's ftrace ring buffer to the host: one more channel per CPU, IVT_CMD_FTRACE (default 0)");

static char *ftrace_relay = "/usr/local/bin/ivtrace-ftrace";
module_param(ftrace_relay, charp, 0444);
MODULE_PARM_DESC(ftrace_relay, "the relay program the module starts when ftrace=1 (empty: start it yourself)");

static char *printk_source = "console";
module_param(printk_source, charp, 0444);
MODULE_PARM_DESC(printk_source, "console (a console: records at the console log level, with their time prefix, the default) or tracepoint (every record, as lttng-modules)");

/* Checked parameters. */
static u32 ivtk_mode, ivtk_groups_at_load;

/* Lock nesting and what it protects: see ivtk.h. */
DEFINE_MUTEX(ivtk_mutex);
struct ivtk_dev *ivtk_dev;		/* under ivtk_mutex; READ_ONCE in ivtk_ring_host() */
bool ivtk_live;				/* load-acquire by writers, interrupts off */
u32 ivtk_groups;			/* written under ivtk_mutex */
bool ivtk_printk_tracepoint;
static unsigned int ivtk_gen;

static const char *ivtk_mode_name(u32 m)
{
	return m == IVT_MODE_OVERWRITE ? "overwrite" : "discard";
}

/* Undo ivtk_start(), from whatever point it reached. Under ivtk_mutex,
 * after ivtk_ctl_stop() and ivtk_cdev_unregister().
 */
static void ivtk_stop(struct ivtk_dev *d)
{
	lockdep_assert_held(&ivtk_mutex);
	ivtk_vmsync_stop();
	ivtk_console_unregister(d);
	ivtk_groups_disable(IVTK_GROUPS_ALL);
	/* No probe runs any more once this returns. */
	tracepoint_synchronize_unregister();
	/* Writers that are not probes (the kernel API, a console write at
	 * panic) check ivtk_live with interrupts off: after the grace
	 * period none is inside the write path.
	 */
	WRITE_ONCE(ivtk_live, false);
	synchronize_rcu();
	ivtk_names_stop();
	/* Stop the flush timers, close every online CPU's packet. */
	ivtk_cpus_stop(d);
	ivtk_region_close(d);
	ivtk_relay_unbind(d);
	WRITE_ONCE(ivtk_dev, NULL);
}

static int ivtk_start(struct ivtk_dev *d)
{
	int ret;

	lockdep_assert_held(&ivtk_mutex);
	ret = ivtk_region_setup(d);
	if (ret)
		return ret;
	d->gen = ++ivtk_gen;
	WRITE_ONCE(ivtk_dev, d);
	ivtk_relay_bind(d);
	/* Publish the bound writers: pairs with ivtk_reserve()'s acquire. */
	smp_store_release(&ivtk_live, true);
	ret = ivtk_cpus_start(d);
	if (ret)
		goto err;
	ret = ivtk_groups_enable(d->groups);
	if (ret)
		goto err;
	/* Threads and interrupts that exist now; fork/exec/rename and
	 * sched_process_free keep the host's view current from here.
	 */
	ivtk_statedump(d);
	ivtk_console_register(d);
	ivtk_vmsync_start(d);
	return 0;
err:
	ivtk_stop(d);
	return ret;
}

/*
 * The memory type the kernel mapping of BAR2 really got. memremap(WB) of
 * a range the guest's MTRRs call uncached (SeaBIOS's 32-bit PCI hole) is
 * downgraded to UC- by x86 PAT (pat_x_mtrr_type()); /dev/ivtrace then
 * maps UC- too (it must match). That costs nothing under TCG (memory types
 * are not emulated) or Intel EPT (KVM ignores the guest's type), but every
 * access is uncached where the guest's PAT applies (AMD NPT). A BAR placed
 * above 4 GiB (default type write-back) is mapped write-back.
 */
static const char *ivtk_cache_mode(const void *addr)
{
	unsigned int level;
	pgprotval_t prot;
	pte_t *pte;

	pte = lookup_address((unsigned long)addr, &level);
	if (!pte)
		return "unmapped";
	prot = pte_val(*pte);
	if (level != PG_LEVEL_4K)
		prot = pgprot_val(pgprot_large_2_4k(__pgprot(prot)));
	prot &= _PAGE_CACHE_MASK;
	if (prot == cachemode2protval(_PAGE_CACHE_MODE_WB))
		return "write-back";
	if (prot == cachemode2protval(_PAGE_CACHE_MODE_UC_MINUS))
		return "uncached-minus (MTRR)";
	if (prot == cachemode2protval(_PAGE_CACHE_MODE_UC))
		return "uncached";
	return "other";
}

static int ivtk_map(struct ivtk_dev *d)
{
	struct pci_dev *pdev = d->pdev;
	resource_size_t start, len;
	int ret;

	ret = pcim_iomap_regions(pdev, BIT(0), IVTK_NAME);
	if (ret) {
		dev_err(&pdev->dev, "BAR0 %pR: cannot map registers: %d\n",
			&pdev->resource[0], ret);
		return ret;
	}
	d->regs = pcim_iomap_table(pdev)[0];

	start = pci_resource_start(pdev, 2);
	len = pci_resource_len(pdev, 2);
	if (!len || !is_power_of_2(len) || len < IVT_REGION_MIN) {
		dev_err(&pdev->dev, "BAR2 %pR: size %llu is not a power of two >= %u\n",
			&pdev->resource[2], (u64)len, IVT_REGION_MIN);
		return -ENODEV;
	}
	if (!devm_request_mem_region(&pdev->dev, start, len, IVTK_NAME)) {
		dev_err(&pdev->dev, "BAR2 %pR is busy\n", &pdev->resource[2]);
		return -EBUSY;
	}
	/* Write-back, never write-combining: WC stores are weakly ordered
	 * and the release stores of the writer protocol would not order
	 * them (docs/guest-kernel.md "Memory ordering").
	 */
	d->shm = devm_memremap(&pdev->dev, start, len, MEMREMAP_WB);
	if (IS_ERR(d->shm)) {
		dev_err(&pdev->dev, "BAR2 %pR: memremap(WB) failed: %ld\n",
			&pdev->resource[2], PTR_ERR(d->shm));
		return PTR_ERR(d->shm);
	}
	d->shm_phys = start;
	d->shm_len = len;
	return 0;
}

static int ivtk_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct ivtk_dev *d;
	int ret;

	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;
	if (pdev->revision < 1) {
		dev_err(&pdev->dev, "ivshmem revision %u not supported (need >= 1, QEMU >= 2.6)\n",
			pdev->revision);
		return -ENODEV;
	}
	d = devm_kzalloc(&pdev->dev, sizeof(*d), GFP_KERNEL);
	if (!d)
		return -ENOMEM;
	d->pdev = pdev;
	d->subbuf_size = subbuf_size;
	d->nr_subbufs = nr_subbufs;
	d->user_channels = user_channels;
	d->mode = ivtk_mode;
	d->flush_ms = flush_ms;
	d->groups = ivtk_groups_at_load;
	d->nr_ftrace = ftrace ? nr_cpu_ids : 0;
	d->doorbell = pdev->msix_cap != 0;
	ivtk_ctl_init(d);
	ret = ivtk_map(d);
	if (ret)
		return ret;

	mutex_lock(&ivtk_mutex);
	if (ivtk_dev) {
		dev_err(&pdev->dev, "already tracing through %s: one ivshmem device at a time\n",
			pci_name(ivtk_dev->pdev));
		mutex_unlock(&ivtk_mutex);
		return -EBUSY;
	}
	ret = ivtk_start(d);
	if (!ret) {
		ret = ivtk_cdev_register(d);
		if (ret)
			ivtk_stop(d);
	}
	mutex_unlock(&ivtk_mutex);
	if (ret)
		return ret;

	ret = ivtk_ctl_start(d);
	if (ret) {
		ivtk_ctl_stop(d);
		mutex_lock(&ivtk_mutex);
		ivtk_cdev_unregister(d);
		ivtk_stop(d);
		mutex_unlock(&ivtk_mutex);
		return ret;
	}
	pci_set_drvdata(pdev, d);
	dev_info(&pdev->dev, "%s: %llu KiB region at %pa (%s), %u kernel + %u ftrace + %u user channels x %u x %u KiB, %s, groups 0x%x, ivposition %u%s\n",
		 d->doorbell ? "ivshmem-doorbell" : "ivshmem-plain",
		 d->shm_len >> 10, &d->shm_phys, ivtk_cache_mode(d->shm),
		 d->layout.nr_kernel_channels, d->nr_ftrace,
		 d->layout.nr_channels - d->layout.nr_kernel_channels - d->nr_ftrace,
		 d->layout.nr_subbufs, d->layout.subbuf_size >> 10,
		 ivtk_mode_name(d->mode), READ_ONCE(ivtk_groups),
		 readl(d->regs + IVSHMEM_REG_IVPOSITION),
		 d->irq >= 0 ? ", MSI-X" : "");
	ivtk_relay_spawn(d, ftrace_relay);
	return 0;
}

static void ivtk_remove(struct pci_dev *pdev)
{
	struct ivtk_dev *d = pci_get_drvdata(pdev);

	ivtk_ctl_stop(d);
	mutex_lock(&ivtk_mutex);
	ivtk_cdev_unregister(d);
	ivtk_stop(d);
	mutex_unlock(&ivtk_mutex);
	dev_info(&pdev->dev, "region closed\n");
}

static const struct pci_device_id ivtk_ids[] = {
	{ PCI_DEVICE(PCI_VENDOR_ID_IVSHMEM, PCI_DEVICE_ID_IVSHMEM) },
	{ }
};
MODULE_DEVICE_TABLE(pci, ivtk_ids);

static struct pci_driver ivtk_driver = {
	.name = IVTK_NAME,
	.id_table = ivtk_ids,
	.probe = ivtk_probe,
	.remove = ivtk_remove,
};

static int __init ivtk_check_params(void)
{
	int ret;

	if (!is_power_of_2(subbuf_size) || subbuf_size < IVT_SUBBUF_MIN ||
	    subbuf_size > IVT_SUBBUF_MAX) {
		pr_err("ivtrace: subbuf_size=%u: need a power of two in [%u, %u]\n",
		       subbuf_size, IVT_SUBBUF_MIN, IVT_SUBBUF_MAX);
		return -EINVAL;
	}
	if (nr_subbufs && (!is_power_of_2(nr_subbufs) ||
			   nr_subbufs < IVT_SUBBUFS_MIN ||
			   nr_subbufs > IVT_SUBBUFS_MAX)) {
		pr_err("ivtrace: nr_subbufs=%u: need 0 or a power of two in [%u, %u]\n",
		       nr_subbufs, IVT_SUBBUFS_MIN, IVT_SUBBUFS_MAX);
		return -EINVAL;
	}
	if (user_channels > IVT_CHANNELS_MAX - nr_cpu_ids * (1 + ftrace)) {
		pr_err("ivtrace: user_channels=%u: at most %u with %u CPUs%s\n",
		       user_channels, IVT_CHANNELS_MAX - nr_cpu_ids * (1 + ftrace),
		       nr_cpu_ids, ftrace ? " and the ftrace relay" : "");
		return -EINVAL;
	}
	if (ftrace && subbuf_size < IVTK_FTRACE_SUBBUF_MIN) {
		pr_err("ivtrace: subbuf_size=%u: the ftrace relay needs %u or more (a packet holds whole ftrace pages)\n",
		       subbuf_size, IVTK_FTRACE_SUBBUF_MIN);
		return -EINVAL;
	}
	if (!strcmp(mode, "discard")) {
		ivtk_mode = IVT_MODE_DISCARD;
	} else if (!strcmp(mode, "overwrite")) {
		ivtk_mode = IVT_MODE_OVERWRITE;
	} else {
		pr_err("ivtrace: mode=%s: need discard or overwrite\n", mode);
		return -EINVAL;
	}
	if (!strcmp(printk_source, "tracepoint")) {
		ivtk_printk_tracepoint = true;
	} else if (strcmp(printk_source, "console")) {
		pr_err("ivtrace: printk_source=%s: need console or tracepoint\n",
		       printk_source);
		return -EINVAL;
	}
	if (flush_ms > 60000) {
		pr_err("ivtrace: flush_ms=%u: at most 60000\n", flush_ms);
		return -EINVAL;
	}
	ret = ivtk_parse_groups(events, &ivtk_groups_at_load);
	if (ret)
		return ret;
	return 0;
}

/* The event table is built from its one definition; what is left to check
 * is that its names and types are ones the host accepts.
 */
static int __init ivtk_check_events(void)
{
	unsigned int i;

	for (i = 0; i < IVTK_NR_EVENTS; i++) {
		const struct ivtk_event_desc *e = &ivtk_events[i];

		if (!ivtk_fields_valid(e->fields, e->nr_fields)) {
			pr_err("ivtrace: event %u (%s) has an invalid field\n",
			       i, e->name);
			return -EINVAL;
		}
	}
	return 0;
}

static int __init ivtk_init(void)
{
	int ret;

	ret = ivtk_check_params();
	if (ret)
		return ret;
	ret = ivtk_check_events();
	if (ret)
		return ret;
	ret = ivtk_probes_init();
	if (ret) {
		pr_err("ivtrace: no tracepoint found (CONFIG_TRACEPOINTS?)\n");
		return ret;
	}
	ivtk_hypercall_init();
	return pci_register_driver(&ivtk_driver);
}

static void __exit ivtk_exit(void)
{
	pci_unregister_driver(&ivtk_driver);
	ivtk_kapi_exit();
}

module_init(ivtk_init);
module_exit(ivtk_exit);

MODULE_DESCRIPTION("ivtrace: guest kernel tracing to the host over ivshmem");
MODULE_AUTHOR("ivtrace developers");
/* GPL: tracepoint_probe_register and for_each_kernel_tracepoint are
 * EXPORT_SYMBOL_GPL.
 */
MODULE_LICENSE("GPL");
