//! Reading back a trace in [`crate::host`]'s packet layout (`DIR/host/`,
//! `DIR/vm/`): its stream files, one event at a time, with the event
//! classes the trace was written with.
//!
//! The files are ours, but a reader must still not trust them (a crash
//! mid-write, a damaged disk): every length is bounded and a packet that
//! does not add up ends its stream with an error naming the file, never a
//! panic.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ivtrace_region::abi::IVT_CTF_MAGIC;
use ivtrace_region::classes::EventClass;

use crate::host::{PACKET_HDR, STREAM_KERNEL};
use crate::kernel::wire::{Layout, Offsets};

/// No packet ivtrace writes comes near this (64 KiB plus one event).
const PACKET_MAX: u64 = 16 << 20;

/// The payload layouts of a trace's event classes, by id.
pub struct Classes {
    by_id: HashMap<u32, (EventClass, Layout)>,
}

impl Classes {
    pub fn new(classes: &[EventClass]) -> Arc<Classes> {
        let by_id = classes
            .iter()
            .map(|c| {
                let layout = Layout::new(c.fields.iter().map(|f| f.ty));
                (c.id, (c.clone(), layout))
            })
            .collect();
        Arc::new(Classes { by_id })
    }

    pub fn get(&self, id: u32) -> Option<&EventClass> {
        self.by_id.get(&id).map(|(c, _)| c)
    }
}

/// One event read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub ts: u64,
    pub class_id: u32,
    /// The `_tid` context (stream class [`STREAM_KERNEL`]), else 0.
    pub tid: i32,
    /// The packet's `cpu_id`.
    pub cpu: u32,
    pub stream_class: u32,
    pub payload: Vec<u8>,
    /// Field start offsets in `payload`, the last one its end.
    pub offsets: Vec<u32>,
}

/// The events of one stream file, in file order.
pub struct StreamReader {
    path: PathBuf,
    file: BufReader<File>,
    classes: Arc<Classes>,
    packet: Vec<u8>,
    /// Next event's offset in `packet` and the content's end.
    pos: usize,
    end: usize,
    stream_class: u32,
    cpu: u32,
}

