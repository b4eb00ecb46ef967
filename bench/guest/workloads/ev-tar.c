// SPDX-License-Identifier: MIT
/*
 * ev-tar - archive a directory tree and extract it again, in tmpfs, with a
 * small ustar writer and reader of our own (512-byte headers, data padded to
 * 512). One round:
 *   create:  walk SRC (opendir/readdir/lstat), write header + data of every
 *            entry to ARCHIVE (read(2) 64 KiB at a time, write(2) to the
 *            archive);
 *   extract: read ARCHIVE header by header, mkdir/creat + write(2) every
 *            entry under DST, check the header checksums;
 *   clean:   remove DST again.
 * The tree (made once, not timed): 8 directories x 24 files, sizes 64 B to
 * 32 KiB from a fixed pseudo-random sequence (~3 MB).
 *
 *   ev-tar [-t SECONDS] [-d DIR]        (default 10 s, /tmp)
 *   EVWL workload=tar score=<MB/s> unit=MB/s ops=<rounds> elapsed=<s>
 * MB/s = tree bytes archived and extracted per second (10^6 B), whole rounds.
 */
#include "evwl.h"
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#define NDIRS 8
#define NFILES 24

static char iobuf[65536];
static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void xwrite(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = write(fd, c, n);

		if (w <= 0)
			EVWL_DIE("ev-tar: write: %s", strerror(errno));
		c += w;
		n -= (size_t)w;
	}
}

static size_t xread(int fd, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (char *)p + got, n - got);

		if (r < 0)
			EVWL_DIE("ev-tar: read: %s", strerror(errno));
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return got;
}

static uint64_t make_tree(const char *src)
{
	char p[512];
	uint64_t total = 0;

	if (mkdir(src, 0755) && errno != EEXIST)
		EVWL_DIE("ev-tar: mkdir %s: %s", src, strerror(errno));
	for (int d = 0; d < NDIRS; d++) {
		snprintf(p, sizeof(p), "%s/dir%02d", src, d);
		if (mkdir(p, 0755) && errno != EEXIST)
			EVWL_DIE("ev-tar: mkdir %s: %s", p, strerror(errno));
		for (int f = 0; f < NFILES; f++) {
			size_t sz = 64 + next() % 32705;
			int fd;

			snprintf(p, sizeof(p), "%s/dir%02d/file%03d.dat", src, d, f);
			fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
			if (fd < 0)
				EVWL_DIE("ev-tar: %s: %s", p, strerror(errno));
			for (size_t i = 0; i < sz; i++)   /* text-like, compressible */
				iobuf[i] = (char)("etaoin shrdlu\n"[next() % 14]);
			xwrite(fd, iobuf, sz);
			close(fd);
			total += sz;
		}
	}
	return total;
}

static void octal(char *dst, size_t n, uint64_t v)
{
	snprintf(dst, n, "%0*" PRIo64, (int)n - 1, v);
}

static unsigned hdr_sum(const unsigned char *h)
{
	unsigned s = 0;

	for (int i = 0; i < 512; i++)
		s += (i >= 148 && i < 156) ? ' ' : h[i];
	return s;
}

static void put_header(int out, const char *name, const struct stat *st)
{
	unsigned char h[512];

	memset(h, 0, sizeof(h));
	if (strlen(name) >= 100)
		EVWL_DIE("ev-tar: name too long: %s", name);
	memcpy(h, name, strlen(name));
	octal((char *)h + 100, 8, st->st_mode & 07777);
	octal((char *)h + 108, 8, 0);
	octal((char *)h + 116, 8, 0);
	octal((char *)h + 124, 12, S_ISREG(st->st_mode) ? (uint64_t)st->st_size : 0);
	octal((char *)h + 136, 12, (uint64_t)st->st_mtime);
	h[156] = S_ISDIR(st->st_mode) ? '5' : '0';
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	snprintf((char *)h + 148, 8, "%06o", hdr_sum(h));
	h[155] = ' ';
	xwrite(out, h, sizeof(h));
}

/* Archive the tree under base/rel into out (depth-first, readdir order). */
static void join(char *dst, size_t n, const char *a, const char *sep, const char *b)
{
	if ((size_t)snprintf(dst, n, "%s%s%s", a, sep, b) >= n)
		EVWL_DIE("ev-tar: path too long: %s%s%s", a, sep, b);
}

