//! The user trace's times in nanoseconds: the drain rewrites each event
//! header's time in place, inside its validation walk
//! ([`crate::packet::walk_from`]), so every sink (the directory, the
//! relay) receives packets on a 1 GHz clock without a second pass or copy
//! (docs/ctf.md, "Time").
//!
//! An extended header holds any time. A compact one keeps the low 27
//! bits, which a reader unwraps from the previous event's time (or the
//! packet's timestamp_begin): rewritten in place it stays right while
//! each event is less than 2^27 ns after the previous one, which holds
//! whenever the guest's clock runs at 1 GHz or faster (the tick delta fit
//! 27 bits, the nanosecond delta is no larger). When it does not (a
//! slower clock, a mapping change within a packet), the walk leaves that
//! event and the rest of the packet as they were ([`Retimer::tail`]) and
//! [`retime_tail`] writes the packet afresh into a second buffer, the
//! events from there on with the header each needs
//! ([`crate::packet::put_event_header`]). Never a wrong time.

use crate::abi;
use crate::bytes::{put_u32, put_u64};
use crate::classes::StreamClasses;
use crate::ns::{Anchor, NS_MAX};
use crate::packet::{put_event_header, walk_from, EventHeader, EventVisitor, WalkFault, WalkFrom};

/// Receives each good event's header during a walk, to rewrite its time.
/// Infallible, so the walk pays no branch for it: a time that cannot be
/// rewritten is the rewriter's to report after the walk.
pub trait Retime {
    /// The event whose header starts at `content[at]`, read as `header`,
    /// has time `ts`.
    fn event(&mut self, content: &mut [u8], at: usize, header: EventHeader, ts: u64);
}

/// Walks that rewrite nothing (validation only).
impl Retime for () {
    #[inline(always)]
    fn event(&mut self, _content: &mut [u8], _at: usize, _header: EventHeader, _ts: u64) {}
}

/// Rewrites one packet's event times from ticks to nanoseconds, keeping
/// the stream's times from going back (a later mapping may put a tick
/// before what an earlier one gave the previous packet): a time before the
/// previous one is written as the previous one and counted.
#[derive(Debug, Clone, Copy)]
pub struct Retimer {
    anchor: Anchor,
    begin_ns: u64,
    prev_ns: u64,
    /// The tick time of the last event rewritten.
    prev_ticks: u64,
    clamped: u64,
    /// The offset of the first event a compact header cannot hold in
    /// nanoseconds: it and the events after it still carry ticks
    /// ([`retime_tail`]). 0 while there is none (offset 0 is the packet
    /// header: one load and compare per event, not an Option's two).
    tail: usize,
}

impl Retimer {
    /// For a packet whose timestamp_begin is the anchor's tick, in a
    /// stream whose previous packet ended at `floor_ns`.
    pub fn new(anchor: Anchor, floor_ns: u64) -> Retimer {
        let raw = anchor.anchor_ns();
        let begin_ns = raw.max(floor_ns);
        Retimer {
            anchor,
            begin_ns,
            prev_ns: begin_ns,
            prev_ticks: anchor.ticks(),
            clamped: u64::from(raw < floor_ns),
            tail: 0,
        }
    }

    /// The packet's timestamp_begin in nanoseconds.
    pub fn begin_ns(&self) -> u64 {
        self.begin_ns
    }

    /// The time of the last event rewritten (begin_ns if none).
    pub fn last_ns(&self) -> u64 {
        self.prev_ns
    }

    /// Times written as an earlier one so the stream does not go back.
    pub fn clamped(&self) -> u64 {
        self.clamped
    }

    /// Where the in-place rewrite stopped, if it did: the event there and
    /// the tick time of the one before ([`retime_tail`] goes on from it).
    pub fn tail(&self) -> Option<WalkFrom> {
        (self.tail != 0).then_some(WalkFrom {
            off: self.tail,
            last_ts: self.prev_ticks,
        })
    }

    /// Why the packet cannot be converted, if it cannot: a time with no
    /// value (the last time is the latest, so checking it checks all).
    pub fn fault(&self) -> Option<WalkFault> {
        (self.prev_ns > NS_MAX).then_some(WalkFault::TimeUnmapped {
            ts: self.prev_ticks,
        })
    }

