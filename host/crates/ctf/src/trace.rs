//! The on-disk trace: `DIR/user/` (stream class 1) and `DIR/kernel/`
//! (stream class 0), each a CTF 1.8 trace with its own `metadata`, one
//! stream file per channel, plus `DIR/ivtrace.json`.
//!
//! Directories and stream files are created lazily, on the first packet of
//! their stream class or channel, so babeltrace2 never sees a trace without
//! data. File names come from trusted indices only (`user_chan12`). Files
//! are created with `create_new` (never through an existing entry or
//! symlink) inside the output directory; metadata and the sidecar are
//! replaced atomically (a hidden temporary, then rename), metadata
//! whenever new event classes appear.
//!
//! Kernel packets (stream class 0) are staged in their wire form in
//! `DIR/.kernel-wire/` while recording and expanded into `DIR/kernel/` by
//! [`CtfWriter::finish`] (see [`crate::kernel`] for why); so are the ftrace
//! relay's pages (stream class 2), which an [`FtraceExpand`] decodes into
//! more streams of the kernel trace ([`crate::ftrace`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

use ivtrace_region::abi;
use ivtrace_region::classes::{EventClasses, StreamClasses};
use ivtrace_region::names::NameTable;
use ivtrace_region::reader::PacketSink;

use crate::ftrace::{FtraceExpand, FtraceInput, FtraceOutput, FtraceStaged, FtraceStats};
use crate::kernel::{self, Expanded, KernelExpansion, Staged, STAGING_DIR, WIRE_METADATA};
use crate::sidecar::{Sidecar, SIDECAR_NAME};
use crate::tsdl::{self, TraceDesc, TraceEnv};
use ivtrace_time::ClockMapping;

/// Buffer per stream file; packets larger than this bypass it.
const STREAM_BUFFER: usize = 1 << 20;

#[derive(Debug, Error)]
pub enum CtfError {
    #[error("cannot create {path}: {source}")]
    Create { path: String, source: io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: io::Error },
    #[error("cannot serialize the sidecar: {0}")]
    Json(#[from] serde_json::Error),
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
fn channel_file_name(stream: u32, chan: u32, nr_channels: u32) -> String {
    if chan == nr_channels {
        NO_CHANNEL_FILE.to_string()
    } else {
        stream_file_name(stream, chan)
    }
}

struct StreamFile {
    /// Where the file ends up, relative to the root.
    rel: String,
    /// Where it is written while recording (kernel: the staging directory).
    path: PathBuf,
    stream: u32,
    out: BufWriter<File>,
}

/// Writes one recording's CTF traces.
pub struct CtfWriter {
    root: PathBuf,
    uuid: String,
    /// The kernel trace's own UUID (babeltrace2 merges same-UUID traces
    /// found under one directory, which fails for two stream classes).
    kernel_uuid: String,
    clock_uuid: String,
    clock: ClockMapping,
    env: TraceEnv,
    /// Generation of event classes each stream class's metadata was
    /// written for (None: directory not created yet).
    metadata_generation: [Option<u64>; 2],
    files: Vec<Option<StreamFile>>,
    /// The kernel stream once expanded (then `DIR/kernel/` exists).
    kernel: Option<Expanded>,
    /// The guest's thread name table, if the front end read one.
    name_table: Option<NameTable>,
    /// Decodes the ftrace relay's pages at the end (installed by the engine).
    ftrace: Option<Box<dyn FtraceExpand>>,
    /// The ftrace stream once expanded.
    ftrace_out: Option<FtraceOutput>,
}

pub(crate) fn create_err(path: &Path) -> impl FnOnce(io::Error) -> CtfError + '_ {
    move |source| CtfError::Create {
        path: path.display().to_string(),
        source,
    }
}

pub(crate) fn write_err(path: &Path) -> impl FnOnce(io::Error) -> CtfError + '_ {
    move |source| CtfError::Write {
        path: path.display().to_string(),
        source,
    }
}

