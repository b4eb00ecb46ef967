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
//! metadata is written once, up front, with every event class, and stream
//! files only ever receive whole packets: a process killed mid-run leaves
//! a valid trace of everything written before.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use ivtrace_region::abi::IVT_CTF_MAGIC;
use ivtrace_region::classes::EventClass;

use crate::outdir::OutDir;
use crate::trace::{create_err, write_err, CtfError};
use crate::tsdl::{host_metadata, EnvValue};

/// Bytes of packet header + context.
pub const PACKET_HDR: usize = 4 + 4 + 8 + 8 * 6 + 4;
/// A packet is written once its content reaches this size.
const PACKET_TARGET: usize = 64 << 10;

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
}

struct HStream {
    class: u32,
    instance: u64,
    cpu: u32,
    path: PathBuf,
    file: File,
    content: Vec<u8>,
    ts_begin: u64,
    last_ts: u64,
    events_in_packet: u64,
    /// Running count of events lost (CTF `events_discarded`).
    discarded: u64,
    seq: u64,
    events: u64,
}

/// A host trace being written.
pub struct HostTrace {
    dir: OutDir,
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
        let dir = parent
            .create_dir(name)
            .map_err(create_err(parent.join(name).display()))?;
        let text = host_metadata(desc, &random_uuid(), &classes);
        dir.write_atomically("metadata", text.as_bytes())
            .map_err(write_err(dir.join("metadata").display()))?;
        Ok(HostTrace {
            dir,
            classes,
            streams: Vec::new(),
            metadata: text,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn metadata_text(&self) -> &str {
        &self.metadata
    }

    pub fn class(&self, id: u32) -> Option<&EventClass> {
        self.classes.iter().find(|c| c.id == id)
    }

    /// Adds a stream file `name` (host-chosen, e.g. `host_cpu3`).
    pub fn add_stream(
        &mut self,
        stream_class: u32,
        cpu: u32,
        name: &str,
    ) -> Result<usize, CtfError> {
        let path = self.dir.join(name);
        let file = self
            .dir
            .create_file(name)
            .map_err(create_err(path.display()))?;
        self.streams.push(HStream {
            class: stream_class,
            instance: self.streams.len() as u64,
            cpu,
            path,
            file,
            content: Vec::with_capacity(PACKET_TARGET + 256),
            ts_begin: 0,
            last_ts: 0,
            events_in_packet: 0,
            discarded: 0,
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
            Self::write_packet(s)?;
        }
        Ok(())
    }

    /// Counts `n` events lost on `stream` (shown by the next packet).
    pub fn discarded(&mut self, stream: usize, n: u64) {
        let s = &mut self.streams[stream];
        s.discarded = s.discarded.saturating_add(n);
    }

    /// Events written so far on `stream`.
    pub fn events(&self, stream: usize) -> u64 {
        self.streams[stream].events
    }

    fn write_packet(s: &mut HStream) -> Result<(), CtfError> {
        if s.events_in_packet == 0 {
            return Ok(());
        }
        let bits = ((PACKET_HDR + s.content.len()) * 8) as u64;
        let mut p = Vec::with_capacity(PACKET_HDR + s.content.len());
        p.extend_from_slice(&IVT_CTF_MAGIC.to_le_bytes());
        p.extend_from_slice(&s.class.to_le_bytes());
        p.extend_from_slice(&s.instance.to_le_bytes());
        p.extend_from_slice(&s.ts_begin.to_le_bytes());
        p.extend_from_slice(&s.last_ts.to_le_bytes());
        p.extend_from_slice(&bits.to_le_bytes());
        p.extend_from_slice(&bits.to_le_bytes());
        p.extend_from_slice(&s.seq.to_le_bytes());
        p.extend_from_slice(&s.discarded.to_le_bytes());
        p.extend_from_slice(&s.cpu.to_le_bytes());
        debug_assert_eq!(p.len(), PACKET_HDR);
        p.extend_from_slice(&s.content);
        s.file.write_all(&p).map_err(write_err(s.path.display()))?;
        s.content.clear();
        s.events_in_packet = 0;
        s.seq += 1;
        Ok(())
    }

    /// Writes every open packet (so readers see everything so far).
    pub fn flush(&mut self) -> Result<(), CtfError> {
        for s in &mut self.streams {
            Self::write_packet(s)?;
        }
        Ok(())
    }

    /// Flushes and closes. Streams that never got an event are removed
    /// (babeltrace2 reads an empty stream file as an error-free nothing,
    /// but nobody needs it). Returns the events written per stream.
    pub fn finish(mut self) -> Result<Vec<u64>, CtfError> {
        self.flush()?;
        let mut counts = Vec::new();
        for s in &self.streams {
            if s.seq == 0 {
                if let Some(name) = s.path.file_name().and_then(|n| n.to_str()) {
                    let _ = self.dir.remove_file(name);
                }
            }
            counts.push(s.events);
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_region::classes::{Field, FieldType};
    use std::fs;

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
        t.discarded(b, 3);
        t.event(b, 100, 5, 42, &p).unwrap(); // clamped to 7
        assert_eq!(t.finish().unwrap(), vec![1, 2, 0]);
        let f = fs::read(dir.join("host_cpu1")).unwrap();
        assert_eq!(f.len(), PACKET_HDR + 2 * (12 + 4 + 16 + 4 + 3));
        assert_eq!(u64::from_le_bytes(f[16..24].try_into().unwrap()), 7);
        assert_eq!(u64::from_le_bytes(f[56..64].try_into().unwrap()), 3);
        assert!(!dir.join("host_cpu2").exists());
        let m = fs::read_to_string(dir.join("metadata")).unwrap();
        assert!(m.contains("name = \"sched_switch\";") && m.contains("_tid;"));
        assert!(m.contains("absolute = TRUE;") && m.contains("ivtrace_x = 1;"));
    }
}
