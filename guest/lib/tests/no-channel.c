/* SPDX-License-Identifier: MIT */
/*
 * no-channel: with more writing threads than channels, a thread left
 * without one drops every event, each counted once in lost_no_channel,
 * cheaply (no lock and no channel scan per event). Once a channel is
 * given back, the thread gets it after at most IVT_RETRY_EVENTS attempts,
 * or at its next attempt once a few milliseconds have passed.
 */
#include <pthread.h>
#include <semaphore.h>
#include <string.h>
#include <time.h>

#include "t.h"

#define DROPS 20000u

static struct ivt_region *region;
static struct ivt_event ev;

struct holder {
	pthread_t th;
	sem_t held, let_go, gone;
};

/* Takes a channel and keeps it until told to let go. */
static void *holder_main(void *arg)
{
	struct holder *h = arg;
	uint64_t v = 1;

	T_OK(ivt_write(&ev, &v, sizeof(v)));
	sem_post(&h->held);
	sem_wait(&h->let_go);
	ivt_thread_release(region);
	sem_post(&h->gone);
	return NULL;
}

static void hold(struct holder *h)
{
	sem_init(&h->held, 0, 0);
	sem_init(&h->let_go, 0, 0);
	sem_init(&h->gone, 0, 0);
	T_OK(pthread_create(&h->th, NULL, holder_main, h));
	sem_wait(&h->held);
}

static void let_go(struct holder *h)
{
	sem_post(&h->let_go);
	sem_wait(&h->gone);
	T_OK(pthread_join(h->th, NULL));
}

static uint64_t lost_no_channel(void)
{
	struct ivt_stats st;

	ivt_stats(region, &st);
	T_EQ(st.lost_full + st.lost_too_big + st.lost_nested, 0);
	return st.lost_no_channel;
}

/* A third writer while two threads hold both channels: drops only. */
static void *late_writer(void *arg)
{
	struct holder *b = arg;
	struct timespec nap = { 0, 3000000 };
	uint64_t v = 3, before = lost_no_channel();
	int i;

	for (i = 0; i < 10; i++)
		T_EQ(ivt_write(&ev, &v, sizeof(v)), -ENOBUFS);
	T_EQ(lost_no_channel(), before + 10);
	let_go(b);
	/* Time, not count: 3 ms later the very next attempt claims. */
	nanosleep(&nap, NULL);
	T_OK(ivt_write(&ev, &v, sizeof(v)));
	T_EQ(lost_no_channel(), before + 10);
	return NULL;
}

int main(void)
{
	static const struct ivt_field f[] = { { "v", IVT_FT_U64, 0, 0 } };
	const char *path = t_path("nochan");
	struct holder a, b;
	pthread_t late;
	uint64_t v = 0, i, t0 = 0, ns = UINT64_MAX, extra = 0;

	region = t_create(path, 2, 2, 4096, IVT_MODE_DISCARD);
	T_OK(ivt_event_register(region, "test:v", f, 1, &ev));
	hold(&a);
	hold(&b);

	/* Count: DROPS refused writes, each counted, each cheap. The cost
	 * is the best of 10 batches, so a preemption cannot fail the test. */
	for (i = 0; i < DROPS; i++) {
		if (i % (DROPS / 10) == 0)
			t0 = t_now_ns();
		T_EQ(ivt_write(&ev, &v, sizeof(v)), -ENOBUFS);
		if (i % (DROPS / 10) == DROPS / 10 - 1 && t_now_ns() - t0 < ns)
			ns = t_now_ns() - t0;
	}
	ns /= DROPS / 10;
	T_EQ(lost_no_channel(), DROPS);
	fprintf(stderr, "no-channel: %lu ns per refused event\n", (unsigned long)ns);
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
	/* Generous: a lock plus a channel scan with kill() per event would
	 * cost well over a microsecond. */
	T_CHECK(ns < 500);
#endif

	/* A channel comes free: we get it within IVT_RETRY_EVENTS tries. */
	let_go(&a);
	while (ivt_write(&ev, &v, sizeof(v)))
		extra++;
	T_CHECK(extra < 1024);
	T_EQ(lost_no_channel(), DROPS + extra);

	/* The retry clock: a channel-less thread retries after ~2 ms. */
	T_OK(pthread_create(&late, NULL, late_writer, &b));
	T_OK(pthread_join(late, NULL));
	ivt_region_close(region);
	return T_PASS;
}
