//! One wire packet rewritten event by event: the walk the staged expansion
//! ([`super`]) and the streaming one ([`super::online`]) share. They differ
//! only in where a thread's name comes from, how a system call's output
//! class is found or declared, and what they learn on the way, which is
//! what [`WriteEvent`] asks of them.

use ivtrace_region::abi::{self, put_u64};

use super::names::{swapper, Comm};
use super::plan::{self, ClassPlan, Lookup, Op, Out, Plans};
use super::wire::{align_event, event_header, packet_content, Offsets};

/// One wire event of the packet being rewritten.
pub struct Event<'p> {
    /// Its wire class.
    pub id: u32,
    /// Its full timestamp.
    pub ts: u64,
    pub wire_hdr: &'p [u8],
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

    /// Writes a wire system call event (`exit` or entry).
    fn syscall(&mut self, exit: bool, e: &Event, out: &mut Vec<u8>);
}

/// The rewritten form of packet `pkt` in `out`: its header, each event at
/// its aligned place as `w` writes it, then the content and packet sizes
/// set to what was written. Returns the number of events; None if the
/// packet does not walk (an event header, a class or a payload that does
/// not fit).
pub fn packet(
    plans: &Plans,
    pkt: &[u8],
    w: &mut impl WriteEvent,
    out: &mut Vec<u8>,
) -> Option<u64> {
    let (h, content) = packet_content(pkt)?;
    let content = &pkt[..content];
    let idle = swapper(h.cpu_id);
    out.clear();
    out.extend_from_slice(&content[..abi::PACKET_HDR_SIZE]);
    let mut off = abi::PACKET_HDR_SIZE;
    let mut last_ts = h.timestamp_begin;
    let mut events = 0u64;
    let mut scratch: Offsets = [0; abi::IVT_FIELDS_MAX as usize + 1];
    while off < content.len() {
        let eh = event_header(content, off, last_ts)?;
        let plan = plans.get(eh.id)?;
        let p0 = off + eh.len;
        let offs = plan.layout.offsets(&content[p0..], &mut scratch)?;
        let payload = &content[p0..p0 + *offs.last()? as usize];
        let event = Event {
            id: eh.id,
            ts: eh.ts,
            wire_hdr: &content[off..p0],
            payload,
            offs,
        };
        w.saw(plan, &event);
        out.resize(align_event(out.len()), 0);
        match &plan.out {
            Out::Verbatim => {
                out.extend_from_slice(event.wire_hdr);
                out.extend_from_slice(payload);
            }
            Out::Expand(ops) => expanded(w, (plan, ops), &event, &idle, out),
            Out::Syscall { exit } => w.syscall(*exit, &event, out),
        }
        events += 1;
        last_ts = eh.ts;
        off = align_event(p0 + payload.len());
    }
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
    let bytes = (e.wire_hdr, e.payload, e.offs);
    plan::write_expanded(how, bytes, out, &mut |what, out| match what {
        Lookup::Comm(tid) => out.extend_from_slice(&w.thread_name(tid, e.ts, idle)),
        Lookup::IrqName(irq) => {
            out.extend_from_slice(w.irq_name(irq));
            out.push(0);
        }
    });
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
