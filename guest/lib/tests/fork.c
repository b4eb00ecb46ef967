/* SPDX-License-Identifier: MIT */
/*
 * fork: a forked child must not write into the channel it inherited from
 * its parent (two writers on one channel corrupt it). The child claims a
 * channel of its own, under its own pid; the parent keeps writing its
 * channel without a gap; the child's close does not mark the parent's
 * region closed.
 */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "walker.h"

struct payload {
	uint16_t who;		/* 0 parent, 1 child */
	uint64_t seq;
} __attribute__((packed));

struct expect {
	uint16_t who;
	uint64_t next;
};

static int check(const struct w_event *e, void *arg)
{
	struct expect *x = arg;

	T_EQ(w_u16(e->payload), x->who);
	T_EQ(w_u64(e->payload + 2), x->next);
	x->next++;
	return 0;
}

static void write_range(const struct ivt_event *ev, uint16_t who,
			uint64_t from, uint64_t to)
{
	struct payload p = { who, 0 };

	for (p.seq = from; p.seq < to; p.seq++)
		T_OK(ivt_write(ev, &p, sizeof(p)));
}

int main(void)
{
	static const struct ivt_field f[] = {
		{ "who", IVT_FT_U16, 0, 0 }, { "seq", IVT_FT_U64, 0, 0 },
	};
	const char *path = t_path("fork");
	struct ivt_region *r = t_create(path, 3, 4, 4096, IVT_MODE_DISCARD);
	struct expect x;
	struct ivt_channel *ch;
	struct ivt_event ev;
	struct w_region wr;
	struct w_chan ci;
	int status;
	pid_t child;

	T_OK(ivt_event_register(r, "test:fork", f, 2, &ev));
	write_range(&ev, 0, 0, 100);		/* parent: channel 0 */

	child = fork();
	T_CHECK(child >= 0);
	if (child == 0) {
		write_range(&ev, 1, 0, 100);
		ivt_region_close(r);		/* not ours: stays LIVE */
		exit(0);			/* atexit: flush + retire */
	}
	T_EQ(waitpid(child, &status, 0), child);
	T_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	write_range(&ev, 0, 100, 200);		/* parent continues */
	ivt_flush(r);

	T_OK(w_open(&wr, path) ? -EIO : 0);
	ch = (struct ivt_channel *)(wr.base + wr.l.channels_off);
	T_EQ(wr.hdr->state, IVT_STATE_LIVE);
	T_EQ(ch[0].state, IVT_CHAN_ACTIVE);
	T_EQ(ch[0].owner_pid, getpid());
	T_EQ(ch[1].state, IVT_CHAN_RETIRED);
	T_EQ(ch[1].owner_pid, child);
	T_EQ(ch[2].claims, 0);

	x = (struct expect){ 0, 0 };
	if (w_walk_channel(&wr, 0, check, NULL, &x, &ci))
		t_fail(__FILE__, __LINE__, "parent's channel: %s", w_error);
	T_EQ(x.next, 200);
	x = (struct expect){ 1, 0 };
	if (w_walk_channel(&wr, 1, check, NULL, &x, &ci))
		t_fail(__FILE__, __LINE__, "child's channel: %s", w_error);
	T_EQ(x.next, 100);
	T_EQ(((struct ivt_packet_hdr *)(wr.base + ivt_subbuf_offset(&wr.l, 1, 0)))->owner_pid,
	     child);
	w_close(&wr);
	ivt_region_close(r);
	return T_PASS;
}
