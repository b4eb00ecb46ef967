// SPDX-License-Identifier: MIT
/*
 * ev-gzip - compression: gzip (zlib deflate, level 6, the gzip default) of a
 * text-like file in tmpfs into a .gz file in tmpfs, read and written 64 KiB
 * at a time. The input (4 MiB of words from a fixed pseudo-random sequence,
 * compressible about 3:1) is made once, not timed.
 *
 *   ev-gzip [-t SECONDS] [-d DIR]       (default 10 s, /tmp)
 *   EVWL workload=gzip score=<MB/s> unit=MB/s ops=<64 KiB chunks> elapsed=<s>
 * MB/s = input bytes compressed per second (10^6 B); the clock is read after
 * every chunk, so partial files count.
 */
#include "evwl.h"
#include <fcntl.h>
#include <zlib.h>

#define IN_SIZE (4u << 20)
#define CHUNK 65536

static unsigned char inbuf[CHUNK];
static unsigned char outbuf[CHUNK];

static void xwrite(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = write(fd, c, n);

		if (w <= 0)
			EVWL_DIE("ev-gzip: write: %s", strerror(errno));
		c += w;
		n -= (size_t)w;
	}
}

static void make_input(const char *path)
{
	static const char *words[] = { "the ", "trace ", "guest ", "host ", "ring ", "buffer ",
		"event ", "of ", "and ", "shared ", "memory ", "packet ", "sched_switch ",
		"timer ", "kmalloc ", "irq ", "\n", "0x7f3a ", "1234 ", "prev_pid=17 " };
	uint64_t r = 0x9e3779b97f4a7c15ull;
	size_t fill = 0, total = 0;
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);

	if (fd < 0)
		EVWL_DIE("ev-gzip: %s: %s", path, strerror(errno));
	while (total < IN_SIZE) {
		const char *w;
		size_t n;

		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		w = words[r % 20];
		n = strlen(w);
		if (fill + n > CHUNK) {
			xwrite(fd, inbuf, fill);
			total += fill;
			fill = 0;
		}
		memcpy(inbuf + fill, w, n);
		fill += n;
	}
	close(fd);
}

int main(int argc, char **argv)
{
	double secs = evwl_seconds(argc, argv, 10.0), t0, t;
	const char *dir = "/tmp";
	char in[256], out[256];
	uint64_t bytes = 0, chunks = 0;
	int done = 0;

	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "-d"))
			dir = argv[i + 1];
	snprintf(in, sizeof(in), "%s/ev-gzip.%d.in", dir, (int)getpid());
	snprintf(out, sizeof(out), "%s/ev-gzip.%d.gz", dir, (int)getpid());
	make_input(in);

	t0 = evwl_now();
	while (!done) {
		int ifd = open(in, O_RDONLY), ofd = open(out, O_CREAT | O_TRUNC | O_WRONLY, 0644);
		z_stream z;
		int flush = Z_NO_FLUSH, rc;

		if (ifd < 0 || ofd < 0)
			EVWL_DIE("ev-gzip: open: %s", strerror(errno));
		memset(&z, 0, sizeof(z));
		/* windowBits 15 + 16: a gzip header and trailer, as gzip(1) writes */
		if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
			EVWL_DIE("ev-gzip: deflateInit2 failed");
		do {
			ssize_t n = read(ifd, inbuf, CHUNK);

			if (n < 0)
				EVWL_DIE("ev-gzip: read: %s", strerror(errno));
			flush = n == 0 ? Z_FINISH : Z_NO_FLUSH;
			z.next_in = inbuf;
			z.avail_in = (uInt)n;
			do {
				z.next_out = outbuf;
				z.avail_out = CHUNK;
				rc = deflate(&z, flush);
				if (rc == Z_STREAM_ERROR)
					EVWL_DIE("ev-gzip: deflate failed");
				xwrite(ofd, outbuf, CHUNK - z.avail_out);
			} while (z.avail_out == 0);
			bytes += (uint64_t)n;
			chunks++;
			t = evwl_now() - t0;
			if (t >= secs) {
				done = 1;
				break;
			}
		} while (flush != Z_FINISH);
		deflateEnd(&z);
		close(ifd);
		close(ofd);
	}
	unlink(in);
	unlink(out);
	evwl_result("gzip", (double)bytes / t / 1e6, "MB/s", chunks, t);
	return 0;
}
