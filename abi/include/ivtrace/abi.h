/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * ivtrace/abi.h - the shared-memory ABI between trace writers and the host.
 *
 * This header is the one definition of the region layout. It is
 * freestanding: it compiles in a Linux kernel module, in user space and in
 * the benchmarks. The host (Rust) mirrors every offset below and checks them
 * against abi/vectors.json, which abi/tests/abi_vectors.c generates from
 * this file. docs/abi.md is the prose specification; the diagram there and
 * the one here must agree.
 *
 *   region (a power of two in size; QEMU requires it for ivshmem)
 *   +-------------------------------+ 0
 *   | struct ivt_region_hdr         |   identity, layout, clock, state,
 *   |   (one 4 KiB page)            |   host control words, sync mailbox
 *   +-------------------------------+ layout.channels_off (4096)
 *   | struct ivt_channel [nr]       |   per-channel positions and counters,
 *   |   (256 bytes each)            |   four cache lines, split by writer
 *   +-------------------------------+ layout.meta_off (page aligned)
 *   | metadata area                 |   struct ivt_meta_rec records:
 *   |   (layout.meta_size bytes)    |   event descriptions, append-only
 *   +-------------------------------+ layout.pool_off (page aligned)
 *   | sub-buffer pool               |   channel c, sub-buffer i at
 *   |   nr * nr_subbufs * subbuf_sz |   pool_off + (c*nr_subbufs + i)*sz;
 *   |                               |   one sub-buffer = one CTF packet
 *   +-------------------------------+ <= region_size
 *
 * Every multi-byte value is little-endian and naturally aligned; there are
 * no pointers, no `long`, no `bool`. Who may write each field is stated
 * beside it; the ordering of each access is stated where it happens
 * (ivtrace/writer.h for writers, host/ring for the reader).
 */
#ifndef IVTRACE_ABI_H
#define IVTRACE_ABI_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/stddef.h>
#else
#include <stdint.h>
#include <stddef.h>
#endif

/* "IVTRACE1" read as a little-endian u64. Stored last (release) by the
 * formatter: a reader that sees it sees a fully formatted region. */
#define IVT_MAGIC		0x3145434152545649ULL
#define IVT_ABI_MAJOR		1	/* incompatible layout changes */
#define IVT_ABI_MINOR		4	/* compatible additions (1: the thread name table,
					 * 2: the ftrace relay, 3: the spinning clock
					 * exchange, IVT_FEAT_SYNC_SPIN, 4: the ftrace
					 * relay's ftrace_symbols) */

#define IVT_PAGE_SIZE		4096u
#define IVT_CACHELINE		64u
#define IVT_REGION_MIN		(1u << 16)	/* 64 KiB */
#define IVT_SUBBUF_MIN		4096u		/* power of two */
#define IVT_SUBBUF_MAX		(1u << 24)	/* 16 MiB, keeps bit sizes in u32 range */
#define IVT_SUBBUFS_MIN		2u		/* power of two */
#define IVT_SUBBUFS_MAX		(1u << 16)
#define IVT_CHANNELS_MAX	4096u
#define IVT_EVENT_IDS_MAX	4096u		/* per stream class */

/* Feature bits (ivt_region_hdr.features). Unknown bits are ignored. */
#define IVT_FEAT_KERNEL		(1ULL << 0)	/* formatted by the guest kernel module */
#define IVT_FEAT_LOOPBACK	(1ULL << 1)	/* writers run on the reader's host: same TSC */
#define IVT_FEAT_DOORBELL	(1ULL << 2)	/* writers ring the host when host_sleeping is set */
#define IVT_FEAT_CONTROL	(1ULL << 3)	/* writer obeys ivt_control commands */
#define IVT_FEAT_SYNC		(1ULL << 4)	/* writer answers the clock sync mailbox */
#define IVT_FEAT_FTRACE		(1ULL << 5)	/* ftrace relay channels and IVT_CMD_FTRACE (1.2) */
#define IVT_FEAT_SYNC_SPIN	(1ULL << 6)	/* the sync answer spins for the next request (IVT_SYNC_*, 1.3) */

/* Region state (ivt_region_hdr.state). */
#define IVT_STATE_FORMATTING	0u	/* zero-filled or being (re)formatted */
#define IVT_STATE_LIVE		1u	/* writers may write */
#define IVT_STATE_CLOSED	2u	/* the region's owner is done; drain and stop */

/* Channel modes (ivt_channel.mode). */
#define IVT_MODE_DISCARD	0u	/* full ring: drop the newest event, count it */
#define IVT_MODE_OVERWRITE	1u	/* full ring: reuse the oldest sub-buffer (flight recorder) */

/* Channel states (ivt_channel.state). */
#define IVT_CHAN_FREE		0u	/* unowned user channel, claimable */
#define IVT_CHAN_ACTIVE		1u	/* a writer owns it */
#define IVT_CHAN_RETIRED	2u	/* last owner left; may be claimed again */

