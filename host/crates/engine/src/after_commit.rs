//! An output with something around it that sees each packet once the
//! output has committed it: serve's delivery log, nested forwarding and
//! expansion. The one place that keeps what was handed over since the
//! last commit and drops it on a rollback: a rolled-back packet (a failed
//! write) is handed over again by the reader, and must reach the watcher
//! once.

use anyhow::Result;

use ivtrace_ctf::{ClockMapping, TraceEnv};
use ivtrace_region::names::NameTable;
use ivtrace_region::{EventClasses, PacketSink};

use crate::engine::Output;

/// What watches an output's committed packets.
pub trait Watcher {
    /// What the watcher keeps of a packet until its commit.
    type Note;
    /// Its errors, as the output's own (they stop the recording like one).
    type Error;

    /// A packet the output took (not committed yet); None: nothing to
    /// keep of it.
    fn note(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Option<Self::Note>;

    /// The output committed the packets of these notes, in order.
    fn committed(&mut self, notes: Vec<Self::Note>) -> Result<(), Self::Error>;

    /// The recording is idle (the output made its packets visible).
    fn idle(&mut self) -> Result<()> {
        Ok(())
    }
}

/// `inner` with `watcher` around it.
pub struct AfterCommit<O, W: Watcher> {
    pub inner: O,
    pub watcher: W,
    /// Notes of the packets handed over since the last commit (at most one
    /// drain pass).
    pending: Vec<W::Note>,
}

impl<O: Output, W: Watcher> AfterCommit<O, W> {
    pub fn new(inner: O, watcher: W) -> AfterCommit<O, W> {
        AfterCommit {
            inner,
            watcher,
            pending: Vec::new(),
        }
    }
}

impl<O, W> PacketSink for AfterCommit<O, W>
where
    O: Output,
    W: Watcher,
    O::Error: From<W::Error>,
{
    type Error = O::Error;

    fn accepts(&mut self, chan: u32, len: usize) -> bool {
        self.inner.accepts(chan, len)
    }

    fn commit(&mut self) -> Result<(), O::Error> {
        self.inner.commit()?;
        if self.pending.is_empty() {
            return Ok(());
        }
        let notes = std::mem::take(&mut self.pending);
        Ok(self.watcher.committed(notes)?)
    }

    fn packet(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Result<(), O::Error> {
        self.inner.packet(chan, stream, bytes, classes)?;
        if let Some(n) = self.watcher.note(chan, stream, bytes, classes) {
            self.pending.push(n);
        }
        Ok(())
    }
}

impl<O, W> Output for AfterCommit<O, W>
where
    O: Output,
    W: Watcher,
    O::Error: From<W::Error>,
{
    fn rollback(&mut self) -> Result<()> {
        self.pending.clear();
        self.inner.rollback()
    }

    fn idle(&mut self) -> Result<()> {
        self.watcher.idle()?;
        self.inner.idle()
    }

    fn thread_names(&mut self, table: NameTable) {
        self.inner.thread_names(table);
    }

    /// Commits what is pending first: the watcher sees every packet the
    /// finished output holds.
    fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<()> {
        PacketSink::commit(self)?;
        self.inner.finish(clock, env, classes)
    }

    /// The output failed: what was not committed is not written.
    fn finish_incomplete(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<()> {
        self.pending.clear();
        self.inner.finish_incomplete(clock, env, classes)
    }
}
