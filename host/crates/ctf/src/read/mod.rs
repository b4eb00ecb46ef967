//! Reading back what the sinks wrote: every CTF trace of a recording
//! directory (the guest kernel trace with its relayed ftrace streams, the
//! user trace, the host trace, the VM view, nested guests' traces) and the
//! sidecar, for the analyses and exports that work from the files, never
//! from the recording engine's internals.
//!
//! - [`metadata`]: a trace's `metadata` parsed (env, clock, stream
//!   classes, event classes);
//! - [`StreamReader`]: one stream file's events and losses, in either of
//!   ivtrace's packet layouts;
//! - [`Trace`]: one trace directory, its metadata and its streams;
//! - [`Recording`]: a recording directory, its traces by kind and its
//!   sidecar;
//! - [`Merge`]: streams of any traces merged in time order, each timestamp
//!   taken through its own trace's clock (frequency and offset), as
//!   babeltrace2 merges them.
//!
//! Nothing here assumes a clock frequency or a layout beyond what the
//! metadata declares; what does not read is an error naming the file.

pub mod metadata;
mod stream;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use metadata::{Clock, Metadata, Packets, StreamDecl};
pub use stream::{stream_files, Classes, Discarded, Item, PacketInfo, Record, StreamReader};

use crate::outdir::{open_regular, read_limited};
use crate::sidecar::{Sidecar, SIDECAR_MAX_BYTES, SIDECAR_NAME};

/// What a trace directory holds, by what its `env` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// The guest kernel trace (`DIR/kernel/`): native probes and relayed ftrace.
    Kernel,
    /// The guest user trace (`DIR/user/`).
    User,
    /// The host trace (`DIR/host/`, host time base).
    Host,
    /// The VM view (`DIR/vm/`, guest clock).
    Vm,
}

impl TraceKind {
    fn of(m: &Metadata) -> TraceKind {
        if m.env_int("ivtrace_host_trace") == Some(1) {
            TraceKind::Host
        } else if m.env_str("domain") == Some("vm") {
            TraceKind::Vm
        } else if m.env_str("domain") == Some("kernel") {
            TraceKind::Kernel
        } else {
            TraceKind::User
        }
    }
}

/// One trace directory read back.
#[derive(Debug, Clone)]
pub struct Trace {
    pub dir: PathBuf,
    pub kind: TraceKind,
    pub meta: Arc<Metadata>,
    pub classes: Arc<Classes>,
}

/// Largest metadata file read back: ivtrace's own TSDL for every class
/// the ABI allows stays well below it (as the sidecar's limit).
const METADATA_MAX_BYTES: u64 = SIDECAR_MAX_BYTES;

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Trace {
    /// Reads `dir/metadata`.
    pub fn open(dir: &Path) -> io::Result<Trace> {
        let path = dir.join("metadata");
        let bytes = open_regular(&path)
            .and_then(|f| read_limited(f, METADATA_MAX_BYTES, &path))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let text = String::from_utf8(bytes)
            .map_err(|e| invalid(format!("{}: not UTF-8 text: {e}", path.display())))?;
        let meta =
            metadata::parse(&text).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
        Ok(Trace {
            dir: dir.to_path_buf(),
            kind: TraceKind::of(&meta),
            classes: Classes::new(&meta.classes),
            meta: Arc::new(meta),
        })
    }

    pub fn clock(&self) -> &Clock {
        &self.meta.clock
    }

    /// A reader of each stream file. A file whose first packet names a
    /// stream class the metadata does not declare is an error.
    pub fn streams(&self) -> io::Result<Vec<StreamReader>> {
        let mut out = Vec::new();
        for path in stream_files(&self.dir)? {
            let class = stream_class_of(&path)?;
            let Some(class) = class else { continue };
            let decl = *self.meta.streams.get(&class).ok_or_else(|| {
                invalid(format!(
                    "{}: stream class {class} is not in the metadata",
                    path.display()
                ))
            })?;
            out.push(StreamReader::open(&path, decl, Arc::clone(&self.classes))?);
        }
        Ok(out)
    }
}

