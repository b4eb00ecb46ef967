// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_region.c - plan, format and close the region in BAR2; publish
 * event descriptions in its metadata area; retire user channels.
 *
 * The layout is planned and kept in private memory (struct ivtk_dev);
 * the shared copy in the header is for the host and for user space. The
 * module never reads an offset, size or index back from shared memory.
 */
#include <linux/atomic.h>
#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/pci.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/string.h>
#include <linux/timekeeping.h>
#include <linux/uuid.h>
#include <asm/tsc.h>

#include "ivtk.h"
#include <ivtrace/format.h>
#include <ivtrace/ftrace.h>

/* Fetch-and-add on a word other writers (user space, other CPUs) share. */
u32 ivtk_fetch_add32(u32 *p, u32 v)
{
	u32 old = READ_ONCE(*p);

	while (!try_cmpxchg(p, &old, old + v))
		;
	return old;
}

u64 ivtk_fetch_add64(u64 *p, u64 v)
{
	u64 old = READ_ONCE(*p);

	while (!try_cmpxchg(p, &old, old + v))
		;
	return old;
}

struct ivt_channel *ivtk_channel(struct ivtk_dev *d, u32 chan)
{
	return d->shm + d->layout.channels_off +
	       (u64)chan * sizeof(struct ivt_channel);
}

/*
 * Plan the layout: nr_cpu_ids kernel channels (every possible CPU), as many
 * ftrace relay channels if the relay is on, then user_channels;
 * subbuf_size bytes per sub-buffer, and nr_subbufs per channel, or as many
 * as fill the BAR (a power of two) when it is 0.
 */
static int ivtk_plan(struct ivtk_dev *d)
{
	struct device *dev = &d->pdev->dev;
	struct ivt_geometry g = {
		.nr_kernel_channels = nr_cpu_ids,
		.nr_ftrace_channels = d->nr_ftrace,
		.nr_channels = nr_cpu_ids + d->nr_ftrace + d->user_channels,
		.nr_subbufs = d->nr_subbufs ?: IVT_SUBBUFS_MIN,
		.subbuf_size = d->subbuf_size,
		.meta_size = d->nr_ftrace ? IVTK_META_SIZE_FTRACE : IVTK_META_SIZE,
	};
	u64 need, per_subbuf, n;

	need = ivt_layout_plan(&d->layout, &g);
	if (!need) {
		dev_err(dev, "geometry out of range: %u channels (%u CPUs + %u user), nr_subbufs %u, subbuf_size %u\n",
			g.nr_channels, g.nr_kernel_channels, d->user_channels,
			g.nr_subbufs, g.subbuf_size);
		return -EINVAL;
	}
	if (need > d->shm_len) {
		dev_err(dev, "BAR2 holds %llu bytes, %u channels x %u x %u bytes need %llu: lower subbuf_size=, nr_subbufs= or user_channels=, or give QEMU a larger memdev\n",
			d->shm_len, g.nr_channels, g.nr_subbufs, g.subbuf_size,
			need);
		return -ENOSPC;
	}
	if (d->nr_subbufs)
		return 0;

	/* Fill the BAR: the pool gets what the header, the channel table
	 * and the metadata area leave.
	 */
	per_subbuf = (u64)g.nr_channels * g.subbuf_size;
	n = div64_u64(d->shm_len - d->layout.pool_off, per_subbuf);
	g.nr_subbufs = rounddown_pow_of_two(min_t(u64, n, IVT_SUBBUFS_MAX));
	need = ivt_layout_plan(&d->layout, &g);
	if (WARN_ON_ONCE(!need || need > d->shm_len))
		return -EINVAL;
	return 0;
}

static void ivtk_clock(struct ivt_clock *c)
{
	unsigned long flags;

	c->freq_hz = (u64)tsc_khz * 1000;
	c->source = IVT_CLOCK_TSC;
	local_irq_save(flags);
	c->ref_ticks = rdtsc_ordered();
	c->ref_realtime_ns = ktime_get_real_ns();
	local_irq_restore(flags);
}

/*
 * Room for a metadata record of @len bytes (docs/abi.md "Metadata area"):
 * a fetch-add on meta_tail (user space appends too). NULL when the area
 * is full or another writer misaligned the tail (@what says which record
 * is lost, in the warning).
 */
static void *ivtk_meta_reserve(struct ivtk_dev *d, u32 len, const char *what)
{
	struct ivt_region_hdr *hdr = d->shm;
	u32 off;

	off = ivtk_fetch_add32(&hdr->meta_tail, len);
	if ((u64)off + len > d->layout.meta_size) {
		dev_warn(&d->pdev->dev, "metadata area full (%u bytes): %s not described\n",
			 d->layout.meta_size, what);
		return NULL;
	}
	if (off & 7) {
		dev_warn(&d->pdev->dev, "meta_tail %u misaligned by another writer: %s not described\n",
			 off, what);
		return NULL;
	}
	return d->shm + d->layout.meta_off + off;
}