/* Stream classes: a channel belongs to exactly one. */
#define IVT_STREAM_KERNEL	0u	/* per-CPU channels of the guest kernel */
#define IVT_STREAM_USER		1u	/* per-thread channels of user programs */
#define IVT_STREAM_COUNT	2u	/* stream classes with an event id counter (next_event_id) */
#define IVT_STREAM_FTRACE	2u	/* per-CPU channels of the ftrace relay: whole
					 * ftrace ring-buffer pages (ivtrace/ftrace.h);
					 * fixed event ids, no counter (1.2) */
#define IVT_STREAM_CLASSES	3u	/* stream classes in all */

/* Clock sources (ivt_clock.source). */
#define IVT_CLOCK_TSC		1u	/* x86 rdtsc, freq_hz ticks per second */

/* ------------------------------------------------------------------ */
/* Region header: the first page.                                      */
/* ------------------------------------------------------------------ */

/* Where the parts of the region are. Written once by the formatter. */
struct ivt_layout {
	uint64_t channels_off;		/* byte offset of the channel table */
	uint64_t meta_off;		/* byte offset of the metadata area */
	uint64_t pool_off;		/* byte offset of the sub-buffer pool */
	uint32_t meta_size;		/* bytes in the metadata area */
	uint32_t nr_channels;		/* channels in the table */
	uint32_t nr_kernel_channels;	/* the first N channels are per-CPU kernel ones */
	uint32_t channel_size;		/* sizeof(struct ivt_channel) */
	uint32_t nr_subbufs;		/* sub-buffers per channel, power of two */
	uint32_t subbuf_size;		/* bytes per sub-buffer, power of two */
};

/* The writers' clock. freq_hz and source are written once by the
 * formatter; ref_* is one (ticks, host-or-guest CLOCK_REALTIME) pair taken
 * at format time, a coarse fallback when no better mapping exists. */
struct ivt_clock {
	uint64_t freq_hz;		/* ticks per second, measured by the formatter */
	uint32_t source;		/* IVT_CLOCK_* */
	uint32_t reserved;
	uint64_t ref_ticks;		/* clock value ... */
	uint64_t ref_realtime_ns;	/* ... at this writer-side CLOCK_REALTIME */
};

/*
 * Clock sync mailbox (ping-pong through shared memory, docs/abi.md "Time").
 * The host writes the request line, the writer the response line.
 *   host:   host_t1 = now; store-release req_seq = n  (then kicks the writer)
 *   writer: load-acquire req_seq; t2 = ticks; t3 = ticks;
 *           store resp_t2, resp_t3; store-release resp_seq = n
 *   host:   load-acquire resp_seq == n; t4 = now
 * With IVT_FEAT_SYNC_SPIN the writer, having answered, spins for the next
 * request instead of leaving, so the host's next requests need no kick and
 * a round trip is two cache-line transfers. The spin is bounded: it ends
 * after IVT_SYNC_PATIENCE_NS without a new request, IVT_SYNC_BUDGET_NS
 * after the first answer, or IVT_SYNC_ROUNDS answers, whichever is first.
 * A writer the host cannot kick (ivshmem-plain) looks at the mailbox every
 * IVT_SYNC_POLL_MS from a timer that keeps its phase, and the host meets it
 * there.
 */
#define IVT_SYNC_ROUNDS		64u	/* answers per entry into the exchange */
#define IVT_SYNC_PATIENCE_NS	20000u	/* wait for the next request at most */
#define IVT_SYNC_BUDGET_NS	60000u	/* first answer to leaving, at most */
#define IVT_SYNC_POLL_MS	20u	/* a writer the host cannot kick enters this often */

struct ivt_sync {
	uint64_t req_seq;		/* host writes (release) */
	uint64_t host_t1;		/* host writes before req_seq */
	uint8_t  pad0[IVT_CACHELINE - 16];
	uint64_t resp_seq;		/* writer writes (release) */
	uint64_t resp_t2;		/* writer clock when the request was seen */
	uint64_t resp_t3;		/* writer clock just before resp_seq */
	uint64_t resp_spun;		/* writer clock ticks spent in the exchange, in all
					 * (IVT_FEAT_SYNC_SPIN; relaxed, a statistic) */
	uint8_t  pad1[IVT_CACHELINE - 32];
};

/*
 * Host -> writer control (docs/abi.md "Control"). The host fills cmd/arg,
 * then store-release cmd_seq and kicks the writer; the writer
 * load-acquires cmd_seq, acts, writes ack_status, store-release ack_seq.
 */
