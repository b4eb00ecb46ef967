/* SPDX-License-Identifier: MIT */
/*
 * ivtrace.h - libivtrace, the user-space trace writer.
 *
 * A program attaches to a region (a guest's /dev/ivtrace, or a /dev/shm
 * file on a plain host, "loopback"), registers its event types once, and
 * writes events through ivt_write(), an inline fast path: no lock, no
 * system call, no blocking. Each thread gets a channel of its own on its
 * first event; a full ring drops the newest event and counts it.
 *
 *	struct ivt_region *r;
 *	struct ivt_event ev;
 *	static const struct ivt_field f[] = {
 *		{ "a", IVT_FT_U64 }, { "b", IVT_FT_U64 },
 *	};
 *	ivt_region_create("/dev/shm/demo", NULL, &r);
 *	ivt_event_register(r, "demo:pair", f, 2, &ev);
 *	struct { uint64_t a, b; } __attribute__((packed)) p = { 1, 2 };
 *	ivt_write(&ev, &p, sizeof(p));
 *	ivt_region_close(r);
 *
 * Payloads are the event's fields in declaration order, byte-packed,
 * little-endian; IVT_FT_STRING is NUL-terminated, IVT_FT_BYTES is a u32
 * length followed by the bytes (ivt_put_*() of ivtrace/payload.h).
 *
 * Signal handlers may write events: one that interrupts an event of the
 * same thread is dropped and counted (lost_nested). A thread's first
 * event in a region claims a channel and allocates; make it outside a
 * signal handler (one that interrupts the library's own slow path drops
 * its event instead of deadlocking).
 *
 * Every function returns 0 or a negative errno; none sets errno.
 */
#ifndef IVTRACE_H
#define IVTRACE_H

#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <ivtrace/abi.h>
#include <ivtrace/payload.h>	/* ivt_put_*(): payload encoders */
#include <ivtrace/writer.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ivt_region;

struct ivt_region_opts {
	uint32_t channels;	/* user channels (threads writing at once); 0: 64 */
	uint32_t subbufs;	/* sub-buffers per channel, power of two; 0: 8 */
	uint32_t subbuf_size;	/* bytes, power of two >= 4096; 0: 256 KiB */
	uint32_t meta_size;	/* metadata area bytes; 0: 256 KiB */
	uint32_t mode;		/* IVT_MODE_DISCARD (default) or IVT_MODE_OVERWRITE */
};

/*
 * Create (format) a loopback region backed by the file `path` (created or
 * truncated to the planned size, rounded up to a power of two). `opts` may
 * be NULL for the defaults. The caller owns the region: ivt_region_close()
 * marks it closed for the reader.
 * Return: 0; -EINVAL bad options; -EAGAIN no thread-specific key left
 * in this process; -errno from open/ftruncate/mmap.
 */
int ivt_region_create(const char *path, const struct ivt_region_opts *opts,
		      struct ivt_region **out);

/*
 * Attach to a region someone else formatted (a guest's /dev/ivtrace, or
 * another process's /dev/shm file). Validates the header and layout.
 * Return: 0; -ENODATA not formatted (yet); -EPROTO bad magic, version or
 * layout; -EAGAIN as for ivt_region_create(); -errno from open/mmap.
 */
int ivt_region_attach(const char *path, struct ivt_region **out);

/*
 * Flush and release the calling thread's channel, mark the region closed
 * if this process created it, and unmap. Other threads must have stopped
 * writing to `r`: their open packets are flushed and their channels given
 * back here, and an event they write to `r` afterwards is a use after
 * free.
 */
void ivt_region_close(struct ivt_region *r);

/* What a region is, as validated at create or attach. */
struct ivt_region_info {
	uint64_t size;			/* bytes mapped (a power of two) */
	uint8_t  uuid[16];		/* names the trace */
	uint64_t features;		/* IVT_FEAT_* */
	uint64_t freq_hz;		/* writer clock ticks per second */
	uint32_t nr_channels;		/* kernel + user */
	uint32_t nr_kernel_channels;
	uint32_t nr_subbufs;
	uint32_t subbuf_size;
	uint32_t meta_size;
	uint32_t mode;			/* IVT_MODE_* given at format time */
	uint32_t created;		/* 1 if this process formatted it */
	void *base;			/* where it is mapped in this process (for
					 * tests and debuggers, valid until close) */
};

void ivt_region_info(struct ivt_region *r, struct ivt_region_info *info);

/* Field of an event type. */
struct ivt_field {
	const char *name;	/* [A-Za-z_][A-Za-z0-9_]*, < IVT_FIELD_NAME_MAX */
	uint8_t type;		/* IVT_FT_* */
	uint8_t flags;		/* IVT_FF_* */
	uint16_t count;		/* IVT_FT_CHARS: bytes; else 0 */
};

