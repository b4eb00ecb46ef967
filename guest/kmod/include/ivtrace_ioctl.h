/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * ivtrace_ioctl.h - /dev/ivtrace requests of the ftrace relay
 * (guest/ftrace/ivtrace-ftrace.c), docs/ftrace.md "The relay".
 *
 * The relay maps the region like any libivtrace program and writes whole
 * ftrace pages into the IVT_STREAM_FTRACE channels itself. What only the
 * module may do goes through these requests: own the ftrace channels (one
 * relay at a time), take the host's IVT_CMD_FTRACE requests (checked by
 * the module first) and answer them, append ftrace format records to the
 * metadata area, and ring the host's doorbell.
 */
#ifndef IVTRACE_IOCTL_H
#define IVTRACE_IOCTL_H

#ifdef __KERNEL__
#include <linux/ioctl.h>
#include <linux/types.h>
#else
#include <sys/ioctl.h>
#include <linux/types.h>
#endif

#include <ivtrace/abi.h>

/* The relay owns the ftrace channels until it closes its file. -EBUSY if
 * another relay does, -ENODEV if the region has none (ftrace=0).
 */
#define IVTRACE_IOC_RELAY_ATTACH	_IO('v', 0x40)

/* The next host request, waiting up to timeout_ms for one. Returns 0 with
 * the request, -ETIMEDOUT if none came, -EPIPE if this file does not own
 * the relay.
 */
struct ivtrace_relay_req {
	__u64 seq;				/* out: the host's command number */
	__u32 timeout_ms;			/* in */
	__u32 len;				/* out: bytes of text */
	char  text[IVT_CTL_REQ_MAX];		/* out, no NUL */
};

#define IVTRACE_IOC_RELAY_WAIT		_IOWR('v', 0x41, struct ivtrace_relay_req)

/* The answer to request seq (ignored if the host moved on). */
struct ivtrace_relay_ans {
	__u64 seq;
	__s32 status;				/* 0 or -errno */
	__u32 flags;				/* IVT_CTL_RESP_* */
	__u32 len;				/* bytes of text */
	__u32 reserved;
	char  text[IVT_CTL_RESP_MAX];
};

#define IVTRACE_IOC_RELAY_DONE		_IOW('v', 0x42, struct ivtrace_relay_ans)

/* Append one ftrace description file to the metadata area
 * (struct ivt_ftrace_rec). -ENOSPC when the area is full.
 */
struct ivtrace_relay_format {
	__u32 what;				/* IVT_FTRACE_HEADER_PAGE or _FORMAT */
	__u32 len;				/* bytes at text, <= IVT_FTRACE_TEXT_MAX */
	char  system[IVT_FTRACE_SYSTEM_MAX];	/* NUL-padded */
	__u64 text;				/* user pointer */
};

#define IVTRACE_IOC_RELAY_FORMAT	_IOW('v', 0x43, struct ivtrace_relay_format)

/* Ring the host's doorbell (a packet closed while host_sleeping was set);
 * nothing on an ivshmem-plain device.
 */
#define IVTRACE_IOC_DOORBELL		_IO('v', 0x44)

#endif /* IVTRACE_IOCTL_H */
