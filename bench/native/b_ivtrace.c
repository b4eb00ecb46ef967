/* SPDX-License-Identifier: MIT */
/*
 * b_ivtrace.c - libivtrace through its public header (ivtrace.h) only:
 *
 *   ivtrace       ivt_write() into a loopback region in /dev/shm, discard
 *                 mode, no reader, the ring large enough to hold the whole
 *                 round (checked: a round with any drop fails) and
 *                 pre-faulted (the process runs under mlockall), so what is
 *                 timed is the writer alone.
 *   ivtrace_live  the same writer while `ivtrace record` drains the region
 *                 on another CPU (the steady state of a real trace).
 *   ivtrace_busy  the writer alone again, while a thread on the other CPU
 *                 copies 64 MiB buffers in a loop: a control for
 *                 ivtrace_live, same kind of load next door, no reader.
 *   no reader     ivb_noreader(): a small ring that fills, then every event
 *                 is dropped and counted; cost before and after full.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ivtrace.h>

#include "ivbench.h"

extern char **environ;

#define EV_SIZE		(IVT_EV_COMPACT_SIZE + sizeof(struct ivb_payload))	/* 36 */

static const struct ivt_field event4_fields[] = {
	{ .name = "a", .type = IVT_FT_U64 },
	{ .name = "b", .type = IVT_FT_U64 },
	{ .name = "c", .type = IVT_FT_U64 },
	{ .name = "d", .type = IVT_FT_U64 },
};

/* One region under test. */
struct ivregion {
	const char *bench;
	char path[256];
	struct ivt_region_opts ro;
	struct ivt_region *r;
	struct ivt_event ev;
	uint64_t drops;		/* ivt_write() returned -ENOBUFS */
};

static uint32_t pow2_at_least(uint64_t v)
{
	uint32_t p = 2;

	while (p < v && p < IVT_SUBBUFS_MAX)
		p <<= 1;
	return p;
}

static void region_open(struct ivregion *g)
{
	int ret;

	unlink(g->path);
	ret = ivt_region_create(g->path, &g->ro, &g->r);
	if (ret)
		ivb_die(g->bench, "ivt_region_create(%s, %u x %u B) failed: %s",
			g->path, g->ro.subbufs, g->ro.subbuf_size, strerror(-ret));
	ret = ivt_event_register(g->r, "ivbench:event4", event4_fields, 4, &g->ev);
	if (ret)
		ivb_die(g->bench, "ivt_event_register failed: %s", strerror(-ret));
	g->drops = 0;
}

static uint64_t region_lost(struct ivregion *g, struct ivt_stats *st)
{
	ivt_stats(g->r, st);
	return st->lost_full + st->lost_too_big + st->lost_nested + st->lost_no_channel;
}

static void region_json(FILE *f, const struct ivregion *g)
{
	fprintf(f, "\"region\": {\"channels\": %u, \"subbufs\": %u, \"subbuf_size\": %u, "
		"\"mode\": \"discard\", \"event_bytes\": %zu},\n",
		g->ro.channels, g->ro.subbufs, g->ro.subbuf_size, (size_t)EV_SIZE);
}

/* ---- ivtrace: the writer alone ----------------------------------------- */

static struct ivregion solo = { .bench = "ivtrace" };

static void solo_setup(void)
{
	const struct ivb_opts *o = &ivb_opts;
	uint64_t events = o->warmup + o->samples + o->groups * IVB_GROUP +
			  o->batch * o->batches;
	uint64_t per_subbuf = (1u << 20) - sizeof(struct ivt_packet_hdr);

	snprintf(solo.path, sizeof(solo.path), "%s/ivbench-%d.region", o->shm_dir, (int)getpid());
	solo.ro.channels = 1;
	solo.ro.subbuf_size = 1u << 20;
	/* Whole events per packet, plus one packet of slack. */
	solo.ro.subbufs = pow2_at_least(events / (per_subbuf / EV_SIZE) + 2);
	solo.ro.mode = IVT_MODE_DISCARD;
}

static void solo_round_setup(unsigned round)
{
	(void)round;
	region_open(&solo);
}

