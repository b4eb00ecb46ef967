//! One stream file read back, packet by packet and event by event, in
//! either of ivtrace's packet layouts ([`Packets`]), with the event classes
//! of the trace's metadata.
//!
//! The files are ours, but a reader must still not trust them (a crash
//! mid-write, a damaged disk): every length is bounded, and a packet that
//! does not add up ends the stream with an error naming the file and the
//! offset, never a panic.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ivtrace_region::abi::{self, IVT_CTF_MAGIC};
use ivtrace_region::bytes::{i32_at, int_at, le_u32, le_u64, u32_at, u64_at, uint_at};
use ivtrace_region::classes::{EventClass, FieldType};
use ivtrace_region::packet::PacketHeader;

use crate::host_trace::PACKET_HDR as HOST_PACKET_HDR;
use crate::kernel::wire::{align_event, event_header, Layout, Offsets};

use super::metadata::{Packets, StreamDecl};

/// No packet ivtrace writes comes near this (sub-buffers are at most
/// `IVT_SUBBUF_MAX`, host packets 64 KiB plus one event).
const PACKET_MAX: u64 = 16 << 20;

/// A trace's event classes with their payload layouts, by (stream class, id).
#[derive(Debug, Default)]
pub struct Classes {
    by_id: HashMap<(u32, u32), (Arc<EventClass>, Layout)>,
}

impl Classes {
    pub fn new(classes: &[EventClass]) -> Arc<Classes> {
        let by_id = classes
            .iter()
            .map(|c| {
                let layout = Layout::new(c.fields.iter().map(|f| f.ty));
                ((c.stream, c.id), (Arc::new(c.clone()), layout))
            })
            .collect();
        Arc::new(Classes { by_id })
    }

    /// The class `id` of stream class `stream`.
    pub fn get(&self, stream: u32, id: u32) -> Option<&Arc<EventClass>> {
        self.by_id.get(&(stream, id)).map(|(c, _)| c)
    }

    /// Every class, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<EventClass>> {
        self.by_id.values().map(|(c, _)| c)
    }
}

/// What the packet an event came in says about it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketInfo {
    pub stream_class: u32,
    pub cpu: u32,
    /// The process and thread that owned the channel (guest user
    /// channels); 0 in the other layouts.
    pub owner_pid: u32,
    pub owner_tid: u32,
    pub timestamp_begin: u64,
    pub timestamp_end: u64,
    /// The running count of events lost on the stream.
    pub events_discarded: u64,
}

/// One event read back.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its timestamp, in the trace's clock (see [`super::Clock`]).
    pub ts: u64,
    pub class: Arc<EventClass>,
    /// The `_tid` event context, where the stream class has one.
    pub tid: Option<i32>,
    pub packet: PacketInfo,
    pub payload: Vec<u8>,
    /// Field start offsets in `payload`, the last one its end.
    pub offsets: Vec<u32>,
}

impl Record {
    pub fn class_id(&self) -> u32 {
        self.class.id
    }

    pub fn cpu(&self) -> u32 {
        self.packet.cpu
    }

    /// The index of field `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.class.fields.iter().position(|f| f.name == name)
    }

    /// Field `i`'s bytes as written.
    pub fn field(&self, i: usize) -> Option<&[u8]> {
        let (a, b) = (
            *self.offsets.get(i)? as usize,
            *self.offsets.get(i + 1)? as usize,
        );
        self.payload.get(a..b)
    }

    /// An integer field, sign- or zero-extended as its type says.
    pub fn int(&self, i: usize) -> Option<i64> {
        let (bytes, signed) = self.class.fields.get(i)?.ty.integer()?;
        let (b, len) = (self.field(i)?, bytes as usize);
        if signed {
            int_at(b, 0, len)
        } else {
            uint_at(b, 0, len).map(|u| u as i64)
        }
    }

    /// A text field's bytes (`chars[N]` and `string` up to the first NUL,
    /// a counted text sequence without its count).
    pub fn text(&self, i: usize) -> Option<&[u8]> {
        let b = self.field(i)?;
        let b = match self.class.fields.get(i)?.ty {
            FieldType::Chars(_) | FieldType::String => b,
            FieldType::TextSeqU64 => b.get(8..)?,
            _ => return None,
        };
        Some(b.split(|&c| c == 0).next().unwrap_or(&[]))
    }

    /// Field `name` as an integer.
    pub fn int_named(&self, name: &str) -> Option<i64> {
        self.int(self.index(name)?)
    }

    /// Field `name` as text.
    pub fn text_named(&self, name: &str) -> Option<&[u8]> {
        self.text(self.index(name)?)
    }
}

