/* SPDX-License-Identifier: MIT */
/*
 * event.c - event types: validate a description, find it among the
 * records already in the region's metadata area, or append a new record.
 *
 * Records are shared with other writers (other processes, the guest
 * kernel) and read by the host. The append protocol (docs/abi.md
 * "Metadata area"): take an id with fetch-add on next_event_id, space
 * with fetch-add on meta_tail, write `len`, then the body, then
 * store-release `commit`. Within this process registrations are
 * serialised by ivt__lock, so a name is never appended twice by us.
 */
#include <errno.h>
#include <string.h>

#include "internal.h"

#define IVT_CHARS_MAX		4096u

/* Bytes of the largest record: the one we would write is built in
 * private memory first (a u64 array, for the record's alignment). */
#define IVT_REC_MAX	(sizeof(struct ivt_meta_rec) + \
			 IVT_FIELDS_MAX * sizeof(struct ivt_meta_field))

/* ---- validation ------------------------------------------------------- */

static int ivt__event_name_ok(const char *s)
{
	size_t n = strnlen(s, IVT_NAME_MAX);
	size_t i;

	if (n == 0 || n >= IVT_NAME_MAX)
		return 0;
	for (i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == ':' ||
		      c == '.' || c == '-'))
			return 0;
	}
	return 1;
}

