/* SPDX-License-Identifier: MIT */
/*
 * extended: through the public API, an event id above 30 and a real pause
 * of more than 2^27 TSC ticks each produce a 16-byte extended header with
 * the full id and timestamp; the events around them stay compact.
 */
#include <string.h>

#include "t.h"
#include "walker.h"

struct expect {
	unsigned int n;
	uint32_t id[8];
	int extended[8];
	uint64_t before[8], after[8];
};

static int check(const struct w_event *e, void *arg)
{
	struct expect *x = arg;
	unsigned int i = x->n++;

	T_CHECK(i < 8);
	T_EQ(e->id, x->id[i]);
	T_EQ(e->extended, x->extended[i]);
	T_EQ(w_u32(e->payload), i);
	T_CHECK(e->ts >= x->before[i] && e->ts <= x->after[i]);
	if (e->extended)
		T_EQ(e->word, IVT_EV_ID_EXTENDED);
	return 0;
}

static void write_one(struct expect *x, const struct ivt_event *ev, int ext)
{
	uint32_t v = x->n;

	x->id[x->n] = ev->id;
	x->extended[x->n] = ext;
	x->before[x->n] = ivt_clock();
	T_OK(ivt_write(ev, &v, sizeof(v)));
	x->after[x->n] = ivt_clock();
	x->n++;
}

int main(void)
{
	static const struct ivt_field f[] = { { "v", IVT_FT_U32, 0, 0 } };
	const char *path = t_path("extended");
	struct ivt_region *r = t_create(path, 1, 2, 4096, IVT_MODE_DISCARD);
	struct ivt_event ev[32];
	struct expect x;
	struct w_region wr;
	struct w_chan ci;
	char name[32];
	unsigned int i;

	memset(&x, 0, sizeof(x));
	for (i = 0; i < 32; i++) {
		snprintf(name, sizeof(name), "ext:e%u", i);
		T_OK(ivt_event_register(r, name, f, 1, &ev[i]));
		T_EQ(ev[i].id, i);
	}
	write_one(&x, &ev[30], 0);	/* opens the packet */
	write_one(&x, &ev[30], 0);	/* id 30: compact */
	write_one(&x, &ev[31], 1);	/* id 31: extended */
	write_one(&x, &ev[0], 0);
	t_spin_ticks((1ull << IVT_EV_TS_BITS) + 1000);	/* ~50 ms */
	write_one(&x, &ev[0], 1);	/* gap >= 2^27 ticks: extended */
	write_one(&x, &ev[0], 0);	/* and back to compact */
	ivt_flush(r);

	T_OK(w_open(&wr, path) ? -EIO : 0);
	x.n = 0;
	if (w_walk_channel(&wr, 0, check, NULL, &x, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(x.n, 6);
	T_EQ(ci.packets, 1);
	w_close(&wr);
	ivt_region_close(r);
	return T_PASS;
}
