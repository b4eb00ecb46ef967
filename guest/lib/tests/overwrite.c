/* SPDX-License-Identifier: MIT */
/*
 * overwrite: a flight-recorder ring never drops for lack of room. With
 * no reader every write succeeds, open_seq and commit_pos keep advancing
 * far past the ring, and the ring holds the newest events, contiguous up
 * to the last one written.
 */
#include <string.h>

#include "t.h"
#include "walker.h"

#define N 100000u

struct expect {
	uint64_t next, first;
	int started;
};

static int check(const struct w_event *e, void *arg)
{
	struct expect *x = arg;
	uint64_t seq = w_u64(e->payload);

	if (!x->started) {
		x->started = 1;
		x->first = x->next = seq;
	}
	T_EQ(seq, x->next);
	/* A packet's first event is number first_event_seq: the writer
	 * counted every earlier event, overwritten or not. */
	if (e->index == 0)
		T_EQ(seq, e->pkt->first_event_seq);
	x->next++;
	return 0;
}

int main(void)
{
	static const struct ivt_field f[] = { { "seq", IVT_FT_U64, 0, 0 } };
	const char *path = t_path("overwrite");
	struct ivt_region *r = t_create(path, 1, 4, 4096, IVT_MODE_OVERWRITE);
	uint64_t i, open_seq = 0, commit = 0;
	struct expect x = { 0 };
	struct ivt_channel *ch;
	struct ivt_stats st;
	struct ivt_event ev;
	struct w_region wr;
	struct w_chan ci;

	T_OK(ivt_event_register(r, "test:seq", f, 1, &ev));
	T_OK(w_open(&wr, path) ? -EIO : 0);
	ch = (struct ivt_channel *)(wr.base + wr.l.channels_off);
	T_EQ(ch->mode, IVT_MODE_OVERWRITE);

	for (i = 0; i < N; i++) {
		T_OK(ivt_write(&ev, &i, sizeof(i)));
		if (i == N / 2) {
			open_seq = ch->open_seq;
			commit = ch->commit_pos;
			T_CHECK(open_seq >= 4);		/* wrapped already */
			T_EQ(commit >> 12, open_seq);	/* inside the open packet */
		}
	}
	T_CHECK(ch->open_seq > open_seq && ch->commit_pos > commit);
	T_EQ(ch->open_seq, (N - 1) / ((4096 - 88 - 1) / 12));	/* last byte unused */
	ivt_stats(r, &st);
	T_EQ(st.lost_full + st.lost_too_big + st.lost_nested + st.lost_no_channel, 0);

	ivt_flush(r);
	T_EQ(ch->commit_pos, (ch->open_seq + 1) * 4096);
	T_EQ(ch->events_closed, N);
	if (w_walk_channel(&wr, 0, check, NULL, &x, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(ci.packets, 4);			/* the whole ring, newest packets */
	T_EQ(x.next, N);			/* ends with the last event */
	T_EQ(x.next - x.first, ci.events);
	w_close(&wr);
	ivt_region_close(r);
	return T_PASS;
}
