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
//! [`CtfWriter::finish`] (see [`crate::kernel`] for why), unless the
//! writer streams ([`CtfWriter::set_tap`], a relay connection): then they
//! are expanded as they arrive ([`crate::kernel::online`]), written to
//! `DIR/kernel/` at once, and the kernel metadata grows (by whole event
//! declarations) as system calls appear.
//!
//! The ftrace relay's pages (stream class 2) are staged there too, always,
//! and an [`FtraceExpand`] decodes them into more streams of the kernel
//! trace at the end ([`crate::ftrace`]); a tap does not get them (the
//! relay daemon's copy has the native kernel and user streams only).
//!
//! A [`PacketTap`] gets every packet exactly as it is handed to its file
//! (before the commit: a packet a failed write rolls back from the local
//! file may have reached the relay), and every metadata text as it is
//! written.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use thiserror::Error;

use ivtrace_region::abi;
use ivtrace_region::classes::{EventClasses, StreamClasses};
use ivtrace_region::names::NameTable;
use ivtrace_region::reader::PacketSink;

use crate::ftrace::{FtraceExpand, FtraceInput, FtraceOutput, FtraceStaged, FtraceStats};
use crate::kernel::online::OnlineKernel;
use crate::kernel::{self, Expanded, KernelExpansion, Staged, STAGING_DIR, WIRE_METADATA};
use crate::outdir::OutDir;
use crate::sidecar::{
    Sidecar, StreamLayout, TracefsFormats, SIDECAR_FORMAT, SIDECAR_NAME, STATE_RECORDING,
};
use crate::streams::{Limits, StreamFiles, StreamStats};
use crate::tsdl::{self, Timebase, TraceDesc, TraceEnv};
use ivtrace_time::ClockMapping;

/// Who else gets the packets and metadata a [`CtfWriter`] writes (a relay
/// connection): `trace` is the trace's directory name (`kernel`, `user`,
/// `host`), `file` the stream file's name.
pub trait PacketTap: Send + Sync {
    /// The trace's whole metadata as just written; `classes`: its event
    /// classes (None for a trace whose metadata never changes).
    fn metadata(&self, trace: &'static str, text: &str, classes: Option<&StreamClasses>);
    /// One packet as written to `file`, holding `events` events.
    fn packet(&self, trace: &'static str, file: &str, bytes: &[u8], events: u64);
}

/// A guest trace's directory, once its stream class had a packet, and the
/// generation of event classes its metadata was last written for.
struct TraceOut {
    dir: OutDir,
    generation: u64,
}

/// Where the kernel stream's packets go and which classes they declare:
/// one state at a time (the states' data boxed: they differ in size).
enum KernelMode {
    /// Staged in their wire form in the staging directory (its trace's
    /// directory while recording), expanded by [`CtfWriter::finish`].
    Staging,
    /// Expanded as they arrive, into `DIR/kernel/` (a streaming writer).
    Online(Box<Online>),
    /// Expanded at the end into `DIR/kernel/` (or, without a native kernel
    /// packet, a kernel trace that holds the ftrace streams alone).
    Expanded(Box<Expanded>),
}

/// The online kernel expansion of a streaming writer.
struct Online {
    kernel: OnlineKernel,
    /// Events of kernel packets that did not walk, per channel (in every
    /// later packet's `events_discarded`).
    lost: BTreeMap<u32, u64>,
    /// Each channel's output time so far.
    times: BTreeMap<u32, kernel::rewrite::Timeline>,
    /// The mapping the latest packet was converted with: the clock block's
    /// precision and description say its bound, not the final mapping's.
    converted_with: Option<ClockMapping>,
}

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

/// What the front end says about the recording in the sidecar written
/// while it runs.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// `record`, `serve`, `snapshot`.
    pub mode: String,
    /// The region's description (the sidecar's `region`).
    pub region: BTreeMap<String, serde_json::Value>,
}

/// Writes one recording's CTF traces.
pub struct CtfWriter {
    root: OutDir,
    uuid: String,
    /// The kernel trace's own UUID (babeltrace2 merges same-UUID traces
    /// found under one directory, which fails for two stream classes).
    kernel_uuid: String,
    clock_uuid: String,
    clock: ClockMapping,
    env: TraceEnv,
    /// The user trace, once it had a packet.
    user: Option<TraceOut>,
    /// The kernel trace, once it had a packet (while staging: the staging
    /// directory), or once the ftrace expansion made it.
    kernel: Option<TraceOut>,
    kernel_mode: KernelMode,
    /// Stream class of each channel that has a file.
    stream_of: Vec<Option<u32>>,
    files: StreamFiles,
    progress: Option<Progress>,
    reserve: bool,
    /// The guest's thread name table, if the front end read one.
    name_table: Option<NameTable>,
    /// Channels of the region (index `nr_channels`: the no-channel stream).
    nr_channels: u32,
    tap: Option<Arc<dyn PacketTap>>,
    /// The staging directory (kernel and ftrace wire packets), once made.
    wire_dir: Option<OutDir>,
    /// Decodes the ftrace relay's pages at the end (installed by the engine).
    ftrace: Option<Box<dyn FtraceExpand>>,
    /// The ftrace stream once expanded.
    ftrace_out: Option<FtraceOutput>,
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
        let (uuid, kernel_uuid, clock_uuid) = trace_uuid_strings(uuid);
        let reserve = make_reserve(&root, limits.reserve_bytes);
        CtfWriter {
            root,
            uuid,
            kernel_uuid,
            clock_uuid,
            clock,
            env,
            user: None,
            kernel: None,
            kernel_mode: KernelMode::Staging,
            // One more than the channels: the no-channel stream.
            stream_of: vec![None; nr_channels as usize + 1],
            files: StreamFiles::new(limits, nr_channels + 1),
            progress: None,
            reserve,
            name_table: None,
            nr_channels,
            tap: None,
            wire_dir: None,
            ftrace: None,
            ftrace_out: None,
        }
    }

