/* SPDX-License-Identifier: MIT */
/*
 * ivtrace-forward - the writer half of nested tracing: forwards what an
 * inner `ivtrace record --forward` emits into this machine's own region,
 * so that the outer host recording this machine gets the inner guest's
 * trace through it (docs/migration.md, "Nested guests").
 *
 * Input (stdin, or --in FILE/FIFO): frames of
 *
 *	u32 kind, u32 len (little-endian), then len bytes   (len <= FRAME_MAX)
 *
 * Each frame becomes one event `ivtrace:forward` { kind u32, data bytes }.
 * The bytes are opaque here: `ivtrace record` already cut its messages
 * into chunks that fit any packet, and the outer ivtrace reassembles and
 * checks them.
 *
 * Clock: at start, after every frame of kind FWD_CLOCK and at the end this
 * writes two events `ivtrace:forward_sync` { mono_ns u64, phase u32 }:
 * phase 0 carries CLOCK_MONOTONIC read just before it was written, phase 1
 * the value read just after phase 0's write returned. Phase 0's timestamp
 * (this machine's writer clock) was therefore taken while CLOCK_MONOTONIC
 * was between the two values: the outer host maps it to its own time and
 * learns this machine's CLOCK_MONOTONIC on its timeline, within half the
 * gap.
 *
 * The inner recorder's time is CLOCK_MONOTONIC based (it sends its mapping
 * so), hence the composition outer(t2) = inner(t2) + (outer - mono).
 *
 * Why a separate process in C: the writer protocol has one implementation,
 * libivtrace, and this machine's region may be the guest's /dev/ivtrace.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ivtrace.h>

#define PROG		"ivtrace-forward"
/* The inner recorder's chunks are at most 3 KiB; a frame above this is
 * not from it. */
#define FRAME_MAX	(64u * 1024)
#define FWD_CLOCK	4u

struct fwd {
	struct ivt_region *r;
	struct ivt_event forward;
	struct ivt_event sync;
	uint64_t frames, bytes, dropped, syncs;
};

static void usage(FILE *f)
{
	fprintf(f,
"usage: " PROG " --shm PATH [--create] [--subbufs N] [--subbuf-size B] [--in FILE]\n"
"  --shm PATH         the region to write into: a guest's /dev/ivtrace, or a\n"
"                     /dev/shm file (loopback)\n"
"  --create           format PATH as a loopback region first (the outer\n"
"                     recorder stops when this program closes it)\n"
"  --subbufs N, --subbuf-size B   geometry with --create (defaults 64, 64K)\n"
"  --in FILE          read frames from FILE (a FIFO) instead of stdin\n"
"At the end prints {\"frames\",\"bytes\",\"dropped\",\"syncs\"} as JSON on stdout.\n"
"Exit: 0 done, 2 usage or setup error.\n");
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, const char *path, int err, const char *hint)
{
	fprintf(stderr, PROG ": %s %s failed: %s\n", what, path, strerror(-err));
	if (hint)
		fprintf(stderr, "hint: %s\n", hint);
	exit(2);
}

static void register_events(struct fwd *f)
{
	static const struct ivt_field fwd_fields[] = {
		{ "kind", IVT_FT_U32, 0, 0 }, { "data", IVT_FT_BYTES, 0, 0 },
	};
	static const struct ivt_field sync_fields[] = {
		{ "mono_ns", IVT_FT_U64, 0, 0 }, { "phase", IVT_FT_U32, 0, 0 },
	};
	int err = ivt_event_register(f->r, "ivtrace:forward", fwd_fields, 2, &f->forward);

	if (!err)
		err = ivt_event_register(f->r, "ivtrace:forward_sync", sync_fields, 2, &f->sync);
	if (err)
		die("registering the forward events in", "the region", err,
		    "is the region's metadata area full?");
}

static void write_sync_phase(struct fwd *f, uint64_t mono, uint32_t phase)
{
	unsigned char p[12];

	memcpy(p, &mono, 8);
	memcpy(p + 8, &phase, 4);
	if (ivt_write(&f->sync, p, sizeof(p)))
		f->dropped++;
}

/* Phase 0 is stamped while CLOCK_MONOTONIC is between its payload and
 * phase 1's. Flushed at once: the outer host needs it, not a full packet. */
static void sync_point(struct fwd *f)
{
	write_sync_phase(f, mono_ns(), 0);
	write_sync_phase(f, mono_ns(), 1);
	ivt_flush(f->r);
	f->syncs++;
}

static int read_full(FILE *in, void *buf, size_t n)
{
	return fread(buf, 1, n, in) == n ? 0 : -1;
}

/* One frame in, one event out; 1 at the end of the input. */
static int forward_frame(struct fwd *f, FILE *in, unsigned char *buf)
{
	uint32_t hdr[2], len;

	if (read_full(in, hdr, sizeof(hdr)))
		return 1;
	len = hdr[1];
	if (len > FRAME_MAX) {
		fprintf(stderr, PROG ": frame of %" PRIu32 " bytes (max %u): not from "
			"ivtrace record --forward; stopping\n", len, FRAME_MAX);
		return 1;
	}
	memcpy(buf, &hdr[0], 4);
	memcpy(buf + 4, &len, 4);
	if (read_full(in, buf + 8, len))
		return 1;
	f->frames++;
	f->bytes += len;
	if (ivt_write(&f->forward, buf, 8 + (size_t)len))
		f->dropped++;
	if (hdr[0] == FWD_CLOCK)
		sync_point(f);
	return 0;
}

static struct ivt_region *open_region(const char *shm, int create,
				      const struct ivt_region_opts *opts)
{
	struct ivt_region *r;
	int err = create ? ivt_region_create(shm, opts, &r) : ivt_region_attach(shm, &r);

	if (err)
		die(create ? "creating region" : "attaching to region", shm, err,
		    create ? "check the geometry (powers of two) and the directory"
			   : "is the module loaded (/dev/ivtrace), or pass --create?");
	return r;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "shm", 1, 0, 's' }, { "create", 0, 0, 'c' }, { "subbufs", 1, 0, 'n' },
		{ "subbuf-size", 1, 0, 'b' }, { "in", 1, 0, 'i' }, { "help", 0, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	struct ivt_region_opts opts = { .channels = 4, .subbufs = 64, .subbuf_size = 65536 };
	const char *shm = NULL, *in_path = NULL;
	struct fwd f = { 0 };
	int create = 0, c;
	unsigned char *buf;
	FILE *in = stdin;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 's': shm = optarg; break;
		case 'c': create = 1; break;
		case 'n': opts.subbufs = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'b': opts.subbuf_size = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'i': in_path = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!shm) {
		usage(stderr);
		return 2;
	}
	buf = malloc(8 + FRAME_MAX);
	if (!buf)
		die("allocating", "the frame buffer", -ENOMEM, NULL);
	f.r = open_region(shm, create, &opts);
	register_events(&f);
	if (in_path && !(in = fopen(in_path, "rb")))
		die("opening", in_path, -errno, "create the FIFO first (mkfifo)");
	sync_point(&f);
	while (!forward_frame(&f, in, buf))
		;
	sync_point(&f);
	ivt_region_close(f.r);
	printf("{\"frames\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"dropped\": %" PRIu64
	       ", \"syncs\": %" PRIu64 "}\n", f.frames, f.bytes, f.dropped, f.syncs);
	free(buf);
	return 0;
}
