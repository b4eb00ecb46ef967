//! The forwarded stream of nested tracing: how an L1 guest that records
//! its own guest (L2) carries L2's trace through its region to the host,
//! and the host's checked reading of it (hostile input, like every byte
//! of a region). ivtrace-nested writes the traces it carries.
//!
//! Wire (L1's pipe to `ivtrace-forward`): frames `u32 kind, u32 len, len
//! bytes`; each frame becomes one [`FORWARD_CLASS`] event whose payload is
//! `u32 kind, u32 len, the bytes`. The bytes are a chunk of a message:
//! `u32 total, u32 offset, chunk`, at most [`CHUNK_MAX`] bytes of it.
//! Messages: [`HELLO`] (JSON [`Hello`]), [`META`] (JSON
//! `Vec<`[`ClassWire`]`>`), [`PACKET`] ([`PacketMessage`]: `u32 chan, u32
//! stream`, the packet), [`CLOCK`] (JSON clock mapping on L1's
//! CLOCK_MONOTONIC). [`SYNC_CLASS`] events (`u64 mono, u32 phase`) bracket
//! L1's CLOCK_MONOTONIC around its writer clock ([`SyncBrackets`]).
//!
//! Every malformed input is refused with a [`FrameError`] that says what
//! was wrong, and the caller counts the message as lost: a short chunk, an
//! offset that skips or repeats bytes, a total past [`MESSAGE_MAX`],
//! lengths past the end, unfinished messages that would hold more than
//! [`PARTIAL_TOTAL_MAX`] bytes together.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::abi;
use crate::bytes::{slice_at, u32_at, u64_at};
use crate::classes::{EventClass, EventClasses, Field, FieldType};
use crate::packet::EventVisitor;
use crate::sanitize;

/// Largest chunk of a message in one event: fits the smallest packet
/// (4 KiB) with its header and the event's own header and fields.
pub const CHUNK_MAX: usize = 3072;
/// Largest message the host reassembles: a packet of the largest
/// sub-buffer and its [`PacketMessage`] header.
pub const MESSAGE_MAX: u32 = abi::IVT_SUBBUF_MAX + 8;
/// Bytes of unfinished messages held at once, all L1 channels together:
/// one largest message (an honest forwarder is one thread that sends one
/// message at a time). A chunk that would need more drops its message,
/// counted: a guest that starts a message on every channel and finishes
/// none costs this much, not 16 MiB per channel.
pub const PARTIAL_TOTAL_MAX: usize = MESSAGE_MAX as usize;
/// The classes `ivtrace-forward` registers in L1's region.
pub const FORWARD_CLASS: &str = "ivtrace:forward";
pub const SYNC_CLASS: &str = "ivtrace:forward_sync";

/// Message kinds.
pub const HELLO: u32 = 1;
pub const META: u32 = 2;
pub const PACKET: u32 = 3;
pub const CLOCK: u32 = 4;

/// Bytes before a chunk's data: `u32 total, u32 offset`.
const CHUNK_HEADER: usize = 8;

/// Why a chunk or message of the forwarded stream was refused (its
/// message is lost and counted).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("a chunk of {len} bytes is shorter than its 8-byte header (total, offset)")]
    ShortChunk { len: usize },
    #[error(
        "a message claims {total} bytes, more than the largest forwarded message ({MESSAGE_MAX})"
    )]
    TooLarge { total: u32 },
    #[error("a chunk at offset {offset} does not continue the message (expected {expected})")]
    OutOfOrder { offset: u32, expected: usize },
    #[error("a chunk of kind {kind} continues a message of kind {was}")]
    KindChanged { kind: u32, was: u32 },
    #[error("a chunk ends at byte {end}, past the message's {total} bytes")]
    PastTotal { end: usize, total: u32 },
    #[error("a chunk claims total {total}, its message began with {was}")]
    TotalChanged { total: u32, was: u32 },
    #[error("unfinished forwarded messages would hold more than {PARTIAL_TOTAL_MAX} bytes")]
    OverCap,
    #[error("a packet message of {len} bytes is shorter than its 8-byte header (chan, stream)")]
    ShortPacket { len: usize },
}