/// Creates `dir` unless it exists already.
fn create_dir_once(dir: &Path) -> Result<(), CtfError> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(create_err(dir)(e)),
        _ => Ok(()),
    }
}

/// Replaces `dir/name` with `bytes` through a hidden temporary file.
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), CtfError> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let dst = dir.join(name);
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(create_err(&tmp)(e)),
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(create_err(&tmp))?;
    f.write_all(bytes).map_err(write_err(&tmp))?;
    f.sync_data().map_err(write_err(&tmp))?;
    fs::rename(&tmp, &dst).map_err(write_err(&dst))
}

impl CtfWriter {
    /// A writer into `root`, which must exist. `uuid` names the trace (the
    /// region's uuid).
    pub fn new(
        root: &Path,
        uuid: [u8; 16],
        clock: ClockMapping,
        env: TraceEnv,
        nr_channels: u32,
    ) -> CtfWriter {
        let mut clock_uuid = uuid;
        clock_uuid[0] ^= 0xc1;
        clock_uuid[15] ^= 0x0c;
        let mut kernel_uuid = uuid;
        kernel_uuid[1] ^= 0x4b;
        kernel_uuid[14] ^= 0xb4;
        CtfWriter {
            root: root.to_path_buf(),
            uuid: ivtrace_region::region::format_uuid(&uuid),
            kernel_uuid: ivtrace_region::region::format_uuid(&kernel_uuid),
            clock_uuid: ivtrace_region::region::format_uuid(&clock_uuid),
            clock,
            env,
            metadata_generation: [None, None],
            // One more than the channels: the no-channel stream.
            files: (0..=nr_channels).map(|_| None).collect(),
            kernel: None,
            name_table: None,
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

    /// Is this stream class still staged (not yet expanded)?
    fn staged(&self, stream: u32) -> bool {
        (stream == abi::IVT_STREAM_KERNEL && self.kernel.is_none())
            || (stream == abi::IVT_STREAM_FTRACE && self.ftrace_out.is_none())
    }

    /// Does the staging directory still hold files of this stream class?
    fn still_staged(&self, stream: u32) -> bool {
        self.staged(stream) && self.files.iter().flatten().any(|f| f.stream == stream)
    }

    /// Directory a stream class's files are written to while recording.
    fn write_dir(&self, stream: u32) -> PathBuf {
        if self.staged(stream) {
            self.root.join(STAGING_DIR)
        } else {
            self.root.join(stream_dir(stream))
        }
    }

    /// The event classes a stream class's output declares: the expanded
    /// ones for the kernel once [`CtfWriter::finish`] ran, else `classes`'.
    pub fn output_classes<'a>(
        &'a self,
        stream: u32,
        classes: &'a EventClasses,
    ) -> &'a StreamClasses {
        match (&self.kernel, &self.ftrace_out) {
            (Some(k), _) if stream == abi::IVT_STREAM_KERNEL => &k.classes,
            (_, Some(f)) if stream == abi::IVT_STREAM_FTRACE => &f.classes,
            _ => classes.stream(stream),
        }
    }

    /// What the kernel expansion did, once it ran.
    pub fn kernel_expansion(&self) -> Option<&KernelExpansion> {
        self.kernel.as_ref().map(|k| &k.stats)
    }

