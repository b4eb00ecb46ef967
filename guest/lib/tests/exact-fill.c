/* SPDX-License-Identifier: MIT */
/*
 * exact-fill: events whose sizes add up to exactly a packet's size. The
 * committed position of an open packet must never reach the packet's
 * end, because commit_pos == (seq + 1) * subbuf_size tells the host the
 * packet is complete and its end fields (content_size, event_count) are
 * written. Regression: an event ending on the last byte of a packet used
 * to publish the packet as complete before it was closed, and the host
 * read a header with content_size 0 (found by the guest end-to-end test).
 */
#include <string.h>

#include "t.h"
#include "walker.h"

#define SUBBUF	4096u
/* (4096 - 88) / 3 = 1336 bytes per event: 4 header + 4 length + 1328. */
#define DATA	1328u

static void check_published(const struct ivt_region_info *info,
			    const struct ivt_channel *ch, unsigned int written)
{
	uint64_t pos = __atomic_load_n(&ch->commit_pos, __ATOMIC_ACQUIRE);
	const struct ivt_packet_hdr *ph;

	if (pos < SUBBUF)
		return;		/* packet 0 still open: nothing to check */
	/* The host now treats packet 0 as complete: its end fields must be
	 * there (sub-buffer 0 of channel 0 is the first in the pool). */
	ph = (const struct ivt_packet_hdr *)((const uint8_t *)info->base +
		((const struct ivt_region_hdr *)info->base)->layout.pool_off);
	T_CHECK(ph->content_size != 0);
	T_CHECK(ph->content_size <= (uint64_t)SUBBUF * 8);
	T_CHECK(ph->event_count != 0 && ph->event_count < written + 1);
}

int main(void)
{
	static const struct ivt_field f[] = { { "b", IVT_FT_BYTES, 0, 0 } };
	const char *path = t_path("exactfill");
	struct ivt_region *r = t_create(path, 1, 4, SUBBUF, IVT_MODE_DISCARD);
	struct ivt_region_info info;
	const struct ivt_channel *ch;
	static uint8_t buf[4 + DATA];
	struct ivt_event ev;
	unsigned int i;

	ivt_put_u32(buf, DATA);
	memset(buf + 4, 0x5a, DATA);
	T_OK(ivt_event_register(r, "test:fill", f, 1, &ev));
	ivt_region_info(r, &info);
	ch = (const struct ivt_channel *)((const uint8_t *)info.base +
		((const struct ivt_region_hdr *)info.base)->layout.channels_off);

	for (i = 1; i <= 6; i++) {
		T_OK(ivt_write(&ev, buf, sizeof(buf)));
		check_published(&info, ch, i);
	}
	/* The third event did not fit in what was left of packet 0 (the
	 * packet's last byte is never used), so packet 0 holds two. */
	T_EQ(((const struct ivt_packet_hdr *)((const uint8_t *)info.base +
		((const struct ivt_region_hdr *)info.base)->layout.pool_off))->event_count, 2);
	ivt_region_close(r);
	return T_PASS;
}
