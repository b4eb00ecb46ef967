/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * ivtrace/payload.h - payload encoders: one implementation for every
 * writer (the kernel module's probes, libivtrace's callers).
 *
 * A payload is its event's fields in declaration order, byte-packed (no
 * alignment), little-endian (docs/abi.md "Events"). Each encoder stores one
 * field at `p` and returns the byte after it, so a probe reads
 *
 *	p = ivt_put_u32(p, tid);
 *	p = ivt_put_u8(p, prio);
 *
 * The caller has reserved room for the whole payload; nothing here checks
 * bounds. Freestanding: no libc, only compiler builtins.
 */
#ifndef IVTRACE_PAYLOAD_H
#define IVTRACE_PAYLOAD_H

#include "abi.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ivtrace payloads are little-endian; the encoders store native words"
#endif

/* Wire bytes of one field of each IVT_FT_* type. STRING: the NUL (its
 * text comes on top); BYTES: the u32 length (its bytes come on top);
 * CHARS: 0 (its `count` comes on top). ivtrace/kernel_events.h sums them. */
#define IVT_FT_U8_SIZE		1u
#define IVT_FT_U16_SIZE		2u
#define IVT_FT_U32_SIZE		4u
#define IVT_FT_U64_SIZE		8u
#define IVT_FT_S8_SIZE		1u
#define IVT_FT_S16_SIZE		2u
#define IVT_FT_S32_SIZE		4u
#define IVT_FT_S64_SIZE		8u
#define IVT_FT_STRING_SIZE	1u
#define IVT_FT_BYTES_SIZE	4u
#define IVT_FT_CHARS_SIZE	0u

static inline uint8_t *ivt_put_u8(uint8_t *p, uint8_t v)
{
	*p = v;
	return p + 1;
}

/* Unaligned stores: the payload is byte-packed. __builtin_memcpy of a
 * constant size compiles to one plain store on x86. */
static inline uint8_t *ivt_put_u16(uint8_t *p, uint16_t v)
{
	__builtin_memcpy(p, &v, sizeof(v));
	return p + sizeof(v);
}

static inline uint8_t *ivt_put_u32(uint8_t *p, uint32_t v)
{
	__builtin_memcpy(p, &v, sizeof(v));
	return p + sizeof(v);
}

static inline uint8_t *ivt_put_u64(uint8_t *p, uint64_t v)
{
	__builtin_memcpy(p, &v, sizeof(v));
	return p + sizeof(v);
}

/* IVT_FT_CHARS: exactly `n` bytes of NUL-padded text (e.g. a comm[16]). */
static inline uint8_t *ivt_put_chars(uint8_t *p, const char *s, uint32_t n)
{
	__builtin_memcpy(p, s, n);
	return p + n;
}

/* IVT_FT_STRING: `n` bytes of text (no NUL among them), then a NUL. */
static inline uint8_t *ivt_put_string(uint8_t *p, const char *s, uint32_t n)
{
	__builtin_memcpy(p, s, n);
	p[n] = 0;
	return p + n + 1;
}

/* IVT_FT_BYTES: the u32 length `n`, then the `n` bytes. */
static inline uint8_t *ivt_put_bytes(uint8_t *p, const void *b, uint32_t n)
{
	p = ivt_put_u32(p, n);
	__builtin_memcpy(p, b, n);
	return p + n;
}

#endif /* IVTRACE_PAYLOAD_H */