    pub fn root(&self) -> &Path {
        &self.root
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
        for stream in 0..2u32 {
            if self.metadata_generation[stream as usize].is_some() {
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
            clock: &self.clock,
            env: &self.env,
        };
        let mut text = tsdl::metadata(&desc, stream, self.output_classes(stream, classes));
        if let Some(f) = self.ftrace_out.as_ref().filter(|_| kernel) {
            tsdl::append_stream(&mut text, abi::IVT_STREAM_FTRACE, &f.classes);
        }
        // Staged wire packets get their metadata under another name, so
        // CTF readers do not take the staging directory for a trace.
        let name = if kernel && self.kernel.is_none() {
            WIRE_METADATA
        } else {
            "metadata"
        };
        write_atomically(&self.write_dir(stream), name, text.as_bytes())?;
        self.metadata_generation[stream as usize] = Some(classes.generation());
        Ok(())
    }

    /// Creates the stream class directory on first use and keeps its
    /// metadata in step with the event classes.
    fn ensure_metadata(&mut self, stream: u32, classes: &EventClasses) -> Result<(), CtfError> {
        let slot = stream.min(1) as usize;
        match self.metadata_generation[slot] {
            Some(g) if g == classes.generation() => Ok(()),
            Some(_) => self.write_stream_metadata(stream, classes),
            None => {
                // The staging directory may exist already (ftrace pages).
                create_dir_once(&self.write_dir(stream))?;
                self.write_stream_metadata(stream, classes)
            }
        }
    }

    fn stream_file(&mut self, chan: u32, stream: u32) -> Result<(), CtfError> {
        if self.files[chan as usize].is_none() {
            let nr_channels = self.files.len() as u32 - 1;
            let name = channel_file_name(stream, chan, nr_channels);
            let rel = format!("{}/{name}", stream_dir(stream));
            let path = self.write_dir(stream).join(&name);
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(create_err(&path))?;
            self.files[chan as usize] = Some(StreamFile {
                rel,
                path,
                stream,
                out: BufWriter::with_capacity(STREAM_BUFFER, f),
            });
        }
        Ok(())
    }

    /// Relative path of channel `chan`'s stream file, if it was created.
    pub fn file_of(&self, chan: u32) -> Option<&str> {
        self.files
            .get(chan as usize)?
            .as_ref()
            .map(|f| f.rel.as_str())
    }

    /// Flushes every stream file's buffer, so a reader of the files sees
    /// every packet handed over so far (`ivtrace serve` going idle).
    pub fn flush_streams(&mut self) -> Result<(), CtfError> {
        for f in self.files.iter_mut().flatten() {
            f.out.flush().map_err(|source| CtfError::Write {
                path: f.rel.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Gives the expansion the guest's thread name table
    /// (`ivtrace_region::names::read_thread_names`), which names the threads
    /// that no naming event in the trace names (a salvaged flight
    /// recorder). Call before [`CtfWriter::finish`].
    pub fn set_thread_name_table(&mut self, table: NameTable) {
        self.name_table = Some(table);
    }

    /// Flushes every stream file, expands the staged kernel stream and
    /// the ftrace stream into `DIR/kernel/` and rewrites the metadata.
    pub fn finish(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        for f in self.files.iter_mut().flatten() {
            f.out.flush().map_err(write_err(&f.path))?;
        }
        self.expand_kernel(classes)?;
        self.expand_ftrace(classes)?;
        if !self.still_staged(abi::IVT_STREAM_KERNEL) && !self.still_staged(abi::IVT_STREAM_FTRACE)
        {
            kernel::remove_staging(&self.root.join(STAGING_DIR));
        }
        self.write_metadata(classes)
    }

    /// The staged files of stream class `stream`: (channel, staged path,
    /// final path).
    fn staged_files(&self, stream: u32) -> Vec<(u32, PathBuf, PathBuf)> {
        self.files
            .iter()
            .enumerate()
            .filter_map(|(c, f)| {
                let f = f.as_ref().filter(|f| f.stream == stream)?;
                Some((c as u32, f.path.clone(), self.root.join(&f.rel)))
            })
            .collect()
    }

    /// The files of `stream` are where [`CtfWriter::finish`] put them.
    fn mark_expanded(&mut self, stream: u32) {
        for f in self.files.iter_mut().flatten() {
            if f.stream == stream {
                f.path = self.root.join(&f.rel);
            }
        }
    }

    /// Decodes the staged ftrace pages into `DIR/kernel/ftrace_chanN`,
    /// once; without an expander they stay staged (with a warning).
    fn expand_ftrace(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        let staged: Vec<FtraceStaged> = self
            .staged_files(abi::IVT_STREAM_FTRACE)
            .into_iter()
            .map(|(chan, wire, out)| FtraceStaged { chan, wire, out })
            .collect();
        if self.ftrace_out.is_some() || staged.is_empty() {
            return Ok(());
        }
        let Some(expander) = self.ftrace.as_mut() else {
            eprintln!(
                "ivtrace: warning: no ftrace decoder: the relay's pages stay in {}",
                self.root.join(STAGING_DIR).display()
            );
            return Ok(());
        };
        let out_dir = self.root.join(stream_dir(abi::IVT_STREAM_KERNEL));
        create_dir_once(&out_dir)?;
        let input = FtraceInput {
            wire: classes.stream(abi::IVT_STREAM_FTRACE),
            formats: &classes.ftrace,
            files: &staged,
        };
        let out = expander.expand(&input).map_err(write_err(&out_dir))?;
        self.ftrace_out = Some(out);
        self.mark_expanded(abi::IVT_STREAM_FTRACE);
        if self.kernel.is_none() {
            // No native kernel packet: the kernel trace holds the ftrace
            // streams alone (stream class 0 declared, without events).
            self.kernel = Some(Expanded {
                classes: StreamClasses::default(),
                stats: KernelExpansion::default(),
            });
        }
        self.metadata_generation[abi::IVT_STREAM_KERNEL as usize] = Some(classes.generation());
        Ok(())
    }

    /// Pass 1 + 2 of [`crate::kernel`] over the staged kernel files, once.
    fn expand_kernel(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        let slot = abi::IVT_STREAM_KERNEL as usize;
        if self.kernel.is_some() || self.metadata_generation[slot].is_none() {
            return Ok(());
        }
        // The wire metadata stays next to the staged packets until the end.
        self.write_stream_metadata(abi::IVT_STREAM_KERNEL, classes)?;
        let out_dir = self.root.join(stream_dir(abi::IVT_STREAM_KERNEL));
        create_dir_once(&out_dir)?;
        let staged: Vec<Staged> = self
            .staged_files(abi::IVT_STREAM_KERNEL)
            .into_iter()
            .map(|(chan, wire, out)| Staged { chan, wire, out })
            .collect();
        let wire = classes.stream(abi::IVT_STREAM_KERNEL);
        let expanded =
            kernel::expand(wire, &staged, self.name_table.as_ref()).map_err(write_err(&out_dir))?;
        self.kernel = Some(expanded);
        self.mark_expanded(abi::IVT_STREAM_KERNEL);
        self.write_stream_metadata(abi::IVT_STREAM_KERNEL, classes)
    }

    /// Writes the sidecar (atomically).
    pub fn write_sidecar(&self, sidecar: &Sidecar) -> Result<(), CtfError> {
        let mut text = serde_json::to_vec_pretty(sidecar)?;
        text.push(b'\n');
        write_atomically(&self.root, SIDECAR_NAME, &text)
    }
}

impl PacketSink for CtfWriter {
    type Error = CtfError;

    fn packet(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        if (stream == abi::IVT_STREAM_KERNEL || stream == abi::IVT_STREAM_FTRACE)
            && !self.staged(stream)
        {
            return Err(CtfError::Write {
                path: self.root.join(STAGING_DIR).display().to_string(),
                source: io::Error::other("kernel packet after the kernel stream was expanded"),
            });
        }
        if stream == abi::IVT_STREAM_FTRACE {
            // Staged without metadata: decoded at the end.
            create_dir_once(&self.write_dir(stream))?;
        } else {
            self.ensure_metadata(stream, classes)?;
        }
        self.stream_file(chan, stream)?;
        let f = self.files[chan as usize]
            .as_mut()
            .expect("created by stream_file");
        f.out.write_all(bytes).map_err(write_err(&f.path))
    }
}
