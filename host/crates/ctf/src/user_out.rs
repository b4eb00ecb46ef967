//! The user trace's output (stream class 1): `DIR/user/`.
//!
//! [`UserTrace`] is made on the stream's first packet (or opened again by
//! `record --resume`) and owns what is the user trace's alone: its
//! directory, its metadata and the generation of event classes that
//! metadata was last written for, and what its timestamps count. Its
//! stream files stay in the writer's [`crate::streams::StreamFiles`]: the
//! descriptor, buffer and size limits are one budget for every trace.

use ivtrace_region::abi;
use ivtrace_region::classes::EventClasses;

use crate::outdir::OutDir;
use crate::trace::{create_err, stream_dir, write_err, CtfError, TraceIds};
use crate::tsdl::{self, Timebase, TraceEnv};
use ivtrace_time::ClockMapping;

/// The user trace: its directory, the generation its metadata was last
/// written for, and the time base it was made with.
pub(crate) struct UserTrace {
    pub dir: OutDir,
    generation: u64,
    timebase: Timebase,
}

/// The user trace's directory name (a host constant).
fn dir_name() -> &'static str {
    stream_dir(abi::IVT_STREAM_USER)
}

impl UserTrace {
    /// Makes `DIR/user/` (on the stream's first packet: babeltrace2 never
    /// sees a trace without data).
    pub fn create(root: &OutDir, timebase: Timebase) -> Result<UserTrace, CtfError> {
        let dir = root
            .create_dir(dir_name())
            .map_err(create_err(root.join(dir_name()).display()))?;
        Ok(UserTrace::with_dir(dir, timebase))
    }

    /// Opens the `DIR/user/` an interrupted recording of the same region
    /// made (`record --resume`), to append to its files.
    pub fn adopt(root: &OutDir, timebase: Timebase) -> Result<UserTrace, CtfError> {
        let dir = root
            .open_dir(dir_name())
            .map_err(create_err(root.join(dir_name()).display()))?;
        Ok(UserTrace::with_dir(dir, timebase))
    }

    fn with_dir(dir: OutDir, timebase: Timebase) -> UserTrace {
        UserTrace {
            dir,
            // No metadata yet: the first packet or the adoption writes it.
            generation: 0,
            timebase,
        }
    }

    /// What the trace's timestamps count: nanoseconds (the drain rewrites
    /// them, `Reader::set_user_clock`) unless the writer keeps ticks.
    pub fn timebase(&self) -> Timebase {
        self.timebase
    }

    /// Whether the metadata was last written for `classes`' generation.
    pub fn is_current(&self, classes: &EventClasses) -> bool {
        self.generation == classes.generation()
    }

    /// Rewrites `DIR/user/metadata` (atomically) for `classes`, with the
    /// recording's UUIDs, clock mapping and environment.
    pub fn write_metadata(
        &mut self,
        ids: &TraceIds,
        clock: &ClockMapping,
        env: &TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        let stream = abi::IVT_STREAM_USER;
        let desc = ids.desc(stream, clock, self.timebase, env);
        let text = tsdl::metadata(&desc, stream, classes.stream(stream));
        self.dir
            .write_atomically("metadata", text.as_bytes())
            .map_err(write_err(self.dir.join("metadata").display()))?;
        self.generation = classes.generation();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use ivtrace_region::abi;
    use ivtrace_region::packet::TickRange;
    use ivtrace_region::region::{Access, Region};
    use ivtrace_region::Reader;
    use ivtrace_testutil::{RegionBuilder, TestRegion};
    use ivtrace_time::ClockMapping;

    use crate::kernel::tests::{finish_as_made, writer_with};
    use crate::tsdl::Timebase;
    use crate::CtfWriter;

    /// A 2.5 GHz mapping: its ticks and nanoseconds give different
    /// clock blocks.
    fn clock() -> ClockMapping {
        ClockMapping {
            freq_hz: 2_500_000_000,
            ..crate::kernel::tests::clock()
        }
    }

    /// One user channel holding one loadgen event.
    fn user_region() -> TestRegion {
        let mut r = RegionBuilder::new(1, 4, 4096).build_region();
        r.register_loadgen(0);
        assert!(r.emit(0, 10, 0, &TestRegion::loadgen_payload(1, 1, b"x")));
        r
    }

    /// Drains `r` into `writer` (complete packets, then committed
    /// prefixes) and commits; the reader, for its classes.
    fn drain(r: &TestRegion, writer: &mut CtfWriter) -> Reader {
        let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
        let mut reader = Reader::new(region, TickRange::ALL);
        reader.drain_available(writer).unwrap();
        reader.flush_partial(writer).unwrap();
        writer.commit().unwrap();
        reader
    }

    fn metadata(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("user/metadata")).unwrap()
    }

    /// The user trace is made on its first packet with the writer's time
    /// base, and its metadata's clock block says that time base.
    #[test]
    fn the_user_trace_counts_what_it_was_made_with() {
        let r = user_region();
        for (ticks, freq) in [(false, 1_000_000_000u64), (true, 2_500_000_000)] {
            let dir = tempfile::tempdir().unwrap();
            let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
            let mut writer = writer_with(dir.path(), &region, clock());
            if ticks {
                writer.keep_user_ticks();
            }
            assert!(
                !dir.path().join("user").exists(),
                "made on the first packet"
            );
            drain(&r, &mut writer);
            let text = metadata(dir.path());
            assert!(text.contains(&format!("freq = {freq};")), "{text}");
            assert!(text.contains("loadgen:payload"), "{text}");
            let want = [Timebase::Nanoseconds, Timebase::Ticks][ticks as usize];
            assert_eq!(writer.timebase(abi::IVT_STREAM_USER), want);
        }
    }

    /// `record --resume` adopts `DIR/user/`: its file keeps the packets
    /// already written and its metadata is written again.
    #[test]
    fn a_resumed_user_trace_is_adopted() {
        let r = user_region();
        let dir = tempfile::tempdir().unwrap();
        let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
        let mut first = writer_with(dir.path(), &region, clock());
        let reader = drain(&r, &mut first);
        drop(first);
        let file = dir.path().join("user/user_chan0");
        let len = std::fs::metadata(&file).unwrap().len();
        assert!(len > 0, "the first recorder wrote a packet");
        std::fs::remove_file(dir.path().join("user/metadata")).unwrap();
        let mut resumed = writer_with(dir.path(), &region, clock());
        let adopted = [(0, abi::IVT_STREAM_USER, len)];
        resumed.adopt(&adopted, reader.classes()).unwrap();
        finish_as_made(&mut resumed, reader.classes());
        assert!(metadata(dir.path()).contains("loadgen:payload"));
        assert_eq!(std::fs::metadata(&file).unwrap().len(), len);
        assert_eq!(resumed.file_of(0).as_deref(), Some("user/user_chan0"));
    }
}
