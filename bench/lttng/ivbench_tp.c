/* SPDX-License-Identifier: MIT */
/*
 * ivbench_tp.c - compiles the probes of ivbench_tp.h into the bench binary
 * (statically linked provider, the LTTng-UST "tracepoint provider in the
 * application" setup).
 */
#define TRACEPOINT_CREATE_PROBES
#define TRACEPOINT_DEFINE
#include "ivbench_tp.h"
