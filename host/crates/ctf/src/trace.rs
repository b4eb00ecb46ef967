//! The on-disk trace: `DIR/user/` (stream class 1) and `DIR/kernel/`
//! (stream class 0), each a CTF 1.8 trace with its own `metadata`, one
//! stream file per channel, plus `DIR/ivtrace.json`.
//!
//! Everything is created relative to directory descriptors
//! ([`crate::outdir`]): the output root is held open, its subdirectories
//! are made and opened relative to it, files are created with
//! `O_EXCL | O_NOFOLLOW`; nothing is reached through a path another user
//! could swap. Directories and stream files are created lazily, on the
//! first packet of their stream class or channel, so babeltrace2 never
//! sees a trace without data. File names come from trusted indices only
//! (`user_chan12`). Metadata and the sidecar are replaced atomically (a
//! hidden temporary, then rename), metadata whenever new event classes
//! appear; the sidecar is written as soon as the trace has metadata (its
//! `state` says `recording`), so a recording cut by a crash still
//! describes itself and `ivtrace recover` can finish it.
//!
//! Packets go through [`crate::streams`]: bounded descriptors and buffers,
//! committed (written) before the engine hands their sub-buffers back,
//! cut back to whole packets when a write fails.
//!
//! Kernel packets (stream class 0) are staged in their wire form in
//! `DIR/.kernel-wire/` while recording and expanded into `DIR/kernel/` by
//! [`CtfWriter::finish`] (see [`crate::kernel`] for why). The kernel trace
//! is made on its stream's first packet, in one of the states of
//! `kernel_out.rs` (staged, expanded), so no flag says which.
//! The user trace likewise has its own writer (`user_out.rs`), made on
//! its stream's first packet with the time base it keeps.
//!
//! The ftrace relay's pages (stream class 2) are staged there too, and an
//! [`FtraceExpand`] decodes them into more streams of the kernel trace at
//! the end ([`crate::ftrace`]).
//!
//! The directory is one sink of a recording's packets; a live copy (a
//! relay connection) is another, beside it ([`crate::live`]).

use std::collections::BTreeMap;
use std::io;

use thiserror::Error;

use ivtrace_region::abi;
use ivtrace_region::classes::{EventClasses, StreamClasses};
use ivtrace_region::names::NameTable;
use ivtrace_region::reader::PacketSink;

use crate::ftrace::{
    FtraceExpand, FtraceInput, FtraceOutput, FtraceStaged, FtraceStats, KeepStaged,
};
use crate::kernel::{self, KernelExpansion, Staged, STAGING_DIR};
use crate::kernel_out::KernelTrace;
use crate::outdir::OutDir;
use crate::sidecar::{
    Sidecar, StreamLayout, TracefsFormats, SIDECAR_FORMAT, SIDECAR_NAME, STATE_RECORDING,
};
use crate::streams::{Limits, StreamFiles, StreamStats};
use crate::tsdl::{self, Timebase, TraceDesc, TraceEnv};
use crate::user_out::UserTrace;
use ivtrace_time::ClockMapping;

/// Space set aside at the start of a recording and given back when a
/// write fails, so that the final metadata and sidecar still fit on a
/// full disk.
pub(crate) const RESERVE_NAME: &str = ".ivtrace.reserve";

#[derive(Debug, Error)]
pub enum CtfError {
    #[error("cannot create {path}: {source}")]
    Create { path: String, source: io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error("cannot serialize the sidecar: {0}")]
    Json(#[from] serde_json::Error),
}

impl CtfError {
    /// The I/O error underneath, if any.
    pub fn io(&self) -> Option<&io::Error> {
        match self {
            CtfError::Create { source, .. } | CtfError::Write { source, .. } => Some(source),
            CtfError::Json(_) => None,
        }
    }

