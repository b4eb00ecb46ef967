//! The ftrace stream (stream class 2, docs/ftrace.md) in the guest's kernel
//! trace.
//!
//! The relay's channels carry whole ftrace ring-buffer pages. While
//! recording, their packets are staged like the kernel stream's, in
//! `DIR/.kernel-wire/ftrace_chanN`; when the recording ends, an
//! [`FtraceExpand`] (ivtrace-tracefs, which decodes pages with the guest's
//! own format files, the same decoder that reads the host's tracefs)
//! rewrites them into `DIR/kernel/ftrace_chanN`, one stream per CPU of
//! stream class 2 of the kernel trace, beside the native probes' streams:
//! one trace, one clock, so Trace Compass and babeltrace2 see both.
//!
//! The relay's `ftrace_symbols` events (this boot's kernel symbols) are
//! not trace events: the expansion checks them and keeps them in
//! `DIR/kallsyms` ([`KALLSYMS_FILE`]).
//!
//! Output packets are ivtrace packets like every other stream's (the same
//! packet header and context, `stream_id` 2, the CPU in `cpu_id`, the
//! compact or extended event header, byte-packed payloads), so the same
//! TSDL stream block, walker and `ivtrace report` apply. Each event's
//! payload starts with the writing thread's id (the record's
//! `common_pid`), then the fields its format declares.

use std::io;

use serde::{Deserialize, Serialize};

use crate::outdir::OutDir;
use crate::sidecar::TracefsFormats;
use ivtrace_region::abi;
use ivtrace_region::classes::StreamClasses;
use ivtrace_region::ftrace::FtraceFormats;
use ivtrace_region::packet::TickRange;
use ivtrace_time::ClockMapping;

/// One relay channel's file: its name in the staging directory (wire
/// packets) and in the kernel trace's (the decoded stream).
#[derive(Debug, Clone)]
pub struct FtraceStaged {
    pub chan: u32,
    pub name: String,
}

/// What one CPU's pages became.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FtraceCpu {
    pub cpu: u32,
    /// Events written to the trace.
    pub recorded: u64,
    /// Events lost, in all (`discarded` of the stream's last packet).
    pub lost: u64,
    /// The parts of `lost`, from ftrace's counters (the last
    /// `ftrace_stats` of the channel): overwritten before the relay read
    /// them, lost to nested writers, refused by a full buffer, discarded
    /// when the relay switched the clock to x86-tsc.
    pub overrun: u64,
    pub commit_overrun: u64,
    pub dropped: u64,
    pub clock_reset: u64,
    /// Events ftrace counted as read but that are not in the trace: read
    /// by another reader of trace_pipe, in pages the host lost, or of an
    /// event whose format the relay never published.
    pub read_not_recorded: u64,
    /// What ftrace says it produced (entries + overrun + read + dropped +
    /// commit overrun, from the last `ftrace_stats`): recorded + lost
    /// equals this once the buffer is drained (entries 0).
    pub produced: u64,
    /// Events still in ftrace's buffer at the last count.
    pub entries: u64,
    pub pages: u64,
    /// Records of no published format, pages that did not walk, and
    /// timestamps that went backwards (clamped).
    pub unknown_type: u64,
    pub bad_pages: u64,
    pub ts_clamped: u64,
    /// Pages whose records lie where the trace's clock cannot place them
    /// or after the relay wrote the page (docs/hardening.md,
    /// "Timestamps"): skipped, their records (`events_out_of_time`) lost.
    #[serde(default)]
    pub pages_out_of_time: u64,
    #[serde(default)]
    pub events_out_of_time: u64,
    /// No `ftrace_stats` reached the host: losses are from the pages only.
    pub no_stats: bool,
    /// `lost` is past what CTF readers accept (2^63-1, the counters are
    /// the guest's): the packets carry 2^63-1.
    #[serde(default)]
    pub lost_clamped: bool,
}