    /// Decode the ftrace relay's pages with `e` when the recording ends.
    pub fn set_ftrace_expander(&mut self, e: Box<dyn FtraceExpand>) {
        self.ftrace = Some(e);
    }

    /// What the ftrace expansion did, once it ran.
    pub fn ftrace_stats(&self) -> Option<&FtraceStats> {
        self.ftrace_out.as_ref().map(|f| &f.stats)
    }

    /// The guest's format files of the relayed events that occurred.
    pub fn ftrace_formats(&self) -> Option<&TracefsFormats> {
        self.ftrace_out
            .as_ref()
            .map(|f| &f.formats)
            .filter(|f| !f.is_empty())
    }

    /// The staging directory, made on first use (the kernel stream's
    /// metadata or the first ftrace page, whichever comes first).
    fn staging_dir(&mut self) -> Result<OutDir, CtfError> {
        if let Some(d) = &self.wire_dir {
            return Ok(d.clone());
        }
        let d = match self.root.kind(STAGING_DIR) {
            // Adopted by --resume: the directory is ours already.
            Ok(Some(_)) => self.root.open_dir(STAGING_DIR),
            _ => self.root.create_dir(STAGING_DIR),
        }
        .map_err(create_err(self.root.join(STAGING_DIR).display()))?;
        self.wire_dir = Some(d.clone());
        Ok(d)
    }

    /// Does the staging directory still hold ftrace pages to decode?
    fn ftrace_staged(&self) -> bool {
        self.ftrace_out.is_none() && self.stream_of.contains(&Some(abi::IVT_STREAM_FTRACE))
    }

    /// Streams: every packet and metadata text written from now on goes to
    /// `tap` too, and kernel packets are expanded as they arrive (call
    /// before the first packet).
    pub fn set_tap(&mut self, tap: Arc<dyn PacketTap>) {
        self.tap = Some(tap);
        self.kernel_mode = KernelMode::Online(Box::new(Online {
            kernel: OnlineKernel::default(),
            lost: BTreeMap::new(),
            times: BTreeMap::new(),
            converted_with: None,
        }));
    }

