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
#include <sched.h>
#include <stdlib.h>
#include <string.h>
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

static int ivt__init_err;

static void ivt__init_once(void)
{
	/* Fails only when the process used up PTHREAD_KEYS_MAX keys. */
	ivt__init_err = -pthread_key_create(&ivt__key, ivt__thread_exit);
	if (ivt__init_err)
		return;
	pthread_atfork(ivt__fork_prepare, ivt__fork_parent, ivt__fork_child);
	atexit(ivt__at_exit);
}

/* Once per process, before the first region: 0 or -EAGAIN. */
int ivt__lib_init(void)
{
	pthread_once(&ivt__once, ivt__init_once);
	return ivt__init_err;
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
