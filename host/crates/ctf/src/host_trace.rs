//! `DIR/host/`: a CTF 1.8 trace of host-side events on the host time base
//! (ivtrace-time's `timebase`: CLOCK_MONOTONIC shifted onto CLOCK_REALTIME), so
//! `babeltrace2 DIR` interleaves them with the guest's streams, whose
//! clocks map guest ticks onto the same base.
//!
//! Two stream classes:
//! - 0, `host kernel`: per-CPU streams of tracefs events (sched_switch of
//!   the QEMU vCPU threads, kvm_exit/kvm_entry/kvm_hypercall), with an
//!   LTTng-style `_tid` event context and `cpu_id` in the packet context;
//! - 1, `ivtrace`: what `ivtrace serve` itself observed (doorbells
//!   received, packets delivered, clock sync points, control commands).
//!
//! Event classes are ivtrace-region's [`EventClass`]es, declared by
//! ivtrace-ctf's TSDL blocks (the guest traces' `event` and `env` text).
//! Every integer is byte-aligned (`align = 8`), so packets need no padding;
//! the clock counts nanoseconds (`freq = 1e9`, offset 0, absolute). The
//! metadata is written once, up front, with every event class.
//!
//! [`HostTrace`] is the writer: it builds each packet (header, context,
//! loss counts, the lead and trailing packets of losses) and hands it,
//! whole, to its [`DirSink`] (the stream files) and then to the sinks
//! beside it ([`HostTrace::add_sink`]: a relay session).

use std::fs::File;
use std::path::Path;

use ivtrace_region::abi::IVT_CTF_MAGIC;
use ivtrace_region::bytes::{le_u32, le_u64};
use ivtrace_region::classes::EventClass;

use crate::outdir::OutDir;
use crate::sink::{DirSink, TraceSink};
use crate::trace::CtfError;
use crate::tsdl::{host_metadata, EnvValue};

/// Bytes of packet header + context.
pub const PACKET_HDR: usize = 4 + 4 + 8 + 8 * 6 + 4;
/// A packet is written once its content reaches this size.
const PACKET_TARGET: usize = 64 << 10;
/// The largest `events_discarded` (babeltrace2 takes 2^64-1 for
/// "unknown"; Trace Compass reads the field as a signed long).
const DISCARDED_MAX: u64 = i64::MAX as u64;

/// Stream class of host kernel (tracefs) events.
pub const STREAM_KERNEL: u32 = 0;
/// Stream class of ivtrace's own host events.
pub const STREAM_IVTRACE: u32 = 1;

/// Payload encoder for one event (fields in class order).
#[derive(Debug, Default)]
pub struct Payload(pub Vec<u8>);

impl Payload {
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A CTF string: the text up to any NUL in it, then a NUL.
    pub fn str(mut self, v: &str) -> Self {
        let b = v.as_bytes();
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        self.0.extend_from_slice(&b[..end]);
        self.0.push(0);
        self
    }
}

struct HStream {
    class: u32,
    instance: u64,
    cpu: u32,
    /// The stream file's name (what every sink calls the stream).
    name: String,
    content: Vec<u8>,
    ts_begin: u64,
    last_ts: u64,
    events_in_packet: u64,
    /// Running count of events lost (CTF `events_discarded`).
    discarded: u64,
    /// The count the last packet written carried.
    carried: u64,
    seq: u64,
    events: u64,
}

/// Where a host trace's packets go: the directory, then the sinks beside
/// it.
struct HostSinks {
    /// What the sinks call this trace (`host`, `vm`).
    trace: &'static str,
    dir: DirSink,
    beside: Vec<Box<dyn TraceSink>>,
}

impl HostSinks {
    /// One packet of `file` to the sinks beside the directory (which the
    /// caller gave it first): all of them, even after one failed, so one
    /// broken copy does not starve the others; the first error is returned.
    fn beside(&mut self, file: &str, bytes: &[u8], events: u64) -> Result<(), CtfError> {
        self.each_beside(|sink, trace| sink.packet(trace, file, bytes, events))
    }

    /// New metadata text, in the directory first, then beside it.
    fn metadata(&mut self, text: &str) -> Result<(), CtfError> {
        self.dir.metadata(self.trace, text, None)?;
        self.each_beside(|sink, trace| sink.metadata(trace, text, None))
    }

