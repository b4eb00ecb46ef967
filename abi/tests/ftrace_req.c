/* SPDX-License-Identifier: MIT */
/*
 * ftrace_req.c - ivt_ftrace_parse(), the one check of the host's ftrace
 * requests (the guest module and the relay both call it): what it must
 * accept and what it must refuse. Exit 0 when every case holds.
 */
#include <stdio.h>
#include <string.h>
#include <ivtrace/ftrace.h>

static int failures;

static void want(const char *req, int ok)
{
	struct ivt_ftrace_req r;
	int got = ivt_ftrace_parse(req, (uint32_t)strlen(req), &r) == 0;

	if (got != ok) {
		printf("ftrace_req: \"%s\": %s, expected %s\n", req,
		       got ? "accepted" : "refused", ok ? "accepted" : "refused");
		failures++;
	}
}

int main(void)
{
	struct ivt_ftrace_req r;

	want("write events/block/block_rq_issue/filter nr_sector > 8", 1);
	want("write events/block/block_rq_issue/enable 1", 1);
	want("write events/block/enable 1", 1);
	want("write events/enable 0", 1);
	want("write current_tracer function_graph", 1);
	want("write set_ftrace_filter vfs_* do_sys_*", 1);
	want("write set_ftrace_filter", 1);	/* empty: clears */
	want("append kprobe_events p:kprobes/x do_sys_openat2 name=+0(%si):ustring", 1);
	want("write set_event_pid 1 2 3", 1);
	want("write options/overwrite 0", 1);
	want("read available_events 0", 1);
	want("read per_cpu/cpu1/stats 0", 1);
	want("read events/sched/sched_switch/format 2048", 1);
	want("read events/header_page 0", 1);

	want("write trace_clock local", 0);	/* the relay keeps x86-tsc */
	want("write available_events x", 0);	/* read-only */
	want("write per_cpu/cpu0/stats 1", 0);
	want("write events/../../etc/passwd x", 0);
	want("write events/block/.hidden/enable 1", 0);
	want("write /etc/passwd x", 0);
	want("write instances/x/tracing_on 1", 0);
	want("write trace x", 0);
	want("read available_events", 0);	/* no offset */
	want("read available_events -1", 0);
	want("delete kprobe_events", 0);
	want("write events/block/block_rq_issue/enable 1\n", 0);	/* no newline */
	want("write events/a/b/c/d 1", 0);
	want("", 0);

	if (ivt_ftrace_parse("read per_cpu/cpu0/stats 4096", 28, &r) ||
	    r.op != IVT_FTRACE_OP_READ || r.offset != 4096 ||
	    strcmp(r.path, "per_cpu/cpu0/stats")) {
		printf("ftrace_req: read's offset or path parsed wrong\n");
		failures++;
	}
	if (failures)
		return 1;
	printf("ftrace_req: ok\n");
	return 0;
}
