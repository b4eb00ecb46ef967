/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * ivtrace/writer.h - the writer side of a channel: open, reserve, commit,
 * close. One implementation, used by the kernel module (per-CPU channels,
 * interrupts off) and by libivtrace (per-thread channels).
 *
 * A channel has one writer at a time. The caller provides the exclusion:
 * the kernel writes with interrupts disabled on the channel's CPU; user
 * space gives each thread its own channel. What can still re-enter is an
 * NMI (kernel) or a signal handler (user): ivt_writer_enter() detects it
 * through `busy` and the nested event is dropped and counted, never
 * interleaved.
 *
 * The writer's own state (struct ivt_writer) is private memory; only the
 * channel (struct ivt_channel) and the sub-buffers are shared with the
 * host. The writer never follows a value it reads back from shared memory
 * as a pointer or an index without masking it.
 *
 * Per event the fast path is: one compare chain, one 4-byte header store,
 * the payload copy, and one store-release of commit_pos.
 */
#ifndef IVTRACE_WRITER_H
#define IVTRACE_WRITER_H

#include "abi.h"
#include "barrier.h"

#ifndef ivt_likely
#define ivt_likely(x)	__builtin_expect(!!(x), 1)
#define ivt_unlikely(x)	__builtin_expect(!!(x), 0)
#endif

/* The slow path of reserve stays out of line: the fast path is inlined at
 * every call site, and a copy of the packet switch at each (~800 bytes
 * on x86-64) would crowd the caller's code out of the i-cache. `unused`:
 * a static function some includers never call (it cannot be `inline`).
 * The underscored spellings: the kernel defines `noinline` as a macro. */
#ifndef ivt_writer_slowpath
#define ivt_writer_slowpath	__attribute__((__noinline__, __cold__, __unused__))
#endif

struct ivt_writer {
	/* Hot: read or written by every event. */
	uint8_t *pkt;			/* open packet, NULL when none */
	uint64_t limit;			/* last usable end offset while a packet is open, else 0 */
	uint64_t off;			/* 4-aligned offset of the next event */
	uint64_t cur_end;		/* end of the last reserved event (unaligned) */
	uint64_t last_ts;		/* timestamp of the last event, or of the packet begin */
	uint64_t pkt_pos;		/* free-running position of the open packet */
	struct ivt_channel *ch;		/* shared */
	uint32_t count;			/* events committed in the open packet */
	uint32_t busy;			/* inside the write path (nesting guard) */
	uint32_t wake_host;		/* a packet closed while the host slept: ring it */

	/* Cold: packet switches only. */
	uint32_t subbuf_shift;		/* log2(subbuf_size) */
	uint8_t *pool;			/* this channel's sub-buffer 0 */
	struct ivt_region_hdr *hdr;	/* shared */
	uint64_t seq;			/* open packet, or the next one to open */
	uint64_t first_event_seq;	/* events committed before the open packet */
	uint32_t subbuf_size;
	uint32_t nr_subbufs;
	uint32_t mode;			/* IVT_MODE_*, re-read at each packet open */
	uint32_t stream;		/* IVT_STREAM_* */
	uint32_t chan;			/* channel index */
	uint32_t cpu;			/* cpu_id written in packet headers */
	uint32_t pid, tid;		/* owner written in packet headers (user) */
	uint32_t doorbell;		/* region has IVT_FEAT_DOORBELL */
};

/* Internal helper, don't use directly: unaligned little-endian stores. */
static inline void __ivt_put32(uint8_t *p, uint32_t v)
{
	__builtin_memcpy(p, &v, sizeof(v));
}

static inline void __ivt_put64(uint8_t *p, uint64_t v)
{
	__builtin_memcpy(p, &v, sizeof(v));
}

static inline uint32_t __ivt_log2(uint32_t v)
{
	return 31u - (uint32_t)__builtin_clz(v);
}

/* Internal helper: the packet header of packet `seq`. */
static inline struct ivt_packet_hdr *__ivt_packet(const struct ivt_writer *w,
						  uint64_t seq)
{
	uint64_t idx = seq & (uint64_t)(w->nr_subbufs - 1);

	return (struct ivt_packet_hdr *)(w->pool + (idx << w->subbuf_shift));
}