    /// Whether the file system is full (ENOSPC, EDQUOT, EFBIG).
    pub fn is_disk_full(&self) -> bool {
        self.io()
            .and_then(io::Error::raw_os_error)
            .is_some_and(|e| {
                e == nix::errno::Errno::ENOSPC as i32
                    || e == nix::errno::Errno::EDQUOT as i32
                    || e == nix::errno::Errno::EFBIG as i32
            })
    }
}

/// Directory name of a stream class (host constant, never guest text):
/// the ftrace stream is part of the kernel trace.
pub fn stream_dir(stream: u32) -> &'static str {
    if stream == abi::IVT_STREAM_KERNEL || stream == abi::IVT_STREAM_FTRACE {
        "kernel"
    } else {
        "user"
    }
}

/// Stream file name of channel `chan` (from the trusted index only).
pub fn stream_file_name(stream: u32, chan: u32) -> String {
    if stream == abi::IVT_STREAM_FTRACE {
        return format!("ftrace_chan{chan}");
    }
    format!("{}_chan{chan}", stream_dir(stream))
}

/// The user trace's stream of events no channel could take (the reader's
/// no-channel stream, index `nr_channels`; docs/abi.md "Lost events").
pub const NO_CHANNEL_FILE: &str = "user_no_channel";

/// Stream file of index `chan` of a region with `nr_channels` channels:
/// a channel's, or the no-channel stream's.
pub fn channel_file_name(stream: u32, chan: u32, nr_channels: u32) -> String {
    if chan == nr_channels {
        NO_CHANNEL_FILE.to_string()
    } else {
        stream_file_name(stream, chan)
    }
}

pub(crate) fn create_err(path: impl std::fmt::Display) -> impl FnOnce(io::Error) -> CtfError {
    let path = path.to_string();
    move |source| CtfError::Create { path, source }
}

pub(crate) fn write_err(path: impl std::fmt::Display) -> impl FnOnce(io::Error) -> CtfError {
    let path = path.to_string();
    move |source| CtfError::Write { path, source }
}

/// What the writer says while the recording runs.
#[derive(Debug, Clone, Default)]
pub enum Progress {
    /// Nothing: no sidecar in its `recording` state (writers of nested
    /// recordings, tests).
    #[default]
    Quiet,
    /// The sidecar in its `recording` state, rewritten whenever the
    /// metadata changes, with what the front end says of the recording.
    Sidecar {
        /// `record`, `serve`, `snapshot`.
        mode: String,
        /// The region's description (the sidecar's `region`).
        region: BTreeMap<String, serde_json::Value>,
    },
}

/// The UUIDs a recording's guest traces carry.
#[derive(Debug, Clone)]
pub(crate) struct TraceIds {
    /// The user trace's (the region's).
    uuid: String,
    /// The kernel trace's own UUID (babeltrace2 merges same-UUID traces
    /// found under one directory, which fails for two stream classes).
    kernel_uuid: String,
    clock_uuid: String,
}

impl TraceIds {
    pub fn new(uuid: [u8; 16]) -> TraceIds {
        let (uuid, kernel_uuid, clock_uuid) = trace_uuid_strings(uuid);
        TraceIds {
            uuid,
            kernel_uuid,
            clock_uuid,
        }
    }

    /// What the metadata of stream class `stream`'s trace describes.
    pub fn desc<'a>(
        &'a self,
        stream: u32,
        clock: &'a ClockMapping,
        timebase: Timebase,
        env: &'a TraceEnv,
    ) -> TraceDesc<'a> {
        TraceDesc {
            uuid: match stream == abi::IVT_STREAM_KERNEL {
                true => &self.kernel_uuid,
                false => &self.uuid,
            },
            clock_uuid: &self.clock_uuid,
            clock,
            timebase,
            env,
        }
    }
}

