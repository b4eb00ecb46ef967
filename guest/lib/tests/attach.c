/* SPDX-License-Identifier: MIT */
/*
 * attach: a region found on disk is untrusted. Attach refuses corrupted
 * headers with the documented errno (-ENODATA not formatted, -EPROTO bad
 * magic, version or layout, -errno from open), accepts a good one, and
 * then works from its private copy of the layout even if the shared one
 * is scribbled over afterwards.
 */
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "walker.h"

static uint8_t *image;
static size_t image_size;

static void write_file(const char *path, const void *buf, size_t n)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);

	T_CHECK(fd >= 0);
	T_EQ(write(fd, buf, n), n);
	close(fd);
}

static void read_image(const char *path)
{
	struct stat st;
	int fd = open(path, O_RDONLY);

	T_CHECK(fd >= 0 && !fstat(fd, &st));
	image_size = (size_t)st.st_size;
	image = malloc(image_size);
	T_CHECK(image != NULL);
	T_EQ(read(fd, image, image_size), image_size);
	close(fd);
}

/* Attach to a copy of the image with `n` bytes at `off` replaced. */
static int attach_patched(const char *path, size_t off, const void *v,
			  size_t n, size_t size)
{
	uint8_t *copy = calloc(1, size);
	struct ivt_region *r;
	int err;

	memcpy(copy, image, size < image_size ? size : image_size);
	if (n)
		memcpy(copy + off, v, n);
	write_file(path, copy, size);
	free(copy);
	err = ivt_region_attach(path, &r);
	if (!err)
		ivt_region_close(r);
	return err;
}

#define HDR(f)		offsetof(struct ivt_region_hdr, f)
#define LAY(f)		(HDR(layout) + offsetof(struct ivt_layout, f))
#define PATCH32(off, val) attach_patched(copy, off, &(uint32_t){ val }, 4, image_size)
#define PATCH64(off, val) attach_patched(copy, off, &(uint64_t){ val }, 8, image_size)

/* The header's identity and size: not formatted, bad magic or version, a size that is not the
 * file's, not a power of two or smaller than a header, an empty or missing file. */
static void header_refused(const char *copy, uint64_t size)
{
	T_EQ(attach_patched(copy, 0, NULL, 0, image_size), 0);
	T_EQ(PATCH64(HDR(magic), 0), -ENODATA);
	T_EQ(PATCH64(HDR(magic), 0x1234), -EPROTO);
	T_EQ(PATCH32(HDR(abi_major), IVT_ABI_MAJOR + 1), -EPROTO);	/* + minor 0 */
	T_EQ(PATCH32(HDR(hdr_size), 2048), -EPROTO);
	T_EQ(PATCH64(HDR(region_size), size * 2), -EPROTO);
	T_EQ(attach_patched(copy, 0, NULL, 0, size / 2), -EPROTO);	/* truncated */
	T_EQ(attach_patched(copy, 0, NULL, 0, size + 4096), -EPROTO);	/* not 2^n */
	T_EQ(attach_patched(copy, 0, NULL, 0, 100), -EPROTO);	/* < a header */
	T_EQ(attach_patched(copy, 0, NULL, 0, 0), -ENODATA);	/* empty */
}

/* The layout: areas outside the region, overlapping or unaligned, counts and sizes out of
 * range or too big for the pool. A channel area moved elsewhere in the region is fine. */