/* Running count of this channel's drops, for events_discarded. */
static inline uint64_t ivt_writer_drops(const struct ivt_writer *w)
{
	return ivt_read_once(w->ch->lost_full) +
	       ivt_read_once(w->ch->lost_too_big) +
	       ivt_read_once(w->ch->lost_nested);
}

/* Internal helper: a drop by the (non-nested) owner of the channel. Only
 * the owner writes lost_full and lost_too_big, so no atomic is needed. */
static inline void __ivt_count(uint64_t *counter)
{
	ivt_write_once(*counter, ivt_read_once(*counter) + 1);
}

/*
 * Close a packet a previous writer left open (it died, or the guest
 * crashed and the region was re-attached). Its committed bytes end at
 * `pos`; event_count and timestamp_end stay unknown for the host to
 * recompute from the events themselves.
 */
static inline void ivt_writer_seal_orphan(struct ivt_writer *w, uint64_t pos)
{
	uint64_t seq = pos >> w->subbuf_shift;
	struct ivt_packet_hdr *ph = __ivt_packet(w, seq);

	ph->content_size = (pos & (w->subbuf_size - 1)) * 8;
	ph->packet_size = (uint64_t)w->subbuf_size * 8;
	ph->timestamp_end = 0;
	ph->event_count = IVT_EVENT_COUNT_UNKNOWN;
	ph->events_discarded = ivt_writer_drops(w);
	/* Publish the seal: pairs with the host's load-acquire of commit_pos. */
	ivt_store_release(&w->ch->commit_pos, (seq + 1) << w->subbuf_shift);
}

/*
 * Bind `w` to channel `chan` of a region whose layout the caller has
 * validated (and copied to private memory: `l` must not point into the
 * shared region). Resumes after whatever the channel's previous writer
 * committed, sealing a packet it left open.
 */
static inline void ivt_writer_init(struct ivt_writer *w, void *region,
				   const struct ivt_layout *l, uint32_t chan,
				   uint32_t cpu, uint32_t pid, uint32_t tid)
{
	uint8_t *base = (uint8_t *)region;
	uint64_t pos;

	__builtin_memset(w, 0, sizeof(*w));
	w->hdr = (struct ivt_region_hdr *)base;
	w->ch = (struct ivt_channel *)(base + l->channels_off +
				       (uint64_t)chan * sizeof(struct ivt_channel));
	w->pool = base + ivt_subbuf_offset(l, chan, 0);
	w->subbuf_size = l->subbuf_size;
	w->subbuf_shift = __ivt_log2(l->subbuf_size);
	w->nr_subbufs = l->nr_subbufs;
	w->stream = ivt_read_once(w->ch->stream);
	if (w->stream != IVT_STREAM_KERNEL && w->stream != IVT_STREAM_FTRACE)
		w->stream = IVT_STREAM_USER;
	w->chan = chan;
	w->cpu = cpu;
	w->pid = pid;
	w->tid = tid;
	w->doorbell = (ivt_read_once(w->hdr->features) & IVT_FEAT_DOORBELL) != 0;

	/* Our own channel's position, last stored by a previous owner: the
	 * acquire pairs with its store-release in commit or close. */
	pos = ivt_load_acquire(&w->ch->commit_pos);
	if (pos & (w->subbuf_size - 1))
		ivt_writer_seal_orphan(w, pos);
	w->seq = (pos + w->subbuf_size - 1) >> w->subbuf_shift;
	w->first_event_seq = ivt_read_once(w->ch->events_closed);
}

/*
 * Open packet w->seq at time `ts`. Returns 0, or -1 when the ring is full
 * in discard mode (the caller counts the drop).
 */
