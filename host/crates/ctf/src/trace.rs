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
//! [`CtfWriter::finish`] (see [`crate::kernel`] for why), unless the
//! writer streams ([`CtfWriter::set_tap`], a relay connection): then they
//! are expanded as they arrive ([`crate::kernel::online`]), written to
//! `DIR/kernel/` at once, and the kernel metadata grows (by whole event
//! declarations) as system calls appear.
//!
//! A [`PacketTap`] gets every packet exactly as it is written to its file,
//! and every metadata text as it is written.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use ivtrace_region::abi;
use ivtrace_region::classes::{EventClasses, StreamClasses};
use ivtrace_region::names::NameTable;
use ivtrace_region::reader::PacketSink;

use crate::kernel::online::OnlineKernel;
use crate::kernel::{self, Expanded, KernelExpansion, Staged, STAGING_DIR, WIRE_METADATA};
use crate::sidecar::{Sidecar, SIDECAR_NAME};
use crate::tsdl::{self, TraceDesc, TraceEnv};
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

/// The online kernel expansion of a streaming writer.
struct Online {
    kernel: OnlineKernel,
    /// Events of kernel packets that did not walk, per channel (in every
    /// later packet's `events_discarded`).
    lost: BTreeMap<u32, u64>,
}

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

/// Directory name of a stream class (host constant, never guest text).
pub fn stream_dir(stream: u32) -> &'static str {
    if stream == abi::IVT_STREAM_KERNEL {
        "kernel"
    } else {
        "user"
    }
}