#define IVT_CMD_NONE		0u
#define IVT_CMD_FLUSH		1u	/* close every open packet now */
#define IVT_CMD_ENABLE		2u	/* arg: event group mask to enable */
#define IVT_CMD_DISABLE		3u	/* arg: event group mask to disable */
#define IVT_CMD_SET_MODE	4u	/* arg: IVT_MODE_* for every channel */
#define IVT_CMD_SYNC		5u	/* answer the sync mailbox */
#define IVT_CMD_STATEDUMP	6u	/* re-emit thread names and irq names */
#define IVT_CMD_FTRACE		7u	/* arg: bytes of the request in ctl_text.req:
					 * one tracefs operation for the ftrace relay
					 * (ivtrace/ftrace.h); the answer in ctl_text.resp (1.2) */

/*
 * Hypercall numbers (KVM guests only; docs/kvm.md "The hypercall channel").
 * A guest issues `vmcall`/`vmmcall` with RAX = nr and RBX, RCX, RDX, RSI =
 * four arguments. KVM traces every hypercall as kvm:kvm_hypercall before it
 * looks at the number, then answers an unknown one with -KVM_ENOSYS: these
 * numbers are ours, far above KVM's own (1-12), so the call has no effect
 * in the hypervisor and exists only to be seen by the host. The host
 * aggregates kvm_exit + kvm_hypercall + kvm_entry into one event. Under TCG
 * `vmcall` raises #UD: a guest issues these only when kvm_para_available().
 */
#define IVT_HC_BASE		0x49560000u	/* 'I' 'V' << 16 */
#define IVT_HC_VMSYNC		(IVT_HC_BASE + 0u)	/* a0 = cnt, a1 = vm_uid (vmsync) */
#define IVT_HC_EVENT_FIRST	(IVT_HC_BASE + 0x100u)	/* guest events: nr in FIRST..LAST */
#define IVT_HC_EVENT_LAST	(IVT_HC_BASE + 0xffffu)

struct ivt_control {
	uint64_t cmd_seq;		/* host writes (release) */
	uint32_t cmd;			/* IVT_CMD_* */
	uint32_t reserved;
	uint64_t arg;
	uint8_t  pad0[IVT_CACHELINE - 24];
	uint64_t ack_seq;		/* writer writes (release) */
	int32_t  ack_status;		/* 0 or -errno */
	uint32_t groups_enabled;	/* event groups currently on (writer view) */
	uint8_t  pad1[IVT_CACHELINE - 16];
};

/*
 * The text of an IVT_CMD_FTRACE command and of its answer (1.2). The host
 * writes req (arg bytes of it, no NUL needed) before its store-release of
 * cmd_seq; the writer writes resp_len, resp_flags and resp before its
 * store-release of ack_seq. Both sides bound every length by the arrays.
 */
#define IVT_CTL_REQ_MAX		1024u
#define IVT_CTL_RESP_MAX	2048u
#define IVT_CTL_RESP_MORE	(1u << 0)	/* a read: the file goes on past this chunk */

struct ivt_ctl_text {
	char     req[IVT_CTL_REQ_MAX];	/* host writes */
	uint32_t resp_len;		/* writer: bytes of resp that are the answer */
	uint32_t resp_flags;		/* writer: IVT_CTL_RESP_* */
	uint8_t  pad0[IVT_CACHELINE - 8];
	char     resp[IVT_CTL_RESP_MAX];	/* writer writes */
};

struct ivt_region_hdr {
	/* Line 0: identity. Written by the formatter, magic last. */
	uint64_t magic;			/* IVT_MAGIC, store-release by the formatter */
	uint16_t abi_major;
	uint16_t abi_minor;
	uint32_t hdr_size;		/* sizeof(struct ivt_region_hdr) */
	uint64_t region_size;		/* bytes, power of two */
	uint64_t features;		/* IVT_FEAT_* */
	uint8_t  uuid[16];		/* random per format; names the trace */
	uint32_t default_mode;		/* IVT_MODE_* given at format time */
	uint32_t owner_pid;		/* formatter's pid (loopback: liveness check) */
	uint8_t  pad0[8];

	/* Lines 1-2: layout and clock. Written once by the formatter. */
	struct ivt_layout layout;	/* 48 bytes */
	uint32_t nr_ftrace_channels;	/* channels [nr_kernel_channels, + this) are the
					 * ftrace relay's, stream IVT_STREAM_FTRACE (1.2) */
	uint8_t  pad1[12];
	struct ivt_clock clock;		/* 32 bytes */
	uint8_t  pad2[32];

	/* Line 3: shared among writers (atomic read-modify-write). */
	uint32_t state;			/* IVT_STATE_*, store-release by the owner */
	uint32_t meta_tail;		/* bytes of the metadata area handed out (fetch-add) */
	uint32_t next_event_id[IVT_STREAM_COUNT]; /* fetch-add per stream class */
	uint64_t lost_no_channel;	/* events dropped: no free channel for a thread */
	uint64_t doorbells;		/* doorbells rung by writers (statistics) */
	uint8_t  pad3[IVT_CACHELINE - 32];

