// SPDX-License-Identifier: MIT
/*
 * ev-helper - small guest-side helpers for bench/guest/evalguest.sh
 * (reads the ivtrace region through /dev/ivtrace; struct layouts from
 * abi/include/ivtrace/abi.h):
 *
 *   ev-helper regionstat [PATH]
 *       EVH regionstat events_closed=N lost=L channels=C heartbeat=H
 *       (kernel channels: events in closed packets and drops, summed)
 *   ev-helper tcgcost
 *       EVH tcgcost rdtsc_ns=.. store8_ns=.. load8_ns=.. clock_gettime_ns=..
 *       getppid_ns=.. loop_ns=..: what the primitives of a trace event cost on this
 *       CPU (best of 3 rounds, net of the empty loop); run in the guest and on the
 *       host, it shows what the emulator makes costlier
 *   ev-helper hbwait [SECS] [PATH]
 *       wait (default 60 s) until the host's heartbeat word has advanced
 *       twice, i.e. `ivtrace record` is attached and draining; exit 1 on
 *       timeout.
 */
#include "evwl.h"
#include <fcntl.h>
#include <stddef.h>
#include <sys/mman.h>
#include <ivtrace/abi.h>

static const volatile uint8_t *map(const char *path, size_t *len)
{
	struct ivt_region_hdr h;
	const void *p;
	size_t need;
	/* O_RDWR: /dev/ivtrace refuses a mapping without VM_SHARED. */
	int fd = open(path, O_RDWR);

	if (fd < 0)
		EVWL_DIE("ev-helper: %s: %s", path, strerror(errno));
	p = mmap(NULL, sizeof(h), PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		EVWL_DIE("ev-helper: mmap %s: %s", path, strerror(errno));
	memcpy(&h, p, sizeof(h));
	munmap((void *)p, sizeof(h));
	if (h.magic != IVT_MAGIC || h.layout.channel_size < sizeof(struct ivt_channel) ||
	    h.layout.nr_kernel_channels > h.layout.nr_channels ||
	    h.layout.channels_off + (uint64_t)h.layout.nr_kernel_channels *
	    h.layout.channel_size > h.region_size)
		EVWL_DIE("ev-helper: %s is not a formatted ivtrace region", path);
	need = h.layout.channels_off + (size_t)h.layout.nr_kernel_channels * h.layout.channel_size;
	p = mmap(NULL, need, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		EVWL_DIE("ev-helper: mmap %s: %s", path, strerror(errno));
	close(fd);
	*len = need;
	return p;
}

static uint64_t heartbeat(const volatile uint8_t *m)
{
	return *(const volatile uint64_t *)(m + offsetof(struct ivt_region_hdr, host_heartbeat));
}

static int regionstat(const char *path)
{
	size_t len;
	const volatile uint8_t *m = map(path, &len);
	const struct ivt_region_hdr *h = (const void *)m;
	uint64_t closed = 0, lost = 0;

	for (uint32_t c = 0; c < h->layout.nr_kernel_channels; c++) {
		const volatile struct ivt_channel *ch = (const volatile void *)
			(m + h->layout.channels_off + (uint64_t)c * h->layout.channel_size);

		closed += ch->events_closed;
		lost += ch->lost_full + ch->lost_too_big + ch->lost_nested;
	}
	printf("EVH regionstat events_closed=%" PRIu64 " lost=%" PRIu64 " channels=%u heartbeat=%"
	       PRIu64 "\n", closed, lost, h->layout.nr_kernel_channels, heartbeat(m));
	return 0;
}

static int hbwait(double secs, const char *path)
{
	size_t len;
	const volatile uint8_t *m = map(path, &len);
	uint64_t first = heartbeat(m), seen = first;
	int moves = 0;
	double end = evwl_now() + secs;

	while (moves < 2) {
		struct timespec ms5 = { 0, 5000000 };
		uint64_t v = heartbeat(m);

		if (v != seen) {
			seen = v;
			moves++;
			continue;
		}
		if (evwl_now() > end) {
			fprintf(stderr, "ev-helper: host heartbeat did not move in %.0f s (%" PRIu64
				")\n", secs, v);
			return 1;
		}
		nanosleep(&ms5, NULL);
	}
	printf("EVH hbwait ok heartbeat=%" PRIu64 "\n", seen);
	return 0;
}

/* ---- tcgcost: what the primitives of an event cost here (guest or host) ---- */

static volatile uint64_t cbuf[8192];	/* 64 KiB: stays in cache */
static volatile uint64_t csink;

static inline uint64_t rdtsc(void)
{
	uint32_t lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return (uint64_t)hi << 32 | lo;
}

/* ns per iteration of BODY, best of 3 rounds of n iterations */
#define COST(n, BODY) ({						\
	double best = 1e30;						\
	for (int round = 0; round < 3; round++) {			\
		double t0 = evwl_now();					\
		for (uint64_t i = 0; i < (n); i++) {			\
			BODY;						\
			__asm__ volatile("" ::: "memory");		\
		}							\
		double ns = (evwl_now() - t0) * 1e9 / (double)(n);	\
		if (ns < best)						\
			best = ns;					\
	}								\
	best;								\
})

static int tcgcost(void)
{
	struct timespec ts;
	uint64_t acc = 0;
	double empty = COST(4000000, (void)0);
	double tsc = COST(1000000, acc += rdtsc()) - empty;
	double store = COST(8000000, cbuf[i & 8191] = i) - empty;
	double load = COST(8000000, acc += cbuf[(i * 8) & 8191]) - empty;
	double clk = COST(500000, (clock_gettime(CLOCK_MONOTONIC, &ts), acc += (uint64_t)ts.tv_nsec))
		- empty;
	double sys = COST(100000, acc += (uint64_t)getppid()) - empty;

	csink = acc;
	printf("EVH tcgcost rdtsc_ns=%.2f store8_ns=%.2f load8_ns=%.2f clock_gettime_ns=%.2f "
	       "getppid_ns=%.1f loop_ns=%.2f\n", tsc, store, load, clk, sys, empty);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "tcgcost"))
		return tcgcost();
	if (argc >= 2 && !strcmp(argv[1], "regionstat") && argc <= 3)
		return regionstat(argc == 3 ? argv[2] : "/dev/ivtrace");
	if (argc >= 2 && !strcmp(argv[1], "hbwait") && argc <= 4)
		return hbwait(argc >= 3 ? strtod(argv[2], NULL) : 60.0,
			      argc == 4 ? argv[3] : "/dev/ivtrace");
	fputs("usage: ev-helper regionstat [PATH] | hbwait [SECS] [PATH] | tcgcost\n", stderr);
	return 2;
}