/// Writes one recording's CTF traces.
pub struct CtfWriter {
    root: OutDir,
    ids: TraceIds,
    clock: ClockMapping,
    env: TraceEnv,
    /// The user trace, once it had a packet.
    user: Option<UserTrace>,
    /// The kernel trace, once it had a packet, or once the ftrace
    /// expansion made it.
    kernel: Option<KernelTrace>,
    /// Stream class of each channel that has a file.
    stream_of: Vec<Option<u32>>,
    files: StreamFiles,
    progress: Progress,
    reserve: bool,
    /// The guest's thread name table as the front end last read it (empty
    /// until it read one: no table and an empty one name nothing alike).
    name_table: NameTable,
    /// Channels of the region (index `nr_channels`: the no-channel stream).
    nr_channels: u32,
    /// What becomes of the ftrace relay's pages at the end: decoded by the
    /// expander the engine installs, else [`KeepStaged`].
    ftrace_expander: Box<dyn FtraceExpand>,
    /// The ftrace stream, once its first page had a file.
    ftrace: Option<FtraceTrace>,
    /// What the user trace is made counting: nanoseconds unless
    /// [`CtfWriter::keep_user_ticks`] said ticks.
    user_timebase: Timebase,
}

/// The ftrace relay's stream (stream class 2): its pages staged, then
/// decoded into more streams of the kernel trace by [`CtfWriter::finish`]
/// (they stay staged without an expander).
enum FtraceTrace {
    /// In the staging directory (shared with the staged kernel stream).
    Staged(OutDir),
    Expanded(Box<FtraceOutput>),
}

/// The user trace's, the kernel trace's and the clock's uuids.
pub(crate) fn trace_uuid_strings(uuid: [u8; 16]) -> (String, String, String) {
    let mut clock_uuid = uuid;
    clock_uuid[0] ^= 0xc1;
    clock_uuid[15] ^= 0x0c;
    let mut kernel_uuid = uuid;
    kernel_uuid[1] ^= 0x4b;
    kernel_uuid[14] ^= 0xb4;
    let f = ivtrace_region::region::format_uuid;
    (f(&uuid), f(&kernel_uuid), f(&clock_uuid))
}

impl CtfWriter {
    /// A writer into `root`. `uuid` names the trace (the region's uuid).
    pub fn new(
        root: OutDir,
        uuid: [u8; 16],
        clock: ClockMapping,
        env: TraceEnv,
        nr_channels: u32,
        limits: Limits,
    ) -> CtfWriter {
        let reserve = make_reserve(&root, limits.reserve_bytes);
        CtfWriter {
            root,
            ids: TraceIds::new(uuid),
            clock,
            env,
            user: None,
            kernel: None,
            // One more than the channels: the no-channel stream.
            stream_of: vec![None; nr_channels as usize + 1],
            files: StreamFiles::new(limits, nr_channels + 1),
            progress: Progress::Quiet,
            reserve,
            name_table: NameTable::default(),
            nr_channels,
            ftrace_expander: Box::new(KeepStaged),
            ftrace: None,
            user_timebase: Timebase::Nanoseconds,
        }
    }

    /// Decode the ftrace relay's pages with `e` when the recording ends.
    pub fn set_ftrace_expander(&mut self, e: Box<dyn FtraceExpand>) {
        self.ftrace_expander = e;
    }

    /// The ftrace stream's output, once expanded.
    fn ftrace_output(&self) -> Option<&FtraceOutput> {
        match &self.ftrace {
            Some(FtraceTrace::Expanded(f)) => Some(f),
            _ => None,
        }
    }

    /// What the ftrace expansion did, once it ran.
    pub fn ftrace_stats(&self) -> Option<&FtraceStats> {
        self.ftrace_output().map(|f| &f.stats)
    }

    /// The guest's format files of the relayed events that occurred.
    pub fn ftrace_formats(&self) -> Option<&TracefsFormats> {
        self.ftrace_output()
            .map(|f| &f.formats)
            .filter(|f| !f.is_empty())
    }

    /// The staging directory, if a staged stream holds it.
    fn staged_dir(&self) -> Option<&OutDir> {
        let kernel = self.kernel.as_ref().filter(|k| k.is_staged());
        match (kernel, &self.ftrace) {
            (Some(k), _) => Some(&k.dir),
            (None, Some(FtraceTrace::Staged(d))) => Some(d),
            _ => None,
        }
    }

