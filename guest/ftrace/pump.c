// SPDX-License-Identifier: GPL-2.0
/*
 * pump.c - one CPU's ftrace pages into its ftrace channel.
 *
 * Per page: reserve an ftrace_page event in the channel's open packet,
 * read(2) one page of per_cpu/cpuN/trace_pipe_raw straight into it (the
 * kernel's copy to user space is the only copy the page sees in the
 * guest), commit. No system call but that read per page, no exit to the
 * hypervisor: the host drains the packets from shared memory.
 *
 * Back-pressure instead of drops: the pump reads a page only when the
 * channel has room for it (discard mode; an overwrite-mode channel always
 * has). When the host falls behind, pages stay in ftrace's buffer, which
 * then overwrites its oldest ones (or refuses new events, with
 * options/overwrite 0) and counts them: ftrace's own overrun and dropped
 * counters, which the pump relays in every ftrace_stats event, are the
 * complete account of what never reached the channel.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <x86intrin.h>

#include <ivtrace_ioctl.h>

#include "relay.h"

#define PAGE_EVENT_LEN	(4u + IVT_FTRACE_PAGE_MAX)	/* u32 length + page */
#define DRAIN_MAX	256u				/* pages per pass */

/* Can a page event (or a smaller one) be written now without a drop? */
int pump_has_room(const struct pump *p)
{
	const struct ivt_writer *w = &p->w;
	uint64_t next = w->seq, consumed;

	if (w->pkt && w->off + IVT_EV_EXT_SIZE + PAGE_EVENT_LEN <= w->limit)
		return 1;
	if (ivt_read_once(w->ch->mode) == IVT_MODE_OVERWRITE)
		return 1;
	if (w->pkt)
		next++;		/* the open packet closes, the next one opens */
	/* Pairs with the host's store-release of consumed: the sub-buffer
	 * we would open is free once it says so. */
	consumed = ivt_load_acquire(&w->ch->consumed);
	return next - consumed < w->nr_subbufs;
}

/*
 * Forget the reservation made last, as if it never was: nothing was
 * committed (commit_pos did not move), so only the writer's private end
 * of the packet goes back. If the reservation opened a packet, that
 * packet is empty and stays open for the next page.
 */
static void pump_unreserve(struct ivt_writer *w, uint64_t pkt_pos,
			   uint64_t cur_end)
{
	if (w->pkt_pos == pkt_pos)
		w->cur_end = cur_end;
	else
		w->cur_end = w->off;
}

/* A page whose header says it holds no data (nothing was read). */
static int page_empty(const uint8_t *page, ssize_t n)
{
	uint64_t commit;

	if (n < 16)
		return 1;
	memcpy(&commit, page + 8, sizeof(commit));
	return (commit & ((1u << 27) - 1)) == 0;
}

/* Moves one page; returns 1 if it did, 0 if there was none (or no room). */
static int pump_page(struct pump *p)
{
	struct ivt_writer *w = &p->w;
	uint64_t pkt_pos = w->pkt_pos, cur_end = w->cur_end;
	uint8_t *dst;
	ssize_t n;

	if (!pump_has_room(p)) {
		p->blocked++;
		return 0;
	}
	if (!ivt_writer_enter(w))
		return 0;
	dst = ivt_writer_reserve(w, __rdtsc(), IVT_FTRACE_EV_PAGE, PAGE_EVENT_LEN);
	if (!dst) {
		ivt_writer_exit(w);
		return 0;
	}
	n = read(p->pipe_fd, dst + 4, IVT_FTRACE_PAGE_MAX);
	if (n <= 0 || page_empty(dst + 4, n)) {
		pump_unreserve(w, pkt_pos, cur_end);
		ivt_writer_exit(w);
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			relay_log("cpu%u: reading trace_pipe_raw failed: %s", p->cpu,
				  strerror(errno));
		return 0;
	}
	__ivt_put32(dst, (uint32_t)n);
	/* A short read leaves the reserved tail unwritten: the event ends
	 * where the page does. */
	w->cur_end -= IVT_FTRACE_PAGE_MAX - (uint64_t)n;
	if (w->count == 0)
		p->open_ms = now_ms();
	ivt_writer_commit(w);
	ivt_writer_exit(w);
	p->pages++;
	return 1;
}

