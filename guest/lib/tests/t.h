/* SPDX-License-Identifier: MIT */
/*
 * t.h - helpers shared by libivtrace's tests: exit codes (the automake
 * convention), checks that say what differed, and region files in
 * /dev/shm with unique names that are removed when the test ends.
 */
#ifndef IVT_TEST_T_H
#define IVT_TEST_T_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <ivtrace.h>

#define T_PASS	0
#define T_FAIL	1
#define T_SKIP	77

void t_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 3, 4)));
void t_skip(const char *why) __attribute__((noreturn));

/* Fail the test unless `cond` holds. */
#define T_CHECK(cond) do {						\
	if (!(cond))							\
		t_fail(__FILE__, __LINE__, "check failed: %s", #cond);	\
} while (0)

/* Fail unless a == b (as unsigned 64-bit), printing both. */
#define T_EQ(a, b) do {							\
	uint64_t t_a_ = (uint64_t)(a), t_b_ = (uint64_t)(b);		\
	if (t_a_ != t_b_)						\
		t_fail(__FILE__, __LINE__, "%s == %s: %" PRIu64 " != %" PRIu64, \
		       #a, #b, t_a_, t_b_);				\
} while (0)

/* Fail unless an int-returning call gives 0, printing the errno. */
#define T_OK(call) do {							\
	int t_r_ = (call);						\
	if (t_r_)							\
		t_fail(__FILE__, __LINE__, "%s: returned %d (%s)", #call, \
		       t_r_, t_r_ < 0 ? t_strerror(-t_r_) : "?");	\
} while (0)

const char *t_strerror(int err);

/* A unique /dev/shm path for this test, removed at exit (by this process
 * only, not by forked children). */
const char *t_path(const char *tag);

/* Create a region with the given geometry or fail the test. */
struct ivt_region *t_create(const char *path, uint32_t channels,
			    uint32_t subbufs, uint32_t subbuf_size,
			    uint32_t mode);

uint64_t t_now_ns(void);

/* Busy-wait until the TSC has advanced by `ticks`. */
void t_spin_ticks(uint64_t ticks);

#endif /* IVT_TEST_T_H */