    /// The staging directory, made on first use (the kernel stream's
    /// metadata or the first ftrace page, whichever comes first); the
    /// staged stream made with it keeps it.
    fn staging_dir(&mut self) -> Result<OutDir, CtfError> {
        if let Some(d) = self.staged_dir() {
            return Ok(d.clone());
        }
        match self.root.kind(STAGING_DIR) {
            // Adopted by --resume: the directory is ours already.
            Ok(Some(_)) => self.root.open_dir(STAGING_DIR),
            _ => self.root.create_dir(STAGING_DIR),
        }
        .map_err(create_err(self.root.join(STAGING_DIR).display()))
    }

    /// Channel `chan` of stream class `stream` has its file in `dir` now;
    /// the first ftrace file starts the ftrace stream (staged in `dir`).
    fn file_made(&mut self, chan: u32, stream: u32, dir: &OutDir) {
        self.stream_of[chan as usize] = Some(stream);
        if stream == abi::IVT_STREAM_FTRACE && self.ftrace.is_none() {
            self.ftrace = Some(FtraceTrace::Staged(dir.clone()));
        }
    }

    /// Does the staging directory still hold ftrace pages to decode?
    fn ftrace_staged(&self) -> bool {
        matches!(self.ftrace, Some(FtraceTrace::Staged(_)))
    }

    /// The recording's trace UUIDs and metadata parts (what a live sink
    /// beside the directory describes its traces with).
    pub(crate) fn ids(&self) -> &TraceIds {
        &self.ids
    }

    /// What the timestamps of stream class `stream`'s trace count: the
    /// kernel trace's are nanoseconds once expanded at the end, the staged
    /// wire packets' ticks; the user trace's what it was made with (see
    /// `UserTrace::timebase`), or will be made with.
    pub fn timebase(&self, stream: u32) -> Timebase {
        match (stream, &self.kernel, &self.user) {
            (abi::IVT_STREAM_KERNEL, Some(k), _) if !k.is_staged() => Timebase::Nanoseconds,
            (abi::IVT_STREAM_KERNEL, _, _) => Timebase::Ticks,
            (_, _, Some(u)) => u.timebase(),
            (_, _, None) => self.user_timebase,
        }
    }

    /// The directory of stream class `stream`'s trace (user or kernel),
    /// once made.
    fn trace_dir(&self, stream: u32) -> Option<&OutDir> {
        match stream {
            abi::IVT_STREAM_KERNEL => self.kernel.as_ref().map(|k| &k.dir),
            _ => self.user.as_ref().map(|u| &u.dir),
        }
    }

    /// What to say while recording (see the module documentation).
    pub fn set_progress(&mut self, progress: Progress) {
        self.progress = progress;
    }

