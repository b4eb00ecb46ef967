/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * ivtrace/ftrace.h - the ftrace relay's side of the ABI (docs/ftrace.md).
 *
 * The relay (guest/ftrace, a guest user-space helper the module starts)
 * copies the guest's ftrace ring-buffer pages, as per_cpu/cpuN/trace_pipe_raw
 * gives them, into channels of stream class IVT_STREAM_FTRACE, one per
 * possible CPU. Their events are fixed by this header (no id counter):
 *
 *   id 0 ftrace_page   page: bytes (u32 length, then one whole ftrace page)
 *   id 1 ftrace_stats  the CPU's ftrace counters, u64 each, in the order of
 *                      enum ivt_ftrace_stat, written after the pages they
 *                      count
 *   id 2 ftrace_symbols text: bytes (u32 length, then at most
 *                      IVT_FTRACE_PAGE_MAX bytes of whole /proc/kallsyms
 *                      lines: the kernel's and modules' text symbols and
 *                      the initcall table's, "ADDR TYPE NAME[\t[MODULE]]\n"),
 *                      written once, by the first CPU's pump, after it
 *                      first drained ftrace's buffer: what names the
 *                      function addresses of this boot (KASLR included)
 *
 * The host selects what ftrace records with IVT_CMD_FTRACE: one tracefs
 * operation per command, as text (struct ivt_ctl_text), which the module
 * checks with ivt_ftrace_check() below before the relay performs it, and
 * which the relay checks again. Freestanding: module, relay and tests.
 */
#ifndef IVTRACE_FTRACE_H
#define IVTRACE_FTRACE_H

#include "abi.h"

#define IVT_FTRACE_EV_PAGE	0u
#define IVT_FTRACE_EV_STATS	1u
#define IVT_FTRACE_EV_SYMBOLS	2u
#define IVT_FTRACE_EVENTS	3u

/* Fields of ftrace_stats (u64 each, in this order). The first six are
 * per_cpu/cpuN/stats of the CPU; the rest are the relay's own. */
enum ivt_ftrace_stat {
	IVT_FTRACE_STAT_ENTRIES,	/* events in ftrace's buffer, not read yet */
	IVT_FTRACE_STAT_OVERRUN,	/* overwritten before they were read */
	IVT_FTRACE_STAT_COMMIT_OVERRUN,	/* lost to nested writers filling a page */
	IVT_FTRACE_STAT_DROPPED,	/* refused by a full buffer (no overwrite) */
	IVT_FTRACE_STAT_READ,		/* read by any reader (the relay, or others) */
	IVT_FTRACE_STAT_BYTES,		/* bytes of events in the buffer */
	IVT_FTRACE_STAT_CLOCK_RESET,	/* discarded by the relay's switch to x86-tsc */
	IVT_FTRACE_STAT_PAGES,		/* pages the relay committed on this channel */
	IVT_FTRACE_STAT_COUNT
};

#define IVT_FTRACE_PAGE_MAX	4096u	/* bytes of an ftrace page (x86 PAGE_SIZE) */

/* ------------------------------------------------------------------ */
/* IVT_CMD_FTRACE requests                                             */
/* ------------------------------------------------------------------ */

/*
 * A request is one line of printable ASCII (no NUL, no newline):
 *
 *   write PATH VALUE     open PATH (under the tracefs root) truncating,
 *                        write VALUE (may be empty: clears a list file)
 *   append PATH VALUE    open PATH for appending, write VALUE
 *   read PATH OFFSET     up to IVT_CTL_RESP_MAX bytes of PATH from byte
 *                        OFFSET (decimal); IVT_CTL_RESP_MORE if it goes on
 *
 * PATH is one of the files ivt_ftrace_path_allowed() accepts; nothing else
 * under tracefs, nothing outside it. The answer is ack_status 0 or -errno
 * of the operation, and for read the bytes in ctl_text.resp.
 */
#define IVT_FTRACE_OP_WRITE	1u
#define IVT_FTRACE_OP_APPEND	2u
#define IVT_FTRACE_OP_READ	3u

#define IVT_FTRACE_PATH_MAX	128u

struct ivt_ftrace_req {
	uint32_t op;			/* IVT_FTRACE_OP_* */
	uint32_t path_len;
	char path[IVT_FTRACE_PATH_MAX];	/* NUL-terminated copy */
	const char *value;		/* into the request text (write, append) */
	uint32_t value_len;
	uint64_t offset;		/* read */
};

static inline int __ivt_ft_word_eq(const char *s, uint32_t n, const char *w)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (!w[i] || s[i] != w[i])
			return 0;
	return w[n] == 0;
}

