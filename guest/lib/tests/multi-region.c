/* SPDX-License-Identifier: MIT */
/*
 * multi-region: one thread writes to several regions at once. The first
 * takes the inline fast path, the next IVT_OTHER_MAX (3) the per-thread
 * table; a fifth region finds no free slot and counts its events in
 * lost_no_channel. Every accepted event lands in its own region.
 */
#include <string.h>
#include <time.h>

#include "t.h"
#include "walker.h"

#define REGIONS 5
#define N 50u

static int check(const struct w_event *e, void *arg)
{
	uint64_t *x = arg;	/* [0] region tag, [1] next seq */

	T_EQ(w_u64(e->payload), x[0] * 1000 + x[1]);
	x[1]++;
	return 0;
}

int main(void)
{
	static const struct ivt_field f[] = { { "v", IVT_FT_U64, 0, 0 } };
	struct timespec nap = { 0, 3000000 };
	struct ivt_region *r[REGIONS];
	struct ivt_event ev[REGIONS];
	const char *path[REGIONS];
	struct ivt_stats st;
	uint64_t i, k, v;

	for (k = 0; k < REGIONS; k++) {
		path[k] = t_path("multi");
		r[k] = t_create(path[k], 2, 2, 4096, IVT_MODE_DISCARD);
		T_OK(ivt_event_register(r[k], "test:v", f, 1, &ev[k]));
	}
	for (i = 0; i < N; i++) {
		for (k = 0; k < REGIONS; k++) {
			v = k * 1000 + i;
			T_EQ(ivt_write(&ev[k], &v, sizeof(v)),
			     k < 4 ? 0 : -ENOBUFS);
		}
	}
	T_CHECK(ivt__tls.region == r[0]);	/* the first on the fast path */
	for (k = 0; k < REGIONS; k++) {
		ivt_stats(r[k], &st);
		T_EQ(st.lost_no_channel, k < 4 ? 0 : N);
		ivt_flush(r[k]);
	}
	for (k = 0; k < 4; k++) {
		struct w_region wr;
		struct w_chan ci;
		uint64_t x[2] = { k, 0 };

		T_OK(w_open(&wr, path[k]) ? -EIO : 0);
		if (w_walk_channel(&wr, 0, check, NULL, x, &ci))
			t_fail(__FILE__, __LINE__, "region %lu: %s",
			       (unsigned long)k, w_error);
		T_EQ(x[1], N);
		w_close(&wr);
	}

	/* Closing one region frees its slot for the fifth (after the retry
	 * delay); the others keep working. */
	ivt_region_close(r[2]);
	nanosleep(&nap, NULL);
	v = 4000 + N;
	T_OK(ivt_write(&ev[4], &v, sizeof(v)));
	v = 3000 + N;
	T_OK(ivt_write(&ev[3], &v, sizeof(v)));
	v = N;
	T_OK(ivt_write(&ev[0], &v, sizeof(v)));
	for (k = 0; k < REGIONS; k++)
		if (k != 2)
			ivt_region_close(r[k]);
	return T_PASS;
}
