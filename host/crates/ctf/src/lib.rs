//! ivtrace-ctf: writes what ivtrace-region validated as CTF 1.8 traces.
//!
//! [`trace::CtfWriter`] is a [`ivtrace_region::PacketSink`]: it lays out
//! `DIR/user/` and `DIR/kernel/` (one CTF trace per stream class, one
//! stream file per channel), keeps each trace's TSDL [`tsdl`] metadata in
//! step with the event classes, and writes the JSON [`sidecar`]. The
//! clock mapping (ivtrace-time's [`ClockMapping`]) becomes the CTF clock
//! block. The kernel stream is staged in its wire form and expanded to
//! LTTng's layout at the end ([`kernel`]); the ftrace relay's pages are
//! staged too and decoded into more streams of the kernel trace
//! ([`ftrace`]). [`host_trace::HostTrace`] writes `DIR/host/`, the host's own
//! events on the host time base; [`vm`] is the metadata of the VM view
//! (`DIR/vm/`, the same packets on the guest's clock); every trace's
//! metadata comes from [`tsdl`]. [`read`] reads every trace ivtrace writes
//! back from the files (metadata, streams, sidecar), for the analyses and
//! exports that work from what the sinks wrote. [`live::LiveOut`] is the
//! sink beside the directory that sends the guest traces, final, to a
//! relay as they come. A [`sink::TraceSink`] takes a writer's finished
//! packets and metadata: the host trace's directory ([`sink::DirSink`]) and
//! a relay session beside it, the live copy's relay session.

pub mod dir;
pub mod ftrace;
pub mod host_trace;
pub mod kernel;
mod kernel_out;
pub mod live;
pub mod outdir;
pub mod read;
pub mod recover;
pub mod sidecar;
pub mod sink;
pub mod streams;
pub mod trace;
pub mod tsdl;
mod user_out;
pub mod vm;

pub use ivtrace_time::ClockMapping;
pub use outdir::{OutDir, OutputPolicy};
pub use sidecar::Sidecar;
pub use sink::TraceSink;
pub use trace::{CtfError, CtfWriter};
pub use tsdl::{EnvValue, TraceEnv};
