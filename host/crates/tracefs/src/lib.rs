//! ivtrace-tracefs: Linux kernel events as tracefs hands them out, decoded.
//!
//! [`format`](mod@format) parses the kernel's own descriptions (`events/*/*/format`,
//! `events/header_page`), [`page`] walks the binary ring-buffer pages of
//! `per_cpu/cpuN/trace_pipe_raw`, and [`decode`] turns each record into an
//! event of a CTF class (LTTng's names and field layouts where LTTng has
//! them). Nothing here is specific to this host's kernel: the layouts come
//! from the format files, so pages of another kernel decode with that
//! kernel's files. [`host_events`] records this host's events for a recording
//! (the QEMU's vCPU threads, kvm_*) into the host trace, `DIR/host/`, with
//! a [`statedump`] of the QEMU's threads (tid, pid, name); [`kvmtsc`]
//! reads KVM's TSC offset changes for the versioned guest clock; [`ftrace_relay`]
//! decodes the guest's ftrace pages, relayed through the region, into the
//! guest's kernel trace with the guest's own format files.

pub mod decode;
pub mod format;
pub mod ftrace_relay;
pub mod host_events;
pub mod kvmtsc;
pub mod page;
pub mod statedump;
