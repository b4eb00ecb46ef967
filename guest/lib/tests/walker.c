/* SPDX-License-Identifier: MIT */
/* walker.c - TEST ORACLE: see walker.h. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "walker.h"

char w_error[512];

static int w_err(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(w_error, sizeof(w_error), fmt, ap);
	va_end(ap);
	return -1;
}

uint16_t w_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
uint32_t w_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
uint64_t w_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

int w_open(struct w_region *wr, const char *path)
{
	struct stat st;
	int fd = open(path, O_RDWR);

	memset(wr, 0, sizeof(*wr));
	if (fd < 0 || fstat(fd, &st))
		return w_err("open %s failed", path);
	wr->size = (uint64_t)st.st_size;
	wr->base = mmap(NULL, wr->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (wr->base == MAP_FAILED)
		return w_err("mmap %s failed", path);
	return w_use(wr, wr->base, wr->size) ? -1 : (wr->mapped = 1, 0);
}

int w_use(struct w_region *wr, void *base, uint64_t size)
{
	wr->base = base;
	wr->size = size;
	wr->hdr = (struct ivt_region_hdr *)wr->base;
	if (__atomic_load_n(&wr->hdr->magic, __ATOMIC_ACQUIRE) != IVT_MAGIC)
		return w_err("bad magic");
	wr->l = wr->hdr->layout;
	wr->types = calloc(IVT_EVENT_IDS_MAX, sizeof(*wr->types));
	if (!wr->types)
		return w_err("out of memory");
	return w_load_meta(wr) < 0 ? -1 : 0;
}

void w_close(struct w_region *wr)
{
	if (wr->mapped)
		munmap(wr->base, wr->size);
	free(wr->types);
	memset(wr, 0, sizeof(*wr));
}

int w_load_meta(struct w_region *wr)
{
	const uint8_t *meta = wr->base + wr->l.meta_off;
	uint32_t tail = __atomic_load_n(&wr->hdr->meta_tail, __ATOMIC_RELAXED);
	uint32_t off = 0, n = 0;

	if (tail > wr->l.meta_size)
		tail = wr->l.meta_size;
	memset(wr->types, 0, IVT_EVENT_IDS_MAX * sizeof(*wr->types));
	while (tail - off >= sizeof(struct ivt_meta_rec)) {
		const struct ivt_meta_rec *rec = (const void *)(meta + off);
		uint32_t commit = __atomic_load_n(&rec->commit, __ATOMIC_ACQUIRE);
		struct w_type *t;

		if (commit != IVT_META_COMMIT)
			break;	/* the host stops here too */
		if (rec->len != ivt_meta_rec_size(rec->nr_fields) ||
		    rec->len > tail - off || rec->nr_fields > IVT_FIELDS_MAX)
			return w_err("meta record at %u: bad len %u", off, rec->len);
		if (rec->kind != IVT_META_EVENT || rec->event_id >= IVT_EVENT_IDS_MAX)
			return w_err("meta record at %u: bad kind/id", off);
		if (rec->stream == IVT_STREAM_USER) {
			t = &wr->types[rec->event_id];
			if (t->present)
				return w_err("meta: id %u described twice", rec->event_id);
			t->present = 1;
			memcpy(t->name, rec->name, sizeof(t->name));
			t->nr_fields = rec->nr_fields;
			memcpy(t->fields, rec->fields,
			       rec->nr_fields * sizeof(struct ivt_meta_field));
		}
		off += rec->len;
		n++;
	}
	wr->nr_records = n;
	return (int)n;
}

/* Bytes of the payload of type `t` at `p`, at most `room`; -1 if it does
 * not fit. */
static int64_t w_payload_len(const struct w_type *t, const uint8_t *p,
			     uint64_t room)
{
	static const uint8_t isz[] = { 0, 1, 2, 4, 8, 1, 2, 4, 8 };
	uint64_t off = 0, n;
	uint16_t i;

	for (i = 0; i < t->nr_fields; i++) {
		const struct ivt_meta_field *f = &t->fields[i];

		switch (f->type) {
		case IVT_FT_STRING:
			for (n = off; n < room && p[n]; n++)
				;
			if (n == room)
				return -1;
			off = n + 1;
			continue;
		case IVT_FT_BYTES:
			if (room - off < 4)
				return -1;
			n = 4 + (uint64_t)w_u32(p + off);
			break;
		case IVT_FT_CHARS:
			n = f->count;
			break;
		default:
			if (f->type > IVT_FT_S64)
				return -1;
			n = isz[f->type];
		}
		if (n > room - off)
			return -1;
		off += n;
	}
	return (int64_t)off;
}