	/* Line 4: written by the host, read by writers. */
	uint32_t host_sleeping;		/* 1 while the host waits for a doorbell (store, then full fence) */
	uint16_t host_peer_id;		/* ivshmem peer id of the host (doorbell target) */
	uint16_t host_vector;		/* doorbell vector the host listens on */
	uint64_t host_heartbeat;	/* host increments while it records (liveness) */
	uint32_t flush_interval_ms;	/* writers close a partial packet this old (0 = never) */
	uint8_t  pad4[IVT_CACHELINE - 20];

	/* Lines 5-8: control and clock sync, host <-> writer. */
	struct ivt_control control;	/* 128 bytes */
	struct ivt_sync sync;		/* 128 bytes */

	/* Lines 9-57: the text of IVT_CMD_FTRACE (1.2). */
	struct ivt_ctl_text ctl_text;	/* 3136 bytes */

	uint8_t  reserved[IVT_PAGE_SIZE - 9 * IVT_CACHELINE -
			  sizeof(struct ivt_ctl_text)];
};

/* ------------------------------------------------------------------ */
/* Channels                                                            */
/* ------------------------------------------------------------------ */

/*
 * A channel is a ring of nr_subbufs sub-buffers with one writer at a time
 * (a CPU with interrupts off in the kernel, a thread in user space).
 * Positions are free-running byte counts: packet `seq` occupies positions
 * [seq * subbuf_size, (seq + 1) * subbuf_size) and lives in sub-buffer
 * seq % nr_subbufs.
 *
 *   commit_pos >= (seq + 1) * subbuf_size   <=> packet seq is complete
 *   seq * subbuf_size < commit_pos < ...    <=> packet seq is open and its
 *                                               bytes up to commit_pos are
 *                                               committed (crash salvage)
 */
struct ivt_channel {
	/* Line 0: written by the channel's writer only. */
	uint64_t commit_pos;		/* end of committed bytes; store-release per event */
	uint64_t open_seq;		/* packet being written; stored, then release fence, before the sub-buffer is touched */
	uint64_t lost_full;		/* events dropped: ring full (discard mode) */
	uint64_t lost_too_big;		/* events dropped: larger than a packet */
	uint64_t lost_nested;		/* events dropped: writer re-entered (NMI, signal) */
	uint32_t mode;			/* IVT_MODE_*, set at format (or by a control command) */
	uint32_t stream;		/* IVT_STREAM_*, set at format */
	uint32_t cpu;			/* kernel channel: its CPU; user: UINT32_MAX */
	uint32_t reserved0;
	uint64_t events_closed;		/* events in closed packets (written at each close) */

	/* Line 1: ownership (user channels), compare-and-swap by writers. */
	uint32_t state;			/* IVT_CHAN_*: CAS to claim, store-release to leave */
	uint32_t owner_pid;
	uint32_t owner_tid;
	uint32_t claims;		/* times the channel was claimed (statistics) */
	uint8_t  pad1[IVT_CACHELINE - 16];

	/* Line 2: written by the host only. */
	uint64_t consumed;		/* packets the host is done with; store-release, writer load-acquire */
	uint8_t  pad2[IVT_CACHELINE - 8];

	/* Line 3: reserved. */
	uint8_t  reserved[IVT_CACHELINE];
};

/* ------------------------------------------------------------------ */
/* Packets: one sub-buffer is one CTF 1.8 packet                       */
/* ------------------------------------------------------------------ */

#define IVT_CTF_MAGIC		0xC1FC1FC1u
/* event_count of a packet sealed on behalf of a writer that vanished: the
 * host counts the events itself; timestamp_end is 0 then, too. */
#define IVT_EVENT_COUNT_UNKNOWN	0xFFFFFFFFu

/*
 * trace.packet.header followed by stream.packet.context, exactly as the
 * host's CTF metadata declares them (sizes in bits, as CTF wants). The
 * writer fills it when it opens a packet (begin fields) and when it closes
 * it (end fields). The host copies the packet, checks every field against
 * what it knows, and rewrites the ones it owns (stream ids,
 * events_discarded, packet_size) before writing the CTF file.
 */
struct ivt_packet_hdr {
	uint32_t magic;			/* IVT_CTF_MAGIC */
	uint32_t stream_id;		/* IVT_STREAM_* */
	uint64_t stream_instance_id;	/* channel index */
	uint64_t timestamp_begin;	/* writer clock at open */
	uint64_t timestamp_end;		/* writer clock of the last event (at close) */
	uint64_t content_size;		/* bits: header + events, no padding (at close) */
	uint64_t packet_size;		/* bits: subbuf_size * 8 (at close) */
	uint64_t packet_seq_num;	/* the packet's seq */
	uint64_t events_discarded;	/* running count of this channel's drops (at close) */
	uint64_t first_event_seq;	/* events committed on this channel before this packet */
	uint32_t event_count;		/* events in this packet (at close) */
	uint32_t cpu_id;		/* kernel: the CPU; user: CPU at open */
	uint32_t owner_pid;		/* user: writer pid; kernel: 0 */
	uint32_t owner_tid;		/* user: writer tid; kernel: 0 */
};

