// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_relay.c - the module's half of the ftrace relay (docs/ftrace.md).
 *
 * The relay is a guest user-space helper (guest/ftrace): it reads the
 * guest's ftrace ring-buffer pages from per_cpu/cpuN/trace_pipe_raw and
 * writes them into the IVT_STREAM_FTRACE channels through its own
 * mapping of /dev/ivtrace. Why user space: Linux 6.1 refuses kernel_read()
 * and kernel_write() on tracefs files (they have .read/.write but no
 * .read_iter/.write_iter), and struct trace_array, which holds the ring
 * buffer the exported ring_buffer_* page API needs, is private to
 * kernel/trace; a process reading trace_pipe_raw is what ftrace supports.
 *
 * What stays here: which file owns the relay (one at a time), the host's
 * IVT_CMD_FTRACE requests (checked against ivtrace/ftrace.h's list of
 * tracefs files before the relay sees them, handed over through
 * IVTRACE_IOC_RELAY_WAIT, answered through IVTRACE_IOC_RELAY_DONE), the
 * format records the relay publishes, and the doorbell. The module starts
 * the relay itself when it binds a device (ftrace_relay=PATH), so a guest
 * that loads ivtrace.ko ftrace=1 from its initramfs relays ftrace from then
 * on with nothing else to start.
 */
#include <linux/capability.h>
#include <linux/kmod.h>
#include <linux/mutex.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "ivtk.h"
#include <ivtrace/ftrace.h>
#include <ivtrace_ioctl.h>

/*
 * relay.lock protects everything in struct ivtk_relay. It nests inside
 * ivtk_mutex (the control work posts requests, unbind clears dev) and
 * takes nothing else; the ioctls take it alone.
 */
struct ivtk_relay {
	struct mutex lock;		/* see above */
	wait_queue_head_t wq;		/* the relay waits here for requests */
	const void *owner;		/* the relay's open file, or NULL */
	struct ivtk_dev *dev;		/* the bound device, or NULL */
	unsigned int gen;		/* dev->gen */
	bool pending;			/* a request waits for the relay */
	bool taken;			/* the relay has it; no answer yet */
	u64 seq;			/* the host's number of that request */
	u32 len;
	char text[IVT_CTL_REQ_MAX];
};

static struct ivtk_relay relay = {
	.lock = __MUTEX_INITIALIZER(relay.lock),
	.wq = __WAIT_QUEUE_HEAD_INITIALIZER(relay.wq),
};

void ivtk_relay_bind(struct ivtk_dev *d)
{
	mutex_lock(&relay.lock);
	relay.dev = d;
	relay.gen = d->gen;
	relay.pending = false;
	relay.taken = false;
	mutex_unlock(&relay.lock);
}

void ivtk_relay_unbind(struct ivtk_dev *d)
{
	mutex_lock(&relay.lock);
	if (relay.dev == d) {
		relay.dev = NULL;
		relay.pending = false;
		relay.taken = false;
	}
	mutex_unlock(&relay.lock);
	wake_up_all(&relay.wq);
}

/*
 * Answer command @seq the way ivtk_ctl_poll() answers the others: the
 * text, then the status, then a store-release of ack_seq. Under relay.lock.
 */
static void ivtk_relay_ack(struct ivtk_dev *d, u64 seq, int status, u32 flags,
			   const char *text, u32 len)
{
	struct ivt_region_hdr *hdr = d->shm;
	struct ivt_control *c = &hdr->control;

	len = min_t(u32, len, IVT_CTL_RESP_MAX);
	if (len)
		memcpy(hdr->ctl_text.resp, text, len);
	WRITE_ONCE(hdr->ctl_text.resp_len, len);
	WRITE_ONCE(hdr->ctl_text.resp_flags, flags);
	WRITE_ONCE(c->ack_status, status);
	WRITE_ONCE(c->groups_enabled, READ_ONCE(ivtk_groups));
	/* Pairs with the host's load-acquire of ack_seq: it then sees the
	 * answer's text and status.
	 */
	ivt_store_release(&c->ack_seq, seq);
}