    /// What the timestamps of stream class `stream`'s trace count: the
    /// kernel trace's are nanoseconds once expanded (at the end or as they
    /// come), the staged wire packets' and the user trace's ticks.
    pub fn timebase(&self, stream: u32) -> Timebase {
        match stream == abi::IVT_STREAM_KERNEL && !self.staging() {
            true => Timebase::Nanoseconds,
            false => Timebase::Ticks,
        }
    }

    /// Whether kernel packets are staged for the expansion at the end.
    fn staging(&self) -> bool {
        matches!(self.kernel_mode, KernelMode::Staging)
    }

    /// The trace of stream class `stream` (user or kernel), once made.
    fn trace(&self, stream: u32) -> Option<&TraceOut> {
        match stream {
            abi::IVT_STREAM_KERNEL => self.kernel.as_ref(),
            _ => self.user.as_ref(),
        }
    }

    fn trace_mut(&mut self, stream: u32) -> &mut Option<TraceOut> {
        match stream {
            abi::IVT_STREAM_KERNEL => &mut self.kernel,
            _ => &mut self.user,
        }
    }

    /// The directory of stream class `stream`'s trace (made already).
    fn trace_dir(&self, stream: u32) -> OutDir {
        self.trace(stream).expect("created").dir.clone()
    }

    /// Writes the sidecar in its `recording` state whenever the metadata
    /// changes (see the module documentation).
    pub fn set_progress(&mut self, progress: Progress) {
        self.progress = Some(progress);
    }

