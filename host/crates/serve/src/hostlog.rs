//! What serve observes, written to the `ivtrace` stream of the guest's
//! host trace (`DIR/host/ivtrace_host`): doorbells received, packets
//! delivered to the trace files, clock sync points, control commands.
//! [`Delivering`] is serve's output (the CTF writer with [`Deliveries`],
//! the delivery log, watching what it commits); [`ServeHooks`] is what serve adds to the engine's loop (control
//! and status requests, the doorbell and sync log).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use serde_json::json;

use ivtrace_ctf::host_trace::{HostTrace, Payload, STREAM_IVTRACE};
use ivtrace_ctf::{ClockMapping, CtfError};
use ivtrace_engine::after_commit::{AfterCommit, Watcher};
use ivtrace_engine::{BoxError, Hooks, Sinks, StopReason, Woken};
use ivtrace_region::bytes::{u32_at, u64_at};
use ivtrace_region::classes::{EventClass, Field, FieldType};
use ivtrace_region::{abi, Command, EventClasses, Reader};
use ivtrace_time::pingpong::SyncPoint;
use ivtrace_time::timebase::host_now_ns;

use crate::error::Report;
use crate::guest::{GuestStatus, Request};
use crate::ServeError;

/// Event ids of the serve stream in the host trace.
pub mod ev {
    pub const DOORBELL_RECEIVED: u32 = 0;
    pub const PACKET_DELIVERED: u32 = 1;
    pub const SYNC_POINT: u32 = 2;
    pub const CONTROL: u32 = 3;
}

/// Deliveries kept for the latency statistics (the log in the host trace
/// keeps them all): a uniform sample of this many (Vitter's algorithm R),
/// so a guest that never idles costs a fixed 2.5 MiB here, not 48 bytes
/// per packet forever.
const DELIVERIES_KEPT: usize = 1 << 16;

fn u64_fields(names: &[&str]) -> Vec<Field> {
    names
        .iter()
        .map(|&n| Field::new(n, FieldType::U64, false))
        .collect()
}

/// The serve stream's event classes.
pub fn serve_classes() -> Vec<EventClass> {
    let c = |id, name: &str, fields| EventClass::new(id, STREAM_IVTRACE, name.into(), fields);
    let delivered = vec![
        Field::new("chan", FieldType::U32, false),
        Field::new("packet_seq", FieldType::U64, false),
        Field::new("ts_begin", FieldType::U64, false),
        Field::new("ts_end", FieldType::U64, false),
        Field::new("events", FieldType::U32, false),
    ];
    let control = vec![
        Field::new("cmd", FieldType::U32, false),
        Field::new("arg", FieldType::U64, true),
        Field::new("status", FieldType::S32, false),
        Field::new("latency_ns", FieldType::U64, false),
    ];
    vec![
        c(
            ev::DOORBELL_RECEIVED,
            "ivtrace_doorbell_received",
            u64_fields(&["count", "total"]),
        ),
        c(ev::PACKET_DELIVERED, "ivtrace_packet_delivered", delivered),
        c(
            ev::SYNC_POINT,
            "ivtrace_sync_point",
            u64_fields(&["guest_ticks", "host_ns", "rtt_ns"]),
        ),
        c(ev::CONTROL, "ivtrace_control", control),
    ]
}

/// One event on the serve stream (`stream` of `host`) at `ts`.
fn log_event(
    host: &Mutex<HostTrace>,
    stream: usize,
    id: u32,
    ts: u64,
    payload: Payload,
) -> Result<(), CtfError> {
    host.lock()
        .expect("not poisoned")
        .event(stream, id, ts, 0, &payload.0)
}

/// A packet handed to the trace, waiting for the flush that makes it
/// visible in the file (its delivery time).
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    chan: u32,
    seq: u64,
    ts_begin: u64,
    ts_end: u64,
    /// The packet's times are nanoseconds since the epoch (a user packet,
    /// which the drain rewrites), not the guest's ticks (kernel wire).
    in_ns: bool,
    events: u32,
    at_ns: u64,
}

