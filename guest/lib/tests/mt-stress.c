/* SPDX-License-Identifier: MIT */
/*
 * mt-stress: 4 threads x 200k events at once. Each thread gets a channel
 * of its own; afterwards every channel holds exactly one thread's events,
 * with contiguous sequence numbers 0..N-1 in order, one owner tid in
 * every packet header, and commit_pos / events_closed consistent with the
 * packets walked. Run under -fsanitize=thread by `make test-tsan`.
 */
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "t.h"
#include "walker.h"

#define THREADS 4
#define N 200000u

static struct ivt_region *region;
static struct ivt_event ev;
static uint32_t tids[THREADS];
static pthread_barrier_t go;

struct payload {
	uint16_t thread;
	uint64_t seq;
} __attribute__((packed));

static void *writer(void *arg)
{
	struct payload p = { (uint16_t)(uintptr_t)arg, 0 };
	uint32_t fails = 0;

	tids[p.thread] = (uint32_t)syscall(SYS_gettid);
	pthread_barrier_wait(&go);
	for (p.seq = 0; p.seq < N; p.seq++)
		fails += ivt_write(&ev, &p, sizeof(p)) != 0;
	if (fails) {
		struct ivt_stats st;

		ivt_stats(region, &st);
		t_fail(__FILE__, __LINE__, "thread %u: %u writes failed (full %lu "
		       "too big %lu nested %lu no channel %lu)", p.thread, fails,
		       (unsigned long)st.lost_full, (unsigned long)st.lost_too_big,
		       (unsigned long)st.lost_nested, (unsigned long)st.lost_no_channel);
	}
	return NULL;	/* the thread-exit destructor flushes and retires */
}

struct chan_check {
	int thread;		/* -1 until the first event */
	uint64_t next;
	uint32_t tid;
};

static int check_event(const struct w_event *e, void *arg)
{
	struct chan_check *c = arg;
	uint16_t t = w_u16(e->payload);

	if (c->thread < 0) {
		T_CHECK(t < THREADS);
		c->thread = t;
		c->tid = e->pkt->owner_tid;
		T_EQ(c->tid, tids[t]);
	}
	T_EQ(t, c->thread);
	T_EQ(w_u64(e->payload + 2), c->next);
	T_EQ(e->pkt->owner_tid, c->tid);
	c->next++;
	return 0;
}

int main(void)
{
	static const struct ivt_field f[] = {
		{ "thread", IVT_FT_U16, 0, 0 }, { "seq", IVT_FT_U64, 0, 0 },
	};
	const char *path = t_path("mtstress");
	pthread_t th[THREADS];
	int seen[THREADS] = { 0 };
	struct ivt_stats st;
	struct w_region wr;
	uintptr_t i;
	uint32_t c, used = 0;

	/* 64 KiB x 64 per channel: room for all 200k 16-byte events. */
	region = t_create(path, THREADS + 2, 64, 65536, IVT_MODE_DISCARD);
	T_OK(ivt_event_register(region, "test:mt", f, 2, &ev));
	pthread_barrier_init(&go, NULL, THREADS);
	for (i = 0; i < THREADS; i++)
		T_OK(pthread_create(&th[i], NULL, writer, (void *)i));
	for (i = 0; i < THREADS; i++)
		T_OK(pthread_join(th[i], NULL));
	ivt_stats(region, &st);
	T_EQ(st.lost_full + st.lost_too_big + st.lost_nested + st.lost_no_channel, 0);

	T_OK(w_open(&wr, path) ? -EIO : 0);
	for (c = 0; c < wr.l.nr_channels; c++) {
		struct ivt_channel *ch = (struct ivt_channel *)
			(wr.base + wr.l.channels_off) + c;
		struct chan_check cc = { -1, 0, 0 };
		struct w_chan ci;

		if (!ch->claims) {
			T_EQ(ch->commit_pos, 0);
			continue;
		}
		used++;
		T_EQ(ch->claims, 1);
		T_EQ(ch->state, IVT_CHAN_RETIRED);	/* released at thread exit */
		if (w_walk_channel(&wr, c, check_event, NULL, &cc, &ci))
			t_fail(__FILE__, __LINE__, "walk: %s", w_error);
		T_EQ(cc.next, N);
		T_EQ(ci.events, N);
		T_EQ(ci.first_seq, 0);
		T_EQ(ch->commit_pos, (uint64_t)ci.packets * 65536);
		T_EQ(ch->events_closed, N);
		T_EQ(ch->owner_tid, cc.tid);
		seen[cc.thread]++;
	}
	T_EQ(used, THREADS);
	for (i = 0; i < THREADS; i++)
		T_EQ(seen[i], 1);
	w_close(&wr);
	ivt_region_close(region);
	return T_PASS;
}
