/* SPDX-License-Identifier: MIT */
/*
 * ivbench.c - runner of the native per-event cost bench (see ivbench.h).
 *
 *   ivbench [--rounds 3] [--samples 200000] [--bench a,b,...] [--json FILE]
 *
 * Pins itself to one CPU, locks its memory (so no page fault lands in a
 * timed loop), calibrates the TSC against CLOCK_MONOTONIC_RAW, then runs
 * every selected bench once per round, rotating the order each round so
 * drift and background load spread over all of them. Per bench and round:
 * setup, warm-up, `samples` single events timed one by one, `batches`
 * batches of `batch` events timed as a whole, teardown. Results go to
 * JSON (stdout or --json); a summary table goes to stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ivbench.h"

struct ivb_opts ivb_opts = {
	.samples = 200000,
	.groups = 50000,
	.warmup = 20000,
	.batch = 20000,
	.batches = 40,
	.rounds = 3,
	.cpu = 0,
	.drain_cpu = 1,
	.shm_dir = "/dev/shm",
	.disk_dir = "/var/tmp",
	.tracefs = "/sys/kernel/tracing/instances/ivbench",
	.lttng_wait_ms = 5000,
};

double ivb_tsc_hz;
double ivb_empty_batch_ns;
struct ivb_overhead ivb_single = { .events = 1 };
struct ivb_overhead ivb_grouped = { .events = IVB_GROUP };

static const struct ivb_bench *const all_benches[] = {
	&ivb_bench_empty,
	&ivb_bench_ivtrace,
	&ivb_bench_ivtrace_live,
	&ivb_bench_ivtrace_busy,
	&ivb_bench_lttng,
	&ivb_bench_marker,
	&ivb_bench_marker_raw,
	&ivb_bench_write_tmpfs,
	&ivb_bench_write_disk,
	&ivb_bench_rdtsc,
	&ivb_bench_getppid,
};
#define NR_ALL	(sizeof(all_benches) / sizeof(all_benches[0]))

static const char default_benches[] =
	"ivtrace,ivtrace_busy,lttng_ust,trace_marker,trace_marker_raw,write_tmpfs,write_disk,rdtsc,getppid";

void ivb_die(const char *bench, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "ivbench: %s: ", bench);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

void ivb_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

uint32_t *ivb_samples_alloc(uint64_t n)
{
	uint32_t *v = malloc((n ? n : 1) * sizeof(*v));

	if (!v)
		ivb_die("ivbench", "cannot allocate %llu samples", (unsigned long long)n);
	memset(v, 0, n * sizeof(*v));	/* fault it in now, not while timing */
	return v;
}

/* ---- statistics --------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const uint32_t *v, uint64_t n, double q)
{
	uint64_t k;

	if (!n)
		return 0;
	k = (uint64_t)(q * (double)n + 0.999999999);
	if (k < 1)
		k = 1;
	if (k > n)
		k = n;
	return v[k - 1];
}

static double mean_u32(const uint32_t *v, uint64_t n)
{
	double s = 0;

	for (uint64_t i = 0; i < n; i++)
		s += v[i];
	return n ? s / (double)n : 0;
}

static const struct { const char *key; double q; } pcts[] = {
	{ "p1", 0.01 }, { "p10", 0.10 }, { "p25", 0.25 }, { "p50", 0.50 },
	{ "p75", 0.75 }, { "p90", 0.90 }, { "p99", 0.99 }, { "p99.9", 0.999 },
	{ "p99.99", 0.9999 },
};
#define NR_PCTS	(sizeof(pcts) / sizeof(pcts[0]))

static double cyc2ns(double c)
{
	return c * 1e9 / ivb_tsc_hz;
}

/* What a sample may cost before we call it "hit by an interrupt or a
 * context switch": 10 us per event. */
static double limit_cycles(const struct ivb_overhead *oh)
{
	return ivb_tsc_hz / 1e5 * oh->events;
}

