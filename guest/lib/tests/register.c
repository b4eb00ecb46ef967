/* SPDX-License-Identifier: MIT */
/*
 * register: event registration. The same name and fields give the same
 * id; the same name with other fields is -EEXIST; bad names, fields,
 * counts and flags are -EINVAL; a full metadata area and a full id space
 * are -ENOSPC. Records in the region say exactly what was registered.
 */
#include <string.h>

#include "t.h"
#include "walker.h"

static const struct ivt_field three[] = {
	{ "a", IVT_FT_U8, 0, 0 }, { "comm", IVT_FT_CHARS, 0, 16 },
	{ "tid", IVT_FT_U32, IVT_FF_TID_COMM, 0 },
};

static void invalid_names(struct ivt_region *r)
{
	static const char *bad[] = {
		"", "a b", "a/b", "a\"b", "caf\xc3\xa9", "x\n",
		"0123456789012345678901234567890123456789012345678901234567890123",
	};
	struct ivt_event ev;
	unsigned int i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		T_EQ(ivt_event_register(r, bad[i], three, 3, &ev), -EINVAL);
	/* 63 characters and every allowed one are fine. */
	T_OK(ivt_event_register(r, "012345678901234567890123456789012345678901234567890123456789012", NULL, 0, &ev));
	T_OK(ivt_event_register(r, "Az09_:.-", NULL, 0, &ev));
	T_EQ(ivt_event_register(r, NULL, NULL, 0, &ev), -EINVAL);
	T_EQ(ivt_event_register(r, "x", NULL, 1, &ev), -EINVAL);
}

static void invalid_fields(struct ivt_region *r)
{
	static const struct ivt_field bad[][2] = {
		{ { "1a", IVT_FT_U8, 0, 0 } },
		{ { "", IVT_FT_U8, 0, 0 } },
		{ { NULL, IVT_FT_U8, 0, 0 } },
		{ { "a-b", IVT_FT_U8, 0, 0 } },
		{ { "abcdefghijabcdefghijabcdefghij12", IVT_FT_U8, 0, 0 } }, /* 32 */
		{ { "a", 0, 0, 0 } },
		{ { "a", IVT_FT_MAX + 1, 0, 0 } },
		{ { "a", IVT_FT_CHARS, 0, 0 } },
		{ { "a", IVT_FT_CHARS, 0, 4097 } },
		{ { "a", IVT_FT_U32, 0, 4 } },
		{ { "a", IVT_FT_STRING, IVT_FF_HEX, 0 } },
		{ { "a", IVT_FT_U64, IVT_FF_TID_COMM, 0 } },
		{ { "a", IVT_FT_U32, 0x80, 0 } },
		{ { "a", IVT_FT_U8, 0, 0 }, { "a", IVT_FT_U16, 0, 0 } },
	};
	static struct ivt_field many[IVT_FIELDS_MAX + 1];
	static char names[IVT_FIELDS_MAX + 1][8];
	struct ivt_event ev;
	unsigned int i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		T_EQ(ivt_event_register(r, "bad:f", bad[i], bad[i][1].name ? 2 : 1, &ev),
		     -EINVAL);
	for (i = 0; i <= IVT_FIELDS_MAX; i++) {
		snprintf(names[i], sizeof(names[i]), "f%u", i);
		many[i] = (struct ivt_field){ names[i], IVT_FT_U8, 0, 0 };
	}
	T_EQ(ivt_event_register(r, "many", many, IVT_FIELDS_MAX + 1, &ev), -EINVAL);
	T_OK(ivt_event_register(r, "many", many, IVT_FIELDS_MAX, &ev));
	T_OK(ivt_event_register(r, "long:ok", (struct ivt_field[]){
		{ "abcdefghijabcdefghijabcdefghij1", IVT_FT_CHARS, 0, 4096 } }, 1, &ev));
}