/// One chunk of a message, parsed from an event's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    pub total: u32,
    pub offset: u32,
    pub data: &'a [u8],
}

impl<'a> Chunk<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Chunk<'a>, FrameError> {
        let short = FrameError::ShortChunk { len: bytes.len() };
        Ok(Chunk {
            total: u32_at(bytes, 0).ok_or(short.clone())?,
            offset: u32_at(bytes, 4).ok_or(short.clone())?,
            data: bytes.get(CHUNK_HEADER..).ok_or(short)?,
        })
    }
}

/// A [`PACKET`] message: which of L2's channels and streams, the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketMessage<'a> {
    pub chan: u32,
    pub stream: u32,
    pub packet: &'a [u8],
}

impl<'a> PacketMessage<'a> {
    pub fn parse(msg: &'a [u8]) -> Result<PacketMessage<'a>, FrameError> {
        let short = FrameError::ShortPacket { len: msg.len() };
        Ok(PacketMessage {
            chan: u32_at(msg, 0).ok_or(short.clone())?,
            stream: u32_at(msg, 4).ok_or(short.clone())?,
            packet: msg.get(8..).ok_or(short)?,
        })
    }

    /// The message's bytes (L1's side).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.packet.len().saturating_add(8));
        body.extend_from_slice(&self.chan.to_le_bytes());
        body.extend_from_slice(&self.stream.to_le_bytes());
        body.extend_from_slice(self.packet);
        body
    }
}

/// One message on the pipe, in frames of at most [`CHUNK_MAX`] bytes of
/// it (L1's side). A body past u32 (never: a packet is at most 16 MiB) is
/// refused.
pub fn write_message(out: &mut impl Write, kind: u32, body: &[u8]) -> std::io::Result<()> {
    let too_big = || std::io::Error::other("a forwarded message past 4 GiB");
    let total = u32::try_from(body.len()).map_err(|_| too_big())?;
    let mut offset = 0u32;
    let mut rest = body;
    loop {
        let (chunk, after) = rest.split_at(rest.len().min(CHUNK_MAX));
        // CHUNK_MAX + 8 fits a u32; offset + chunk <= total, a u32.
        let len = u32::try_from(chunk.len()).map_err(|_| too_big())?;
        out.write_all(&kind.to_le_bytes())?;
        out.write_all(&len.saturating_add(8).to_le_bytes())?;
        out.write_all(&total.to_le_bytes())?;
        out.write_all(&offset.to_le_bytes())?;
        out.write_all(chunk)?;
        offset = offset.saturating_add(len);
        rest = after;
        if rest.is_empty() {
            return Ok(());
        }
    }
}

/// The frames of pipe bytes `wire`, as `ivtrace-forward` reads them:
/// (kind, the chunk's bytes) each; a frame cut short ends the list
/// (`ivtrace-forward` stops there too). Tests and tools use it to see
/// what [`write_message`] sent.
pub fn split_frames(wire: &[u8]) -> Vec<(u32, &[u8])> {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while let (Some(kind), Some(len)) = (u32_at(wire, at), u32_at(wire, at.saturating_add(4))) {
        let Some(data) = slice_at(wire, at.saturating_add(8), len as usize) else {
            break;
        };
        frames.push((kind, data));
        at = at.saturating_add(8).saturating_add(data.len());
    }
    frames
}

/// A message being reassembled from one L1 channel's chunks.
struct Partial {
    kind: u32,
    total: u32,
    buf: Vec<u8>,
}

impl Partial {
    /// Whether `c` (of `kind`) is the next chunk of this message.
    fn check_next(&self, kind: u32, c: &Chunk) -> Result<(), FrameError> {
        let end = self.buf.len().saturating_add(c.data.len());
        if c.total > MESSAGE_MAX {
            return Err(FrameError::TooLarge { total: c.total });
        }
        if kind != self.kind {
            return Err(FrameError::KindChanged {
                kind,
                was: self.kind,
            });
        }
        if c.total != self.total {
            return Err(FrameError::TotalChanged {
                total: c.total,
                was: self.total,
            });
        }
        if c.offset as usize != self.buf.len() {
            let expected = self.buf.len();
            return Err(FrameError::OutOfOrder {
                offset: c.offset,
                expected,
            });
        }
        if end > c.total as usize {
            return Err(FrameError::PastTotal {
                end,
                total: c.total,
            });
        }
        Ok(())
    }
}

