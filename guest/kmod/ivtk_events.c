// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_events.c - the kernel stream's wire events, expanded from their one
 * definition, IVT_KERNEL_EVENTS in ivtrace/kernel_events.h: ids in that
 * order, names (LTTng's), groups, fields in payload order. ivtk_region.c
 * publishes them as metadata records; the probes write their payloads.
 */
#include <linux/build_bug.h>
#include <linux/kernel.h>
#include <linux/sched.h>

#include "ivtk.h"

/* One designated entry per event, its fields a compound literal (static
 * storage at file scope).
 */
#define IVTK_EVENT(id, _name, _group, doc)				\
	[IVT_KEV_##id] = {						\
		.name = #_name,						\
		.group = IVTRACE_GROUP_##_group,			\
		.nr_fields = IVT_KEV_##id##_NR_FIELDS,			\
		.fields = (const struct ivtrace_field[]) {
#define IVTK_FIELD(f, t, fl, n)						\
			{ .name = #f, .type = IVT_FT_##t,		\
			  .flags = IVT_KF_##fl, .count = (n) },
#define IVTK_EVENT_END(id)	} },

const struct ivtk_event_desc ivtk_events[IVTK_NR_EVENTS] = {
	IVT_KERNEL_EVENTS(IVTK_EVENT, IVTK_FIELD, IVTK_EVENT_END)
};

static_assert(TASK_COMM_LEN == 16, "comm fields are char[16] on the wire");
static_assert(IVTK_NR_EVENTS == IVTRACE_KAPI_FIRST_ID,
	      "kernel API ids follow the kernel events");
