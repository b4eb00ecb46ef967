//! Packet validation and the event walk: the drain hot path.
//!
//! Everything here works on a private copy of one packet. The header is
//! checked against what the host knows (stream class, channel index,
//! sequence number, sub-buffer size); the walk then steps over every event
//! without decoding it: a 4-byte header, a fixed payload length or a tiny
//! per-class program, 4-byte alignment, timestamps rebuilt from their low
//! 27 bits and checked for order. No allocation per event.

use thiserror::Error;

use crate::abi;
use crate::bytes::{le_u32, le_u64, put_u32, put_u64, slice_at, uint_at};
use crate::classes::{Op, Payload, StreamClasses};
use crate::retime::Retime;
use crate::sanitize::fix_utf8_in_place;

/// The 88-byte `struct ivt_packet_hdr`, parsed from a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PacketHeader {
    pub magic: u32,
    pub stream_id: u32,
    pub stream_instance_id: u64,
    pub timestamp_begin: u64,
    pub timestamp_end: u64,
    pub content_size: u64,
    pub packet_size: u64,
    pub packet_seq_num: u64,
    pub events_discarded: u64,
    pub first_event_seq: u64,
    pub event_count: u32,
    pub cpu_id: u32,
    pub owner_pid: u32,
    pub owner_tid: u32,
}

impl PacketHeader {
    /// Parses the first 88 bytes of `b` (the caller guarantees the length).
    pub fn parse(b: &[u8]) -> PacketHeader {
        use abi::pkt::*;
        PacketHeader {
            magic: le_u32(b, MAGIC),
            stream_id: le_u32(b, STREAM_ID),
            stream_instance_id: le_u64(b, STREAM_INSTANCE_ID),
            timestamp_begin: le_u64(b, TIMESTAMP_BEGIN),
            timestamp_end: le_u64(b, TIMESTAMP_END),
            content_size: le_u64(b, CONTENT_SIZE),
            packet_size: le_u64(b, PACKET_SIZE),
            packet_seq_num: le_u64(b, PACKET_SEQ_NUM),
            events_discarded: le_u64(b, EVENTS_DISCARDED),
            first_event_seq: le_u64(b, FIRST_EVENT_SEQ),
            event_count: le_u32(b, EVENT_COUNT),
            cpu_id: le_u32(b, CPU_ID),
            owner_pid: le_u32(b, OWNER_PID),
            owner_tid: le_u32(b, OWNER_TID),
        }
    }

    /// Writes every field back into the first 88 bytes of `b`.
    pub fn write(&self, b: &mut [u8]) {
        use abi::pkt::*;
        put_u32(b, MAGIC, self.magic);
        put_u32(b, STREAM_ID, self.stream_id);
        put_u64(b, STREAM_INSTANCE_ID, self.stream_instance_id);
        put_u64(b, TIMESTAMP_BEGIN, self.timestamp_begin);
        put_u64(b, TIMESTAMP_END, self.timestamp_end);
        put_u64(b, CONTENT_SIZE, self.content_size);
        put_u64(b, PACKET_SIZE, self.packet_size);
        put_u64(b, PACKET_SEQ_NUM, self.packet_seq_num);
        put_u64(b, EVENTS_DISCARDED, self.events_discarded);
        put_u64(b, FIRST_EVENT_SEQ, self.first_event_seq);
        put_u32(b, EVENT_COUNT, self.event_count);
        put_u32(b, CPU_ID, self.cpu_id);
        put_u32(b, OWNER_PID, self.owner_pid);
        put_u32(b, OWNER_TID, self.owner_tid);
    }

    /// timestamp_end is the writer's "unknown" (a sealed orphan).
    pub fn end_unknown(&self) -> bool {
        self.timestamp_end == 0
    }
}

/// The tick values a trace's clock can place on every reader's timeline
/// (ivtrace-time's `ClockMapping::expressible`, the one place that knows
/// the conversion). Empty when `min > max`: a clock nothing fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickRange {
    pub min: u64,
    pub max: u64,
}