static int w_packet_header(const struct w_region *wr, uint32_t chan,
			   uint64_t seq, const struct ivt_packet_hdr *h,
			   uint64_t limit)
{
	const struct ivt_channel *ch = (const void *)(wr->base + wr->l.channels_off +
						      (uint64_t)chan * sizeof(*ch));

	if (h->magic != IVT_CTF_MAGIC)
		return w_err("chan %u seq %lu: bad packet magic %#x", chan,
			     (unsigned long)seq, h->magic);
	if (h->stream_id != ch->stream || h->stream_instance_id != chan ||
	    h->packet_seq_num != seq ||
	    h->packet_size != (uint64_t)wr->l.subbuf_size * 8)
		return w_err("chan %u seq %lu: header ids stream %u inst %lu "
			     "seq %lu size %lu", chan, (unsigned long)seq,
			     h->stream_id, (unsigned long)h->stream_instance_id,
			     (unsigned long)h->packet_seq_num,
			     (unsigned long)h->packet_size);
	if (limit < sizeof(*h) || limit > wr->l.subbuf_size)
		return w_err("chan %u seq %lu: content end %lu out of range",
			     chan, (unsigned long)seq, (unsigned long)limit);
	return 0;
}

/* Decode the header at `p`, advancing *ts. Returns header bytes or -1. */
static int w_event_header(const uint8_t *p, uint64_t room, uint64_t *ts,
			  struct w_event *e)
{
	uint32_t word = w_u32(p);
	uint64_t prev = *ts;

	e->word = word;
	if ((word & 31) != IVT_EV_ID_EXTENDED) {
		uint64_t low = word >> IVT_EV_ID_BITS;

		e->id = word & 31;
		e->extended = 0;
		*ts = (prev & ~IVT_EV_TS_MASK) | low;
		if (low < (prev & IVT_EV_TS_MASK))
			*ts += 1ull << IVT_EV_TS_BITS;
		return IVT_EV_COMPACT_SIZE;
	}
	if (room < IVT_EV_EXT_SIZE || word != IVT_EV_ID_EXTENDED)
		return -1;
	e->id = w_u32(p + 4);
	e->extended = 1;
	*ts = w_u64(p + 8);
	return IVT_EV_EXT_SIZE;
}

int w_walk_packet(const struct w_region *wr, uint32_t chan, uint64_t seq,
		  const uint8_t *buf, uint64_t limit, int complete,
		  w_event_fn fn, void *arg, struct w_packet *p)
{
	uint64_t off = sizeof(struct ivt_packet_hdr), end = off, ts;
	struct w_event e;
	int hl;

	memset(p, 0, sizeof(*p));
	memcpy(&p->h, buf, sizeof(p->h));
	p->seq = seq;
	p->complete = complete;
	if (w_packet_header(wr, chan, seq, &p->h, limit))
		return -1;
	ts = p->h.timestamp_begin;
	while (off < limit) {
		const struct w_type *t;
		int64_t len;
		uint64_t prev = ts;

		memset(&e, 0, sizeof(e));
		if (limit - off < IVT_EV_COMPACT_SIZE)
			return w_err("chan %u seq %lu: %lu stray bytes at %lu", chan,
				     (unsigned long)seq, (unsigned long)(limit - off),
				     (unsigned long)off);
		hl = w_event_header(buf + off, limit - off, &ts, &e);
		if (hl < 0 || ts < prev)
			return w_err("chan %u seq %lu ev %u: bad header %#x or "
				     "time going back", chan, (unsigned long)seq,
				     p->events, e.word);
		t = e.id < IVT_EVENT_IDS_MAX ? &wr->types[e.id] : NULL;
		if (!t || !t->present)
			return w_err("chan %u seq %lu ev %u: unknown id %u", chan,
				     (unsigned long)seq, p->events, e.id);
		len = w_payload_len(t, buf + off + hl, limit - off - hl);
		if (len < 0)
			return w_err("chan %u seq %lu ev %u: payload overruns "
				     "the content", chan, (unsigned long)seq, p->events);
		e.chan = chan;
		e.pkt = (const struct ivt_packet_hdr *)buf;
		e.pkt_seq = seq;
		e.index = p->events++;
		e.ts = ts;
		e.payload = buf + off + hl;
		e.len = (uint32_t)len;
		end = off + hl + (uint64_t)len;
		off = (end + IVT_EV_ALIGN - 1) & ~(uint64_t)(IVT_EV_ALIGN - 1);
		if (fn && fn(&e, arg))
			break;
	}
	p->end = end;
	p->last_ts = ts;
	if (off < limit)	/* stopped by fn */
		return 0;
	if (end != limit)
		return w_err("chan %u seq %lu: events end at %lu, content at %lu",
			     chan, (unsigned long)seq, (unsigned long)end,
			     (unsigned long)limit);
	if (complete && p->h.event_count != IVT_EVENT_COUNT_UNKNOWN &&
	    (p->h.event_count != p->events ||
	     (p->events && p->h.timestamp_end != ts)))
		return w_err("chan %u seq %lu: header says %u events ending at "
			     "%lu, walked %u ending at %lu", chan, (unsigned long)seq,
			     p->h.event_count, (unsigned long)p->h.timestamp_end,
			     p->events, (unsigned long)ts);
	return 0;
}

