/* SPDX-License-Identifier: MIT */
/*
 * thread.c - per-thread channels. A thread claims a user channel on its
 * first event, gives it back at thread exit (or ivt_thread_release), and
 * a forked child forgets the channels it inherited. Also the out-of-line
 * halves of ivt_reserve()/ivt_commit() for every region but the one on
 * the thread's inline fast path.
 *
 * Locking: ivt__lock guards the bookkeeping (refs, dead, slot lists) and
 * is only taken on slow paths. The channel itself needs no lock: it has
 * one writer, its owning thread. Signal handlers may write events; one
 * that interrupts a slow path of its own thread drops its event
 * (ivt__in_slow) rather than deadlocking on ivt__lock.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

struct ivt_region ivt__none;

__thread struct ivt_tls ivt__tls __attribute__((tls_model("initial-exec"))) = {
	.region = IVT_NONE,
};

static __thread struct ivt_thread *ivt__self;
static __thread int ivt__in_slow;

pthread_mutex_t ivt__lock = PTHREAD_MUTEX_INITIALIZER;
struct ivt_region *ivt__regions;

static pthread_key_t ivt__key;
static pthread_once_t ivt__once = PTHREAD_ONCE_INIT;

/* {state, owner_pid} of a channel as one 64-bit word (little-endian).
 * Claims compare-and-swap both at once, so a thread that saw a dead owner
 * can never take the channel from a new, live one (ABA). */
_Static_assert(offsetof(struct ivt_channel, owner_pid) ==
	       offsetof(struct ivt_channel, state) + 4 &&
	       offsetof(struct ivt_channel, state) % 8 == 0,
	       "state and owner_pid form one aligned u64");
#define IVT_OWN(state, pid)	((uint64_t)(state) | (uint64_t)(pid) << 32)

static uint64_t *ivt__own(struct ivt_channel *ch)
{
	return (uint64_t *)(void *)&ch->state;
}

static uint32_t ivt__gettid(void)
{
	return (uint32_t)syscall(SYS_gettid);
}

/* Mark the calling thread as inside a slow path (see the file comment). */
void ivt__slow_enter(void)
{
	ivt__in_slow++;
	ivt_signal_fence();	/* set before we take locks or touch slots */
}

void ivt__slow_exit(void)
{
	ivt_signal_fence();	/* slots consistent before a handler may enter */
	ivt__in_slow--;
}

/* ---- regions' reference counts (under ivt__lock) ---------------------- */

void ivt__region_put(struct ivt_region *r)
{
	if (--r->refs == 0)
		free(r);
}

static void ivt__link(struct ivt_region *r, struct ivt_slot *s)
{
	s->prev = NULL;
	s->next = r->slots;
	if (s->next)
		s->next->prev = s;
	r->slots = s;
	s->linked = 1;
}

static void ivt__unlink(struct ivt_region *r, struct ivt_slot *s)
{
	if (!s->linked)
		return;
	if (s->prev)
		s->prev->next = s->next;
	else
		r->slots = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->next = s->prev = NULL;
	s->linked = 0;
}

/* ---- claiming and retiring a channel ---------------------------------- */

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
static int ivt__claim(struct ivt_region *r, uint32_t pid, uint32_t tid)
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
static void ivt__retire(struct ivt_writer *w)
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
static void ivt__populate(struct ivt_region *r, uint32_t chan)
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

/* ---- slots: a thread's bindings --------------------------------------- */

static void ivt__slot_bind(struct ivt_thread *th, struct ivt_slot *s,
			  struct ivt_region *r, uint32_t chan)
{
	int cpu = sched_getcpu();

	ivt_writer_init(&s->t->w, r->base, &r->layout, chan,
			cpu < 0 ? 0 : (uint32_t)cpu, (uint32_t)getpid(), th->tid);
	ivt__populate(r, chan);
	/* Compiler-only: the writer is ready before a signal handler on
	 * this thread can find it through t->region. */
	ivt_signal_fence();
	s->t->region = r;
	r->refs++;
	ivt__link(r, s);
}

/* Drop the slot's binding, retiring the channel if the region is open.
 * Under ivt__lock, on the slot's own thread. */
static void ivt__slot_release(struct ivt_slot *s)
{
	struct ivt_region *r = s->t->region;

	if (r == IVT_NONE)
		return;
	/* Unbind first: a signal handler arriving now finds no writer and
	 * takes the (guarded) slow path instead of racing the flush. */
	s->t->region = IVT_NONE;
	ivt_signal_fence();
	if (!r->dead && s->linked)
		ivt__retire(&s->t->w);
	ivt__unlink(r, s);
	ivt__region_put(r);
}

/* A free slot for a new binding, the fast-path one first. Bindings to
 * closed regions are dropped on the way. */
static struct ivt_slot *ivt__free_slot(struct ivt_thread *th)
{
	unsigned int i;

	for (i = 0; i < IVT_SLOTS; i++) {
		struct ivt_slot *s = &th->slot[i];

		if (s->t->region != IVT_NONE && s->t->region->dead)
			ivt__slot_release(s);
		if (s->t->region == IVT_NONE)
			return s;
	}
	return NULL;
}