static void add_tree(int out, const char *base, const char *rel)
{
	char full[512], child[512];
	struct dirent *e;
	DIR *d;

	join(full, sizeof(full), base, "/", rel);
	d = opendir(full);
	if (!d)
		EVWL_DIE("ev-tar: opendir %s: %s", full, strerror(errno));
	while ((e = readdir(d))) {
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		join(child, sizeof(child), rel, *rel ? "/" : "", e->d_name);
		join(full, sizeof(full), base, "/", child);
		if (lstat(full, &st))
			EVWL_DIE("ev-tar: lstat %s: %s", full, strerror(errno));
		if (S_ISDIR(st.st_mode)) {
			char dn[512];

			join(dn, sizeof(dn), child, "/", "");
			put_header(out, dn, &st);
			add_tree(out, base, child);
		} else if (S_ISREG(st.st_mode)) {
			int fd = open(full, O_RDONLY);
			uint64_t left = (uint64_t)st.st_size;

			if (fd < 0)
				EVWL_DIE("ev-tar: %s: %s", full, strerror(errno));
			put_header(out, child, &st);
			while (left) {
				size_t n = left < sizeof(iobuf) ? (size_t)left : sizeof(iobuf);

				if (xread(fd, iobuf, n) != n)
					EVWL_DIE("ev-tar: %s shrank", full);
				if (n % 512) {   /* pad the last block */
					size_t pad = 512 - n % 512;

					memset(iobuf + n, 0, pad);
					xwrite(out, iobuf, n + pad);
				} else {
					xwrite(out, iobuf, n);
				}
				left -= n;
			}
			close(fd);
		}
	}
	closedir(d);
}

static uint64_t extract(const char *archive, const char *dst)
{
	unsigned char h[512];
	char path[512];
	uint64_t bytes = 0;
	int in = open(archive, O_RDONLY);

	if (in < 0)
		EVWL_DIE("ev-tar: %s: %s", archive, strerror(errno));
	if (mkdir(dst, 0755) && errno != EEXIST)
		EVWL_DIE("ev-tar: mkdir %s: %s", dst, strerror(errno));
	for (;;) {
		uint64_t size, left;
		unsigned sum;
		int out;

		if (xread(in, h, 512) != 512)
			EVWL_DIE("ev-tar: truncated archive");
		if (!h[0])
			break;
		sum = (unsigned)strtoul((char *)h + 148, NULL, 8);
		if (sum != hdr_sum(h))
			EVWL_DIE("ev-tar: bad header checksum");
		size = strtoull((char *)h + 124, NULL, 8);
		snprintf(path, sizeof(path), "%s/%.100s", dst, (char *)h);
		if (h[156] == '5') {
			if (mkdir(path, 0755) && errno != EEXIST)
				EVWL_DIE("ev-tar: mkdir %s: %s", path, strerror(errno));
			continue;
		}
		out = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
		if (out < 0)
			EVWL_DIE("ev-tar: %s: %s", path, strerror(errno));
		left = size;
		while (left) {
			size_t want = left < sizeof(iobuf) ? (size_t)left : sizeof(iobuf);
			size_t blocks = (want + 511) / 512 * 512;

			if (xread(in, iobuf, blocks) != blocks)
				EVWL_DIE("ev-tar: truncated data");
			xwrite(out, iobuf, want);
			left -= want;
		}
		close(out);
		bytes += size;
	}
	close(in);
	return bytes;
}

static void remove_tree(const char *dst)
{
	char p[512];

	for (int d = 0; d < NDIRS; d++) {
		for (int f = 0; f < NFILES; f++) {
			snprintf(p, sizeof(p), "%s/dir%02d/file%03d.dat", dst, d, f);
			if (unlink(p))
				EVWL_DIE("ev-tar: unlink %s: %s", p, strerror(errno));
		}
		snprintf(p, sizeof(p), "%s/dir%02d", dst, d);
		if (rmdir(p))
			EVWL_DIE("ev-tar: rmdir %s: %s", p, strerror(errno));
	}
}

int main(int argc, char **argv)
{
	double secs = evwl_seconds(argc, argv, 10.0), t0, t;
	const char *dir = "/tmp";
	char src[256], dst[256], arc[256];
	uint64_t tree, rounds = 0;
	static const unsigned char zero[1024];

	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "-d"))
			dir = argv[i + 1];
	snprintf(src, sizeof(src), "%s/ev-tar-src.%d", dir, (int)getpid());
	snprintf(dst, sizeof(dst), "%s/ev-tar-dst.%d", dir, (int)getpid());
	snprintf(arc, sizeof(arc), "%s/ev-tar.%d.tar", dir, (int)getpid());
	tree = make_tree(src);

	t0 = evwl_now();
	for (;;) {
		int out = open(arc, O_CREAT | O_TRUNC | O_WRONLY, 0644);

		if (out < 0)
			EVWL_DIE("ev-tar: %s: %s", arc, strerror(errno));
		add_tree(out, src, "");
		xwrite(out, zero, sizeof(zero));
		close(out);
		if (extract(arc, dst) != tree)
			EVWL_DIE("ev-tar: extracted size differs");
		remove_tree(dst);
		rounds++;
		t = evwl_now() - t0;
		if (t >= secs)
			break;
	}
	rmdir(dst);
	unlink(arc);
	remove_tree(src);
	rmdir(src);
	evwl_result("tar", (double)tree * (double)rounds / t / 1e6, "MB/s", rounds, t);
	return 0;
}
