/* SPDX-License-Identifier: MIT */
/*
 * kernel_events.c - print the kernel stream's event table
 * (ivtrace/kernel_events.h) as JSON.
 *
 * `make -C abi kernel-events` writes abi/kernel_events.json from this
 * program (and docs/abi.md's table from that file); `make -C abi test`
 * fails if either committed copy is stale, and the host's test model of the
 * kernel events is checked against the JSON by a Rust unit test.
 */
#include <stdio.h>
#include <string.h>
#include <ctype.h>
#include <ivtrace/kernel_events.h>

static const char *type_name(const char *token)
{
	static char buf[16];
	size_t i;

	/* "U32" -> "u32", "CHARS" -> "chars": the host's FieldType names. */
	for (i = 0; token[i] && i < sizeof(buf) - 1; i++)
		buf[i] = (char)tolower((unsigned char)token[i]);
	buf[i] = 0;
	return buf;
}

static const char *flag_name(const char *token)
{
	if (!strcmp(token, "HEX"))
		return "hex";
	if (!strcmp(token, "TID"))
		return "tid_comm";
	return "";
}

static int first_event = 1, first_field;

/* A JSON string body: `"` and `\` escaped (the doc texts may quote). */
static void json_text(const char *s)
{
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			putchar('\\');
		putchar(*s);
	}
}

static void event(int id, const char *name, const char *group, const char *doc,
		  unsigned int size)
{
	char g[16];
	size_t i;

	for (i = 0; group[i] && i < sizeof(g) - 1; i++)
		g[i] = (char)tolower((unsigned char)group[i]);
	g[i] = 0;
	printf("%s\n  {\"id\": %d, \"name\": \"%s\", \"group\": \"%s\", "
	       "\"payload_size\": %u, \"host\": \"", first_event ? "" : ",", id,
	       name, g, size);
	json_text(doc);
	printf("\", \"fields\": [");
	first_event = 0;
	first_field = 1;
}

static void field(const char *name, const char *type, const char *flag,
		  unsigned int count)
{
	printf("%s\n    {\"name\": \"%s\", \"type\": \"%s\", \"flag\": \"%s\", "
	       "\"count\": %u}", first_field ? "" : ",", name, type_name(type),
	       flag_name(flag), count);
	first_field = 0;
}

static void end(void)
{
	printf("\n  ]}");
}

#define EV(id, name, group, doc) \
	event(IVT_KEV_##id, #name, #group, doc, IVT_KEV_##id##_SIZE);
#define F(name, type, flag, count)	field(#name, #type, #flag, count);
#define END(id)				end();

int main(void)
{
	printf("[");
	IVT_KERNEL_EVENTS(EV, F, END)
	printf("\n]\n");
	return 0;
}