static struct ivt_slot *ivt__slot_of(struct ivt_thread *th,
				     const struct ivt_region *r)
{
	unsigned int i;

	for (i = 0; th && i < IVT_SLOTS; i++)
		if (th->slot[i].t->region == r)
			return &th->slot[i];
	return NULL;
}

/* Called by ivt_region_close() under ivt__lock: retire the channels the
 * other threads hold in `r` (they must have stopped writing to it). Their
 * slots keep their reference until they notice the region is dead. */
void ivt__unbind_all(struct ivt_region *r)
{
	while (r->slots) {
		struct ivt_slot *s = r->slots;

		ivt__retire(&s->t->w);
		ivt__unlink(r, s);
	}
}

/* ---- per-thread state ------------------------------------------------- */

static void ivt__thread_init(struct ivt_thread *th)
{
	unsigned int i;

	th->tid = ivt__gettid();
	th->slot[0].t = &ivt__tls;
	for (i = 0; i < IVT_OTHER_MAX; i++) {
		th->other[i].region = IVT_NONE;
		th->slot[i + 1].t = &th->other[i];
	}
}

static struct ivt_thread *ivt__thread(void)
{
	struct ivt_thread *th = ivt__self;

	if (th)
		return th;
	th = calloc(1, sizeof(*th));
	if (!th)
		return NULL;
	ivt__thread_init(th);
	if (pthread_setspecific(ivt__key, th)) {
		free(th);
		return NULL;
	}
	ivt__self = th;
	return th;
}

static void ivt__release_all(struct ivt_thread *th)
{
	unsigned int i;

	pthread_mutex_lock(&ivt__lock);
	for (i = 0; i < IVT_SLOTS; i++)
		ivt__slot_release(&th->slot[i]);
	memset(th->backoff, 0, sizeof(th->backoff));
	pthread_mutex_unlock(&ivt__lock);
}

/* pthread key destructor: the thread is exiting. Runs again if a later
 * destructor writes an event (and claims a channel) after us. */
static void ivt__thread_exit(void *arg)
{
	struct ivt_thread *th = arg;

	ivt__slow_enter();
	ivt__release_all(th);
	ivt__self = NULL;
	ivt__slow_exit();
	free(th);
}

/* exit(): the main thread never runs key destructors. */
static void ivt__at_exit(void)
{
	struct ivt_thread *th = ivt__self;

	if (!th)
		return;
	ivt__slow_enter();
	ivt__release_all(th);
	ivt__slow_exit();
}

/* fork(): hold the lock across it so the child's copy is consistent. */
static void ivt__fork_prepare(void)
{
	pthread_mutex_lock(&ivt__lock);
}

static void ivt__fork_parent(void)
{
	pthread_mutex_unlock(&ivt__lock);
}

/*
 * In the child only the forking thread exists, and every binding copied
 * from the parent names a channel the parent still owns: writing to it,
 * or retiring it, would corrupt the parent's ring. Forget them all
 * without touching shared memory; the child claims its own channels.
 */
static void ivt__fork_child(void)
{
	struct ivt_thread *th = ivt__self;
	struct ivt_region *r;
	unsigned int i;

	for (i = 0; th && i < IVT_SLOTS; i++) {
		struct ivt_slot *s = &th->slot[i];

		if (s->t->region == IVT_NONE)
			continue;
		r = s->t->region;
		s->t->region = IVT_NONE;
		ivt__unlink(r, s);
		ivt__region_put(r);
	}
	if (th) {
		th->tid = ivt__gettid();
		memset(th->backoff, 0, sizeof(th->backoff));
	}
	/* Other threads' bindings: those threads do not exist here. */
	for (r = ivt__regions; r; r = r->next) {
		while (r->slots) {
			ivt__unlink(r, r->slots);
			r->refs--;	/* the handle's reference remains */
		}
	}
	ivt__in_slow = 0;
	pthread_mutex_unlock(&ivt__lock);
}

static void ivt__init_once(void)
{
	if (pthread_key_create(&ivt__key, ivt__thread_exit))
		abort();	/* PTHREAD_KEYS_MAX exhausted at startup */
	pthread_atfork(ivt__fork_prepare, ivt__fork_parent, ivt__fork_child);
	atexit(ivt__at_exit);
}

void ivt__lib_init(void)
{
	pthread_once(&ivt__once, ivt__init_once);
}

/* ---- channel-less threads: drop cheaply, retry occasionally ----------- */

static struct ivt_backoff *ivt__backoff_of(struct ivt_thread *th,
					   const struct ivt_region *r)
{
	unsigned int i;

	for (i = 0; i < IVT_SLOTS; i++)
		if (th->backoff[i].r == r && th->backoff[i].gen == r->gen)
			return &th->backoff[i];
	return NULL;
}

/* 1 if the thread should drop this event without trying to claim. */
static int ivt__backoff_wait(struct ivt_thread *th, struct ivt_region *r)
{
	struct ivt_backoff *b = ivt__backoff_of(th, r);

	if (!b)
		return 0;
	if (--b->skip && ivt_clock() < b->retry_tsc)
		return 1;
	b->r = NULL;
	return 0;
}

