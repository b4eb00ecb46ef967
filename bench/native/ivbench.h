/* SPDX-License-Identifier: MIT */
/*
 * ivbench.h - the native per-event cost bench: one process, one pinned CPU,
 * every tracer measured in the same run with the same payload.
 *
 * A benchmark is a row of a table (struct ivb_bench, BPF ringbuf bench
 * style): setup once, set up a round, time single events (sample), time a
 * large batch (batch), tear the round down, report extra numbers. The
 * timing loops are generated per tracer by IVB_LOOPS() so the tracer's
 * write call is inlined into the loop exactly as an application would
 * inline it; no indirect call is timed.
 */
#ifndef IVBENCH_H
#define IVBENCH_H

#include <stdint.h>
#include <stdio.h>

/* The payload every tracer writes: 4 x u64, 32 bytes. */
struct ivb_payload {
	uint64_t a, b, c, d;
};

_Static_assert(sizeof(struct ivb_payload) == 32, "payload is 32 bytes");

/* Run parameters, shared with the benchmarks (read-only for them). */
struct ivb_opts {
	uint64_t samples;	/* timed single events per bench per round */
	uint64_t groups;	/* timed groups of IVB_GROUP events per bench per round */
	uint64_t warmup;	/* untimed events before sampling, per round */
	uint64_t batch;		/* events per throughput batch */
	uint64_t batches;	/* throughput batches per round */
	unsigned rounds;	/* rounds; the bench order rotates each round */
	int cpu;		/* CPU the measuring thread is pinned to */
	int drain_cpu;		/* CPU for ivtrace-live's recorder */
	const char *shm_dir;	/* regions and tmpfs files (/dev/shm) */
	const char *disk_dir;	/* the write(2)-to-disk file */
	const char *tracefs;	/* tracefs instance directory */
	const char *recorder;	/* `ivtrace` binary for ivtrace-live, or NULL */
	unsigned lttng_wait_ms;	/* how long to wait for the tracepoint to be enabled */
};

extern struct ivb_opts ivb_opts;

/* Fail loudly: print "ivbench: <bench>: <message>" and exit 2. */
void ivb_die(const char *bench, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 2, 3)));
/* Write a JSON string literal (quoted, escaped) to `f`. */
void ivb_json_str(FILE *f, const char *s);

struct ivb_bench {
	const char *name;
	const char *what;	/* one line: exactly what one event is */
	/* Once before the rounds; ivb_die() if the tracer cannot be measured. */
	void (*setup)(void);
	void (*round_setup)(unsigned round);
	/* Time n single events, one sample (TSC cycles) each. */
	void (*sample)(uint32_t *out, uint64_t n, uint64_t seq);
	/* Time n groups of IVB_GROUP events, one sample per group. */
	void (*group)(uint32_t *out, uint64_t n, uint64_t seq);
	/* Time n events back to back; returns the TSC cycles taken. */
	uint64_t (*batch)(uint64_t n, uint64_t seq);
	/* End of a round: check the round was valid (ivb_die() if not). */
	void (*round_teardown)(unsigned round);
	/* Extra JSON members (`"key": value,` lines), may be NULL. */
	void (*report)(FILE *json);
	void (*teardown)(void);
};

/* The table, one entry per tracer, defined in the b_*.c files. */
extern const struct ivb_bench ivb_bench_empty, ivb_bench_rdtsc, ivb_bench_getppid,
	ivb_bench_ivtrace, ivb_bench_ivtrace_live, ivb_bench_ivtrace_busy, ivb_bench_lttng,
	ivb_bench_marker, ivb_bench_marker_raw, ivb_bench_write_tmpfs,
	ivb_bench_write_disk;

/* ivtrace with no reader: the ring fills, then every event is dropped. */
struct ivb_noreader_opts {
	unsigned rounds;
	uint64_t events;	/* timed single events per round (most are dropped) */
	uint64_t batch;		/* events per timed batch of dropped events */
	uint32_t subbufs;	/* ring: sub-buffers ... */
	uint32_t subbuf_size;	/* ... of this many bytes */
	const char *keep_path;	/* keep the last round's region here, or NULL */
};
void ivb_noreader(FILE *json, const struct ivb_noreader_opts *o);

/* Paced writers at several rates while `ivtrace record` drains. */
struct ivb_live_opts {
	const uint64_t *rates;		/* events/s; 0: as fast as possible */
	unsigned nr_rates;
	const uint32_t (*rings)[2];	/* { subbufs, subbuf_size } */
	unsigned nr_rings;
	double seconds;			/* per run */
};
void ivb_live_rates(FILE *json, const struct ivb_live_opts *o);

/* ---- shared by the benches: statistics and JSON ------------------------ */

extern double ivb_tsc_hz;		/* calibrated TSC frequency */
extern double ivb_empty_batch_ns;	/* ns per event of the empty bench's batches */