/* Mean of the samples of v[0..n) at or below `lim`. */
static double mean_below(const uint32_t *v, uint64_t n, double lim)
{
	double s = 0;
	uint64_t k = 0;

	for (uint64_t i = 0; i < n; i++) {
		if (v[i] <= lim) {
			s += v[i];
			k++;
		}
	}
	return k ? s / (double)k : 0;
}

/* Samples of sorted v[0..n) above `cycles` (interrupts, preemption). */
static uint64_t count_over(const uint32_t *v, uint64_t n, double cycles)
{
	uint64_t lo = 0, hi = n;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (v[mid] > cycles)
			hi = mid;
		else
			lo = mid + 1;
	}
	return n - lo;
}

/* Net ns per event of a raw sample value (or mean). */
static double net_ns(double raw, double overhead, const struct ivb_overhead *oh)
{
	return cyc2ns(raw - overhead) / oh->events;
}

void ivb_json_dist(FILE *f, const char *key, uint32_t *v, uint64_t n,
		   const struct ivb_overhead *oh)
{
	double mean = mean_u32(v, n), tmean = mean_below(v, n, limit_cycles(oh));
	unsigned i;

	qsort(v, n, sizeof(*v), cmp_u32);
	fprintf(f, "\"%s\": {\"n\": %llu, \"events_per_sample\": %u,\n  \"raw_cycles\": {",
		key, (unsigned long long)n, oh->events);
	for (i = 0; i < NR_PCTS; i++)
		fprintf(f, "\"%s\": %.0f, ", pcts[i].key, pct(v, n, pcts[i].q));
	fprintf(f, "\"min\": %u, \"max\": %u, \"mean\": %.3f},\n  \"net_ns\": {",
		n ? v[0] : 0, n ? v[n - 1] : 0, mean);
	for (i = 0; i < NR_PCTS; i++)
		fprintf(f, "\"%s\": %.3f, ", pcts[i].key,
			net_ns(pct(v, n, pcts[i].q), oh->p50, oh));
	fprintf(f, "\"mean\": %.3f, \"mean_under_10us\": %.3f},\n  \"over_10us\": %llu},\n",
		net_ns(mean, oh->mean, oh), net_ns(tmean, oh->mean, oh),
		(unsigned long long)count_over(v, n, limit_cycles(oh)));
}

/* ---- machine probes ------------------------------------------------------ */

static uint64_t mono_raw_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* TSC ticks per second over ~`ms` of CLOCK_MONOTONIC_RAW. */
static double tsc_calibrate(unsigned ms)
{
	const struct timespec d = { ms / 1000, (long)(ms % 1000) * 1000000 };
	uint64_t n0 = mono_raw_ns(), t0 = ivb_tsc_begin();

	nanosleep(&d, NULL);
	uint64_t t1 = ivb_tsc_end(), n1 = mono_raw_ns();

	return (double)(t1 - t0) * 1e9 / (double)(n1 - n0);
}

