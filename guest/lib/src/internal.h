/* SPDX-License-Identifier: MIT */
/*
 * internal.h - libivtrace's private state: the region handle, the
 * per-thread channel bindings, and the helpers the slow paths share.
 * Nothing here is part of the ABI or of the public API.
 */
#ifndef IVT_INTERNAL_H
#define IVT_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include "ivtrace.h"

/* Slow paths stay out of the callers' instruction stream. */
#define ivt_cold	__attribute__((cold, noinline))

/* Regions one thread writes at once: one on the inline fast path
 * (ivt__tls), IVT_OTHER_MAX more through ivt__reserve_other(). */
#define IVT_OTHER_MAX		3u
#define IVT_SLOTS		(1u + IVT_OTHER_MAX)

/* A thread that found no channel drops its events without trying again
 * until it has dropped this many, or this much time has passed. */
#define IVT_RETRY_EVENTS	1024u
#define IVT_RETRY_MS		2u

struct ivt_slot;

/*
 * A mapped region. `layout` is the private copy validated at create or
 * attach: after that the shared layout is never read again, so a writer
 * that scribbles on the header cannot move our pointers.
 */
struct ivt_region {
	uint8_t *base;			/* the shared mapping */
	uint64_t size;			/* bytes mapped */
	struct ivt_region_hdr *hdr;	/* == base */
	struct ivt_layout layout;	/* private, validated */
	uint64_t freq_hz;		/* clock.freq_hz as found at create/attach */
	uint8_t uuid[16];		/* as found at create/attach */
	uint64_t features;		/* as found at create/attach */
	uint32_t default_mode;		/* as found at create/attach */
	uint32_t creator_pid;		/* pid that formatted it; 0 if attached */
	uint64_t gen;			/* unique per handle in this process */

	/* Under ivt__lock. */
	int refs;			/* the handle + one per bound slot */
	int dead;			/* closed: unmapped, never touch base */
	struct ivt_slot *slots;		/* slots bound to one of our channels */
	struct ivt_region *next, *prev;	/* ivt__regions, while open */
};

/* One binding of a thread to a channel: slot 0 is the thread's ivt__tls,
 * slots 1.. its other[] entries. `t->region` holds a reference. */
struct ivt_slot {
	struct ivt_tls *t;
	struct ivt_slot *next, *prev;	/* region->slots, under ivt__lock */
	int linked;			/* on region->slots */
};

/* A region this thread could not get a channel in, and when to retry. */
struct ivt_backoff {
	struct ivt_region *r;		/* compared with ->gen: r may be reused */
	uint64_t gen;
	uint32_t skip;			/* events left to drop before retrying */
	uint64_t retry_tsc;		/* ... or ivt_clock() past this */
};

struct ivt_thread {
	uint32_t tid;
	struct ivt_slot slot[IVT_SLOTS];
	struct ivt_tls other[IVT_OTHER_MAX];
	struct ivt_backoff backoff[IVT_SLOTS];
};

/* The "bound to nothing" region: never equal to a real handle nor to
 * NULL, so a zeroed struct ivt_event cannot hit the fast path. */
extern struct ivt_region ivt__none;
#define IVT_NONE	(&ivt__none)

/* Protects every region's refs/dead/slots and the region list. Taken on
 * slow paths only (claim, release, close, register), never per event. */
extern pthread_mutex_t ivt__lock;
extern struct ivt_region *ivt__regions;

/* thread.c */
int ivt__lib_init(void);
void ivt__region_put(struct ivt_region *r);
void ivt__unbind_all(struct ivt_region *r);
void ivt__slow_enter(void);
void ivt__slow_exit(void);

/* channel.c */
int ivt__claim(struct ivt_region *r, uint32_t pid, uint32_t tid);
void ivt__retire(struct ivt_writer *w);
void ivt__populate(struct ivt_region *r, uint32_t chan);

/* clock.c */
uint64_t ivt__tsc_hz(void);
void ivt__clock_ref(uint64_t *ticks, uint64_t *realtime_ns);
void ivt__uuid(uint8_t uuid[16]);

/* Channel `i` of `r` (i < r->layout.nr_channels, checked by the caller). */
static inline struct ivt_channel *ivt__channel(const struct ivt_region *r,
					       uint32_t i)
{
	return (struct ivt_channel *)(r->base + r->layout.channels_off +
				      (uint64_t)i * sizeof(struct ivt_channel));
}

/* Bound the count of events dropped because a thread had no channel.
 * Relaxed fetch-add: writers share the counter and nothing is ordered
 * by it (docs/abi.md, memory ordering table). */
static inline void ivt__count_no_channel(struct ivt_region *r)
{
	__atomic_fetch_add(&r->hdr->lost_no_channel, 1, __ATOMIC_RELAXED);
}

#endif /* IVT_INTERNAL_H */