static int ivtk_meta_publish_stream(struct ivtk_dev *d, u32 stream, u32 id,
				    u32 group, const char *name,
				    const struct ivtrace_field *f,
				    unsigned int nr)
{
	u32 len = ivt_meta_rec_size(nr);
	struct ivt_meta_rec *rec;
	unsigned int i;

	/* The ftrace stream's ids are fixed (ivtrace/ftrace.h): no counter. */
	if (stream == IVT_STREAM_KERNEL)
		ivtk_fetch_add32(&((struct ivt_region_hdr *)d->shm)->next_event_id[stream], 1);
	rec = ivtk_meta_reserve(d, len, name);
	if (!rec)
		return -ENOSPC;
	WRITE_ONCE(rec->len, len);
	rec->kind = IVT_META_EVENT;
	rec->nr_fields = nr;
	rec->event_id = id;
	rec->stream = stream;
	rec->group = group;
	strscpy_pad(rec->name, name, sizeof(rec->name));
	for (i = 0; i < nr; i++) {
		struct ivt_meta_field *mf = &rec->fields[i];

		strscpy_pad(mf->name, f[i].name, sizeof(mf->name));
		mf->type = f[i].type;
		mf->flags = f[i].flags;
		mf->count = f[i].type == IVT_FT_CHARS ? f[i].count : 0;
		mf->reserved = 0;
	}
	/* Publish the record: pairs with the host's load-acquire of commit. */
	ivt_store_release(&rec->commit, IVT_META_COMMIT);
	return 0;
}

/* One event description of the kernel stream (kernel table, kernel API). */
int ivtk_meta_publish(struct ivtk_dev *d, u32 id, u32 group, const char *name,
		      const struct ivtrace_field *f, unsigned int nr)
{
	return ivtk_meta_publish_stream(d, IVT_STREAM_KERNEL, id, group, name,
					f, nr);
}

/*
 * One ftrace description file for the host's decoder (struct
 * ivt_ftrace_rec): the relay's text as it read it, bounded by the caller.
 */
int ivtk_meta_publish_ftrace(struct ivtk_dev *d, u32 what, const char *system,
			     const char *text, u32 len)
{
	struct ivt_ftrace_rec *rec;
	u32 size = ivt_ftrace_rec_size(len);

	rec = ivtk_meta_reserve(d, size, "an ftrace format");
	if (!rec)
		return -ENOSPC;
	WRITE_ONCE(rec->len, size);
	rec->kind = IVT_META_FTRACE;
	rec->what = what;
	rec->text_len = len;
	strscpy_pad(rec->system, system, sizeof(rec->system));
	memcpy(rec->text, text, len);
	/* Publish the record: pairs with the host's load-acquire of commit. */
	ivt_store_release(&rec->commit, IVT_META_COMMIT);
	return 0;
}

/* The ftrace stream's events (ivtrace/ftrace.h), fixed ids. */
static int ivtk_publish_ftrace_events(struct ivtk_dev *d)
{
	static const struct ivtrace_field page[] = {
		{ .name = "page", .type = IVT_FT_BYTES },
	};
	static const struct ivtrace_field symbols[] = {
		{ .name = "text", .type = IVT_FT_BYTES },
	};
	static const char *const stat_names[IVT_FTRACE_STAT_COUNT] = {
		"entries", "overrun", "commit_overrun", "dropped", "read",
		"bytes", "clock_reset", "pages",
	};
	struct ivtrace_field stats[IVT_FTRACE_STAT_COUNT] = { };
	unsigned int i;
	int ret;

	if (!d->nr_ftrace)
		return 0;
	for (i = 0; i < IVT_FTRACE_STAT_COUNT; i++) {
		stats[i].name = stat_names[i];
		stats[i].type = IVT_FT_U64;
	}
	ret = ivtk_meta_publish_stream(d, IVT_STREAM_FTRACE, IVT_FTRACE_EV_PAGE,
				       0, "ftrace_page", page, ARRAY_SIZE(page));
	if (ret)
		return ret;
	ret = ivtk_meta_publish_stream(d, IVT_STREAM_FTRACE,
				       IVT_FTRACE_EV_STATS, 0, "ftrace_stats",
				       stats, IVT_FTRACE_STAT_COUNT);
	if (ret)
		return ret;
	return ivtk_meta_publish_stream(d, IVT_STREAM_FTRACE,
					IVT_FTRACE_EV_SYMBOLS, 0, "ftrace_symbols",
					symbols, ARRAY_SIZE(symbols));
}

