/* SPDX-License-Identifier: MIT */
/*
 * ivbench_tp.h - the LTTng-UST tracepoint provider the native bench compares
 * ivtrace against: one event, ivbench:event4, with the same payload as the
 * ivtrace side (4 x u64, no strings, no context fields).
 */
#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER ivbench

#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./ivbench_tp.h"

#if !defined(IVBENCH_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define IVBENCH_TP_H

#include <stdint.h>
#include <lttng/tracepoint.h>

TRACEPOINT_EVENT(
	ivbench,
	event4,
	TP_ARGS(uint64_t, a, uint64_t, b, uint64_t, c, uint64_t, d),
	TP_FIELDS(
		ctf_integer(uint64_t, a, a)
		ctf_integer(uint64_t, b, b)
		ctf_integer(uint64_t, c, c)
		ctf_integer(uint64_t, d, d)
	)
)

#endif /* IVBENCH_TP_H */

#include <lttng/tracepoint-event.h>