/*
 * IVT_CMD_FTRACE from the control work (ivtk_mutex held): copy the request
 * out of shared memory, check it, hand it to the relay. Returns
 * -EINPROGRESS when the relay will answer, else the status to answer now.
 */
int ivtk_relay_post(struct ivtk_dev *d, u64 seq, u64 arg)
{
	struct ivt_region_hdr *hdr = d->shm;
	struct ivt_ftrace_req *r;
	int ret = -EINPROGRESS;

	if (!d->nr_ftrace)
		return -EOPNOTSUPP;
	if (arg == 0 || arg > IVT_CTL_REQ_MAX)
		return -EINVAL;
	r = kmalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	mutex_lock(&relay.lock);
	/* A private copy: the host may change the shared text under us. */
	memcpy(relay.text, hdr->ctl_text.req, arg);
	if (ivt_ftrace_parse(relay.text, arg, r)) {
		dev_info(&d->pdev->dev, "ftrace request #%llu refused: not one of the allowed operations on allowed tracefs files\n",
			 seq);
		ret = -EPERM;
	} else if (!relay.owner) {
		ret = -ENOTCONN;
	} else {
		relay.len = arg;
		relay.seq = seq;
		relay.pending = true;
		relay.taken = false;
	}
	mutex_unlock(&relay.lock);
	kfree(r);
	if (ret == -EINPROGRESS)
		wake_up_all(&relay.wq);
	return ret;
}

/* A newer command arrived: an unanswered request is the host's no more. */
void ivtk_relay_cancel(void)
{
	mutex_lock(&relay.lock);
	relay.pending = false;
	relay.taken = false;
	mutex_unlock(&relay.lock);
}

static int ivtk_relay_attach(const void *file, unsigned int gen)
{
	int ret = 0;

	mutex_lock(&relay.lock);
	if (!relay.dev || relay.gen != gen)
		ret = -ENODEV;
	else if (!relay.dev->nr_ftrace)
		ret = -ENODEV;
	else if (relay.owner && relay.owner != file)
		ret = -EBUSY;
	else
		relay.owner = file;
	mutex_unlock(&relay.lock);
	return ret;
}

static bool ivtk_relay_ready(const void *file)
{
	return READ_ONCE(relay.pending) || READ_ONCE(relay.owner) != file;
}

static long ivtk_relay_wait(const void *file, struct ivtrace_relay_req __user *u)
{
	struct ivtrace_relay_req *req;
	u32 timeout;
	long ret;

	if (get_user(timeout, &u->timeout_ms))
		return -EFAULT;
	ret = wait_event_interruptible_timeout(relay.wq, ivtk_relay_ready(file),
					       msecs_to_jiffies(min(timeout, 60000u)));
	if (ret < 0)
		return ret;
	req = kzalloc(sizeof(*req), GFP_KERNEL);
	if (!req)
		return -ENOMEM;
	mutex_lock(&relay.lock);
	if (relay.owner != file) {
		ret = -EPIPE;
	} else if (!relay.pending) {
		ret = -ETIMEDOUT;
	} else {
		req->seq = relay.seq;
		req->len = relay.len;
		memcpy(req->text, relay.text, relay.len);
		relay.pending = false;
		relay.taken = true;
		ret = 0;
	}
	mutex_unlock(&relay.lock);
	if (!ret && copy_to_user(u, req, sizeof(*req)))
		ret = -EFAULT;
	kfree(req);
	return ret;
}

static long ivtk_relay_done(const void *file, struct ivtrace_relay_ans __user *u)
{
	struct ivtrace_relay_ans *a;
	long ret = 0;

	a = kmalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	if (copy_from_user(a, u, sizeof(*a))) {
		kfree(a);
		return -EFAULT;
	}
	mutex_lock(&relay.lock);
	if (relay.owner != file) {
		ret = -EPIPE;
	} else if (relay.dev && relay.taken && relay.seq == a->seq) {
		if (a->status > 0 || a->status < -MAX_ERRNO)
			a->status = -EIO;
		ivtk_relay_ack(relay.dev, a->seq, a->status,
			       a->flags & IVT_CTL_RESP_MORE, a->text, a->len);
		relay.taken = false;
	}
	mutex_unlock(&relay.lock);
	kfree(a);
	return ret;
}