/* p50 TSC cycles of CPUID leaf 0: >= 10k cycles means a nested guest. */
static double cpuid_cycles(void)
{
	enum { N = 2001 };
	static uint32_t v[N];

	for (int i = 0; i < N; i++) {
		uint32_t a = 0, b, c = 0, d;
		uint64_t t0 = ivb_tsc_begin();

		__asm__ __volatile__("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
		v[i] = ivb_sat32(ivb_tsc_end() - t0);
	}
	qsort(v, N, sizeof(v[0]), cmp_u32);
	return v[N / 2];
}

/*
 * The TSC's resolution: the GCD of the common (>= 1 %) steps between two
 * back-to-back rdtsc reads. 1 where the TSC counts every cycle; 26 on this
 * kind of AMD EPYC guest, whose TSC advances in 10 ns steps (rare odd
 * steps, e.g. at a TSC offset adjustment, are ignored).
 */
static unsigned tsc_tick(void)
{
	enum { N = 200000, MAXD = 1024 };
	static unsigned tick;
	static uint32_t hist[MAXD];
	uint64_t prev, t;
	unsigned d, g = 0;

	if (tick)
		return tick;
	prev = __builtin_ia32_rdtsc();
	for (int i = 0; i < N; i++) {
		t = __builtin_ia32_rdtsc();
		if (t - prev < MAXD)
			hist[t - prev]++;
		prev = t;
	}
	for (d = 1; d < MAXD; d++) {
		unsigned a = d, b = g;

		if (hist[d] < N / 100)
			continue;
		while (b) {
			unsigned r = a % b;

			a = b;
			b = r;
		}
		g = a;
	}
	tick = g ? g : 1;
	return tick;
}

/* ---- the run ------------------------------------------------------------- */

struct result {
	const struct ivb_bench *b;
	uint32_t *samples;		/* rounds x samples */
	uint32_t *groups;		/* rounds x groups */
	uint64_t *batch_cycles;		/* rounds x batches */
	unsigned *order;		/* position in each round */
};

static void run_rounds(struct result *res, unsigned nb)
{
	const struct ivb_opts *o = &ivb_opts;
	uint64_t seq = 0;

	for (unsigned r = 0; r < o->rounds; r++) {
		for (unsigned k = 0; k < nb; k++) {
			struct result *x = &res[(k + r) % nb];
			const struct ivb_bench *b = x->b;

			fprintf(stderr, "\rivbench: round %u/%u: %-18s", r + 1, o->rounds, b->name);
			x->order[r] = k;
			if (b->round_setup)
				b->round_setup(r);
			b->batch(o->warmup, seq);
			seq += o->warmup;
			b->sample(x->samples + r * o->samples, o->samples, seq);
			seq += o->samples;
			b->group(x->groups + r * o->groups, o->groups, seq);
			seq += o->groups * IVB_GROUP;
			for (uint64_t j = 0; j < o->batches; j++) {
				x->batch_cycles[r * o->batches + j] = b->batch(o->batch, seq);
				seq += o->batch;
			}
			if (b->round_teardown)
				b->round_teardown(r);
		}
	}
	fprintf(stderr, "\r%60s\r", "");
}

static double batch_ns(const struct result *x, uint64_t i)
{
	return cyc2ns((double)x->batch_cycles[i]) / (double)ivb_opts.batch;
}

static double batch_mean_ns(const struct result *x)
{
	uint64_t n = ivb_opts.rounds * ivb_opts.batches;
	double s = 0;

	for (uint64_t i = 0; i < n; i++)
		s += batch_ns(x, i);
	return s / (double)n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median over all batches: robust to the batch a context switch hit. */
static double batch_median_ns(const struct result *x)
{
	uint64_t n = ivb_opts.rounds * ivb_opts.batches;
	double *v = calloc(n, sizeof(*v)), m;

	for (uint64_t i = 0; i < n; i++)
		v[i] = batch_ns(x, i);
	qsort(v, n, sizeof(*v), cmp_double);
	m = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
	free(v);
	return m;
}

struct summary {
	double p50, p99, p999, mean;	/* net ns, single events */
	double tmean;			/* mean of the samples under 10 us */
	double g50, g99, gmean;		/* net ns per event, groups */
	double batch;			/* net ns per event, batches */
};

/* Sort v[0..n) and compute its net p50/p99/p99.9/mean. */
static void summarize(uint32_t *v, uint64_t n, const struct ivb_overhead *oh,
		      double *p50, double *p99, double *p999, double *mean)
{
	*mean = net_ns(mean_u32(v, n), oh->mean, oh);
	qsort(v, n, sizeof(*v), cmp_u32);
	*p50 = net_ns(pct(v, n, 0.50), oh->p50, oh);
	*p99 = net_ns(pct(v, n, 0.99), oh->p50, oh);
	*p999 = net_ns(pct(v, n, 0.999), oh->p50, oh);
}

static void json_bench(FILE *f, struct result *x, double empty_batch_ns,
		       struct summary *sum)
{
	const struct ivb_opts *o = &ivb_opts;
	double p50, p99, p999, mean, g50, g99, g999, gmean;

	fprintf(f, "{\"name\": ");
	ivb_json_str(f, x->b->name);
	fprintf(f, ",\n\"what\": ");
	ivb_json_str(f, x->b->what);
	fprintf(f, ",\n");
	if (x->b->report)
		x->b->report(f);
	fprintf(f, "\"rounds\": [\n");
	for (unsigned r = 0; r < o->rounds; r++) {
		summarize(x->samples + r * o->samples, o->samples, &ivb_single,
			  &p50, &p99, &p999, &mean);
		summarize(x->groups + r * o->groups, o->groups, &ivb_grouped,
			  &g50, &g99, &g999, &gmean);
		fprintf(f, "  {\"position\": %u, \"single_net_ns\": {\"p50\": %.3f, \"p99\": %.3f, "
			"\"p99.9\": %.3f, \"mean\": %.3f}, \"group_net_ns\": {\"p50\": %.3f, "
			"\"p99\": %.3f, \"mean\": %.3f}, \"batch_ns_per_event_raw\": [",
			x->order[r], p50, p99, p999, mean, g50, g99, gmean);
		for (uint64_t j = 0; j < o->batches; j++)
			fprintf(f, "%s%.3f", j ? ", " : "", batch_ns(x, r * o->batches + j));
		fprintf(f, "]}%s\n", r + 1 < o->rounds ? "," : "");
	}
	fprintf(f, "],\n");
	sum->tmean = net_ns(mean_below(x->samples, o->rounds * o->samples,
				       limit_cycles(&ivb_single)), ivb_single.mean, &ivb_single);
	summarize(x->samples, o->rounds * o->samples, &ivb_single,
		  &sum->p50, &sum->p99, &sum->p999, &sum->mean);
	summarize(x->groups, o->rounds * o->groups, &ivb_grouped,
		  &sum->g50, &sum->g99, &g999, &sum->gmean);
	ivb_json_dist(f, "single", x->samples, o->rounds * o->samples, &ivb_single);
	ivb_json_dist(f, "group", x->groups, o->rounds * o->groups, &ivb_grouped);
	sum->batch = batch_median_ns(x) - empty_batch_ns;
	fprintf(f, "\"batch\": {\"events_per_batch\": %llu, \"batches\": %llu, "
		"\"ns_per_event_raw_mean\": %.3f, \"ns_per_event_raw_median\": %.3f, "
		"\"ns_per_event_net_mean\": %.3f, \"ns_per_event_net_median\": %.3f, "
		"\"events_per_s_net_median\": %.0f}}",
		(unsigned long long)o->batch,
		(unsigned long long)(o->rounds * o->batches),
		batch_mean_ns(x), batch_median_ns(x), batch_mean_ns(x) - empty_batch_ns,
		sum->batch, sum->batch > 0 ? 1e9 / sum->batch : 0);
}

/* Select benches by name; "empty" is always first (it calibrates). */
static unsigned select_benches(const char *list, const struct ivb_bench **sel)
{
	char *copy = strdup(list), *tok, *save;
	unsigned n = 0;

	sel[n++] = &ivb_bench_empty;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		unsigned i;

		for (i = 0; i < NR_ALL && strcmp(all_benches[i]->name, tok); i++)
			;
		if (i == NR_ALL)
			ivb_die("ivbench", "unknown bench '%s' (try --list)", tok);
		if (all_benches[i] != &ivb_bench_empty)
			sel[n++] = all_benches[i];
	}
	free(copy);
	return n;
}

/* Set oh's p50 and mean from the empty bench's samples (left unsorted).
 * The mean leaves out samples an interrupt hit: those are not overhead. */
static void overhead_of(const uint32_t *v, uint64_t n, struct ivb_overhead *oh)
{
	uint32_t *tmp = ivb_samples_alloc(n);

	memcpy(tmp, v, n * sizeof(*tmp));
	oh->mean = mean_below(tmp, n, limit_cycles(oh));
	qsort(tmp, n, sizeof(*tmp), cmp_u32);
	oh->p50 = pct(tmp, n, 0.5);
	free(tmp);
}

/* "1000000,5000000,0" -> values; returns how many. */
static unsigned parse_list(const char *s, uint64_t *v, unsigned max)
{
	unsigned n = 0;
	char *end;

	while (*s && n < max) {
		v[n++] = strtoull(s, &end, 0);
		if (end == s)
			ivb_die("ivbench", "bad number list '%s'", s);
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

/* "8x262144,32x1048576" -> { subbufs, subbuf_size } pairs. */
static unsigned parse_rings(const char *s, uint32_t (*v)[2], unsigned max)
{
	unsigned n = 0;
	char *end;

	while (*s && n < max) {
		v[n][0] = (uint32_t)strtoul(s, &end, 0);
		if (*end != 'x')
			ivb_die("ivbench", "bad ring list '%s' (want KxBYTES,...)", s);
		v[n][1] = (uint32_t)strtoul(end + 1, &end, 0);
		n++;
		s = *end == ',' ? end + 1 : end;
	}
	return n;
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: ivbench [options]\n"
"  --bench LIST         comma-separated benches (default: %s,\n"
"                       plus ivtrace_live when --recorder is given); --list shows all\n"
"  --rounds N           rounds, bench order rotated each round (3)\n"
"  --samples N          single events timed one by one, per bench and round (200000)\n"
"  --groups N           groups of 16 events timed per sample, per bench and round (50000)\n"
"  --warmup N           untimed events before sampling (20000)\n"
"  --batch N            events per throughput batch (20000)\n"
"  --batches N          throughput batches per bench and round (40)\n"
"  --cpu N              CPU to run on (0)\n"
"  --drain-cpu N        CPU for ivtrace_live's recorder (1)\n"
"  --recorder PATH      `ivtrace` binary: enables ivtrace_live\n"
"  --shm-dir DIR        regions and the tmpfs file (/dev/shm)\n"
"  --disk-dir DIR       the write_disk file (/var/tmp)\n"
"  --tracefs DIR        tracefs instance for trace_marker (/sys/kernel/tracing/instances/ivbench)\n"
"  --noreader           also run the no-reader test (ring fills, events dropped)\n"
"  --noreader-events N  timed events per no-reader round (1000000)\n"
"  --noreader-subbufs N / --noreader-subbuf-size B   its ring (64 x 65536)\n"
"  --keep-noreader PATH keep the last no-reader region at PATH (for `ivtrace record`)\n"
"  --live-rates LIST    also write at these rates (events/s, 0 = flat out) while\n"
"                       `ivtrace record` drains (needs --recorder)\n"
"  --live-rings LIST    rings for --live-rates, KxBYTES,... (8x262144,32x1048576)\n"
"  --live-seconds S     seconds per live run (3)\n"
"  --no-mlock           do not mlockall (page faults may land in timed loops)\n"
"  --json FILE          write the JSON there instead of stdout\n",
		default_benches);
}

/* What the command line asks for beyond ivb_opts: the bench list, where the JSON goes, the
 * no-reader test and the live runs. */
struct cli {
	char *bench_list, *json_path;
	int noreader, mlocked;
	struct ivb_noreader_opts nro;
	struct ivb_live_opts lvo;
};

enum { O_BENCH = 256, O_ROUNDS, O_SAMPLES, O_GROUPS, O_WARMUP, O_BATCH, O_BATCHES,
       O_CPU, O_DRAIN_CPU, O_RECORDER, O_SHM, O_DISK, O_TRACEFS, O_NOREADER,
       O_NR_EVENTS, O_NR_SUBBUFS, O_NR_SUBBUF_SIZE, O_KEEP, O_NO_MLOCK,
       O_LIVE_RATES, O_LIVE_RINGS, O_LIVE_SECONDS,
       O_JSON, O_LIST, O_HELP };

static const struct option long_opts[] = {
	{ "bench", 1, 0, O_BENCH }, { "rounds", 1, 0, O_ROUNDS },
	{ "samples", 1, 0, O_SAMPLES }, { "groups", 1, 0, O_GROUPS },
	{ "warmup", 1, 0, O_WARMUP },
	{ "batch", 1, 0, O_BATCH }, { "batches", 1, 0, O_BATCHES },
	{ "cpu", 1, 0, O_CPU }, { "drain-cpu", 1, 0, O_DRAIN_CPU },
	{ "recorder", 1, 0, O_RECORDER }, { "shm-dir", 1, 0, O_SHM },
	{ "disk-dir", 1, 0, O_DISK }, { "tracefs", 1, 0, O_TRACEFS },
	{ "noreader", 0, 0, O_NOREADER }, { "noreader-events", 1, 0, O_NR_EVENTS },
	{ "noreader-subbufs", 1, 0, O_NR_SUBBUFS },
	{ "noreader-subbuf-size", 1, 0, O_NR_SUBBUF_SIZE },
	{ "keep-noreader", 1, 0, O_KEEP }, { "no-mlock", 0, 0, O_NO_MLOCK },
	{ "live-rates", 1, 0, O_LIVE_RATES }, { "live-rings", 1, 0, O_LIVE_RINGS },
	{ "live-seconds", 1, 0, O_LIVE_SECONDS },
	{ "json", 1, 0, O_JSON }, { "list", 0, 0, O_LIST }, { "help", 0, 0, O_HELP },
	{ 0, 0, 0, 0 },
};

/* The live runs' defaults; --live-rates and --live-rings overwrite them in place. */
static uint64_t live_rates[16];
static uint32_t live_rings[8][2] = { { 8, 256 << 10 }, { 32, 1 << 20 } };

/* Apply one option. Returns -1 to go on, else the exit status: 0 after --list or --help,
 * 2 for an unknown option. */
static int set_option(int c, struct ivb_opts *o, struct cli *cli)
{
	unsigned i;

	switch (c) {
	case O_BENCH: cli->bench_list = optarg; break;
	case O_ROUNDS: o->rounds = (unsigned)atoi(optarg); break;
	case O_SAMPLES: o->samples = strtoull(optarg, 0, 0); break;
	case O_GROUPS: o->groups = strtoull(optarg, 0, 0); break;
	case O_WARMUP: o->warmup = strtoull(optarg, 0, 0); break;
	case O_BATCH: o->batch = strtoull(optarg, 0, 0); break;
	case O_BATCHES: o->batches = strtoull(optarg, 0, 0); break;
	case O_CPU: o->cpu = atoi(optarg); break;
	case O_DRAIN_CPU: o->drain_cpu = atoi(optarg); break;
	case O_RECORDER: o->recorder = optarg; break;
	case O_SHM: o->shm_dir = optarg; break;
	case O_DISK: o->disk_dir = optarg; break;
	case O_TRACEFS: o->tracefs = optarg; break;
	case O_NOREADER: cli->noreader = 1; break;
	case O_NR_EVENTS: cli->nro.events = strtoull(optarg, 0, 0); break;
	case O_NR_SUBBUFS: cli->nro.subbufs = (uint32_t)strtoul(optarg, 0, 0); break;
	case O_NR_SUBBUF_SIZE: cli->nro.subbuf_size = (uint32_t)strtoul(optarg, 0, 0); break;
	case O_KEEP: cli->nro.keep_path = optarg; break;
	case O_NO_MLOCK: cli->mlocked = 0; break;
	case O_LIVE_RATES:
		cli->lvo.nr_rates = parse_list(optarg, live_rates, 16);
		break;
	case O_LIVE_RINGS:
		cli->lvo.nr_rings = parse_rings(optarg, live_rings, 8);
		break;
	case O_LIVE_SECONDS: cli->lvo.seconds = atof(optarg); break;
	case O_JSON: cli->json_path = optarg; break;
	case O_LIST:
		for (i = 0; i < NR_ALL; i++)
			printf("%-18s %s\n", all_benches[i]->name, all_benches[i]->what);
		return 0;
	case O_HELP: case 'h': usage(stdout); return 0;
	default: usage(stderr); return 2;
	}
	return -1;
}

/* Parse the command line into ivb_opts and cli, then check it. Returns -1 to go on, else the
 * exit status (as set_option). Without --bench: the default benches, plus ivtrace_live when
 * there is a recorder to drain it. */
static int parse_args(int argc, char **argv, struct ivb_opts *o, struct cli *cli)
{
	static char def[512];
	int c, rc;

	while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1)
		if ((rc = set_option(c, o, cli)) >= 0)
			return rc;
	if (optind != argc || !o->rounds || !o->samples || !o->groups || !o->batch ||
	    !o->batches) {
		usage(stderr);
		return 2;
	}
	if (o->rounds > 64)
		ivb_die("ivbench", "--rounds is at most 64");
	cli->nro.rounds = o->rounds;
	if (!cli->bench_list) {
		snprintf(def, sizeof(def), "%s%s", default_benches,
			 o->recorder ? ",ivtrace_live" : "");
		cli->bench_list = def;
	}
	return -1;
}

/* Pin to the timed CPU and (unless --no-mlock) lock all memory, so that neither a migration
 * nor a page fault lands in a timed loop. */
static void pin_and_lock(int cpu, int mlocked)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0)
		ivb_die("ivbench", "cannot pin to CPU %d: %s", cpu, strerror(errno));
	if (mlocked && mlockall(MCL_CURRENT | MCL_FUTURE) != 0)
		ivb_die("ivbench", "mlockall failed: %s (run as root, raise RLIMIT_MEMLOCK, "
			"or pass --no-mlock)", strerror(errno));
}

