/* SPDX-License-Identifier: MIT */
/*
 * writer-unit: abi/include/ivtrace/writer.h driven directly with chosen
 * timestamps, on a channel the library never claimed. Checks the header
 * form at the exact boundaries (id 30/31, a gap of 2^27 - 1 / 2^27
 * ticks), a clock stepping backwards (clamped), the packet switch, and
 * the packet context fields at close.
 */
#include <string.h>

#include "t.h"
#include "walker.h"

struct step {
	uint64_t ts;		/* given to reserve */
	uint32_t id;
	int extended;		/* expected form */
	uint64_t want_ts;	/* expected decoded value */
};

static const struct step steps[] = {
	{ 1000000, 0, 0, 1000000 },
	{ 1000000 + IVT_EV_TS_MASK, 1, 0, 1000000 + IVT_EV_TS_MASK },	/* gap 2^27-1 */
	{ 1000000 + 2 * IVT_EV_TS_MASK + 1, 1, 1, 1000000 + 2 * IVT_EV_TS_MASK + 1 }, /* gap 2^27 */
	{ 5, 2, 0, 1000000 + 2 * IVT_EV_TS_MASK + 1 },	/* backwards: clamped */
	{ 1ull << 40, 30, 1, 1ull << 40 },		/* big jump */
	{ (1ull << 40) + 1, 30, 0, (1ull << 40) + 1 },	/* id 30: compact */
	{ (1ull << 40) + 2, 31, 1, (1ull << 40) + 2 },	/* id 31: extended */
	{ (1ull << 40) + 3, 4095, 1, (1ull << 40) + 3 },
	/* low bits wrap: compact across a 2^27 boundary */
	{ (1ull << 41) - 10, 3, 1, (1ull << 41) - 10 },
	{ (1ull << 41) + 10, 3, 0, (1ull << 41) + 10 },
};
#define NSTEPS (sizeof(steps) / sizeof(steps[0]))

struct seen {
	unsigned int n;
};

static int check(const struct w_event *e, void *arg)
{
	struct seen *s = arg;
	const struct step *st;

	if (s->n >= NSTEPS) {	/* the filler events of the second part */
		s->n++;
		return 0;
	}
	st = &steps[s->n++];
	T_EQ(e->id, st->id);
	T_EQ(e->extended, st->extended);
	T_EQ(e->ts, st->want_ts);
	T_EQ(e->len, 4);
	T_EQ(w_u32(e->payload), s->n - 1);
	return 0;
}

int main(void)
{
	static const struct ivt_field f[] = { { "v", IVT_FT_U32, 0, 0 } };
	const char *path = t_path("writer");
	struct ivt_region_opts o = { .channels = 2, .subbufs = 2,
				     .subbuf_size = 4096, .meta_size = 1 << 20 };
	struct ivt_region *r;
	struct ivt_packet_hdr *ph;
	struct ivt_writer w;
	struct ivt_event ev;
	struct w_region wr;
	struct w_chan ci;
	struct seen s = { 0 };
	uint32_t i, chan = 1, per_pkt;
	char name[32];

	T_OK(ivt_region_create(path, &o, &r));
	/* 4096 types, so that every id used above has a description. */
	for (i = 0; i < IVT_EVENT_IDS_MAX && i < 4096; i++) {
		snprintf(name, sizeof(name), "unit:e%u", i);
		T_OK(ivt_event_register(r, name, f, 1, &ev));
		T_EQ(ev.id, i);
	}
	T_OK(w_open(&wr, path) ? -EIO : 0);

	ivt_writer_init(&w, wr.base, &wr.l, chan, 7, 11, 13);
	for (i = 0; i < NSTEPS; i++) {
		uint8_t *p = ivt_writer_reserve(&w, steps[i].ts, steps[i].id, 4);

		T_CHECK(p != NULL);
		ivt_put_u32(p, i);
		ivt_writer_commit(&w);
	}
	/* One packet so far, still open: its committed prefix is walkable. */
	T_EQ(ivt_read_once(w.ch->commit_pos) >> 12, 0);
	ivt_writer_flush(&w);
	T_EQ(w.ch->commit_pos, 4096);
	ph = (struct ivt_packet_hdr *)(wr.base + ivt_subbuf_offset(&wr.l, chan, 0));
	T_EQ(ph->event_count, NSTEPS);
	T_EQ(ph->cpu_id, 7);
	T_EQ(ph->owner_pid, 11);
	T_EQ(ph->owner_tid, 13);
	T_EQ(ph->timestamp_begin, steps[0].ts);
	T_EQ(ph->timestamp_end, steps[NSTEPS - 1].want_ts);
	T_EQ(ph->first_event_seq, 0);

	/* Fill the ring (2 packets) with compact 8-byte events: packet 1
	 * takes (4096 - 88 - 1) / 8 of them (an event never uses a packet's
	 * last byte), then the ring is full. */
	per_pkt = (4096 - sizeof(struct ivt_packet_hdr) - 1) / 8;
	for (i = 0; i < per_pkt + 5; i++) {
		uint8_t *p = ivt_writer_reserve(&w, (1ull << 42) + i, 0, 4);

		if (i < per_pkt) {
			T_CHECK(p != NULL);
			ivt_put_u32(p, NSTEPS + i);
			ivt_writer_commit(&w);
		} else {
			T_CHECK(p == NULL);	/* discard mode, no reader */
		}
	}
	T_EQ(w.ch->lost_full, 5);
	T_EQ(w.ch->commit_pos, 2 * 4096);	/* packet 1 closed when full */
	T_EQ(w.ch->events_closed, NSTEPS + per_pkt);
	ph = (struct ivt_packet_hdr *)(wr.base + ivt_subbuf_offset(&wr.l, chan, 1));
	T_EQ(ph->event_count, per_pkt);
	T_EQ(ph->first_event_seq, NSTEPS);
	T_EQ(ph->content_size, (88 + per_pkt * 8) * 8);	/* full but its last byte */

	if (w_walk_channel(&wr, chan, check, NULL, &s, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(s.n, NSTEPS + per_pkt);
	T_EQ(ci.packets, 2);

	/* A new writer on the same channel resumes after the last commit. */
	ivt_writer_init(&w, wr.base, &wr.l, chan, 0, 0, 0);
	T_EQ(w.seq, 2);
	T_EQ(w.first_event_seq, NSTEPS + per_pkt);
	w_close(&wr);
	ivt_region_close(r);
	return T_PASS;
}
