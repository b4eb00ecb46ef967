/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * ivtrace/format.h - plan a region's layout and format it.
 *
 * Used by whoever owns a region: the guest kernel module for a guest's
 * ivshmem BAR, libivtrace for a loopback /dev/shm file. The host never
 * formats; it only reads.
 */
#ifndef IVTRACE_FORMAT_H
#define IVTRACE_FORMAT_H

#include "abi.h"
#include "barrier.h"

struct ivt_geometry {
	uint32_t nr_channels;		/* total: kernel + ftrace + user */
	uint32_t nr_kernel_channels;	/* per-CPU kernel channels, first in the table */
	uint32_t nr_ftrace_channels;	/* per-CPU ftrace relay channels, next (ABI 1.2) */
	uint32_t nr_subbufs;		/* per channel, power of two */
	uint32_t subbuf_size;		/* bytes, power of two */
	uint32_t meta_size;		/* bytes of the metadata area */
};

static inline int __ivt_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

static inline uint64_t __ivt_align(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

/*
 * Fill `l` for geometry `g`. Returns the bytes the region needs (round up
 * to a power of two for ivshmem), or 0 if the geometry is out of range.
 */
static inline uint64_t ivt_layout_plan(struct ivt_layout *l,
				       const struct ivt_geometry *g)
{
	uint64_t pool_bytes;

	if (g->nr_channels == 0 || g->nr_channels > IVT_CHANNELS_MAX ||
	    g->nr_kernel_channels > g->nr_channels ||
	    g->nr_ftrace_channels > g->nr_channels - g->nr_kernel_channels ||
	    !__ivt_pow2(g->nr_subbufs) || g->nr_subbufs < IVT_SUBBUFS_MIN ||
	    g->nr_subbufs > IVT_SUBBUFS_MAX ||
	    !__ivt_pow2(g->subbuf_size) || g->subbuf_size < IVT_SUBBUF_MIN ||
	    g->subbuf_size > IVT_SUBBUF_MAX ||
	    g->meta_size < IVT_PAGE_SIZE || g->meta_size > (1u << 30))
		return 0;

	__builtin_memset(l, 0, sizeof(*l));
	l->nr_channels = g->nr_channels;
	l->nr_kernel_channels = g->nr_kernel_channels;
	l->channel_size = sizeof(struct ivt_channel);
	l->nr_subbufs = g->nr_subbufs;
	l->subbuf_size = g->subbuf_size;
	l->channels_off = IVT_PAGE_SIZE;
	l->meta_off = __ivt_align(l->channels_off +
				  (uint64_t)g->nr_channels * sizeof(struct ivt_channel),
				  IVT_PAGE_SIZE);
	l->meta_size = (uint32_t)__ivt_align(g->meta_size, IVT_PAGE_SIZE);
	l->pool_off = __ivt_align(l->meta_off + l->meta_size, IVT_PAGE_SIZE);
	pool_bytes = (uint64_t)g->nr_channels * g->nr_subbufs * g->subbuf_size;
	return l->pool_off + pool_bytes;
}

/* Smallest power of two >= v (v <= 2^63). */
static inline uint64_t ivt_pow2_ceil(uint64_t v)
{
	uint64_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

struct ivt_format_args {
	struct ivt_layout layout;	/* from ivt_layout_plan() */
	uint64_t region_size;		/* bytes mapped, >= the planned size */
	uint64_t features;		/* IVT_FEAT_* */
	uint8_t  uuid[16];		/* random */
	struct ivt_clock clock;
	uint32_t mode;			/* IVT_MODE_* for every channel */
	uint32_t owner_pid;
	uint32_t nr_ftrace_channels;	/* after the kernel channels (ABI 1.2) */
};

/*
 * Format the region at `region` (shared memory, possibly stale from an
 * earlier run). The sub-buffer pool is not cleared: nothing in it counts
 * until a commit_pos says so. Readers see either no magic or a complete
 * region.
 */
static inline void ivt_region_format(void *region,
				     const struct ivt_format_args *a)
{
	struct ivt_region_hdr *hdr = (struct ivt_region_hdr *)region;
	const struct ivt_layout *l = &a->layout;
	uint8_t *base = (uint8_t *)region;
	uint32_t i;

	/* Withdraw the old magic before changing anything; a reader that
	 * re-validates sees it gone (or a new uuid). */
	ivt_write_once(hdr->magic, 0);
	ivt_full_fence();

	__builtin_memset(base + sizeof(hdr->magic), 0,
			 IVT_PAGE_SIZE - sizeof(hdr->magic));
	__builtin_memset(base + l->channels_off, 0,
			 l->meta_off - l->channels_off);
	__builtin_memset(base + l->meta_off, 0, l->meta_size);

	hdr->abi_major = IVT_ABI_MAJOR;
	hdr->abi_minor = IVT_ABI_MINOR;
	hdr->hdr_size = sizeof(*hdr);
	hdr->region_size = a->region_size;
	hdr->features = a->features;
	__builtin_memcpy(hdr->uuid, a->uuid, sizeof(hdr->uuid));
	hdr->default_mode = a->mode;
	hdr->owner_pid = a->owner_pid;
	hdr->layout = *l;
	hdr->nr_ftrace_channels = a->nr_ftrace_channels;
	hdr->clock = a->clock;

	for (i = 0; i < l->nr_channels; i++) {
		struct ivt_channel *ch = (struct ivt_channel *)
			(base + l->channels_off + (uint64_t)i * sizeof(*ch));
		uint32_t ftrace = i - l->nr_kernel_channels;

		ch->mode = a->mode;
		if (i < l->nr_kernel_channels) {
			ch->stream = IVT_STREAM_KERNEL;
			ch->cpu = i;
		} else if (ftrace < a->nr_ftrace_channels) {
			/* Owned by the relay from the start: never claimed
			 * by a user-space writer, never retired. */
			ch->stream = IVT_STREAM_FTRACE;
			ch->cpu = ftrace;
		} else {
			ch->stream = IVT_STREAM_USER;
			ch->cpu = 0xFFFFFFFFu;
		}
		ch->state = ch->stream == IVT_STREAM_USER ? IVT_CHAN_FREE :
			    IVT_CHAN_ACTIVE;
	}
	hdr->state = IVT_STATE_LIVE;

	/* Publish the region: pairs with the reader's load-acquire of magic,
	 * after which every store above is visible. */
	ivt_store_release(&hdr->magic, IVT_MAGIC);
}

#endif /* IVTRACE_FORMAT_H */