fn bad(path: &Path, what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what}", path.display()),
    )
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl StreamReader {
    pub fn open(path: &Path, classes: Arc<Classes>) -> io::Result<StreamReader> {
        Ok(StreamReader {
            path: path.to_path_buf(),
            file: BufReader::with_capacity(64 << 10, crate::outdir::open_regular(path)?),
            classes,
            packet: Vec::new(),
            pos: 0,
            end: 0,
            stream_class: 0,
            cpu: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the next packet; false at the end of the file.
    fn next_packet(&mut self) -> io::Result<bool> {
        self.packet.resize(PACKET_HDR, 0);
        match self.file.read_exact(&mut self.packet) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
            r => r?,
        }
        let p = &self.packet;
        let (content, size) = (u64_at(p, 32), u64_at(p, 40));
        if u32_at(p, 0) != IVT_CTF_MAGIC {
            return Err(bad(&self.path, "packet without the CTF magic".into()));
        }
        if size % 8 != 0
            || content > size
            || size > PACKET_MAX * 8
            || content < PACKET_HDR as u64 * 8
        {
            return Err(bad(&self.path, format!("packet of {content}/{size} bits")));
        }
        self.stream_class = u32_at(p, 4);
        self.cpu = u32_at(p, 64);
        self.packet.resize((size / 8) as usize, 0);
        self.file.read_exact(&mut self.packet[PACKET_HDR..])?;
        (self.pos, self.end) = (PACKET_HDR, (content / 8) as usize);
        Ok(true)
    }

    /// The next event, None at the end of the file.
    pub fn next_record(&mut self) -> io::Result<Option<Record>> {
        while self.pos >= self.end {
            if !self.next_packet()? {
                return Ok(None);
            }
        }
        let hdr = if self.stream_class == STREAM_KERNEL {
            16
        } else {
            12
        };
        let content = &self.packet[..self.end];
        let at = self.pos;
        if at + hdr > content.len() {
            return Err(bad(
                &self.path,
                format!("event header past the content at {at}"),
            ));
        }
        let class_id = u32_at(content, at);
        let ts = u64_at(content, at + 4);
        let tid = if hdr == 16 {
            u32_at(content, at + 12) as i32
        } else {
            0
        };
        let Some((_, layout)) = self.classes.by_id.get(&class_id) else {
            return Err(bad(
                &self.path,
                format!("unknown event class {class_id} at {at}"),
            ));
        };
        let payload = &content[at + hdr..];
        let mut scratch: Offsets = [0; 33];
        let Some(offs) = layout.offsets(payload, &mut scratch) else {
            return Err(bad(&self.path, format!("payload past the content at {at}")));
        };
        let len = *offs.last().expect("end offset") as usize;
        let rec = Record {
            ts,
            class_id,
            tid,
            cpu: self.cpu,
            stream_class: self.stream_class,
            payload: payload[..len].to_vec(),
            offsets: offs.to_vec(),
        };
        self.pos = at + hdr + len;
        Ok(Some(rec))
    }
}

/// The stream files of a trace directory: every file but `metadata` and
/// hidden ones, sorted by name.
pub fn stream_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "metadata" || name.starts_with('.') || !e.file_type()?.is_file() {
            continue;
        }
        out.push(e.path());
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{HostTrace, HostTraceDesc, Payload, STREAM_IVTRACE};
    use ivtrace_region::classes::{Field, FieldType};

    fn classes() -> Vec<EventClass> {
        vec![
            EventClass::new(
                0,
                STREAM_IVTRACE,
                "mark".into(),
                vec![Field::new("n", FieldType::U64, false)],
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
        ]
    }

    #[test]
    fn what_the_host_writer_wrote_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("host");
        let desc = HostTraceDesc {
            hostname: "h",
            trace_name: "t",
            error_ns: 1,
            env: vec![],
        };
        let root = crate::OutDir::root(tmp.path(), &Default::default()).unwrap();
        let mut t = HostTrace::create(&root, "host", &desc, classes()).unwrap();
        let a = t.add_stream(STREAM_IVTRACE, 0, "ivtrace_host").unwrap();
        let b = t.add_stream(STREAM_KERNEL, 3, "host_cpu3").unwrap();
        let mut p = b"qemu".to_vec();
        p.resize(16, 0);
        p.extend_from_slice(&7i32.to_le_bytes());
        p.extend_from_slice(b"hello\0");
        for i in 0..20_000u64 {
            t.event(b, 100, 1000 + i, 42, &p).unwrap();
        }
        t.event(a, 0, 5, 0, &Payload::default().u64(9).0).unwrap();
        t.finish().unwrap();
        let cl = Classes::new(&classes());
        let files = stream_files(&dir).unwrap();
        assert_eq!(files.len(), 2);
        let mut r = StreamReader::open(&dir.join("host_cpu3"), Arc::clone(&cl)).unwrap();
        let mut n = 0u64;
        while let Some(rec) = r.next_record().unwrap() {
            assert_eq!(
                (rec.ts, rec.class_id, rec.tid, rec.cpu),
                (1000 + n, 100, 42, 3)
            );
            assert_eq!(rec.offsets, [0, 16, 20, 26]);
            assert_eq!(&rec.payload[20..25], b"hello");
            n += 1;
        }
        assert_eq!(n, 20_000, "several packets");
        let mut r = StreamReader::open(&dir.join("ivtrace_host"), cl).unwrap();
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!((rec.ts, rec.stream_class, rec.tid), (5, STREAM_IVTRACE, 0));
        assert_eq!(rec.payload, 9u64.to_le_bytes());
        assert!(r.next_record().unwrap().is_none());
    }

    #[test]
    fn damaged_files_are_errors_not_panics() {
        let tmp = tempfile::tempdir().unwrap();
        let cl = Classes::new(&classes());
        let mut junk = vec![0u8; 200];
        junk[..4].copy_from_slice(&IVT_CTF_MAGIC.to_le_bytes());
        for (size, content) in [(200u64 * 8, 199 * 8), (8 << 30, 100), (80 * 8, 90 * 8)] {
            junk[32..40].copy_from_slice(&(content as u64).to_le_bytes());
            junk[40..48].copy_from_slice(&size.to_le_bytes());
            let f = tmp.path().join("s");
            std::fs::write(&f, &junk).unwrap();
            let mut r = StreamReader::open(&f, Arc::clone(&cl)).unwrap();
            assert!(read_to_error(&mut r), "{size} {content}");
        }
        // A truncated event: header past the content.
        junk[32..40].copy_from_slice(&((PACKET_HDR as u64 + 10) * 8).to_le_bytes());
        junk[40..48].copy_from_slice(&(200u64 * 8).to_le_bytes());
        let f = tmp.path().join("s");
        std::fs::write(&f, &junk).unwrap();
        assert!(read_to_error(&mut StreamReader::open(&f, cl).unwrap()));
    }

    /// Reads until the end; true if that end was an error.
    fn read_to_error(r: &mut StreamReader) -> bool {
        loop {
            match r.next_record() {
                Ok(Some(_)) => continue,
                Ok(None) => return false,
                Err(_) => return true,
            }
        }
    }
}