/* A registered event type: pass it to ivt_write(). */
struct ivt_event {
	struct ivt_region *region;
	uint32_t id;
};

/*
 * Describe an event type in the region's metadata area. Registering the
 * same name with the same fields again returns the existing id.
 * Names: [A-Za-z0-9_:.-], shorter than IVT_NAME_MAX. Fields: C
 * identifiers shorter than IVT_FIELD_NAME_MAX, unique, of a known type;
 * IVT_FT_CHARS needs a count of 1..4096, other types a count of 0.
 * Return: 0; -EINVAL bad name, field or count; -ENOSPC metadata area or
 * id space full; -EEXIST same name with different fields; -EPROTO the
 * metadata area was corrupted by another writer.
 */
int ivt_event_register(struct ivt_region *r, const char *name,
		       const struct ivt_field *fields, unsigned int nr_fields,
		       struct ivt_event *ev);

/* Close the calling thread's open packet so the reader sees it now. */
void ivt_flush(struct ivt_region *r);

/* Give the calling thread's channel back (also done at thread exit). */
void ivt_thread_release(struct ivt_region *r);

struct ivt_stats {
	uint64_t lost_full;		/* ring full (discard mode) */
	uint64_t lost_too_big;		/* event larger than a packet */
	uint64_t lost_nested;		/* written from a signal handler mid-write */
	uint64_t lost_no_channel;	/* more writing threads than channels */
};

/* Sum of the region's drop counters, all channels. */
void ivt_stats(struct ivt_region *r, struct ivt_stats *st);

/* ---- fast path ------------------------------------------------------ */

struct ivt_tls {
	struct ivt_region *region;	/* region `w` writes to, NULL if none */
	struct ivt_writer w;
};

extern __thread struct ivt_tls ivt__tls __attribute__((tls_model("initial-exec")));

/* Internal helpers, don't use directly: slow paths in src/thread.c, for
 * a thread's first event and for regions other than its fast-path one. */
uint8_t *ivt__reserve_other(const struct ivt_event *ev, uint32_t len);
void ivt__commit_other(const struct ivt_event *ev);
int ivt__write_other(const struct ivt_event *ev, const void *payload,
		     uint32_t len);

static inline uint64_t ivt_clock(void)
{
	return __builtin_ia32_rdtsc();
}

/*
 * Reserve `len` payload bytes for event `ev`; write them, then call
 * ivt_commit(). Returns NULL if the event was dropped (counted). Between
 * reserve and commit the thread must not write another event.
 */
static inline void *ivt_reserve(const struct ivt_event *ev, uint32_t len)
{
	struct ivt_tls *t = &ivt__tls;
	uint8_t *dst;

	if (ivt_unlikely(t->region != ev->region))
		return ivt__reserve_other(ev, len);
	if (ivt_unlikely(!ivt_writer_enter(&t->w)))
		return 0;
	dst = ivt_writer_reserve(&t->w, ivt_clock(), ev->id, len);
	if (ivt_unlikely(!dst))
		ivt_writer_exit(&t->w);
	return dst;
}

static inline void ivt_commit(const struct ivt_event *ev)
{
	struct ivt_tls *t = &ivt__tls;

	if (ivt_unlikely(t->region != ev->region)) {
		ivt__commit_other(ev);
		return;
	}
	ivt_writer_commit(&t->w);
	ivt_writer_exit(&t->w);
}

/*
 * Write one event whose payload is `len` bytes at `payload`.
 * Return: 0; -ENOBUFS the event was dropped (and counted).
 */
static inline int ivt_write(const struct ivt_event *ev, const void *payload,
			    uint32_t len)
{
	struct ivt_tls *t = &ivt__tls;
	uint8_t *dst;

	/* ivt_reserve() + ivt_commit(), with the region checked once: the
	 * memcpy could alias *ev, so ivt_commit() would have to reload it. */
	if (ivt_unlikely(t->region != ev->region))
		return ivt__write_other(ev, payload, len);
	if (ivt_unlikely(!ivt_writer_enter(&t->w)))
		return -ENOBUFS;
	dst = ivt_writer_reserve(&t->w, ivt_clock(), ev->id, len);
	if (ivt_unlikely(!dst)) {
		ivt_writer_exit(&t->w);
		return -ENOBUFS;
	}
	memcpy(dst, payload, len);
	ivt_writer_commit(&t->w);
	ivt_writer_exit(&t->w);
	return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* IVTRACE_H */