impl Delivery {
    /// The delivery of packet `bytes` of channel `chan`, from its header
    /// (checked: None when `bytes` is too short to hold one).
    fn of(chan: u32, bytes: &[u8]) -> Option<Delivery> {
        use abi::pkt;
        Some(Delivery {
            chan,
            seq: u64_at(bytes, pkt::PACKET_SEQ_NUM)?,
            ts_begin: u64_at(bytes, pkt::TIMESTAMP_BEGIN)?,
            ts_end: u64_at(bytes, pkt::TIMESTAMP_END)?,
            in_ns: u32_at(bytes, pkt::STREAM_ID)? == abi::IVT_STREAM_USER,
            events: u32_at(bytes, pkt::EVENT_COUNT)?,
            at_ns: 0,
        })
    }

    /// Packet time `ts` (one of its own) in nanoseconds since the epoch.
    fn ns(&self, clock: &ClockMapping, ts: u64) -> i128 {
        match self.in_ns {
            true => i128::from(ts),
            false => clock.realtime_ns(ts),
        }
    }
}

/// serve's output: the CTF writer, plus the log of when each packet
/// became visible in its file.
pub type Delivering = AfterCommit<Sinks, Deliveries>;

/// The log of when each packet became visible in its trace file (in the
/// host trace), and a sample of the deliveries for the latency statistics.
pub struct Deliveries {
    host: Arc<Mutex<HostTrace>>,
    stream: usize,
    /// A uniform sample of the deliveries, for the latency statistics.
    delivered: Vec<Delivery>,
    /// Deliveries so far (the sample's population).
    deliveries: u64,
    /// Packets written whose header was too short to log their delivery
    /// (the reader validates headers, so 0 unless that check is broken).
    headerless: u64,
    rng: u64,
}

impl Deliveries {
    /// serve's output: `sinks` with the deliveries of its directory logged
    /// in `host`'s `stream`.
    pub fn around(sinks: Sinks, host: Arc<Mutex<HostTrace>>, stream: usize) -> Delivering {
        let log = Deliveries {
            host,
            stream,
            delivered: Vec::new(),
            deliveries: 0,
            headerless: 0,
            rng: host_now_ns() | 1,
        };
        AfterCommit::new(sinks, log)
    }

    /// Keeps `d` in the sample with probability kept/seen.
    fn sample(&mut self, d: Delivery) {
        self.deliveries += 1;
        if self.delivered.len() < DELIVERIES_KEPT {
            self.delivered.push(d);
            return;
        }
        // xorshift64: statistics, not secrets.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let j = self.rng % self.deliveries;
        if let Some(slot) = self.delivered.get_mut(j as usize) {
            *slot = d;
        }
    }

    /// Stamps the packets the writer committed with now and logs them in
    /// the host trace.
    fn deliver(&mut self, committed: Vec<Delivery>) -> Result<(), CtfError> {
        let now = host_now_ns();
        let host = Arc::clone(&self.host);
        let mut h = host.lock().expect("not poisoned");
        for mut d in committed {
            d.at_ns = now;
            let payload = Payload::default()
                .u32(d.chan)
                .u64(d.seq)
                .u64(d.ts_begin)
                .u64(d.ts_end)
                .u32(d.events);
            h.event(self.stream, ev::PACKET_DELIVERED, now, 0, &payload.0)?;
            self.sample(d);
        }
        Ok(())
    }

    /// Delivery latency: host time the packet reached the file minus the
    /// mapped guest time of its first and last events.
    pub fn latency(&self, clock: &ClockMapping) -> serde_json::Value {
        let mut first: Vec<i128> = Vec::new();
        let mut last: Vec<i128> = Vec::new();
        for d in self.delivered.iter().filter(|d| d.events > 0) {
            first.push(d.at_ns as i128 - d.ns(clock, d.ts_begin));
            last.push(d.at_ns as i128 - d.ns(clock, d.ts_end));
        }
        first.sort_unstable();
        last.sort_unstable();
        json!({
            "packets": self.deliveries,
            "packets_without_header": self.headerless,
            "sampled": first.len(),
            "note": "host time the packet reached the trace file minus the mapped guest time of its oldest (first) / newest (last) event",
            "oldest_event_ms": percentiles_ms(&first),
            "newest_event_ms": percentiles_ms(&last),
        })
    }
}