/// Events lost on a stream, as CTF readers report them: the growth of
/// `events_discarded` from one packet to the next (babeltrace2 reports no
/// count for a first packet's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discarded {
    pub count: u64,
    /// The packet that announced them.
    pub packet: PacketInfo,
}

/// What a stream yields, in file order.
#[derive(Debug, Clone)]
pub enum Item {
    Event(Record),
    /// Before the first event of the packet that announced them.
    Discarded(Discarded),
}

impl Item {
    /// Its time in the trace's clock: an event's timestamp, a loss's
    /// packet's beginning.
    pub fn ts(&self) -> u64 {
        match self {
            Item::Event(r) => r.ts,
            Item::Discarded(d) => d.packet.timestamp_begin,
        }
    }
}

fn bad(path: &Path, what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what}", path.display()),
    )
}

/// The items of one stream file, in file order.
pub struct StreamReader {
    path: PathBuf,
    file: BufReader<File>,
    decl: StreamDecl,
    classes: Arc<Classes>,
    packet: Vec<u8>,
    info: PacketInfo,
    /// Next event's offset in `packet`, the content's end, the previous
    /// event's timestamp (compact headers count from it).
    pos: usize,
    end: usize,
    last_ts: u64,
    /// File offset of the current packet (for messages).
    offset: u64,
    packets: u64,
    /// Losses announced by the packet just loaded, not yet yielded.
    pending: Option<Discarded>,
}