/// What one chunk did.
#[derive(Debug, PartialEq, Eq)]
pub struct Pushed {
    /// The channel's unfinished message was dropped: this chunk began a
    /// new one (L1 lost a chunk of the old one).
    pub dropped_unfinished: bool,
    /// The message this chunk completed (`Ok(None)`: more to come), or why
    /// it was refused (the message is lost).
    pub outcome: Result<Option<Vec<u8>>, FrameError>,
}

impl Pushed {
    /// Messages this chunk cost (0, 1 or 2).
    pub fn lost(&self) -> u64 {
        u64::from(self.dropped_unfinished).saturating_add(u64::from(self.outcome.is_err()))
    }
}

/// Reassembles the messages of every L1 channel, within
/// [`PARTIAL_TOTAL_MAX`] bytes of unfinished messages together.
#[derive(Default)]
pub struct Reassembly {
    partial: HashMap<u32, Partial>,
    /// The capacity of every buffer in `partial`.
    held: usize,
    /// Messages refused because they would pass [`PARTIAL_TOTAL_MAX`].
    over_cap: u64,
}

impl Reassembly {
    /// Adds the data of one [`FORWARD_CLASS`] event of channel `chan`.
    pub fn push(&mut self, chan: u32, kind: u32, data: &[u8]) -> Pushed {
        // A chunk too short to say where it belongs is lost alone.
        let c = match Chunk::parse(data) {
            Ok(c) => c,
            Err(e) => {
                return Pushed {
                    dropped_unfinished: false,
                    outcome: Err(e),
                }
            }
        };
        let mut dropped_unfinished = false;
        if c.offset == 0 {
            dropped_unfinished = self.take(chan).is_some_and(|b| !b.is_empty());
            let buf = Vec::new();
            self.partial.insert(
                chan,
                Partial {
                    kind,
                    total: c.total,
                    buf,
                },
            );
        }
        let outcome = self.add(chan, kind, &c);
        if outcome.is_err() {
            self.take(chan);
        }
        if outcome == Err(FrameError::OverCap) {
            self.over_cap = self.over_cap.saturating_add(1);
        }
        Pushed {
            dropped_unfinished,
            outcome,
        }
    }

    fn add(&mut self, chan: u32, kind: u32, c: &Chunk) -> Result<Option<Vec<u8>>, FrameError> {
        let p = self.partial.get(&chan).ok_or(FrameError::OutOfOrder {
            offset: c.offset,
            expected: 0,
        })?;
        p.check_next(kind, c)?;
        self.reserve(chan, c.data.len())?;
        let Some(p) = self.partial.get_mut(&chan) else {
            return Ok(None);
        };
        p.buf.extend_from_slice(c.data);
        if p.buf.len() != p.total as usize {
            return Ok(None);
        }
        Ok(self.take(chan))
    }

    /// Makes room for `more` bytes in `chan`'s message: it grows by
    /// doubling up to its claimed total, within [`PARTIAL_TOTAL_MAX`] for
    /// every message together.
    fn reserve(&mut self, chan: u32, more: usize) -> Result<(), FrameError> {
        let p = self.partial.get_mut(&chan).ok_or(FrameError::OverCap)?;
        let need = p.buf.len().saturating_add(more);
        let cap = p.buf.capacity();
        if need <= cap {
            return Ok(());
        }
        let grow_to = cap.saturating_mul(2).min(p.total as usize).max(need);
        if self.held.saturating_add(grow_to.saturating_sub(cap)) > PARTIAL_TOTAL_MAX {
            return Err(FrameError::OverCap);
        }
        p.buf.reserve_exact(grow_to.saturating_sub(p.buf.len()));
        let grown = p.buf.capacity().saturating_sub(cap);
        self.held = self.held.saturating_add(grown);
        Ok(())
    }

