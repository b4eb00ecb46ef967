/* SPDX-License-Identifier: MIT */
/*
 * region.c - create (format), attach (validate), close, and read the
 * statistics of a region. A region found on disk may have been written
 * by another, possibly buggy, process: attach validates a private copy of
 * the layout and nothing afterwards re-reads the shared one.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ivtrace/format.h>
#include "internal.h"

/* Largest region we map: 64 TiB, far beyond any ivshmem BAR. */
#define IVT_REGION_MAX		(1ull << 46)

#define IVT_DEF_CHANNELS	64u
#define IVT_DEF_SUBBUFS		8u
#define IVT_DEF_SUBBUF_SIZE	(256u << 10)
#define IVT_DEF_META_SIZE	(256u << 10)

/* ---- handles -------------------------------------------------------- */

static struct ivt_region *ivt__region_new(void *base, uint64_t size,
					  const struct ivt_region_hdr *h)
{
	static uint64_t next_gen;
	struct ivt_region *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->base = base;
	r->size = size;
	r->hdr = base;
	r->layout = h->layout;
	r->freq_hz = h->clock.freq_hz;
	memcpy(r->uuid, h->uuid, sizeof(r->uuid));
	r->features = h->features;
	r->default_mode = h->default_mode;
	r->refs = 1;

	ivt__slow_enter();
	pthread_mutex_lock(&ivt__lock);
	r->gen = ++next_gen;
	r->next = ivt__regions;
	if (r->next)
		r->next->prev = r;
	ivt__regions = r;
	pthread_mutex_unlock(&ivt__lock);
	ivt__slow_exit();
	return r;
}

/* ---- create --------------------------------------------------------- */

static int ivt__geometry(const struct ivt_region_opts *o,
			 struct ivt_geometry *g, uint32_t *mode)
{
	static const struct ivt_region_opts none;

	if (!o)
		o = &none;
	if (o->mode != IVT_MODE_DISCARD && o->mode != IVT_MODE_OVERWRITE)
		return -EINVAL;
	g->nr_channels = o->channels ? o->channels : IVT_DEF_CHANNELS;
	g->nr_kernel_channels = 0;	/* every channel is a user channel */
	g->nr_ftrace_channels = 0;
	g->nr_subbufs = o->subbufs ? o->subbufs : IVT_DEF_SUBBUFS;
	g->subbuf_size = o->subbuf_size ? o->subbuf_size : IVT_DEF_SUBBUF_SIZE;
	g->meta_size = o->meta_size ? o->meta_size : IVT_DEF_META_SIZE;
	*mode = o->mode;
	return 0;
}

/* Open (or create) `path` and size it to exactly `size` bytes. */
static int ivt__open_sized(const char *path, uint64_t size)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size)) {
		int err = -errno;

		close(fd);
		return err;
	}
	return fd;
}

