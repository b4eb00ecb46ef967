/* SPDX-License-Identifier: MIT */
/*
 * mt-reader: writers and a live reader at once, on small discard rings.
 * The reader plays the host: load-acquire commit_pos, copy each complete
 * packet, check the copy, store-release consumed. Every event the writer
 * reported written arrives exactly once, in order; the gaps in a thread's
 * sequence are exactly the events it gave up on, and lost_full counts
 * every refused write.
 * Under -fsanitize=thread this checks the commit_pos and consumed
 * pairings of the protocol.
 */
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "t.h"
#include "walker.h"

#define THREADS 2
#define N 300000u
#define SUBBUF 4096u
#define NSUB 4u

static struct ivt_region *region;
static struct ivt_event ev;
static struct w_region wr;
static uint64_t written[THREADS], failed[THREADS], skipped[THREADS];
static int writers_done;

struct payload {
	uint16_t thread;
	uint64_t seq;
} __attribute__((packed));

/* First half: a failed write is retried until the reader has made room
 * (so sub-buffers are surely reused); second half: it is given up. */
static void *writer(void *arg)
{
	struct payload p = { (uint16_t)(uintptr_t)arg, 0 };
	uint64_t ok = 0, fails = 0, given_up = 0;

	for (p.seq = 0; p.seq < N; p.seq++) {
		while (ivt_write(&ev, &p, sizeof(p))) {
			fails++;
			if (p.seq >= N / 2) {
				given_up++;
				break;
			}
			sched_yield();
		}
		ok += 1;
	}
	written[p.thread] = ok - given_up;
	failed[p.thread] = fails;
	skipped[p.thread] = given_up;
	ivt_thread_release(region);	/* flush the last packet */
	return NULL;
}

struct reader {
	int thread[64];			/* channel -> writer, -1 unknown */
	uint64_t consumed[64];
	uint64_t next[THREADS];		/* next expected seq per thread */
	uint64_t seen[THREADS], gaps[THREADS];
	uint64_t last_discarded[64];
	uint32_t chan;
};

static int on_event(const struct w_event *e, void *arg)
{
	struct reader *rd = arg;
	uint16_t t = w_u16(e->payload);
	uint64_t seq = w_u64(e->payload + 2);

	T_CHECK(t < THREADS);
	if (rd->thread[rd->chan] < 0)
		rd->thread[rd->chan] = t;
	T_EQ(t, rd->thread[rd->chan]);	/* one thread per channel */
	T_CHECK(seq >= rd->next[t]);	/* in order, never twice */
	rd->gaps[t] += seq - rd->next[t];
	rd->next[t] = seq + 1;
	rd->seen[t]++;
	return 0;
}

/* Drain the complete packets of channel c; returns packets read. */
static int drain(struct reader *rd, uint32_t c)
{
	struct ivt_channel *ch = (struct ivt_channel *)(wr.base + wr.l.channels_off) + c;
	static uint8_t copy[SUBBUF];
	struct ivt_packet_hdr *h = (struct ivt_packet_hdr *)copy;
	/* Acquire: pairs with the writer's store-release of commit_pos
	 * (close), so the copy below sees the whole packet. */
	uint64_t done = ivt_load_acquire(&ch->commit_pos) / SUBBUF;
	struct w_packet p;
	int n = 0;

	rd->chan = c;
	for (; rd->consumed[c] < done; rd->consumed[c]++, n++) {
		uint64_t seq = rd->consumed[c];

		memcpy(copy, wr.base + ivt_subbuf_offset(&wr.l, c, seq), SUBBUF);
		if (w_walk_packet(&wr, c, seq, copy, h->content_size / 8, 1,
				  on_event, rd, &p))
			t_fail(__FILE__, __LINE__, "packet: %s", w_error);
		T_CHECK(h->events_discarded >= rd->last_discarded[c]);
		rd->last_discarded[c] = h->events_discarded;
		/* Release: our reads of the packet happen before the writer
		 * may reuse it; pairs with its load-acquire of consumed. */
		ivt_store_release(&ch->consumed, seq + 1);
	}
	return n;
}

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	uint32_t c;
	int busy = 1;

	while (busy || !__atomic_load_n(&writers_done, __ATOMIC_ACQUIRE)) {
		busy = 0;
		for (c = 0; c < wr.l.nr_channels; c++)
			busy |= drain(rd, c);
	}
	for (c = 0; c < wr.l.nr_channels; c++)	/* after the final flushes */
		drain(rd, c);
	return NULL;
}

int main(void)
{
	static const struct ivt_field f[] = {
		{ "thread", IVT_FT_U16, 0, 0 }, { "seq", IVT_FT_U64, 0, 0 },
	};
	const char *path = t_path("mtreader");
	static struct reader rd;
	struct ivt_region_info ri;
	pthread_t th[THREADS], rth;
	struct ivt_stats st;
	uintptr_t i;
	uint64_t lost = 0, seen = 0;

	region = t_create(path, THREADS, NSUB, SUBBUF, IVT_MODE_DISCARD);
	T_OK(ivt_event_register(region, "test:mt", f, 2, &ev));
	ivt_region_info(region, &ri);
	T_OK(w_use(&wr, ri.base, ri.size) ? -EIO : 0);	/* same addresses as the writer */
	memset(rd.thread, -1, sizeof(rd.thread));
	T_OK(pthread_create(&rth, NULL, reader_main, &rd));
	for (i = 0; i < THREADS; i++)
		T_OK(pthread_create(&th[i], NULL, writer, (void *)i));
	for (i = 0; i < THREADS; i++)
		T_OK(pthread_join(th[i], NULL));
	__atomic_store_n(&writers_done, 1, __ATOMIC_RELEASE);
	T_OK(pthread_join(rth, NULL));

	ivt_stats(region, &st);
	for (i = 0; i < THREADS; i++) {
		T_EQ(rd.seen[i], written[i]);
		T_EQ(rd.gaps[i] + (N - rd.next[i]), skipped[i]);
		seen += rd.seen[i];
		lost += failed[i];
	}
	/* Every failed write, retried or given up, was counted once. */
	T_EQ(st.lost_full, lost);
	T_CHECK(seen > 4 * THREADS * NSUB * (SUBBUF / 16));	/* rings reused */
	fprintf(stderr, "mt-reader: %lu events read, %lu writes refused while "
		"the reader lagged\n", (unsigned long)seen, (unsigned long)lost);
	w_close(&wr);		/* before close: it is the library's mapping */
	ivt_region_close(region);
	return T_PASS;
}
