/* SPDX-License-Identifier: MIT */
/*
 * nested: an event written while the thread's writer is already inside
 * the write path (a signal handler between reserve and commit) is dropped
 * and counted in lost_nested; the interrupted event is intact and the
 * writer works again afterwards.
 */
#include <signal.h>
#include <string.h>

#include "t.h"
#include "walker.h"

static struct ivt_event ev;
static volatile int handler_ret = 1;

static void on_signal(int sig)
{
	uint64_t v = 999;

	(void)sig;
	handler_ret = ivt_write(&ev, &v, sizeof(v));
}

/* What the channel must hold: no trace of the dropped events. */
static const uint64_t want[] = { 0, 1, 2, 999 };

static int check(const struct w_event *e, void *arg)
{
	uint64_t *n = arg;

	T_CHECK(*n < 4);
	T_EQ(w_u64(e->payload), want[*n]);
	(*n)++;
	return 0;
}

int main(void)
{
	static const struct ivt_field f[] = { { "v", IVT_FT_U64, 0, 0 } };
	const char *path = t_path("nested");
	struct ivt_region *r = t_create(path, 1, 2, 4096, IVT_MODE_DISCARD);
	struct sigaction sa;
	struct ivt_stats st;
	struct w_region wr;
	struct w_chan ci;
	uint64_t v = 0, n = 0;
	uint8_t *p;

	T_OK(ivt_event_register(r, "test:v", f, 1, &ev));
	T_OK(ivt_write(&ev, &v, sizeof(v)));		/* claims the channel */

	/* Simulated: the writer is marked busy, as in the middle of a write. */
	T_CHECK(ivt_writer_enter(&ivt__tls.w));
	v = 999;
	T_EQ(ivt_write(&ev, &v, sizeof(v)), -ENOBUFS);
	T_CHECK(ivt_reserve(&ev, 8) == NULL);
	ivt_writer_exit(&ivt__tls.w);
	ivt_stats(r, &st);
	T_EQ(st.lost_nested, 2);

	/* Real: a signal handler writes between reserve and commit. */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	T_OK(sigaction(SIGUSR1, &sa, NULL));
	p = ivt_reserve(&ev, 8);
	T_CHECK(p != NULL);
	raise(SIGUSR1);
	T_EQ(handler_ret, -ENOBUFS);
	ivt_put_u64(p, 1);
	ivt_commit(&ev);
	v = 2;
	T_OK(ivt_write(&ev, &v, sizeof(v)));
	ivt_stats(r, &st);
	T_EQ(st.lost_nested, 3);

	/* Outside a write, the handler's event goes through. */
	raise(SIGUSR1);
	T_EQ(handler_ret, 0);
	ivt_flush(r);

	T_OK(w_open(&wr, path) ? -EIO : 0);
	if (w_walk_channel(&wr, 0, check, NULL, &n, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(n, 4);
	w_close(&wr);
	ivt_region_close(r);
	return T_PASS;
}
