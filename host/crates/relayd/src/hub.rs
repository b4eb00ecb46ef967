//! The sender: one thread per daemon feeds every session's relay
//! connections from bounded queues, so a recording never waits for the
//! network.
//!
//! A recording ([`Session`]) hands over metadata additions and packets
//! and returns at once. Packets wait in the session's queue up to a byte
//! bound; past it a packet is dropped and its events are counted for its
//! stream. The thread sends each session's queue in turn (a bounded slice
//! per turn, so one flooding guest cannot starve the others), keeps idle
//! streams moving for live viewers with beacons, and confirms written
//! packets with the relay's data-pending query. When a connection breaks
//! (relay restarted, network stalled past the I/O timeout) the packets
//! sent but not yet confirmed are counted as lost, the queue keeps
//! filling, and the thread reconnects every second: a new session under
//! the same name, the whole metadata again (its file is rewritten with
//! the same text) and each data stream in a new file (`<name>_r<N>`),
//! whose packets continue the stream's sequence numbers. Every loss is
//! also added to the `events_discarded` of the stream's next packet on the
//! relay, and a stream whose last packets were lost gets an empty packet
//! at the end that carries the count, so CTF readers of the relay's copy
//! see each loss.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ivtrace_region::abi::pkt;
use ivtrace_region::bytes::{le_u32, le_u64, put_u64};
use serde::Serialize;

use crate::client::{Connection, RelayError};
use crate::proto::PacketIndex;
use crate::url::RelayUrl;

/// Bytes of the CTF packet header fields every ivtrace packet starts
/// with (magic, stream id, instance, timestamps, sizes, sequence number,
/// events discarded: `abi::pkt`), all little-endian.
const HDR_COMMON: usize = pkt::EVENTS_DISCARDED + 8;
/// Packets sent per session per turn before the next session's.
const TURN_PACKETS: usize = 64;
const RETRY: Duration = Duration::from_secs(1);
/// How long a closing session may wait for a connected relay to take its
/// queue.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The index entry of a packet, from its header.
fn index_of(p: &[u8]) -> PacketIndex {
    PacketIndex {
        packet_size: le_u64(p, pkt::PACKET_SIZE),
        content_size: le_u64(p, pkt::CONTENT_SIZE),
        timestamp_begin: le_u64(p, pkt::TIMESTAMP_BEGIN),
        timestamp_end: le_u64(p, pkt::TIMESTAMP_END),
        events_discarded: le_u64(p, pkt::EVENTS_DISCARDED),
        stream_id: le_u32(p, pkt::STREAM_ID) as u64,
        stream_instance_id: le_u64(p, pkt::STREAM_INSTANCE_ID),
        packet_seq_num: le_u64(p, pkt::PACKET_SEQ_NUM),
    }
}

/// Settings of the sender.
#[derive(Debug, Clone)]
pub struct RelayOptions {
    pub url: RelayUrl,
    /// The relay's `hostname` of every session (this machine's name):
    /// the live URL is `net://RELAY/host/<hostname>/<session>`.
    pub hostname: String,
    /// Queue bound per session, bytes.
    pub queue_bytes: usize,
    /// Live timer: beacons for idle streams and confirmations this often.
    pub live_interval: Duration,
}

/// What happened to one stream on its way to the relay (the sidecar's
/// `relay.streams`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    pub trace: String,
    pub stream: String,
    pub packets_sent: u64,
    pub packets_confirmed: u64,
    pub bytes_sent: u64,
    /// Dropped because the queue was full.
    pub packets_dropped: u64,
    pub events_dropped: u64,
    /// Sent but unconfirmed when a connection broke.
    pub packets_lost_in_flight: u64,
    pub events_lost_in_flight: u64,
    pub beacons: u64,
}

impl StreamStats {
    pub fn events_lost(&self) -> u64 {
        self.events_dropped
            .saturating_add(self.events_lost_in_flight)
    }
}