static void dedupe(struct ivt_region *r, const char *path)
{
	struct ivt_field other[3];
	struct ivt_event e1, e2, e3;
	struct ivt_region *r2;
	struct w_region wr;
	int before;

	T_OK(w_open(&wr, path) ? -EIO : 0);
	before = w_load_meta(&wr);
	if (before < 0)
		t_fail(__FILE__, __LINE__, "meta: %s", w_error);
	T_OK(ivt_event_register(r, "dup:x", three, 3, &e1));
	T_OK(ivt_event_register(r, "dup:x", three, 3, &e2));
	T_EQ(e1.id, e2.id);
	T_EQ(w_load_meta(&wr), before + 1);		/* one record only */
	memcpy(other, three, sizeof(other));
	other[1].count = 15;
	T_EQ(ivt_event_register(r, "dup:x", other, 3, &e3), -EEXIST);
	T_EQ(ivt_event_register(r, "dup:x", three, 2, &e3), -EEXIST);
	T_EQ(w_load_meta(&wr), before + 1);

	/* Another handle (as another process would) finds it too. */
	T_OK(ivt_region_attach(path, &r2));
	T_OK(ivt_event_register(r2, "dup:x", three, 3, &e3));
	T_EQ(e3.id, e1.id);
	T_CHECK(e3.region == r2);
	ivt_region_close(r2);

	T_CHECK(!strcmp(wr.types[e1.id].name, "dup:x"));
	T_EQ(wr.types[e1.id].nr_fields, 3);
	T_CHECK(!strcmp(wr.types[e1.id].fields[1].name, "comm"));
	T_EQ(wr.types[e1.id].fields[1].type, IVT_FT_CHARS);
	T_EQ(wr.types[e1.id].fields[1].count, 16);
	T_EQ(wr.types[e1.id].fields[2].flags, IVT_FF_TID_COMM);
	w_close(&wr);
}

/* A 4 KiB metadata area holds exactly what fits, and a refused record
 * leaves meta_tail where it was. */
static void meta_full(void)
{
	struct ivt_region_opts o = { .channels = 1, .subbufs = 2,
				     .subbuf_size = 4096, .meta_size = 4096 };
	const char *path = t_path("regfull");
	uint32_t fit = 4096 / ivt_meta_rec_size(3), i;
	struct ivt_region *r;
	struct ivt_event ev;
	struct w_region wr;
	char name[32];

	T_OK(ivt_region_create(path, &o, &r));
	for (i = 0; i < fit; i++) {
		snprintf(name, sizeof(name), "full:%u", i);
		T_OK(ivt_event_register(r, name, three, 3, &ev));
	}
	T_EQ(ivt_event_register(r, "full:last", three, 3, &ev), -ENOSPC);
	T_EQ(ivt_event_register(r, "full:0", three, 3, &ev), 0);	/* still found */
	/* The refused record took no space: a smaller one still fits in
	 * the 4096 - fit * 208 bytes left, once. */
	T_OK(ivt_event_register(r, "full:small", NULL, 0, &ev));
	T_EQ(ivt_event_register(r, "full:small2", NULL, 0, &ev), -ENOSPC);
	T_OK(w_open(&wr, path) ? -EIO : 0);
	T_EQ(w_load_meta(&wr), fit + 1);
	T_CHECK(wr.hdr->meta_tail <= 4096);
	w_close(&wr);
	ivt_region_close(r);
}

/* Ids are per stream class and stop at IVT_EVENT_IDS_MAX. */
static void ids_full(void)
{
	struct ivt_region_opts o = { .channels = 1, .subbufs = 2,
				     .subbuf_size = 4096, .meta_size = 1 << 20 };
	const char *path = t_path("regids");
	struct ivt_region *r;
	struct ivt_event ev;
	char name[32];
	uint32_t i;

	T_OK(ivt_region_create(path, &o, &r));
	for (i = 0; i < IVT_EVENT_IDS_MAX; i++) {
		snprintf(name, sizeof(name), "id:%u", i);
		T_OK(ivt_event_register(r, name, NULL, 0, &ev));
		T_EQ(ev.id, i);
	}
	T_EQ(ivt_event_register(r, "id:one-more", NULL, 0, &ev), -ENOSPC);
	ivt_region_close(r);
}

int main(void)
{
	const char *path = t_path("register");
	struct ivt_region *r = t_create(path, 1, 2, 4096, IVT_MODE_DISCARD);

	invalid_names(r);
	invalid_fields(r);
	dedupe(r, path);
	ivt_region_close(r);
	meta_full();
	ids_full();
	return T_PASS;
}