/* IVT_RETRY_MS in ticks of the region's clock (the formatter measured it;
 * a value outside 1 MHz..100 GHz is not believed). */
static uint64_t ivt__retry_ticks(const struct ivt_region *r)
{
	uint64_t hz = r->freq_hz;

	if (hz < 1000000ull || hz > 100000000000ull)
		hz = ivt__tsc_hz();
	return hz / 1000 * IVT_RETRY_MS;
}

static void ivt__backoff_arm(struct ivt_thread *th, struct ivt_region *r)
{
	struct ivt_backoff *b = ivt__backoff_of(th, r);
	unsigned int i;

	for (i = 0; !b && i < IVT_SLOTS; i++)
		if (!th->backoff[i].r)
			b = &th->backoff[i];
	if (!b)		/* more regions than entries: evict one */
		b = &th->backoff[r->gen % IVT_SLOTS];
	b->r = r;
	b->gen = r->gen;
	b->skip = IVT_RETRY_EVENTS;
	b->retry_tsc = ivt_clock() + ivt__retry_ticks(r);
}

static struct ivt_tls *ivt__bind_locked(struct ivt_thread *th,
					struct ivt_region *r)
{
	struct ivt_tls *t = NULL;
	struct ivt_slot *s;
	int chan;

	pthread_mutex_lock(&ivt__lock);
	if (r->dead)
		goto out;
	s = ivt__free_slot(th);
	chan = s ? ivt__claim(r, (uint32_t)getpid(), th->tid) : -1;
	if (chan < 0) {
		ivt__backoff_arm(th, r);
		goto out;
	}
	ivt__slot_bind(th, s, r, (uint32_t)chan);
	t = s->t;
out:
	pthread_mutex_unlock(&ivt__lock);
	return t;
}

/*
 * First event of this thread in `r`: claim a channel and bind it to a
 * free slot. NULL when the event is to be dropped; the drop is counted
 * in lost_no_channel.
 */
static ivt_cold struct ivt_tls *ivt__bind(struct ivt_region *r)
{
	struct ivt_thread *th;
	struct ivt_tls *t = NULL;

	if (ivt__in_slow) {	/* a signal handler interrupted our slow path */
		ivt__count_no_channel(r);
		return NULL;
	}
	ivt__slow_enter();
	th = ivt__thread();
	if (th && !ivt__backoff_wait(th, r))
		t = ivt__bind_locked(th, r);
	if (!t)
		ivt__count_no_channel(r);
	ivt__slow_exit();
	return t;
}

/* The thread's binding for `r`, or NULL. */
static inline struct ivt_tls *ivt__find(const struct ivt_region *r)
{
	struct ivt_thread *th = ivt__self;
	unsigned int i;

	if (ivt__tls.region == r)
		return &ivt__tls;
	for (i = 0; th && i < IVT_OTHER_MAX; i++)
		if (th->other[i].region == r)
			return &th->other[i];
	return NULL;
}

/* ---- the out-of-line halves of ivt_reserve() and ivt_commit() --------- */

uint8_t *ivt__reserve_other(const struct ivt_event *ev, uint32_t len)
{
	struct ivt_tls *t;
	uint8_t *dst;

	if (ivt_unlikely(!ev->region))		/* never registered */
		return NULL;
	t = ivt__find(ev->region);
	if (!t)
		t = ivt__bind(ev->region);
	if (!t || !ivt_writer_enter(&t->w))
		return NULL;
	dst = ivt_writer_reserve(&t->w, ivt_clock(), ev->id, len);
	if (ivt_unlikely(!dst))
		ivt_writer_exit(&t->w);
	return dst;
}

void ivt__commit_other(const struct ivt_event *ev)
{
	struct ivt_tls *t = ivt__find(ev->region);

	if (ivt_unlikely(!t))	/* commit without a successful reserve */
		return;
	ivt_writer_commit(&t->w);
	ivt_writer_exit(&t->w);
}

int ivt__write_other(const struct ivt_event *ev, const void *payload,
		     uint32_t len)
{
	uint8_t *dst = ivt__reserve_other(ev, len);

	if (!dst)
		return -ENOBUFS;
	memcpy(dst, payload, len);
	ivt__commit_other(ev);
	return 0;
}

/* ---- public slow paths ------------------------------------------------ */

void ivt_flush(struct ivt_region *r)
{
	struct ivt_tls *t = ivt__find(r);

	/* Not from a signal handler that interrupted this thread's write. */
	if (t && !t->w.busy)
		ivt_writer_flush(&t->w);
}

void ivt_thread_release(struct ivt_region *r)
{
	struct ivt_thread *th = ivt__self;
	struct ivt_backoff *b;
	struct ivt_slot *s;

	if (!th)
		return;
	ivt__slow_enter();
	pthread_mutex_lock(&ivt__lock);
	s = ivt__slot_of(th, r);
	if (s)
		ivt__slot_release(s);
	b = ivt__backoff_of(th, r);
	if (b)
		b->r = NULL;
	pthread_mutex_unlock(&ivt__lock);
	ivt__slow_exit();
}