    /// Removes `chan`'s unfinished message, its bytes off the total.
    fn take(&mut self, chan: u32) -> Option<Vec<u8>> {
        let p = self.partial.remove(&chan)?;
        self.held = self.held.saturating_sub(p.buf.capacity());
        Some(p.buf)
    }

    /// The end of the stream: drops every unfinished message and returns
    /// their channels (one lost message each).
    pub fn finish(&mut self) -> Vec<u32> {
        let unfinished: Vec<u32> = self.partial.keys().copied().collect();
        for &chan in &unfinished {
            self.take(chan);
        }
        unfinished
    }

    /// Bytes the unfinished messages hold (at most [`PARTIAL_TOTAL_MAX`]).
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Messages refused because they would pass [`PARTIAL_TOTAL_MAX`].
    pub fn over_cap(&self) -> u64 {
        self.over_cap
    }
}

/// One sync bracket: L1's writer clock was read at `at_ns` (the event's
/// time in L0's trace: nanoseconds on L0's timeline, the drain converts
/// L1's user stream) while L1's CLOCK_MONOTONIC was in [mono_before,
/// mono_after].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SyncBracket {
    pub at_ns: u64,
    pub mono_before: u64,
    pub mono_after: u64,
}

/// The tightest bracket of L1's [`SYNC_CLASS`] events: phase 0 (the
/// writer clock's ticks and CLOCK_MONOTONIC before), then phase 1 on the
/// same channel (CLOCK_MONOTONIC after). A lone phase, or a bracket whose
/// end is before its beginning, is no bracket.
#[derive(Default)]
pub struct SyncBrackets {
    pending: HashMap<u32, (u64, u64)>,
    best: Option<SyncBracket>,
}

impl SyncBrackets {
    pub fn push(&mut self, chan: u32, ticks: u64, mono: u64, phase: u32) {
        if phase == 0 {
            self.pending.insert(chan, (ticks, mono));
            return;
        }
        let Some((ticks, before)) = self.pending.remove(&chan) else {
            return;
        };
        if mono < before {
            return;
        }
        let b = SyncBracket {
            at_ns: ticks,
            mono_before: before,
            mono_after: mono,
        };
        // mono_after >= mono_before (checked above).
        let width = |s: &SyncBracket| s.mono_after.saturating_sub(s.mono_before);
        if self.best.is_none_or(|old| width(&b) < width(&old)) {
            self.best = Some(b);
        }
    }

    pub fn best(&self) -> Option<SyncBracket> {
        self.best
    }
}

/// What one forward or sync event of an L1 packet carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A chunk's kind and data ([`Reassembly::push`]).
    Chunk(u32, Vec<u8>),
    /// The event's time, CLOCK_MONOTONIC, phase ([`SyncBrackets::push`]).
    Sync(u64, u64, u32),
}

/// Collects the forward and sync events of one L1 packet (walked with
/// `reader::walk_own_packet`); events too short for their fields are
/// skipped, and their chunks' messages then arrive incomplete (counted).
#[derive(Debug, Clone)]
pub struct ForwardEvents {
    forward_id: Option<u32>,
    sync_id: Option<u32>,
    pub found: Vec<Found>,
}

impl ForwardEvents {
    /// The ids of [`FORWARD_CLASS`] and [`SYNC_CLASS`] in L1's user stream,
    /// or None when it has neither (nothing is forwarded).
    pub fn for_classes(classes: &EventClasses) -> Option<ForwardEvents> {
        let user = classes.stream(abi::IVT_STREAM_USER);
        let id_of = |name: &str| user.iter().find(|c| c.name == name).map(|c| c.id);
        let (forward_id, sync_id) = (id_of(FORWARD_CLASS), id_of(SYNC_CLASS));
        (forward_id.is_some() || sync_id.is_some()).then(|| ForwardEvents {
            forward_id,
            sync_id,
            found: Vec::new(),
        })
    }
}