    /// Runs `f` on every sink beside the directory, each even after one
    /// failed; the first error.
    fn each_beside(
        &mut self,
        mut f: impl FnMut(&mut dyn TraceSink, &'static str) -> Result<(), CtfError>,
    ) -> Result<(), CtfError> {
        let mut first = Ok(());
        for sink in &mut self.beside {
            let sent = f(&mut **sink, self.trace);
            if first.is_ok() {
                first = sent;
            }
        }
        first
    }
}

/// A host trace being written.
pub struct HostTrace {
    sinks: HostSinks,
    classes: Vec<EventClass>,
    streams: Vec<HStream>,
    metadata: String,
}

/// What the trace says about itself.
pub struct HostTraceDesc<'a> {
    pub hostname: &'a str,
    pub trace_name: &'a str,
    /// Error of the host time base itself (precision, ns).
    pub error_ns: u64,
    pub env: Vec<(String, EnvValue)>,
}

/// A random (version 4) uuid for a trace or clock nobody else names.
pub(crate) fn random_uuid() -> String {
    let mut b = [0u8; 16];
    if File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_err()
    {
        // No randomness: time and pid still make it unique enough.
        let t = ivtrace_time::timebase::realtime_ns().to_le_bytes();
        b[..8].copy_from_slice(&t);
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    ivtrace_region::region::format_uuid(&b)
}

impl HostTrace {
    /// Creates `parent/name` (must not exist) and writes its metadata.
    pub fn create(
        parent: &OutDir,
        name: &str,
        desc: &HostTraceDesc,
        classes: Vec<EventClass>,
    ) -> Result<HostTrace, CtfError> {
        let text = host_metadata(desc, &random_uuid(), &classes);
        HostTrace::create_with_metadata(parent, name, "host", text, classes)
    }

    /// Creates `parent/name` (must not exist) with `text` as its metadata:
    /// another trace in this packet layout on another clock (the VM view's,
    /// `ivtrace-vmview`), which the sinks beside the directory call
    /// `trace`. `text` must declare `classes` and the stream classes
    /// [`STREAM_KERNEL`] (with a `_tid` context) and [`STREAM_IVTRACE`].
    pub fn create_with_metadata(
        parent: &OutDir,
        name: &str,
        trace: &'static str,
        text: String,
        classes: Vec<EventClass>,
    ) -> Result<HostTrace, CtfError> {
        let mut dir = DirSink::create(parent, name)?;
        dir.metadata(trace, &text, None)?;
        Ok(HostTrace {
            sinks: HostSinks {
                trace,
                dir,
                beside: Vec::new(),
            },
            classes,
            streams: Vec::new(),
            metadata: text,
        })
    }

    /// Sends the metadata, then every packet written from now on, to
    /// `sink` too, beside the directory (a relay session: what a live
    /// viewer sees from the moment it is added).
    pub fn add_sink(&mut self, mut sink: Box<dyn TraceSink>) -> Result<(), CtfError> {
        sink.metadata(self.sinks.trace, &self.metadata, None)?;
        self.sinks.beside.push(sink);
        Ok(())
    }

    /// Replaces the metadata (a trace whose env is only known at its end:
    /// the VM view's), in the directory first, then in the sinks beside it,
    /// each told even after one failed; the first error.
    pub fn set_metadata(&mut self, text: String) -> Result<(), CtfError> {
        let sent = self.sinks.metadata(&text);
        self.metadata = text;
        sent
    }

    pub fn dir(&self) -> &Path {
        self.sinks.dir.out_dir().path()
    }

    pub fn metadata_text(&self) -> &str {
        &self.metadata
    }

    pub fn class(&self, id: u32) -> Option<&EventClass> {
        self.classes.iter().find(|c| c.id == id)
    }

    /// Every event class the metadata declares.
    pub fn classes(&self) -> &[EventClass] {
        &self.classes
    }

    /// Adds a stream file `name` (host-chosen, e.g. `host_cpu3`).
    pub fn add_stream(
        &mut self,
        stream_class: u32,
        cpu: u32,
        name: &str,
    ) -> Result<usize, CtfError> {
        self.sinks.dir.add_file(name)?;
        self.streams.push(HStream {
            class: stream_class,
            instance: self.streams.len() as u64,
            cpu,
            name: name.to_string(),
            content: Vec::with_capacity(PACKET_TARGET + 256),
            ts_begin: 0,
            last_ts: 0,
            events_in_packet: 0,
            discarded: 0,
            carried: 0,
            seq: 0,
            events: 0,
        });
        Ok(self.streams.len() - 1)
    }

    /// Appends one event. `tid` is the event context of stream class 0
    /// (ignored for class 1). Timestamps are clamped to be monotonic
    /// within the stream.
    pub fn event(
        &mut self,
        stream: usize,
        class_id: u32,
        ts: u64,
        tid: i32,
        payload: &[u8],
    ) -> Result<(), CtfError> {
        let s = &mut self.streams[stream];
        let ts = ts.max(s.last_ts);
        if s.events_in_packet == 0 {
            s.ts_begin = ts;
        }
        s.last_ts = ts;
        s.content.extend_from_slice(&class_id.to_le_bytes());
        s.content.extend_from_slice(&ts.to_le_bytes());
        if s.class == STREAM_KERNEL {
            s.content.extend_from_slice(&tid.to_le_bytes());
        }
        s.content.extend_from_slice(payload);
        s.events_in_packet += 1;
        s.events += 1;
        if s.content.len() >= PACKET_TARGET {
            Self::write_packet(s, &mut self.sinks)?;
        }
        Ok(())
    }

    /// Counts `n` events lost on `stream` before the events that follow:
    /// the open packet is written first, so the next packet announces the
    /// loss between the events around it (and [`HostTrace::finish`]
    /// writes an empty packet for a loss no later packet announces).
    pub fn discarded(&mut self, stream: usize, n: u64) -> Result<(), CtfError> {
        let s = &mut self.streams[stream];
        if n == 0 {
            return Ok(());
        }
        Self::write_packet(s, &mut self.sinks)?;
        s.discarded = s.discarded.saturating_add(n).min(DISCARDED_MAX);
        Ok(())
    }

    /// Events lost on `stream` so far (what its packets carry at the end).
    pub fn discarded_count(&self, stream: usize) -> u64 {
        self.streams[stream].discarded
    }

    /// Events written so far on `stream`.
    pub fn events(&self, stream: usize) -> u64 {
        self.streams[stream].events
    }

    /// Writes the open packet, if it has events.
    fn write_packet(s: &mut HStream, sinks: &mut HostSinks) -> Result<(), CtfError> {
        if s.events_in_packet == 0 {
            return Ok(());
        }
        Self::lead_packet(s, sinks, s.ts_begin)?;
        let (begin, end) = (s.ts_begin, s.last_ts);
        let content = std::mem::take(&mut s.content);
        let events = s.events_in_packet;
        let written = Self::put_packet(s, sinks, (begin, end), &content, events);
        s.content = content;
        s.content.clear();
        s.events_in_packet = 0;
        written
    }

    /// babeltrace2 gives no count for losses a stream's first packet
    /// announces: a stream whose first packet would carry some starts with
    /// an empty packet that carries none.
    fn lead_packet(s: &mut HStream, sinks: &mut HostSinks, ts: u64) -> Result<(), CtfError> {
        if s.seq > 0 || s.discarded == 0 {
            return Ok(());
        }
        let discarded = std::mem::replace(&mut s.discarded, 0);
        let written = Self::put_packet(s, sinks, (ts, ts), &[], 0);
        s.discarded = discarded;
        written
    }

    /// Writes one packet of `content`, from `begin` to `end`, carrying the
    /// stream's loss count: to the directory, then to the sinks beside it.
    /// The stream moves on (sequence number, losses announced) once the
    /// directory has the packet, whatever the sinks beside it say.
    fn put_packet(
        s: &mut HStream,
        sinks: &mut HostSinks,
        (begin, end): (u64, u64),
        content: &[u8],
        events: u64,
    ) -> Result<(), CtfError> {
        let bits = ((PACKET_HDR + content.len()) * 8) as u64;
        let mut p = Vec::with_capacity(PACKET_HDR + content.len());
        p.extend_from_slice(&IVT_CTF_MAGIC.to_le_bytes());
        p.extend_from_slice(&s.class.to_le_bytes());
        p.extend_from_slice(&s.instance.to_le_bytes());
        p.extend_from_slice(&begin.to_le_bytes());
        p.extend_from_slice(&end.to_le_bytes());
        p.extend_from_slice(&bits.to_le_bytes());
        p.extend_from_slice(&bits.to_le_bytes());
        p.extend_from_slice(&s.seq.to_le_bytes());
        p.extend_from_slice(&s.discarded.to_le_bytes());
        p.extend_from_slice(&s.cpu.to_le_bytes());
        debug_assert_eq!(p.len(), PACKET_HDR);
        p.extend_from_slice(content);
        sinks.dir.packet(sinks.trace, &s.name, &p, events)?;
        s.seq += 1;
        s.carried = s.discarded;
        sinks.beside(&s.name, &p, events)
    }

    /// Losses that no packet announced yet get an empty packet of their
    /// own, at the stream's last time (or now, if it never had an event).
    fn write_trailing_losses(s: &mut HStream, sinks: &mut HostSinks) -> Result<(), CtfError> {
        if s.discarded <= s.carried {
            return Ok(());
        }
        let ts = match s.last_ts {
            0 => ivtrace_time::timebase::host_now_ns(),
            t => t,
        };
        s.last_ts = ts;
        Self::lead_packet(s, sinks, ts)?;
        Self::put_packet(s, sinks, (ts, ts), &[], 0)
    }

    /// Writes every open packet (so readers see everything so far).
    pub fn flush(&mut self) -> Result<(), CtfError> {
        for s in &mut self.streams {
            Self::write_packet(s, &mut self.sinks)?;
        }
        Ok(())
    }

    /// Flushes and closes: every loss is in a packet; the directory drops
    /// the stream files that never got one ([`DirSink::finish`]). Returns
    /// the events written per stream.
    pub fn finish(mut self) -> Result<Vec<u64>, CtfError> {
        self.flush()?;
        for s in &mut self.streams {
            Self::write_trailing_losses(s, &mut self.sinks)?;
        }
        self.sinks.dir.finish();
        Ok(self.streams.iter().map(|s| s.events).collect())
    }
}

/// Events the host trace in `dir` says it lost: per stream file, the
/// `events_discarded` of its last packet (a running count), summed. For
/// `ivtrace report`, which checks it against the recorded reasons.
pub fn trace_discarded(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == "metadata" || name.starts_with('.') || !entry.file_type()?.is_file() {
            continue;
        }
        total = total.saturating_add(stream_discarded(&entry.path())?);
    }
    Ok(total)
}

