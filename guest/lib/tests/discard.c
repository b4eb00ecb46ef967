/* SPDX-License-Identifier: MIT */
/*
 * discard: with no reader, a discard-mode ring takes exactly as many
 * events as its packets hold, then drops every later one and counts each
 * drop: lost_full == attempted - written. When the "host" frees packets
 * (consumed, store-release), writing resumes, and the next packet header
 * carries the running drop count.
 */
#include <string.h>

#include "t.h"
#include "walker.h"

/* 4-byte header + u64 payload; the packet's last byte is never used */
#define PKT_EVENTS ((4096 - 88 - 1) / 12)

struct expect {
	uint64_t next;
};

static int check(const struct w_event *e, void *arg)
{
	struct expect *x = arg;

	T_EQ(w_u64(e->payload), x->next);
	x->next++;
	return 0;
}

static uint64_t write_n(const struct ivt_event *ev, uint64_t from, uint64_t n,
			uint64_t *first_drop)
{
	uint64_t i, ok = 0;

	for (i = from; i < from + n; i++) {
		if (ivt_write(ev, &i, sizeof(i)) == 0) {
			T_CHECK(*first_drop == UINT64_MAX);	/* no write after a drop */
			ok++;
		} else if (*first_drop == UINT64_MAX) {
			*first_drop = i;
		}
	}
	return ok;
}

int main(void)
{
	static const struct ivt_field f[] = { { "seq", IVT_FT_U64, 0, 0 } };
	const char *path = t_path("discard");
	struct ivt_region *r = t_create(path, 1, 2, 4096, IVT_MODE_DISCARD);
	uint64_t ok, attempted = 10000, first_drop = UINT64_MAX;
	struct expect x = { 0 };
	struct ivt_packet_hdr *ph;
	struct ivt_channel *ch;
	struct ivt_stats st;
	struct ivt_event ev;
	struct w_region wr;
	struct w_chan ci;

	T_OK(ivt_event_register(r, "test:seq", f, 1, &ev));
	ok = write_n(&ev, 0, attempted, &first_drop);
	T_EQ(ok, 2 * PKT_EVENTS);
	T_EQ(first_drop, ok);

	T_OK(w_open(&wr, path) ? -EIO : 0);
	ch = (struct ivt_channel *)(wr.base + wr.l.channels_off);
	T_EQ(ch->lost_full, attempted - ok);
	ivt_stats(r, &st);
	T_EQ(st.lost_full, attempted - ok);
	T_EQ(st.lost_too_big + st.lost_nested + st.lost_no_channel, 0);
	T_EQ(ch->commit_pos, 2 * 4096);		/* both packets closed */
	if (w_walk_channel(&wr, 0, check, NULL, &x, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(x.next, ok);

	/* The "host" is done with both packets: the writer may reuse them.
	 * Release pairs with the writer's load-acquire of consumed. */
	ivt_store_release(&ch->consumed, 2);
	first_drop = UINT64_MAX;
	T_EQ(write_n(&ev, attempted, attempted, &first_drop), 2 * PKT_EVENTS);
	T_EQ(first_drop, attempted + 2 * PKT_EVENTS);
	T_EQ(ch->lost_full, 2 * (attempted - ok));
	ph = (struct ivt_packet_hdr *)(wr.base + ivt_subbuf_offset(&wr.l, 0, 2));
	T_EQ(ph->packet_seq_num, 2);
	T_EQ(ph->first_event_seq, ok);
	/* events_discarded: rewritten at close with the count then. */
	T_EQ(ph->events_discarded, attempted - ok);

	x.next = attempted;
	if (w_walk_channel(&wr, 0, check, NULL, &x, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(ci.first_seq, 2);
	T_EQ(x.next, attempted + 2 * PKT_EVENTS);
	w_close(&wr);
	ivt_region_close(r);
	return T_PASS;
}
