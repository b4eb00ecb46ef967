//! A recording's sinks: the trace directory ([`CtfWriter`]) and the sinks
//! beside it (a relay connection's live copy,
//! [`ivtrace_ctf::live::LiveOut`]; other formats later), each an
//! [`Output`] fed the same packets in the same order, as babeltrace puts
//! its file-system sink beside lttng-live.
//!
//! The directory leads: its size limit decides whether a packet is taken
//! at all (a refused packet is counted lost once, and no sink gets it),
//! and a packet it fails to write stops the recording before the others
//! see it.

use ivtrace_ctf::{ClockMapping, CtfError, CtfWriter, TraceEnv};
use ivtrace_region::names::NameTable;
use ivtrace_region::{EventClasses, PacketSink};

use crate::engine::Output;

/// A sink beside the directory.
pub type Beside = Box<dyn Output<Error = CtfError> + Send>;

/// The directory and the sinks beside it.
pub struct Sinks {
    pub dir: CtfWriter,
    beside: Vec<Beside>,
}

impl Sinks {
    /// The directory alone.
    pub fn new(dir: CtfWriter) -> Sinks {
        Sinks {
            dir,
            beside: Vec::new(),
        }
    }

    /// `sink` gets every packet from now on too.
    pub fn add(&mut self, sink: Beside) {
        self.beside.push(sink);
    }

    /// Runs `f` on every sink, the directory first, each even after one
    /// failed (the sidecar that follows must still be written); the first
    /// error.
    fn each(
        &mut self,
        mut f: impl FnMut(&mut dyn Output<Error = CtfError>) -> Result<(), CtfError>,
    ) -> Result<(), CtfError> {
        let first = f(&mut self.dir);
        let rest = self.beside.iter_mut().map(|s| f(&mut **s));
        rest.fold(first, |all, r| all.and(r))
    }
}

impl PacketSink for Sinks {
    type Error = CtfError;

    fn accepts(&mut self, chan: u32, len: usize) -> bool {
        self.dir.accepts(chan, len)
    }

    fn commit(&mut self) -> Result<(), CtfError> {
        PacketSink::commit(&mut self.dir)?;
        self.beside.iter_mut().try_for_each(|s| s.commit())
    }

    fn packet(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        self.dir.packet(chan, stream, bytes, classes)?;
        for s in &mut self.beside {
            s.packet(chan, stream, bytes, classes)?;
        }
        Ok(())
    }
}

impl Output for Sinks {
    fn rollback(&mut self) -> Result<(), CtfError> {
        self.each(|s| s.rollback())
    }

    fn idle(&mut self) -> Result<(), CtfError> {
        self.each(|s| s.idle())
    }

    fn thread_names(&mut self, table: NameTable) {
        for s in &mut self.beside {
            s.thread_names(table.clone());
        }
        self.dir.thread_names(table);
    }

    fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        self.each(|s| s.finish(clock, env.clone(), classes))
    }

    fn finish_incomplete(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        self.each(|s| s.finish_incomplete(clock, env.clone(), classes))
    }
}