/* A path component: [A-Za-z0-9_-]+ (no dots: no "..", no hidden files). */
static inline int __ivt_ft_component_ok(const char *s, uint32_t n)
{
	uint32_t i;

	if (n == 0 || n > 64)
		return 0;
	for (i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

/* Splits `path` at '/' into at most 4 components; returns their count, or
 * 0 if a component is not acceptable. */
static inline uint32_t __ivt_ft_split(const char *path, uint32_t len,
				      const char *comp[4], uint32_t clen[4])
{
	uint32_t n = 0, start = 0, i;

	for (i = 0; i <= len; i++) {
		if (i < len && path[i] != '/')
			continue;
		if (n == 4 || !__ivt_ft_component_ok(path + start, i - start))
			return 0;
		comp[n] = path + start;
		clen[n] = i - start;
		n++;
		start = i + 1;
	}
	return n;
}

static inline int __ivt_ft_in(const char *s, uint32_t n, const char *const *list)
{
	for (; *list; list++)
		if (__ivt_ft_word_eq(s, n, *list))
			return 1;
	return 0;
}

/*
 * May the host reach tracefs file `path` (relative to the tracefs root)
 * with `op`? The control files of tracers, events, filters, triggers,
 * probes and pid filters; reading also the lists of what exists, the
 * formats and each CPU's stats. Never trace_clock (the relay keeps it at
 * x86-tsc), never instances, never a file outside tracefs.
 */
static inline int ivt_ftrace_path_allowed(const char *path, uint32_t len,
					  uint32_t op)
{
	static const char *const top_rw[] = {
		"current_tracer", "tracing_on", "buffer_size_kb", "set_event",
		"set_event_pid", "set_event_notrace_pid", "set_ftrace_pid",
		"set_ftrace_notrace_pid", "set_ftrace_filter",
		"set_ftrace_notrace", "set_graph_function", "set_graph_notrace",
		"max_graph_depth", "kprobe_events", "uprobe_events",
		"dynamic_events", 0 };
	static const char *const top_ro[] = {
		"available_events", "available_tracers",
		"available_filter_functions", "trace_clock", "README", 0 };
	static const char *const ev_rw[] = { "enable", "filter", "trigger", 0 };
	static const char *const ev_ro[] = { "format", "id", 0 };
	const char *c[4];
	uint32_t l[4], n;
	int write = op != IVT_FTRACE_OP_READ;

	n = __ivt_ft_split(path, len, c, l);
	if (n == 1)
		return __ivt_ft_in(c[0], l[0], top_rw) ||
		       (!write && __ivt_ft_in(c[0], l[0], top_ro));
	if (n == 2 && __ivt_ft_word_eq(c[0], l[0], "options"))
		return 1;
	if (n == 2 && __ivt_ft_word_eq(c[0], l[0], "events"))
		return __ivt_ft_word_eq(c[1], l[1], "enable") ||
		       (!write && __ivt_ft_word_eq(c[1], l[1], "header_page"));
	if (n == 3 && __ivt_ft_word_eq(c[0], l[0], "per_cpu"))
		return !write && l[1] > 3 && __ivt_ft_word_eq(c[1], 3, "cpu") &&
		       __ivt_ft_word_eq(c[2], l[2], "stats");
	if (n == 3 && __ivt_ft_word_eq(c[0], l[0], "events"))
		return __ivt_ft_word_eq(c[2], l[2], "enable") ||
		       __ivt_ft_word_eq(c[2], l[2], "filter");
	if (n == 4 && __ivt_ft_word_eq(c[0], l[0], "events"))
		return __ivt_ft_in(c[3], l[3], ev_rw) ||
		       (!write && __ivt_ft_in(c[3], l[3], ev_ro));
	return 0;
}

/* Printable ASCII and tabs only. */
static inline int __ivt_ft_text_ok(const char *s, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if ((s[i] < 0x20 && s[i] != '\t') || s[i] > 0x7e)
			return 0;
	return 1;
}

/* Length of the word at s[0..n) (up to a space). */
static inline uint32_t __ivt_ft_word(const char *s, uint32_t n)
{
	uint32_t i = 0;

	while (i < n && s[i] != ' ')
		i++;
	return i;
}

/*
 * Parse and check one request of `len` bytes. Returns 0 and fills `r`, or
 * -1 when it is malformed or names a file the host may not reach that way.
 */
static inline int ivt_ftrace_parse(const char *text, uint32_t len,
				   struct ivt_ftrace_req *r)
{
	uint32_t w, i;

	__builtin_memset(r, 0, sizeof(*r));
	if (len == 0 || len > IVT_CTL_REQ_MAX || !__ivt_ft_text_ok(text, len))
		return -1;
	w = __ivt_ft_word(text, len);
	if (__ivt_ft_word_eq(text, w, "write"))
		r->op = IVT_FTRACE_OP_WRITE;
	else if (__ivt_ft_word_eq(text, w, "append"))
		r->op = IVT_FTRACE_OP_APPEND;
	else if (__ivt_ft_word_eq(text, w, "read"))
		r->op = IVT_FTRACE_OP_READ;
	else
		return -1;
	if (w == len)
		return -1;
	text += w + 1;
	len -= w + 1;
	w = __ivt_ft_word(text, len);
	if (w == 0 || w >= IVT_FTRACE_PATH_MAX ||
	    !ivt_ftrace_path_allowed(text, w, r->op))
		return -1;
	__builtin_memcpy(r->path, text, w);
	r->path[w] = 0;
	r->path_len = w;
	r->value = text + w + (w < len);
	r->value_len = len - w - (w < len);
	if (r->op != IVT_FTRACE_OP_READ)
		return 0;
	if (r->value_len == 0 || r->value_len > 12)
		return -1;
	for (i = 0; i < r->value_len; i++) {
		if (r->value[i] < '0' || r->value[i] > '9')
			return -1;
		r->offset = r->offset * 10 + (uint64_t)(r->value[i] - '0');
	}
	return 0;
}

#endif /* IVTRACE_FTRACE_H */