/// What the ftrace expansion did (the sidecar's `ftrace`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FtraceStats {
    /// Format files the guest published, parsed, refused.
    pub formats: u64,
    pub formats_refused: u64,
    /// Event classes declared (events that occurred).
    pub classes: u64,
    /// Events written, by their name in the trace.
    pub events_by_name: std::collections::BTreeMap<String, u64>,
    pub cpus: Vec<FtraceCpu>,
    pub seconds: f64,
    /// Kernel symbols the relay sent (`ftrace_symbols`), kept in
    /// `DIR/kallsyms`, and lines refused (malformed, past the bounds).
    #[serde(default)]
    pub symbols: u64,
    #[serde(default)]
    pub symbols_refused: u64,
}

/// The input of an expansion.
pub struct FtraceInput<'a> {
    /// The wire classes of stream class 2 (`ftrace_page`, `ftrace_stats`).
    pub wire: &'a StreamClasses,
    pub formats: &'a FtraceFormats,
    pub files: &'a [FtraceStaged],
    /// Where the wire files are read (through directory descriptors,
    /// [`crate::outdir`]); the decoded streams go to
    /// [`FtraceInput::out_dir`].
    pub staging: &'a OutDir,
    /// What the kernel trace's clock can express (the clock's
    /// [`ClockMapping::expressible`]), and its frequency (for the tolerance
    /// between CPUs' clocks): records outside are refused.
    pub ticks: TickRange,
    pub freq_hz: u64,
    /// The final mapping: every record's time is written in nanoseconds
    /// since the epoch with it ([`ClockMapping::ns_value`]), the kernel
    /// trace's 1 GHz clock.
    pub clock: &'a ClockMapping,
    /// The recording's directory: the kernel symbols go to
    /// [`KALLSYMS_FILE`] there, outside every trace directory.
    pub root: &'a OutDir,
}

/// The kernel symbols of the traced boot, as the relay sent them (checked,
/// one `ADDR TYPE NAME[\t[MODULE]]` line each), in the recording's
/// directory: what names the function addresses of its ftrace events.
pub const KALLSYMS_FILE: &str = "kallsyms";

/// The expanded stream class: its event classes (stream 2) and the facts.
#[derive(Debug)]
pub struct FtraceOutput {
    pub classes: StreamClasses,
    pub stats: FtraceStats,
    /// The guest's format files of the events that occurred.
    pub formats: TracefsFormats,
}

impl FtraceInput<'_> {
    /// The kernel trace's directory, where the decoded streams go: the
    /// expanded kernel stream's, or made now when no native kernel packet
    /// came. Asked for by a decoder only, so pages that stay staged leave
    /// no empty trace directory behind.
    pub fn out_dir(&self) -> io::Result<OutDir> {
        let name = crate::trace::stream_dir(abi::IVT_STREAM_KERNEL);
        match self.root.kind(name)? {
            Some(_) => self.root.open_dir(name),
            None => self.root.create_dir(name),
        }
    }
}

/// What becomes of the staged pages when the recording ends (the
/// [`crate::CtfWriter`] holds one: [`KeepStaged`] unless the recording
/// engine installs ivtrace-tracefs's decoder).
pub trait FtraceExpand: Send {
    /// The decoded stream class, or `None` when the pages stay staged.
    fn expand(&mut self, input: &FtraceInput) -> io::Result<Option<FtraceOutput>>;
}

/// No decoder (writers of nested recordings, tests): the pages stay in the
/// staging directory, with a warning naming it.
#[derive(Debug, Default)]
pub struct KeepStaged;

impl FtraceExpand for KeepStaged {
    fn expand(&mut self, input: &FtraceInput) -> io::Result<Option<FtraceOutput>> {
        eprintln!(
            "ivtrace: warning: no ftrace decoder: the relay's pages stay in {}",
            input.root.join(crate::kernel::STAGING_DIR).display()
        );
        Ok(None)
    }
}