/* ftrace_stats: the CPU's ftrace counters, after the pages they count. */
static void pump_stats(struct pump *p, int force)
{
	uint64_t s[IVT_FTRACE_STAT_COUNT] = { 0 };
	struct ivt_writer *w = &p->w;
	uint8_t *dst;
	uint32_t i;

	if (tracefs_stats(p->stats_fd, s))
		return;
	s[IVT_FTRACE_STAT_CLOCK_RESET] = p->clock_reset;
	s[IVT_FTRACE_STAT_PAGES] = p->pages;
	if (!force && !memcmp(s, p->stat, sizeof(s)))
		return;
	if (!ivt_writer_enter(w))
		return;
	dst = ivt_writer_reserve(w, __rdtsc(), IVT_FTRACE_EV_STATS, sizeof(s));
	if (dst) {
		for (i = 0; i < IVT_FTRACE_STAT_COUNT; i++)
			__ivt_put64(dst + 8 * i, s[i]);
		if (w->count == 0)
			p->open_ms = now_ms();
		ivt_writer_commit(w);
		memcpy(p->stat, s, sizeof(s));
	}
	ivt_writer_exit(w);
}

/* Close a packet that has held pages for a whole flush interval, and ring
 * the host if a packet closed while it slept. */
static void pump_flush(struct pump *p, int force)
{
	struct ivt_writer *w = &p->w;

	if (w->pkt && w->count &&
	    (force || now_ms() - p->open_ms >= p->r->flush_ms)) {
		if (ivt_writer_enter(w)) {
			ivt_writer_flush(w);
			ivt_writer_exit(w);
		}
	}
	if (w->wake_host) {
		w->wake_host = 0;
		ioctl(p->r->dev, IVTRACE_IOC_DOORBELL);
	}
}

static int region_live(const struct relay *r)
{
	const struct ivt_region_hdr *h = (const void *)r->region;

	/* Relaxed: a stale LIVE costs one more pass at most. */
	return ivt_read_once(h->state) == IVT_STATE_LIVE;
}

/* The symbols go out of the first CPU's channel (symbols.c). */
static int publishes_symbols(const struct pump *p)
{
	return p == &p->r->pumps[0];
}

/* Before exiting: what is left of the symbols, while the host makes room
 * (up to 2 s: a host that stopped draining gets none). */
static void symbols_finish(struct pump *p)
{
	uint32_t tries;

	for (tries = 0; tries < 200 && symbols_publish(p, 1); tries++) {
		pump_flush(p, 1);
		usleep(10000);
	}
}

/* Until stop: wait for ftrace (its buffer_percent, or the flush interval),
 * move what it has, account, flush; once ftrace's buffer was drained, the
 * symbols a little at a time. Then drain what is left. */
static void *pump_main(void *arg)
{
	struct pump *p = arg;
	struct pollfd pfd = { .fd = p->pipe_fd, .events = POLLIN };
	uint32_t n;

	while (!atomic_load(&p->r->stop) && region_live(p->r)) {
		poll(&pfd, 1, (int)p->r->flush_ms);
		for (n = 0; n < DRAIN_MAX && pump_page(p); n++)
			;
		if (n < DRAIN_MAX && publishes_symbols(p))
			symbols_publish(p, 0);
		pump_stats(p, 0);
		pump_flush(p, 0);
	}
	if (region_live(p->r)) {
		while (pump_page(p))
			;
		if (publishes_symbols(p))
			symbols_finish(p);
		pump_stats(p, 1);
		pump_flush(p, 1);
	}
	return NULL;
}

int pump_start(struct relay *r, struct pump *p, uint32_t cpu)
{
	char path[64];
	int err;

	p->r = r;
	p->cpu = cpu;
	snprintf(path, sizeof(path), "per_cpu/cpu%u/trace_pipe_raw", cpu);
	p->pipe_fd = openat(r->tracefs, path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (p->pipe_fd < 0)
		return -errno;
	snprintf(path, sizeof(path), "per_cpu/cpu%u/stats", cpu);
	p->stats_fd = openat(r->tracefs, path, O_RDONLY | O_CLOEXEC);
	if (p->stats_fd < 0) {
		err = -errno;
		close(p->pipe_fd);
		return err;
	}
	ivt_writer_init(&p->w, r->region, &r->layout, r->first_chan + cpu, cpu,
			(uint32_t)getpid(), (uint32_t)syscall(SYS_gettid));
	err = pthread_create(&p->thread, NULL, pump_main, p);
	if (err) {
		close(p->pipe_fd);
		close(p->stats_fd);
		return -err;
	}
	p->started = 1;
	return 0;
}

void pump_join(struct pump *p)
{
	if (!p->started)
		return;
	pthread_join(p->thread, NULL);
	close(p->pipe_fd);
	close(p->stats_fd);
	p->started = 0;
}