fn percentile(sorted: &[i128], p: f64) -> Option<i128> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    Some(sorted[i])
}

fn percentiles_ms(sorted: &[i128]) -> serde_json::Value {
    let ms = |v: Option<i128>| v.map(|x| x as f64 / 1e6);
    json!({"p50": ms(percentile(sorted, 0.5)), "p99": ms(percentile(sorted, 0.99)),
           "max": ms(sorted.last().copied()), "min": ms(sorted.first().copied())})
}

impl Watcher for Deliveries {
    type Note = Delivery;
    type Error = CtfError;

    fn note(&mut self, chan: u32, _: u32, bytes: &[u8], _: &EventClasses) -> Option<Delivery> {
        let d = Delivery::of(chan, bytes);
        if d.is_none() {
            self.headerless = self.headerless.saturating_add(1);
        }
        d
    }

    fn committed(&mut self, notes: Vec<Delivery>) -> Result<(), CtfError> {
        self.deliver(notes)
    }

    /// Idle: the host trace's open packets reach their files too.
    fn idle(&mut self) -> Result<(), CtfError> {
        self.host.lock().expect("not poisoned").flush()
    }
}

/// Kicks the guest's MSI-X vector 0 (control and sync).
pub fn kick(fd: Option<&EventFd>) {
    if let Some(fd) = fd {
        // EAGAIN only if the counter is about to overflow: a kick is
        // pending anyway.
        let _ = fd.write(1);
    }
}

/// What serve adds to the engine's loop for one recording.
pub struct ServeHooks<'a> {
    pub requests: &'a Receiver<Request>,
    pub status: &'a Mutex<GuestStatus>,
    pub stop: &'a AtomicBool,
    pub kick: Option<&'a EventFd>,
    pub host: Arc<Mutex<HostTrace>>,
    pub stream: usize,
    /// Doorbells received so far.
    pub received: u64,
    pub safety_timeout: Duration,
    /// The trace directory (what `handoff` answers).
    pub out: &'a std::path::Path,
    /// `ivtrace ctl handoff` asked to end this part with a handoff.
    pub handoff: bool,
}

impl ServeHooks<'_> {
    /// Posts `cmd` in the region, kicks the guest, logs the answer.
    fn control(&self, reader: &Reader, cmd: Command) -> Result<ivtrace_region::Ack, String> {
        let region = reader.region().protocol();
        let timeout = region.ack_timeout(true);
        let res = region.send_command(cmd, &|| kick(self.kick), timeout);
        if let Ok(a) = &res {
            let payload = Payload::default()
                .u32(cmd.code())
                .u64(cmd.arg())
                .i32(a.status)
                .u64(a.latency.as_nanos() as u64);
            let _ = log_event(&self.host, self.stream, ev::CONTROL, host_now_ns(), payload);
        }
        res.map_err(|e| format!("{}", Report(&e)))
    }

    /// Posts one ftrace request, kicks the guest, waits for the relay's
    /// answer (the drain pauses meanwhile: a tracer switch under TCG takes
    /// seconds, which the channels' rings absorb).
    fn ftrace(&self, reader: &Reader, text: &str) -> Result<ivtrace_region::FtraceAck, String> {
        let region = reader.region().protocol();
        let timeout = region.ftrace_timeout(true);
        let res = region.send_ftrace(text.as_bytes(), &|| kick(self.kick), timeout);
        if let Ok(a) = &res {
            let payload = Payload::default()
                .u32(ivtrace_region::abi::IVT_CMD_FTRACE)
                .u64(text.len() as u64)
                .i32(a.ack.status)
                .u64(a.ack.latency.as_nanos() as u64);
            let _ = log_event(&self.host, self.stream, ev::CONTROL, host_now_ns(), payload);
        }
        res.map_err(|e| format!("{}", Report(&e)))
    }

    /// `ivtrace ctl list/status`: the last state plus fresh counters.
    fn status(&self, reader: &Reader) -> GuestStatus {
        let mut s = self.status.lock().map(|s| s.clone()).unwrap_or_default();
        let (mut ev, mut pk, mut by, mut lost) = (0, 0, 0, 0);
        for c in 0..reader.nr_channels() {
            let st = reader.channel_stats(c);
            ev += st.events;
            pk += st.packets;
            by += st.bytes_out;
            lost += st.writer_lost.total() + st.host_lost.total();
        }
        s.events = ev;
        s.packets = pk;
        s.bytes = by;
        s.lost = lost;
        s.doorbells = self.received;
        s.doorbells_rung = reader.region().protocol().doorbells_rung();
        s
    }
}