static void solo_round_teardown(unsigned round)
{
	struct ivt_stats st;
	uint64_t lost = region_lost(&solo, &st);

	(void)round;
	if (lost || solo.drops)
		ivb_die(solo.bench, "the ring (%u x %u B) dropped %llu events in a round "
			"(lost_full %llu); it must hold the whole round",
			solo.ro.subbufs, solo.ro.subbuf_size,
			(unsigned long long)solo.drops, (unsigned long long)st.lost_full);
	ivt_region_close(solo.r);
	unlink(solo.path);
}

static void solo_report(FILE *f)
{
	region_json(f, &solo);
	fprintf(f, "\"ring\": \"large enough for a whole round (checked: 0 drops), "
		"pre-faulted by mlockall, no reader\",\n");
}

#define SOLO_WRITE(p)	(solo.drops += (ivt_write(&solo.ev, (p), sizeof(*(p))) != 0))
IVB_LOOPS(solo, SOLO_WRITE)

const struct ivb_bench ivb_bench_ivtrace = {
	.name = "ivtrace",
	.what = "ivt_write(&ev, &payload, 32): libivtrace inline fast path, loopback region in /dev/shm, discard mode",
	.setup = solo_setup,
	.round_setup = solo_round_setup,
	.sample = solo_sample,
	.group = solo_group,
	.batch = solo_batch,
	.round_teardown = solo_round_teardown,
	.report = solo_report,
};

/* ---- ivtrace_busy: the writer alone, the other CPU copying memory ------- */

#define BUSY_BYTES	(64u << 20)

static struct ivregion busy = { .bench = "ivtrace_busy" };
static pthread_t busy_thread;
static volatile int busy_stop;
static char *busy_src, *busy_dst;
static uint64_t busy_copies;

