/* SPDX-License-Identifier: MIT */
/*
 * fastpath-bench - the writer's cost per event on its fast path: one
 * thread writes a 4 x u64 payload (ivt_fastpath_write4(), tools/fastpath.c)
 * into an overwrite-mode ring (never full, so never dropping), in batches
 * of 1000 timed with the TSC. Prints percentiles of the per-event cost of
 * the batches, next to a loop of bare rdtsc for scale.
 *
 *	build/ivtrace-fastpath-bench [--json] [/dev/shm/NAME]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ivtrace.h>

int ivt_fastpath_write4(const struct ivt_event *ev, const uint64_t v[4]);

#define BATCH	1000u
#define BATCHES	4000u

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Percentile p (0..100) of sorted v[n], in ns per event. */
static double pct(const uint64_t *v, unsigned int n, unsigned int p, double ns_per_tick)
{
	return (double)v[(n - 1) * p / 100] * ns_per_tick / BATCH;
}

static void rdtsc_batches(uint64_t *t)
{
	unsigned int b, i;

	for (b = 0; b < BATCHES; b++) {
		uint64_t t0 = ivt_clock(), x = 0;

		for (i = 0; i < BATCH; i++)
			x += ivt_clock();
		__asm__ volatile("" :: "r"(x));
		t[b] = ivt_clock() - t0;
	}
}

static void write_batches(const struct ivt_event *ev, uint64_t *t)
{
	uint64_t v[4] = { 1, 2, 3, 4 };
	unsigned int b, i;

	for (b = 0; b < BATCHES; b++) {
		uint64_t t0 = ivt_clock();

		for (i = 0; i < BATCH; i++) {
			v[0] = i;
			ivt_fastpath_write4(ev, v);
		}
		t[b] = ivt_clock() - t0;
	}
}

int main(int argc, char **argv)
{
	static const struct ivt_field f[] = {
		{ "a", IVT_FT_U64, 0, 0 }, { "b", IVT_FT_U64, 0, 0 },
		{ "c", IVT_FT_U64, 0, 0 }, { "d", IVT_FT_U64, 0, 0 },
	};
	struct ivt_region_opts o = { .channels = 2, .subbufs = 4,
				     .subbuf_size = 1 << 20, .mode = IVT_MODE_OVERWRITE };
	static uint64_t tw[BATCHES], tr[BATCHES];
	char def[64];
	const char *path = def;
	struct ivt_region_info ri;
	struct ivt_region *r;
	struct ivt_stats st;
	struct ivt_event ev;
	int json = 0, i, err;
	double npt;

	snprintf(def, sizeof(def), "/dev/shm/ivt-fastpath-%d", (int)getpid());
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else
			path = argv[i];
	}
	err = ivt_region_create(path, &o, &r);
	if (!err)
		err = ivt_event_register(r, "bench:4u64", f, 4, &ev);
	if (err) {
		fprintf(stderr, "ivtrace-fastpath-bench: %s: %s\n", path, strerror(-err));
		return 2;
	}
	ivt_region_info(r, &ri);
	npt = 1e9 / (double)ri.freq_hz;

	write_batches(&ev, tw);			/* warm up: claim, fault in */
	rdtsc_batches(tr);
	write_batches(&ev, tw);
	qsort(tw, BATCHES, sizeof(tw[0]), cmp_u64);
	qsort(tr, BATCHES, sizeof(tr[0]), cmp_u64);
	ivt_stats(r, &st);

	if (json)
		printf("{\"payload_bytes\":32,\"batch\":%u,\"batches\":%u,"
		       "\"ns_per_event\":{\"p50\":%.2f,\"p90\":%.2f,\"p99\":%.2f,\"min\":%.2f},"
		       "\"rdtsc_ns\":{\"p50\":%.2f},\"tsc_hz\":%lu,\"dropped\":%lu}\n",
		       BATCH, BATCHES, pct(tw, BATCHES, 50, npt), pct(tw, BATCHES, 90, npt),
		       pct(tw, BATCHES, 99, npt), pct(tw, BATCHES, 0, npt),
		       pct(tr, BATCHES, 50, npt), (unsigned long)ri.freq_hz,
		       (unsigned long)(st.lost_full + st.lost_too_big + st.lost_nested +
				       st.lost_no_channel));
	else
		printf("ivt_write, 4 x u64 payload, ns/event over %u batches of %u:\n"
		       "  p50 %.2f  p90 %.2f  p99 %.2f  min %.2f   (rdtsc alone: p50 %.2f)\n",
		       BATCHES, BATCH, pct(tw, BATCHES, 50, npt), pct(tw, BATCHES, 90, npt),
		       pct(tw, BATCHES, 99, npt), pct(tw, BATCHES, 0, npt),
		       pct(tr, BATCHES, 50, npt));
	ivt_region_close(r);
	if (path == def)
		unlink(path);
	return 0;
}
