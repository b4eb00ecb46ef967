/* SPDX-License-Identifier: MIT */
/*
 * efd_baseline - eventfd between two host threads, the floor under any
 * doorbell: what QEMU does per guest doorbell under TCG (write(2) on an
 * eventfd) and what a sleeping host pays to wake up.
 *
 *   rate: thread A writes 1 to an eventfd N times as fast as it can;
 *         thread B blocks in read(2) and sums: writes/s, wake-ups, and how
 *         many writes each wake-up coalesced
 *   rtt:  ping-pong over two eventfds, both threads blocking in read(2),
 *         N round trips: percentiles in microseconds
 *
 * Prints one JSON object.  efd_baseline [N]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int efd_a, efd_b;
static uint64_t n_ops;
static uint64_t reads, total;

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void *rate_reader(void *arg)
{
	(void)arg;
	while (total < n_ops) {
		uint64_t v;

		if (read(efd_a, &v, sizeof(v)) == sizeof(v)) {
			total += v;
			reads++;
		}
	}
	return NULL;
}

static void *pong(void *arg)
{
	uint64_t i, v;

	(void)arg;
	for (i = 0; i < n_ops; i++) {
		if (read(efd_a, &v, sizeof(v)) != sizeof(v))
			return NULL;
		v = 1;
		if (write(efd_b, &v, sizeof(v)) != sizeof(v))
			return NULL;
	}
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	uint64_t i, t0, t1, one = 1, *lat;
	pthread_t t;

	n_ops = argc > 1 ? strtoull(argv[1], NULL, 0) : 200000;
	efd_a = eventfd(0, EFD_CLOEXEC);
	efd_b = eventfd(0, EFD_CLOEXEC);

	pthread_create(&t, NULL, rate_reader, NULL);
	t0 = now_ns();
	for (i = 0; i < n_ops; i++)
		if (write(efd_a, &one, sizeof(one)) != sizeof(one))
			return 1;
	pthread_join(t, NULL);
	t1 = now_ns();
	printf("{\"rate\": {\"writes\": %llu, \"seconds\": %.6f, \"writes_per_s\": %.0f, "
	       "\"wakeups\": %llu, \"writes_per_wakeup\": %.1f},\n",
	       (unsigned long long)n_ops, (t1 - t0) / 1e9, n_ops / ((t1 - t0) / 1e9),
	       (unsigned long long)reads, (double)total / (double)(reads ? reads : 1));

	n_ops = n_ops / 10 ? n_ops / 10 : 1;
	lat = calloc(n_ops, sizeof(*lat));
	pthread_create(&t, NULL, pong, NULL);
	for (i = 0; i < n_ops; i++) {
		uint64_t v;

		t0 = now_ns();
		if (write(efd_a, &one, sizeof(one)) != sizeof(one) ||
		    read(efd_b, &v, sizeof(v)) != sizeof(v))
			return 1;
		lat[i] = now_ns() - t0;
	}
	pthread_join(t, NULL);
	qsort(lat, n_ops, sizeof(*lat), cmp);
#define P(q) (lat[(uint64_t)((n_ops - 1) * (q))] / 1000.0)
	printf(" \"rtt\": {\"round_trips\": %llu, \"us\": {\"min\": %.2f, \"p50\": %.2f, \"p90\": %.2f, "
	       "\"p99\": %.2f, \"max\": %.2f}}}\n",
	       (unsigned long long)n_ops, P(0.0), P(0.5), P(0.9), P(0.99), P(1.0));
	return 0;
}
