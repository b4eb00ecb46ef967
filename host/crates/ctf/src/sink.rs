//! Where a trace writer's finished CTF goes: the [`TraceSink`] trait and
//! the directory sink of the host-clock traces ([`DirSink`]).
//!
//! A writer builds whole packets and metadata text (the host trace's
//! [`crate::host_trace::HostTrace`], the live copy of the guest traces
//! [`crate::live::LiveOut`]); a sink keeps or sends them as they are: the
//! trace directory's stream files, a relay session. A writer hands each
//! packet to its directory sink first and then to the sinks beside it, as
//! babeltrace puts a file-system sink beside a live one; a failed
//! directory write stops the packet before the others see it, so no copy
//! has a packet the directory lacks.
//!
//! Not the engine's `Output`: an `Output` takes the region's raw packets,
//! with commit and rollback, before any writer made CTF of them; a
//! `TraceSink` gets what a writer finished, final.

use std::fs::File;
use std::io::{self, Write};

use ivtrace_region::classes::StreamClasses;

use crate::outdir::OutDir;
use crate::trace::{create_err, write_err, CtfError};

/// Takes a writer's finished metadata and packets. `trace` names the trace
/// (`host`, `vm`, `kernel`, `user`: a host constant, never guest text);
/// `file` is the stream file's name within it.
pub trait TraceSink: Send {
    /// The trace's whole metadata as it stands now; `classes`: its event
    /// classes (None for a trace whose metadata never changes), so a sink
    /// that only appends can tell which declarations are new.
    fn metadata(
        &mut self,
        trace: &'static str,
        text: &str,
        classes: Option<&StreamClasses>,
    ) -> Result<(), CtfError>;

    /// One whole packet of stream `file`, holding `events` events.
    fn packet(
        &mut self,
        trace: &'static str,
        file: &str,
        bytes: &[u8],
        events: u64,
    ) -> Result<(), CtfError>;
}

/// One stream file of a [`DirSink`].
struct StreamFile {
    name: String,
    file: File,
    packets: u64,
}

/// A host-clock trace's directory (`DIR/host/`, `DIR/vm/`): the metadata
/// file, rewritten whole and atomically, and one file per stream that
/// only ever receives whole packets, so a process killed mid-run leaves
/// a valid trace of everything written before.
pub struct DirSink {
    dir: OutDir,
    files: Vec<StreamFile>,
}

impl DirSink {
    /// Creates `parent/name`, which must not exist.
    pub fn create(parent: &OutDir, name: &str) -> Result<DirSink, CtfError> {
        let dir = parent
            .create_dir(name)
            .map_err(create_err(parent.join(name).display()))?;
        Ok(DirSink {
            dir,
            files: Vec::new(),
        })
    }

    /// The trace directory's descriptor.
    pub fn out_dir(&self) -> &OutDir {
        &self.dir
    }

    /// Creates the empty stream file `name` (which must not exist): made
    /// when the stream is, so the directory shows every stream from the
    /// start.
    pub fn add_file(&mut self, name: &str) -> Result<(), CtfError> {
        let file = self
            .dir
            .create_file(name)
            .map_err(create_err(self.dir.join(name).display()))?;
        self.files.push(StreamFile {
            name: name.to_string(),
            file,
            packets: 0,
        });
        Ok(())
    }

    /// Removes the stream files that never got a packet (babeltrace2 reads
    /// an empty one as an error-free nothing, but nobody needs it).
    pub fn finish(self) {
        for f in self.files.iter().filter(|f| f.packets == 0) {
            // Best effort: an empty file left behind is still a valid trace.
            let _ = self.dir.remove_file(&f.name);
        }
    }
}

impl TraceSink for DirSink {
    fn metadata(
        &mut self,
        _trace: &'static str,
        text: &str,
        _classes: Option<&StreamClasses>,
    ) -> Result<(), CtfError> {
        self.dir
            .write_atomically("metadata", text.as_bytes())
            .map_err(write_err(self.dir.join("metadata").display()))
    }

    fn packet(
        &mut self,
        _trace: &'static str,
        file: &str,
        bytes: &[u8],
        _events: u64,
    ) -> Result<(), CtfError> {
        let dir = &self.dir;
        let failed = |e| write_err(dir.join(file).display())(e);
        let Some(f) = self.files.iter_mut().find(|f| f.name == file) else {
            // A writer's bug, not the guest's: say which file is missing.
            let why = io::Error::new(io::ErrorKind::NotFound, "no stream of this name was added");
            return Err(failed(why));
        };
        f.file.write_all(bytes).map_err(failed)?;
        f.packets += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packet for a stream the directory never made is refused with
    /// the file it names, not written anywhere.
    #[test]
    fn a_packet_for_an_unknown_stream_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = OutDir::root(tmp.path(), &Default::default()).unwrap();
        let mut dir = DirSink::create(&root, "host").unwrap();
        dir.add_file("host_cpu0").unwrap();
        let err = dir.packet("host", "host_cpu9", b"abc", 1).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("host_cpu9"), "{text}");
        assert!(!tmp.path().join("host/host_cpu9").exists());
        dir.packet("host", "host_cpu0", b"abc", 1).unwrap();
        dir.finish();
        assert_eq!(
            std::fs::read(tmp.path().join("host/host_cpu0")).unwrap(),
            b"abc"
        );
    }
}
