/* SPDX-License-Identifier: GPL-2.0 */
/*
 * relay.h - ivtrace-ftrace, the ftrace relay (docs/ftrace.md).
 *
 * One thread per CPU moves that CPU's ftrace ring-buffer pages from
 * per_cpu/cpuN/trace_pipe_raw into its IVT_STREAM_FTRACE channel of the
 * region, followed by the CPU's ftrace counters; the main thread serves
 * the host's IVT_CMD_FTRACE requests and publishes the format of every
 * event that can appear in a page. A page reaches the channel in one
 * copy either way: where the kernel lets user space map the ring buffer
 * (6.10+, TRACE_MMAP_IOCTL_GET_READER) from the mapping, else with read(2)
 * straight into the channel's open packet.
 *
 * Files: main.c (options, start, stop, the request loop), pump.c (the
 * per-CPU page pump, both sources), tracefs.c (tracefs files: requests,
 * formats, stats, the trace clock), symbols.c (this boot's kernel symbols,
 * once).
 */
#ifndef IVTRACE_FTRACE_RELAY_H
#define IVTRACE_FTRACE_RELAY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <ivtrace/abi.h>
#include <ivtrace/ftrace.h>
#include <ivtrace/writer.h>

#define RELAY_NAME	"ivtrace-ftrace"
#define FTRACE_IDS	65536u		/* ftrace event type ids are u16 */

/*
 * The meta page at the start of a mapped ring buffer (the kernel's uapi
 * <linux/trace_mmap.h>, struct trace_buffer_meta, 6.10+), spelled out
 * here because the relay is built against older user-space headers too.
 */
struct ftrace_meta {
	uint32_t meta_page_size;	/* the sub-buffers start after it */
	uint32_t meta_struct_len;
	uint32_t subbuf_size;
	uint32_t nr_subbufs;		/* the reader's included */
	uint64_t reader_lost_events;
	uint32_t reader_id;		/* the sub-buffer user space reads now */
	uint32_t reader_read;		/* bytes of it the kernel counts as read */
	uint64_t flags;
	uint64_t entries;		/* ever written */
	uint64_t overrun;		/* overwritten before being read */
	uint64_t read;			/* read */
};

#define FTRACE_MMAP_GET_READER	_IO('R', 0x20)	/* TRACE_MMAP_IOCTL_GET_READER */

/* One CPU's pump: its trace_pipe_raw, its channel, its counters. */
struct pump {
	struct relay *r;
	uint32_t cpu;
	int pipe_fd;			/* per_cpu/cpuN/trace_pipe_raw, O_NONBLOCK */
	int stats_fd;			/* per_cpu/cpuN/stats */
	/* The mapped ring buffer (NULL: read(2) instead). */
	const volatile struct ftrace_meta *meta;
	uint8_t *map;
	size_t map_len;
	uint32_t sb_off;		/* the first sub-buffer's offset in the map */
	uint32_t nr_sb;			/* sub-buffers mapped */
	int map_err;			/* why not mapped at start (0: mapped) */
	int remap;			/* unmapped on request: map again after */
	atomic_int mapped;
	uint32_t reader_id;		/* the reader sub-buffer relayed last */
	uint32_t reader_off;		/* its data bytes already relayed */
	uint64_t meta_seen[3];		/* entries, overrun, read at the last stats read */
	uint64_t stats_ms;		/* when the stats file was read last */
	struct ivt_writer w;		/* writes the channel (this thread only) */
	uint64_t stat[IVT_FTRACE_STAT_COUNT];	/* last written ftrace_stats */
	uint64_t pages;			/* pages committed */
	uint64_t clock_reset;		/* events lost to the relay's clock switch */
	uint64_t open_ms;		/* when the open packet got its first page */
	uint64_t blocked;		/* drains cut short by a full channel */
	pthread_t thread;
	int started;
};

/* The kernel symbols the first pump publishes once (symbols.c). */
enum { SYMBOLS_NONE, SYMBOLS_WRITING, SYMBOLS_DONE };

struct symbols {
	int state;			/* SYMBOLS_*: that pump's only */
	char *buf;			/* the wanted kallsyms lines */
	size_t len, cap, off;		/* off: written so far */
};

struct relay {
	int dev;			/* /dev/ivtrace */
	uint8_t *region;		/* the whole region, mapped shared */
	uint64_t size;
	struct ivt_layout layout;	/* private copy, checked */
	uint32_t first_chan;		/* the first ftrace channel */
	uint32_t nr_cpus;		/* ftrace channels = CPUs pumped */
	int tracefs;			/* the tracefs root, a directory fd */
	uint32_t flush_ms;
	int use_read;			/* --read: read(2) even where mapping works */
	atomic_int stop;
	/* The main thread asks the pumps to unmap (a mapped buffer cannot be
	 * resized): unmap_req up, each mapped pump unmaps and counts itself
	 * in unmapped, maps again once unmap_req is down.
	 */
	atomic_int unmap_req;
	atomic_int unmapped;
	struct pump *pumps;
	uint8_t published[FTRACE_IDS / 8];	/* format ids already published */
	int meta_full;			/* the metadata area refused a format */
	struct symbols symbols;
};

/* main.c */
void relay_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t now_ms(void);

/* pump.c */
int pump_start(struct relay *r, struct pump *p, uint32_t cpu);
void pump_join(struct pump *p);
int pumps_unmap(struct relay *r);
void pumps_remap(struct relay *r);
int pump_has_room(const struct pump *p);

/* symbols.c */
int symbols_publish(struct pump *p, int all);

/* tracefs.c */
int tracefs_open(const char *root);
int tracefs_read(int root, const char *path, char *buf, size_t size);
int tracefs_ensure_tsc(struct relay *r);
void tracefs_publish(struct relay *r);
int tracefs_stats(int fd, uint64_t stat[IVT_FTRACE_STAT_COUNT]);
int tracefs_serve(struct relay *r, const char *text, uint32_t len,
		  char *out, uint32_t *out_len, uint32_t *flags);

#endif /* IVTRACE_FTRACE_RELAY_H */