    /// The event classes a stream class's output declares: the expanded
    /// ones for the kernel once [`CtfWriter::finish`] ran, else `classes`'.
    pub fn output_classes<'a>(
        &'a self,
        stream: u32,
        classes: &'a EventClasses,
    ) -> &'a StreamClasses {
        if stream == abi::IVT_STREAM_FTRACE {
            return match &self.ftrace_out {
                Some(f) => &f.classes,
                None => classes.stream(stream),
            };
        }
        if stream != abi::IVT_STREAM_KERNEL {
            return classes.stream(stream);
        }
        match &self.kernel_mode {
            KernelMode::Expanded(k) => &k.classes,
            KernelMode::Online(o) => o.kernel.classes(),
            KernelMode::Staging => classes.stream(stream),
        }
    }

    /// What the kernel expansion did: once it ran, or so far when online.
    pub fn kernel_expansion(&self) -> Option<&KernelExpansion> {
        match &self.kernel_mode {
            KernelMode::Expanded(k) => Some(&k.stats),
            KernelMode::Online(o) => self.kernel.as_ref().map(|_| &o.kernel.stats),
            KernelMode::Staging => None,
        }
    }

    /// The generation a stream class's metadata follows: the online kernel
    /// expansion's output classes grow on their own.
    fn generation_of(&self, stream: u32, classes: &EventClasses) -> u64 {
        match &self.kernel_mode {
            KernelMode::Online(o) if stream == abi::IVT_STREAM_KERNEL => o.kernel.generation(),
            _ => classes.generation(),
        }
    }

    pub fn root(&self) -> &OutDir {
        &self.root
    }

    /// Whether stream class `stream` has a trace directory.
    pub fn has_stream(&self, stream: u32) -> bool {
        match stream {
            abi::IVT_STREAM_FTRACE => self.ftrace_out.is_some(),
            _ => self.trace(stream).is_some(),
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
        &self.clock_uuid
    }

    /// The `hostname` the guest traces carry.
    pub fn host_name(&self) -> &str {
        &self.env.hostname
    }

    /// Replaces the clock mapping (final estimate); rewrite the metadata
    /// with [`CtfWriter::write_metadata`] afterwards.
    pub fn set_clock(&mut self, clock: ClockMapping) {
        self.clock = clock;
    }

    pub fn set_env(&mut self, env: TraceEnv) {
        self.env = env;
    }

    /// Rewrites the metadata of every stream class that has a directory.
    pub fn write_metadata(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        for stream in [abi::IVT_STREAM_KERNEL, abi::IVT_STREAM_USER] {
            if self.trace(stream).is_some() {
                self.write_stream_metadata(stream, classes)?;
            }
        }
        Ok(())
    }

    fn write_stream_metadata(
        &mut self,
        stream: u32,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        let kernel = stream == abi::IVT_STREAM_KERNEL;
        let desc = TraceDesc {
            uuid: if kernel {
                &self.kernel_uuid
            } else {
                &self.uuid
            },
            clock_uuid: &self.clock_uuid,
            clock: match &self.kernel_mode {
                KernelMode::Online(o) if kernel => o.converted_with.as_ref().unwrap_or(&self.clock),
                _ => &self.clock,
            },
            timebase: self.timebase(stream),
            env: &self.env,
        };
        let output = self.output_classes(stream, classes);
        let text = tsdl::metadata(&desc, stream, output);
        // The relay daemon's copy has no ftrace streams: only the file
        // declares them.
        let mut file_text = text.clone();
        if let Some(f) = self.ftrace_out.as_ref().filter(|_| kernel) {
            tsdl::append_stream(&mut file_text, abi::IVT_STREAM_FTRACE, &f.classes);
        }
        // Staged wire packets get their metadata under another name, so
        // CTF readers do not take the staging directory for a trace.
        let staged = kernel && self.staging();
        let name = if staged { WIRE_METADATA } else { "metadata" };
        let dir = self.trace_dir(stream);
        dir.write_atomically(name, file_text.as_bytes())
            .map_err(write_err(dir.join(name).display()))?;
        if let (Some(tap), false) = (&self.tap, staged) {
            tap.metadata(stream_dir(stream), &text, Some(output));
        }
        let generation = self.generation_of(stream, classes);
        self.trace_mut(stream).as_mut().expect("created").generation = generation;
        Ok(())
    }

    /// The trace's sidecar before the recording is finalized: what
    /// `ivtrace recover` needs (layouts, clock, env) and the state.
    fn progress_sidecar(&self, classes: &EventClasses) -> Option<Sidecar> {
        let p = self.progress.as_ref()?;
        let streams = (0..abi::IVT_STREAM_CLASSES)
            .filter(|&s| self.has_stream(s))
            .map(|s| StreamLayout::from_classes(s, stream_dir(s), self.output_classes(s, classes)))
            .collect();
        Some(Sidecar {
            format: SIDECAR_FORMAT.into(),
            tracer_version: env!("CARGO_PKG_VERSION").into(),
            mode: p.mode.clone(),
            state: STATE_RECORDING.into(),
            trace_uuid: self.uuid.clone(),
            region: p.region.clone(),
            clock: self.clock.clone(),
            env: Some(crate::sidecar::EnvRecord::from(&self.env)),
            streams,
            stop_reason: "recording: not finalized yet (if the recorder died, `ivtrace recover \
                          DIR` makes the trace whole)"
                .into(),
            ..Sidecar::default()
        })
    }

    /// Creates the stream class directory on first use and keeps its
    /// metadata (and the sidecar in progress) in step with the classes.
    fn ensure_metadata(&mut self, stream: u32, classes: &EventClasses) -> Result<(), CtfError> {
        let generation = self.generation_of(stream, classes);
        match self.trace(stream) {
            Some(t) if t.generation == generation => return Ok(()),
            Some(_) => {}
            None => {
                let dir = match stream == abi::IVT_STREAM_KERNEL && self.staging() {
                    // Shared with the ftrace pages, which may have made it.
                    true => self.staging_dir()?,
                    false => {
                        let name = stream_dir(stream);
                        self.root
                            .create_dir(name)
                            .map_err(create_err(self.root.join(name).display()))?
                    }
                };
                *self.trace_mut(stream) = Some(TraceOut { dir, generation });
            }
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
        if let KernelMode::Online(o) = &mut self.kernel_mode {
            o.kernel.set_table(&table);
        }
        self.name_table = Some(table);
    }

    /// Commits and closes every stream file, expands the staged kernel
    /// stream and the ftrace stream into `DIR/kernel/` and rewrites the
    /// metadata.
    pub fn finish(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        self.files
            .close_all()
            .map_err(write_err(self.root.path().display()))?;
        self.release_reserve();
        self.expand_kernel(classes)?;
        self.expand_ftrace(classes)?;
        if self.wire_dir.is_some() && !self.ftrace_staged() {
            kernel::remove_staging(&self.root);
        }
        self.write_metadata(classes)
    }

    /// The kernel trace's directory once its packets are final (expanded
    /// at the end or as they came), made here if it had none.
    fn kernel_out_dir(&mut self) -> Result<OutDir, CtfError> {
        if let (false, Some(t)) = (self.staging(), &self.kernel) {
            return Ok(t.dir.clone());
        }
        let name = stream_dir(abi::IVT_STREAM_KERNEL);
        self.root
            .create_dir(name)
            .map_err(create_err(self.root.join(name).display()))
    }

    /// Decodes the staged ftrace pages into `DIR/kernel/ftrace_chanN`,
    /// once; without an expander they stay staged (with a warning).
    fn expand_ftrace(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        if !self.ftrace_staged() {
            return Ok(());
        }
        let staged: Vec<FtraceStaged> = (0..self.stream_of.len() as u32)
            .filter(|&c| self.stream_of[c as usize] == Some(abi::IVT_STREAM_FTRACE))
            .map(|chan| FtraceStaged {
                chan,
                name: stream_file_name(abi::IVT_STREAM_FTRACE, chan),
            })
            .collect();
        if self.ftrace.is_none() {
            eprintln!(
                "ivtrace: warning: no ftrace decoder: the relay's pages stay in {}",
                self.root.join(STAGING_DIR).display()
            );
            return Ok(());
        }
        let out_dir = self.kernel_out_dir()?;
        let input = FtraceInput {
            wire: classes.stream(abi::IVT_STREAM_FTRACE),
            formats: &classes.ftrace,
            files: &staged,
            staging: self.wire_dir.as_ref().expect("ftrace pages were staged"),
            out: &out_dir,
            ticks: self.clock.expressible(),
            freq_hz: self.clock.freq_hz,
            clock: &self.clock,
            root: &self.root,
        };
        let expander = self.ftrace.as_mut().expect("checked above");
        let out = expander
            .expand(&input)
            .map_err(write_err(out_dir.path().display()))?;
        self.ftrace_out = Some(out);
        if self.staging() {
            // No native kernel packet: the kernel trace holds the ftrace
            // streams alone (stream class 0 declared, without events).
            self.kernel_mode = KernelMode::Expanded(Box::new(Expanded {
                classes: StreamClasses::default(),
                stats: KernelExpansion::default(),
            }));
        }
        if self.kernel.is_none() {
            let generation = self.generation_of(abi::IVT_STREAM_KERNEL, classes);
            self.kernel = Some(TraceOut {
                dir: out_dir,
                generation,
            });
        }
        Ok(())
    }

    /// The recording stopped on a failed write: closes the stream files
    /// (each holds whole packets), gives the reserve back and rewrites the
    /// metadata with the final clock; the kernel stream stays staged
    /// (expanding it needs as much room again). Best effort past the
    /// first error: the sidecar that follows must still say why.
    pub fn finish_incomplete(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
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
        let Some(staging) = self.kernel.as_ref().filter(|_| self.staging()) else {
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
        let expanded = kernel::expand_dir(
            &self.root,
            &staging,
            classes.stream(abi::IVT_STREAM_KERNEL),
            (&staged, &self.clock),
            self.name_table.as_ref(),
        )?;
        self.kernel.as_mut().expect("staged above").dir = expanded.1;
        self.kernel_mode = KernelMode::Expanded(Box::new(expanded.0));
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
            if self.root.kind(name).ok().flatten().is_some() {
                let dir = match s == abi::IVT_STREAM_KERNEL {
                    true => self.staging_dir()?,
                    false => self
                        .root
                        .open_dir(name)
                        .map_err(create_err(self.root.join(name).display()))?,
                };
                let generation = self.generation_of(s, classes);
                *self.trace_mut(s) = Some(TraceOut { dir, generation });
                self.write_stream_metadata(s, classes)?;
            }
        }
        for &(chan, stream, len) in files {
            let dir = match stream == abi::IVT_STREAM_FTRACE {
                true => self.staging_dir()?,
                false => self.trace_dir(stream),
            };
            self.files.adopt(
                chan,
                &dir,
                &channel_file_name(stream, chan, self.nr_channels),
                len,
            );
            self.stream_of[chan as usize] = Some(stream);
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
            abi::IVT_STREAM_KERNEL => matches!(self.kernel_mode, KernelMode::Expanded(_)),
            abi::IVT_STREAM_FTRACE => self.ftrace_out.is_some(),
            _ => false,
        };
        if done {
            return Err(CtfError::Write {
                path: self.root.join(STAGING_DIR).display().to_string(),
                source: io::Error::other("kernel packet after the kernel stream was expanded"),
            });
        }
        let expanded;
        let bytes = match &mut self.kernel_mode {
            KernelMode::Online(o) if stream == abi::IVT_STREAM_KERNEL => {
                expanded = o.packet(chan, bytes, classes, &self.clock);
                &expanded[..]
            }
            _ => bytes,
        };
        let dir = match stream == abi::IVT_STREAM_FTRACE {
            // Staged without metadata: decoded at the end.
            true => self.staging_dir()?,
            false => {
                self.ensure_metadata(stream, classes)?;
                self.trace_dir(stream)
            }
        };
        let name = channel_file_name(stream, chan, self.nr_channels);
        let path = || {
            self.root
                .join(stream_dir(stream))
                .join(&name)
                .display()
                .to_string()
        };
        if !self.files.has(chan) {
            self.files
                .create(chan, &dir, &name)
                .map_err(create_err(path()))?;
            self.stream_of[chan as usize] = Some(stream);
        }
        self.files.write(chan, bytes).map_err(write_err(path()))?;
        if let Some(tap) = self
            .tap
            .as_ref()
            .filter(|_| stream != abi::IVT_STREAM_FTRACE)
        {
            let events = ivtrace_region::bytes::le_u32(bytes, abi::pkt::EVENT_COUNT) as u64;
            tap.packet(stream_dir(stream), &name, bytes, events);
        }
        Ok(())
    }
}

impl Online {
    /// A kernel packet, expanded; one that does not walk becomes an empty
    /// packet with its header (the stream's sequence has no gap) and its
    /// events are counted as lost, in every later packet's
    /// `events_discarded` too. Times are converted with `clock`, the
    /// mapping in force.
    fn packet(
        &mut self,
        chan: u32,
        bytes: &[u8],
        classes: &EventClasses,
        clock: &ClockMapping,
    ) -> Vec<u8> {
        let wire = classes.stream(abi::IVT_STREAM_KERNEL);
        if self.converted_with.as_ref() != Some(clock) {
            self.converted_with = Some(clock.clone());
        }
        let time = self.times.entry(chan).or_default();
        let mut out = match self
            .kernel
            .packet((wire, classes.generation()), bytes, (clock, time))
        {
            Some(p) => p.to_vec(),
            None => {
                let mut out = Vec::new();
                let at = (clock, time);
                let n = kernel::rewrite::skipped(&mut self.kernel.stats, chan, bytes, at, &mut out);
                let lost = self.lost.entry(chan).or_default();
                *lost = lost.saturating_add(n);
                out
            }
        };
        let lost = self.lost.get(&chan).copied().unwrap_or(0);
        kernel::rewrite::add_discarded(&mut out, lost);
        out
    }
}