/* Allocate each selected bench's sample arrays (all rounds) and run its setup. */
static void setup_benches(const struct ivb_bench **sel, struct result *res, unsigned nb)
{
	const struct ivb_opts *o = &ivb_opts;
	unsigned i;

	for (i = 0; i < nb; i++) {
		res[i].b = sel[i];
		res[i].samples = ivb_samples_alloc(o->rounds * o->samples);
		res[i].groups = ivb_samples_alloc(o->rounds * o->groups);
		res[i].batch_cycles = calloc(o->rounds * o->batches, sizeof(uint64_t));
		res[i].order = calloc(o->rounds, sizeof(unsigned));
		if (sel[i]->setup)
			sel[i]->setup();
	}
}

/* The JSON's fields before the benches: the machine, the parameters, how the timing is done
 * and the overheads taken off every result. */
static void json_head(FILE *f, int mlocked, const double cal[2], double cpuid, double empty_batch)
{
	const struct ivb_opts *o = &ivb_opts;

	fprintf(f, "{\n\"tool\": \"ivbench\",\n\"cpu\": %d,\n\"drain_cpu\": %d,\n"
		"\"mlockall\": %s,\n\"tsc_hz\": %.0f,\n\"tsc_hz_calibrations\": [%.0f, %.0f],\n"
		"\"cpuid_exit_cycles_p50\": %.0f,\n",
		o->cpu, o->drain_cpu, mlocked ? "true" : "false",
		ivb_tsc_hz, cal[0], cal[1], cpuid);
	fprintf(f, "\"params\": {\"rounds\": %u, \"samples\": %llu, \"groups\": %llu, "
		"\"group_events\": %u, \"warmup\": %llu, "
		"\"batch\": %llu, \"batches\": %llu, \"payload_bytes\": %zu},\n",
		o->rounds, (unsigned long long)o->samples, (unsigned long long)o->groups,
		IVB_GROUP, (unsigned long long)o->warmup,
		(unsigned long long)o->batch, (unsigned long long)o->batches,
		sizeof(struct ivb_payload));
	fprintf(f, "\"timing\": \"single: lfence;rdtsc;lfence before one event, rdtscp;lfence "
		"after; group: the same stamps around %u events; net percentile = (raw percentile "
		"- p50 of the empty bench's samples) / events per sample, net mean = (raw mean - "
		"empty mean) / events per sample (the empty mean leaves out samples over 10 us "
		"per event, i.e. interrupts; mean_under_10us does the same for the tracer); batch: one stamp pair around %llu events, "
		"net = raw - the empty batch (medians over all batches)\",\n", IVB_GROUP, (unsigned long long)o->batch);
	fprintf(f, "\"tsc_tick_cycles\": %u,\n", tsc_tick());
	fprintf(f, "\"overhead_single_cycles\": {\"p50\": %.0f, \"mean\": %.3f},\n"
		"\"overhead_group_cycles\": {\"p50\": %.0f, \"mean\": %.3f},\n"
		"\"empty_batch_ns_per_event\": %.3f,\n",
		ivb_single.p50, ivb_single.mean, ivb_grouped.p50, ivb_grouped.mean, empty_batch);
}