/* A C identifier: it becomes a CTF field name as is. */
static int ivt__field_name_ok(const char *s)
{
	size_t n, i;

	if (!s)
		return 0;
	n = strnlen(s, IVT_FIELD_NAME_MAX);
	if (n == 0 || n >= IVT_FIELD_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
		return 0;
	for (i = 0; i < n; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_'))
			return 0;
	}
	return 1;
}

static int ivt__is_integer(uint8_t type)
{
	return type >= IVT_FT_U8 && type <= IVT_FT_S64;
}

static int ivt__field_ok(const struct ivt_field *f)
{
	if (!ivt__field_name_ok(f->name) || f->type < 1 || f->type > IVT_FT_MAX)
		return 0;
	if (f->type == IVT_FT_CHARS ? f->count < 1 || f->count > IVT_CHARS_MAX
				    : f->count != 0)
		return 0;
	if (f->flags & ~(IVT_FF_HEX | IVT_FF_TID_COMM))
		return 0;
	if ((f->flags & IVT_FF_HEX) && !ivt__is_integer(f->type))
		return 0;
	if ((f->flags & IVT_FF_TID_COMM) && f->type != IVT_FT_U32 &&
	    f->type != IVT_FT_S32)
		return 0;
	return 1;
}

static int ivt__fields_ok(const struct ivt_field *f, unsigned int n)
{
	unsigned int i, j;

	if (n > IVT_FIELDS_MAX || (n && !f))
		return 0;
	for (i = 0; i < n; i++) {
		if (!ivt__field_ok(&f[i]))
			return 0;
		for (j = 0; j < i; j++)
			if (!strcmp(f[i].name, f[j].name))
				return 0;
	}
	return 1;
}

/* ---- the record ------------------------------------------------------- */

static void ivt__rec_build(struct ivt_meta_rec *b, const char *name,
			   const struct ivt_field *f, unsigned int n)
{
	unsigned int i;

	memset(b, 0, IVT_REC_MAX);
	b->len = ivt_meta_rec_size(n);
	b->kind = IVT_META_EVENT;
	b->nr_fields = (uint16_t)n;
	b->stream = IVT_STREAM_USER;
	strncpy(b->name, name, IVT_NAME_MAX - 1);
	for (i = 0; i < n; i++) {
		strncpy(b->fields[i].name, f[i].name, IVT_FIELD_NAME_MAX - 1);
		b->fields[i].type = f[i].type;
		b->fields[i].flags = f[i].flags;
		b->fields[i].count = f[i].count;
	}
}

/* Same event (stream class + name)? Then same description (fields)? */
static int ivt__rec_same_event(const struct ivt_meta_rec *a,
			       const struct ivt_meta_rec *b)
{
	return a->kind == b->kind && a->stream == b->stream &&
	       !memcmp(a->name, b->name, IVT_NAME_MAX);
}

static int ivt__rec_same_fields(const struct ivt_meta_rec *a,
				const struct ivt_meta_rec *b)
{
	return a->nr_fields == b->nr_fields &&
	       !memcmp(a->fields, b->fields,
		       b->nr_fields * sizeof(struct ivt_meta_field));
}

/*
 * Look for a committed record of the same event. Returns 1 with *id set
 * when one has the same fields, -EEXIST when one has different fields,
 * 0 when there is none, -EPROTO if the one found has an impossible id.
 * Everything read here is untrusted: a record whose length is not
 * plausible ends the walk.
 */
static int ivt__meta_find(struct ivt_region *r, const struct ivt_meta_rec *b,
			  uint32_t *id)
{
	uint8_t *meta = r->base + r->layout.meta_off;
	/* Relaxed: meta_tail only bounds the walk; each record is checked
	 * on its own below. */
	uint32_t end = ivt_read_once(r->hdr->meta_tail);
	uint32_t off, len;

	if (end > r->layout.meta_size)
		end = r->layout.meta_size;
	for (off = 0; end - off >= sizeof(struct ivt_meta_rec); off += len) {
		const struct ivt_meta_rec *rec = (const void *)(meta + off);
		/* Acquire: pairs with the store-release of commit in
		 * ivt__meta_append() (or another writer's): once we see it,
		 * len and the body are complete. */
		uint32_t commit = ivt_load_acquire(&rec->commit);

		/* Relaxed: len is written first by the appender, so even a
		 * record still in progress can be stepped over; 0 means its
		 * appender has not got that far, and the walk stops. */
		len = ivt_read_once(rec->len);
		if (len < sizeof(*rec) || len % 8 || len > end - off)
			break;
		if (commit != IVT_META_COMMIT || !ivt__rec_same_event(rec, b))
			continue;
		if (rec->nr_fields > IVT_FIELDS_MAX ||
		    ivt_meta_rec_size(rec->nr_fields) > len ||
		    !ivt__rec_same_fields(rec, b))
			return -EEXIST;
		*id = ivt_read_once(rec->event_id);
		return *id < IVT_EVENT_IDS_MAX ? 1 : -EPROTO;
	}
	return 0;
}

/* Take `n` from a shared fetch-add counter that must stay below `max`.
 * Checks first so a full area does not keep growing the counter (it is
 * only 32 bits). Relaxed: the counters order nothing (docs/abi.md). */
static int ivt__take(uint32_t *ctr, uint32_t n, uint32_t max, uint32_t *got)
{
	uint32_t v;

	if (n > max || ivt_read_once(*ctr) > max - n)
		return -ENOSPC;
	v = __atomic_fetch_add(ctr, n, __ATOMIC_RELAXED);
	if (v > max - n)
		return -ENOSPC;
	*got = v;
	return 0;
}

static int ivt__meta_append(struct ivt_region *r, struct ivt_meta_rec *b,
			    uint32_t *id)
{
	struct ivt_meta_rec *rec;
	uint32_t off, len = b->len;
	int err;

	/* The id first: if the space then runs out, a number is wasted,
	 * but no hole is left in the records (the host stops at a hole). */
	err = ivt__take(&r->hdr->next_event_id[IVT_STREAM_USER], 1,
			IVT_EVENT_IDS_MAX, &b->event_id);
	if (!err)
		err = ivt__take(&r->hdr->meta_tail, len, r->layout.meta_size, &off);
	if (err)
		return err;
	if (off % 8)		/* another writer broke the 8-byte rule */
		return -EPROTO;

	rec = (struct ivt_meta_rec *)(r->base + r->layout.meta_off + off);
	/* Relaxed, and first: lets a concurrent walker step over this
	 * record before it is committed (ivt__meta_find). */
	ivt_write_once(rec->len, len);
	memcpy((uint8_t *)rec + offsetof(struct ivt_meta_rec, kind),
	       (const uint8_t *)b + offsetof(struct ivt_meta_rec, kind),
	       len - offsetof(struct ivt_meta_rec, kind));
	/* Release: the body above is visible before the commit; pairs with
	 * the host's (and ivt__meta_find's) load-acquire of commit. */
	ivt_store_release(&rec->commit, IVT_META_COMMIT);
	*id = b->event_id;
	return 0;
}

int ivt_event_register(struct ivt_region *r, const char *name,
		       const struct ivt_field *fields, unsigned int nr_fields,
		       struct ivt_event *ev)
{
	uint64_t buf[IVT_REC_MAX / 8];
	struct ivt_meta_rec *b = (struct ivt_meta_rec *)buf;
	uint32_t id = 0;
	int err;

	if (!r || !name || !ev || !ivt__event_name_ok(name) ||
	    !ivt__fields_ok(fields, nr_fields))
		return -EINVAL;
	ivt__rec_build(b, name, fields, nr_fields);

	ivt__slow_enter();
	pthread_mutex_lock(&ivt__lock);
	err = r->dead ? -EINVAL : ivt__meta_find(r, b, &id);
	if (err == 0)
		err = ivt__meta_append(r, b, &id);
	pthread_mutex_unlock(&ivt__lock);
	ivt__slow_exit();
	if (err < 0)
		return err;
	ev->region = r;
	ev->id = id;
	return 0;
}