/// A session's relay statistics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionStats {
    pub url: String,
    pub hostname: String,
    pub session: String,
    pub path: String,
    pub connects: u64,
    pub connection_failures: u64,
    pub last_error: Option<String>,
    pub queue_bytes_max: usize,
    pub queue_high_water: usize,
    /// The session ended with its queue sent and every stream closed.
    pub completed: bool,
    pub streams: Vec<StreamStats>,
}

struct Trace {
    /// Directory under the session path (`kernel`, `user`, `host`).
    name: String,
    /// Header size of this trace's packets (for the trailing empty packet).
    hdr_len: usize,
    metadata: Vec<u8>,
    /// Latest "nothing before this" time of the trace's clock, for beacons.
    beacon_floor: u64,
}

struct Stream {
    trace: usize,
    name: String,
    stats: StreamStats,
    /// Events lost so far (dropped + in flight): added to the relay copy's
    /// `events_discarded`.
    lost: u64,
    /// The header of the stream's last packet handed over (sent or not).
    last_header: Vec<u8>,
    /// `lost` when the last packet was sent: a trailing packet is due when
    /// it grew since.
    lost_carried: u64,
}

struct Packet {
    stream: usize,
    bytes: Vec<u8>,
    events: u64,
    /// The stream's events dropped from the queue before this packet was
    /// queued (the losses that precede it).
    dropped_before: u64,
}

/// The part of a session the producer and the sender share.
struct Queue {
    traces: Vec<Trace>,
    streams: Vec<Stream>,
    packets: VecDeque<Packet>,
    bytes: usize,
    closing: bool,
    /// Set by the first [`Session::begin_close`].
    close_deadline: Option<Instant>,
    done: bool,
    stats: SessionStats,
}

struct SessionShared {
    name: String,
    path: String,
    q: Mutex<Queue>,
    done: Condvar,
}

impl SessionShared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct HubShared {
    opts: RelayOptions,
    sessions: Mutex<Vec<Arc<SessionShared>>>,
    wake: Condvar,
    woken: Mutex<bool>,
    stop: AtomicBool,
}

impl HubShared {
    fn notify(&self) {
        *self.woken.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_one();
    }
}

/// The sender thread of a daemon.
pub struct Hub {
    shared: Arc<HubShared>,
    thread: Option<JoinHandle<()>>,
}