    /// Tick `ts` in nanoseconds, no earlier than the previous time (above
    /// [`NS_MAX`] when it has no value); the previous time moves on with
    /// each event rewritten, not with the end.
    #[inline]
    fn time(&mut self, ts: u64) -> u64 {
        let raw = self.anchor.ns_or_over(ts);
        // A count of events: it cannot reach 2^64.
        self.clamped = self.clamped.wrapping_add(u64::from(raw < self.prev_ns));
        raw.max(self.prev_ns)
    }

    /// The packet's timestamp_end (ticks `end`, at or after its last
    /// event) in nanoseconds; None when the mapping gives it none.
    pub fn end_ns(&mut self, end: u64) -> Option<u64> {
        Some(self.time(end)).filter(|&ns| ns <= NS_MAX)
    }
}

impl Retime for Retimer {
    #[inline]
    fn event(&mut self, content: &mut [u8], at: usize, header: EventHeader, ts: u64) {
        if self.tail != 0 {
            return;
        }
        let ns = self.time(ts);
        match header {
            // The walk checked the 16 bytes; the time is the last 8.
            EventHeader::Extended => put_u64(content, at.saturating_add(8), ns),
            // ns >= prev_ns (time): the difference cannot wrap.
            EventHeader::Compact(word) if ns.wrapping_sub(self.prev_ns) <= abi::IVT_EV_TS_MASK => {
                let id_mask = (1u32 << abi::IVT_EV_ID_BITS).wrapping_sub(1);
                // The mask keeps 27 bits: the shifted word fits in 32.
                let low = (ns & abi::IVT_EV_TS_MASK) as u32;
                put_u32(content, at, (word & id_mask) | low << abi::IVT_EV_ID_BITS);
            }
            EventHeader::Compact(_) => {
                self.tail = at;
                return;
            }
        }
        self.prev_ns = ns;
        self.prev_ticks = ts;
    }
}

/// Writes the packet in `content` (rewritten in place up to the
/// retimer's tail, ticks from there on) into `out` with every time in
/// nanoseconds: the bytes before the tail as they are, then each event
/// with the header its time needs. `tail_ticks` is the tick time of the
/// event before the tail (timestamp_begin if none), `end` the walk's
/// bound. The caller walked the packet successfully: this walk only
/// re-reads what that one checked.
pub fn retime_tail(
    content: &mut [u8],
    classes: &StreamClasses,
    tail: WalkFrom,
    end: Option<u64>,
    retimer: &mut Retimer,
    out: &mut Vec<u8>,
) -> Result<(), WalkFault> {
    out.clear();
    out.extend_from_slice(content.get(..tail.off).unwrap_or_default());
    let mut emit = Emit { retimer, out };
    walk_from(content, classes, tail, end, &mut emit, &mut ())?;
    match retimer.fault() {
        Some(fault) => Err(fault),
        None => Ok(()),
    }
}

/// The slow path's visitor: re-emits each event with its time in ns.
struct Emit<'a> {
    retimer: &'a mut Retimer,
    out: &'a mut Vec<u8>,
}