/// The last packet's `events_discarded` of one host stream file (packets
/// are found by their `packet_size`; a cut last packet ends the walk).
fn stream_discarded(path: &Path) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let (mut off, mut last) = (0u64, 0u64);
    let mut hdr = [0u8; PACKET_HDR];
    while off + PACKET_HDR as u64 <= len {
        f.seek(SeekFrom::Start(off))?;
        f.read_exact(&mut hdr)?;
        // The header array is PACKET_HDR (64) bytes: every field is inside.
        let size = le_u64(&hdr, 40) / 8;
        if le_u32(&hdr, 0) != IVT_CTF_MAGIC || size < PACKET_HDR as u64 {
            break;
        }
        last = le_u64(&hdr, 56);
        off = off.saturating_add(size);
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_region::classes::{Field, FieldType};
    use std::fs;
    use std::sync::Arc;

    #[test]
    fn packets_and_metadata_are_consistent() {
        let tmp = tempfile::tempdir().unwrap();
        let classes = vec![
            EventClass::new(
                0,
                STREAM_IVTRACE,
                "ivtrace_doorbell_received".into(),
                vec![
                    Field::new("count", FieldType::U64, false),
                    Field::new("total", FieldType::U64, false),
                ],
            ),
            EventClass::new(
                100,
                STREAM_KERNEL,
                "sched_switch".into(),
                vec![
                    Field::new("prev_comm", FieldType::Chars(16), false),
                    Field::new("prev_tid", FieldType::S32, false),
                    Field::new("s", FieldType::String, false),
                ],
            ),
        ];
        let desc = HostTraceDesc {
            hostname: "h",
            trace_name: "t",
            error_ns: 5,
            env: vec![("ivtrace_x".into(), EnvValue::Int(1))],
        };
        let root = OutDir::root(tmp.path(), &Default::default()).unwrap();
        let dir = tmp.path().join("host");
        let mut t = HostTrace::create(&root, "host", &desc, classes).unwrap();
        let a = t.add_stream(STREAM_IVTRACE, 0, "ivtrace_host").unwrap();
        let b = t.add_stream(STREAM_KERNEL, 1, "host_cpu1").unwrap();
        let _unused = t.add_stream(STREAM_KERNEL, 2, "host_cpu2").unwrap();
        t.event(a, 0, 10, 0, &Payload::default().u64(1).u64(1).0)
            .unwrap();
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"qemu");
        let mut p = comm.to_vec();
        p.extend_from_slice(&5i32.to_le_bytes());
        p.extend_from_slice(b"hi\0");
        t.event(b, 100, 7, 42, &p).unwrap();
        t.discarded(b, 3).unwrap();
        t.event(b, 100, 5, 42, &p).unwrap(); // clamped to 7
        assert_eq!(t.finish().unwrap(), vec![1, 2, 0]);
        // The loss sits between the two events: each has a packet, the
        // second announces it.
        let f = fs::read(dir.join("host_cpu1")).unwrap();
        let ev = 12 + 4 + 16 + 4 + 3;
        assert_eq!(f.len(), 2 * (PACKET_HDR + ev));
        assert_eq!(le_u64(&f, 16), 7);
        assert_eq!(le_u64(&f, 56), 0);
        let second = PACKET_HDR + ev;
        let at = |o: usize| le_u64(&f, second + o);
        assert_eq!((at(16), at(48), at(56)), (7, 1, 3));
        assert!(!dir.join("host_cpu2").exists());
        let m = fs::read_to_string(dir.join("metadata")).unwrap();
        assert!(m.contains("name = \"sched_switch\";") && m.contains("_tid;"));
        assert!(m.contains("absolute = TRUE;") && m.contains("ivtrace_x = 1;"));
    }

    /// (seq, ts_begin, ts_end, content bits, discarded) of every packet.
    fn headers(f: &[u8]) -> Vec<(u64, u64, u64, u64, u64)> {
        let at = |o: usize| le_u64(f, o);
        let mut out = Vec::new();
        let mut off = 0;
        while off < f.len() {
            out.push((
                at(off + 48),
                at(off + 16),
                at(off + 24),
                at(off + 32),
                at(off + 56),
            ));
            off += at(off + 40) as usize / 8;
        }
        out
    }

    #[test]
    fn every_loss_reaches_a_packet_and_the_first_packet_carries_none() {
        let tmp = tempfile::tempdir().unwrap();
        let desc = HostTraceDesc {
            hostname: "h",
            trace_name: "t",
            error_ns: 5,
            env: vec![],
        };
        let classes = vec![EventClass::new(7, STREAM_KERNEL, "e".into(), vec![])];
        let root = OutDir::root(tmp.path(), &Default::default()).unwrap();
        let dir = tmp.path().join("host");
        let mut t = HostTrace::create(&root, "host", &desc, classes).unwrap();
        let early = t.add_stream(STREAM_KERNEL, 0, "host_cpu0").unwrap();
        let late = t.add_stream(STREAM_KERNEL, 1, "host_cpu1").unwrap();
        let only = t.add_stream(STREAM_KERNEL, 2, "host_cpu2").unwrap();
        // Lost before the first event, then again after the last one.
        t.discarded(early, 4).unwrap();
        t.event(early, 7, 100, 1, &[]).unwrap();
        t.event(early, 7, 110, 1, &[]).unwrap();
        t.discarded(early, 2).unwrap();
        // Events, then a loss no later event announces.
        t.event(late, 7, 200, 1, &[]).unwrap();
        t.discarded(late, 5).unwrap();
        // Nothing but a loss.
        t.discarded(only, u64::MAX).unwrap();
        let before = ivtrace_time::timebase::host_now_ns();
        t.finish().unwrap();
        let hdr = PACKET_HDR as u64 * 8;
        let ev = hdr + 2 * 16 * 8;
        let read = |n: &str| headers(&fs::read(dir.join(n)).unwrap());
        assert_eq!(
            read("host_cpu0"),
            vec![
                (0, 100, 100, hdr, 0),
                (1, 100, 110, ev, 4),
                (2, 110, 110, hdr, 6)
            ]
        );
        assert_eq!(
            read("host_cpu1"),
            vec![(0, 200, 200, hdr + 16 * 8, 0), (1, 200, 200, hdr, 5)]
        );
        assert_eq!(trace_discarded(&dir).unwrap(), 6 + 5 + DISCARDED_MAX);
        let only = read("host_cpu2");
        assert_eq!(only.len(), 2);
        assert_eq!(
            (only[0].0, only[0].4, only[1].0, only[1].4),
            (0, 0, 1, DISCARDED_MAX)
        );
        assert!(
            only[1].1 >= before,
            "a stream without events announces at the end's time"
        );
        if let Some(n) = babeltrace2_discarded(&dir) {
            assert_eq!(n, 6 + 5 + DISCARDED_MAX, "babeltrace2 counts every loss");
        }
    }

    /// What a sink beside the directory got: (trace, text) of each
    /// metadata, and each file's packets end to end.
    #[derive(Default)]
    struct Copy {
        metadata: Vec<(&'static str, String)>,
        files: std::collections::BTreeMap<String, Vec<u8>>,
        events: u64,
    }

    /// Shared, so the test reads what the trace's sink sent.
    struct CopySink(Arc<std::sync::Mutex<Copy>>);

    impl TraceSink for CopySink {
        fn metadata(
            &mut self,
            trace: &'static str,
            text: &str,
            _classes: Option<&ivtrace_region::classes::StreamClasses>,
        ) -> Result<(), CtfError> {
            let mut c = self.0.lock().unwrap();
            c.metadata.push((trace, text.to_string()));
            Ok(())
        }

        fn packet(
            &mut self,
            trace: &'static str,
            file: &str,
            bytes: &[u8],
            events: u64,
        ) -> Result<(), CtfError> {
            let mut c = self.0.lock().unwrap();
            let name = format!("{trace}/{file}");
            c.files.entry(name).or_default().extend_from_slice(bytes);
            c.events += events;
            Ok(())
        }
    }

    /// A sink beside the directory gets the metadata when it is added and
    /// every packet written from then on, byte for byte what the stream
    /// files hold (losses' lead and trailing packets too).
    #[test]
    fn a_sink_beside_the_directory_gets_what_the_files_get() {
        let tmp = tempfile::tempdir().unwrap();
        let root = OutDir::root(tmp.path(), &Default::default()).unwrap();
        let classes = vec![EventClass::new(7, STREAM_KERNEL, "e".into(), vec![])];
        let text = "/* CTF 1.8 */ the vm view's metadata\n".to_string();
        let first = text.clone();
        let mut t = HostTrace::create_with_metadata(&root, "vm-2", "vm", text, classes).unwrap();
        let a = t.add_stream(STREAM_KERNEL, 0, "vm_cpu0").unwrap();
        let copy = Arc::new(std::sync::Mutex::new(Copy::default()));
        t.add_sink(Box::new(CopySink(Arc::clone(&copy)))).unwrap();
        let b = t.add_stream(STREAM_KERNEL, 1, "vm_cpu1").unwrap();
        let _never = t.add_stream(STREAM_KERNEL, 2, "vm_cpu2").unwrap();
        t.discarded(a, 2).unwrap();
        for ts in 0..10_000u64 {
            t.event(a, 7, ts, 1, &[]).unwrap();
            t.event(b, 7, ts, 2, &[]).unwrap();
        }
        t.discarded(b, 3).unwrap();
        // The VM view's env is only known at its end.
        let last = format!("{first}env {{ end = 1; }};\n");
        t.set_metadata(last.clone()).unwrap();
        assert_eq!(t.finish().unwrap(), vec![10_000, 10_000, 0]);
        let dir = tmp.path().join("vm-2");
        let c = copy.lock().unwrap();
        let on_disk = fs::read_to_string(dir.join("metadata")).unwrap();
        assert_eq!(on_disk, last);
        assert_eq!(c.metadata, vec![("vm", first), ("vm", last)]);
        for file in ["vm_cpu0", "vm_cpu1"] {
            let sent = &c.files[&format!("vm/{file}")];
            let packets = headers(sent).len();
            assert!(packets > 2, "{file}: several packets, not {packets}");
            assert!(*sent == fs::read(dir.join(file)).unwrap(), "{file} differs");
        }
        assert_eq!(c.files.len(), 2, "nothing for the stream without packets");
        assert_eq!(c.events, 20_000);
        assert!(!dir.join("vm_cpu2").exists());
    }

    /// The discarded events babeltrace2's text output warns about (None
    /// without babeltrace2).
    fn babeltrace2_discarded(dir: &Path) -> Option<u64> {
        if !ivtrace_testutil::have_tool("babeltrace2") {
            eprintln!("SKIP: babeltrace2 is not installed");
            return None;
        }
        let o = std::process::Command::new("babeltrace2")
            .arg(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stderr);
        let counts = text.lines().filter_map(|l| {
            let rest = l.split("Tracer discarded ").nth(1)?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        });
        Some(counts.fold(0u64, u64::saturating_add))
    }
}
