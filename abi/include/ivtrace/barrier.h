/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * ivtrace/barrier.h - the memory-ordering vocabulary of the shared region.
 *
 * The same four names are used on every side and in docs/abi.md:
 *
 *   ivt_load_acquire(p)      later accesses stay after this load
 *   ivt_store_release(p, v)  earlier accesses stay before this store
 *   ivt_fence_release()      earlier stores stay before later stores
 *   ivt_fence_acquire()      earlier loads stay before later accesses
 *   ivt_full_fence()         store -> load ordering (Dekker: publish, then check)
 *   ivt_read_once / ivt_write_once   single untorn access, no ordering
 *   ivt_count_nested(p)      bump a drop counter from a nested writer
 *
 * In the kernel they map to the virt_* barriers: "virtual machine guests
 * should use virt_mb() rather than smp_mb() when synchronizing against a
 * (possibly SMP) host" (Documentation/memory-barriers.txt); they stay
 * correct in a CONFIG_SMP=n guest. In user space they are the C11 atomics
 * the Rust reader also uses. On x86 acquire/release compile to plain moves
 * plus a compiler barrier; only ivt_full_fence costs a locked instruction.
 */
#ifndef IVTRACE_BARRIER_H
#define IVTRACE_BARRIER_H

#ifdef __KERNEL__
#include <asm/barrier.h>
#include <linux/compiler.h>

#define ivt_load_acquire(p)		virt_load_acquire(p)
#define ivt_store_release(p, v)		virt_store_release(p, v)
#define ivt_fence_release()		virt_wmb()
#define ivt_fence_acquire()		virt_rmb()
#define ivt_full_fence()		virt_mb()
#define ivt_read_once(x)		READ_ONCE(x)
#define ivt_write_once(x, v)		WRITE_ONCE(x, v)
#define ivt_signal_fence()		barrier()
/* Counter bumped by a nested writer. In the kernel only an NMI nests in
 * the (interrupts-off) write path and NMIs do not nest, so a plain
 * read-modify-write cannot be interrupted by another bump. */
#define ivt_count_nested(p)		WRITE_ONCE(*(p), READ_ONCE(*(p)) + 1)

#else /* user space */

#define ivt_load_acquire(p)		__atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ivt_store_release(p, v)		__atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define ivt_fence_release()		__atomic_thread_fence(__ATOMIC_RELEASE)
#define ivt_fence_acquire()		__atomic_thread_fence(__ATOMIC_ACQUIRE)
#define ivt_full_fence()		__atomic_thread_fence(__ATOMIC_SEQ_CST)
#define ivt_read_once(x)		__atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ivt_write_once(x, v)		__atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
/* Orders against a signal handler on the same thread (compiler only). */
#define ivt_signal_fence()		__atomic_signal_fence(__ATOMIC_SEQ_CST)
/* Counter bumped by a nested writer: signal handlers can nest in each
 * other, so the bump must be one atomic instruction. */
#define ivt_count_nested(p)		__atomic_fetch_add((p), 1, __ATOMIC_RELAXED)

#endif

#endif /* IVTRACE_BARRIER_H */