static long ivtk_relay_format(const void *file,
			      struct ivtrace_relay_format __user *u)
{
	struct ivtrace_relay_format f;
	char *text;
	long ret;

	if (copy_from_user(&f, u, sizeof(f)))
		return -EFAULT;
	if ((f.what != IVT_FTRACE_HEADER_PAGE && f.what != IVT_FTRACE_FORMAT) ||
	    f.len == 0 || f.len > IVT_FTRACE_TEXT_MAX)
		return -EINVAL;
	text = kvmalloc(f.len, GFP_KERNEL);
	if (!text)
		return -ENOMEM;
	if (copy_from_user(text, u64_to_user_ptr(f.text), f.len)) {
		kvfree(text);
		return -EFAULT;
	}
	f.system[sizeof(f.system) - 1] = 0;
	mutex_lock(&relay.lock);
	if (relay.owner != file || !relay.dev)
		ret = -EPIPE;
	else
		ret = ivtk_meta_publish_ftrace(relay.dev, f.what, f.system,
					       text, f.len);
	mutex_unlock(&relay.lock);
	kvfree(text);
	return ret;
}

static long ivtk_relay_doorbell(const void *file)
{
	long ret = 0;

	mutex_lock(&relay.lock);
	if (relay.owner != file || !relay.dev)
		ret = -EPIPE;
	else
		ivtk_ring_doorbell(relay.dev);
	mutex_unlock(&relay.lock);
	return ret;
}

/*
 * /dev/ivtrace ioctls (ivtk_cdev.c); @file identifies the opener. They
 * need CAP_SYS_ADMIN even when dev_access=file lets others open the node:
 * the relay takes the host's tracefs requests and publishes the formats
 * the host decodes with, which an unprivileged writer must not.
 */
long ivtk_relay_ioctl(const void *file, unsigned int gen, unsigned int cmd,
		      unsigned long arg)
{
	void __user *u = (void __user *)arg;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	switch (cmd) {
	case IVTRACE_IOC_RELAY_ATTACH:
		return ivtk_relay_attach(file, gen);
	case IVTRACE_IOC_RELAY_WAIT:
		return ivtk_relay_wait(file, u);
	case IVTRACE_IOC_RELAY_DONE:
		return ivtk_relay_done(file, u);
	case IVTRACE_IOC_RELAY_FORMAT:
		return ivtk_relay_format(file, u);
	case IVTRACE_IOC_DOORBELL:
		return ivtk_relay_doorbell(file);
	default:
		return -ENOTTY;
	}
}

/* The relay's file is closed: a request it took is answered -EPIPE, so
 * the host hears at once that nobody will perform it.
 */
void ivtk_relay_release(const void *file)
{
	mutex_lock(&relay.lock);
	if (relay.owner == file) {
		if (relay.dev && (relay.taken || relay.pending))
			ivtk_relay_ack(relay.dev, relay.seq, -EPIPE, 0, NULL, 0);
		relay.owner = NULL;
		relay.pending = false;
		relay.taken = false;
	}
	mutex_unlock(&relay.lock);
	wake_up_all(&relay.wq);
}

/*
 * Start the relay program (ftrace_relay=PATH) once the device is bound and
 * /dev/ivtrace exists. It is a child of kthreadd with no stdio: it logs to
 * /dev/kmsg. Not under any of our locks: the program opens /dev/ivtrace.
 */
void ivtk_relay_spawn(struct ivtk_dev *d, const char *path)
{
	char *argv[3], *envp[3];
	int ret;

	if (!d->nr_ftrace || !path || !*path)
		return;
	argv[0] = (char *)path;
	argv[1] = "--from-module";
	argv[2] = NULL;
	envp[0] = "HOME=/";
	envp[1] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
	envp[2] = NULL;
	ret = call_usermodehelper(argv[0], argv, envp, UMH_WAIT_EXEC);
	if (ret)
		dev_warn(&d->pdev->dev, "ftrace relay %s not started (%d): start it by hand, or pass ftrace_relay=PATH\n",
			 path, ret);
	else
		dev_info(&d->pdev->dev, "ftrace relay %s started\n", path);
}