/* The human summary on stderr: one line per bench (the empty one left out), ns per event net
 * of the timing overhead. */
static void print_table(const struct ivb_bench **sel, const struct summary *sum, unsigned nb,
			double cpuid)
{
	unsigned i;

	fprintf(stderr, "ivbench: CPU %d, TSC %.1f MHz (tick %u cycles), timing overhead %.0f "
		"cycles, cpuid exit %.0f cycles\n", ivb_opts.cpu, ivb_tsc_hz / 1e6, tsc_tick(),
		ivb_single.p50, cpuid);
	fprintf(stderr, "%-18s %8s %8s | %8s %8s %8s %8s %8s | %8s   (ns/event, net)\n",
		"bench", "grp p50", "grp mean", "p50", "p99", "p99.9", "mean", "mean<10u",
		"batch");
	for (i = 1; i < nb; i++)
		fprintf(stderr, "%-18s %8.1f %8.1f | %8.1f %8.1f %8.1f %8.1f %8.1f | %8.1f\n",
			sel[i]->name, sum[i].g50, sum[i].gmean, sum[i].p50, sum[i].p99,
			sum[i].p999, sum[i].mean, sum[i].tmean, sum[i].batch);
}

int main(int argc, char **argv)
{
	struct cli cli = {
		.mlocked = 1,
		.nro = { .rounds = 3, .events = 1000000, .batch = 20000,
			 .subbufs = 64, .subbuf_size = 65536 },
		.lvo = { .rates = live_rates, .rings = live_rings, .nr_rings = 2, .seconds = 3 },
	};
	struct ivb_opts *o = &ivb_opts;
	const struct ivb_bench *sel[NR_ALL];
	struct result res[NR_ALL];
	struct summary sum[NR_ALL];
	double cal[2], cpuid, empty_batch;
	unsigned nb, i;
	FILE *f = stdout;
	int rc;

	if ((rc = parse_args(argc, argv, o, &cli)) >= 0)
		return rc;
	nb = select_benches(cli.bench_list, sel);
	pin_and_lock(o->cpu, cli.mlocked);
	cal[0] = tsc_calibrate(200);
	cal[1] = tsc_calibrate(200);
	ivb_tsc_hz = cal[1];
	cpuid = cpuid_cycles();

	setup_benches(sel, res, nb);
	run_rounds(res, nb);

	/* The empty bench (res[0]) is the timing overhead of everyone else. */
	overhead_of(res[0].samples, o->rounds * o->samples, &ivb_single);
	overhead_of(res[0].groups, o->rounds * o->groups, &ivb_grouped);
	empty_batch = batch_median_ns(&res[0]);
	ivb_empty_batch_ns = empty_batch;

	if (cli.json_path && !(f = fopen(cli.json_path, "w")))
		ivb_die("ivbench", "cannot write %s: %s", cli.json_path, strerror(errno));
	json_head(f, cli.mlocked, cal, cpuid, empty_batch);
	fprintf(f, "\"benches\": [\n");
	for (i = 0; i < nb; i++) {
		json_bench(f, &res[i], empty_batch, &sum[i]);
		fprintf(f, "%s\n", i + 1 < nb ? "," : "");
	}
	fprintf(f, "]");
	if (cli.noreader) {
		fprintf(stderr, "ivbench: no-reader test\n");
		fprintf(f, ",\n\"noreader\": ");
		ivb_noreader(f, &cli.nro);
	}
	if (cli.lvo.nr_rates) {
		fprintf(f, ",\n\"live_rates\": ");
		ivb_live_rates(f, &cli.lvo);
	}
	fprintf(f, "\n}\n");
	if (f != stdout)
		fclose(f);

	print_table(sel, sum, nb, cpuid);
	for (i = 0; i < nb; i++)
		if (sel[i]->teardown)
			sel[i]->teardown();
	return 0;
}
