/* SPDX-License-Identifier: MIT */
/* t.c - helpers shared by libivtrace's tests (see t.h). */
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t.h"

#define T_MAX_PATHS 64

static char t_paths[T_MAX_PATHS][128];
static int t_nr_paths;
static pid_t t_owner;

void t_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "FAIL %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(T_FAIL);
}

void t_skip(const char *why)
{
	fprintf(stderr, "SKIP: %s\n", why);
	exit(T_SKIP);
}

const char *t_strerror(int err)
{
	return strerror(err);
}

static void t_cleanup(void)
{
	int i;

	if (getpid() != t_owner)
		return;
	for (i = 0; i < t_nr_paths; i++)
		unlink(t_paths[i]);
}

const char *t_path(const char *tag)
{
	char *p;

	if (t_nr_paths == T_MAX_PATHS)
		t_fail(__FILE__, __LINE__, "too many test paths");
	if (!t_nr_paths) {
		t_owner = getpid();
		atexit(t_cleanup);
	}
	p = t_paths[t_nr_paths];
	snprintf(p, sizeof(t_paths[0]), "/dev/shm/ivt-test-%s-%d-%d", tag,
		 (int)getpid(), t_nr_paths);
	t_nr_paths++;
	unlink(p);
	return p;
}

struct ivt_region *t_create(const char *path, uint32_t channels,
			    uint32_t subbufs, uint32_t subbuf_size,
			    uint32_t mode)
{
	struct ivt_region_opts o = {
		.channels = channels, .subbufs = subbufs,
		.subbuf_size = subbuf_size, .mode = mode,
	};
	struct ivt_region *r = NULL;

	T_OK(ivt_region_create(path, &o, &r));
	T_CHECK(r != NULL);
	return r;
}

uint64_t t_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void t_spin_ticks(uint64_t ticks)
{
	uint64_t t0 = ivt_clock();

	while (ivt_clock() - t0 < ticks)
		;
}
