/* SPDX-License-Identifier: MIT */
/*
 * close: giving channels back. A thread that exits without calling
 * anything has its packet flushed and its channel RETIRED by the thread
 * destructor. ivt_region_close() flushes and retires the channels of
 * threads that are still alive but done writing, marks the region CLOSED
 * only if this process created it, and those threads later exit, or move
 * on to another region, without touching the unmapped one.
 */
#include <pthread.h>
#include <semaphore.h>
#include <string.h>

#include "t.h"
#include "walker.h"

static const struct ivt_field f[] = { { "v", IVT_FT_U64, 0, 0 } };
static struct ivt_event ev, ev2;
static sem_t wrote, closed, moved;

static void write_n(const struct ivt_event *e, uint64_t n)
{
	uint64_t v;

	for (v = 0; v < n; v++)
		T_OK(ivt_write(e, &v, sizeof(v)));
}

static void *exits_quietly(void *arg)
{
	(void)arg;
	write_n(&ev, 10);
	return NULL;		/* no flush, no release: the destructor does it */
}

/* Writes, stays alive across the close, then writes to a new region. */
static void *outlives(void *arg)
{
	(void)arg;
	write_n(&ev, 7);
	sem_post(&wrote);
	sem_wait(&closed);
	write_n(&ev2, 3);	/* rebinding drops the dead binding */
	ivt_flush(ev2.region);
	sem_post(&moved);
	return NULL;		/* exit: must not touch the closed region */
}

static uint32_t events_in(struct w_region *wr, uint32_t chan)
{
	struct w_chan ci;

	if (w_walk_channel(wr, chan, NULL, NULL, NULL, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	return ci.events;
}

int main(void)
{
	const char *path = t_path("close"), *path2 = t_path("close2");
	struct ivt_region *r, *r2, *a;
	struct ivt_channel *ch;
	struct w_region wr, wr2;
	pthread_t th;

	r = t_create(path, 2, 4, 4096, IVT_MODE_DISCARD);
	T_OK(ivt_event_register(r, "test:v", f, 1, &ev));
	T_OK(w_open(&wr, path) ? -EIO : 0);
	ch = (struct ivt_channel *)(wr.base + wr.l.channels_off);

	T_OK(pthread_create(&th, NULL, exits_quietly, NULL));
	T_OK(pthread_join(th, NULL));
	T_EQ(ch[0].state, IVT_CHAN_RETIRED);
	T_EQ(ch[0].commit_pos, 4096);		/* flushed */
	T_EQ(events_in(&wr, 0), 10);

	/* The next thread prefers the FREE channel over the RETIRED one. */
	sem_init(&wrote, 0, 0);
	sem_init(&closed, 0, 0);
	sem_init(&moved, 0, 0);
	T_OK(pthread_create(&th, NULL, outlives, NULL));
	sem_wait(&wrote);
	T_EQ(ch[1].state, IVT_CHAN_ACTIVE);
	T_EQ(ch[1].claims, 1);
	T_EQ(ch[1].commit_pos, 88 + 7 * 12);	/* not flushed yet */
	write_n(&ev, 5);			/* main: reuses channel 0 */
	T_EQ(ch[0].claims, 2);
	T_EQ(ch[0].commit_pos, 4096 + 88 + 5 * 12);

	/* An attached handle never marks the region closed. */
	T_OK(ivt_region_attach(path, &a));
	ivt_region_close(a);
	T_EQ(wr.hdr->state, IVT_STATE_LIVE);
	T_EQ(ch[1].state, IVT_CHAN_ACTIVE);	/* not a's channel */

	ivt_region_close(r);
	T_EQ(wr.hdr->state, IVT_STATE_CLOSED);
	T_EQ(ch[0].state, IVT_CHAN_RETIRED);
	T_EQ(ch[1].state, IVT_CHAN_RETIRED);	/* the live thread's, too */
	T_EQ(ch[0].commit_pos, 2 * 4096);
	T_EQ(ch[1].commit_pos, 4096);
	T_EQ(events_in(&wr, 0), 10 + 5);
	T_EQ(events_in(&wr, 1), 7);

	/* A new region may reuse the old handle's memory; the thread's
	 * stale binding must neither match it nor touch the old mapping. */
	r2 = t_create(path2, 2, 2, 4096, IVT_MODE_DISCARD);
	T_OK(ivt_event_register(r2, "test:v", f, 1, &ev2));
	sem_post(&closed);
	sem_wait(&moved);
	T_OK(pthread_join(th, NULL));
	T_OK(w_open(&wr2, path2) ? -EIO : 0);
	T_EQ(events_in(&wr2, 0), 3);
	T_EQ(((struct ivt_channel *)(wr2.base + wr2.l.channels_off))->state,
	     IVT_CHAN_RETIRED);
	w_close(&wr2);
	w_close(&wr);
	ivt_region_close(r2);
	return T_PASS;
}
