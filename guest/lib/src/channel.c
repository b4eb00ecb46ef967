/* SPDX-License-Identifier: MIT */
/*
 * channel.c - claiming a user channel and giving it back.
 *
 * A user channel's owner is recorded in the channel table, shared with
 * every other writer process and with the host: state (FREE, ACTIVE,
 * RETIRED) and owner_pid. Writers change them only with the atomics
 * below; the host only reads them. Within this process claims are
 * serialised by ivt__lock; across processes the compare-and-swap decides.
 */
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>

#include "internal.h"

/* {state, owner_pid} of a channel as one 64-bit word (little-endian).
 * Claims compare-and-swap both at once, so a thread that saw a dead owner
 * can never take the channel from a new, live one (ABA). Every writer
 * access to state goes through this word; the host reads state alone
 * (a 32-bit load of an aligned half: atomic on every target we have). */
_Static_assert(offsetof(struct ivt_channel, owner_pid) ==
	       offsetof(struct ivt_channel, state) + 4 &&
	       offsetof(struct ivt_channel, state) % 8 == 0,
	       "state and owner_pid form one aligned u64");
#define IVT_OWN(state, pid)	((uint64_t)(state) | (uint64_t)(pid) << 32)

static uint64_t *ivt__own(struct ivt_channel *ch)
{
	return (uint64_t *)(void *)&ch->state;
}

/* kill(pid, 0) fails with ESRCH only for a pid that no longer exists.
 * Zero and out-of-range pids name nobody: a corrupt owner is dead too. */
static int ivt__pid_dead(uint32_t pid)
{
	if (pid == 0 || pid > 0x400000u)	/* PID_MAX_LIMIT */
		return 1;
	return kill((pid_t)pid, 0) && errno == ESRCH;
}

/* The claim passes, in order of preference. */
enum ivt_pass {
	IVT_PASS_FREE,		/* never used: a whole empty ring */
	IVT_PASS_RETIRED,	/* given back: the one with the least unread data */
	IVT_PASS_DEAD,		/* ACTIVE, but its owning process is gone */
	IVT_PASS_COUNT,
};

/* Is channel word `own` (state, owner) claimable in this pass? */
static int ivt__claimable(uint64_t own, uint32_t pid, enum ivt_pass pass)
{
	uint32_t state = (uint32_t)own, owner = (uint32_t)(own >> 32);

	switch (pass) {
	case IVT_PASS_FREE:
		return state == IVT_CHAN_FREE;
	case IVT_PASS_RETIRED:
		return state == IVT_CHAN_RETIRED;
	default:
		return state == IVT_CHAN_ACTIVE && owner != pid &&
		       ivt__pid_dead(owner);
	}
}

/* Packets of `ch` the host has not consumed yet (0 in overwrite mode,
 * where nothing waits for the host). Relaxed: a preference only. */
static uint64_t ivt__backlog(const struct ivt_region *r,
			     const struct ivt_channel *ch)
{
	uint64_t S = r->layout.subbuf_size;
	uint64_t used = (ivt_read_once(ch->commit_pos) + S - 1) / S;
	uint64_t consumed = ivt_read_once(ch->consumed);

	if (ivt_read_once(ch->mode) == IVT_MODE_OVERWRITE || consumed >= used)
		return 0;
	return used - consumed;
}

/* The best candidate of a pass, with its ownership word, or -1. */
static int ivt__candidate(struct ivt_region *r, uint32_t pid,
			  enum ivt_pass pass, uint64_t *own)
{
	const struct ivt_layout *l = &r->layout;
	uint64_t best_backlog = UINT64_MAX;
	int best = -1;
	uint32_t i;

	for (i = l->nr_kernel_channels; i < l->nr_channels; i++) {
		struct ivt_channel *ch = ivt__channel(r, i);
		/* Relaxed: only picks which compare-and-swap to try; the
		 * CAS re-checks the whole word. */
		uint64_t w = __atomic_load_n(ivt__own(ch), __ATOMIC_RELAXED);
		uint64_t backlog;

		if (!ivt__claimable(w, pid, pass))
			continue;
		if (pass != IVT_PASS_RETIRED) {
			*own = w;
			return (int)i;
		}
		backlog = ivt__backlog(r, ch);
		if (backlog < best_backlog) {
			best_backlog = backlog;
			best = (int)i;
			*own = w;
		}
	}
	return best;
}

/*
 * Claim a user channel of `r`; returns its index, or -1 if none is free.
 * FREE channels first (an empty ring each), then the RETIRED one with the
 * least unread data (a reused ring may still hold packets the host has
 * not read), then channels whose owning process died without retiring
 * them (crashed or killed).
 */
int ivt__claim(struct ivt_region *r, uint32_t pid, uint32_t tid)
{
	uint32_t tries = r->layout.nr_channels;
	enum ivt_pass pass = IVT_PASS_FREE;
	uint64_t own;
	int i;

	while (pass < IVT_PASS_COUNT) {
		struct ivt_channel *ch;

		i = ivt__candidate(r, pid, pass, &own);
		if (i < 0) {
			pass++;
			continue;
		}
		ch = ivt__channel(r, (uint32_t)i);
		/* Acquire on success: pairs with the previous owner's
		 * store-release of RETIRED in ivt__retire(), so we see its
		 * last commit_pos, events_closed and packet stores before we
		 * continue its ring. */
		if (__atomic_compare_exchange_n(ivt__own(ch), &own,
						IVT_OWN(IVT_CHAN_ACTIVE, pid), 0,
						__ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
			/* Relaxed: we own the channel now; these are for
			 * the reader's information only. */
			ivt_write_once(ch->owner_tid, tid);
			ivt_write_once(ch->claims, ivt_read_once(ch->claims) + 1);
			return i;
		}
		if (!--tries)	/* another process keeps winning: give up */
			break;
	}
	return -1;
}

/* Close the open packet and give the channel back. Not while the writer
 * is mid-event (a caller broke the "stopped writing" rule): the channel
 * then stays ACTIVE and is reclaimed once this process is gone. */
void ivt__retire(struct ivt_writer *w)
{
	if (w->busy)
		return;
	ivt_writer_flush(w);
	/* Release: the flushed packet, commit_pos and events_closed are
	 * visible before the channel is seen free; pairs with the acquire
	 * of the next owner's CAS in ivt__try_claim(). */
	ivt_store_release(ivt__own(w->ch), IVT_OWN(IVT_CHAN_RETIRED, w->pid));
}

/* Prefault the channel's sub-buffers so the first pass over the ring does
 * not take page faults in the fast path. Contents are unchanged
 * (MADV_POPULATE_WRITE, Linux 5.14); where unsupported, nothing happens. */
void ivt__populate(struct ivt_region *r, uint32_t chan)
{
#ifdef MADV_POPULATE_WRITE
	const struct ivt_layout *l = &r->layout;

	madvise(r->base + ivt_subbuf_offset(l, chan, 0),
		(size_t)l->nr_subbufs * l->subbuf_size, MADV_POPULATE_WRITE);
#else
	(void)r;
	(void)chan;
#endif
}