    /// The event classes a stream class's output declares: the expanded
    /// ones for the kernel once [`CtfWriter::finish`] ran, else `classes`'.
    pub fn output_classes<'a>(
        &'a self,
        stream: u32,
        classes: &'a EventClasses,
    ) -> &'a StreamClasses {
        let wire = classes.stream(stream);
        match stream {
            abi::IVT_STREAM_FTRACE => self.ftrace_output().map_or(wire, |f| &f.classes),
            abi::IVT_STREAM_KERNEL => self.kernel.as_ref().map_or(wire, |k| k.classes(wire)),
            _ => wire,
        }
    }

    /// What the kernel expansion at the end did, once it ran.
    pub fn kernel_expansion(&self) -> Option<&KernelExpansion> {
        self.kernel.as_ref().and_then(KernelTrace::expansion)
    }

    pub fn root(&self) -> &OutDir {
        &self.root
    }

    /// Channels of the region (index `nr_channels` is the no-channel
    /// stream's).
    pub fn nr_channels(&self) -> u32 {
        self.nr_channels
    }

    /// Whether stream class `stream` has a trace directory.
    pub fn has_stream(&self, stream: u32) -> bool {
        match stream {
            abi::IVT_STREAM_FTRACE => self.ftrace_output().is_some(),
            _ => self.trace_dir(stream).is_some(),
        }
    }

    /// What the stream files cost (descriptors, buffers, the size limit).
    pub fn stream_stats(&self) -> &StreamStats {
        self.files.stats()
    }

    pub fn clock(&self) -> &ClockMapping {
        &self.clock
    }

    pub fn env(&self) -> &TraceEnv {
        &self.env
    }

    /// The UUID of the guest traces' clock: another trace on the guest's
    /// time base (the VM view) names the same clock with it, so readers
    /// (Trace Compass: one machine per clock UUID) put them together.
    pub fn clock_uuid(&self) -> &str {
        &self.ids.clock_uuid
    }

    /// The `hostname` the guest traces carry.
    pub fn host_name(&self) -> &str {
        &self.env.hostname
    }

    /// The user packets this writer gets count the guest's ticks (the
    /// reader does not convert them: nested tracing, whose L0 places L2's
    /// ticks with the composed mapping, docs/nested.md): its user trace's
    /// clock block says ticks at the mapping's frequency, the date in the
    /// offset. Call before the first user packet: the user trace keeps
    /// the time base it was made with.
    pub fn keep_user_ticks(&mut self) {
        self.user_timebase = Timebase::Ticks;
    }

    /// Replaces the clock mapping with a refined estimate while
    /// recording, which the streaming expansions convert with from then
    /// on (the final one comes with [`CtfWriter::finish`]).
    pub fn set_clock(&mut self, clock: ClockMapping) {
        self.clock = clock;
    }

    /// The recording's final clock mapping and env, which every trace's
    /// metadata states from now on.
    fn set_final(&mut self, clock: &ClockMapping, env: TraceEnv) {
        self.clock = clock.clone();
        self.env = env;
    }

    /// Rewrites the metadata of every stream class that has a directory.
    pub fn write_metadata(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        for stream in [abi::IVT_STREAM_KERNEL, abi::IVT_STREAM_USER] {
            if self.trace_dir(stream).is_some() {
                self.write_stream_metadata(stream, classes)?;
            }
        }
        Ok(())
    }

    /// Rewrites the metadata of stream class `stream`'s trace (made).
    fn write_stream_metadata(
        &mut self,
        stream: u32,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        match stream {
            abi::IVT_STREAM_KERNEL => self.write_kernel_metadata(classes),
            _ => {
                let user = self.user.as_mut().expect("made");
                user.write_metadata(&self.ids, &self.clock, &self.env, classes)
            }
        }
    }

    /// The kernel trace's metadata: its output classes (the wire ones
    /// while staged, under the staged name) and, once decoded, the ftrace
    /// streams'.
    fn write_kernel_metadata(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        let stream = abi::IVT_STREAM_KERNEL;
        let desc = self
            .ids
            .desc(stream, &self.clock, self.timebase(stream), &self.env);
        let mut text = tsdl::metadata(&desc, stream, self.output_classes(stream, classes));
        if let Some(f) = self.ftrace_output() {
            tsdl::append_stream(&mut text, abi::IVT_STREAM_FTRACE, &f.classes);
        }
        let k = self.kernel.as_mut().expect("made");
        let name = k.metadata_name();
        k.dir
            .write_atomically(name, text.as_bytes())
            .map_err(write_err(k.dir.join(name).display()))?;
        k.generation = classes.generation();
        Ok(())
    }

    /// Whether stream class `stream`'s metadata was last written for
    /// `classes`' generation (the trace is made).
    fn metadata_current(&self, stream: u32, classes: &EventClasses) -> bool {
        match stream {
            abi::IVT_STREAM_KERNEL => {
                self.kernel.as_ref().expect("made").generation == classes.generation()
            }
            _ => self.user.as_ref().expect("made").is_current(classes),
        }
    }

    /// The trace's sidecar before the recording is finalized: what
    /// `ivtrace recover` needs (layouts, clock, env) and the state.
    fn progress_sidecar(&self, classes: &EventClasses) -> Option<Sidecar> {
        let Progress::Sidecar { mode, region } = &self.progress else {
            return None;
        };
        let streams = (0..abi::IVT_STREAM_CLASSES)
            .filter(|&s| self.has_stream(s))
            .map(|s| StreamLayout::from_classes(s, stream_dir(s), self.output_classes(s, classes)))
            .collect();
        Some(Sidecar {
            format: SIDECAR_FORMAT.into(),
            tracer_version: env!("CARGO_PKG_VERSION").into(),
            mode: mode.clone(),
            state: STATE_RECORDING.into(),
            trace_uuid: self.ids.uuid.clone(),
            region: region.clone(),
            clock: self.clock.clone(),
            env: Some(crate::sidecar::EnvRecord::from(&self.env)),
            streams,
            stop_reason: "recording: not finalized yet (if the recorder died, `ivtrace recover \
                          DIR` makes the trace whole)"
                .into(),
            ..Sidecar::default()
        })
    }

    /// Creates the trace of stream class `stream` (user or kernel) on
    /// first use; says whether it made it now.
    fn ensure_trace(&mut self, stream: u32) -> Result<bool, CtfError> {
        if self.trace_dir(stream).is_some() {
            return Ok(false);
        }
        if stream == abi::IVT_STREAM_KERNEL {
            // Shared with the ftrace pages, which may have made it.
            let dir = self.staging_dir()?;
            self.kernel = Some(KernelTrace::staged(dir));
            return Ok(true);
        }
        self.user = Some(UserTrace::create(&self.root, self.user_timebase)?);
        Ok(true)
    }

    /// Keeps the metadata of stream class `stream` (made, `fresh`: just
    /// now) and the sidecar in progress in step with the classes.
    fn ensure_metadata(
        &mut self,
        stream: u32,
        fresh: bool,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        if !fresh && self.metadata_current(stream, classes) {
            return Ok(());
        }
        self.write_stream_metadata(stream, classes)?;
        match self.progress_sidecar(classes) {
            Some(s) => self.write_sidecar(&s),
            None => Ok(()),
        }
    }

    /// Relative path of channel `chan`'s stream file, if it was created.
    pub fn file_of(&self, chan: u32) -> Option<String> {
        let stream = (*self.stream_of.get(chan as usize)?)?;
        Some(format!(
            "{}/{}",
            stream_dir(stream),
            channel_file_name(stream, chan, self.nr_channels)
        ))
    }

    /// Writes every packet handed over so far (write(2) returned): the
    /// engine then hands their sub-buffers back to the writer.
    pub fn commit(&mut self) -> Result<(), CtfError> {
        self.files
            .commit()
            .map_err(write_err(self.root.path().display()))
    }

    /// Undoes every packet handed over since the last commit: each stream
    /// file is cut back to whole committed packets. The space set aside
    /// for the final metadata and sidecar is given back (a write failed:
    /// most likely the disk is full).
    pub fn rollback(&mut self) -> Result<(), CtfError> {
        self.release_reserve();
        self.files
            .rollback()
            .map_err(write_err(self.root.path().display()))
    }

    fn release_reserve(&mut self) {
        if std::mem::take(&mut self.reserve) {
            let _ = self.root.remove_file(RESERVE_NAME);
        }
    }

    /// Gives the expansion the guest's thread name table
    /// (`ivtrace_region::names::read_thread_names`), which names the threads
    /// that no naming event in the trace names (a salvaged flight
    /// recorder). Call before [`CtfWriter::finish`].
    pub fn set_thread_name_table(&mut self, table: NameTable) {
        self.name_table = table;
    }

    /// Commits and closes every stream file, expands the staged kernel
    /// stream and the ftrace stream into `DIR/kernel/` with the final
    /// `clock` and rewrites the metadata (stating `clock` and `env`).
    pub fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        self.set_final(clock, env);
        self.files
            .close_all()
            .map_err(write_err(self.root.path().display()))?;
        self.release_reserve();
        let staged = self.staged_dir().is_some();
        self.expand_kernel(classes)?;
        self.expand_ftrace(classes)?;
        if staged && !self.ftrace_staged() {
            kernel::remove_staging(&self.root);
        }
        self.write_metadata(classes)
    }

    /// Decodes the staged ftrace pages into `DIR/kernel/ftrace_chanN`
    /// with the expander, once; with [`KeepStaged`] they stay staged.
    fn expand_ftrace(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        let Some(FtraceTrace::Staged(staging)) = &self.ftrace else {
            return Ok(());
        };
        let staged: Vec<FtraceStaged> = (0..self.stream_of.len() as u32)
            .filter(|&c| self.stream_of[c as usize] == Some(abi::IVT_STREAM_FTRACE))
            .map(|chan| FtraceStaged {
                chan,
                name: stream_file_name(abi::IVT_STREAM_FTRACE, chan),
            })
            .collect();
        let input = FtraceInput {
            wire: classes.stream(abi::IVT_STREAM_FTRACE),
            formats: &classes.ftrace,
            files: &staged,
            staging,
            ticks: self.clock.expressible(),
            freq_hz: self.clock.freq_hz,
            clock: &self.clock,
            root: &self.root,
        };
        let out_name = stream_dir(abi::IVT_STREAM_KERNEL);
        let out_path = self.root.join(out_name);
        let expanded = self.ftrace_expander.expand(&input);
        let Some(out) = expanded.map_err(write_err(out_path.display()))? else {
            return Ok(());
        };
        self.ftrace = Some(FtraceTrace::Expanded(Box::new(out)));
        if self.kernel.is_none() {
            // No native kernel packet: the kernel trace holds the ftrace
            // streams alone, in the directory the expansion made.
            let dir = self
                .root
                .open_dir(out_name)
                .map_err(create_err(out_path.display()))?;
            let generation = classes.generation();
            self.kernel = Some(KernelTrace::ftrace_only(dir, generation));
        }
        Ok(())
    }

    /// The recording stopped on a failed write: closes the stream files
    /// (each holds whole packets), gives the reserve back and rewrites the
    /// metadata with the final `clock` and `env`; the kernel stream stays
    /// staged (expanding it needs as much room again). Best effort past
    /// the first error: the sidecar that follows must still say why.
    pub fn finish_incomplete(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        self.set_final(clock, env);
        self.release_reserve();
        let closed = self
            .files
            .close_all()
            .map_err(write_err(self.root.path().display()));
        let metadata = self.write_metadata(classes);
        closed.and(metadata)
    }

    /// Pass 1 + 2 of [`crate::kernel`] over the staged kernel files, once.
    fn expand_kernel(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        let Some(staging) = self.kernel.as_ref().filter(|k| k.is_staged()) else {
            return Ok(());
        };
        let staging = staging.dir.clone();
        // The wire metadata stays next to the staged packets until the end.
        self.write_stream_metadata(abi::IVT_STREAM_KERNEL, classes)?;
        let staged: Vec<Staged> = self
            .stream_of
            .iter()
            .enumerate()
            .filter(|(_, s)| **s == Some(abi::IVT_STREAM_KERNEL))
            .map(|(c, _)| Staged::channel(c as u32))
            .collect();
        let (expanded, dir) = kernel::expand_dir(
            &self.root,
            &staging,
            classes.stream(abi::IVT_STREAM_KERNEL),
            (&staged, &self.clock),
            &self.name_table,
        )?;
        let k = self.kernel.as_mut().expect("staged above");
        k.set_expanded(expanded, dir);
        self.write_stream_metadata(abi::IVT_STREAM_KERNEL, classes)
    }

    /// Writes the sidecar (atomically).
    pub fn write_sidecar(&self, sidecar: &Sidecar) -> Result<(), CtfError> {
        write_json(&self.root, sidecar)
    }

    /// Adopts the stream files of an interrupted recording of the same
    /// region (`ivtrace record --resume`): `files` lists (channel, stream
    /// class, length of its whole packets); the directories exist.
    pub fn adopt(
        &mut self,
        files: &[(u32, u32, u64)],
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        for s in [abi::IVT_STREAM_KERNEL, abi::IVT_STREAM_USER] {
            let name = crate::dir::recording_dir(s);
            if self.root.kind(name).ok().flatten().is_none() {
                continue;
            }
            if s == abi::IVT_STREAM_KERNEL {
                // Its files hold wire packets, staged like new ones.
                let dir = self.staging_dir()?;
                self.kernel = Some(KernelTrace::staged(dir));
            } else {
                self.user = Some(UserTrace::adopt(&self.root, self.user_timebase)?);
            }
            self.write_stream_metadata(s, classes)?;
        }
        for &(chan, stream, len) in files {
            let dir = match stream == abi::IVT_STREAM_FTRACE {
                true => self.staging_dir()?,
                false => self.trace_dir(stream).expect("adopted above").clone(),
            };
            self.files.adopt(
                chan,
                &dir,
                &channel_file_name(stream, chan, self.nr_channels),
                len,
            );
            self.file_made(chan, stream, &dir);
        }
        Ok(())
    }
}

