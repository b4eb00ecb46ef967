// SPDX-License-Identifier: GPL-2.0
/*
 * symbols.c - this boot's kernel symbols, once, so that the host can name
 * the addresses ftrace records.
 *
 * function and function_graph record a function's address, initcall_start
 * the initcall's, kprobes their ip. Only this boot's symbols name them:
 * KASLR moves the kernel at every boot, modules load anywhere, and the
 * distribution's System.map may not be at hand (Debian's is a stub; the
 * real one ships in the 800 MB -dbg package). So the relay reads
 * /proc/kallsyms (as root it sees the addresses), keeps the text symbols
 * (types t T w W, modules' included) and the initcall table's
 * (__initcall*: their names say each initcall's level), and writes them,
 * whole lines, in ftrace_symbols events of the first CPU's channel.
 *
 * When: once that pump has first drained ftrace's buffer, so the events
 * ftrace kept since boot leave first (reading kallsyms is kernel work
 * ftrace traces like any other), and before the relay exits if it had not
 * yet. A few chunks per pass, with the same back-pressure as pages: the
 * host gets the text in order, nothing is dropped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <x86intrin.h>

#include "relay.h"

#define KALLSYMS	"/proc/kallsyms"
#define READ_BLOCK	65536u
#define CHUNKS_PER_PASS	32u

/* Is this kallsyms line ("ADDR TYPE NAME[\t[MOD]]") one the host needs? */
static int wanted(const char *line, size_t len)
{
	const char *sp = memchr(line, ' ', len);
	char type;

	if (!sp || (size_t)(sp - line) + 3 > len || sp[2] != ' ')
		return 0;
	type = sp[1];
	if (type == 't' || type == 'T' || type == 'w' || type == 'W')
		return 1;
	return len - (size_t)(sp + 3 - line) >= 10 && !memcmp(sp + 3, "__initcall", 10);
}

/* Appends `len` bytes to the buffer, growing it. */
static int append(struct symbols *s, const char *b, size_t len)
{
	if (s->len + len > s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 1u << 20;
		char *n;

		while (cap < s->len + len)
			cap *= 2;
		n = realloc(s->buf, cap);
		if (!n)
			return -ENOMEM;
		s->buf = n;
		s->cap = cap;
	}
	memcpy(s->buf + s->len, b, len);
	s->len += len;
	return 0;
}

/* Keeps the wanted lines of `block` (its last, partial line goes back to
 * the front of `block` for the next read); returns the bytes kept back. */
static ssize_t keep_lines(struct symbols *s, char *block, size_t n)
{
	size_t at = 0;

	while (at < n) {
		char *nl = memchr(block + at, '\n', n - at);
		size_t len;

		if (!nl)
			break;
		len = (size_t)(nl - (block + at)) + 1;
		if (wanted(block + at, len) && append(s, block + at, len))
			return -ENOMEM;
		at += len;
	}
	memmove(block, block + at, n - at);
	return (ssize_t)(n - at);
}

/* Reads the wanted lines of /proc/kallsyms into s->buf. */
static int symbols_load(struct symbols *s)
{
	char *block = malloc(READ_BLOCK);
	size_t have = 0;
	ssize_t n;
	int fd, err = 0;

	if (!block)
		return -ENOMEM;
	fd = open(KALLSYMS, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		free(block);
		return -errno;
	}
	while ((n = read(fd, block + have, READ_BLOCK - have)) > 0) {
		ssize_t left = keep_lines(s, block, have + (size_t)n);

		/* A line longer than the block (none is) is dropped. */
		if (left < 0 || (size_t)left == READ_BLOCK) {
			err = left < 0 ? -ENOMEM : 0;
			have = 0;
			if (err)
				break;
			continue;
		}
		have = (size_t)left;
	}
	if (n < 0)
		err = -errno;
	close(fd);
	free(block);
	/* kptr_restrict hides the addresses (all zero): nothing to name. */
	if (!err && s->len >= 16 && !memcmp(s->buf, "0000000000000000", 16))
		err = -EPERM;
	return err;
}

/* The length of the next chunk: whole lines, at most a page. */
static size_t next_chunk(const struct symbols *s)
{
	size_t max = s->len - s->off, n;

	if (max <= IVT_FTRACE_PAGE_MAX)
		return max;
	for (n = IVT_FTRACE_PAGE_MAX; n > 0; n--)
		if (s->buf[s->off + n - 1] == '\n')
			return n;
	return IVT_FTRACE_PAGE_MAX;	/* no line ends in a page: cut it */
}

/* Writes one chunk; 1 if it did, 0 if the channel had no room. */
static int write_chunk(struct pump *p, struct symbols *s)
{
	struct ivt_writer *w = &p->w;
	size_t n = next_chunk(s);
	uint8_t *dst;

	if (!pump_has_room(p) || !ivt_writer_enter(w))
		return 0;
	dst = ivt_writer_reserve(w, __rdtsc(), IVT_FTRACE_EV_SYMBOLS, 4 + (uint32_t)n);
	if (dst) {
		__ivt_put32(dst, (uint32_t)n);
		memcpy(dst + 4, s->buf + s->off, n);
		if (w->count == 0)
			p->open_ms = now_ms();
		ivt_writer_commit(w);
		s->off += n;
	}
	ivt_writer_exit(w);
	return dst != NULL;
}

/*
 * Publishes (part of) the symbols from pump `p`: loads them the first
 * time, then writes up to CHUNKS_PER_PASS chunks (all of them when `all`).
 * Returns 1 while some are left to write.
 */
int symbols_publish(struct pump *p, int all)
{
	struct symbols *s = &p->r->symbols;
	uint32_t n;
	int err;

	if (s->state == SYMBOLS_DONE)
		return 0;
	if (s->state == SYMBOLS_NONE) {
		err = symbols_load(s);
		if (err) {
			relay_log("%s: no symbols for the host (%s)", KALLSYMS, strerror(-err));
			s->state = SYMBOLS_DONE;
			return 0;
		}
		s->state = SYMBOLS_WRITING;
	}
	for (n = 0; (all || n < CHUNKS_PER_PASS) && s->off < s->len; n++)
		if (!write_chunk(p, s))
			break;
	if (s->off < s->len)
		return 1;
	relay_log("%zu bytes of kernel symbols for the host", s->len);
	free(s->buf);
	s->buf = NULL;
	s->state = SYMBOLS_DONE;
	return 0;
}