/// The stream class of a stream file's first packet (the packet header's
/// `stream_id`, at the same place in both layouts); None for an empty file.
pub fn stream_class_of(path: &Path) -> io::Result<Option<u32>> {
    use std::io::Read;
    let mut head = [0u8; 8];
    let mut f = open_regular(path)?;
    match f.read_exact(&mut head) {
        Ok(()) => Ok(Some(ivtrace_region::bytes::le_u32(&head, 4))),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// A recording directory read back: its sidecar and every trace in it
/// (nested guests' traces are in [`Recording::nested`]).
#[derive(Debug, Clone)]
pub struct Recording {
    pub root: PathBuf,
    pub sidecar: Option<Sidecar>,
    pub traces: Vec<Trace>,
    /// `DIR/nested/NAME-N/`, each a recording of its own.
    pub nested: Vec<PathBuf>,
}

impl Recording {
    /// Reads `root`'s sidecar (if any) and the traces of its direct
    /// subdirectories that have a `metadata` file.
    pub fn open(root: &Path) -> io::Result<Recording> {
        let side = root.join(SIDECAR_NAME);
        let sidecar =
            match open_regular(&side).and_then(|f| read_limited(f, SIDECAR_MAX_BYTES, &side)) {
                Ok(b) => Some(
                    serde_json::from_slice(&b)
                        .map_err(|e| invalid(format!("{}: {e}", side.display())))?,
                ),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", side.display()))),
            };
        let mut traces = Vec::new();
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", root.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("metadata").is_file())
            .collect();
        dirs.sort();
        for d in dirs {
            traces.push(Trace::open(&d)?);
        }
        let mut nested: Vec<PathBuf> = match std::fs::read_dir(root.join("nested")) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir())
                .collect(),
            Err(_) => Vec::new(),
        };
        nested.sort();
        Ok(Recording {
            root: root.to_path_buf(),
            sidecar,
            traces,
            nested,
        })
    }

    /// The first trace of kind `kind`.
    pub fn trace(&self, kind: TraceKind) -> Option<&Trace> {
        self.traces.iter().find(|t| t.kind == kind)
    }

    /// The guest's name: the sidecar's env, else a trace's `hostname`, else
    /// the directory's name.
    pub fn guest_name(&self) -> String {
        if let Some(env) = self.sidecar.as_ref().and_then(|s| s.env.as_ref()) {
            if !env.hostname.is_empty() {
                return env.hostname.clone();
            }
        }
        self.traces
            .iter()
            .find(|t| matches!(t.kind, TraceKind::Kernel | TraceKind::User))
            .and_then(|t| t.meta.env_str("hostname"))
            .map(str::to_string)
            .unwrap_or_else(|| {
                self.root
                    .file_name()
                    .map_or("guest".into(), |n| n.to_string_lossy().into_owned())
            })
    }
}

/// One item of a [`Merge`], with where it came from.
#[derive(Debug, Clone)]
pub struct Merged {
    /// Index of the source the stream was added with.
    pub source: usize,
    /// Nanoseconds from the epoch through the stream's trace clock.
    pub ns: i128,
    pub item: Item,
}

/// Streams of any traces merged by time (nanoseconds from the epoch through
/// each trace's own clock; ties in the order the streams were added). A
/// stream that stops reading is dropped, with why, and the others go on.
#[derive(Default)]
pub struct Merge {
    streams: Vec<(StreamReader, Arc<Clock>, usize)>,
    heads: Vec<Option<Item>>,
    heap: BinaryHeap<Reverse<(i128, usize)>>,
    /// Streams that stopped on a read error, and why.
    pub errors: Vec<String>,
}

impl Merge {
    /// Adds every stream of `trace`, tagged `source`.
    pub fn add_trace(&mut self, trace: &Trace, source: usize) -> io::Result<()> {
        let clock = Arc::new(trace.meta.clock.clone());
        for s in trace.streams()? {
            self.add(s, Arc::clone(&clock), source);
        }
        Ok(())
    }

    /// Adds one stream read with `clock`, tagged `source`.
    pub fn add(&mut self, stream: StreamReader, clock: Arc<Clock>, source: usize) {
        self.streams.push((stream, clock, source));
        self.heads.push(None);
        self.refill(self.streams.len() - 1);
    }

    fn refill(&mut self, i: usize) {
        let (s, clock, _) = &mut self.streams[i];
        match s.next_item() {
            Ok(Some(item)) => {
                self.heap
                    .push(Reverse((clock.ns_from_origin(item.ts()), i)));
                self.heads[i] = Some(item);
            }
            Ok(None) => self.heads[i] = None,
            Err(e) => {
                self.errors.push(e.to_string());
                self.heads[i] = None;
            }
        }
    }
}

impl Iterator for Merge {
    type Item = Merged;

    fn next(&mut self) -> Option<Merged> {
        let Reverse((ns, i)) = self.heap.pop()?;
        let item = self.heads[i].take().expect("a queued stream has a head");
        self.refill(i);
        Some(Merged {
            source: self.streams[i].2,
            ns,
            item,
        })
    }
}

#[cfg(test)]
mod tests;
