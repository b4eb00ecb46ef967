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
 * Where the kernel maps its ring buffer to user space (6.10+), the pump
 * maps it instead: TRACE_MMAP_IOCTL_GET_READER hands it the reader
 * sub-buffer, which it copies from the mapping into the event (again the
 * one copy). The writer may still be filling that sub-buffer (it is the
 * tail when ftrace holds less than a page): the pump remembers how much of
 * it it relayed and relays the rest later as a page of its own, whose
 * time_stamp is the one reached at that point (the kernel's read(2) does
 * the same for a partly read page). With the mapping, the stats file is
 * read only when the meta page's counters moved, or once a second.
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
#include <sys/mman.h>
#include <sys/syscall.h>
#include <x86intrin.h>

#include <ivtrace_ioctl.h>

#include "relay.h"

#define PAGE_EVENT_LEN	(4u + IVT_FTRACE_PAGE_MAX)	/* u32 length + page */
#define DRAIN_MAX	256u				/* pages per pass */

/* A ring-buffer sub-buffer (events/header_page on x86-64): u64
 * time_stamp, u64 commit (data bytes, bits 30-31 flags), then the data. */
#define RB_HDR		16u
#define RB_SIZE_MASK	((1u << 27) - 1)
#define RB_MISSED_STORED (1ull << 30)	/* the missed count follows the data */
#define RB_DATA_MAX	(IVT_FTRACE_PAGE_MAX - RB_HDR)
#define RB_TS_SHIFT	27
#define RB_TS_ABS_MASK	((1ull << 59) - 1)

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

/* read(2) one page of trace_pipe_raw to @dst; its length, 0 if none. */
static uint32_t pump_read(struct pump *p, uint8_t *dst)
{
	ssize_t n = read(p->pipe_fd, dst, IVT_FTRACE_PAGE_MAX);

	if (n < 0 && errno != EAGAIN && errno != EINTR)
		relay_log("cpu%u: reading trace_pipe_raw failed: %s", p->cpu, strerror(errno));
	return n <= 0 || page_empty(dst, n) ? 0 : (uint32_t)n;
}

/*
 * With the mapping: nothing to count since the stats file was read last,
 * as the meta page says (the kernel updates it at each GET_READER), for at
 * most a second. Without, the stats file is read on every pass.
 */
static int pump_stats_quiet(struct pump *p)
{
	uint64_t m[3];

	if (!p->meta)
		return 0;
	m[0] = p->meta->entries;
	m[1] = p->meta->overrun;
	m[2] = p->meta->read;
	if (!memcmp(m, p->meta_seen, sizeof(m)) && now_ms() - p->stats_ms < 1000)
		return 1;
	memcpy(p->meta_seen, m, sizeof(m));
	p->stats_ms = now_ms();
	return 0;
}

/* ftrace_stats: the CPU's ftrace counters, after the pages they count. */
static void pump_stats(struct pump *p, int force)
{
	uint64_t s[IVT_FTRACE_STAT_COUNT] = { 0 };
	struct ivt_writer *w = &p->w;
	uint8_t *dst;
	uint32_t i;

	if (!force && pump_stats_quiet(p))
		return;
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

/*
 * Map this CPU's ring buffer: the meta page first, which says how long the
 * whole is, then all of it. 0, or -errno: before 6.10 trace_pipe_raw has
 * no mmap (ENODEV); sub-buffers of another size than a page are not
 * relayed from a mapping (EOPNOTSUPP). The caller reads instead.
 */
static int pump_map(struct pump *p)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), len;
	const struct ftrace_meta *m;
	int usable;

	m = mmap(NULL, pg, PROT_READ, MAP_SHARED, p->pipe_fd, 0);
	if (m == MAP_FAILED)
		return -errno;
	usable = m->subbuf_size == IVT_FTRACE_PAGE_MAX && m->nr_subbufs &&
		 m->meta_struct_len >= sizeof(*m) && m->meta_page_size >= pg;
	len = (size_t)m->meta_page_size + (size_t)m->nr_subbufs * m->subbuf_size;
	p->sb_off = m->meta_page_size;
	p->nr_sb = m->nr_subbufs;
	munmap((void *)m, pg);
	if (!usable)
		return -EOPNOTSUPP;
	p->map = mmap(NULL, len, PROT_READ, MAP_SHARED, p->pipe_fd, 0);
	if (p->map == MAP_FAILED) {
		p->map = NULL;
		return -errno;
	}
	p->map_len = len;
	p->meta = (const volatile struct ftrace_meta *)p->map;
	atomic_store(&p->mapped, 1);
	return 0;
}

static void pump_unmap(struct pump *p)
{
	if (p->map)
		munmap(p->map, p->map_len);
	p->map = NULL;
	p->meta = NULL;
	atomic_store(&p->mapped, 0);
}

/*
 * The time stamp reached at data offset @from of a sub-buffer whose
 * time_stamp was *@ts (every event delta before it added), as the host's
 * decoder walks a page. 0, or -1 when the walk does not land on @from.
 */
static int rb_ts_at(const uint8_t *data, uint32_t from, uint64_t *ts)
{
	uint32_t pos = 0, word, type, len;
	uint64_t delta, v;

	while (pos + 4 <= from) {
		memcpy(&word, data + pos, 4);
		type = word & 0x1f;
		delta = word >> 5;
		pos += 4;
		if (type >= 29 || type == 0) {	/* a length or a time word follows */
			if (pos + 4 > from)
				return -1;
			memcpy(&len, data + pos, 4);
		}
		if (type == 29) {		/* padding: its length, from here */
			if (!delta || len < 4)
				return -1;
			pos += len;
			*ts += delta;
		} else if (type == 30 || type == 31) {	/* time extend, absolute */
			v = ((uint64_t)len << RB_TS_SHIFT) + delta;
			*ts = type == 30 ? *ts + v : (*ts & ~RB_TS_ABS_MASK) | (v & RB_TS_ABS_MASK);
			pos += 4;
		} else {			/* a record */
			if (type == 0 && len < 4)
				return -1;
			pos += type ? type * 4 : 4 + ((len - 4 + 3) & ~3u);
			*ts += delta;
		}
	}
	return pos == from ? 0 : -1;
}

