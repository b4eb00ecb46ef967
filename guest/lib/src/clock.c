/* SPDX-License-Identifier: MIT */
/*
 * clock.c - the writer clock (the TSC): its frequency, a reference pair
 * against CLOCK_REALTIME, and the random uuid of a new region.
 */
#include <cpuid.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define IVT_CALIBRATE_NS	15000000ull	/* 15 ms: ~ppm precision */

static uint64_t ivt__ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * One (ticks, ns) pair: the clock read bracketed by two rdtsc, keeping
 * the tightest of a few tries so that a preemption or an interrupt in
 * the middle does not skew it. Ticks are the bracket's midpoint.
 */
static void ivt__pair(clockid_t clk, uint64_t *ticks, uint64_t *ns)
{
	uint64_t best = UINT64_MAX;
	int i;

	*ticks = *ns = 0;
	for (i = 0; i < 8; i++) {
		uint64_t t0 = ivt_clock();
		uint64_t n = ivt__ns(clk);
		uint64_t t1 = ivt_clock();

		if (t1 - t0 < best) {
			best = t1 - t0;
			*ticks = t0 + (t1 - t0) / 2;
			*ns = n;
		}
	}
}

/* CPUID leaf 0x15: TSC = crystal * EBX / EAX, when the CPU says so. */
static uint64_t ivt__tsc_hz_cpuid(void)
{
	unsigned int a, b, c, d;

	if (__get_cpuid_max(0, 0) < 0x15)
		return 0;
	__cpuid(0x15, a, b, c, d);
	if (!a || !b || !c)
		return 0;
	return (uint64_t)c * b / a;
}

static uint64_t ivt__tsc_hz_measure(void)
{
	struct timespec nap = { 0, IVT_CALIBRATE_NS };
	uint64_t t0, n0, t1, n1;

	ivt__pair(CLOCK_MONOTONIC_RAW, &t0, &n0);
	while (nanosleep(&nap, &nap) && errno == EINTR)
		;
	ivt__pair(CLOCK_MONOTONIC_RAW, &t1, &n1);
	if (n1 <= n0 || t1 <= t0)
		return 0;
	return (uint64_t)((unsigned __int128)(t1 - t0) * 1000000000u / (n1 - n0));
}

/*
 * Ticks per second of ivt_clock(). Measured once per process (15 ms) and
 * cached: every region this process formats gets the same value.
 */
uint64_t ivt__tsc_hz(void)
{
	static uint64_t hz;
	uint64_t v = __atomic_load_n(&hz, __ATOMIC_RELAXED);

	if (v)
		return v;
	v = ivt__tsc_hz_cpuid();
	if (!v)
		v = ivt__tsc_hz_measure();
	/* Relaxed: a plain cache; two racing measurements both store a
	 * valid value. */
	__atomic_store_n(&hz, v, __ATOMIC_RELAXED);
	return v;
}

void ivt__clock_ref(uint64_t *ticks, uint64_t *realtime_ns)
{
	ivt__pair(CLOCK_REALTIME, ticks, realtime_ns);
}

/* Random (version 4) uuid. getrandom() first; a uuid only names a trace,
 * so if no entropy source works, time and pid still make it unique. */
void ivt__uuid(uint8_t uuid[16])
{
	ssize_t n = getrandom(uuid, 16, GRND_NONBLOCK);

	if (n != 16) {
		int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);

		n = fd >= 0 ? read(fd, uuid, 16) : -1;
		if (fd >= 0)
			close(fd);
	}
	if (n != 16) {
		uint64_t a = ivt_clock(), b = ivt__ns(CLOCK_REALTIME) ^
			     ((uint64_t)getpid() << 32);

		memcpy(uuid, &a, 8);
		memcpy(uuid + 8, &b, 8);
	}
	uuid[6] = (uint8_t)((uuid[6] & 0x0f) | 0x40);
	uuid[8] = (uint8_t)((uuid[8] & 0x3f) | 0x80);
}