impl TickRange {
    /// Every u64 (tests, and traces that never reach a CTF reader).
    pub const ALL: TickRange = TickRange {
        min: 0,
        max: u64::MAX,
    };

    pub fn contains(&self, ts: u64) -> bool {
        self.min <= ts && ts <= self.max
    }
}

/// Why an event walk failed. Offsets are from the packet start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WalkFault {
    #[error("event header at {at} runs past the content")]
    TruncatedHeader { at: usize },
    #[error("event at {at} has id {id}, unknown in this stream class")]
    UnknownId { at: usize, id: u32 },
    #[error("payload of the event at {at} runs past the content")]
    PayloadOverrun { at: usize },
    #[error("string in the event at {at} is not NUL-terminated within the content")]
    UnterminatedString { at: usize },
    #[error("event at {at} goes back in time")]
    TimeBackwards { at: usize },
    #[error("event at {at} (time {ts}) is later than the packet's timestamp_end")]
    TimeAfterEnd { at: usize, ts: u64 },
    #[error("packet claims {claimed} events, the walk found {found}")]
    EventCount { claimed: u32, found: u64 },
    #[error("the packet's times up to tick {ts} have no nanosecond value under the mapping in force (before the epoch or past int64)")]
    TimeUnmapped { ts: u64 },
}

impl WalkFault {
    /// A stable name for counting faults by reason.
    pub fn reason(&self) -> &'static str {
        match self {
            WalkFault::TruncatedHeader { .. } => "truncated_event",
            WalkFault::UnknownId { .. } => "unknown_event_id",
            WalkFault::PayloadOverrun { .. } => "payload_overrun",
            WalkFault::UnterminatedString { .. } => "unterminated_string",
            WalkFault::TimeBackwards { .. } => "time_backwards",
            WalkFault::TimeAfterEnd { .. } => "time_after_end",
            WalkFault::EventCount { .. } => "event_count",
            WalkFault::TimeUnmapped { .. } => "time_unmapped",
        }
    }
}

/// Why a packet is skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PacketFault {
    #[error("bad packet magic {0:#x}")]
    Magic(u32),
    #[error("stream_id {found}, channel belongs to stream class {expected}")]
    StreamId { found: u32, expected: u32 },
    #[error("stream_instance_id {found}, expected channel {expected}")]
    StreamInstance { found: u64, expected: u64 },
    #[error("packet_seq_num {found}, expected {expected}")]
    Seq { found: u64, expected: u64 },
    #[error("content_size {bits} bits is not a byte count in [88, {max}] bytes")]
    ContentSize { bits: u64, max: u64 },
    #[error("packet_size {bits} bits, sub-buffers are {expected} bits")]
    PacketSize { bits: u64, expected: u64 },
    #[error("timestamp_begin {begin} is after timestamp_end {end}")]
    TimeRange { begin: u64, end: u64 },
    #[error("timestamp {ts} is outside what the trace's clock can express ({min}..={max} ticks)")]
    TimeUnexpressible { ts: u64, min: u64, max: u64 },
    #[error("timestamp_begin {begin} is before the end {end} of the channel's previous packet")]
    TimeBeforePrevious { begin: u64, end: u64 },
    #[error("the packet ends at {end}, after its successor, already in the ring, began at {next}")]
    TimeAfterNext { end: u64, next: u64 },
    #[error("copy was overwritten by the writer while it was taken")]
    Torn,
    #[error("the sub-buffer could not be read (region file shrunk?)")]
    Unreadable,
    #[error(transparent)]
    Walk(#[from] WalkFault),
}

impl PacketFault {
    /// A stable name for counting faults by reason.
    pub fn reason(&self) -> &'static str {
        match self {
            PacketFault::Magic(_) => "magic",
            PacketFault::StreamId { .. } => "stream_id",
            PacketFault::StreamInstance { .. } => "stream_instance_id",
            PacketFault::Seq { .. } => "packet_seq_num",
            PacketFault::ContentSize { .. } => "content_size",
            PacketFault::PacketSize { .. } => "packet_size",
            PacketFault::TimeRange { .. } => "time_range",
            PacketFault::TimeUnexpressible { .. } => "time_unexpressible",
            PacketFault::TimeBeforePrevious { .. } => "time_before_previous",
            PacketFault::TimeAfterNext { .. } => "time_after_next",
            PacketFault::Torn => "torn",
            PacketFault::Unreadable => "unreadable",
            PacketFault::Walk(w) => w.reason(),
        }
    }
}

