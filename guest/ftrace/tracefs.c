// SPDX-License-Identifier: GPL-2.0
/*
 * tracefs.c - the relay's tracefs files: the host's requests, the format
 * files the host decodes pages with, each CPU's counters, the trace clock.
 *
 * Every path is opened relative to the tracefs root's directory fd, with
 * O_NOFOLLOW, and only after ivt_ftrace_parse() accepted the request (the
 * module checked it too, with the same function): a bug on the host side
 * cannot make the relay write anything but ftrace's own control files.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ivtrace_ioctl.h>

#include "relay.h"

/* The tracefs root, mounted there if it is not yet (a bare initramfs). */
int tracefs_open(const char *root)
{
	char probe[256];
	int fd;

	snprintf(probe, sizeof(probe), "%s/events/header_page", root);
	if (access(probe, R_OK) &&
	    mount("tracefs", root, "tracefs", 0, NULL) && errno != EBUSY)
		return -errno;
	fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

/*
 * Reads a whole (small) tracefs file into buf, NUL-terminated. Some of
 * them answer in pieces (seq_file), so read until EOF. Returns the length
 * or -errno (-EFBIG if it does not fit).
 */
int tracefs_read(int root, const char *path, char *buf, size_t size)
{
	size_t len = 0;
	ssize_t n;
	int fd, err = 0;

	fd = openat(root, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (len + 1 < size) {
		n = read(fd, buf + len, size - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			err = n < 0 ? -errno : 0;
			break;
		}
		len += (size_t)n;
	}
	if (!err && len + 1 >= size)
		err = -EFBIG;
	close(fd);
	buf[len] = 0;
	return err ? err : (int)len;
}

/* The value of "NAME: 123" in per_cpu/cpuN/stats text. */
static uint64_t stat_value(const char *text, const char *name)
{
	const char *p = strstr(text, name);

	return p ? strtoull(p + strlen(name), NULL, 10) : 0;
}

/* One CPU's ftrace counters (per_cpu/cpuN/stats, read from the start;
 * every line, the first too, is matched as "\nNAME: "). */
int tracefs_stats(int fd, uint64_t s[IVT_FTRACE_STAT_COUNT])
{
	char text[1024];
	ssize_t n;

	text[0] = '\n';
	n = pread(fd, text + 1, sizeof(text) - 2, 0);
	if (n <= 0)
		return -1;
	text[n + 1] = 0;
	s[IVT_FTRACE_STAT_ENTRIES] = stat_value(text, "\nentries: ");
	s[IVT_FTRACE_STAT_OVERRUN] = stat_value(text, "\noverrun: ");
	s[IVT_FTRACE_STAT_COMMIT_OVERRUN] = stat_value(text, "\ncommit overrun: ");
	s[IVT_FTRACE_STAT_DROPPED] = stat_value(text, "\ndropped events: ");
	s[IVT_FTRACE_STAT_READ] = stat_value(text, "\nread events: ");
	s[IVT_FTRACE_STAT_BYTES] = stat_value(text, "\nbytes: ");
	return 0;
}

/*
 * The relay's timestamps and the region's are the same TSC only if ftrace
 * uses the x86-tsc clock (boot: trace_clock=x86-tsc). Switching makes
 * ftrace empty its buffer (tracing_set_clock() resets it, and its
 * counters): those events are counted per CPU as clock_reset.
 */
int tracefs_ensure_tsc(struct relay *r)
{
	char clock[512], path[64];
	uint64_t s[IVT_FTRACE_STAT_COUNT];
	uint32_t cpu;
	int fd, n;

	n = tracefs_read(r->tracefs, "trace_clock", clock, sizeof(clock));
	if (n < 0)
		return n;
	if (strstr(clock, "[x86-tsc]"))
		return 0;
	for (cpu = 0; cpu < r->nr_cpus; cpu++) {
		snprintf(path, sizeof(path), "per_cpu/cpu%u/stats", cpu);
		fd = openat(r->tracefs, path, O_RDONLY | O_CLOEXEC);
		memset(s, 0, sizeof(s));
		if (fd >= 0 && !tracefs_stats(fd, s))
			r->pumps[cpu].clock_reset = s[IVT_FTRACE_STAT_ENTRIES];
		if (fd >= 0)
			close(fd);
	}
	fd = openat(r->tracefs, "trace_clock", O_WRONLY | O_TRUNC | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = write(fd, "x86-tsc", 7) == 7 ? 0 : -errno;
	close(fd);
	if (!n)
		relay_log("trace_clock was %.*s; now x86-tsc (the events ftrace held are gone, counted as clock_reset)",
			  (int)strcspn(clock, "\n"), clock);
	return n;
}

static int published(struct relay *r, unsigned int id)
{
	return r->published[id / 8] & (1u << (id % 8));
}

/* Publishes one description file (no-op for an id already published). */
static void publish_file(struct relay *r, uint32_t what, const char *system,
			 const char *path)
{
	static char text[IVT_FTRACE_TEXT_MAX + 1];
	struct ivtrace_relay_format f = { .what = what };
	const char *id;
	unsigned long v = 0;
	int n;

	n = tracefs_read(r->tracefs, path, text, sizeof(text));
	if (n <= 0)
		return;
	if (what == IVT_FTRACE_FORMAT) {
		id = strstr(text, "\nID: ");
		v = id ? strtoul(id + 5, NULL, 10) : FTRACE_IDS;
		if (v >= FTRACE_IDS || published(r, (unsigned int)v))
			return;
	}
	f.len = (uint32_t)n;
	snprintf(f.system, sizeof(f.system), "%s", system);
	f.text = (uint64_t)(uintptr_t)text;
	if (ioctl(r->dev, IVTRACE_IOC_RELAY_FORMAT, &f)) {
		if (!r->meta_full++)
			relay_log("publishing %s failed: %s (its events cannot be decoded)",
				  path, strerror(errno));
		return;
	}
	if (what == IVT_FTRACE_FORMAT)
		r->published[v / 8] |= (uint8_t)(1u << (v % 8));
}

static void publish_event(struct relay *r, const char *system, const char *event)
{
	char path[256];

	if (snprintf(path, sizeof(path), "events/%s/%s/format", system, event) <
	    (int)sizeof(path))
		publish_file(r, IVT_FTRACE_FORMAT, system, path);
}

/* Every event of events/ftrace/: what the tracers (function,
 * function_graph, ...) and trace_marker write. */
static void publish_ftrace_system(struct relay *r)
{
	struct dirent *e;
	DIR *d;
	int fd;

	fd = openat(r->tracefs, "events/ftrace", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && e->d_type == DT_DIR)
			publish_event(r, "ftrace", e->d_name);
	closedir(d);
}

/*
 * header_page once, every event of events/ftrace/, and every event
 * set_event lists as enabled (tracepoints, kprobes, uprobes, synthetic):
 * called at start, after each host request and every second, so an event
 * is described before the host decodes a page holding it.
 */
void tracefs_publish(struct relay *r)
{
	static char list[1 << 16];
	static int header_done;
	char *line, *save = NULL, *colon;

	if (!header_done) {
		publish_file(r, IVT_FTRACE_HEADER_PAGE, "", "events/header_page");
		publish_ftrace_system(r);
		header_done = 1;
	}
	if (tracefs_read(r->tracefs, "set_event", list, sizeof(list)) < 0)
		return;
	for (line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		colon = strchr(line, ':');
		if (!colon)
			continue;
		*colon = 0;
		publish_event(r, line, colon + 1);
	}
}

/* write / append: like `echo VALUE > PATH` / `>> PATH`. */
static int serve_write(struct relay *r, const struct ivt_ftrace_req *q)
{
	int flags = O_WRONLY | O_NOFOLLOW | O_CLOEXEC;
	ssize_t n = 0;
	int fd, err = 0;

	flags |= q->op == IVT_FTRACE_OP_APPEND ? O_APPEND : O_TRUNC;
	fd = openat(r->tracefs, q->path, flags);
	if (fd < 0)
		return -errno;
	if (q->value_len)
		n = write(fd, q->value, q->value_len);
	if (n < 0)
		err = -errno;
	else if ((uint32_t)n != q->value_len)
		err = -EIO;
	if (close(fd) && !err)
		err = -errno;
	return err;
}

/* read: IVT_CTL_RESP_MAX bytes from the offset; MORE when it filled up. */
static int serve_read(struct relay *r, const struct ivt_ftrace_req *q,
		      char *out, uint32_t *out_len, uint32_t *flags)
{
	ssize_t n;
	int fd;

	fd = openat(r->tracefs, q->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = pread(fd, out, IVT_CTL_RESP_MAX, (off_t)q->offset);
	if (n < 0) {
		n = -errno;
		close(fd);
		return (int)n;
	}
	close(fd);
	*out_len = (uint32_t)n;
	*flags = n == IVT_CTL_RESP_MAX ? IVT_CTL_RESP_MORE : 0;
	return 0;
}

/* One host request: checked again (defence in depth), then performed. */
int tracefs_serve(struct relay *r, const char *text, uint32_t len,
		  char *out, uint32_t *out_len, uint32_t *flags)
{
	struct ivt_ftrace_req q;
	int err;

	*out_len = 0;
	*flags = 0;
	if (ivt_ftrace_parse(text, len, &q))
		return -EPERM;
	if (q.op == IVT_FTRACE_OP_READ)
		return serve_read(r, &q, out, out_len, flags);
	err = serve_write(r, &q);
	if (err == -EBUSY && pumps_unmap(r) > 0) {
		/* The kernel refuses to resize (or snapshot) a mapped ring
		 * buffer: again with the pumps unmapped for the moment.
		 */
		err = serve_write(r, &q);
		pumps_remap(r);
	} else if (err == -EBUSY) {
		pumps_remap(r);
	}
	relay_log("host: %.*s -> %d", (int)len, text, err);
	if (!err)
		tracefs_publish(r);
	return err;
}