/// Writes `sidecar` as `dir/ivtrace.json`, atomically.
pub fn write_json(dir: &OutDir, sidecar: &Sidecar) -> Result<(), CtfError> {
    let mut text = serde_json::to_vec_pretty(sidecar)?;
    text.push(b'\n');
    dir.write_atomically(SIDECAR_NAME, &text)
        .map_err(write_err(dir.join(SIDECAR_NAME).display()))
}

/// Sets space aside for the end of the recording (best effort: a file
/// system without fallocate just has no reserve).
fn make_reserve(root: &OutDir, bytes: u64) -> bool {
    if bytes == 0 {
        return false;
    }
    let Ok(f) = root.create_file(RESERVE_NAME) else {
        return false;
    };
    use std::os::fd::AsRawFd;
    let len = bytes.min(i64::MAX as u64) as i64;
    if nix::fcntl::posix_fallocate(f.as_raw_fd(), 0, len).is_err() {
        let _ = root.remove_file(RESERVE_NAME);
        return false;
    }
    true
}

impl PacketSink for CtfWriter {
    type Error = CtfError;

    fn accepts(&mut self, _chan: u32, len: usize) -> bool {
        self.files.accepts(len)
    }

    fn commit(&mut self) -> Result<(), CtfError> {
        CtfWriter::commit(self)
    }

