/* SPDX-License-Identifier: MIT */
/*
 * fastpath.c - what the compiler makes of ivt_write() for a constant
 * 4 x u64 payload, for `make fastpath` (tools/fastpath-count.sh) and the
 * fast-path benchmark (tools/fastpath-bench.c). Not part of the library.
 */
#include <ivtrace.h>

int ivt_fastpath_write4(const struct ivt_event *ev, const uint64_t v[4]);

int ivt_fastpath_write4(const struct ivt_event *ev, const uint64_t v[4])
{
	return ivt_write(ev, v, 4 * sizeof(uint64_t));
}
