//! One wire packet rewritten event by event, or replaced by an empty one
//! when it does not walk: what the staged expansion ([`super`]) and the
//! streaming one ([`super::online`]) share. They differ only in where a
//! thread's name comes from, how a system call's output class is found or
//! declared, and what they learn on the way, which is what [`WriteEvent`]
//! asks of them.

use ivtrace_region::abi;
use ivtrace_region::bytes::put_u64;
use ivtrace_region::packet::{put_event_header, PacketHeader};
use ivtrace_time::ClockMapping;

use super::lttng::{self, SyscallWire};
use super::names::{swapper, Comm};
use super::plan::{self, ClassPlan, Lookup, Op, Out, Plans};
use super::wire::{align_event, event_header, packet_content, Offsets};
use super::{syscalls, KernelExpansion};
use ivtrace_region::bytes::le_u64;

/// One kernel stream's time in the output: the guest's ticks become
/// nanoseconds since the epoch (the kernel trace's 1 GHz clock, docs/ctf.md
/// "Time"), never going back. One mapping converts a whole staged stream
/// at the end, so its times only go back where the guest's did; a
/// streaming expansion converts with the mapping in force, which the
/// estimator may move back between two packets: such a time is clamped to
/// the stream's last one and counted (`ts_clamped`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Timeline {
    last: u64,
}

impl Timeline {
    /// The output time of tick value `ticks`, not before the stream's last
    /// one; None (counted in `ts_unmapped`) when `clock` has no nanosecond
    /// value for it.
    #[inline]
    pub fn ns(
        &mut self,
        clock: &ClockMapping,
        ticks: u64,
        stats: &mut KernelExpansion,
    ) -> Option<u64> {
        let Some(ns) = clock.ns_value(ticks) else {
            stats.ts_unmapped += 1;
            return None;
        };
        if ns < self.last {
            stats.ts_clamped += 1;
            return Some(self.last);
        }
        self.last = ns;
        Some(ns)
    }

    /// The stream's latest output time.
    pub fn last(&self) -> u64 {
        self.last
    }
}

/// One wire event of the packet being rewritten.
pub struct Event<'p> {
    /// Its wire class.
    pub id: u32,
    /// Its full timestamp (guest ticks: the name timeline's time).
    pub ts: u64,
    /// Its output time, and the previous one of its packet (what a
    /// compact header is unwrapped from).
    pub ns: u64,
    pub prev_ns: u64,
    pub payload: &'p [u8],
    /// Field offsets in `payload`, its end last.
    pub offs: &'p [u32],
}

/// What an expansion does with the events of a packet.
pub trait WriteEvent {
    /// Sees every event before it is written (what a naming event teaches).
    fn saw(&mut self, _plan: &ClassPlan, _e: &Event) {}

    /// The name of thread `tid` at time `ts` (`idle` for thread 0 on this
    /// packet's CPU).
    fn thread_name(&mut self, tid: u32, ts: u64, idle: &Comm) -> Comm;

    /// The name of interrupt `irq` (empty if unknown, and counted).
    fn irq_name(&mut self, irq: u32) -> &[u8];

    /// The output class of system call `nr` (entry or `exit`), if it has
    /// one (the streaming expansion declares it on first use).
    fn syscall_id(&mut self, exit: bool, nr: u64) -> Option<u32>;

    /// A system call event of wire class `wire_id` is written as it is, as
    /// `syscall_{entry,exit}_unknown` (the streaming expansion declares
    /// that class on first use).
    fn unknown_syscall(&mut self, _exit: bool, _wire_id: u32) {}

    /// The counters of this expansion.
    fn stats(&mut self) -> &mut KernelExpansion;
}

/// The rewritten form of packet `pkt` in `out`: its header, each event at
/// its aligned place as `w` writes it, then the content and packet sizes
/// set to what was written; every time (the packet's bounds, each event's)
/// in nanoseconds on `time` with `clock`. Returns the number of events;
/// None if the packet does not walk (an event header, a class or a payload
/// that does not fit) or a time has no nanosecond value.
pub fn packet(
    plans: &Plans,
    pkt: &[u8],
    (clock, time): (&ClockMapping, &mut Timeline),
    w: &mut impl WriteEvent,
    out: &mut Vec<u8>,
) -> Option<u64> {
    let (h, content) = packet_content(pkt)?;
    let content = &pkt[..content];
    let idle = swapper(h.cpu_id);
    out.clear();
    out.extend_from_slice(&content[..abi::PACKET_HDR_SIZE]);
    let begin = time.ns(clock, h.timestamp_begin, w.stats())?;
    let mut off = abi::PACKET_HDR_SIZE;
    let (mut last_ts, mut prev_ns) = (h.timestamp_begin, begin);
    let mut events = 0u64;
    let mut scratch: Offsets = [0; abi::IVT_FIELDS_MAX as usize + 1];
    while off < content.len() {
        let eh = event_header(content, off, last_ts)?;
        let plan = plans.get(eh.id)?;
        let p0 = off + eh.len;
        let offs = plan.layout.offsets(&content[p0..], &mut scratch)?;
        let payload = &content[p0..p0 + *offs.last()? as usize];
        let ns = time.ns(clock, eh.ts, w.stats())?;
        let event = Event {
            id: eh.id,
            ts: eh.ts,
            ns,
            prev_ns,
            payload,
            offs,
        };
        w.saw(plan, &event);
        out.resize(align_event(out.len()), 0);
        match &plan.out {
            Out::Verbatim => {
                put_event_header(out, event.id, ns, prev_ns);
                out.extend_from_slice(payload);
            }
            Out::Expand(ops) => expanded(w, (plan, ops), &event, &idle, out),
            Out::Syscall { exit } => syscall(w, *exit, &event, out),
        }
        events += 1;
        (last_ts, prev_ns) = (eh.ts, ns);
        off = align_event(p0 + payload.len());
    }
    let end = time.ns(clock, h.timestamp_end, w.stats())?;
    put_u64(out, abi::pkt::TIMESTAMP_BEGIN, begin);
    put_u64(out, abi::pkt::TIMESTAMP_END, end);
    set_sizes(out);
    Some(events)
}