/* ------------------------------------------------------------------ */
/* Events                                                              */
/* ------------------------------------------------------------------ */

/*
 * Event header, 4-byte aligned from the packet start (CTF aligns to the
 * packet start), one little-endian u32:
 *
 *   bits 0..4   id, 0..30: compact form, the whole header
 *               31: extended form, followed by u32 id, u64 timestamp
 *   bits 5..31  compact: low 27 bits of the timestamp
 *               extended: zero
 *
 * Compact requires id <= 30 and (ts - previous ts in this packet) < 2^27,
 * so a reader recovers the full value with at most one wrap (CTF 1.8 §8).
 * The payload follows byte-packed (fields unaligned, little-endian), as
 * described by the event's metadata record; the next header starts at the
 * next 4-byte boundary. Events never straddle packets.
 */
#define IVT_EV_ID_BITS		5
#define IVT_EV_ID_EXTENDED	31u
#define IVT_EV_COMPACT_MAX_ID	30u
#define IVT_EV_TS_BITS		27
#define IVT_EV_TS_MASK		((1ULL << IVT_EV_TS_BITS) - 1)
#define IVT_EV_ALIGN		4u

struct ivt_event_ext {
	uint32_t word;			/* IVT_EV_ID_EXTENDED */
	uint32_t id;
	uint64_t timestamp;		/* full writer clock value (4-byte aligned) */
} __attribute__((packed, aligned(4)));

#define IVT_EV_COMPACT_SIZE	4u
#define IVT_EV_EXT_SIZE		16u

/* ------------------------------------------------------------------ */
/* Metadata area: event descriptions                                   */
/* ------------------------------------------------------------------ */

/*
 * Writers append records: off = fetch_add(&hdr->meta_tail, len); if the
 * record fits, write `len`, then the body, then store-release `commit`.
 * Records are 8-byte aligned; the host parses them in order and stops at
 * the first one whose `commit` it has not seen yet. Everything in a
 * record is untrusted by the host: names are sanitised, counts bounded.
 */
#define IVT_META_COMMIT		0x434F4D54u	/* "TMOC" */
#define IVT_META_EVENT		1u
#define IVT_NAME_MAX		64u	/* event name, NUL-padded */
#define IVT_FIELD_NAME_MAX	32u	/* field name, NUL-padded */
#define IVT_FIELDS_MAX		32u

/* Field types. Integers are byte-packed little-endian. */
#define IVT_FT_U8		1u
#define IVT_FT_U16		2u
#define IVT_FT_U32		3u
#define IVT_FT_U64		4u
#define IVT_FT_S8		5u
#define IVT_FT_S16		6u
#define IVT_FT_S32		7u
#define IVT_FT_S64		8u
#define IVT_FT_STRING		9u	/* NUL-terminated UTF-8 */
#define IVT_FT_BYTES		10u	/* u32 length, then that many bytes */
#define IVT_FT_CHARS		11u	/* `count` bytes, NUL-padded text (e.g. comm[16]) */
#define IVT_FT_MAX		11u

/* Field flags. */
#define IVT_FF_HEX		(1u << 0)	/* display integers in base 16 */
#define IVT_FF_TID_COMM		(1u << 1)	/* u32/s32 thread id: the host adds the
						 * thread's name as a char[16] field
						 * before it (prev_tid -> prev_comm) */

struct ivt_meta_field {
	char     name[IVT_FIELD_NAME_MAX];
	uint8_t  type;			/* IVT_FT_* */
	uint8_t  flags;			/* IVT_FF_* */
	uint16_t count;			/* IVT_FT_CHARS: length in bytes; else 0 */
	uint32_t reserved;
};

struct ivt_meta_rec {
	uint32_t len;			/* bytes of this record, multiple of 8 */
	uint32_t commit;		/* IVT_META_COMMIT once complete (release) */
	uint16_t kind;			/* IVT_META_EVENT */
	uint16_t nr_fields;		/* <= IVT_FIELDS_MAX */
	uint32_t event_id;		/* id within its stream class */
	uint32_t stream;		/* IVT_STREAM_* */
	uint32_t group;			/* event group (kernel probes: enable mask bit) */
	char     name[IVT_NAME_MAX];
	struct ivt_meta_field fields[];	/* nr_fields entries */
};

/* ------------------------------------------------------------------ */
/* Thread name table                                                   */
/* ------------------------------------------------------------------ */