/* What to subtract from a sample, and how many events it covers. */
struct ivb_overhead {
	double p50;		/* cycles: p50 of the empty bench's samples */
	double mean;		/* cycles: mean of the empty bench's samples under 10 us/event */
	unsigned events;	/* events per sample: 1 or IVB_GROUP */
};
extern struct ivb_overhead ivb_single, ivb_grouped;

/*
 * Sort the n samples (TSC cycles, raw) in place and write
 * `"key": {n, raw percentiles and mean in cycles, the same per event and
 * net of the timing overhead in ns},` to f. Net percentile q is
 * (raw q - overhead p50) / events; net mean is (raw mean - overhead
 * mean) / events.
 */
void ivb_json_dist(FILE *f, const char *key, uint32_t *v, uint64_t n,
		   const struct ivb_overhead *oh);
/* Allocate n samples, pre-faulted; ivb_die() on failure. */
uint32_t *ivb_samples_alloc(uint64_t n);

/* ---- timing ------------------------------------------------------------ */

/*
 * Start and end stamps of one timed event. lfence before rdtsc waits for
 * earlier instructions (the previous event) to finish; lfence after it
 * keeps the timed code from starting early. rdtscp at the end waits for
 * the timed code; the lfence after it keeps the next iteration out.
 * Linux makes lfence dispatch-serializing on AMD (LFENCE_RDTSC), so the
 * same sequence is valid on both vendors. The cost of the sequence itself
 * is measured by the "empty" bench and subtracted in the report.
 */
static inline __attribute__((always_inline)) uint64_t ivb_tsc_begin(void)
{
	uint32_t lo, hi;

	__asm__ __volatile__("lfence\n\trdtsc\n\tlfence"
			     : "=a"(lo), "=d"(hi) :: "memory");
	return ((uint64_t)hi << 32) | lo;
}

static inline __attribute__((always_inline)) uint64_t ivb_tsc_end(void)
{
	uint32_t lo, hi, aux;

	__asm__ __volatile__("rdtscp\n\tlfence"
			     : "=a"(lo), "=d"(hi), "=c"(aux) :: "memory");
	return ((uint64_t)hi << 32) | lo;
}

/* The payload of event `seq`: cheap, different per event, not foldable. */
static inline __attribute__((always_inline)) void
ivb_fill(struct ivb_payload *p, uint64_t seq)
{
	p->a = seq;
	p->b = seq * 0x9E3779B97F4A7C15ull;
	p->c = ~seq;
	p->d = 0x1122334455667788ull;
	__asm__ __volatile__("" : : "r"(p) : "memory");
}

static inline uint32_t ivb_sat32(uint64_t v)
{
	return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

/*
 * Events per sample of the "group" loop. The TSC of some CPUs ticks in
 * coarse steps (AMD Zen: one tick = 10 ns of ~26-36 cycles), so a single
 * ~15 ns event cannot be resolved; timing IVB_GROUP events per sample
 * gives a resolution of one tick / IVB_GROUP per event.
 */
#define IVB_GROUP	16

/*
 * Generate prefix##_sample(), prefix##_group() and prefix##_batch()
 * around WRITE(p), a statement that writes the event whose payload is *p
 * (a `struct ivb_payload *`). The single-event loop fills the payload
 * before the start stamp, so only the write is timed; the group and batch
 * loops fill it inside (the empty bench's loops do the same, and are
 * subtracted).
 */
#define IVB_LOOPS(prefix, WRITE)						\
static void prefix##_sample(uint32_t *out, uint64_t n, uint64_t seq)	\
{									\
	struct ivb_payload pl, *p = &pl;				\
	for (uint64_t i = 0; i < n; i++) {				\
		ivb_fill(p, seq + i);					\
		uint64_t t0 = ivb_tsc_begin();				\
		WRITE(p);						\
		uint64_t t1 = ivb_tsc_end();				\
		out[i] = ivb_sat32(t1 - t0);				\
	}								\
}									\
static void prefix##_group(uint32_t *out, uint64_t n, uint64_t seq)	\
{									\
	struct ivb_payload pl, *p = &pl;				\
	for (uint64_t i = 0; i < n; i++, seq += IVB_GROUP) {		\
		uint64_t t0 = ivb_tsc_begin();				\
		for (unsigned j = 0; j < IVB_GROUP; j++) {		\
			ivb_fill(p, seq + j);				\
			WRITE(p);					\
		}							\
		uint64_t t1 = ivb_tsc_end();				\
		out[i] = ivb_sat32(t1 - t0);				\
	}								\
}									\
static uint64_t prefix##_batch(uint64_t n, uint64_t seq)		\
{									\
	struct ivb_payload pl, *p = &pl;				\
	uint64_t t0 = ivb_tsc_begin();					\
	for (uint64_t i = 0; i < n; i++) {				\
		ivb_fill(p, seq + i);					\
		WRITE(p);						\
	}								\
	return ivb_tsc_end() - t0;					\
}

#endif /* IVBENCH_H */
