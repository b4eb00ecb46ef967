/* SPDX-License-Identifier: MIT */
/*
 * walker.h - TEST ORACLE. A small, independent reader of what libivtrace
 * wrote, used by the tests to check the packets and events byte by byte.
 * It is not the product reader (that is host/, in Rust) and it trusts the
 * region more than a product reader may; it exists so that the C tests
 * can fail when the writer is wrong.
 *
 * It maps the region file itself (it does not share the library's view)
 * and reads the metadata area to learn each user event's fields, which it
 * needs to find where an event's payload ends.
 */
#ifndef IVT_TEST_WALKER_H
#define IVT_TEST_WALKER_H

#include <stdint.h>
#include <ivtrace/abi.h>

struct w_type {
	int present;
	char name[IVT_NAME_MAX];
	uint16_t nr_fields;
	struct ivt_meta_field fields[IVT_FIELDS_MAX];
};

struct w_region {
	uint8_t *base;
	uint64_t size;
	int mapped;			/* by w_open (unmapped by w_close) */
	struct ivt_region_hdr *hdr;
	struct ivt_layout l;
	uint32_t nr_records;		/* committed metadata records seen */
	struct w_type *types;		/* user stream, by id */
};

struct w_event {
	uint32_t chan;
	const struct ivt_packet_hdr *pkt;	/* the packet's header */
	uint64_t pkt_seq;
	uint32_t index;			/* in its packet, from 0 */
	uint32_t id;
	uint64_t ts;			/* full value, decoded */
	int extended;			/* 16-byte header */
	uint32_t word;			/* the first header word as stored */
	const uint8_t *payload;
	uint32_t len;			/* payload bytes, from the metadata */
};

struct w_packet {
	uint64_t seq;
	struct ivt_packet_hdr h;	/* copy of the header */
	int complete;			/* closed (or sealed), else open */
	uint32_t events;		/* events walked */
	uint64_t end;			/* bytes of content walked */
	uint64_t last_ts;
};

/* Called for each event; a non-zero return stops the walk. */
typedef int (*w_event_fn)(const struct w_event *e, void *arg);
/* Called for each packet after its events (may be NULL). */
typedef int (*w_packet_fn)(const struct w_packet *p, void *arg);

struct w_chan {
	uint64_t commit_pos, open_seq, first_seq, end_seq;
	uint32_t packets, events;
};

/* What the last failing call found wrong. */
extern char w_error[512];

int w_open(struct w_region *wr, const char *path);
/* Use an existing mapping instead (the library's own, so that TSan sees
 * the reader's and the writer's accesses at the same addresses). */
int w_use(struct w_region *wr, void *base, uint64_t size);
void w_close(struct w_region *wr);

/* Re-read the metadata area (done by w_open). Returns records or -1. */
int w_load_meta(struct w_region *wr);

/*
 * Check one packet image `buf` (a copy, or the sub-buffer itself) of
 * channel `chan`: its header, then every event up to `limit` bytes
 * (content_size for a closed packet, the committed prefix for an open
 * one). Returns 0, or -1 with w_error set.
 */
int w_walk_packet(const struct w_region *wr, uint32_t chan, uint64_t seq,
		  const uint8_t *buf, uint64_t limit, int complete,
		  w_event_fn fn, void *arg, struct w_packet *p);

/*
 * Walk every packet of channel `chan` still in its ring, oldest first,
 * as a quiescent reader would (the writer is not running). Checks
 * first_event_seq continuity between packets. Returns 0 or -1.
 */
int w_walk_channel(const struct w_region *wr, uint32_t chan, w_event_fn fn,
		   w_packet_fn pfn, void *arg, struct w_chan *ci);

/* Payload field readers (little-endian, unaligned). */
uint16_t w_u16(const uint8_t *p);
uint32_t w_u32(const uint8_t *p);
uint64_t w_u64(const uint8_t *p);

#endif /* IVT_TEST_WALKER_H */