static void *busy_main(void *arg)
{
	cpu_set_t set;

	(void)arg;
	CPU_ZERO(&set);
	CPU_SET(ivb_opts.drain_cpu, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	while (!busy_stop) {
		memcpy(busy_dst, busy_src, BUSY_BYTES);
		__atomic_fetch_add(&busy_copies, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void busy_setup(void)
{
	solo_setup();		/* the same ring, sized for the round */
	busy.ro = solo.ro;
	snprintf(busy.path, sizeof(busy.path), "%s/ivbench-%d.busy", ivb_opts.shm_dir,
		 (int)getpid());
	busy_src = malloc(BUSY_BYTES);
	busy_dst = malloc(BUSY_BYTES);
	if (!busy_src || !busy_dst)
		ivb_die(busy.bench, "cannot allocate 2 x %u bytes", BUSY_BYTES);
	memset(busy_src, 1, BUSY_BYTES);
	memset(busy_dst, 2, BUSY_BYTES);
}

static void busy_round_setup(unsigned round)
{
	const struct timespec settle = { 0, 50 * 1000000 };
	int ret;

	(void)round;
	region_open(&busy);
	busy_stop = 0;
	ret = pthread_create(&busy_thread, NULL, busy_main, NULL);
	if (ret)
		ivb_die(busy.bench, "cannot start the copy thread: %s", strerror(ret));
	nanosleep(&settle, NULL);
}

static void busy_round_teardown(unsigned round)
{
	struct ivt_stats st;
	uint64_t lost = region_lost(&busy, &st);

	(void)round;
	busy_stop = 1;
	pthread_join(busy_thread, NULL);
	if (lost || busy.drops)
		ivb_die(busy.bench, "the ring dropped %llu events in a round; it must hold the "
			"whole round", (unsigned long long)(lost + busy.drops));
	ivt_region_close(busy.r);
	unlink(busy.path);
}

static void busy_report(FILE *f)
{
	region_json(f, &busy);
	fprintf(f, "\"ring\": \"as ivtrace; meanwhile a thread on CPU %d copies %u MiB "
		"buffers in a loop (%llu copies in all)\",\n", ivb_opts.drain_cpu,
		BUSY_BYTES >> 20, (unsigned long long)busy_copies);
}

#define BUSY_WRITE(p)	(busy.drops += (ivt_write(&busy.ev, (p), sizeof(*(p))) != 0))
IVB_LOOPS(busy, BUSY_WRITE)

const struct ivb_bench ivb_bench_ivtrace_busy = {
	.name = "ivtrace_busy",
	.what = "ivt_write() as in `ivtrace` (no reader), while a thread on the other CPU copies memory (control for ivtrace_live)",
	.setup = busy_setup,
	.round_setup = busy_round_setup,
	.sample = busy_sample,
	.group = busy_group,
	.batch = busy_batch,
	.round_teardown = busy_round_teardown,
	.report = busy_report,
};

/* ---- ivtrace_live: the writer while `ivtrace record` drains ------------ */

#define LIVE_ROUNDS_MAX	64

static struct ivregion live = { .bench = "ivtrace_live" };
static char live_out[256], live_log[256];
static pid_t live_pid;
static uint64_t live_lost[LIVE_ROUNDS_MAX];
static char *live_summary;	/* the recorder's ivtrace.json, last round */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb; (void)flag; (void)ftw;
	return remove(p);
}

static void rm_tree(const char *dir)
{
	nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static char *slurp(const char *path, size_t max)
{
	char *buf;
	ssize_t n;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return NULL;
	buf = malloc(max + 1);
	n = buf ? read(fd, buf, max) : -1;
	close(fd);
	if (n <= 0) {
		free(buf);
		return NULL;
	}
	buf[n] = 0;
	return buf;
}

/* Check the recorder and name its output and log files. */
static void rec_setup(const char *bench)
{
	const struct ivb_opts *o = &ivb_opts;

	if (!o->recorder)
		ivb_die(bench, "needs --recorder PATH (the `ivtrace` binary, bin/ivtrace)");
	if (access(o->recorder, X_OK) != 0)
		ivb_die(bench, "recorder %s is not executable: %s", o->recorder, strerror(errno));
	snprintf(live_out, sizeof(live_out), "%s/ivbench-%d.live-out", o->shm_dir, (int)getpid());
	snprintf(live_log, sizeof(live_log), "%s/ivbench-%d.live-log", o->shm_dir, (int)getpid());
}

static void live_setup(void)
{
	const struct ivb_opts *o = &ivb_opts;

	rec_setup(live.bench);
	snprintf(live.path, sizeof(live.path), "%s/ivbench-%d.live", o->shm_dir, (int)getpid());
	live.ro.channels = 1;
	live.ro.subbufs = 64;		/* 64 MiB: holds a 1M-event batch even undrained */
	live.ro.subbuf_size = 1u << 20;
	live.ro.mode = IVT_MODE_DISCARD;
}

static void live_die_with_log(const char *bench, const char *what)
{
	char *log = slurp(live_log, 4096);

	ivb_die(bench, "%s; recorder log (%s):\n%s", what, live_log, log ? log : "(empty)");
}

/* Wait until the recorder drains `path`: it bumps host_heartbeat (region
 * header, ivtrace/abi.h) once per drain pass. */
static void rec_wait_attached(const char *bench, const char *path)
{
	const struct timespec ms = { 0, 1000000 };
	const struct ivt_region_hdr *hdr;
	int fd = open(path, O_RDONLY), status;
	unsigned waited;

	if (fd < 0)
		ivb_die(bench, "cannot open %s: %s", path, strerror(errno));
	hdr = mmap(NULL, sizeof(*hdr), PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (hdr == MAP_FAILED)
		ivb_die(bench, "cannot map %s: %s", path, strerror(errno));
	for (waited = 0; !__atomic_load_n(&hdr->host_heartbeat, __ATOMIC_RELAXED); waited++) {
		if (waitpid(live_pid, &status, WNOHANG) == live_pid)
			live_die_with_log(bench, "the recorder exited before it attached");
		if (waited == 10000)
			live_die_with_log(bench, "the recorder did not attach within 10 s");
		nanosleep(&ms, NULL);
	}
	munmap((void *)hdr, sizeof(*hdr));
}

/* Start `ivtrace record` on the drain CPU for region `path`; return once
 * it drains. */
static void rec_start(const char *bench, const char *path)
{
	char cpu[16];
	char *argv[] = { "taskset", "-c", cpu, (char *)ivb_opts.recorder, "record",
			 "--shm", (char *)path, "-o", live_out, NULL };
	posix_spawn_file_actions_t fa;
	int ret;

	rm_tree(live_out);
	snprintf(cpu, sizeof(cpu), "%d", ivb_opts.drain_cpu);
	/* posix_spawn (vfork semantics), not fork: a fork would write-protect
	 * our pre-faulted pages and cost page faults inside the timed loops. */
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, live_log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_adddup2(&fa, 1, 2);
	ret = posix_spawnp(&live_pid, "taskset", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (ret)
		ivb_die(bench, "cannot start %s: %s", ivb_opts.recorder, strerror(ret));
	rec_wait_attached(bench, path);
}

/* After the region was closed: wait for the recorder to drain and exit,
 * keep its summary (live_summary), remove its output. */
static void rec_finish(const char *bench)
{
	const struct timespec ms = { 0, 1000000 };
	char path[300];
	int status, waited;

	for (waited = 0; waitpid(live_pid, &status, WNOHANG) != live_pid; waited++) {
		if (waited == 60000) {
			kill(live_pid, SIGTERM);
			waitpid(live_pid, &status, 0);
			live_die_with_log(bench, "the recorder did not exit within 60 s of the region closing");
		}
		nanosleep(&ms, NULL);
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		live_die_with_log(bench, "the recorder failed");
	snprintf(path, sizeof(path), "%s/ivtrace.json", live_out);
	free(live_summary);
	live_summary = slurp(path, 1 << 16);
	rm_tree(live_out);
	unlink(live_log);
}

static void live_round_setup(unsigned round)
{
	(void)round;
	region_open(&live);
	rec_start(live.bench, live.path);
}

static void live_round_teardown(unsigned round)
{
	struct ivt_stats st;

	live_lost[round < LIVE_ROUNDS_MAX ? round : LIVE_ROUNDS_MAX - 1] =
		region_lost(&live, &st);
	/* Closing marks the region closed: the recorder drains and exits. */
	ivt_region_close(live.r);
	rec_finish(live.bench);
	unlink(live.path);
}

/* The recorder's own summary, embedded as-is when it looks like JSON. */
static void json_summary(FILE *f)
{
	if (live_summary && live_summary[strspn(live_summary, " \t\r\n")] == '{')
		fprintf(f, "\"recorder_summary\": %s,\n", live_summary);
}

static void live_report(FILE *f)
{
	unsigned i;

	region_json(f, &live);
	fprintf(f, "\"ring\": \"drained by `ivtrace record` pinned to CPU %d, writing to /dev/shm\",\n",
		ivb_opts.drain_cpu);
	fprintf(f, "\"lost_per_round\": [");
	for (i = 0; i < ivb_opts.rounds && i < LIVE_ROUNDS_MAX; i++)
		fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)live_lost[i]);
	fprintf(f, "],\n");
	/* The recorder's own summary, embedded as-is when it looks like JSON. */
	json_summary(f);
}

#define LIVE_WRITE(p)	(live.drops += (ivt_write(&live.ev, (p), sizeof(*(p))) != 0))
IVB_LOOPS(live, LIVE_WRITE)

const struct ivb_bench ivb_bench_ivtrace_live = {
	.name = "ivtrace_live",
	.what = "ivt_write() as in `ivtrace`, while `ivtrace record` drains the region concurrently on the other CPU",
	.setup = live_setup,
	.round_setup = live_round_setup,
	.sample = live_sample,
	.group = live_group,
	.batch = live_batch,
	.round_teardown = live_round_teardown,
	.report = live_report,
};

/* ---- live rates: a paced writer while `ivtrace record` drains ----------- */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Write events at `rate` per second (0: as fast as possible), paced in
 * 1 ms ticks, for `seconds`. Returns events attempted; *ok gets the
 * committed ones. */
static uint64_t paced_write(struct ivregion *g, uint64_t rate, double seconds, uint64_t *ok,
			    uint64_t *elapsed_ns)
{
	struct ivb_payload pl, *p = &pl;
	uint64_t t0 = now_ns(), end = t0 + (uint64_t)(seconds * 1e9), n = 0, good = 0;
	struct timespec tick;

	clock_gettime(CLOCK_MONOTONIC, &tick);
	for (uint64_t t = t0; t < end; t = now_ns()) {
		/* Events due by now (rate > 0), or a chunk (rate 0). */
		uint64_t due = rate ? (uint64_t)((double)(t - t0) * 1e-9 * (double)rate) + 1 :
				      n + 4096;

		for (; n < due; n++) {
			ivb_fill(p, n);
			good += ivt_write(&g->ev, p, sizeof(*p)) == 0;
		}
		if (rate) {
			tick.tv_nsec += 1000000;
			if (tick.tv_nsec >= 1000000000) {
				tick.tv_nsec -= 1000000000;
				tick.tv_sec++;
			}
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &tick, NULL) == EINTR)
				;
		}
	}
	*elapsed_ns = now_ns() - t0;
	*ok = good;
	return n;
}

void ivb_live_rates(FILE *f, const struct ivb_live_opts *o)
{
	struct ivregion g = { .bench = "live_rates" };
	unsigned i, j, first = 1;

	rec_setup(g.bench);
	snprintf(g.path, sizeof(g.path), "%s/ivbench-%d.rate", ivb_opts.shm_dir, (int)getpid());
	fprintf(f, "{\"method\": \"ivbench creates the region, starts `ivtrace record` on CPU %d, "
		"waits until it drains (host_heartbeat), then writes ivbench:event4 (%zu B in the "
		"ring) at the target rate in 1 ms ticks for %.1f s from CPU %d, closes the region "
		"and waits for the recorder to finish\",\n\"runs\": [\n",
		ivb_opts.drain_cpu, (size_t)EV_SIZE, o->seconds, ivb_opts.cpu);
	for (i = 0; i < o->nr_rings; i++) {
		for (j = 0; j < o->nr_rates; j++) {
			uint64_t produced, ok, ns;
			struct ivt_stats st;

			fprintf(stderr, "\rivbench: live: ring %u x %u, rate %llu        ",
				o->rings[i][0], o->rings[i][1], (unsigned long long)o->rates[j]);
			g.ro = (struct ivt_region_opts){ .channels = 1, .subbufs = o->rings[i][0],
				.subbuf_size = o->rings[i][1], .mode = IVT_MODE_DISCARD };
			region_open(&g);
			rec_start(g.bench, g.path);
			produced = paced_write(&g, o->rates[j], o->seconds, &ok, &ns);
			region_lost(&g, &st);
			ivt_region_close(g.r);
			rec_finish(g.bench);
			unlink(g.path);
			fprintf(f, "%s{\"subbufs\": %u, \"subbuf_size\": %u, \"rate\": %llu, "
				"\"produced\": %llu, \"committed\": %llu, \"lost_full\": %llu, "
				"\"seconds\": %.3f, \"achieved_rate\": %.0f,\n",
				first ? "" : ",\n", o->rings[i][0], o->rings[i][1],
				(unsigned long long)o->rates[j], (unsigned long long)produced,
				(unsigned long long)ok, (unsigned long long)st.lost_full, ns / 1e9,
				produced / (ns / 1e9));
			json_summary(f);
			fprintf(f, "\"event_bytes\": %zu}", (size_t)EV_SIZE);
			first = 0;
		}
	}
	fprintf(f, "\n]}");
	fprintf(stderr, "\r%60s\r", "");
}

/* ---- no reader: the ring fills, then every event is dropped ------------ */

/* Timed single events; returns how many were committed, and where the
 * first drop happened (n if none). */
static uint64_t noreader_sample(struct ivregion *g, uint32_t *out, uint64_t n,
				uint64_t *first_drop)
{
	struct ivb_payload pl, *p = &pl;
	uint64_t ok = 0;

	*first_drop = n;
	for (uint64_t i = 0; i < n; i++) {
		int ret;

		ivb_fill(p, i);
		uint64_t t0 = ivb_tsc_begin();
		ret = ivt_write(&g->ev, p, sizeof(*p));
		uint64_t t1 = ivb_tsc_end();
		out[i] = ivb_sat32(t1 - t0);
		if (ret == 0)
			ok++;
		else if (*first_drop == n)
			*first_drop = i;
	}
	return ok;
}

/* A timed batch; adds the committed events to *ok. Returns cycles. */
static uint64_t noreader_batch(struct ivregion *g, uint64_t n, uint64_t *ok)
{
	struct ivb_payload pl, *p = &pl;
	uint64_t good = 0, t0 = ivb_tsc_begin();

	for (uint64_t i = 0; i < n; i++) {
		ivb_fill(p, i);
		good += ivt_write(&g->ev, p, sizeof(*p)) == 0;
	}
	t0 = ivb_tsc_end() - t0;
	*ok += good;
	return t0;
}

struct noreader_round {
	uint64_t produced, committed, lost, first_drop;
	uint64_t fill_events;		/* events per batch while the ring has room */
	double fill_ns;			/* median ns/event of those batches, net */
	uint64_t drop_events;		/* events per batch once it is full */
	double drop_ns;			/* median ns/event of those batches, net */
	uint64_t b_produced, b_committed, b_lost;
};

#define NR_FILL_BATCHES	9	/* 9 x 10 % of the ring: fits */
#define NR_DROP_BATCHES	40

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Median ns per event, net of the empty batch, of k batches of n events. */
static double median_batch_ns(uint64_t *cycles, unsigned k, uint64_t n)
{
	qsort(cycles, k, sizeof(*cycles), cmp_u64);
	return (double)cycles[k / 2] * 1e9 / ivb_tsc_hz / (double)n - ivb_empty_batch_ns;
}

/* Samples gathered over all rounds: the single events timed before the ring was full, or
 * after. */
struct sample_set {
	uint32_t *v;
	uint64_t n;
};

/* Part 1 of a round: single timed events into an empty ring, through full. The samples up
 * to the first drop go to *before, the rest to *after (s is scratch for one round). The
 * last round's region is kept at --keep-noreader if given. Returns 1 if the region's lost
 * count is not produced - committed. */
static int noreader_singles(struct ivregion *g, const struct ivb_noreader_opts *o, int last,
			    struct noreader_round *x, uint32_t *s,
			    struct sample_set *before, struct sample_set *after)
{
	struct ivt_stats st;
	int keep = last && o->keep_path;

	if (keep)
		snprintf(g->path, sizeof(g->path), "%s", o->keep_path);
	else
		snprintf(g->path, sizeof(g->path), "%s/ivbench-%d.noreader",
			 ivb_opts.shm_dir, (int)getpid());
	region_open(g);
	x->produced = o->events;
	x->committed = noreader_sample(g, s, o->events, &x->first_drop);
	x->lost = region_lost(g, &st);
	memcpy(before->v + before->n, s, x->first_drop * sizeof(*s));
	before->n += x->first_drop;
	memcpy(after->v + after->n, s + x->first_drop, (o->events - x->first_drop) * sizeof(*s));
	after->n += o->events - x->first_drop;
	ivt_region_close(g->r);
	if (!keep)
		unlink(g->path);
	return x->lost != x->produced - x->committed;
}

/* Part 2 of a round, on a fresh region: batches that fit (9 x 10 % of the ring), then, once
 * it is full, batches that are all dropped. Medians, so a preempted batch does not count.
 * Returns 1 if the region's lost count is not produced - committed. */
static int noreader_batches(struct ivregion *g, const struct ivb_noreader_opts *o,
			    uint64_t capacity, struct noreader_round *x)
{
	uint64_t cyc[NR_DROP_BATCHES];
	struct ivt_stats st;

	snprintf(g->path, sizeof(g->path), "%s/ivbench-%d.noreader-b",
		 ivb_opts.shm_dir, (int)getpid());
	region_open(g);
	x->fill_events = capacity / 10;
	for (unsigned k = 0; k < NR_FILL_BATCHES; k++)
		cyc[k] = noreader_batch(g, x->fill_events, &x->b_committed);
	x->fill_ns = median_batch_ns(cyc, NR_FILL_BATCHES, x->fill_events);
	noreader_batch(g, capacity, &x->b_committed);	/* fill it up */
	x->drop_events = o->batch;
	for (unsigned k = 0; k < NR_DROP_BATCHES; k++)
		cyc[k] = noreader_batch(g, x->drop_events, &x->b_committed);
	x->drop_ns = median_batch_ns(cyc, NR_DROP_BATCHES, x->drop_events);
	x->b_produced = NR_FILL_BATCHES * x->fill_events + capacity +
			NR_DROP_BATCHES * x->drop_events;
	x->b_lost = region_lost(g, &st);
	ivt_region_close(g->r);
	unlink(g->path);
	return x->b_lost != x->b_produced - x->b_committed;
}

/* One round's line of the JSON's "rounds" array. */
static void noreader_round_json(FILE *f, const struct noreader_round *x, int more)
{
	fprintf(f, "  {\"produced\": %llu, \"committed\": %llu, \"lost\": %llu, "
		"\"first_drop_index\": %llu, "
		"\"batch_fill_events\": %llu, \"batch_fill_ns_per_event_net\": %.3f, "
		"\"batch_full_events\": %llu, \"batch_full_ns_per_event_net\": %.3f, "
		"\"batch_produced\": %llu, \"batch_committed\": %llu, \"batch_lost\": %llu}%s\n",
		(unsigned long long)x->produced, (unsigned long long)x->committed,
		(unsigned long long)x->lost, (unsigned long long)x->first_drop,
		(unsigned long long)x->fill_events, x->fill_ns,
		(unsigned long long)x->drop_events, x->drop_ns,
		(unsigned long long)x->b_produced, (unsigned long long)x->b_committed,
		(unsigned long long)x->b_lost, more ? "," : "");
}

/* The "noreader" object: the region, the rounds, the latency distributions before and after
 * the ring was full. */
static void noreader_json(FILE *f, const struct ivregion *g, const struct ivb_noreader_opts *o,
			  uint64_t capacity, int mismatch, const struct noreader_round *rr,
			  const struct sample_set *before, const struct sample_set *after)
{
	fprintf(f, "{\n");
	region_json(f, g);
	fprintf(f, "\"capacity_events\": %llu,\n", (unsigned long long)capacity);
	fprintf(f, "\"lost_equals_produced_minus_committed\": %s,\n", mismatch ? "false" : "true");
	if (o->keep_path) {
		fprintf(f, "\"kept_region\": ");
		ivb_json_str(f, o->keep_path);
		fprintf(f, ",\n");
	}
	fprintf(f, "\"rounds\": [\n");
	for (unsigned r = 0; r < o->rounds; r++)
		noreader_round_json(f, &rr[r], r + 1 < o->rounds);
	fprintf(f, "],\n");
	ivb_json_dist(f, "before_full", before->v, before->n, &ivb_single);
	ivb_json_dist(f, "after_full", after->v, after->n, &ivb_single);
	fprintf(f, "\"samples_before_full\": %llu, \"samples_after_full\": %llu\n}",
		(unsigned long long)before->n, (unsigned long long)after->n);
}

void ivb_noreader(FILE *f, const struct ivb_noreader_opts *o)
{
	struct noreader_round *rr = calloc(o->rounds, sizeof(*rr));
	uint32_t *s = ivb_samples_alloc(o->events);
	struct sample_set before = { ivb_samples_alloc(o->events * o->rounds), 0 };
	struct sample_set after = { ivb_samples_alloc(o->events * o->rounds), 0 };
	struct ivregion g = { .bench = "ivtrace_noreader" };
	uint64_t capacity;
	int mismatch = 0;

	g.ro.channels = 1;
	g.ro.subbufs = o->subbufs;
	g.ro.subbuf_size = o->subbuf_size;
	g.ro.mode = IVT_MODE_DISCARD;
	capacity = (uint64_t)o->subbufs *
		   ((o->subbuf_size - sizeof(struct ivt_packet_hdr)) / EV_SIZE);
	for (unsigned r = 0; r < o->rounds; r++) {
		mismatch |= noreader_singles(&g, o, r == o->rounds - 1, &rr[r], s, &before, &after);
		mismatch |= noreader_batches(&g, o, capacity, &rr[r]);
	}
	if (mismatch)
		fprintf(stderr, "ivbench: ivtrace_noreader: WARNING: lost != produced - committed "
			"in some round (see the JSON)\n");
	noreader_json(f, &g, o, capacity, mismatch, rr, &before, &after);
	free(rr);
	free(s);
	free(before.v);
	free(after.v);
}
