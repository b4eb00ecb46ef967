// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_names.c - the thread name table: who is called what, kept current
 * in the region outside the rings.
 *
 * In flight-recorder mode the rings keep only the newest packets, so the
 * state dump and the fork/exec events that named long-lived threads are
 * overwritten first, and a guest that crashed cannot dump again. The table
 * (a struct ivt_names_rec in the metadata area, docs/abi.md "Thread name
 * table") holds the latest name of every thread the module has seen named,
 * for the host to read when it salvages the region.
 *
 * An entry's home is tid % IVTK_NAMES_NR; a thread takes the first of
 * IVTK_NAMES_WINDOW slots from there that holds it, else a free one, else
 * the one named longest ago among those of freed threads, else the one
 * named longest ago. Entries change only inside their seqcount (abi.h).
 * Callers: the fork, exec and rename probes, the state dump (process
 * context, any CPU), sched_process_free (marks the entry dead).
 */
#include <linux/atomic.h>
#include <linux/kernel.h>
#include <linux/log2.h>
#include <linux/sched.h>
#include <linux/string.h>

#include "ivtk.h"

#define IVTK_NAMES_WINDOW	8u
static_assert((IVTK_NAMES_NR & (IVTK_NAMES_NR - 1)) == 0,
	      "entries are found by tid modulo a power of two");

/* The table while a region is live, else NULL (ivtk_names_start/stop). */
static struct ivt_names_rec *ivtk_names;

/* Take entry @e for writing: its seq from even to odd. False if another
 * CPU holds it (the caller gives its update up).
 */
static bool ivtk_name_lock(struct ivt_name_entry *e, u32 *seq)
{
	u32 s = READ_ONCE(e->seq);

	/* The cmpxchg orders the odd seq before every store to the entry
	 * (a locked instruction; on x86 stores are seen in order anyway), so
	 * the host's re-read of seq after its copy (acquire fence) sees it
	 * change if the copy raced with us.
	 */
	if ((s & 1) || cmpxchg(&e->seq, s, s + 1) != s)
		return false;
	ivt_fence_release();
	*seq = s + 1;
	return true;
}

static void ivtk_name_unlock(struct ivt_name_entry *e, u32 seq)
{
	/* Pairs with the host's load-acquire of seq before its copy. */
	ivt_store_release(&e->seq, seq + 1);
}

/* Whether @a is a better slot to take than @b (see the top). */
static bool ivtk_name_better(const struct ivt_name_entry *a,
			     const struct ivt_name_entry *b)
{
	u32 ta = READ_ONCE(a->tid), tb = READ_ONCE(b->tid);

	if (!ta || !tb)
		return !ta && tb;
	if ((ta & IVT_NAME_DEAD) != (tb & IVT_NAME_DEAD))
		return ta & IVT_NAME_DEAD;
	return READ_ONCE(a->ts) < READ_ONCE(b->ts);
}

/* The slot for @tid in @t: the one that holds it, else the best to take. */
static struct ivt_name_entry *ivtk_name_slot(struct ivt_names_rec *t, u32 tid)
{
	struct ivt_name_entry *best = NULL;
	u32 i;

	for (i = 0; i < IVTK_NAMES_WINDOW; i++) {
		/* IVTK_NAMES_NR, never the shared nr_entries: shared memory
		 * is not read back as an index.
		 */
		struct ivt_name_entry *e =
			&t->entries[(tid + i) & (IVTK_NAMES_NR - 1)];

		if ((READ_ONCE(e->tid) & ~IVT_NAME_DEAD) == tid)
			return e;
		if (!best || ivtk_name_better(e, best))
			best = e;
	}
	return best;
}

/* Thread @tid is called @comm (at most TASK_COMM_LEN bytes) from now on. */
void ivtk_name_set(u32 tid, const char *comm)
{
	struct ivt_names_rec *t = READ_ONCE(ivtk_names);
	char buf[TASK_COMM_LEN];
	struct ivt_name_entry *e;
	u32 seq;

	if (!t || !tid)
		return;
	strscpy_pad(buf, comm, sizeof(buf));
	e = ivtk_name_slot(t, tid);
	if (!ivtk_name_lock(e, &seq)) {
		ivtk_fetch_add64(&t->skipped, 1);
		return;
	}
	WRITE_ONCE(e->tid, tid);
	WRITE_ONCE(e->ts, rdtsc());
	memcpy(e->comm, buf, sizeof(buf));
	ivtk_name_unlock(e, seq);
	ivtk_fetch_add64(&t->updates, 1);
}

/* Thread @tid was freed: its entry may be taken first, its name stays. */
void ivtk_name_dead(u32 tid)
{
	struct ivt_names_rec *t = READ_ONCE(ivtk_names);
	struct ivt_name_entry *e;
	u32 seq;

	if (!t || !tid)
		return;
	e = ivtk_name_slot(t, tid);
	if (READ_ONCE(e->tid) != tid || !ivtk_name_lock(e, &seq))
		return;
	if (READ_ONCE(e->tid) == tid)
		WRITE_ONCE(e->tid, tid | IVT_NAME_DEAD);
	ivtk_name_unlock(e, seq);
}

/*
 * Append the table to @d's metadata area (after the event records, as
 * ivtk_meta_publish() appends those) and start using it. Process context,
 * before the region goes live.
 */
int ivtk_names_start(struct ivtk_dev *d)
{
	struct ivt_region_hdr *h = d->shm;
	u32 len = sizeof(struct ivt_names_rec) +
		  IVTK_NAMES_NR * sizeof(struct ivt_name_entry);
	struct ivt_names_rec *t;
	u32 off;

	off = ivtk_fetch_add32(&h->meta_tail, len);
	if (off > d->layout.meta_size || len > d->layout.meta_size - off) {
		pr_warn("ivtrace: no room for the thread name table in the metadata area; a salvaged trace may miss thread names\n");
		return -ENOSPC;
	}
	t = d->shm + d->layout.meta_off + off;
	memset(t, 0, len);
	t->len = len;
	t->kind = IVT_META_NAMES;
	t->nr_entries = IVTK_NAMES_NR;
	/* Pairs with the host's load-acquire of commit (MetaParser, and
	 * the host reader's read_thread_names(), names.rs).
	 */
	ivt_store_release(&t->commit, IVT_META_COMMIT);
	WRITE_ONCE(ivtk_names, t);
	return 0;
}

/* Stop writing to the table (the region is going away). Callers make sure
 * no probe still runs (tracepoint_synchronize_unregister()).
 */
void ivtk_names_stop(void)
{
	WRITE_ONCE(ivtk_names, NULL);
}