/// Stream file name of channel `chan` (from the trusted index only).
pub fn stream_file_name(stream: u32, chan: u32) -> String {
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
    /// Set when streaming: kernel packets are expanded as they arrive.
    online: Option<Online>,
    tap: Option<Arc<dyn PacketTap>>,
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
            online: None,
            tap: None,
        }
    }

    /// Streams: every packet and metadata text written from now on goes to
    /// `tap` too, and kernel packets are expanded as they arrive (call
    /// before the first packet).
    pub fn set_tap(&mut self, tap: Arc<dyn PacketTap>) {
        self.tap = Some(tap);
        self.online = Some(Online {
            kernel: OnlineKernel::default(),
            lost: BTreeMap::new(),
        });
    }

    /// Directory a stream class's files are written to while recording.
    fn write_dir(&self, stream: u32) -> PathBuf {
        if stream == abi::IVT_STREAM_KERNEL && self.kernel.is_none() && self.online.is_none() {
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
        if stream != abi::IVT_STREAM_KERNEL {
            return classes.stream(stream);
        }
        match (&self.kernel, &self.online) {
            (Some(k), _) => &k.classes,
            (None, Some(o)) => o.kernel.classes(),
            (None, None) => classes.stream(stream),
        }
    }

    /// What the kernel expansion did: once it ran, or so far when online.
    pub fn kernel_expansion(&self) -> Option<&KernelExpansion> {
        let slot = abi::IVT_STREAM_KERNEL as usize;
        match (&self.kernel, &self.online) {
            (Some(k), _) => Some(&k.stats),
            (None, Some(o)) => self.metadata_generation[slot].map(|_| &o.kernel.stats),
            (None, None) => None,
        }
    }

    /// The generation a stream class's metadata follows: the online kernel
    /// expansion's output classes grow on their own.
    fn generation_of(&self, stream: u32, classes: &EventClasses) -> u64 {
        match &self.online {
            Some(o) if stream == abi::IVT_STREAM_KERNEL => o.kernel.generation(),
            _ => classes.generation(),
        }
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
        let output = self.output_classes(stream, classes);
        let text = tsdl::metadata(&desc, stream, output);
        // Staged wire packets get their metadata under another name, so
        // CTF readers do not take the staging directory for a trace.
        let staged = kernel && self.kernel.is_none() && self.online.is_none();
        let name = if staged { WIRE_METADATA } else { "metadata" };
        write_atomically(&self.write_dir(stream), name, text.as_bytes())?;
        if let (Some(tap), false) = (&self.tap, staged) {
            tap.metadata(stream_dir(stream), &text, Some(output));
        }
        self.metadata_generation[stream as usize] = Some(self.generation_of(stream, classes));
        Ok(())
    }

    /// Creates the stream class directory on first use and keeps its
    /// metadata in step with the event classes.
    fn ensure_metadata(&mut self, stream: u32, classes: &EventClasses) -> Result<(), CtfError> {
        let slot = stream.min(1) as usize;
        match self.metadata_generation[slot] {
            Some(g) if g == self.generation_of(stream, classes) => Ok(()),
            Some(_) => self.write_stream_metadata(stream, classes),
            None => {
                let dir = self.write_dir(stream);
                fs::create_dir(&dir).map_err(create_err(&dir))?;
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
        if let Some(o) = &mut self.online {
            o.kernel.set_table(&table);
        }
        self.name_table = Some(table);
    }

    /// Flushes every stream file, expands the staged kernel stream into
    /// `DIR/kernel/` and rewrites the metadata.
    pub fn finish(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        for f in self.files.iter_mut().flatten() {
            f.out.flush().map_err(write_err(&f.path))?;
        }
        self.expand_kernel(classes)?;
        self.write_metadata(classes)
    }

    /// Pass 1 + 2 of [`crate::kernel`] over the staged kernel files, once.
    fn expand_kernel(&mut self, classes: &EventClasses) -> Result<(), CtfError> {
        let slot = abi::IVT_STREAM_KERNEL as usize;
        if self.kernel.is_some()
            || self.online.is_some()
            || self.metadata_generation[slot].is_none()
        {
            return Ok(());
        }
        // The wire metadata stays next to the staged packets until the end.
        self.write_stream_metadata(abi::IVT_STREAM_KERNEL, classes)?;
        let staging = self.root.join(STAGING_DIR);
        let out_dir = self.root.join(stream_dir(abi::IVT_STREAM_KERNEL));
        fs::create_dir(&out_dir).map_err(create_err(&out_dir))?;
        let staged: Vec<Staged> = self
            .files
            .iter()
            .enumerate()
            .filter_map(|(c, f)| {
                let f = f.as_ref().filter(|f| f.stream == abi::IVT_STREAM_KERNEL)?;
                Some(Staged {
                    chan: c as u32,
                    wire: f.path.clone(),
                    out: self.root.join(&f.rel),
                })
            })
            .collect();
        let wire = classes.stream(abi::IVT_STREAM_KERNEL);
        let expanded =
            kernel::expand(wire, &staged, self.name_table.as_ref()).map_err(write_err(&out_dir))?;
        self.kernel = Some(expanded);
        for f in self.files.iter_mut().flatten() {
            if f.stream == abi::IVT_STREAM_KERNEL {
                f.path = self.root.join(&f.rel);
            }
        }
        self.write_stream_metadata(abi::IVT_STREAM_KERNEL, classes)?;
        kernel::remove_staging(&staging);
        Ok(())
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
        if stream == abi::IVT_STREAM_KERNEL && self.kernel.is_some() {
            return Err(CtfError::Write {
                path: self.root.join(STAGING_DIR).display().to_string(),
                source: io::Error::other("kernel packet after the kernel stream was expanded"),
            });
        }
        let expanded;
        let bytes = match &mut self.online {
            Some(o) if stream == abi::IVT_STREAM_KERNEL => {
                expanded = o.packet(chan, bytes, classes);
                &expanded[..]
            }
            _ => bytes,
        };
        self.ensure_metadata(stream, classes)?;
        self.stream_file(chan, stream)?;
        let f = self.files[chan as usize]
            .as_mut()
            .expect("created by stream_file");
        f.out.write_all(bytes).map_err(write_err(&f.path))?;
        if let Some(tap) = &self.tap {
            let events = kernel::wire::le_u32(bytes, abi::pkt::EVENT_COUNT) as u64;
            let name = f.rel.rsplit('/').next().unwrap_or(&f.rel);
            tap.packet(stream_dir(stream), name, bytes, events);
        }
        Ok(())
    }
}

impl Online {
    /// A kernel packet, expanded; one that does not walk becomes an empty
    /// packet with its header (the stream's sequence has no gap) and its
    /// events are counted as lost, in every later packet's
    /// `events_discarded` too.
    fn packet(&mut self, chan: u32, bytes: &[u8], classes: &EventClasses) -> Vec<u8> {
        let wire = classes.stream(abi::IVT_STREAM_KERNEL);
        let mut out = match self.kernel.packet(wire, classes.generation(), bytes) {
            Some(p) => p.to_vec(),
            None => self.skipped(chan, bytes),
        };
        if let Some(&lost) = self.lost.get(&chan) {
            let at = abi::pkt::EVENTS_DISCARDED;
            let v = kernel::wire::le_u64(&out, at)
                .saturating_add(lost)
                .min(i64::MAX as u64);
            abi::put_u64(&mut out, at, v);
        }
        out
    }

    fn skipped(&mut self, chan: u32, pkt: &[u8]) -> Vec<u8> {
        use ivtrace_region::packet::PacketHeader;
        let h = PacketHeader::parse(&pkt[..abi::PACKET_HDR_SIZE]);
        let events = match h.event_count {
            abi::IVT_EVENT_COUNT_UNKNOWN => 0,
            n => n as u64,
        };
        let stats = &mut self.kernel.stats;
        stats.packets_skipped += 1;
        stats.events_lost = stats.events_lost.saturating_add(events);
        let n = stats.lost_by_channel.entry(chan).or_default();
        *n = n.saturating_add(events);
        let n = self.lost.entry(chan).or_default();
        *n = n.saturating_add(events);
        let empty = PacketHeader {
            content_size: abi::PACKET_HDR_SIZE as u64 * 8,
            packet_size: abi::PACKET_HDR_SIZE as u64 * 8,
            event_count: 0,
            timestamp_end: h.timestamp_begin,
            ..h
        };
        let mut out = vec![0u8; abi::PACKET_HDR_SIZE];
        empty.write(&mut out);
        out
    }
}
