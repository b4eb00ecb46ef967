/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ivtrace_kapi.h - write ivtrace events from other kernel modules.
 *
 * In the spirit of IVRing's ivring_write(id, buf, size): a module describes
 * an event type once, then writes pre-encoded payloads. Events go to the
 * kernel stream (stream class 0) on the calling CPU's channel, next to the
 * probes' events, with ids from IVTRACE_KAPI_FIRST_ID on. Ids stay the same
 * across a re-format of the region (PCI unbind/bind): ivtrace.ko remembers
 * every registration and publishes it again.
 *
 *	static const struct ivtrace_field f[] = {
 *		{ .name = "seq", .type = IVT_FT_U64 },
 *		{ .name = "msg", .type = IVT_FT_STRING },
 *	};
 *	u32 id;
 *	err = ivtrace_event_register("mydrv_thing", f, ARRAY_SIZE(f), &id);
 *	...
 *	err = ivtrace_write(id, buf, len);	(any context, NMI included)
 *
 * Payload encoding (docs/abi.md "Events"): the fields in declaration order,
 * byte-packed, little-endian. IVT_FT_STRING is text and a NUL,
 * IVT_FT_BYTES a u32 length then that many bytes, IVT_FT_CHARS exactly
 * `count` bytes. ivtrace_write() checks a payload against its fields
 * before it writes it, so a bad payload never reaches the ring (a packet
 * the host cannot parse would cost every event in it).
 *
 * Build: add the ABI headers to the include path, e.g.
 *	ccflags-y += -I$(IVTRACE)/abi/include -I$(IVTRACE)/guest/kmod/include
 * and KBUILD_EXTRA_SYMBOLS=$(IVTRACE)/guest/kmod/Module.symvers.
 */
#ifndef IVTRACE_KAPI_H
#define IVTRACE_KAPI_H

#include <linux/types.h>
#include <ivtrace/abi.h>	/* IVT_FT_*, IVT_FF_*, IVT_NAME_MAX, ... */

/* Event ids below this are the module's own kernel events (docs/abi.md). */
#define IVTRACE_KAPI_FIRST_ID	52u
/* Registrations ivtrace.ko keeps (ids IVTRACE_KAPI_FIRST_ID + 0..N-1). */
#define IVTRACE_KAPI_MAX	128u

/*
 * Event groups: the bits of the events= module parameter and of the
 * IVT_CMD_ENABLE/DISABLE argument, and the `group` of the kernel events'
 * metadata records. Events outside every group (state dump, this API)
 * carry IVTRACE_GROUP_ALWAYS.
 */
#define IVTRACE_GROUP_SCHED	0u
#define IVTRACE_GROUP_IRQ	1u
#define IVTRACE_GROUP_TIMER	2u
#define IVTRACE_GROUP_KMEM	3u
#define IVTRACE_GROUP_SYSCALL	4u
#define IVTRACE_GROUP_PRINTK	5u
#define IVTRACE_NR_GROUPS	6u
#define IVTRACE_GROUP_ALWAYS	0xffffffffu

/* One field of an event type (same shape as libivtrace's struct ivt_field). */
struct ivtrace_field {
	const char *name;	/* [A-Za-z_][A-Za-z0-9_]*, < IVT_FIELD_NAME_MAX */
	u8 type;		/* IVT_FT_* */
	u8 flags;		/* IVT_FF_* */
	u16 count;		/* IVT_FT_CHARS: bytes; else 0 */
};

/**
 * ivtrace_event_register() - describe an event type of the kernel stream
 * @name: event name, [A-Za-z_][A-Za-z0-9_:]*, shorter than IVT_NAME_MAX
 * @fields: its fields, in payload order
 * @nr: number of fields, at most IVT_FIELDS_MAX
 * @id: where the event id is stored
 *
 * May sleep. Registering the same name with the same fields again returns
 * the id it got the first time. Works whether or not an ivshmem device is
 * bound; the description reaches the region when one is.
 *
 * Return:
 *  0 on success.
 * -EINVAL bad name, field, type or count.
 * -EEXIST the name is registered with different fields.
 * -ENOSPC IVTRACE_KAPI_MAX registrations reached, or the region's metadata
 *         area is full (the id is valid; events are written but the host
 *         cannot decode them).
 * -ENOMEM out of memory.
 */
int ivtrace_event_register(const char *name, const struct ivtrace_field *fields,
			   unsigned int nr, u32 *id);

/**
 * ivtrace_write() - write one event on the calling CPU's channel
 * @id: an id from ivtrace_event_register()
 * @buf: the encoded payload
 * @size: its length in bytes
 *
 * Lock-free and non-blocking; callable from any context, NMI included (an
 * NMI that interrupts a write on the same CPU is dropped and counted).
 *
 * Return:
 *  0 on success.
 * -EINVAL unknown id, or a payload that does not match the fields.
 * -ENODEV no ivshmem region is bound.
 * -ENOBUFS the event was dropped and counted (ring full in discard mode,
 *          larger than a packet, or nested in another write on this CPU).
 */
int ivtrace_write(u32 id, const void *buf, u32 size);

/**
 * ivtrace_hypercall() - an event the host sees the moment it happens
 * @nr: the event's number, IVT_HC_EVENT_FIRST..IVT_HC_EVENT_LAST
 * @a0: first argument (RBX)
 * @a1: second argument (RCX)
 * @a2: third argument (RDX)
 * @a3: fourth argument (RSI)
 *
 * KVM guests only: a hypercall, traced by the host's kvm:kvm_hypercall,
 * which ivtrace aggregates with the exit and entry around it into one
 * `vm_hypercall` event (nr, arguments, vCPU, guest rip, exit overhead)
 * on the guest's timeline (docs/kvm.md "The hypercall channel"). Costs a
 * VM exit: for rare, synchronous events; the rings are for the rest.
 * Without KVM (TCG) it does nothing: the instruction would fault there.
 * Any context.
 *
 * Return:
 *  0 on success (the hypercall was made).
 * -ENODEV not a KVM guest (kvm_para_available() is false).
 * -EINVAL @nr outside ivtrace's event range.
 */
int ivtrace_hypercall(unsigned long nr, unsigned long a0, unsigned long a1,
		      unsigned long a2, unsigned long a3);

#endif /* IVTRACE_KAPI_H */