static const uint8_t *w_subbuf(const struct w_region *wr, uint32_t chan,
			       uint64_t seq)
{
	return wr->base + ivt_subbuf_offset(&wr->l, chan, seq);
}

/* Packets [first, end) still in the ring of a quiescent writer. */
static void w_ring_span(const struct w_region *wr, const struct ivt_channel *ch,
			struct w_chan *ci)
{
	uint64_t S = wr->l.subbuf_size, n = wr->l.nr_subbufs;
	uint64_t touched;

	ci->commit_pos = __atomic_load_n(&ch->commit_pos, __ATOMIC_ACQUIRE);
	ci->open_seq = __atomic_load_n(&ch->open_seq, __ATOMIC_RELAXED);
	ci->end_seq = (ci->commit_pos + S - 1) / S;
	/* An opened packet overwrote sub-buffer open_seq % n even before
	 * its first commit. */
	touched = ci->end_seq;
	if (ci->open_seq + 1 > touched && ci->commit_pos)
		touched = ci->open_seq + 1;
	ci->first_seq = touched > n ? touched - n : 0;
	if (ch->mode == IVT_MODE_DISCARD && ci->first_seq < ch->consumed)
		ci->first_seq = ch->consumed;
}

int w_walk_channel(const struct w_region *wr, uint32_t chan, w_event_fn fn,
		   w_packet_fn pfn, void *arg, struct w_chan *ci)
{
	const struct ivt_channel *ch = (const void *)(wr->base + wr->l.channels_off +
						      (uint64_t)chan * sizeof(*ch));
	uint64_t S = wr->l.subbuf_size, seq, next_first = UINT64_MAX;
	struct w_packet p;

	memset(ci, 0, sizeof(*ci));
	w_ring_span(wr, ch, ci);
	for (seq = ci->first_seq; seq < ci->end_seq; seq++) {
		const uint8_t *buf = w_subbuf(wr, chan, seq);
		int complete = ci->commit_pos >= (seq + 1) * S;
		uint64_t limit = complete ? ((const struct ivt_packet_hdr *)buf)->content_size / 8
					  : ci->commit_pos - seq * S;

		if (w_walk_packet(wr, chan, seq, buf, limit, complete, fn, arg, &p))
			return -1;
		if (next_first != UINT64_MAX && p.h.first_event_seq != next_first)
			return w_err("chan %u seq %lu: first_event_seq %lu, expected %lu",
				     chan, (unsigned long)seq,
				     (unsigned long)p.h.first_event_seq,
				     (unsigned long)next_first);
		next_first = p.h.event_count == IVT_EVENT_COUNT_UNKNOWN ? UINT64_MAX :
			     p.h.first_event_seq + p.events;
		ci->packets++;
		ci->events += p.events;
		if (pfn && pfn(&p, arg))
			break;
	}
	return 0;
}