impl EventVisitor for Emit<'_> {
    fn event(&mut self, _id: u32, _ts: u64) {}

    fn event_payload(&mut self, id: u32, ts: u64, payload: &[u8]) {
        let ns = self.retimer.time(ts);
        put_event_header(self.out, id, ns, self.retimer.prev_ns);
        self.out.extend_from_slice(payload);
        // Event headers are 4-byte aligned; payloads are byte-packed, so
        // moving an event by a multiple of 4 keeps every field readable.
        let aligned = self.out.len().next_multiple_of(abi::IVT_EV_ALIGN);
        self.out.resize(aligned, 0);
        self.retimer.prev_ns = ns;
        self.retimer.prev_ticks = ts;
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::classes::{EventClass, Field, FieldType};
    use crate::ns::NsScale;
    use crate::packet::walk;
    use proptest::prelude::*;

    /// Class 0: a u64 and a byte; class 40 (extended only): a string.
    fn classes() -> StreamClasses {
        let f = |name: &str, ty| Field::new(name, ty, false);
        let mut s = StreamClasses::default();
        s.insert(EventClass::new(
            0,
            1,
            "a".into(),
            vec![f("x", FieldType::U64), f("y", FieldType::U8)],
        ));
        s.insert(EventClass::new(
            40,
            1,
            "s".into(),
            vec![f("s", FieldType::String)],
        ));
        s
    }

    /// A packet of events (id, tick time), compact where the writer would
    /// use it (id fits, tick delta < 2^27), each with a payload naming it.
    fn packet(begin: u64, events: &[(u32, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; abi::PACKET_HDR_SIZE];
        let mut prev = begin;
        for (i, &(id, ts)) in events.iter().enumerate() {
            put_event_header(&mut b, id, ts, prev);
            prev = ts;
            match id {
                0 => {
                    b.extend_from_slice(&(i as u64).to_le_bytes());
                    b.push(i as u8);
                }
                _ => b.extend_from_slice(format!("e{i}\0").as_bytes()),
            }
            b.resize(b.len().next_multiple_of(4), 0);
        }
        b
    }

    /// What a reader sees: each event's id, full time and payload.
    #[derive(Default)]
    struct Seen(Vec<(u32, u64, Vec<u8>)>);

    impl EventVisitor for Seen {
        fn event(&mut self, _id: u32, _ts: u64) {}
        fn event_payload(&mut self, id: u32, ts: u64, payload: &[u8]) {
            self.0.push((id, ts, payload.to_vec()));
        }
    }

    fn seen(bytes: &mut [u8], begin: u64) -> Vec<(u32, u64, Vec<u8>)> {
        let mut s = Seen::default();
        walk(bytes, &classes(), begin, None, &mut s).unwrap();
        s.0
    }

    /// Converts `events` as the drain does; returns the packet as written
    /// (in place, or afresh on the slow path), its begin in ns and the
    /// retimer.
    fn convert(
        scale: NsScale,
        floor_ns: u64,
        begin: u64,
        events: &[(u32, u64)],
    ) -> (Vec<u8>, Retimer) {
        let mut b = packet(begin, events);
        let mut r = Retimer::new(scale.anchor(begin).unwrap(), floor_ns);
        let from = WalkFrom {
            off: abi::PACKET_HDR_SIZE,
            last_ts: begin,
        };
        walk_from(&mut b, &classes(), from, None, &mut (), &mut r).unwrap();
        if let Some(tail) = r.tail() {
            let mut out = Vec::new();
            retime_tail(&mut b, &classes(), tail, None, &mut r, &mut out).unwrap();
            return (out, r);
        }
        (b, r)
    }

    /// Every event keeps its id and payload and reads as its exact ns.
    fn check(scale: NsScale, begin: u64, events: &[(u32, u64)]) -> Retimer {
        let (mut out, r) = convert(scale, 0, begin, events);
        let want: Vec<_> = seen(&mut packet(begin, events), begin)
            .into_iter()
            .map(|(id, t, p)| (id, scale.ns(t).unwrap(), p))
            .collect();
        assert_eq!(seen(&mut out, r.begin_ns()), want);
        assert_eq!(r.begin_ns(), scale.ns(begin).unwrap());
        r
    }

    const NOW_NS: u64 = 1_780_000_000_123_456_789;

    #[test]
    fn fast_clocks_convert_in_place() {
        let scale = NsScale::new(2_400_000_007, 1 << 40, NOW_NS);
        let b = (1 << 40) + 5;
        // A compact wrap of the tick bits, an extended id, a long gap.
        let ev = [
            (0, b + 3),
            (0, b + (1 << 27) - 2),
            (40, b + (1 << 27) + 9),
            (0, b + (1 << 33)),
        ];
        let r = check(scale, b, &ev);
        assert_eq!((r.tail(), r.clamped()), (None, 0));
    }

    #[test]
    fn a_slow_clock_takes_the_slow_path_and_stays_exact() {
        // 1 MHz: 200_000 ticks are 200 ms, more than 2^27 ns.
        let scale = NsScale::new(1_000_000, 0, NOW_NS);
        let ev = [(0, 10), (0, 20), (0, 200_020), (40, 200_030), (0, 200_031)];
        let mut b = packet(0, &ev);
        let mut r = Retimer::new(scale.anchor(0).unwrap(), 0);
        let from = WalkFrom {
            off: abi::PACKET_HDR_SIZE,
            last_ts: 0,
        };
        walk_from(&mut b, &classes(), from, None, &mut (), &mut r).unwrap();
        // The third event is 200 ms after the second: its compact header
        // cannot say that in ns.
        assert_eq!(r.tail().map(|t| t.last_ts), Some(20));
        check(scale, 0, &ev);
    }

    #[test]
    fn a_stream_never_goes_back() {
        let scale = NsScale::new(1_000_000_000, 0, NOW_NS);
        let (mut out, r) = convert(scale, NOW_NS + 500, 100, &[(0, 200), (0, 700)]);
        let times: Vec<u64> = seen(&mut out, r.begin_ns()).iter().map(|e| e.1).collect();
        assert_eq!(r.begin_ns(), NOW_NS + 500);
        assert_eq!(times, [NOW_NS + 500, NOW_NS + 700]);
        assert_eq!(r.clamped(), 2, "the begin and the first event");
    }

    #[test]
    fn a_time_without_a_value_is_a_fault_never_a_wrong_time() {
        // Tick 0 is one second before the epoch.
        let scale = NsScale::new(1_000_000_000, 1_000_000_000, 0);
        assert!(scale.anchor(0).is_none());
        // At 1 GHz from 0, tick n is n ns: past NS_MAX, no value. A
        // compact header 15 ticks on is rewritten, then refused.
        let scale = NsScale::new(1_000_000_000, 0, 0);
        let begin = NS_MAX - 10;
        let mut r = Retimer::new(scale.anchor(begin).unwrap(), 0);
        let mut b = packet(begin, &[(0, begin + 5), (0, NS_MAX + 5)]);
        let from = WalkFrom {
            off: abi::PACKET_HDR_SIZE,
            last_ts: begin,
        };
        walk_from(&mut b, &classes(), from, None, &mut (), &mut r).unwrap();
        assert_eq!(r.fault(), Some(WalkFault::TimeUnmapped { ts: NS_MAX + 5 }));
        // An extended header takes any u64: the last time is checked.
        let mut r = Retimer::new(scale.anchor(begin).unwrap(), 0);
        let mut b = packet(begin, &[(40, u64::MAX)]);
        walk_from(&mut b, &classes(), from, None, &mut (), &mut r).unwrap();
        assert_eq!(r.fault(), Some(WalkFault::TimeUnmapped { ts: u64::MAX }));
        assert_eq!(r.end_ns(u64::MAX), None);
    }

    proptest! {
        #[test]
        fn every_event_reads_as_its_exact_nanoseconds(
            freq in prop_oneof![1_000_000u64..10_000_000, 900_000_000u64..4_000_000_000, 10_000_000_000u64..100_000_000_000],
            begin in ((1u64 << 49) - (1 << 40))..((1u64 << 49) + (1 << 40)),
            steps in proptest::collection::vec((0u64..3, prop_oneof![0u64..100, 0u64..(1 << 27), 0u64..(1 << 36)]), 0..40),
        ) {
            let scale = NsScale::new(freq, 1 << 49, NOW_NS);
            let mut t = begin;
            let ev: Vec<(u32, u64)> = steps
                .iter()
                .map(|&(k, d)| {
                    t += d;
                    (if k == 0 { 40 } else { 0 }, t)
                })
                .collect();
            let r = check(scale, begin, &ev);
            prop_assert_eq!(r.clamped(), 0);
            if freq >= 1_000_000_000 && ev.iter().all(|e| e.0 == 0) {
                let small = ev.windows(2).all(|w| w[1].1 - w[0].1 < (1 << 27));
                if small && ev.first().is_none_or(|e| e.1 - begin < (1 << 27)) {
                    prop_assert!(r.tail().is_none(), "in place when the ticks fit");
                }
            }
        }
    }
}