    fn packet(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        let done = match stream {
            abi::IVT_STREAM_KERNEL => self.kernel.as_ref().is_some_and(KernelTrace::is_expanded),
            abi::IVT_STREAM_FTRACE => self.ftrace_output().is_some(),
            _ => false,
        };
        if done {
            return Err(CtfError::Write {
                path: self.root.join(STAGING_DIR).display().to_string(),
                source: io::Error::other("kernel packet after the kernel stream was expanded"),
            });
        }
        let dir = match stream {
            // Staged without metadata: decoded at the end.
            abi::IVT_STREAM_FTRACE => self.staging_dir()?,
            _ => {
                let fresh = self.ensure_trace(stream)?;
                self.ensure_metadata(stream, fresh, classes)?;
                self.trace_dir(stream).expect("made").clone()
            }
        };
        self.write_packet(chan, stream, &dir, bytes)
    }
}

impl CtfWriter {
    /// Writes a packet to channel `chan`'s file in `dir` (made on first
    /// use).
    fn write_packet(
        &mut self,
        chan: u32,
        stream: u32,
        dir: &OutDir,
        bytes: &[u8],
    ) -> Result<(), CtfError> {
        let name = channel_file_name(stream, chan, self.nr_channels);
        // The path is shown in an error only: made when one happens.
        let path = |root: &OutDir| {
            root.join(stream_dir(stream))
                .join(&name)
                .display()
                .to_string()
        };
        if !self.files.has(chan) {
            let made = self.files.create(chan, dir, &name);
            made.map_err(|e| create_err(path(&self.root))(e))?;
            self.file_made(chan, stream, dir);
        }
        let written = self.files.write(chan, bytes);
        written.map_err(|e| write_err(path(&self.root))(e))
    }
}
