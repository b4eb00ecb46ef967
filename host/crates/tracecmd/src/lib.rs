//! ivtrace-tracecmd: recordings as trace-cmd files (docs/trace-cmd.md).
//!
//! `trace-cmd report`, `trace-cmd hist` and KernelShark read a guest and
//! its host as one session when they are given a host file and a guest
//! file that point at each other, as trace-cmd's own host-guest
//! recordings write them. This crate writes such files from what a
//! recording's sinks wrote (ivtrace-ctf's [`read`](ivtrace_ctf::read):
//! the CTF traces and the sidecar), never from the recording engine:
//!
//! - [`dat`]: the file container, trace.dat version 7 (written here: see
//!   docs/trace-cmd.md for why not through libtracecmd);
//! - [`pages`]: each CPU's ring-buffer pages, as the kernel lays them out,
//!   losses as missed-events marks;
//! - [`formats`]: the format files: the kernel's own (recorded in the
//!   sidecar, or built in for the native probes' events) and generated
//!   ones for everything else;
//! - [`target`]: what each event class becomes and how a record is written;
//! - [`side`]: one file being written (threads, CPUs, command lines);
//! - [`mod@export`]: the whole export, the host and guest options that tie
//!   the files together (GUEST, TRACEID, TIME_SHIFT).

pub mod dat;
pub mod export;
pub mod formats;
pub mod pages;
pub mod side;
pub mod target;

pub use export::{export, export_into, ExportError, Exported, GuestFile, Options, HOST_FILE};
