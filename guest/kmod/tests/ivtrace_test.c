// SPDX-License-Identifier: GPL-2.0
/*
 * ivtrace_test.ko - emits events with known payloads through the ivtrace
 * kernel API (ivtrace_event_register/ivtrace_write), on demand, for
 * end-to-end tests (the lttng-modules src/tests/probes/lttng-test.c way).
 *
 *	echo 1000 > /proc/ivtrace-test     # 1000 ivtrace_test_event + blobs
 *	echo hc 10 > /proc/ivtrace-test    # 10 ivtrace_hypercall()s (KVM only)
 *	cat /proc/ivtrace-test             # "written W dropped D errors E ..."
 *
 * For write number i (0-based, counting from module load), it writes
 *	ivtrace_test_event { seq = i, magic = IVTRACE_TEST_MAGIC,
 *			     cpu = the CPU, msg = "ivtrace test event" }
 * and, every 10th i, one
 *	ivtrace_test_blob { seq = i, tag = "ivtblob" (char[8]),
 *			    data = i % 64 bytes, byte k = (i + k) & 0xff }
 *
 * Hypercall number j (0-based) is ivtrace_hypercall(IVT_HC_EVENT_FIRST + 1,
 * j, IVTRACE_TEST_MAGIC, cpu, 0); the line then says how many were made
 * and what the last call returned (-ENODEV without KVM: never a fault).
 */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/smp.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include <ivtrace_kapi.h>

#define IVTRACE_TEST_MAGIC	0x1f7ace5du
#define IVTRACE_TEST_MSG	"ivtrace test event"
#define IVTRACE_TEST_MAX	10000000ul

static const struct ivtrace_field ivtt_event_fields[] = {
	{ .name = "seq", .type = IVT_FT_U64 },
	{ .name = "magic", .type = IVT_FT_U32, .flags = IVT_FF_HEX },
	{ .name = "cpu", .type = IVT_FT_U32 },
	{ .name = "msg", .type = IVT_FT_STRING },
};

static const struct ivtrace_field ivtt_blob_fields[] = {
	{ .name = "seq", .type = IVT_FT_U64 },
	{ .name = "tag", .type = IVT_FT_CHARS, .count = 8 },
	{ .name = "data", .type = IVT_FT_BYTES },
};

static u32 ivtt_event_id, ivtt_blob_id;
static u64 ivtt_seq, ivtt_written, ivtt_dropped, ivtt_errors;
static u64 ivtt_hypercalls;
static int ivtt_hypercall_ret;
static DEFINE_MUTEX(ivtt_lock);

struct ivtt_event {
	__le64 seq;
	__le32 magic;
	__le32 cpu;
	char msg[sizeof(IVTRACE_TEST_MSG)];
} __packed;

struct ivtt_blob {
	__le64 seq;
	char tag[8];
	__le32 len;
	u8 data[64];
} __packed;

static void ivtt_count(int ret)
{
	if (!ret)
		ivtt_written++;
	else if (ret == -ENOBUFS)
		ivtt_dropped++;
	else
		ivtt_errors++;
}

static void ivtt_emit(u64 i)
{
	struct ivtt_event ev = {
		.seq = cpu_to_le64(i),
		.magic = cpu_to_le32(IVTRACE_TEST_MAGIC),
		.cpu = cpu_to_le32(raw_smp_processor_id()),
		.msg = IVTRACE_TEST_MSG,
	};
	struct ivtt_blob b = { .seq = cpu_to_le64(i), .tag = "ivtblob" };
	u32 k, n = i % 64;

	ivtt_count(ivtrace_write(ivtt_event_id, &ev, sizeof(ev)));
	if (i % 10)
		return;
	b.len = cpu_to_le32(n);
	for (k = 0; k < n; k++)
		b.data[k] = (i + k) & 0xff;
	ivtt_count(ivtrace_write(ivtt_blob_id, &b,
				 offsetof(struct ivtt_blob, data) + n));
}

/* `hc N`: N hypercalls. Under ivtt_lock. */
static void ivtt_hypercalls_do(unsigned long n)
{
	unsigned long i;

	for (i = 0; i < n; i++) {
		ivtt_hypercall_ret = ivtrace_hypercall(IVT_HC_EVENT_FIRST + 1,
						       ivtt_hypercalls,
						       IVTRACE_TEST_MAGIC,
						       raw_smp_processor_id(), 0);
		if (ivtt_hypercall_ret)
			return;
		ivtt_hypercalls++;
	}
}

static ssize_t ivtt_write(struct file *file, const char __user *ubuf,
			  size_t count, loff_t *ppos)
{
	char buf[32];
	unsigned long n, i;
	bool hc;
	int ret;

	if (count >= sizeof(buf))
		return -EINVAL;
	if (copy_from_user(buf, ubuf, count))
		return -EFAULT;
	buf[count] = 0;
	hc = !strncmp(buf, "hc ", 3);
	ret = kstrtoul(strim(buf + (hc ? 3 : 0)), 0, &n);
	if (ret)
		return ret;
	if (n > IVTRACE_TEST_MAX)
		return -EINVAL;
	if (hc) {
		mutex_lock(&ivtt_lock);
		ivtt_hypercalls_do(n);
		mutex_unlock(&ivtt_lock);
		return count;
	}
	mutex_lock(&ivtt_lock);
	for (i = 0; i < n; i++) {
		ivtt_emit(ivtt_seq++);
		if (!(i & 1023))
			cond_resched();
	}
	mutex_unlock(&ivtt_lock);
	return count;
}

static int ivtt_show(struct seq_file *m, void *v)
{
	mutex_lock(&ivtt_lock);
	seq_printf(m, "written %llu dropped %llu errors %llu next_seq %llu event_id %u blob_id %u hypercalls %llu hypercall_ret %d\n",
		   ivtt_written, ivtt_dropped, ivtt_errors, ivtt_seq,
		   ivtt_event_id, ivtt_blob_id, ivtt_hypercalls,
		   ivtt_hypercall_ret);
	mutex_unlock(&ivtt_lock);
	return 0;
}

static int ivtt_open(struct inode *inode, struct file *file)
{
	return single_open(file, ivtt_show, NULL);
}

static const struct proc_ops ivtt_proc_ops = {
	.proc_open = ivtt_open,
	.proc_read = seq_read,
	.proc_lseek = seq_lseek,
	.proc_release = single_release,
	.proc_write = ivtt_write,
};

static struct proc_dir_entry *ivtt_proc;

static int __init ivtt_init(void)
{
	int ret;

	ret = ivtrace_event_register("ivtrace_test_event", ivtt_event_fields,
				     ARRAY_SIZE(ivtt_event_fields), &ivtt_event_id);
	if (ret)
		return ret;
	ret = ivtrace_event_register("ivtrace_test_blob", ivtt_blob_fields,
				     ARRAY_SIZE(ivtt_blob_fields), &ivtt_blob_id);
	if (ret)
		return ret;
	ivtt_proc = proc_create("ivtrace-test", 0600, NULL, &ivtt_proc_ops);
	if (!ivtt_proc)
		return -ENOMEM;
	pr_info("ivtrace_test: /proc/ivtrace-test ready (event id %u, blob id %u)\n",
		ivtt_event_id, ivtt_blob_id);
	return 0;
}

static void __exit ivtt_exit(void)
{
	proc_remove(ivtt_proc);
}

module_init(ivtt_init);
module_exit(ivtt_exit);

MODULE_DESCRIPTION("ivtrace kernel API test events");
MODULE_LICENSE("GPL");