/*
 * Copy the reader sub-buffer's bytes not relayed yet to @dst as a page of
 * their own (header, data); returns its length, 0 if there were none. The
 * caller reserved room for a whole page before: the ioctl marks what it
 * hands out as read, so it must not fail to land afterwards.
 */
static uint32_t pump_take(struct pump *p, uint8_t *dst)
{
	const uint8_t *sb;
	uint32_t id, size, from, n;
	uint64_t commit, ts;

	if (ioctl(p->pipe_fd, FTRACE_MMAP_GET_READER) < 0)
		return 0;
	/* The kernel wrote the meta page under the ioctl; the sub-buffer's
	 * commit word is the ftrace writer's, stored after its data (x86-TSO):
	 * acquire loads, which order the copies below after them.
	 */
	id = __atomic_load_n(&p->meta->reader_id, __ATOMIC_ACQUIRE);
	if (id >= p->nr_sb)
		return 0;
	sb = p->map + p->sb_off + (size_t)id * IVT_FTRACE_PAGE_MAX;
	commit = __atomic_load_n((const uint64_t *)(sb + 8), __ATOMIC_ACQUIRE);
	size = (uint32_t)(commit & RB_SIZE_MASK);
	if (size > RB_DATA_MAX)
		return 0;
	from = id == p->reader_id && size >= p->reader_off ? p->reader_off : 0;
	p->reader_id = id;
	p->reader_off = size;
	if (from == size)
		return 0;
	memcpy(&ts, sb, sizeof(ts));
	if (from && rb_ts_at(sb + RB_HDR, from, &ts)) {
		relay_log("cpu%u: sub-buffer %u does not walk to byte %u; its last %u bytes are not relayed",
			  p->cpu, id, from, size - from);
		return 0;
	}
	n = size - from;
	if (!from && (commit & RB_MISSED_STORED) && size + 8 <= RB_DATA_MAX)
		n += 8;				/* the missed count after the data */
	__ivt_put64(dst, ts);
	/* A partial sub-buffer: its own size; the flags stay with its start. */
	__ivt_put64(dst + 8, from ? size - from : commit);
	memcpy(dst + RB_HDR, sb + RB_HDR + from, n);
	return RB_HDR + n;
}

/*
 * Moves one page, from the mapping or by read(2), into an ftrace_page
 * event; returns 1 if it did, 0 if there was none (or no room). The event
 * is reserved for a whole page first and ends where the page does.
 */
static int pump_page(struct pump *p)
{
	struct ivt_writer *w = &p->w;
	uint64_t pkt_pos = w->pkt_pos, cur_end = w->cur_end;
	uint8_t *dst;
	uint32_t n;

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
	n = p->map ? pump_take(p, dst + 4) : pump_read(p, dst + 4);
	if (!n) {
		pump_unreserve(w, pkt_pos, cur_end);
		ivt_writer_exit(w);
		return 0;
	}
	__ivt_put32(dst, n);
	w->cur_end -= IVT_FTRACE_PAGE_MAX - (uint64_t)n;
	if (w->count == 0)
		p->open_ms = now_ms();
	ivt_writer_commit(w);
	ivt_writer_exit(w);
	p->pages++;
	return 1;
}

/*
 * The main thread's request to unmap (pumps_unmap()) and its end: a
 * mapped pump unmaps and counts itself, and maps again afterwards.
 */
static int pump_unmap_asked(struct pump *p)
{
	if (atomic_load(&p->r->unmap_req)) {
		if (p->map) {
			pump_unmap(p);
			p->remap = 1;
			atomic_fetch_add(&p->r->unmapped, 1);
		}
		return 1;
	}
	if (p->remap) {
		int err = pump_map(p);

		p->remap = 0;
		if (err)
			relay_log("cpu%u: mapping the ring buffer again failed (%s); reading it instead",
				  p->cpu, strerror(-err));
	}
	return 0;
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
		if (pump_unmap_asked(p))
			continue;
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
	pump_unmap(p);
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
	p->reader_id = UINT32_MAX;
	if (!r->use_read)
		p->map_err = pump_map(p);
	err = pthread_create(&p->thread, NULL, pump_main, p);
	if (err) {
		pump_unmap(p);
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

/*
 * Unmap every mapped pump's ring buffer (a write the kernel refuses while
 * it is mapped, such as buffer_size_kb, may then be done). Returns how many
 * pumps unmapped, or -ETIMEDOUT after 3 s; pumps_remap() ends it.
 */
int pumps_unmap(struct relay *r)
{
	int want = 0, i;
	uint32_t cpu;

	for (cpu = 0; cpu < r->nr_cpus; cpu++)
		want += r->pumps[cpu].started && atomic_load(&r->pumps[cpu].mapped);
	atomic_store(&r->unmapped, 0);
	atomic_store(&r->unmap_req, 1);
	for (i = 0; i < 300 && atomic_load(&r->unmapped) < want; i++)
		usleep(10000);
	return atomic_load(&r->unmapped) >= want ? want : -ETIMEDOUT;
}

void pumps_remap(struct relay *r)
{
	atomic_store(&r->unmap_req, 0);
}
