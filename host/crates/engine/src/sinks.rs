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

    fn clock_refined(&mut self, clock: &ClockMapping) {
        self.dir.clock_refined(clock);
        for s in &mut self.beside {
            s.clock_refined(clock);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_ctf::streams::Limits;
    use ivtrace_region::abi;
    use std::sync::{Arc, Mutex};

    /// What a sink beside the directory was handed.
    #[derive(Default)]
    struct Log {
        packets: Vec<(u32, u32, usize)>,
        commits: usize,
        tables: usize,
        finished: usize,
    }

    struct Beside(Arc<Mutex<Log>>);

    impl PacketSink for Beside {
        type Error = CtfError;

        fn commit(&mut self) -> Result<(), CtfError> {
            self.0.lock().unwrap().commits += 1;
            Ok(())
        }

        fn packet(
            &mut self,
            chan: u32,
            stream: u32,
            bytes: &[u8],
            _: &EventClasses,
        ) -> Result<(), CtfError> {
            let mut log = self.0.lock().unwrap();
            log.packets.push((chan, stream, bytes.len()));
            Ok(())
        }
    }

    impl Output for Beside {
        fn rollback(&mut self) -> Result<(), CtfError> {
            Ok(())
        }

        fn thread_names(&mut self, _: NameTable) {
            self.0.lock().unwrap().tables += 1;
        }

        fn finish(
            &mut self,
            _: &ClockMapping,
            _: TraceEnv,
            _: &EventClasses,
        ) -> Result<(), CtfError> {
            self.0.lock().unwrap().finished += 1;
            Ok(())
        }

        fn finish_incomplete(
            &mut self,
            c: &ClockMapping,
            e: TraceEnv,
            classes: &EventClasses,
        ) -> Result<(), CtfError> {
            self.finish(c, e, classes)
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

    /// The directory's size limit decides for every sink; a sink beside it
    /// gets each packet the directory took, its commits, the thread names
    /// and the end.
    #[test]
    fn sinks_beside_the_directory_get_what_it_took() {
        let tmp = tempfile::tempdir().unwrap();
        let root = ivtrace_ctf::OutDir::root(tmp.path(), &Default::default()).unwrap();
        let limits = Limits {
            max_bytes: Some(100),
            reserve_bytes: 0,
            ..Limits::default()
        };
        let clock = ClockMapping::default();
        let dir = CtfWriter::new(root, [7; 16], clock.clone(), env(), 2, limits);
        let log = Arc::new(Mutex::new(Log::default()));
        let mut sinks = Sinks::new(dir);
        sinks.add(Box::new(Beside(log.clone())));
        let classes = EventClasses::default();
        let user = abi::IVT_STREAM_USER;
        for (chan, len) in [(0u32, 64usize), (1, 64), (1, 30)] {
            if sinks.accepts(chan, len) {
                sinks.packet(chan, user, &vec![0; len], &classes).unwrap();
            }
        }
        PacketSink::commit(&mut sinks).unwrap();
        sinks.thread_names(NameTable::default());
        Output::finish(&mut sinks, &clock, env(), &classes).unwrap();
        let log = log.lock().unwrap();
        assert_eq!(log.packets, vec![(0, user, 64), (1, user, 30)]);
        assert_eq!((log.commits, log.tables, log.finished), (1, 1, 1));
        let file = |n: &str| {
            std::fs::metadata(tmp.path().join("user").join(n))
                .unwrap()
                .len()
        };
        assert_eq!((file("user_chan0"), file("user_chan1")), (64, 30));
        assert!(tmp.path().join("user/metadata").exists());
    }
}
