/* SPDX-License-Identifier: MIT */
/*
 * too-big: an event that cannot fit in any packet (with the packet
 * header and an extended event header) is dropped and counted in
 * lost_too_big; the largest one that fits is written intact.
 */
#include <string.h>

#include "t.h"
#include "walker.h"

/* Largest payload: 4096 - packet header (88) - extended header (16) - the
 * packet's last byte, which an event never uses (see ivt_writer_open()). */
#define MAX_PAYLOAD (4096u - 88u - 16u - 1u)

static int check(const struct w_event *e, void *arg)
{
	unsigned int *n = arg;
	uint32_t i;

	(*n)++;
	T_EQ(e->len, MAX_PAYLOAD);
	T_EQ(w_u32(e->payload), MAX_PAYLOAD - 4);
	for (i = 4; i < e->len; i++)
		T_EQ(e->payload[i], (uint8_t)i);
	return 0;
}

int main(void)
{
	static const struct ivt_field f[] = { { "b", IVT_FT_BYTES, 0, 0 } };
	const char *path = t_path("toobig");
	struct ivt_region *r = t_create(path, 1, 2, 4096, IVT_MODE_DISCARD);
	static uint8_t buf[1 << 16];
	struct ivt_stats st;
	struct ivt_event ev;
	struct w_region wr;
	struct w_chan ci;
	unsigned int n = 0;
	uint32_t i;

	for (i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)i;
	ivt_put_u32(buf, MAX_PAYLOAD - 4);
	T_OK(ivt_event_register(r, "test:blob", f, 1, &ev));

	T_EQ(ivt_write(&ev, buf, MAX_PAYLOAD + 1), -ENOBUFS);
	T_CHECK(ivt_reserve(&ev, 1u << 20) == NULL);
	T_CHECK(ivt_reserve(&ev, UINT32_MAX) == NULL);
	T_OK(ivt_write(&ev, buf, MAX_PAYLOAD));
	T_OK(ivt_write(&ev, buf, MAX_PAYLOAD));	/* one packet each */
	ivt_stats(r, &st);
	T_EQ(st.lost_too_big, 3);
	T_EQ(st.lost_full, 0);
	ivt_flush(r);

	T_OK(w_open(&wr, path) ? -EIO : 0);
	if (w_walk_channel(&wr, 0, check, NULL, &n, &ci))
		t_fail(__FILE__, __LINE__, "walk: %s", w_error);
	T_EQ(n, 2);
	T_EQ(ci.packets, 2);
	w_close(&wr);
	ivt_region_close(r);
	return T_PASS;
}