static void *ivt__map(int fd, uint64_t size, int prot)
{
	void *p = mmap(NULL, (size_t)size, prot, MAP_SHARED, fd, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void ivt__format_args(struct ivt_format_args *a, uint64_t size,
			     uint32_t mode)
{
	a->region_size = size;
	a->features = IVT_FEAT_LOOPBACK;
	ivt__uuid(a->uuid);
	a->clock.source = IVT_CLOCK_TSC;
	a->clock.freq_hz = ivt__tsc_hz();
	ivt__clock_ref(&a->clock.ref_ticks, &a->clock.ref_realtime_ns);
	a->mode = mode;
	a->owner_pid = (uint32_t)getpid();
}

int ivt_region_create(const char *path, const struct ivt_region_opts *opts,
		      struct ivt_region **out)
{
	struct ivt_format_args a;
	struct ivt_geometry g;
	struct ivt_region *r;
	uint64_t size;
	uint32_t mode;
	void *base;
	int fd, err;

	if (!path || !out)
		return -EINVAL;
	memset(&a, 0, sizeof(a));
	err = ivt__geometry(opts, &g, &mode);
	if (err)
		return err;
	size = ivt_layout_plan(&a.layout, &g);
	if (!size)
		return -EINVAL;
	/* QEMU maps ivshmem BARs only in power-of-two sizes. */
	size = ivt_pow2_ceil(size < IVT_REGION_MIN ? IVT_REGION_MIN : size);
	if (size > IVT_REGION_MAX || size > SIZE_MAX)
		return -EINVAL;

	err = ivt__lib_init();
	if (err)
		return err;
	fd = ivt__open_sized(path, size);
	if (fd < 0)
		return fd;
	base = ivt__map(fd, size, PROT_READ | PROT_WRITE);
	if (!base) {
		err = -errno;
		close(fd);
		return err;
	}
	close(fd);

	ivt__format_args(&a, size, mode);
	ivt_region_format(base, &a);

	r = ivt__region_new(base, size, base);
	if (!r) {
		munmap(base, size);
		return -ENOMEM;
	}
	r->creator_pid = (uint32_t)getpid();
	*out = r;
	return 0;
}

/* ---- attach: validate a region someone else formatted --------------- */

struct ivt_range {
	uint64_t off, len;
};

/* Every range inside [0, size), non-empty, and no two overlapping. */
static int ivt__ranges_ok(const struct ivt_range *rg, int n, uint64_t size)
{
	int i, j;

	for (i = 0; i < n; i++) {
		if (!rg[i].len || rg[i].off > size || rg[i].len > size - rg[i].off)
			return 0;
		for (j = 0; j < i; j++)
			if (rg[i].off < rg[j].off + rg[j].len &&
			    rg[j].off < rg[i].off + rg[i].len)
				return 0;
	}
	return 1;
}

static int ivt__pow2_in(uint64_t v, uint64_t lo, uint64_t hi)
{
	return v && !(v & (v - 1)) && v >= lo && v <= hi;
}

/*
 * Check a private copy of a header against the size we mapped. Limits
 * are those of abi.h; offsets must be page aligned (docs/abi.md "Layout"),
 * inside the mapping, and the four parts must not overlap. Products fit
 * in 64 bits once the factors are in range (2^12 * 2^16 * 2^24).
 */
static int ivt__check_header(const struct ivt_region_hdr *h, uint64_t mapped)
{
	const struct ivt_layout *l = &h->layout;
	struct ivt_range rg[4];

	if (h->abi_major != IVT_ABI_MAJOR || h->hdr_size != IVT_PAGE_SIZE ||
	    h->region_size != mapped ||
	    !ivt__pow2_in(h->region_size, IVT_REGION_MIN, IVT_REGION_MAX))
		return -EPROTO;
	if (l->channel_size != sizeof(struct ivt_channel) ||
	    !l->nr_channels || l->nr_channels > IVT_CHANNELS_MAX ||
	    l->nr_kernel_channels > l->nr_channels ||
	    !ivt__pow2_in(l->nr_subbufs, IVT_SUBBUFS_MIN, IVT_SUBBUFS_MAX) ||
	    !ivt__pow2_in(l->subbuf_size, IVT_SUBBUF_MIN, IVT_SUBBUF_MAX))
		return -EPROTO;
	if ((l->channels_off | l->meta_off | l->pool_off) & (IVT_PAGE_SIZE - 1) ||
	    l->meta_size % 8)
		return -EPROTO;

	rg[0] = (struct ivt_range){ 0, IVT_PAGE_SIZE };
	rg[1] = (struct ivt_range){ l->channels_off,
		(uint64_t)l->nr_channels * sizeof(struct ivt_channel) };
	rg[2] = (struct ivt_range){ l->meta_off, l->meta_size };
	rg[3] = (struct ivt_range){ l->pool_off,
		(uint64_t)l->nr_channels * l->nr_subbufs * l->subbuf_size };
	return ivt__ranges_ok(rg, 4, mapped) ? 0 : -EPROTO;
}

/*
 * Copy the header out of shared memory. The acquire load of magic pairs
 * with the formatter's store-release (ivt_region_format): with the magic
 * seen, the copy holds the formatted values. The copy is what we check
 * and keep, so a concurrent scribbler cannot change it after the check.
 */
static int ivt__read_header(const void *base, struct ivt_region_hdr *h)
{
	const struct ivt_region_hdr *sh = base;
	uint64_t magic = ivt_load_acquire(&sh->magic);

	if (magic == 0)
		return -ENODATA;	/* not formatted, or being re-formatted */
	if (magic != IVT_MAGIC)
		return -EPROTO;
	memcpy(h, sh, sizeof(*h));
	return 0;
}

/*
 * How many bytes to map: a regular file's size; for a device (a guest's
 * /dev/ivtrace) the size the header announces, read from its first page.
 */
static int ivt__region_size(int fd, uint64_t *size)
{
	struct ivt_region_hdr h;
	struct stat st;
	void *p;
	int err;

	if (fstat(fd, &st))
		return -errno;
	if (S_ISREG(st.st_mode)) {
		if (st.st_size == 0)
			return -ENODATA;	/* created, not sized yet */
		if (st.st_size < (off_t)IVT_PAGE_SIZE)
			return -EPROTO;
		*size = (uint64_t)st.st_size;
		return 0;
	}
	p = ivt__map(fd, IVT_PAGE_SIZE, PROT_READ);
	if (!p)
		return -errno;
	err = ivt__read_header(p, &h);
	munmap(p, IVT_PAGE_SIZE);
	if (err)
		return err;
	if (!ivt__pow2_in(h.region_size, IVT_REGION_MIN, IVT_REGION_MAX))
		return -EPROTO;
	*size = h.region_size;
	return 0;
}

static int ivt__attach_fd(int fd, struct ivt_region **out)
{
	struct ivt_region_hdr h;
	struct ivt_region *r = NULL;
	uint64_t size = 0;
	void *base;
	int err;

	err = ivt__region_size(fd, &size);
	if (err)
		return err;
	if (size > SIZE_MAX)
		return -EPROTO;
	base = ivt__map(fd, size, PROT_READ | PROT_WRITE);
	if (!base)
		return -errno;
	err = ivt__read_header(base, &h);
	if (!err)
		err = ivt__check_header(&h, size);
	if (!err) {
		r = ivt__region_new(base, size, &h);
		err = r ? 0 : -ENOMEM;
	}
	if (err) {
		munmap(base, size);
		return err;
	}
	*out = r;
	return 0;
}

int ivt_region_attach(const char *path, struct ivt_region **out)
{
	int fd, err;

	if (!path || !out)
		return -EINVAL;
	err = ivt__lib_init();
	if (err)
		return err;
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	err = ivt__attach_fd(fd, out);
	close(fd);
	return err;
}

/* ---- close ------------------------------------------------------------ */

void ivt_region_close(struct ivt_region *r)
{
	if (!r)
		return;
	ivt_thread_release(r);

	ivt__slow_enter();
	pthread_mutex_lock(&ivt__lock);
	ivt__unbind_all(r);
	if (r->creator_pid == (uint32_t)getpid())
		/* Release: every packet flushed above (ours, and the other
		 * threads' in ivt__unbind_all) is published before the reader
		 * sees CLOSED; pairs with its load-acquire of state. */
		ivt_store_release(&r->hdr->state, IVT_STATE_CLOSED);
	r->dead = 1;
	munmap(r->base, r->size);
	if (r->prev)
		r->prev->next = r->next;
	else
		ivt__regions = r->next;
	if (r->next)
		r->next->prev = r->prev;
	ivt__region_put(r);
	pthread_mutex_unlock(&ivt__lock);
	ivt__slow_exit();
}

/* ---- statistics and identity ----------------------------------------- */

void ivt_stats(struct ivt_region *r, struct ivt_stats *st)
{
	uint32_t i;

	memset(st, 0, sizeof(*st));
	for (i = 0; i < r->layout.nr_channels; i++) {
		const struct ivt_channel *ch = ivt__channel(r, i);

		/* Relaxed: statistics. Each counter has one writer (the
		 * channel's owner) or is bumped atomically (lost_nested). */
		st->lost_full += ivt_read_once(ch->lost_full);
		st->lost_too_big += ivt_read_once(ch->lost_too_big);
		st->lost_nested += ivt_read_once(ch->lost_nested);
	}
	/* Relaxed: bumped with atomic fetch-add by channel-less threads. */
	st->lost_no_channel = ivt_read_once(r->hdr->lost_no_channel);
}

void ivt_region_info(struct ivt_region *r, struct ivt_region_info *info)
{
	memset(info, 0, sizeof(*info));
	info->size = r->size;
	memcpy(info->uuid, r->uuid, sizeof(info->uuid));
	info->features = r->features;
	info->freq_hz = r->freq_hz;
	info->nr_channels = r->layout.nr_channels;
	info->nr_kernel_channels = r->layout.nr_kernel_channels;
	info->nr_subbufs = r->layout.nr_subbufs;
	info->subbuf_size = r->layout.subbuf_size;
	info->meta_size = r->layout.meta_size;
	info->mode = r->default_mode;
	info->created = r->creator_pid != 0;
	info->base = r->base;
}
