// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_kapi.c - ivtrace_event_register() / ivtrace_write() for other
 * kernel modules (include/ivtrace_kapi.h).
 *
 * Registrations live in module memory, so ids are stable: id
 * IVTRACE_KAPI_FIRST_ID + i for the i-th distinct registration, published
 * again (in id order, after the 25 kernel events) whenever a region is
 * formatted. They are append-only: ivtrace_write() finds an event with a
 * load-acquire of the count and no lock.
 */
#include <linux/ctype.h>
#include <linux/export.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "ivtk.h"

struct ivtk_kapi_event {
	char name[IVT_NAME_MAX];
	unsigned int nr;
	u32 fixed_size;			/* payload bytes, U32_MAX when variable */
	struct ivtrace_field fields[IVT_FIELDS_MAX];
	char field_names[IVT_FIELDS_MAX][IVT_FIELD_NAME_MAX];
};

/* Written under ivtk_mutex; entries below ivtk_kapi_nr are immutable. */
static struct ivtk_kapi_event *ivtk_kapi[IVTRACE_KAPI_MAX];
static unsigned int ivtk_kapi_nr;	/* store-release / load-acquire */

static bool ivtk_ident_ok(const char *s, size_t max, bool colon)
{
	size_t i, n = strnlen(s, max);

	if (n == 0 || n >= max || isdigit(s[0]))
		return false;
	for (i = 0; i < n; i++)
		if (!isalnum(s[i]) && s[i] != '_' && !(colon && s[i] == ':'))
			return false;
	return true;
}

/* Bytes of a fixed-size field, 0 for STRING and BYTES. */
static u32 ivtk_field_size(const struct ivtrace_field *f)
{
	static const u8 size[IVT_FT_MAX + 1] = {
		[IVT_FT_U8] = 1, [IVT_FT_U16] = 2, [IVT_FT_U32] = 4,
		[IVT_FT_U64] = 8, [IVT_FT_S8] = 1, [IVT_FT_S16] = 2,
		[IVT_FT_S32] = 4, [IVT_FT_S64] = 8,
	};

	if (f->type == IVT_FT_CHARS)
		return f->count;
	return f->type <= IVT_FT_MAX ? size[f->type] : 0;
}

/* Check field names, types, flags and counts. Also used on the module's
 * own table at load.
 */
bool ivtk_fields_valid(const struct ivtrace_field *f, unsigned int nr)
{
	unsigned int i, j;

	if (nr > IVT_FIELDS_MAX || (nr && !f))
		return false;
	for (i = 0; i < nr; i++) {
		if (!f[i].name ||
		    !ivtk_ident_ok(f[i].name, IVT_FIELD_NAME_MAX, false))
			return false;
		if (f[i].type < IVT_FT_U8 || f[i].type > IVT_FT_MAX)
			return false;
		if (f[i].flags & ~(IVT_FF_HEX | IVT_FF_TID_COMM))
			return false;
		if ((f[i].flags & IVT_FF_TID_COMM) &&
		    f[i].type != IVT_FT_U32 && f[i].type != IVT_FT_S32)
			return false;
		if (f[i].type == IVT_FT_CHARS ?
		    !f[i].count || f[i].count > 4096 : f[i].count)
			return false;
		for (j = 0; j < i; j++)
			if (!strcmp(f[i].name, f[j].name))
				return false;
	}
	return true;
}

/* Payload bytes when every field has a fixed size, else U32_MAX. */
static u32 ivtk_fixed_size(const struct ivtrace_field *f, unsigned int nr)
{
	unsigned int i;
	u32 sz = 0;

	for (i = 0; i < nr; i++) {
		if (f[i].type == IVT_FT_STRING || f[i].type == IVT_FT_BYTES)
			return U32_MAX;
		sz += ivtk_field_size(&f[i]);
	}
	return sz;
}

static bool ivtk_same_fields(const struct ivtk_kapi_event *e,
			     const struct ivtrace_field *f, unsigned int nr)
{
	unsigned int i;

	if (e->nr != nr)
		return false;
	for (i = 0; i < nr; i++)
		if (strcmp(e->fields[i].name, f[i].name) ||
		    e->fields[i].type != f[i].type ||
		    e->fields[i].flags != f[i].flags ||
		    e->fields[i].count != f[i].count)
			return false;
	return true;
}

static int ivtk_kapi_publish(struct ivtk_dev *d, unsigned int i)
{
	const struct ivtk_kapi_event *e = ivtk_kapi[i];

	return ivtk_meta_publish(d, IVTRACE_KAPI_FIRST_ID + i,
				 IVTRACE_GROUP_ALWAYS, e->name, e->fields,
				 e->nr);
}