impl StreamReader {
    /// Opens stream file `path` of a stream class declared as `decl`.
    pub fn open(path: &Path, decl: StreamDecl, classes: Arc<Classes>) -> io::Result<StreamReader> {
        Ok(StreamReader {
            path: path.to_path_buf(),
            file: BufReader::with_capacity(64 << 10, crate::outdir::open_regular(path)?),
            decl,
            classes,
            packet: Vec::new(),
            info: PacketInfo::default(),
            pos: 0,
            end: 0,
            last_ts: 0,
            offset: 0,
            packets: 0,
            pending: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn header_size(&self) -> usize {
        match self.decl.packets {
            Packets::Guest => abi::PACKET_HDR_SIZE,
            Packets::Host => HOST_PACKET_HDR,
        }
    }

    /// Reads the next packet; false at the end of the file.
    fn next_packet(&mut self) -> io::Result<bool> {
        let hdr = self.header_size();
        self.offset += self.packet.len() as u64;
        self.packet.resize(hdr, 0);
        match self.file.read_exact(&mut self.packet) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
            r => r?,
        }
        let info = self.parse_header()?;
        let (content, size) = (le_u64(&self.packet, 32), le_u64(&self.packet, 40));
        if size % 8 != 0 || content > size || size > PACKET_MAX * 8 || content < hdr as u64 * 8 {
            let at = self.offset;
            return Err(bad(
                &self.path,
                format!("packet of {content}/{size} bits at {at}"),
            ));
        }
        self.packet.resize((size / 8) as usize, 0);
        self.file.read_exact(&mut self.packet[hdr..]).map_err(|e| {
            bad(
                &self.path,
                format!("packet at {} cut short: {e}", self.offset),
            )
        })?;
        if self.packets > 0 && info.events_discarded > self.info.events_discarded {
            self.pending = Some(Discarded {
                count: info.events_discarded - self.info.events_discarded,
                packet: info,
            });
        }
        self.packets += 1;
        self.info = info;
        (self.pos, self.end) = (hdr, (content / 8) as usize);
        self.last_ts = info.timestamp_begin;
        Ok(true)
    }

    fn parse_header(&self) -> io::Result<PacketInfo> {
        let p = &self.packet;
        if le_u32(p, 0) != IVT_CTF_MAGIC {
            let at = self.offset;
            return Err(bad(&self.path, format!("no CTF magic at {at}")));
        }
        Ok(match self.decl.packets {
            Packets::Guest => {
                let h = PacketHeader::parse(p);
                PacketInfo {
                    stream_class: h.stream_id,
                    cpu: h.cpu_id,
                    owner_pid: h.owner_pid,
                    owner_tid: h.owner_tid,
                    timestamp_begin: h.timestamp_begin,
                    timestamp_end: h.timestamp_end,
                    events_discarded: h.events_discarded,
                }
            }
            Packets::Host => PacketInfo {
                stream_class: le_u32(p, 4),
                cpu: le_u32(p, 64),
                owner_pid: 0,
                owner_tid: 0,
                timestamp_begin: le_u64(p, 16),
                timestamp_end: le_u64(p, 24),
                events_discarded: le_u64(p, 56),
            },
        })
    }

    /// The next item, None at the end of the file.
    pub fn next_item(&mut self) -> io::Result<Option<Item>> {
        loop {
            if let Some(d) = self.pending.take() {
                return Ok(Some(Item::Discarded(d)));
            }
            if self.pos < self.end {
                return self.next_event().map(|r| Some(Item::Event(r)));
            }
            if !self.next_packet()? {
                return Ok(None);
            }
        }
    }

    /// The next event, losses skipped; None at the end of the file.
    pub fn next_record(&mut self) -> io::Result<Option<Record>> {
        loop {
            match self.next_item()? {
                Some(Item::Event(r)) => return Ok(Some(r)),
                Some(Item::Discarded(_)) => continue,
                None => return Ok(None),
            }
        }
    }

    /// The event header at `pos`: (class id, timestamp, tid, header length).
    fn event_head(&self, content: &[u8]) -> Option<(u32, u64, Option<i32>, usize)> {
        let at = self.pos;
        let (id, ts, len) = match self.decl.packets {
            Packets::Guest => {
                let h = event_header(content, at, self.last_ts)?;
                (h.id, h.ts, h.len)
            }
            Packets::Host => (
                u32_at(content, at)?,
                u64_at(content, at.checked_add(4)?)?,
                12,
            ),
        };
        if !self.decl.tid_context {
            return Some((id, ts, None, len));
        }
        let tid = i32_at(content, at.checked_add(len)?)?;
        Some((id, ts, Some(tid), len + 4))
    }

    fn next_event(&mut self) -> io::Result<Record> {
        let content = &self.packet[..self.end];
        let at = self.pos;
        let where_ = |what: &str| format!("{what} at {} + {at}", self.offset);
        let (id, ts, tid, hlen) = self
            .event_head(content)
            .ok_or_else(|| bad(&self.path, where_("an event header past the content")))?;
        let stream = self.info.stream_class;
        let Some((class, layout)) = self.classes.by_id.get(&(stream, id)) else {
            return Err(bad(
                &self.path,
                where_(&format!("unknown event class {stream}/{id}")),
            ));
        };
        let payload = &content[at + hlen..];
        let mut scratch: Offsets = [0; abi::IVT_FIELDS_MAX as usize + 1];
        let offs = layout
            .offsets(payload, &mut scratch)
            .ok_or_else(|| bad(&self.path, where_("a payload past the content")))?;
        let len = *offs.last().expect("end offset") as usize;
        let rec = Record {
            ts,
            class: Arc::clone(class),
            tid,
            packet: self.info,
            payload: payload[..len].to_vec(),
            offsets: offs.to_vec(),
        };
        self.last_ts = ts;
        self.pos = match self.decl.packets {
            Packets::Guest => align_event(at + hlen + len),
            Packets::Host => at + hlen + len,
        };
        Ok(rec)
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