static int ivtk_publish_kernel_events(struct ivtk_dev *d)
{
	unsigned int i;
	int ret;

	for (i = 0; i < IVTK_NR_EVENTS; i++) {
		const struct ivtk_event_desc *e = &ivtk_events[i];

		ret = ivtk_meta_publish(d, i, e->group, e->name, e->fields,
					e->nr_fields);
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * Format the BAR as a fresh region (new uuid: a host reader of the old
 * one notices and stops), bind every possible CPU's writer to its channel
 * and describe the events. Called before anything can write.
 */
int ivtk_region_setup(struct ivtk_dev *d)
{
	struct ivt_format_args a = { };
	uuid_t uuid;
	int ret;

	ret = ivtk_plan(d);
	if (ret)
		return ret;
	if (!tsc_khz) {
		dev_err(&d->pdev->dev, "tsc_khz is 0: no TSC frequency to describe the clock\n");
		return -ENODEV;
	}

	a.layout = d->layout;
	a.region_size = d->shm_len;
	a.features = IVT_FEAT_KERNEL | IVT_FEAT_CONTROL | IVT_FEAT_SYNC | IVT_FEAT_SYNC_SPIN;
	if (d->doorbell)
		a.features |= IVT_FEAT_DOORBELL;
	if (d->nr_ftrace)
		a.features |= IVT_FEAT_FTRACE;
	a.nr_ftrace_channels = d->nr_ftrace;
	uuid_gen(&uuid);	/* get_random_bytes(), version 4 */
	memcpy(a.uuid, uuid.b, sizeof(a.uuid));
	ivtk_clock(&a.clock);
	a.mode = d->mode;
	a.owner_pid = 0;
	ivt_region_format(d->shm, &a);
	WRITE_ONCE(((struct ivt_region_hdr *)d->shm)->flush_interval_ms,
		   d->flush_ms);
	d->ctl_seq = 0;
	d->sync_seq = 0;

	ivtk_writers_init(d);
	ret = ivtk_publish_kernel_events(d);
	if (!ret)
		ret = ivtk_publish_ftrace_events(d);
	if (ret) {
		ivtk_region_close(d);
		return ret;
	}
	ivtk_kapi_publish_all(d);	/* a full area only costs those records */
	ivtk_names_start(d);		/* a full area only costs crash names */
	return 0;
}

/* The region's owner is done: the host drains what is committed, stops. */
void ivtk_region_close(struct ivtk_dev *d)
{
	struct ivt_region_hdr *hdr = d->shm;

	/* Pairs with the host's load-acquire of state: every packet closed
	 * before this store is visible to it.
	 */
	ivt_store_release(&hdr->state, IVT_STATE_CLOSED);
}

/* IVT_CMD_SET_MODE: every channel; writers re-read it at packet open. */
void ivtk_set_mode(struct ivtk_dev *d, u32 mode)
{
	u32 i;

	for (i = 0; i < d->layout.nr_channels; i++)
		WRITE_ONCE(ivtk_channel(d, i)->mode, mode);
}

/* Does @pid name a live process in the caller's pid namespace? */
static bool ivtk_pid_alive(pid_t pid)
{
	bool alive;

	rcu_read_lock();
	alive = pid > 0 && pid_task(find_vpid(pid), PIDTYPE_TGID);
	rcu_read_unlock();
	return alive;
}

/*
 * Retire the user channels a process left ACTIVE when it stopped using
 * the region: those owned by @tgid (whose last /dev/ivtrace file is being
 * released), and those whose owner no longer exists (a forked child that
 * inherited the mapping). A packet left open is sealed from commit_pos
 * (ivt_writer_seal_orphan() in ivt_writer_init()), then the channel is
 * handed back with a store-release of RETIRED, as its owner would have.
 */
void ivtk_retire_user_channels(struct ivtk_dev *d, pid_t tgid)
{
	struct ivt_writer tmp;
	u32 c;

	/* The ftrace channels are the relay's for the region's lifetime. */
	for (c = d->layout.nr_kernel_channels + d->nr_ftrace;
	     c < d->layout.nr_channels; c++) {
		struct ivt_channel *ch = ivtk_channel(d, c);
		pid_t owner = (pid_t)READ_ONCE(ch->owner_pid);

		if (READ_ONCE(ch->state) != IVT_CHAN_ACTIVE)
			continue;
		if (owner != tgid && ivtk_pid_alive(owner))
			continue;
		ivt_writer_init(&tmp, d->shm, &d->layout, c, 0, 0, 0);
		/* Hand the channel back; the next owner's acquiring CAS sees
		 * the seal. cmpxchg: only if nobody else changed it.
		 */
		virt_mb();
		cmpxchg(&ch->state, IVT_CHAN_ACTIVE, IVT_CHAN_RETIRED);
		dev_dbg(&d->pdev->dev, "retired user channel %u of pid %d\n",
			c, owner);
	}
}