impl Hooks for ServeHooks<'_> {
    fn stop_requested(&mut self) -> Option<StopReason> {
        if self.handoff {
            return Some(StopReason::Handoff);
        }
        self.stop
            .load(Ordering::Relaxed)
            .then_some(StopReason::Interrupted)
    }

    /// Answers control and status requests.
    fn between_passes(&mut self, reader: &Reader) -> Result<(), BoxError> {
        loop {
            match self.requests.try_recv() {
                Ok(Request::Control { cmd, reply }) => {
                    let _ = reply.send(self.control(reader, cmd));
                }
                Ok(Request::Status { reply }) => {
                    let _ = reply.send(self.status(reader));
                }
                Ok(Request::Ftrace { text, reply }) => {
                    let _ = reply.send(self.ftrace(reader, &text));
                }
                Ok(Request::Handoff { reply }) => {
                    self.handoff = true;
                    let _ = reply.send(Ok(self.out.display().to_string()));
                }
                Ok(Request::Resume { reply, .. }) => {
                    let _ = reply.send(Err("already recording: `resume` is for a guest that \
                                            arrives by migration (QEMU -incoming)"
                        .into()));
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return Ok(()),
            }
        }
    }

    fn synced(&mut self, p: &SyncPoint) -> Result<(), BoxError> {
        let payload = Payload::default()
            .u64(p.guest_ticks)
            .u64(p.host_ns)
            .u64(p.rtt_ns);
        log_event(
            &self.host,
            self.stream,
            ev::SYNC_POINT,
            host_now_ns(),
            payload,
        )
        .map_err(|e| ServeError::HostTrace(e).into())
    }

    fn woken(&mut self, woken: &Woken) -> Result<(), BoxError> {
        if woken.doorbells == 0 {
            return Ok(());
        }
        self.received += woken.doorbells;
        let payload = Payload::default().u64(woken.doorbells).u64(self.received);
        let id = ev::DOORBELL_RECEIVED;
        log_event(&self.host, self.stream, id, woken.at_ns, payload)
            .map_err(|e| ServeError::HostTrace(e).into())
    }

    fn max_wait(&self) -> Duration {
        self.safety_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::pkt;

    #[test]
    fn a_delivery_is_read_from_the_header_or_not_at_all() {
        let mut hdr = vec![0u8; pkt::OWNER_TID + 4];
        hdr[pkt::PACKET_SEQ_NUM..][..8].copy_from_slice(&7u64.to_le_bytes());
        hdr[pkt::TIMESTAMP_BEGIN..][..8].copy_from_slice(&100u64.to_le_bytes());
        hdr[pkt::TIMESTAMP_END..][..8].copy_from_slice(&200u64.to_le_bytes());
        hdr[pkt::EVENT_COUNT..][..4].copy_from_slice(&3u32.to_le_bytes());
        let d = Delivery::of(2, &hdr).expect("a whole header");
        assert_eq!(
            (d.chan, d.seq, d.ts_begin, d.ts_end, d.events),
            (2, 7, 100, 200, 3)
        );
        // Short of the event count: no delivery (it was 0s before, silently).
        assert!(Delivery::of(2, &hdr[..pkt::EVENT_COUNT + 3]).is_none());
        assert!(Delivery::of(2, &[]).is_none());
    }
}