static inline int ivt_writer_open(struct ivt_writer *w, uint64_t ts)
{
	struct ivt_packet_hdr *ph;
	uint64_t seq = w->seq;

	w->mode = ivt_read_once(w->ch->mode) == IVT_MODE_OVERWRITE ?
		  IVT_MODE_OVERWRITE : IVT_MODE_DISCARD;
	/* Discard mode reuses a sub-buffer only once the host is done with
	 * it: the acquire pairs with the host's store-release of consumed,
	 * so our writes to the sub-buffer come after its reads. */
	if (w->mode == IVT_MODE_DISCARD &&
	    seq - ivt_load_acquire(&w->ch->consumed) >= w->nr_subbufs)
		return -1;

	/* Announce the packet before touching its sub-buffer. The release
	 * fence orders this store before the header and event stores below;
	 * it pairs with the host's acquire fence between copying a packet
	 * and re-reading open_seq (overwrite detection, a seqlock). */
	ivt_write_once(w->ch->open_seq, seq);
	ivt_fence_release();

	ph = __ivt_packet(w, seq);
	ph->magic = IVT_CTF_MAGIC;
	ph->stream_id = w->stream;
	ph->stream_instance_id = w->chan;
	ph->timestamp_begin = ts;
	ph->timestamp_end = ts;
	ph->content_size = 0;
	ph->packet_size = (uint64_t)w->subbuf_size * 8;
	ph->packet_seq_num = seq;
	ph->events_discarded = ivt_writer_drops(w);
	ph->first_event_seq = w->first_event_seq;
	ph->event_count = 0;
	ph->cpu_id = w->cpu;
	ph->owner_pid = w->pid;
	ph->owner_tid = w->tid;

	w->pkt = (uint8_t *)ph;
	/* An event may end at subbuf_size - 1 at most: commit_pos of an open
	 * packet must stay below (seq + 1) * subbuf_size, the value that
	 * tells the host the packet is complete (and its end fields written). */
	w->limit = w->subbuf_size - 1;
	w->off = sizeof(*ph);
	w->cur_end = sizeof(*ph);
	w->count = 0;
	w->last_ts = ts;
	w->pkt_pos = seq << w->subbuf_shift;
	return 0;
}

/*
 * Close the open packet: write its end fields, then publish it whole.
 * Returns 1 when the host is asleep waiting for packets (the caller rings
 * its doorbell), else 0.
 */
static inline int ivt_writer_close(struct ivt_writer *w)
{
	struct ivt_packet_hdr *ph = (struct ivt_packet_hdr *)w->pkt;

	ph->timestamp_end = w->last_ts;
	ph->content_size = w->cur_end * 8;
	ph->event_count = w->count;
	ph->events_discarded = ivt_writer_drops(w);
	ivt_write_once(w->ch->events_closed, w->first_event_seq + w->count);
	/* Publish the packet: pairs with the host's load-acquire of
	 * commit_pos, which then sees every header and event store above. */
	ivt_store_release(&w->ch->commit_pos, (w->seq + 1) << w->subbuf_shift);

	w->first_event_seq += w->count;
	w->seq++;
	w->pkt = 0;
	w->limit = 0;
	if (!w->doorbell)
		return 0;
	/* Dekker with the host: it stores host_sleeping = 1, full fence,
	 * re-reads commit_pos; we store commit_pos, full fence, read
	 * host_sleeping. At least one of us sees the other's store. */
	ivt_full_fence();
	return ivt_read_once(w->hdr->host_sleeping) != 0;
}

/* Close the open packet if it holds any event (flush timer, exit). */
static inline void ivt_writer_flush(struct ivt_writer *w)
{
	if (w->pkt && w->count)
		w->wake_host |= (uint32_t)ivt_writer_close(w);
}

/* Internal helper: write an event header at the current offset. */
static inline uint8_t *__ivt_put_header(struct ivt_writer *w, uint64_t ts,
					uint32_t id, uint32_t hlen)
{
	uint8_t *p = w->pkt + w->off;

	if (hlen == IVT_EV_COMPACT_SIZE) {
		__ivt_put32(p, id | (uint32_t)(ts << IVT_EV_ID_BITS));
	} else {
		__ivt_put32(p, IVT_EV_ID_EXTENDED);
		__ivt_put32(p + 4, id);
		__ivt_put64(p + 8, ts);
	}
	w->last_ts = ts;
	return p + hlen;
}