/// What the host knows about the packet it copied.
#[derive(Debug, Clone, Copy)]
pub struct Expected {
    pub stream: u32,
    pub channel: u32,
    pub seq: u64,
    pub subbuf_size: u32,
    /// The timestamps the trace's clock can express.
    pub ticks: TickRange,
}

/// How much of the sub-buffer is the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// A closed packet: content_size in the header says.
    Complete,
    /// The committed prefix of an open packet, this many bytes (from the
    /// host's own load of commit_pos); the header's end fields are unset.
    Prefix(u32),
}

/// Checks the header fields against `exp` and returns the content length
/// in bytes (at least 88, at most the sub-buffer size).
pub fn check_header(
    h: &PacketHeader,
    exp: &Expected,
    extent: Extent,
) -> Result<usize, PacketFault> {
    if h.magic != abi::IVT_CTF_MAGIC {
        return Err(PacketFault::Magic(h.magic));
    }
    if h.stream_id != exp.stream {
        return Err(PacketFault::StreamId {
            found: h.stream_id,
            expected: exp.stream,
        });
    }
    if h.stream_instance_id != exp.channel as u64 {
        return Err(PacketFault::StreamInstance {
            found: h.stream_instance_id,
            expected: exp.channel as u64,
        });
    }
    if h.packet_seq_num != exp.seq {
        return Err(PacketFault::Seq {
            found: h.packet_seq_num,
            expected: exp.seq,
        });
    }
    check_expressible(h.timestamp_begin, exp.ticks)?;
    match extent {
        Extent::Prefix(bytes) => Ok(bytes as usize),
        Extent::Complete => check_complete(h, exp),
    }
}

/// A timestamp the trace's clock cannot place would make CTF readers
/// refuse the whole trace (nanoseconds from the origin past int64).
pub fn check_expressible(ts: u64, ticks: TickRange) -> Result<(), PacketFault> {
    if ticks.contains(ts) {
        Ok(())
    } else {
        Err(PacketFault::TimeUnexpressible {
            ts,
            min: ticks.min,
            max: ticks.max,
        })
    }
}

fn check_complete(h: &PacketHeader, exp: &Expected) -> Result<usize, PacketFault> {
    let max = exp.subbuf_size as u64;
    let bits = h.content_size;
    if !bits.is_multiple_of(8) || bits / 8 < abi::PACKET_HDR_SIZE as u64 || bits / 8 > max {
        return Err(PacketFault::ContentSize { bits, max });
    }
    // The sub-buffer size is a u32: in bits it fits a u64.
    let max_bits = max.saturating_mul(8);
    if h.packet_size != max_bits {
        return Err(PacketFault::PacketSize {
            bits: h.packet_size,
            expected: max_bits,
        });
    }
    if !h.end_unknown() {
        check_expressible(h.timestamp_end, exp.ticks)?;
        if h.timestamp_begin > h.timestamp_end {
            return Err(PacketFault::TimeRange {
                begin: h.timestamp_begin,
                end: h.timestamp_end,
            });
        }
    }
    Ok((bits / 8) as usize)
}

/// Receives every event of a successful walk (report's per-type counts).
pub trait EventVisitor {
    fn event(&mut self, id: u32, ts: u64);

    /// The same event with its payload bytes (already bounds-checked
    /// against the packet); nested tracing reads forwarded data from it.
    #[inline(always)]
    fn event_payload(&mut self, id: u32, ts: u64, _payload: &[u8]) {
        self.event(id, ts);
    }
}

/// The drain does not look at individual events.
impl EventVisitor for () {
    #[inline(always)]
    fn event(&mut self, _id: u32, _ts: u64) {}
}

