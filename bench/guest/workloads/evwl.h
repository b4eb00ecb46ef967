/* SPDX-License-Identifier: MIT */
/*
 * evwl.h - shared bits of the evaluation workloads (bench/guest/workloads).
 *
 * Every workload runs for a fixed wall time (-t SECONDS, CLOCK_MONOTONIC),
 * counts whole operations and prints exactly one result line on stdout:
 *
 *   EVWL workload=NAME score=S unit=U ops=N elapsed=E
 *
 * S is higher-is-better (operations or bytes per second). Errors go to stderr
 * with exit status 1 (2 for usage).
 */
#ifndef EVWL_H
#define EVWL_H

#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static inline double evwl_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double evwl_seconds(int argc, char **argv, double dflt)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "-t"))
			return strtod(argv[i + 1], NULL);
	return dflt;
}

static inline void evwl_result(const char *name, double score, const char *unit,
			       uint64_t ops, double elapsed)
{
	printf("EVWL workload=%s score=%.6g unit=%s ops=%" PRIu64 " elapsed=%.6f\n",
	       name, score, unit, ops, elapsed);
	fflush(stdout);
}

#define EVWL_DIE(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

#endif
