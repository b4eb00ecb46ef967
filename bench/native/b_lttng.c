/* SPDX-License-Identifier: MIT */
/*
 * b_lttng.c - LTTng-UST: the ivbench:event4 tracepoint (4 x ctf_integer
 * uint64_t, bench/lttng/ivbench_tp.h). The session, the discard-mode
 * channel and the enabled event are set up by the calling script
 * (bench/harness/native.py); here we only check that the tracepoint really is on,
 * since a disabled tracepoint costs ~1 ns and would look like a win.
 */
#define _GNU_SOURCE
#include <time.h>

#include "ivbench.h"
#include "ivbench_tp.h"

static void lttng_setup(void)
{
	const struct timespec ms = { 0, 1000000 };
	unsigned waited;

	/* liblttng-ust registers with the session daemon from a constructor
	 * and waits for it (LTTNG_UST_REGISTER_TIMEOUT); the event may be
	 * enabled a little later still. */
	for (waited = 0; waited < ivb_opts.lttng_wait_ms; waited++) {
		if (tracepoint_enabled(ivbench, event4))
			return;
		nanosleep(&ms, NULL);
	}
	ivb_die("lttng_ust", "tracepoint ivbench:event4 is not enabled after %u ms. "
		"Is lttng-sessiond running, with a session that has "
		"`lttng enable-event -u ivbench:event4` and is started? "
		"(bench/run native sets this up; see `lttng list` and `lttng status`)",
		ivb_opts.lttng_wait_ms);
}

#define LTTNG_WRITE(p)	tracepoint(ivbench, event4, (p)->a, (p)->b, (p)->c, (p)->d)
IVB_LOOPS(lttng, LTTNG_WRITE)

const struct ivb_bench ivb_bench_lttng = {
	.name = "lttng_ust",
	.what = "tracepoint(ivbench, event4, a, b, c, d): LTTng-UST, 4 x ctf_integer(uint64_t), per-UID buffers, discard channel drained by lttng-consumerd to /dev/shm",
	.setup = lttng_setup,
	.sample = lttng_sample,
	.group = lttng_group,
	.batch = lttng_batch,
};