/// Writes an event with its plan's insertions, widenings and reshapes.
fn expanded(
    w: &mut impl WriteEvent,
    how: (&ClassPlan, &[Op]),
    e: &Event,
    idle: &Comm,
    out: &mut Vec<u8>,
) {
    put_event_header(out, e.id, e.ns, e.prev_ns);
    plan::write_expanded(how, (e.payload, e.offs), out, &mut |what, out| match what {
        Lookup::Comm(tid) => out.extend_from_slice(&w.thread_name(tid, e.ts, idle)),
        Lookup::IrqName(irq) => {
            out.extend_from_slice(w.irq_name(irq));
            out.push(0);
        }
    });
}

/// Writes a wire system call event as LTTng's
/// `syscall_{entry,exit}_<name>`, or as it is (`_unknown`) when the table
/// cannot name it or it has no output class.
fn syscall(w: &mut impl WriteEvent, exit: bool, e: &Event, out: &mut Vec<u8>) {
    let call = SyscallWire::parse(exit, e.payload, e.offs);
    let named = syscalls::get(call.nr).filter(|s| call.matches(exit, s));
    let id = named.and_then(|_| w.syscall_id(exit, call.nr));
    match named.zip(id) {
        Some((s, id)) => {
            w.stats().syscalls_named += 1;
            put_event_header(out, id, e.ns, e.prev_ns);
            lttng::write_syscall(out, exit, s, &call);
        }
        None => {
            w.stats().syscalls_unknown += 1;
            w.unknown_syscall(exit, e.id);
            put_event_header(out, e.id, e.ns, e.prev_ns);
            out.extend_from_slice(e.payload);
        }
    }
}

/// A packet that does not walk (the drain validated it, so a host bug or a
/// damaged file): its events are lost and counted in `stats` for channel
/// `chan`, and an empty packet with its header takes its place in `out`,
/// so the stream's sequence has no gap and the loss reaches CTF readers
/// (through [`add_discarded`]). Its time is its start's in nanoseconds,
/// or the stream's last one when the clock has none for it. Returns the
/// events lost.
pub fn skipped(
    stats: &mut KernelExpansion,
    chan: u32,
    pkt: &[u8],
    (clock, time): (&ClockMapping, &mut Timeline),
    out: &mut Vec<u8>,
) -> u64 {
    let h = PacketHeader::parse(&pkt[..abi::PACKET_HDR_SIZE]);
    let at = time
        .ns(clock, h.timestamp_begin, stats)
        .unwrap_or(time.last());
    let events = match h.event_count {
        abi::IVT_EVENT_COUNT_UNKNOWN => 0,
        n => n as u64,
    };
    let empty = PacketHeader {
        content_size: abi::PACKET_HDR_SIZE as u64 * 8,
        packet_size: abi::PACKET_HDR_SIZE as u64 * 8,
        event_count: 0,
        timestamp_begin: at,
        timestamp_end: at,
        ..h
    };
    out.clear();
    out.resize(abi::PACKET_HDR_SIZE, 0);
    empty.write(out);
    stats.packets_skipped += 1;
    stats.events_lost = stats.events_lost.saturating_add(events);
    let n = stats.lost_by_channel.entry(chan).or_default();
    *n = n.saturating_add(events);
    events
}

/// Adds `lost` (events of skipped packets before this one) to the running
/// `events_discarded` of the packet in `out`, within what CTF readers
/// accept (babeltrace2 takes 2^64-1 for "unknown").
pub fn add_discarded(out: &mut [u8], lost: u64) {
    if lost == 0 {
        return;
    }
    let at = abi::pkt::EVENTS_DISCARDED;
    let v = le_u64(out, at).saturating_add(lost).min(i64::MAX as u64);
    put_u64(out, at, v);
}

/// Pads a rewritten packet to whole 64-bit words and sets its content and
/// packet sizes (in bits) to what it holds.
fn set_sizes(out: &mut Vec<u8>) {
    let end = out.len();
    let padded = end.next_multiple_of(8);
    out.resize(padded, 0);
    put_u64(out, abi::pkt::CONTENT_SIZE, end as u64 * 8);
    put_u64(out, abi::pkt::PACKET_SIZE, padded as u64 * 8);
}