/*
 * A record of kind IVT_META_NAMES in the metadata area: the kernel module
 * appends one when it formats the region and keeps its entries current
 * (fork, exec, rename, the state dump), so that a host salvaging a crashed
 * flight recorder can name threads whose naming events the rings have
 * overwritten (docs/abi.md "Thread name table"). It starts like every
 * record (len, commit, kind), so a reader that does not know it skips it.
 *
 * An entry changes only inside its seqcount: a writer takes it with a
 * compare-and-swap of `seq` from even to odd (a full barrier), writes tid,
 * ts and comm, and store-releases `seq` + 1 (even again). A writer that
 * finds `seq` odd gives its update up and counts it in `skipped`. The host
 * load-acquires `seq`, copies the entry, issues an acquire fence and
 * re-reads `seq`: an odd or changed value means a torn copy, not used.
 */
#define IVT_META_NAMES		2u
#define IVT_NAME_DEAD		(1u << 31)	/* tid flag: the thread was freed */

struct ivt_name_entry {
	uint32_t tid;			/* 0: free; IVT_NAME_DEAD | tid once freed */
	uint32_t seq;			/* seqcount, see above */
	uint64_t ts;			/* writer clock when the name was set */
	char     comm[16];		/* NUL-padded thread name */
};

struct ivt_names_rec {
	uint32_t len;			/* bytes of the record, multiple of 8 */
	uint32_t commit;		/* IVT_META_COMMIT once the header is written (release) */
	uint16_t kind;			/* IVT_META_NAMES */
	uint16_t reserved0;
	uint32_t nr_entries;		/* entries that follow the header */
	uint64_t updates;		/* names written (atomic add; statistics) */
	uint64_t skipped;		/* updates given up (entry busy, or no slot) */
	uint8_t  pad[32];
	struct ivt_name_entry entries[];
};

/* ------------------------------------------------------------------ */
/* ftrace formats                                                      */
/* ------------------------------------------------------------------ */

/*
 * A record of kind IVT_META_FTRACE (1.2): one tracefs description file of
 * the guest, as its text, so the host decodes the relayed ftrace pages
 * with the guest's own formats (docs/ftrace.md). `what` says which file:
 * events/header_page, or events/<system>/<event>/format (the event's name
 * and id are in the text). The relay publishes header_page once and each
 * event's format before that event can appear in a page it relays (once
 * per event id). It starts like every record, so older readers skip it.
 */
#define IVT_META_FTRACE		3u
#define IVT_FTRACE_HEADER_PAGE	1u	/* events/header_page */
#define IVT_FTRACE_FORMAT	2u	/* events/<system>/<event>/format */
#define IVT_FTRACE_TEXT_MAX	16384u	/* bytes of one file's text */
#define IVT_FTRACE_SYSTEM_MAX	32u	/* system name, NUL-padded */

struct ivt_ftrace_rec {
	uint32_t len;			/* bytes of the record, multiple of 8 */
	uint32_t commit;		/* IVT_META_COMMIT once complete (release) */
	uint16_t kind;			/* IVT_META_FTRACE */
	uint16_t what;			/* IVT_FTRACE_HEADER_PAGE or IVT_FTRACE_FORMAT */
	uint32_t text_len;		/* bytes of text, <= IVT_FTRACE_TEXT_MAX */
	char     system[IVT_FTRACE_SYSTEM_MAX];	/* the event's directory under events/ */
	char     text[];		/* the file as tracefs gives it (no NUL) */
};

static inline uint32_t ivt_ftrace_rec_size(uint32_t text_len)
{
	return ((uint32_t)sizeof(struct ivt_ftrace_rec) + text_len + 7u) & ~7u;
}

/* ------------------------------------------------------------------ */
/* Pinned offsets: any change here is an ABI change.                   */
/* ------------------------------------------------------------------ */