impl Hub {
    pub fn start(opts: RelayOptions) -> std::io::Result<Hub> {
        let shared = Arc::new(HubShared {
            opts,
            sessions: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            woken: Mutex::new(false),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ivt-relay".into())
            .spawn(move || Sender::new(s).run())?;
        Ok(Hub {
            shared,
            thread: Some(thread),
        })
    }

    pub fn options(&self) -> &RelayOptions {
        &self.shared.opts
    }

    /// A new relay session `name` whose traces go under `path` (relative to
    /// the relay's output directory, e.g. `HOST/NAME-DATE`).
    pub fn session(&self, name: &str, path: &str) -> Session {
        let opts = &self.shared.opts;
        let shared = Arc::new(SessionShared {
            name: name.to_string(),
            path: path.to_string(),
            q: Mutex::new(Queue {
                traces: Vec::new(),
                streams: Vec::new(),
                packets: VecDeque::new(),
                bytes: 0,
                closing: false,
                close_deadline: None,
                done: false,
                stats: SessionStats {
                    url: opts.url.to_string(),
                    hostname: opts.hostname.clone(),
                    session: name.to_string(),
                    path: path.to_string(),
                    queue_bytes_max: opts.queue_bytes,
                    ..SessionStats::default()
                },
            }),
            done: Condvar::new(),
        });
        self.shared
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&shared));
        self.shared.notify();
        Session {
            shared,
            hub: Arc::clone(&self.shared),
            limit: opts.queue_bytes,
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A recording's side of a relay session. Nothing here blocks on the
/// network: every call takes the session's lock for a queue operation.
pub struct Session {
    shared: Arc<SessionShared>,
    hub: Arc<HubShared>,
    limit: usize,
}

impl Drop for Session {
    /// A session dropped without [`Session::close`] (its recording failed)
    /// still ends: the sender sends what is queued and closes it, so the
    /// sender thread never waits for it forever.
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.hub.notify();
    }
}

/// A trace of a session (its index).
pub type TraceId = usize;

impl Session {
    /// Declares a trace (a directory of the session with its own metadata).
    pub fn trace(&self, name: &str, hdr_len: usize) -> TraceId {
        let mut q = self.shared.lock();
        q.traces.push(Trace {
            name: name.to_string(),
            hdr_len: hdr_len.max(HDR_COMMON),
            metadata: Vec::new(),
            beacon_floor: 0,
        });
        q.traces.len() - 1
    }

    /// Appends `text` to the trace's metadata (never dropped; metadata is
    /// small and append-only).
    pub fn metadata(&self, trace: TraceId, text: &[u8]) {
        if text.is_empty() {
            return;
        }
        self.shared.lock().traces[trace]
            .metadata
            .extend_from_slice(text);
        self.hub.notify();
    }

    /// Bytes of the trace's metadata handed over so far.
    pub fn metadata_len(&self, trace: TraceId) -> usize {
        self.shared.lock().traces[trace].metadata.len()
    }

    /// No event of `trace` will be timestamped before `ts` any more (its
    /// clock's cycles): idle streams get beacons up to it.
    pub fn beacon_floor(&self, trace: TraceId, ts: u64) {
        let mut q = self.shared.lock();
        let f = &mut q.traces[trace].beacon_floor;
        *f = (*f).max(ts);
    }

    /// Hands a packet of stream file `stream` of `trace` over; false if the
    /// queue was full and it was dropped (its `events` counted as lost).
    pub fn packet(&self, trace: TraceId, stream: &str, bytes: &[u8], events: u64) -> bool {
        if bytes.len() < HDR_COMMON {
            return false;
        }
        let mut q = self.shared.lock();
        let s = match q
            .streams
            .iter()
            .position(|s| s.trace == trace && s.name == stream)
        {
            Some(i) => i,
            None => {
                let tname = q.traces[trace].name.clone();
                q.streams.push(Stream {
                    trace,
                    name: stream.to_string(),
                    stats: StreamStats {
                        trace: tname,
                        stream: stream.to_string(),
                        ..StreamStats::default()
                    },
                    lost: 0,
                    last_header: Vec::new(),
                    lost_carried: 0,
                });
                q.streams.len() - 1
            }
        };
        let hdr_len = q.traces[trace].hdr_len.min(bytes.len());
        let full = q.bytes + bytes.len() > self.limit;
        let st = &mut q.streams[s];
        st.last_header.clear();
        st.last_header.extend_from_slice(&bytes[..hdr_len]);
        if full {
            st.stats.packets_dropped += 1;
            st.stats.events_dropped = st.stats.events_dropped.saturating_add(events);
            st.lost = st.lost.saturating_add(events);
            return false;
        }
        let dropped_before = st.stats.events_dropped;
        q.bytes += bytes.len();
        q.stats.queue_high_water = q.stats.queue_high_water.max(q.bytes);
        q.packets.push_back(Packet {
            stream: s,
            bytes: bytes.to_vec(),
            events,
            dropped_before,
        });
        drop(q);
        self.hub.notify();
        true
    }

    /// Bytes waiting in the queue.
    pub fn queued_bytes(&self) -> usize {
        self.shared.lock().bytes
    }

    /// Ends the session: the sender sends what is queued (waiting at most a
    /// few seconds for a relay that is away), closes the streams and the
    /// session. Returns the statistics; packets still queued when it gives
    /// up are counted as dropped.
    pub fn close(&self) -> SessionStats {
        let deadline = self.begin_close();
        let mut q = self.shared.lock();
        while !q.done {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q = self
                .shared
                .done
                .wait_timeout(q, left.min(Duration::from_millis(200)))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        if !q.done {
            abandon(&mut q);
        }
        stats_of(&q)
    }

    /// Starts ending the session without waiting (the sender sends what
    /// is queued and closes it); returns the deadline [`Session::close`]
    /// waits until, the same however often it is called. A drain worker
    /// starts the close, gives its turn to other guests until
    /// [`Session::close_settled`], then calls [`Session::close`], which
    /// then returns at once.
    pub fn begin_close(&self) -> Instant {
        let mut q = self.shared.lock();
        q.closing = true;
        let deadline = *q
            .close_deadline
            .get_or_insert_with(|| Instant::now() + CLOSE_GRACE + Duration::from_secs(2));
        drop(q);
        self.hub.notify();
        deadline
    }

    /// Whether [`Session::close`] would return at once: the sender is done
    /// with the session, or its close deadline has passed.
    pub fn close_settled(&self) -> bool {
        let q = self.shared.lock();
        q.done || q.close_deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The statistics so far.
    pub fn stats(&self) -> SessionStats {
        stats_of(&self.shared.lock())
    }
}

fn stats_of(q: &Queue) -> SessionStats {
    let mut s = q.stats.clone();
    s.streams = q.streams.iter().map(|st| st.stats.clone()).collect();
    s
}

/// Counts every queued packet as dropped (the relay never took them).
fn abandon(q: &mut Queue) {
    while let Some(p) = q.packets.pop_front() {
        let st = &mut q.streams[p.stream].stats;
        st.packets_dropped += 1;
        st.events_dropped = st.events_dropped.saturating_add(p.events);
    }
    q.bytes = 0;
    q.done = true;
}

/// A packet sent on the current connection and not confirmed yet.
struct InFlight {
    net_seq: u64,
    events: u64,
}

/// The sender's side of one stream on the current connection.
#[derive(Default)]
struct Wire {
    handle: Option<u64>,
    next_seq: u64,
    in_flight: VecDeque<InFlight>,
    /// Sent since the last beacon tick.
    active: bool,
    last_ts_end: u64,
    ctf_stream_id: u64,
    instance: u64,
    closed: bool,
}

/// The sender's side of one session.
struct Link {
    session: Arc<SessionShared>,
    conn: Option<Connection>,
    generation: u64,
    retry_at: Instant,
    meta_handles: Vec<Option<u64>>,
    meta_sent: Vec<usize>,
    wires: Vec<Wire>,
}

struct Sender {
    hub: Arc<HubShared>,
    links: Vec<Link>,
    last_tick: Instant,
}

impl Sender {
    fn new(hub: Arc<HubShared>) -> Sender {
        Sender {
            hub,
            links: Vec::new(),
            last_tick: Instant::now(),
        }
    }

    fn run(mut self) {
        loop {
            self.adopt_sessions();
            let tick = self.last_tick.elapsed() >= self.hub.opts.live_interval;
            if tick {
                self.last_tick = Instant::now();
            }
            let mut busy = false;
            for link in &mut self.links {
                busy |= link.service(&self.hub.opts, tick);
            }
            self.links.retain(|l| !l.session.lock().done);
            if self.hub.stop.load(Ordering::Relaxed) && self.links.is_empty() {
                return;
            }
            if !busy {
                self.sleep();
            }
        }
    }

    fn adopt_sessions(&mut self) {
        let mut sessions = self.hub.sessions.lock().unwrap_or_else(|p| p.into_inner());
        for s in sessions.drain(..) {
            self.links.push(Link {
                session: s,
                conn: None,
                generation: 0,
                retry_at: Instant::now(),
                meta_handles: Vec::new(),
                meta_sent: Vec::new(),
                wires: Vec::new(),
            });
        }
    }

    fn sleep(&self) {
        let left = self
            .hub
            .opts
            .live_interval
            .saturating_sub(self.last_tick.elapsed())
            .max(Duration::from_millis(1));
        let mut woken = self.hub.woken.lock().unwrap_or_else(|p| p.into_inner());
        if !*woken {
            woken = self
                .hub
                .wake
                .wait_timeout(woken, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        *woken = false;
    }
}

impl Link {
    /// One turn: connect if due, send metadata and up to a slice of
    /// packets, beacons and confirmations on a tick, close when asked.
    /// Returns whether packets are still waiting.
    fn service(&mut self, opts: &RelayOptions, tick: bool) -> bool {
        let closing = self.session.lock().closing;
        if self.conn.is_none() && !self.try_connect(opts) {
            // A recording that ends while the relay is away does not wait
            // for it (its worker has other guests): what is queued is
            // counted as dropped.
            if closing {
                self.give_up();
            }
            return false;
        }
        let result = self.send_turn(tick, closing);
        match result {
            Ok(more) => more,
            Err(e) => {
                self.broken(&e);
                false
            }
        }
    }

    fn try_connect(&mut self, opts: &RelayOptions) -> bool {
        if Instant::now() < self.retry_at {
            return false;
        }
        self.retry_at = Instant::now() + RETRY;
        let live_us = opts.live_interval.as_micros().clamp(1, u32::MAX as u128) as u32;
        let s = &self.session;
        match Connection::open(&opts.url, &s.name, &opts.hostname, live_us) {
            Ok(c) => {
                let mut q = s.lock();
                q.stats.connects += 1;
                self.generation = q.stats.connects - 1;
                drop(q);
                self.conn = Some(c);
                self.meta_handles.clear();
                self.meta_sent.clear();
                for w in &mut self.wires {
                    w.handle = None;
                    w.closed = false;
                }
                true
            }
            Err(e) => {
                self.note_failure(&e);
                false
            }
        }
    }

    fn note_failure(&self, e: &RelayError) {
        let mut q = self.session.lock();
        q.stats.connection_failures += 1;
        let msg = e.to_string();
        if q.stats.last_error.as_deref() != Some(msg.as_str()) {
            eprintln!("ivtrace: relay session {}: {msg}; retrying every second, packets queue up to {} bytes",
                self.session.name, q.stats.queue_bytes_max);
        }
        q.stats.last_error = Some(msg);
    }

    /// The connection broke: what was in flight is lost (counted), the
    /// rest waits for the next connection.
    fn broken(&mut self, e: &RelayError) {
        self.note_failure(e);
        self.conn = None;
        let mut q = self.session.lock();
        for (i, w) in self.wires.iter_mut().enumerate() {
            let st = &mut q.streams[i];
            for p in w.in_flight.drain(..) {
                st.stats.packets_lost_in_flight += 1;
                st.stats.events_lost_in_flight =
                    st.stats.events_lost_in_flight.saturating_add(p.events);
                st.lost = st.lost.saturating_add(p.events);
            }
            w.handle = None;
        }
    }

    fn give_up(&mut self) {
        let mut q = self.session.lock();
        abandon(&mut q);
        self.session.done.notify_all();
    }

    fn send_turn(&mut self, tick: bool, closing: bool) -> Result<bool, RelayError> {
        self.publish()?;
        let more = self.send_packets()?;
        if tick {
            self.confirm()?;
            self.beacons()?;
        }
        if closing && !more {
            self.finish()?;
        }
        Ok(more)
    }

    /// Metadata streams and their additions, new data streams: added and
    /// published before any of their packets. What to send is copied under
    /// the queue's lock and sent after it: a relay that answers late must
    /// never hold up a recording handing over packets (issue 23, case 4).
    fn publish(&mut self) -> Result<(), RelayError> {
        let (metadata, streams) = self.due_for_publishing();
        let conn = self.conn.as_mut().expect("connected");
        let mut added = false;
        for (t, path, bytes, new_len) in metadata {
            let handle = match self.meta_handles[t] {
                Some(h) => h,
                None => {
                    let h = conn.add_stream("metadata", &path)?;
                    added = true;
                    *self.meta_handles[t].insert(h)
                }
            };
            conn.metadata(handle, &bytes)?;
            self.meta_sent[t] = new_len;
        }
        for (i, trace, name, path) in streams {
            if self.meta_handles[trace].is_none() {
                continue;
            }
            self.wires[i].handle = Some(conn.add_stream(&name, &path)?);
            added = true;
        }
        if added {
            conn.streams_sent()?;
        }
        Ok(())
    }

    /// Under the queue's lock: the metadata additions (trace, path, bytes,
    /// length sent after them) and the data streams without a handle yet
    /// (index, trace, name, path).
    #[allow(clippy::type_complexity)]
    fn due_for_publishing(
        &mut self,
    ) -> (
        Vec<(usize, String, Vec<u8>, usize)>,
        Vec<(usize, usize, String, String)>,
    ) {
        let q = self.session.lock();
        self.meta_handles.resize(q.traces.len(), None);
        self.meta_sent.resize(q.traces.len(), 0);
        self.wires.resize_with(q.streams.len(), Wire::default);
        let path_of = |t: usize| format!("{}/{}", self.session.path, q.traces[t].name);
        let metadata = q
            .traces
            .iter()
            .enumerate()
            .filter(|(t, trace)| trace.metadata.len() != self.meta_sent[*t])
            .map(|(t, trace)| {
                let bytes = trace.metadata[self.meta_sent[t]..].to_vec();
                (t, path_of(t), bytes, trace.metadata.len())
            })
            .collect();
        let streams = q
            .streams
            .iter()
            .enumerate()
            .filter(|(i, _)| self.wires[*i].handle.is_none())
            .map(|(i, s)| {
                let name = match self.generation {
                    0 => s.name.clone(),
                    g => format!("{}_r{g}", s.name),
                };
                (i, s.trace, name, path_of(s.trace))
            })
            .collect();
        (metadata, streams)
    }

    /// Sends up to [`TURN_PACKETS`] queued packets.
    fn send_packets(&mut self) -> Result<bool, RelayError> {
        for _ in 0..TURN_PACKETS {
            let mut q = self.session.lock();
            let Some(front) = q.packets.front() else {
                return Ok(false);
            };
            match self.wires.get(front.stream) {
                // A stream declared since this turn's publish: next turn.
                None => return Ok(true),
                // Its trace's metadata is not there yet.
                Some(w) if w.handle.is_none() => return Ok(false),
                Some(_) => {}
            }
            let mut p = q.packets.pop_front().expect("front");
            q.bytes -= p.bytes.len();
            // Losses before this packet: drops of packets queued before it,
            // and packets sent before it that a broken connection lost.
            let st = &q.streams[p.stream];
            let lost = p
                .dropped_before
                .saturating_add(st.stats.events_lost_in_flight);
            drop(q);
            self.send_one(&mut p, lost)?;
        }
        Ok(!self.session.lock().packets.is_empty())
    }

    fn send_one(&mut self, p: &mut Packet, lost: u64) -> Result<(), RelayError> {
        let discarded = le_u64(&p.bytes, pkt::EVENTS_DISCARDED)
            .saturating_add(lost)
            .min(i64::MAX as u64);
        put_u64(&mut p.bytes, pkt::EVENTS_DISCARDED, discarded);
        let ix = index_of(&p.bytes);
        let w = &mut self.wires[p.stream];
        let handle = w.handle.expect("published");
        let seq = w.next_seq;
        w.in_flight.push_back(InFlight {
            net_seq: seq,
            events: p.events,
        });
        w.next_seq += 1;
        w.active = true;
        w.last_ts_end = w.last_ts_end.max(ix.timestamp_end);
        w.ctf_stream_id = ix.stream_id;
        w.instance = ix.stream_instance_id;
        let conn = self.conn.as_mut().expect("connected");
        conn.packet(handle, seq, &p.bytes, &ix)?;
        let mut q = self.session.lock();
        let st = &mut q.streams[p.stream];
        st.stats.packets_sent += 1;
        st.stats.bytes_sent += p.bytes.len() as u64;
        st.lost_carried = lost;
        Ok(())
    }

    /// Asks the relay which packets it has written, and forgets those.
    fn confirm(&mut self) -> Result<(), RelayError> {
        let conn = self.conn.as_mut().expect("connected");
        let mut confirmed = Vec::new();
        for (i, w) in self.wires.iter_mut().enumerate() {
            let (Some(h), Some(last)) = (w.handle, w.in_flight.back()) else {
                continue;
            };
            let last = last.net_seq;
            if conn.written_up_to(h, last)? {
                confirmed.push((i, w.in_flight.len() as u64));
                w.in_flight.clear();
            }
        }
        let mut q = self.session.lock();
        for (i, n) in confirmed {
            q.streams[i].stats.packets_confirmed += n;
        }
        Ok(())
    }

    /// Live beacons: each stream that sent nothing since the last tick
    /// says "nothing before" its trace's floor (never before its own last
    /// packet's end).
    fn beacons(&mut self) -> Result<(), RelayError> {
        // The floors are read under the queue's lock, sent after it.
        let floors: Vec<u64> = {
            let q = self.session.lock();
            q.streams
                .iter()
                .map(|st| q.traces[st.trace].beacon_floor)
                .collect()
        };
        let conn = self.conn.as_mut().expect("connected");
        let mut sent = Vec::new();
        for (i, w) in self.wires.iter_mut().enumerate() {
            let active = std::mem::take(&mut w.active);
            let (Some(h), Some(&floor)) = (w.handle, floors.get(i)) else {
                continue;
            };
            if active || w.next_seq == 0 || w.closed {
                continue;
            }
            let ix = PacketIndex {
                timestamp_end: floor.max(w.last_ts_end),
                stream_id: w.ctf_stream_id,
                stream_instance_id: w.instance,
                ..PacketIndex::default()
            };
            conn.index(h, w.next_seq.saturating_sub(1), &ix)?;
            sent.push(i);
        }
        let mut q = self.session.lock();
        for i in sent {
            q.streams[i].stats.beacons += 1;
        }
        Ok(())
    }

    /// The queue is empty and the session closing: trailing losses get
    /// their empty packet, streams are confirmed and closed.
    fn finish(&mut self) -> Result<(), RelayError> {
        self.trailing_packets()?;
        self.confirm()?;
        let conn = self.conn.as_mut().expect("connected");
        for w in &mut self.wires {
            if let (Some(h), false) = (w.handle, w.closed) {
                conn.close_stream(h, w.next_seq.wrapping_sub(1))?;
                w.closed = true;
            }
        }
        // Metadata is not sent as packets: "no last packet" closes it now.
        for h in self.meta_handles.iter().flatten() {
            conn.close_stream(*h, u64::MAX)?;
        }
        let mut q = self.session.lock();
        for (i, w) in self.wires.iter().enumerate() {
            // Closed streams cannot be asked; what is left is taken as written
            // (the relay closes a stream only once it has its last packet).
            q.streams[i].stats.packets_confirmed += w.in_flight.len() as u64;
        }
        q.stats.completed = true;
        q.done = true;
        self.session.done.notify_all();
        Ok(())
    }

    fn trailing_packets(&mut self) -> Result<(), RelayError> {
        let q = self.session.lock();
        let mut due = Vec::new();
        for (i, s) in q.streams.iter().enumerate() {
            if s.lost > s.lost_carried && s.last_header.len() >= HDR_COMMON {
                let mut p = s.last_header.clone();
                let bits = (p.len() * 8) as u64;
                let end = le_u64(&p, pkt::TIMESTAMP_END);
                put_u64(&mut p, pkt::TIMESTAMP_BEGIN, end);
                put_u64(&mut p, pkt::CONTENT_SIZE, bits);
                put_u64(&mut p, pkt::PACKET_SIZE, bits);
                // The sequence number stays the last handed-over packet's:
                // that one was lost, so this one takes its place.
                // ivtrace guest packets count their events at byte 72.
                if p.len() >= 76 {
                    p[72..76].fill(0);
                }
                // The base count is the header's, before the relay's losses.
                due.push((i, p, s.lost));
            }
        }
        drop(q);
        for (i, p, lost) in due {
            if self.wires[i].handle.is_none() {
                continue;
            }
            let mut pk = Packet {
                stream: i,
                bytes: p,
                events: 0,
                dropped_before: 0,
            };
            self.send_one(&mut pk, lost)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_region::bytes::put_u32;
    use std::collections::HashMap;

    /// A packet of `len` bytes whose header says `events_discarded` = 0.
    fn packet(len: usize, seq: u64) -> Vec<u8> {
        let mut p = vec![0u8; len.max(HDR_COMMON)];
        put_u64(&mut p, pkt::CONTENT_SIZE, (len * 8) as u64);
        put_u64(&mut p, pkt::PACKET_SIZE, (len * 8) as u64);
        put_u64(&mut p, pkt::PACKET_SEQ_NUM, seq);
        p
    }

    /// No relay listens: packets queue up to the bound, the rest are
    /// dropped and counted per stream; closing gives up at once and counts
    /// what was queued.
    #[test]
    fn a_relay_that_is_away_costs_counted_packets_only() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port(); // closed again: nobody listens there
        let hub = Hub::start(RelayOptions {
            url: crate::url::parse(&format!("net://127.0.0.1:{port}:{port}")).unwrap(),
            hostname: "h".into(),
            queue_bytes: 4096,
            live_interval: Duration::from_millis(20),
        })
        .unwrap();
        let s = hub.session("g", "h/g-1");
        let t = s.trace("user", 88);
        s.metadata(t, b"/* CTF 1.8 */");
        let taken: Vec<bool> = (0..6)
            .map(|i| s.packet(t, "user_chan0", &packet(1024, i), 10))
            .collect();
        assert_eq!(taken, [true, true, true, true, false, false]);
        assert!(!s.packet(t, "user_chan1", &packet(1024, 0), 7));
        let started = Instant::now();
        let stats = s.close();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "closing waited for an absent relay"
        );
        assert!(!stats.completed);
        let by_name: HashMap<_, _> = stats
            .streams
            .iter()
            .map(|st| (st.stream.as_str(), st))
            .collect();
        assert_eq!(by_name["user_chan0"].packets_dropped, 6);
        assert_eq!(by_name["user_chan0"].events_dropped, 60);
        assert_eq!(by_name["user_chan1"].events_dropped, 7);
        assert_eq!(
            stats.streams.iter().map(|st| st.packets_sent).sum::<u64>(),
            0
        );
        assert!(stats.connection_failures > 0 && stats.last_error.is_some());
    }

    #[test]
    fn indexes_come_from_the_packet_header() {
        let mut p = packet(256, 9);
        put_u32(&mut p, pkt::STREAM_ID, 1);
        put_u64(&mut p, pkt::STREAM_INSTANCE_ID, 3);
        put_u64(&mut p, pkt::TIMESTAMP_BEGIN, 100);
        put_u64(&mut p, pkt::TIMESTAMP_END, 200);
        put_u64(&mut p, pkt::EVENTS_DISCARDED, 5);
        let ix = index_of(&p);
        assert_eq!(
            (ix.stream_id, ix.stream_instance_id, ix.packet_seq_num),
            (1, 3, 9)
        );
        assert_eq!(
            (ix.timestamp_begin, ix.timestamp_end, ix.events_discarded),
            (100, 200, 5)
        );
        assert_eq!((ix.packet_size, ix.content_size), (2048, 2048));
    }
}
