//! An output with something around it that sees each packet once the
//! output has committed it: serve's delivery log, nested forwarding and
//! expansion. The one place that keeps what was handed over since the
//! last commit and drops it on a rollback: a rolled-back packet (a failed
//! write) is handed over again by the reader, and must reach the watcher
//! once.

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
    fn idle(&mut self) -> Result<(), Self::Error> {
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
    fn rollback(&mut self) -> Result<(), O::Error> {
        self.pending.clear();
        self.inner.rollback()
    }

    fn idle(&mut self) -> Result<(), O::Error> {
        self.watcher.idle()?;
        self.inner.idle()
    }

    fn thread_names(&mut self, table: NameTable) {
        self.inner.thread_names(table);
    }

    fn clock_refined(&mut self, clock: &ClockMapping) {
        self.inner.clock_refined(clock);
    }

    /// Commits what is pending first: the watcher sees every packet the
    /// finished output holds.
    fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), O::Error> {
        PacketSink::commit(self)?;
        self.inner.finish(clock, env, classes)
    }

    /// The output failed: what was not committed is not written.
    fn finish_incomplete(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), O::Error> {
        self.pending.clear();
        self.inner.finish_incomplete(clock, env, classes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that keeps packets by channel: committed, or handed over
    /// since the last commit.
    #[derive(Default)]
    struct Kept {
        committed: Vec<u32>,
        open: Vec<u32>,
    }

    impl PacketSink for Kept {
        type Error = std::io::Error;

        fn commit(&mut self) -> Result<(), std::io::Error> {
            self.committed.append(&mut self.open);
            Ok(())
        }

        fn packet(
            &mut self,
            chan: u32,
            _: u32,
            _: &[u8],
            _: &EventClasses,
        ) -> Result<(), Self::Error> {
            self.open.push(chan);
            Ok(())
        }
    }

    impl Output for Kept {
        fn rollback(&mut self) -> std::io::Result<()> {
            self.open.clear();
            Ok(())
        }

        fn finish(
            &mut self,
            _: &ClockMapping,
            _: TraceEnv,
            _: &EventClasses,
        ) -> std::io::Result<()> {
            Ok(())
        }

        fn finish_incomplete(
            &mut self,
            _: &ClockMapping,
            _: TraceEnv,
            _: &EventClasses,
        ) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Sees the channels of committed packets; keeps none of stream 9.
    #[derive(Default)]
    struct Seen(Vec<u32>);

    impl Watcher for Seen {
        type Note = u32;
        type Error = std::io::Error;

        fn note(&mut self, chan: u32, stream: u32, _: &[u8], _: &EventClasses) -> Option<u32> {
            (stream != 9).then_some(chan)
        }

        fn committed(&mut self, notes: Vec<u32>) -> Result<(), std::io::Error> {
            self.0.extend(notes);
            Ok(())
        }
    }

    fn env() -> TraceEnv {
        TraceEnv {
            hostname: "h".into(),
            trace_name: "t".into(),
            creation_datetime: String::new(),
            tracer_major: 0,
            tracer_minor: 1,
            extra: Vec::new(),
        }
    }

    #[test]
    fn the_watcher_sees_committed_packets_once_and_rolled_back_ones_never() {
        let classes = EventClasses::default();
        let mut out = AfterCommit::new(Kept::default(), Seen::default());
        out.packet(1, 0, &[], &classes).unwrap();
        out.packet(2, 9, &[], &classes).unwrap();
        Output::rollback(&mut out).unwrap();
        out.packet(1, 0, &[], &classes).unwrap();
        out.packet(2, 9, &[], &classes).unwrap();
        out.packet(3, 0, &[], &classes).unwrap();
        PacketSink::commit(&mut out).unwrap();
        assert_eq!(out.inner.committed, vec![1, 2, 3]);
        assert_eq!(out.watcher.0, vec![1, 3]);
        out.packet(4, 0, &[], &classes).unwrap();
        Output::finish(&mut out, &ClockMapping::default(), env(), &classes).unwrap();
        assert_eq!(
            out.watcher.0,
            vec![1, 3, 4],
            "finish commits what is pending"
        );
        out.packet(5, 0, &[], &classes).unwrap();
        Output::finish_incomplete(&mut out, &ClockMapping::default(), env(), &classes).unwrap();
        PacketSink::commit(&mut out).unwrap();
        assert_eq!(
            out.watcher.0,
            vec![1, 3, 4],
            "an incomplete finish drops it"
        );
    }
}