static void layout_refused(const char *copy, uint64_t size, uint64_t meta_off,
			   uint64_t pool_off)
{
	T_EQ(PATCH64(LAY(channels_off), size), -EPROTO);
	T_EQ(PATCH64(LAY(channels_off), pool_off), -EPROTO);	/* overlaps pool */
	T_EQ(PATCH64(LAY(channels_off), size - 4096), 0);	/* moved: fine */
	T_EQ(PATCH64(LAY(channels_off), 0), -EPROTO);		/* the header */
	T_EQ(PATCH64(LAY(meta_off), meta_off + 8), -EPROTO);	/* unaligned */
	T_EQ(PATCH64(LAY(pool_off), meta_off), -EPROTO);	/* overlaps meta */
	T_EQ(PATCH64(LAY(pool_off), UINT64_MAX - 4095), -EPROTO);	/* wraps */
	T_EQ(PATCH32(LAY(meta_size), (uint32_t)size), -EPROTO);
	T_EQ(PATCH32(LAY(meta_size), 12), -EPROTO);
	T_EQ(PATCH32(LAY(nr_channels), 0), -EPROTO);
	T_EQ(PATCH32(LAY(nr_channels), IVT_CHANNELS_MAX + 1), -EPROTO);
	T_EQ(PATCH32(LAY(nr_channels), 8), -EPROTO);		/* pool too big */
	T_EQ(PATCH32(LAY(nr_kernel_channels), 3), -EPROTO);
	T_EQ(PATCH32(LAY(channel_size), 128), -EPROTO);
	T_EQ(PATCH32(LAY(nr_subbufs), 1), -EPROTO);
	T_EQ(PATCH32(LAY(nr_subbufs), 3), -EPROTO);
	T_EQ(PATCH32(LAY(nr_subbufs), 1u << 17), -EPROTO);
	T_EQ(PATCH32(LAY(subbuf_size), 3000), -EPROTO);
	T_EQ(PATCH32(LAY(subbuf_size), 1u << 25), -EPROTO);
	T_EQ(PATCH32(LAY(subbuf_size), 16384), -EPROTO);	/* pool too big */
}

/* A good attach works from its private layout copy: scribbling on the shared one afterwards
 * moves nothing. */
static void private_layout(const char *good, const struct ivt_region_hdr *h,
			   const struct ivt_field *f)
{
	struct ivt_region *a;
	struct ivt_region_info ri;
	struct ivt_event ev;
	struct w_region wr;
	struct w_chan ci;
	uint64_t v;

	T_OK(ivt_region_attach(good, &a));
	ivt_region_info(a, &ri);
	T_EQ(ri.created, 0);
	T_EQ(ri.nr_channels, 2);
	T_EQ(ri.features, IVT_FEAT_LOOPBACK);
	T_CHECK(!memcmp(ri.uuid, h->uuid, 16));
	T_OK(w_open(&wr, good) ? -EIO : 0);	/* takes its own copy too */
	wr.hdr->layout.pool_off = 4096;
	wr.hdr->layout.nr_subbufs = 1u << 16;
	T_OK(ivt_event_register(a, "test:v", f, 1, &ev));
	for (v = 0; v < 10; v++)
		T_OK(ivt_write(&ev, &v, sizeof(v)));
	ivt_flush(a);
	T_EQ(w_walk_channel(&wr, 0, NULL, NULL, NULL, &ci), 0);
	T_EQ(ci.events, 10);
	w_close(&wr);
	ivt_region_close(a);
}

int main(void)
{
	const char *good = t_path("attach");
	const char *copy = t_path("attachcopy");
	struct ivt_region_hdr *h;
	struct ivt_region *r, *a;
	struct ivt_event ev;
	uint64_t size;
	static const struct ivt_field f[] = { { "v", IVT_FT_U64, 0, 0 } };

	struct ivt_region_opts o = { .channels = 2, .subbufs = 2,
				     .subbuf_size = 4096, .meta_size = 4096 };

	T_OK(ivt_region_create(good, &o, &r));
	T_OK(ivt_event_register(r, "test:v", f, 1, &ev));
	read_image(good);
	h = (struct ivt_region_hdr *)image;
	size = h->region_size;
	T_EQ(size, image_size);
	T_EQ(size, IVT_REGION_MIN);		/* the minimum, a power of two */

	header_refused(copy, size);
	layout_refused(copy, size, h->layout.meta_off, h->layout.pool_off);
	unlink(copy);
	T_EQ(ivt_region_attach(copy, &a), -ENOENT);
	T_EQ(ivt_region_attach("/dev/shm", &a), -EISDIR);

	private_layout(good, h, f);
	ivt_region_close(r);
	free(image);
	return T_PASS;
}
