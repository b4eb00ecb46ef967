/* SPDX-License-Identifier: GPL-2.0 */
/*
 * relay.h - ivtrace-ftrace, the ftrace relay (docs/ftrace.md).
 *
 * One thread per CPU moves that CPU's ftrace ring-buffer pages from
 * per_cpu/cpuN/trace_pipe_raw into its IVT_STREAM_FTRACE channel of the
 * region (read(2) copies each page straight into the channel's open
 * packet), followed by the CPU's ftrace counters; the main thread serves
 * the host's IVT_CMD_FTRACE requests and publishes the format of every
 * event that can appear in a page.
 *
 * Files: main.c (options, start, stop, the request loop), pump.c (the
 * per-CPU page pump), tracefs.c (tracefs files: requests, formats, stats,
 * the trace clock), symbols.c (this boot's kernel symbols, once).
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

/* One CPU's pump: its trace_pipe_raw, its channel, its counters. */
struct pump {
	struct relay *r;
	uint32_t cpu;
	int pipe_fd;			/* per_cpu/cpuN/trace_pipe_raw, O_NONBLOCK */
	int stats_fd;			/* per_cpu/cpuN/stats */
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
	atomic_int stop;
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