/*
 * Slow path of ivt_writer_reserve(): extended headers, clock steps
 * backwards, packet switches, full rings, oversized events. Returns the
 * payload destination, or NULL when the event was dropped (and counted).
 */
static ivt_writer_slowpath
uint8_t *ivt_writer_reserve_slow(struct ivt_writer *w, uint64_t ts,
				 uint32_t id, uint32_t len)
{
	uint32_t hlen;
	uint64_t end;

	/* Too big even for an empty packet with an extended header (the
	 * last byte of a packet is never used, see ivt_writer_open()). */
	if ((uint64_t)len + IVT_EV_EXT_SIZE + sizeof(struct ivt_packet_hdr) >
	    w->subbuf_size - 1u) {
		__ivt_count(&w->ch->lost_too_big);
		return 0;
	}
	if (ts < w->last_ts)		/* keep every stream monotonic */
		ts = w->last_ts;
	hlen = id <= IVT_EV_COMPACT_MAX_ID &&
	       ts - w->last_ts <= IVT_EV_TS_MASK ?
	       IVT_EV_COMPACT_SIZE : IVT_EV_EXT_SIZE;
	end = w->off + hlen + len;
	if (end > w->limit) {
		if (w->pkt)
			w->wake_host |= (uint32_t)ivt_writer_close(w);
		if (ivt_writer_open(w, ts)) {
			__ivt_count(&w->ch->lost_full);
			return 0;
		}
		hlen = id <= IVT_EV_COMPACT_MAX_ID ?
		       IVT_EV_COMPACT_SIZE : IVT_EV_EXT_SIZE;
		end = w->off + hlen + len;
	}
	w->cur_end = end;
	return __ivt_put_header(w, ts, id, hlen);
}

/*
 * Reserve room for an event of `len` payload bytes with id `id` at time
 * `ts`. Returns where to write the payload (followed by
 * ivt_writer_commit()), or NULL if the event was dropped and counted.
 * Fast path: compact header in the open packet. The subtraction is
 * unsigned, so a clock step backwards also takes the slow path.
 */
static inline uint8_t *ivt_writer_reserve(struct ivt_writer *w, uint64_t ts,
					  uint32_t id, uint32_t len)
{
	uint64_t end = w->off + IVT_EV_COMPACT_SIZE + (uint64_t)len;

	if (ivt_likely(id <= IVT_EV_COMPACT_MAX_ID &&
		       ts - w->last_ts <= IVT_EV_TS_MASK && end <= w->limit)) {
		w->cur_end = end;
		return __ivt_put_header(w, ts, id, IVT_EV_COMPACT_SIZE);
	}
	return ivt_writer_reserve_slow(w, ts, id, len);
}

/* Publish the event reserved last. */
static inline void ivt_writer_commit(struct ivt_writer *w)
{
	w->count++;
	w->off = (w->cur_end + (IVT_EV_ALIGN - 1)) & ~(uint64_t)(IVT_EV_ALIGN - 1);
	/* Publish the event: pairs with the host's load-acquire of
	 * commit_pos (live drain of a partial packet, crash salvage). */
	ivt_store_release(&w->ch->commit_pos, w->pkt_pos + w->cur_end);
}

/*
 * Enter the write path. Returns 0 if this writer is already inside it
 * (an NMI or a signal handler interrupted it): the event is dropped and
 * counted in lost_nested. Pair every successful enter with exit.
 */
static inline int ivt_writer_enter(struct ivt_writer *w)
{
	if (ivt_unlikely(w->busy)) {
		ivt_count_nested(&w->ch->lost_nested);
		return 0;
	}
	w->busy = 1;
	ivt_signal_fence();	/* busy is set before we touch the packet */
	return 1;
}

static inline void ivt_writer_exit(struct ivt_writer *w)
{
	ivt_signal_fence();	/* the packet is consistent before busy clears */
	w->busy = 0;
}

#endif /* IVTRACE_WRITER_H */