#ifdef __cplusplus
#define IVT_STATIC_ASSERT(cond, msg)	static_assert(cond, msg)
#else
#define IVT_STATIC_ASSERT(cond, msg)	_Static_assert(cond, msg)
#endif
#define IVT_ASSERT_OFF(type, field, off) \
	IVT_STATIC_ASSERT(offsetof(struct type, field) == (off), #type "." #field)
#define IVT_ASSERT_SIZE(type, size) \
	IVT_STATIC_ASSERT(sizeof(struct type) == (size), "sizeof " #type)

IVT_ASSERT_SIZE(ivt_layout, 48);
IVT_ASSERT_SIZE(ivt_clock, 32);
IVT_ASSERT_SIZE(ivt_sync, 128);
IVT_ASSERT_SIZE(ivt_control, 128);
IVT_ASSERT_SIZE(ivt_region_hdr, IVT_PAGE_SIZE);
IVT_ASSERT_OFF(ivt_region_hdr, magic, 0);
IVT_ASSERT_OFF(ivt_region_hdr, abi_major, 8);
IVT_ASSERT_OFF(ivt_region_hdr, hdr_size, 12);
IVT_ASSERT_OFF(ivt_region_hdr, region_size, 16);
IVT_ASSERT_OFF(ivt_region_hdr, features, 24);
IVT_ASSERT_OFF(ivt_region_hdr, uuid, 32);
IVT_ASSERT_OFF(ivt_region_hdr, default_mode, 48);
IVT_ASSERT_OFF(ivt_region_hdr, owner_pid, 52);
IVT_ASSERT_OFF(ivt_region_hdr, layout, 64);
IVT_ASSERT_OFF(ivt_region_hdr, clock, 128);
IVT_ASSERT_OFF(ivt_region_hdr, state, 192);
IVT_ASSERT_OFF(ivt_region_hdr, meta_tail, 196);
IVT_ASSERT_OFF(ivt_region_hdr, next_event_id, 200);
IVT_ASSERT_OFF(ivt_region_hdr, lost_no_channel, 208);
IVT_ASSERT_OFF(ivt_region_hdr, doorbells, 216);
IVT_ASSERT_OFF(ivt_region_hdr, host_sleeping, 256);
IVT_ASSERT_OFF(ivt_region_hdr, host_peer_id, 260);
IVT_ASSERT_OFF(ivt_region_hdr, host_vector, 262);
IVT_ASSERT_OFF(ivt_region_hdr, host_heartbeat, 264);
IVT_ASSERT_OFF(ivt_region_hdr, flush_interval_ms, 272);
IVT_ASSERT_OFF(ivt_region_hdr, control, 320);
IVT_ASSERT_OFF(ivt_region_hdr, sync, 448);
IVT_ASSERT_OFF(ivt_region_hdr, nr_ftrace_channels, 112);
IVT_ASSERT_OFF(ivt_region_hdr, ctl_text, 576);
IVT_ASSERT_SIZE(ivt_ctl_text, 3136);
IVT_ASSERT_OFF(ivt_ctl_text, req, 0);
IVT_ASSERT_OFF(ivt_ctl_text, resp_len, 1024);
IVT_ASSERT_OFF(ivt_ctl_text, resp_flags, 1028);
IVT_ASSERT_OFF(ivt_ctl_text, resp, 1088);
IVT_ASSERT_SIZE(ivt_ftrace_rec, 48);
IVT_ASSERT_OFF(ivt_ftrace_rec, len, 0);
IVT_ASSERT_OFF(ivt_ftrace_rec, commit, 4);
IVT_ASSERT_OFF(ivt_ftrace_rec, kind, 8);
IVT_ASSERT_OFF(ivt_ftrace_rec, what, 10);
IVT_ASSERT_OFF(ivt_ftrace_rec, text_len, 12);
IVT_ASSERT_OFF(ivt_ftrace_rec, system, 16);
IVT_ASSERT_OFF(ivt_ftrace_rec, text, 48);
IVT_ASSERT_OFF(ivt_layout, channels_off, 0);
IVT_ASSERT_OFF(ivt_layout, meta_off, 8);
IVT_ASSERT_OFF(ivt_layout, pool_off, 16);
IVT_ASSERT_OFF(ivt_layout, meta_size, 24);
IVT_ASSERT_OFF(ivt_layout, nr_channels, 28);
IVT_ASSERT_OFF(ivt_layout, nr_kernel_channels, 32);
IVT_ASSERT_OFF(ivt_layout, channel_size, 36);
IVT_ASSERT_OFF(ivt_layout, nr_subbufs, 40);
IVT_ASSERT_OFF(ivt_layout, subbuf_size, 44);
IVT_ASSERT_OFF(ivt_clock, freq_hz, 0);
IVT_ASSERT_OFF(ivt_clock, source, 8);
IVT_ASSERT_OFF(ivt_clock, ref_ticks, 16);
IVT_ASSERT_OFF(ivt_clock, ref_realtime_ns, 24);
IVT_ASSERT_OFF(ivt_control, cmd_seq, 0);
IVT_ASSERT_OFF(ivt_control, cmd, 8);
IVT_ASSERT_OFF(ivt_control, arg, 16);
IVT_ASSERT_OFF(ivt_control, ack_seq, 64);
IVT_ASSERT_OFF(ivt_control, ack_status, 72);
IVT_ASSERT_OFF(ivt_control, groups_enabled, 76);
IVT_ASSERT_OFF(ivt_sync, req_seq, 0);
IVT_ASSERT_OFF(ivt_sync, host_t1, 8);
IVT_ASSERT_OFF(ivt_sync, resp_seq, 64);
IVT_ASSERT_OFF(ivt_sync, resp_t2, 72);
IVT_ASSERT_OFF(ivt_sync, resp_t3, 80);
IVT_ASSERT_SIZE(ivt_channel, 256);
IVT_ASSERT_OFF(ivt_channel, commit_pos, 0);
IVT_ASSERT_OFF(ivt_channel, open_seq, 8);
IVT_ASSERT_OFF(ivt_channel, lost_full, 16);
IVT_ASSERT_OFF(ivt_channel, lost_too_big, 24);
IVT_ASSERT_OFF(ivt_channel, lost_nested, 32);
IVT_ASSERT_OFF(ivt_channel, mode, 40);
IVT_ASSERT_OFF(ivt_channel, stream, 44);
IVT_ASSERT_OFF(ivt_channel, cpu, 48);
IVT_ASSERT_OFF(ivt_channel, events_closed, 56);
IVT_ASSERT_OFF(ivt_channel, state, 64);
IVT_ASSERT_OFF(ivt_channel, owner_pid, 68);
IVT_ASSERT_OFF(ivt_channel, owner_tid, 72);
IVT_ASSERT_OFF(ivt_channel, claims, 76);
IVT_ASSERT_OFF(ivt_channel, consumed, 128);
IVT_ASSERT_SIZE(ivt_packet_hdr, 88);
IVT_ASSERT_OFF(ivt_packet_hdr, magic, 0);
IVT_ASSERT_OFF(ivt_packet_hdr, stream_id, 4);
IVT_ASSERT_OFF(ivt_packet_hdr, stream_instance_id, 8);
IVT_ASSERT_OFF(ivt_packet_hdr, timestamp_begin, 16);
IVT_ASSERT_OFF(ivt_packet_hdr, timestamp_end, 24);
IVT_ASSERT_OFF(ivt_packet_hdr, content_size, 32);
IVT_ASSERT_OFF(ivt_packet_hdr, packet_size, 40);
IVT_ASSERT_OFF(ivt_packet_hdr, packet_seq_num, 48);
IVT_ASSERT_OFF(ivt_packet_hdr, events_discarded, 56);
IVT_ASSERT_OFF(ivt_packet_hdr, first_event_seq, 64);
IVT_ASSERT_OFF(ivt_packet_hdr, event_count, 72);
IVT_ASSERT_OFF(ivt_packet_hdr, cpu_id, 76);
IVT_ASSERT_OFF(ivt_packet_hdr, owner_pid, 80);
IVT_ASSERT_OFF(ivt_packet_hdr, owner_tid, 84);
IVT_ASSERT_SIZE(ivt_event_ext, IVT_EV_EXT_SIZE);
IVT_ASSERT_SIZE(ivt_meta_field, 40);
IVT_ASSERT_OFF(ivt_meta_field, type, 32);
IVT_ASSERT_OFF(ivt_meta_field, flags, 33);
IVT_ASSERT_OFF(ivt_meta_field, count, 34);
IVT_ASSERT_SIZE(ivt_meta_rec, 88);
IVT_ASSERT_OFF(ivt_meta_rec, len, 0);
IVT_ASSERT_OFF(ivt_meta_rec, commit, 4);
IVT_ASSERT_OFF(ivt_meta_rec, kind, 8);
IVT_ASSERT_OFF(ivt_meta_rec, nr_fields, 10);
IVT_ASSERT_OFF(ivt_meta_rec, event_id, 12);
IVT_ASSERT_OFF(ivt_meta_rec, stream, 16);
IVT_ASSERT_OFF(ivt_meta_rec, group, 20);
IVT_ASSERT_OFF(ivt_meta_rec, name, 24);
IVT_ASSERT_OFF(ivt_meta_rec, fields, 88);
IVT_ASSERT_SIZE(ivt_name_entry, 32);
IVT_ASSERT_OFF(ivt_name_entry, tid, 0);
IVT_ASSERT_OFF(ivt_name_entry, seq, 4);
IVT_ASSERT_OFF(ivt_name_entry, ts, 8);
IVT_ASSERT_OFF(ivt_name_entry, comm, 16);
IVT_ASSERT_SIZE(ivt_names_rec, 64);
IVT_ASSERT_OFF(ivt_names_rec, len, 0);
IVT_ASSERT_OFF(ivt_names_rec, commit, 4);
IVT_ASSERT_OFF(ivt_names_rec, kind, 8);
IVT_ASSERT_OFF(ivt_names_rec, nr_entries, 12);
IVT_ASSERT_OFF(ivt_names_rec, updates, 16);
IVT_ASSERT_OFF(ivt_names_rec, skipped, 24);
IVT_ASSERT_OFF(ivt_names_rec, entries, 64);

/* ------------------------------------------------------------------ */
/* Small pure helpers shared by every side                             */
/* ------------------------------------------------------------------ */

static inline uint64_t ivt_subbuf_offset(const struct ivt_layout *l,
					 uint32_t chan, uint64_t seq)
{
	uint64_t idx = (uint64_t)chan * l->nr_subbufs + (seq & (l->nr_subbufs - 1));

	return l->pool_off + idx * l->subbuf_size;
}

static inline uint32_t ivt_meta_rec_size(uint32_t nr_fields)
{
	uint32_t sz = (uint32_t)sizeof(struct ivt_meta_rec) +
		      nr_fields * (uint32_t)sizeof(struct ivt_meta_field);

	return (sz + 7u) & ~7u;
}

#endif /* IVTRACE_ABI_H */