/// What a walk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WalkSummary {
    pub events: u64,
    /// Events with the 16-byte extended header (the rest use 4 bytes).
    pub extended: u64,
    /// Timestamp of the last event (timestamp_begin if there is none).
    pub last_ts: u64,
    /// Bytes of invalid UTF-8 replaced in strings.
    pub utf8_fixed: u64,
}

impl WalkSummary {
    /// Event-header bytes of the walked events.
    pub fn header_bytes(&self) -> u64 {
        let compact = self.events.saturating_sub(self.extended);
        compact
            .saturating_mul(abi::IVT_EV_COMPACT_SIZE as u64)
            .saturating_add(self.extended.saturating_mul(abi::IVT_EV_EXT_SIZE as u64))
    }
}

/// Walks the events in `content` (the packet from its first byte to the end
/// of its content). `end` is timestamp_end, or None when unknown.
pub fn walk<V: EventVisitor>(
    content: &mut [u8],
    classes: &StreamClasses,
    begin: u64,
    end: Option<u64>,
    visitor: &mut V,
) -> Result<WalkSummary, WalkFault> {
    let from = WalkFrom {
        off: abi::PACKET_HDR_SIZE,
        last_ts: begin,
    };
    walk_from(content, classes, from, end, visitor, &mut ())
}

/// An event header as the walk read it, for [`Retime::event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventHeader {
    /// The 4-byte word: the id and the low 27 bits of the time.
    Compact(u32),
    /// 16 bytes, the full time in the last 8.
    Extended,
}

/// Where a walk starts: the offset of an event header and the time of the
/// event before it (timestamp_begin for the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkFrom {
    pub off: usize,
    pub last_ts: u64,
}

/// [`walk`] from `from`, handing each event's header to `retime` once the
/// event is known good (its class and payload checked) and its time
/// decoded, so `retime` may rewrite that header in place: the walk has
/// read all it needs of it, and later events unwrap their compact times
/// from `last_ts`, the tick value, not from the bytes.
pub fn walk_from<V: EventVisitor, R: Retime + Copy>(
    content: &mut [u8],
    classes: &StreamClasses,
    from: WalkFrom,
    end: Option<u64>,
    visitor: &mut V,
    retime: &mut R,
) -> Result<WalkSummary, WalkFault> {
    // A local copy the loop can keep in registers; written back at the
    // end (a failed walk's packet is skipped: its retimer is moot).
    let mut rt = *retime;
    let len = content.len();
    let end = end.unwrap_or(u64::MAX);
    let mut sum = WalkSummary {
        last_ts: from.last_ts,
        ..WalkSummary::default()
    };
    // Positions are below len; every sum saturates, so a length past the
    // content is refused by the bounds checks, never wraps.
    let mut off = from.off;
    while off < len {
        let at = off;
        if off.saturating_add(abi::IVT_EV_COMPACT_SIZE) > len {
            return Err(WalkFault::TruncatedHeader { at });
        }
        let word = le_u32(content, off);
        let mut id = word & ((1 << abi::IVT_EV_ID_BITS) - 1);
        let ts;
        let extended = id == abi::IVT_EV_ID_EXTENDED;
        if extended {
            let Some(ext) = slice_at(content, off, abi::IVT_EV_EXT_SIZE) else {
                return Err(WalkFault::TruncatedHeader { at });
            };
            id = le_u32(ext, 4);
            ts = le_u64(ext, 8);
            if ts < sum.last_ts {
                return Err(WalkFault::TimeBackwards { at });
            }
            sum.extended = sum.extended.saturating_add(1);
            off = off.saturating_add(abi::IVT_EV_EXT_SIZE);
        } else {
            ts = unwrap_compact(sum.last_ts, (word >> abi::IVT_EV_ID_BITS) as u64)
                .ok_or(WalkFault::TimeAfterEnd { at, ts: u64::MAX })?;
            off = off.saturating_add(abi::IVT_EV_COMPACT_SIZE);
        }
        if ts > end {
            return Err(WalkFault::TimeAfterEnd { at, ts });
        }
        let class = classes.get(id).ok_or(WalkFault::UnknownId { at, id })?;
        let payload_end = match &class.payload {
            Payload::Fixed(n) => off.saturating_add(*n as usize),
            Payload::Program(ops) => run_program(content, off, ops, &mut sum.utf8_fixed)
                .ok_or(WalkFault::PayloadOverrun { at })??,
        };
        if payload_end > len {
            return Err(WalkFault::PayloadOverrun { at });
        }
        let header = match extended {
            true => EventHeader::Extended,
            false => EventHeader::Compact(word),
        };
        rt.event(content, at, header, ts);
        visitor.event_payload(id, ts, &content[off..payload_end]);
        sum.events = sum.events.saturating_add(1);
        sum.last_ts = ts;
        // payload_end <= len: aligning it up cannot overflow.
        off = payload_end.next_multiple_of(abi::IVT_EV_ALIGN);
    }
    *retime = rt;
    Ok(sum)
}

