// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_cdev.c - /dev/ivtrace: the region for user space (libivtrace).
 *
 * mmap() maps BAR2 itself, shared, with the default (write-back) page
 * protection: the same memory type as the kernel's memremap(MEMREMAP_WB)
 * mapping, which x86 PAT requires of a second mapping of the range
 * (docs/guest-kernel.md "`/dev/ivtrace`"). libivtrace then claims user channels with its own CAS
 * on the channel table; the kernel is not involved per event.
 *
 * When a process's last file is released (after its mappings are gone),
 * user channels it left ACTIVE are retired: a thread that died without
 * ivt_thread_release() does not leak its channel.
 *
 * ioctl() serves the ftrace relay (include/ivtrace_ioctl.h, ivtk_relay.c).
 *
 * Opening needs CAP_SYS_ADMIN unless the administrator sets dev_access=file:
 * then the node's own permissions decide, as a udev rule sets them (the
 * guest package's rule gives group ivtrace 0660). Whoever may open it may
 * read every channel of the region, kernel ones included, and corrupt any
 * of them; the host validates every packet, so that harms the trace only.
 */
#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "ivtk.h"

static char *dev_access = "cap";
module_param(dev_access, charp, 0444);
MODULE_PARM_DESC(dev_access,
		 "who may open /dev/ivtrace: cap (CAP_SYS_ADMIN, default) or file (the node's mode and group, e.g. from a udev rule)");

struct ivtk_file {
	struct list_head node;
	pid_t tgid;			/* opener, as getpid() shows it */
	unsigned int gen;		/* ivtk_dev->gen at open */
};

/*
 * ivtk_files_lock protects the open files and ivtk_cdev_dev, the device
 * /dev/ivtrace maps. It is taken under mmap_lock (mmap), under misc_mtx
 * (misc_open() calls our open) and under ivtk_mutex (unbind); it takes no
 * other lock. Our open() cannot take ivtk_mutex: misc_deregister() runs
 * under ivtk_mutex and takes misc_mtx.
 */
static DEFINE_MUTEX(ivtk_files_lock);
static LIST_HEAD(ivtk_files);
static struct ivtk_dev *ivtk_cdev_dev;

static int ivtk_open(struct inode *inode, struct file *file)
{
	/* misc_open() holds misc_mtx, so the device cannot be
	 * deregistered (and freed) under us.
	 */
	struct ivtk_dev *d = container_of(file->private_data,
					  struct ivtk_dev, misc);
	struct ivtk_file *f;

	if (strcmp(dev_access, "file") != 0 && !capable(CAP_SYS_ADMIN))
		return -EPERM;
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	f->tgid = task_tgid_vnr(current);
	f->gen = d->gen;
	mutex_lock(&ivtk_files_lock);
	list_add(&f->node, &ivtk_files);
	mutex_unlock(&ivtk_files_lock);
	file->private_data = f;
	return 0;
}

static int ivtk_release(struct inode *inode, struct file *file)
{
	struct ivtk_file *f = file->private_data, *o;
	struct ivtk_dev *d;
	bool last = true;

	ivtk_relay_release(f);
	mutex_lock(&ivtk_files_lock);
	list_del(&f->node);
	list_for_each_entry(o, &ivtk_files, node)
		if (o->tgid == f->tgid && o->gen == f->gen)
			last = false;
	d = ivtk_cdev_dev;
	if (last && d && d->gen == f->gen)
		ivtk_retire_user_channels(d, f->tgid);
	mutex_unlock(&ivtk_files_lock);
	kfree(f);
	return 0;
}

static int ivtk_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct ivtk_file *f = file->private_data;
	struct ivtk_dev *d;
	int ret = -ENODEV;

	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;		/* a private copy would never reach the host */
	mutex_lock(&ivtk_files_lock);
	d = ivtk_cdev_dev;
	if (d && d->gen == f->gen)
		ret = vm_iomap_memory(vma, d->shm_phys, d->shm_len);
	mutex_unlock(&ivtk_files_lock);
	return ret;
}

static long ivtk_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct ivtk_file *f = file->private_data;

	return ivtk_relay_ioctl(f, f->gen, cmd, arg);
}

static const struct file_operations ivtk_fops = {
	.owner = THIS_MODULE,
	.open = ivtk_open,
	.release = ivtk_release,
	.mmap = ivtk_mmap,
	.unlocked_ioctl = ivtk_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

int ivtk_cdev_register(struct ivtk_dev *d)
{
	int ret;

	mutex_lock(&ivtk_files_lock);
	ivtk_cdev_dev = d;
	mutex_unlock(&ivtk_files_lock);

	d->misc.minor = MISC_DYNAMIC_MINOR;
	d->misc.name = IVTK_NAME;
	d->misc.fops = &ivtk_fops;
	d->misc.mode = 0600;
	d->misc.parent = &d->pdev->dev;
	ret = misc_register(&d->misc);
	if (ret) {
		dev_err(&d->pdev->dev, "misc_register(/dev/%s) failed: %d\n",
			IVTK_NAME, ret);
		ivtk_cdev_unregister(d);
		return ret;
	}
	d->cdev_on = true;
	return 0;
}

void ivtk_cdev_unregister(struct ivtk_dev *d)
{
	if (d->cdev_on)
		misc_deregister(&d->misc);
	d->cdev_on = false;
	mutex_lock(&ivtk_files_lock);
	ivtk_cdev_dev = NULL;
	mutex_unlock(&ivtk_files_lock);
}
