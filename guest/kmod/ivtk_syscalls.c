// SPDX-License-Identifier: GPL-2.0
/*
 * ivtk_syscalls.c - the sys_enter and sys_exit probes.
 *
 * The host writes system calls as lttng-modules does (syscall_entry_<name>
 * with named, typed fields); the module writes only what those fields need,
 * as ivtrace/syscalls_x86_64.h says per number (docs/abi.md "System
 * calls"): on entry the arguments and the user strings among them, on exit
 * the return value, the arguments LTTng repeats there and, for pipe and
 * socketpair, the two descriptors the call wrote.
 *
 * User memory is read without sleeping, with page faults disabled: a
 * string or a pair of descriptors that cannot be read without a fault is
 * written empty (zeroed). Since v6.13 these tracepoints may run
 * preemptible (they are "faultable", called under RCU tasks trace), so
 * sys_enter pins itself (preemption off) before it takes this CPU's
 * string buffer, and keeps it until the event is written.
 */
#include <linux/compat.h>
#include <linux/kernel.h>
#include <linux/percpu.h>
#include <linux/sched.h>
#include <linux/uaccess.h>
#include <asm/syscall.h>

#include <ivtrace/syscalls_x86_64.h>

#include "ivtk.h"

/* Bytes of one user string, its NUL included (longer ones are cut). */
#define IVTK_SYS_STR_MAX	256u
/* User strings of one call at most (mount has three). */
#define IVTK_SYS_STRS_MAX	3u

/*
 * The strings of the current sys_enter on this CPU, copied before the
 * event is reserved so that the reservation has their exact length. Per
 * CPU is enough: sys_enter holds it with preemption off (no other task's
 * sys_enter runs on this CPU meanwhile) and never nests in an interrupt.
 */
struct ivtk_sys_strings {
	char buf[IVTK_SYS_STR_MAX * IVTK_SYS_STRS_MAX];
};

static DEFINE_PER_CPU(struct ivtk_sys_strings, ivtk_sys_strings);

static __always_inline const struct ivt_syscall_wire *ivtk_sys_wire(long id)
{
	static const struct ivt_syscall_wire unknown = IVT_SYSCALL_UNKNOWN;

	if (id < 0 || id >= IVT_SYSCALLS_NR)
		return &unknown;
	return &ivt_syscalls_x86_64[id];
}

/*
 * The host names syscalls from the x86-64 table; a 32-bit (ia32 or x32
 * compat) syscall number means something else there, so those are not
 * recorded.
 */
static __always_inline bool ivtk_native_syscall(void)
{
	return !in_compat_syscall();
}

/* Copy the user string at @uaddr to @dst (at most IVTK_SYS_STR_MAX bytes
 * with its NUL) without sleeping. Returns the bytes used, NUL included: 1
 * (an empty string) when it cannot be read.
 */
static u32 ivtk_copy_user_string(char *dst, unsigned long uaddr)
{
	long n;

	pagefault_disable();
	n = strncpy_from_user(dst, (const char __user *)uaddr,
			      IVTK_SYS_STR_MAX - 1);
	pagefault_enable();
	if (n < 0)
		n = 0;
	dst[n] = 0;
	return n + 1;
}

/* The user strings of @sw's string arguments, one after the other. */
static u32 ivtk_sys_copy_strings(const struct ivt_syscall_wire *sw,
				 const unsigned long *args, char *buf)
{
	unsigned int i, nr = 0;
	u32 len = 0;

	for (i = 0; i < sw->nargs && nr < IVTK_SYS_STRS_MAX; i++) {
		if (!(sw->str_mask & BIT(i)))
			continue;
		len += ivtk_copy_user_string(buf + len, args[i]);
		nr++;
	}
	return len;
}

void ivtk_sys_enter(void *data, struct pt_regs *regs, long id)
{
	const struct ivt_syscall_wire *sw = ivtk_sys_wire(id);
	unsigned long args[6];
	struct ivt_writer *w;
	unsigned long flags;
	unsigned int i;
	u32 slen = 0;
	char *strs;
	u8 *p;

	if (!ivtk_native_syscall())
		return;
	syscall_get_arguments(current, regs, args);
	/* Pinned from here: the string buffer is this CPU's until the
	 * event that carries its strings is committed.
	 */
	preempt_disable();
	strs = this_cpu_ptr(&ivtk_sys_strings)->buf;
	if (sw->str_mask)
		slen = ivtk_sys_copy_strings(sw, args, strs);
	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_SYSCALL_ENTRY,
			 IVT_KEV_SYSCALL_ENTRY_SIZE + 8 * sw->nargs + slen);
	if (p) {
		p = ivt_put_u16(p, id);
		p = ivt_put_u32(p, 8 * sw->nargs);
		for (i = 0; i < sw->nargs; i++)
			p = ivt_put_u64(p, args[i]);
		p = ivt_put_bytes(p, strs, slen);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
	preempt_enable();
}

/* The two u32 the argument @uaddr points to, or zeros. */
static void ivtk_sys_copy_pair(u32 *pair, unsigned long uaddr)
{
	if (copy_from_user_nofault(pair, (const void __user *)uaddr,
				   IVT_SYSCALL_DATA_SIZE))
		memset(pair, 0, IVT_SYSCALL_DATA_SIZE);
}

void ivtk_sys_exit(void *data, struct pt_regs *regs, long ret)
{
	long id = syscall_get_nr(current, regs);
	const struct ivt_syscall_wire *sw = ivtk_sys_wire(id);
	unsigned int nout = hweight8(sw->out_mask);
	u32 dlen = sw->data_arg ? IVT_SYSCALL_DATA_SIZE : 0;
	unsigned long args[6];
	struct ivt_writer *w;
	unsigned long flags;
	u32 pair[2] = { 0, 0 };
	unsigned int i;
	u8 *p;

	if (!ivtk_native_syscall() || id < 0)
		return;
	if (nout || dlen)
		syscall_get_arguments(current, regs, args);
	if (dlen)
		ivtk_sys_copy_pair(pair, args[sw->data_arg - 1]);
	local_irq_save(flags);
	p = ivtk_reserve(&w, IVT_KEV_SYSCALL_EXIT,
			 IVT_KEV_SYSCALL_EXIT_SIZE + 8 * nout + dlen);
	if (p) {
		p = ivt_put_u16(p, id);
		p = ivt_put_u64(p, ret);
		p = ivt_put_u32(p, 8 * nout);
		for (i = 0; i < ARRAY_SIZE(args); i++)
			if (sw->out_mask & BIT(i))
				p = ivt_put_u64(p, args[i]);
		p = ivt_put_bytes(p, pair, dlen);
		ivtk_commit(w, p);
	}
	local_irq_restore(flags);
}
