/* SPDX-License-Identifier: MIT */
/*
 * orphan: a process that dies mid-packet (no flush, no atexit) leaves its
 * channel ACTIVE with commit_pos inside a packet. The next writer that
 * needs a channel reclaims it from the dead owner and seals that packet:
 * content_size from commit_pos, event_count unknown, timestamp_end 0, so
 * every committed event stays readable; its own events start in the next
 * packet.
 */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "walker.h"

struct expect {
	uint64_t next;
};

static int check(const struct w_event *e, void *arg)
{
	struct expect *x = arg;

	/* child: 0..9 in packet 0; parent: 100..104 in packet 1 */
	T_EQ(w_u64(e->payload), x->next);
	T_EQ(e->pkt_seq, x->next < 100 ? 0 : 1);
	x->next = x->next == 9 ? 100 : x->next + 1;
	return 0;
}

int main(void)
{
	static const struct ivt_field f[] = { { "v", IVT_FT_U64, 0, 0 } };
	const char *path = t_path("orphan");
	struct ivt_region *r = t_create(path, 1, 4, 4096, IVT_MODE_DISCARD);
	struct expect x = { 0 };
	struct ivt_packet_hdr *ph;
	struct ivt_channel *ch;
	struct ivt_event ev;
	struct w_region wr;
	struct w_chan ci;
	uint64_t v, pos;
	int status;
	pid_t child;

	T_OK(ivt_event_register(r, "test:v", f, 1, &ev));
	child = fork();
	T_CHECK(child >= 0);
	if (child == 0) {
		for (v = 0; v < 10; v++)
			if (ivt_write(&ev, &v, sizeof(v)))
				_exit(1);
		_exit(0);	/* dies without flushing or releasing */
	}
	T_EQ(waitpid(child, &status, 0), child);	/* reaped: pid is gone */
	T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	T_OK(w_open(&wr, path) ? -EIO : 0);
	ch = (struct ivt_channel *)(wr.base + wr.l.channels_off);
	pos = ch->commit_pos;
	T_EQ(ch->state, IVT_CHAN_ACTIVE);
	T_EQ(ch->owner_pid, child);
	T_EQ(pos, 88 + 10 * 12);		/* mid-packet */

	for (v = 100; v < 105; v++)
		T_OK(ivt_write(&ev, &v, sizeof(v)));
	T_EQ(ch->owner_pid, getpid());
	T_EQ(ch->claims, 2);
	ph = (struct ivt_packet_hdr *)(wr.base + ivt_subbuf_offset(&wr.l, 0, 0));
	T_EQ(ph->event_count, IVT_EVENT_COUNT_UNKNOWN);
	T_EQ(ph->content_size, pos * 8);
	T_EQ(ph->timestamp_end, 0);
	T_EQ(ph->owner_pid, child);
	ivt_flush(r);
	ph = (struct ivt_packet_hdr *)(wr.base + ivt_subbuf_offset(&wr.l, 0, 1));
	T_EQ(ph->owner_pid, getpid());
	T_EQ(ph->event_count, 5);

	if (w_walk_channel(&wr, 0, check, NULL, &x, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(x.next, 105);
	T_EQ(ci.packets, 2);
	w_close(&wr);
	ivt_region_close(r);
	return T_PASS;
}