/// Appends an event header for class `id` at time `ts` to `out`, the
/// previous time of its packet being `prev` (<= `ts`): the compact form
/// (5-bit id, the low 27 bits of `ts`) when `id` fits and `ts` is less
/// than 2^27 past `prev` (a reader unwraps it from `prev`, CTF 1.8 §8),
/// else the extended form with the full time. What the host writes into
/// a stream it builds (the kernel and ftrace expansions), never the
/// drain's copy of a guest packet.
#[inline]
pub fn put_event_header(out: &mut Vec<u8>, id: u32, ts: u64, prev: u64) {
    if id <= abi::IVT_EV_COMPACT_MAX_ID && ts.saturating_sub(prev) <= abi::IVT_EV_TS_MASK {
        // The mask keeps 27 bits: the shifted word fits in 32.
        let word = id | ((ts & abi::IVT_EV_TS_MASK) as u32) << abi::IVT_EV_ID_BITS;
        out.extend_from_slice(&word.to_le_bytes());
    } else {
        out.extend_from_slice(&abi::IVT_EV_ID_EXTENDED.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&ts.to_le_bytes());
    }
}

/// Full timestamp from its low 27 bits, assuming at most one wrap since
/// `prev` (CTF 1.8 §8). None on u64 overflow.
#[inline]
fn unwrap_compact(prev: u64, low: u64) -> Option<u64> {
    let ts = (prev & !abi::IVT_EV_TS_MASK) | low;
    if ts >= prev {
        Some(ts)
    } else {
        ts.checked_add(abi::IVT_EV_TS_MASK + 1)
    }
}

/// Length of the NUL-terminated text at the start of `b` and whether it
/// is plain ASCII (then it is valid UTF-8 without further checks). Both
/// scans are SIMD/word-at-a-time.
#[inline]
fn scan_cstr(b: &[u8]) -> Option<(usize, bool)> {
    // Short strings are the common case: look at the first 16 bytes inline
    // before paying for a call.
    let head = &b[..b.len().min(16)];
    let nul = match head.iter().position(|&c| c == 0) {
        Some(n) => n,
        None => memchr::memchr(0, b)?,
    };
    Some((nul, b[..nul].is_ascii()))
}

/// Makes `text` valid UTF-8 in place; the common ASCII case costs one scan.
#[inline]
fn fix_text(text: &mut [u8], ascii: bool) -> u64 {
    if ascii {
        0
    } else {
        fix_utf8_in_place(text) as u64
    }
}