impl EventVisitor for ForwardEvents {
    fn event(&mut self, _id: u32, _ts: u64) {}

    fn event_payload(&mut self, id: u32, ts: u64, p: &[u8]) {
        if Some(id) == self.forward_id {
            // kind u32, then bytes: u32 length, the bytes.
            let (Some(kind), Some(len)) = (u32_at(p, 0), u32_at(p, 4)) else {
                return;
            };
            if let Some(data) = slice_at(p, 8, len as usize) {
                self.found.push(Found::Chunk(kind, data.to_vec()));
            }
        } else if Some(id) == self.sync_id {
            if let (Some(mono), Some(phase)) = (u64_at(p, 0), u32_at(p, 8)) {
                self.found.push(Found::Sync(ts, mono, phase));
            }
        }
    }
}

/// Who the forwarded guest is ([`HELLO`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub name: String,
    pub uuid: [u8; 16],
    pub nr_channels: u32,
}

/// One forwarded event class ([`META`]; the sidecar's layout loses
/// `tid_comm`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClassWire {
    pub stream: u32,
    pub id: u32,
    pub name: String,
    /// (name, type as `FieldType::name`, hex, tid_comm)
    pub fields: Vec<(String, String, bool, bool)>,
}

/// L2's classes as L1 forwards them.
pub fn classes_to_wire(classes: &EventClasses) -> Vec<ClassWire> {
    [abi::IVT_STREAM_KERNEL, abi::IVT_STREAM_USER]
        .into_iter()
        .flat_map(|s| classes.stream(s).iter())
        .map(|c| ClassWire {
            stream: c.stream,
            id: c.id,
            name: c.name.clone(),
            fields: c
                .fields
                .iter()
                .map(|f| (f.name.clone(), f.ty.name(), f.hex, f.tid_comm))
                .collect(),
        })
        .collect()
}

/// Forwarded classes back, as hostile input: names sanitized and
/// deduplicated the way the region's metadata parser does, unknown types
/// and ids out of range dropped (the second value counts them).
pub fn classes_from_wire(wire: &[ClassWire]) -> (EventClasses, u64) {
    let mut classes = EventClasses::default();
    let mut skipped = 0u64;
    let most = (abi::IVT_EVENT_IDS_MAX as usize).saturating_mul(2);
    for w in wire.iter().take(most) {
        match class_from_wire(w, &mut classes) {
            Some(c) if classes.stream_mut(c.stream).insert(c.clone()) => {}
            _ => skipped = skipped.saturating_add(1),
        }
    }
    classes.bump_generation();
    (classes, skipped)
}

fn class_from_wire(w: &ClassWire, classes: &mut EventClasses) -> Option<EventClass> {
    if w.stream > abi::IVT_STREAM_USER || w.fields.len() > abi::IVT_FIELDS_MAX as usize {
        return None;
    }
    // A region's names fit fixed fields; forwarded ones are cut to the same.
    let (name, _) = sanitize::event_name(head(&w.name, abi::IVT_NAME_MAX), w.id);
    let (name, _) = sanitize::dedupe(name, classes.stream_mut(w.stream).names_mut());
    let mut taken = HashSet::new();
    let mut fields = Vec::with_capacity(w.fields.len());
    for (i, (fname, ty, hex, tid)) in w.fields.iter().enumerate() {
        let ty = FieldType::parse(ty)?;
        let (fname, _) = sanitize::field_name(head(fname, abi::IVT_FIELD_NAME_MAX), i);
        let (fname, _) = crate::meta::dedupe_field(fname, ty, &mut taken);
        let mut f = Field::new(fname, ty, *hex);
        f.tid_comm = *tid && matches!(ty, FieldType::U32 | FieldType::S32);
        fields.push(f);
    }
    Some(EventClass::new(w.id, w.stream, name, fields))
}

/// The first bytes of `s` that a NUL-padded field of `max` bytes holds.
fn head(s: &str, max: usize) -> &[u8] {
    let b = s.as_bytes();
    b.get(..b.len().min(max.saturating_sub(1))).unwrap_or(b)
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