/* After a format: describe every registration again. Under ivtk_mutex. */
int ivtk_kapi_publish_all(struct ivtk_dev *d)
{
	unsigned int i;
	int ret = 0;

	lockdep_assert_held(&ivtk_mutex);
	for (i = 0; i < ivtk_kapi_nr && !ret; i++)
		ret = ivtk_kapi_publish(d, i);
	return ret;
}

int ivtrace_event_register(const char *name, const struct ivtrace_field *fields,
			   unsigned int nr, u32 *id)
{
	struct ivtk_kapi_event *e;
	unsigned int i;
	int ret = 0;

	if (!name || !ivtk_ident_ok(name, IVT_NAME_MAX, true) || !id ||
	    !ivtk_fields_valid(fields, nr))
		return -EINVAL;

	mutex_lock(&ivtk_mutex);
	for (i = 0; i < ivtk_kapi_nr; i++) {
		if (strcmp(ivtk_kapi[i]->name, name))
			continue;
		if (ivtk_same_fields(ivtk_kapi[i], fields, nr))
			*id = IVTRACE_KAPI_FIRST_ID + i;
		else
			ret = -EEXIST;
		goto out;
	}
	if (ivtk_kapi_nr == IVTRACE_KAPI_MAX) {
		ret = -ENOSPC;
		goto out;
	}
	e = kzalloc(sizeof(*e), GFP_KERNEL);
	if (!e) {
		ret = -ENOMEM;
		goto out;
	}
	strscpy(e->name, name, sizeof(e->name));
	e->nr = nr;
	for (i = 0; i < nr; i++) {
		e->fields[i] = fields[i];
		strscpy(e->field_names[i], fields[i].name, IVT_FIELD_NAME_MAX);
		e->fields[i].name = e->field_names[i];
	}
	e->fixed_size = ivtk_fixed_size(e->fields, nr);
	i = ivtk_kapi_nr;
	ivtk_kapi[i] = e;
	/* Pairs with the load-acquire in ivtk_kapi_event(). */
	smp_store_release(&ivtk_kapi_nr, i + 1);
	*id = IVTRACE_KAPI_FIRST_ID + i;
	if (ivtk_dev)
		ret = ivtk_kapi_publish(ivtk_dev, i);
out:
	mutex_unlock(&ivtk_mutex);
	return ret;
}
EXPORT_SYMBOL_GPL(ivtrace_event_register);

static const struct ivtk_kapi_event *ivtk_kapi_event(u32 id)
{
	/* Pairs with the store-release in ivtrace_event_register(). */
	unsigned int nr = smp_load_acquire(&ivtk_kapi_nr);

	if (id < IVTRACE_KAPI_FIRST_ID || id - IVTRACE_KAPI_FIRST_ID >= nr)
		return NULL;
	return ivtk_kapi[id - IVTRACE_KAPI_FIRST_ID];
}

/* Does @buf hold exactly one encoding of @e's fields? */
static bool ivtk_payload_ok(const struct ivtk_kapi_event *e, const u8 *buf,
			    u32 size)
{
	unsigned int i;
	u32 off = 0, n;
	const u8 *nul;

	if (e->fixed_size != U32_MAX)
		return size == e->fixed_size;
	for (i = 0; i < e->nr; i++) {
		switch (e->fields[i].type) {
		case IVT_FT_STRING:
			nul = memchr(buf + off, 0, size - off);
			if (!nul)
				return false;
			off = nul - buf + 1;
			break;
		case IVT_FT_BYTES:
			if (size - off < 4)
				return false;
			n = get_unaligned_le32(buf + off);
			off += 4;
			if (n > size - off)
				return false;
			off += n;
			break;
		default:
			n = ivtk_field_size(&e->fields[i]);
			if (n > size - off)
				return false;
			off += n;
		}
	}
	return off == size;
}

int ivtrace_write(u32 id, const void *buf, u32 size)
{
	const struct ivtk_kapi_event *e = ivtk_kapi_event(id);
	struct ivt_writer *w;
	unsigned long flags;
	int ret = -ENOBUFS;
	u8 *p;

	if (!e || (size && !buf) || !ivtk_payload_ok(e, buf, size))
		return -EINVAL;
	if (!READ_ONCE(ivtk_live))
		return -ENODEV;
	local_irq_save(flags);
	p = ivtk_reserve(&w, id, size);
	if (p) {
		memcpy(p, buf, size);
		ivtk_commit(w, p + size);
		ret = 0;
	}
	local_irq_restore(flags);
	return ret;
}
EXPORT_SYMBOL_GPL(ivtrace_write);

void ivtk_kapi_exit(void)
{
	unsigned int i;

	for (i = 0; i < ivtk_kapi_nr; i++)
		kfree(ivtk_kapi[i]);
	ivtk_kapi_nr = 0;
}