/// Steps over a variable payload starting at `p`. Outer None: a length
/// ran past the content; inner Err: a string is not terminated. Inlined
/// into the walk, its one caller: the walk with the time rewrite is past
/// the size the compiler inlines on its own, and a call costs the drain
/// ~40 instructions per small event.
#[inline(always)]
fn run_program(
    content: &mut [u8],
    mut p: usize,
    ops: &[Op],
    utf8_fixed: &mut u64,
) -> Option<Result<usize, WalkFault>> {
    let len = content.len();
    let at = p;
    for op in ops {
        p = match *op {
            Op::Skip(n) => p.checked_add(n as usize).filter(|&e| e <= len)?,
            Op::Bytes => {
                let body = p.checked_add(4).filter(|&e| e <= len)?;
                let n = le_u32(content, p) as usize;
                body.checked_add(n).filter(|&e| e <= len)?
            }
            Op::String => {
                let Some((nul, ascii)) = scan_cstr(content.get(p..)?) else {
                    return Some(Err(WalkFault::UnterminatedString { at }));
                };
                // The NUL is inside content: p + nul + 1 <= len.
                let end = p.saturating_add(nul);
                *utf8_fixed = utf8_fixed.saturating_add(fix_text(&mut content[p..end], ascii));
                end.saturating_add(1)
            }
            Op::Chars(n) => {
                let e = p.checked_add(n as usize).filter(|&e| e <= len)?;
                let ascii = content[p..e].is_ascii();
                *utf8_fixed = utf8_fixed.saturating_add(fix_text(&mut content[p..e], ascii));
                e
            }
            Op::Seq { len_bytes, elem } => {
                let body = p.checked_add(len_bytes as usize).filter(|&e| e <= len)?;
                let n = usize::try_from(uint_at(content, p, len_bytes as usize)?).ok()?;
                let size = n.checked_mul(elem as usize)?;
                body.checked_add(size).filter(|&e| e <= len)?
            }
        };
    }
    Some(Ok(p))
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::classes::{EventClass, Field, FieldType};

    fn classes() -> StreamClasses {
        let f = |name: &str, ty| Field::new(name, ty, false);
        let mut s = StreamClasses::default();
        s.insert(EventClass::new(
            0,
            1,
            "fixed".into(),
            vec![f("x", FieldType::U64), f("y", FieldType::S8)],
        ));
        s.insert(EventClass::new(
            1,
            1,
            "var".into(),
            vec![f("d", FieldType::Bytes), f("s", FieldType::String)],
        ));
        s.insert(EventClass::new(
            40,
            1,
            "ext".into(),
            vec![f("c", FieldType::Chars(4))],
        ));
        s
    }

    struct Pkt(Vec<u8>);

    impl Pkt {
        fn new() -> Pkt {
            Pkt(vec![0u8; abi::PACKET_HDR_SIZE])
        }
        fn align(&mut self) {
            while !self.0.len().is_multiple_of(4) {
                self.0.push(0);
            }
        }
        fn compact(mut self, id: u32, ts: u64, payload: &[u8]) -> Pkt {
            self.align();
            self.0
                .extend_from_slice(&(id | ((ts as u32) << 5)).to_le_bytes());
            self.0.extend_from_slice(payload);
            self
        }
        fn ext(mut self, id: u32, ts: u64, payload: &[u8]) -> Pkt {
            self.align();
            self.0.extend_from_slice(&31u32.to_le_bytes());
            self.0.extend_from_slice(&id.to_le_bytes());
            self.0.extend_from_slice(&ts.to_le_bytes());
            self.0.extend_from_slice(payload);
            self
        }
    }

    fn run(p: &mut Pkt, begin: u64, end: Option<u64>) -> Result<WalkSummary, WalkFault> {
        walk(&mut p.0, &classes(), begin, end, &mut ())
    }

    #[test]
    fn walks_compact_extended_and_variable_events() {
        let var = [&3u32.to_le_bytes()[..], b"abc", b"hi\0"].concat();
        let mut p = Pkt::new()
            .compact(0, 1000, &[1, 0, 0, 0, 0, 0, 0, 0, 0xff])
            .compact(1, 1010, &var)
            .ext(40, 1 << 40, b"ab\0\0");
        let s = run(&mut p, 900, Some(1 << 40)).unwrap();
        assert_eq!((s.events, s.extended, s.last_ts), (3, 1, 1 << 40));
        assert_eq!(s.header_bytes(), 4 + 4 + 16);
    }

    #[test]
    fn compact_timestamps_unwrap_once() {
        let begin = (5 << 27) + ((1 << 27) - 10);
        let mut p = Pkt::new().compact(0, 5, &[0; 9]);
        let s = run(&mut p, begin, None).unwrap();
        assert_eq!(s.last_ts, (6 << 27) + 5);
    }

    #[test]
    fn each_walk_fault_is_reported() {
        let nine = [0u8; 9];
        let cases: Vec<(Pkt, WalkFault)> = vec![
            (
                Pkt::new().compact(0, 10, &nine[..5]),
                WalkFault::PayloadOverrun { at: 88 },
            ),
            (
                Pkt::new().compact(7, 10, &nine),
                WalkFault::UnknownId { at: 88, id: 7 },
            ),
            (
                Pkt::new().compact(1, 10, &[9, 0, 0, 0, 1, 2]),
                WalkFault::PayloadOverrun { at: 88 },
            ),
            (
                Pkt::new().compact(1, 10, &[1, 0, 0, 0, 7, b'x']),
                WalkFault::UnterminatedString { at: 92 },
            ),
            (
                Pkt::new().ext(0, 5, &nine),
                WalkFault::TimeBackwards { at: 88 },
            ),
            (
                Pkt::new().ext(0, 5000, &nine),
                WalkFault::TimeAfterEnd { at: 88, ts: 5000 },
            ),
        ];
        for (mut p, want) in cases {
            assert_eq!(run(&mut p, 10, Some(4000)), Err(want));
        }
        let mut short = Pkt::new().compact(0, 10, &nine);
        short.0.extend_from_slice(&[0, 0, 0, 0, 31]);
        assert!(matches!(
            run(&mut short, 10, None),
            Err(WalkFault::TruncatedHeader { .. })
        ));
    }

    #[test]
    fn invalid_utf8_is_fixed_in_the_copy() {
        let var = [&0u32.to_le_bytes()[..], b"a\xffb\0"].concat();
        let mut p = Pkt::new().compact(1, 10, &var);
        let s = run(&mut p, 10, None).unwrap();
        assert_eq!(s.utf8_fixed, 1);
        assert_eq!(&p.0[88 + 8..88 + 11], b"a?b");
    }

    #[test]
    fn header_checks_name_the_wrong_field() {
        let good = PacketHeader {
            magic: abi::IVT_CTF_MAGIC,
            stream_id: 1,
            stream_instance_id: 2,
            timestamp_begin: 5,
            timestamp_end: 9,
            content_size: 100 * 8,
            packet_size: 4096 * 8,
            packet_seq_num: 3,
            ..Default::default()
        };
        let exp = Expected {
            stream: 1,
            channel: 2,
            seq: 3,
            subbuf_size: 4096,
            ticks: TickRange { min: 2, max: 1000 },
        };
        assert_eq!(check_header(&good, &exp, Extent::Complete), Ok(100));
        let bad = |f: fn(&mut PacketHeader)| {
            let mut h = good;
            f(&mut h);
            check_header(&h, &exp, Extent::Complete)
                .unwrap_err()
                .reason()
        };
        assert_eq!(bad(|h| h.magic = 0), "magic");
        assert_eq!(bad(|h| h.stream_id = 0), "stream_id");
        assert_eq!(bad(|h| h.stream_instance_id = 9), "stream_instance_id");
        assert_eq!(bad(|h| h.packet_seq_num = 4), "packet_seq_num");
        assert_eq!(bad(|h| h.content_size = 4097 * 8), "content_size");
        assert_eq!(bad(|h| h.content_size = 87 * 8), "content_size");
        assert_eq!(bad(|h| h.content_size = 801), "content_size");
        assert_eq!(bad(|h| h.packet_size = 8), "packet_size");
        assert_eq!(bad(|h| h.timestamp_begin = 10), "time_range");
        assert_eq!(bad(|h| h.timestamp_begin = 1), "time_unexpressible");
        assert_eq!(bad(|h| h.timestamp_end = 1001), "time_unexpressible");
        assert_eq!(
            bad(|h| (h.timestamp_begin, h.timestamp_end) = (1 << 63, u64::MAX)),
            "time_unexpressible"
        );
        let orphan = PacketHeader {
            timestamp_end: 0,
            ..good
        };
        assert!(check_header(&orphan, &exp, Extent::Complete).is_ok());
    }
}
