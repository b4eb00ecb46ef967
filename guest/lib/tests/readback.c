/* SPDX-License-Identifier: MIT */
/*
 * readback: one thread's events come back byte for byte. Compact 4-byte
 * headers carry the id and the low 27 bits of a timestamp taken inside
 * the write; payloads are the fields in order; packet headers name the
 * channel, the sequence and the owner; release and close publish states.
 */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "t.h"
#include "walker.h"

#define N 600

struct expect {
	uint64_t before[N], after[N];
	uint32_t id_a, id_s;
	unsigned int seen;
};

/* Event i: "test:a" { x u64 = i * 3, y u32 = ~i } for even i, else
 * "test:s" { s string = "ev<i>", c chars[5] = "ab", b bytes = i % 7 bytes of i }. */
static uint32_t build(uint8_t *buf, unsigned int i, const struct expect *x,
		      uint32_t *id)
{
	uint8_t bytes[8], *p = buf;
	char s[16];
	int n;

	if (i % 2 == 0) {
		*id = x->id_a;
		p = ivt_put_u64(p, (uint64_t)i * 3);
		p = ivt_put_u32(p, ~(uint32_t)i);
		return (uint32_t)(p - buf);
	}
	*id = x->id_s;
	n = snprintf(s, sizeof(s), "ev%u", i);
	p = ivt_put_string(p, s, (uint32_t)n);
	memcpy(p, "ab\0\0\0", 5);
	p += 5;
	memset(bytes, (int)i, sizeof(bytes));
	p = ivt_put_bytes(p, bytes, i % 7);
	return (uint32_t)(p - buf);
}

static int check_event(const struct w_event *e, void *arg)
{
	struct expect *x = arg;
	unsigned int i = x->seen++;
	uint8_t want[64];
	uint32_t id, len = build(want, i, x, &id);

	T_CHECK(i < N);
	T_EQ(e->id, id);
	T_EQ(e->len, len);
	T_CHECK(!memcmp(e->payload, want, len));
	/* Compact header: id in bits 0..4, low 27 timestamp bits above. */
	T_CHECK(!e->extended);
	T_EQ(e->word & 31, id);
	T_EQ(e->word >> 5, e->ts & IVT_EV_TS_MASK);
	/* The timestamp was taken inside ivt_write(). */
	T_CHECK(e->ts >= x->before[i] && e->ts <= x->after[i]);
	return 0;
}

static int check_packet(const struct w_packet *p, void *arg)
{
	(void)arg;
	T_EQ(p->h.stream_id, IVT_STREAM_USER);
	T_EQ(p->h.owner_pid, getpid());
	T_EQ(p->h.owner_tid, syscall(SYS_gettid));
	T_CHECK(p->complete);		/* flushed before the walk */
	T_EQ(p->h.content_size, p->end * 8);
	return 0;
}

int main(void)
{
	static const struct ivt_field fa[] = {
		{ "x", IVT_FT_U64, 0, 0 }, { "y", IVT_FT_U32, IVT_FF_HEX, 0 },
	};
	static const struct ivt_field fs[] = {
		{ "s", IVT_FT_STRING, 0, 0 }, { "c", IVT_FT_CHARS, 0, 5 },
		{ "b", IVT_FT_BYTES, 0, 0 },
	};
	const char *path = t_path("readback");
	struct ivt_region *r = t_create(path, 2, 4, 4096, IVT_MODE_DISCARD);
	static struct expect x;
	struct ivt_event ea, es;
	struct ivt_channel *ch;
	struct w_region wr;
	struct w_chan ci;
	unsigned int i;

	T_OK(ivt_event_register(r, "test:a", fa, 2, &ea));
	T_OK(ivt_event_register(r, "test:s", fs, 3, &es));
	x.id_a = ea.id;
	x.id_s = es.id;
	T_CHECK(ea.id != es.id && ea.id <= 30 && es.id <= 30);

	for (i = 0; i < N; i++) {
		uint8_t buf[64];
		uint32_t id, len = build(buf, i, &x, &id);

		x.before[i] = ivt_clock();
		T_OK(ivt_write(id == ea.id ? &ea : &es, buf, len));
		x.after[i] = ivt_clock();
	}
	ivt_flush(r);

	T_OK(w_open(&wr, path) ? -EIO : 0);
	T_EQ(wr.nr_records, 2);
	T_CHECK(!strcmp(wr.types[ea.id].name, "test:a"));
	T_EQ(wr.types[ea.id].fields[1].flags, IVT_FF_HEX);
	T_EQ(wr.types[es.id].fields[1].count, 5);
	ch = (struct ivt_channel *)(wr.base + wr.l.channels_off);
	/* The first user channel went to us, the second is untouched. */
	T_EQ(ch[0].state, IVT_CHAN_ACTIVE);
	T_EQ(ch[0].owner_pid, getpid());
	T_EQ(ch[0].claims, 1);
	T_EQ(ch[1].state, IVT_CHAN_FREE);
	T_EQ(ch[1].commit_pos, 0);

	if (w_walk_channel(&wr, 0, check_event, check_packet, &x, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(x.seen, N);
	T_EQ(ci.first_seq, 0);
	T_CHECK(ci.packets >= 2);		/* 4 KiB packets: several */
	T_EQ(ch[0].commit_pos, ci.packets * 4096ull);	/* flushed: aligned */
	T_EQ(ch[0].events_closed, N);

	ivt_thread_release(r);
	T_EQ(ch[0].state, IVT_CHAN_RETIRED);
	T_EQ(wr.hdr->state, IVT_STATE_LIVE);
	ivt_region_close(r);
	T_EQ(wr.hdr->state, IVT_STATE_CLOSED);
	w_close(&wr);
	return T_PASS;
}
