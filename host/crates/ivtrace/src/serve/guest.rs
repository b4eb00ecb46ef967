//! One connected QEMU: its thread waits for the guest module to format the
//! region, records it with the drain engine (sleeping on the doorbell when
//! idle), answers control requests, keeps the guest clock synchronized,
//! and finalizes the trace whatever ends the recording: Ctrl-C, QEMU
//! exiting or killed, the peer misbehaving, the module unloading (then it
//! waits for the next load, which starts a new trace directory).
//!
//! Nothing here may take the server down: errors end this guest's
//! recording (after finalizing what was recorded) and are logged.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::eventfd::EventFd;
use serde_json::json;

use ivtrace_ctf::{ClockMapping, CtfWriter, EnvValue};
use ivtrace_region::classes::{EventClass, Field, FieldType};
use ivtrace_region::reader::PacketSink;
use ivtrace_region::{abi, Access, Ack, Command, EventClasses, Reader, Region, RegionError};

use crate::serve::proto::{Eventfds, PeerInfo, HOST_ID};
use crate::serve::ServeConfig;
use ivtrace_engine::notify::{Notifier, NotifyStats};
use ivtrace_engine::session;

use crate::summary;
use ivtrace_ctf::host::{HostTrace, HostTraceDesc, Payload, STREAM_IVTRACE};
use ivtrace_time::estimator::ClockEstimator;
use ivtrace_time::kvm::KvmTsc;
use ivtrace_time::pingpong::{self, PingPong, PingPongEstimate};
use ivtrace_time::timebase::host_now_ns;

/// Epoll tokens.
const TOK_CONN: u64 = 1;
const TOK_WAKE: u64 = 2;
/// While waiting for the module to format the region.
const FORMAT_POLL: Duration = Duration::from_millis(200);
/// Slow checks (re-format, status) while recording.
const SLOW_CHECK: Duration = Duration::from_millis(100);
/// Polling backoff for a region without doorbells.
const POLL_MIN: Duration = Duration::from_micros(50);
const POLL_MAX: Duration = Duration::from_millis(20);

/// A request from the control socket.
pub enum Request {
    Control {
        cmd: Command,
        reply: Sender<Result<Ack, String>>,
    },
    Status {
        reply: Sender<GuestStatus>,
    },
}

/// What `ivtrace ctl list` shows of a guest.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GuestStatus {
    pub name: String,
    pub qemu_pid: Option<i32>,
    pub state: String,
    pub shm: String,
    /// Trace directories written so far (one per formatted region).
    pub traces: Vec<String>,
    pub clock_method: Option<String>,
    pub clock_error_ns: Option<u64>,
    pub events: u64,
    pub packets: u64,
    pub bytes: u64,
    pub lost: u64,
    /// Doorbells received during the current recording.
    pub doorbells: u64,
    /// Doorbells the guest says it rang (region counter).
    pub doorbells_rung: u64,
}

/// Everything one guest thread owns.
pub struct Guest {
    pub name: String,
    pub peer: PeerInfo,
    pub conn: UnixStream,
    pub shm_path: PathBuf,
    pub shm_file: File,
    pub fds: Eventfds,
    pub wake: Arc<EventFd>,
    pub requests: Receiver<Request>,
    pub status: Arc<Mutex<GuestStatus>>,
    pub cfg: Arc<ServeConfig>,
    pub stop: Arc<AtomicBool>,
    conn_open: bool,
}

/// Why one recording ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Stop,
    Disconnected,
    Misbehaved,
    Closed,
    Withdrawn,
}

impl End {
    fn describe(self) -> &'static str {
        match self {
            End::Stop => "server stopped",
            End::Disconnected => "peer disconnected (QEMU exited or was killed)",
            End::Misbehaved => "peer sent data (protocol violation), disconnected",
            End::Closed => "region closed by the guest module (unloaded)",
            End::Withdrawn => "region withdrawn for reformatting",
        }
    }
    fn guest_alive(self) -> bool {
        matches!(self, End::Stop | End::Closed)
    }
}

/// A packet handed to the trace, waiting for the flush that makes it
/// visible in the file (its delivery time).
#[derive(Debug, Clone, Copy)]
struct Delivery {
    chan: u32,
    seq: u64,
    ts_begin: u64,
    ts_end: u64,
    events: u32,
    at_ns: u64,
}

/// The CTF writer plus the packet delivery log.
struct Sink<'a> {
    writer: &'a mut CtfWriter,
    pending: &'a mut Vec<Delivery>,
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .map_or(0, |s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
}

impl PacketSink for Sink<'_> {
    type Error = ivtrace_ctf::CtfError;

    fn packet(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Result<(), Self::Error> {
        self.writer.packet(chan, stream, bytes, classes)?;
        use abi::pkt;
        self.pending.push(Delivery {
            chan,
            seq: le_u64(bytes, pkt::PACKET_SEQ_NUM),
            ts_begin: le_u64(bytes, pkt::TIMESTAMP_BEGIN),
            ts_end: le_u64(bytes, pkt::TIMESTAMP_END),
            events: le_u32(bytes, pkt::EVENT_COUNT),
            at_ns: 0,
        });
        Ok(())
    }
}

/// Event ids of the serve stream in the host trace.
pub mod ev {
    pub const DOORBELL_RECEIVED: u32 = 0;
    pub const PACKET_DELIVERED: u32 = 1;
    pub const SYNC_POINT: u32 = 2;
    pub const CONTROL: u32 = 3;
}

/// The serve stream's event classes.
pub fn serve_classes() -> Vec<EventClass> {
    let c = |id, name: &str, fields| EventClass::new(id, STREAM_IVTRACE, name.into(), fields);
    vec![
        c(
            ev::DOORBELL_RECEIVED,
            "ivtrace_doorbell_received",
            vec![
                Field::new("count", FieldType::U64, false),
                Field::new("total", FieldType::U64, false),
            ],
        ),
        c(
            ev::PACKET_DELIVERED,
            "ivtrace_packet_delivered",
            vec![
                Field::new("chan", FieldType::U32, false),
                Field::new("packet_seq", FieldType::U64, false),
                Field::new("ts_begin", FieldType::U64, false),
                Field::new("ts_end", FieldType::U64, false),
                Field::new("events", FieldType::U32, false),
            ],
        ),
        c(
            ev::SYNC_POINT,
            "ivtrace_sync_point",
            vec![
                Field::new("guest_ticks", FieldType::U64, false),
                Field::new("host_ns", FieldType::U64, false),
                Field::new("rtt_ns", FieldType::U64, false),
            ],
        ),
        c(
            ev::CONTROL,
            "ivtrace_control",
            vec![
                Field::new("cmd", FieldType::U32, false),
                Field::new("arg", FieldType::U64, true),
                Field::new("status", FieldType::S32, false),
                Field::new("latency_ns", FieldType::U64, false),
            ],
        ),
    ]
}

/// Claims `root/name`, or `name-2`, `name-3`... (atomic `mkdir`).
pub fn claim_dir(root: &Path, name: &str) -> Result<PathBuf> {
    for k in 1u32.. {
        let n = if k == 1 {
            name.to_string()
        } else {
            format!("{name}-{k}")
        };
        let p = root.join(&n);
        match fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", p.display())),
        }
    }
    unreachable!("u32 names exhausted")
}

fn percentile(sorted: &[i128], p: f64) -> Option<i128> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    Some(sorted[i])
}

impl Guest {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: String,
        peer: PeerInfo,
        conn: UnixStream,
        shm_path: PathBuf,
        shm_file: File,
        fds: Eventfds,
        wake: Arc<EventFd>,
        requests: Receiver<Request>,
        status: Arc<Mutex<GuestStatus>>,
        cfg: Arc<ServeConfig>,
        stop: Arc<AtomicBool>,
    ) -> Guest {
        Guest {
            name,
            peer,
            conn,
            shm_path,
            shm_file,
            fds,
            wake,
            requests,
            status,
            cfg,
            stop,
            conn_open: true,
        }
    }

    fn log(&self, msg: &str) {
        eprintln!("ivtrace serve: [{}] {msg}", self.name);
    }

    fn set_state(&self, state: &str) {
        if let Ok(mut s) = self.status.lock() {
            s.state = state.to_string();
        }
    }

    /// Kicks the guest's MSI-X vector 0 (control and sync).
    fn kick(&self) {
        if let Some(fd) = self.fds.guest_rx.first() {
            // EAGAIN only if the counter is about to overflow: a kick is
            // pending anyway.
            let _ = fd.write(1);
        }
    }

    /// The thread body.
    pub fn run(mut self) {
        let doorbells: Vec<EventFd> = std::mem::take(&mut self.fds.host_rx);
        let mut notifier = match Notifier::new(doorbells) {
            Ok(n) => n,
            Err(e) => {
                self.log(&format!("cannot set up notification: {e:#}"));
                return;
            }
        };
        let watched = notifier
            .watch(self.conn.as_fd(), TOK_CONN)
            .and_then(|()| notifier.watch(self.wake.as_fd(), TOK_WAKE));
        if let Err(e) = watched {
            self.log(&format!("cannot watch the connection: {e:#}"));
            return;
        }
        let _ = self.conn.set_nonblocking(true);
        let mut last_uuid: Option<[u8; 16]> = None;
        loop {
            self.set_state("waiting for the guest module to format the region");
            let Some(region) = self.wait_for_region(&mut notifier, last_uuid) else {
                break;
            };
            last_uuid = Some(region.header().uuid);
            match self.record(region, &mut notifier) {
                Ok(end) if end.guest_alive() && !self.stop.load(Ordering::Relaxed) => continue,
                Ok(End::Withdrawn) => continue,
                Ok(_) => break,
                Err(e) => {
                    self.log(&format!("recording failed: {e:#}"));
                    break;
                }
            }
        }
        self.set_state("done");
        if !self.cfg.keep_shm {
            let _ = fs::remove_file(&self.shm_path);
        }
        self.log("finished");
    }

    /// Reads what the peer sent: EOF means QEMU is gone; data is a
    /// protocol violation (QEMU never sends any).
    fn check_conn(&mut self, notifier: &Notifier) -> Option<End> {
        if !self.conn_open {
            return Some(End::Disconnected);
        }
        let mut buf = [0u8; 256];
        match self.conn.read(&mut buf) {
            Ok(0) => {
                self.conn_open = false;
                notifier.unwatch(self.conn.as_fd());
                Some(End::Disconnected)
            }
            Ok(n) => {
                self.log(&format!(
                    "the peer sent {n} bytes; QEMU never sends data: closing the connection"
                ));
                self.conn_open = false;
                notifier.unwatch(self.conn.as_fd());
                let _ = self.conn.shutdown(std::net::Shutdown::Both);
                Some(End::Misbehaved)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
            Err(_) => {
                self.conn_open = false;
                notifier.unwatch(self.conn.as_fd());
                Some(End::Disconnected)
            }
        }
    }

    fn drain_wake(&self) {
        let _ = self.wake.read();
    }

    /// Waits until the region holds a formatted region other than
    /// `last_uuid`. None: the peer left or the server stops.
    fn wait_for_region(
        &mut self,
        notifier: &mut Notifier,
        last_uuid: Option<[u8; 16]>,
    ) -> Option<Region> {
        let mut said = String::new();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            match Region::open(&self.shm_path, Access::ReadWrite) {
                Ok(r) if Some(r.header().uuid) != last_uuid => return Some(r),
                Ok(_) => {}
                Err(RegionError::NotFormatted | RegionError::Missing { .. }) => {}
                Err(e) => {
                    let msg = format!("the region is not usable yet: {e}");
                    if msg != said {
                        self.log(&msg);
                        said = msg;
                    }
                }
            }
            self.answer_requests_without_region();
            let wake = match notifier.block(FORMAT_POLL) {
                Ok(w) => w,
                Err(e) => {
                    self.log(&format!("wait failed: {e:#}"));
                    return None;
                }
            };
            if wake.tokens.contains(&TOK_WAKE) {
                self.drain_wake();
            }
            if (wake.tokens.contains(&TOK_CONN) || !self.conn_open)
                && self.check_conn(notifier).is_some()
            {
                self.log("disconnected before the guest module formatted the region: no trace");
                return None;
            }
        }
    }

    fn answer_requests_without_region(&self) {
        loop {
            match self.requests.try_recv() {
                Ok(Request::Control { reply, .. }) => {
                    let _ = reply.send(Err(
                        "the guest module has not formatted the region yet".into()
                    ));
                }
                Ok(Request::Status { reply }) => {
                    let _ = reply.send(self.status.lock().map(|s| s.clone()).unwrap_or_default());
                }
                Err(_) => return,
            }
        }
    }

    /// Records one formatted region until something ends it.
    fn record(&mut self, region: Region, notifier: &mut Notifier) -> Result<End> {
        let out = claim_dir(&self.cfg.outroot, &self.name)?;
        self.log(&format!(
            "region formatted (uuid {}, {} channels): recording into {}",
            region.header().uuid_string(),
            region.layout().nr_channels,
            out.display()
        ));
        if let Ok(mut s) = self.status.lock() {
            s.traces.push(out.display().to_string());
            s.state = "recording".into();
        }
        let features = region.header().features;
        let doorbell = features & abi::IVT_FEAT_DOORBELL != 0 && notifier.has_doorbell();
        region.protocol().set_doorbell_target(HOST_ID as u16, 0);

        // Clock: KVM's numbers when there are any, the ping-pong always
        // (it is the method under TCG and a cross-check under KVM).
        let kvm = match self.peer.pid {
            Some(pid) => KvmTsc::start(pid),
            None => Err("no peer pid (SO_PEERCRED)".into()),
        };
        let kvm_note = kvm.as_ref().err().cloned();
        let mut kvm = kvm.ok();
        let can_sync = features & abi::IVT_FEAT_SYNC != 0 && !self.fds.guest_rx.is_empty();
        let mut pingpong = can_sync.then(|| PingPong::new(&region, self.cfg.sync_interval));
        if let Some(pp) = pingpong.as_mut() {
            let gr = &self.fds.guest_rx;
            pp.burst(&region, &|| {
                let _ = gr[0].write(1);
            });
        }
        match (&kvm, &pingpong) {
            (Some(k), _) => self.log(&format!(
                "guest time from KVM's TSC offset/scaling ({})",
                k.vm_dir().display()
            )),
            (None, Some(_)) => self.log(&format!(
                "guest time by ping-pong through the region ({})",
                kvm_note.as_deref().unwrap_or("no KVM clock")
            )),
            (None, None) => {
                self.log("guest time from the region header (no KVM clock, no sync mailbox)")
            }
        }
        let header_clock = region.header().clock;
        // Neither KVM nor a sync-capable writer (e.g. a loopback writer on
        // a served region): the estimator `record` would use.
        let mut fallback = (kvm.is_none() && pingpong.is_none())
            .then(|| ivtrace_time::estimator::estimator_for(region.header()));
        let initial = match (&kvm, &pingpong, &fallback) {
            (Some(k), _, _) => k.initial(),
            (None, Some(pp), _) => pp.mapping(),
            (None, None, Some(f)) => f.initial(),
            (None, None, None) => unreachable!("fallback is set when both are missing"),
        };

        let host_desc = HostTraceDesc {
            hostname: &session::this_host(),
            trace_name: &format!("{}-host", self.name),
            error_ns: ivtrace_time::timebase::base().error_ns,
            env: vec![
                (
                    "ivtrace_guest_name".into(),
                    EnvValue::Str(self.name.clone()),
                ),
                (
                    "ivtrace_qemu_pid".into(),
                    EnvValue::Int(self.peer.pid.unwrap_or(0) as i64),
                ),
            ],
        };
        let mut classes = serve_classes();
        let hostev = if self.cfg.host_events {
            ivtrace_tracefs::host::HostEvents::prepare(self.peer.pid, &mut classes)
                .map_err(|e| self.log(&format!("host events not recorded: {e:#}")))
                .ok()
        } else {
            None
        };
        let host = Arc::new(Mutex::new(HostTrace::create(
            &out.join("host"),
            &host_desc,
            classes,
        )?));
        let serve_stream =
            host.lock()
                .expect("not poisoned")
                .add_stream(STREAM_IVTRACE, 0, "ivtrace_host")?;
        let hostev = match hostev.map(|h| h.start(Arc::clone(&host))) {
            Some(Ok(h)) => Some(h),
            Some(Err(e)) => {
                self.log(&format!("host events not recorded: {e:#}"));
                None
            }
            None => None,
        };

        let started = Instant::now();
        let mut writer = session::ctf_writer_named(&region, &out, &initial, &self.name);
        let mut reader = Reader::new(region);
        let mut pending: Vec<Delivery> = Vec::new();
        let mut delivered: Vec<Delivery> = Vec::new();
        let mut received_total = 0u64;
        let notify_before = notifier.stats;
        let mut heartbeat = 0u64;
        let mut last_slow = Instant::now();
        let mut ending: Option<End> = None;
        let mut idle = POLL_MIN;
        let host_err = |e: ivtrace_ctf::CtfError| anyhow::Error::from(e).context("host trace");

        let end = loop {
            let pass = {
                let mut sink = Sink {
                    writer: &mut writer,
                    pending: &mut pending,
                };
                reader.drain_available(&mut sink)?
            };
            heartbeat += 1;
            reader.region().protocol().heartbeat(heartbeat);
            if let Some(e) = ending {
                break e;
            }
            if self.stop.load(Ordering::Relaxed) {
                break End::Stop;
            }
            if reader.region().protocol().writer_closed() {
                ending = Some(End::Closed);
                continue;
            }
            if last_slow.elapsed() >= SLOW_CHECK {
                last_slow = Instant::now();
                if !reader.region().protocol().still_formatted() {
                    ending = Some(End::Withdrawn);
                    continue;
                }
            }
            self.serve_requests(&reader, &host, serve_stream, notifier, received_total);
            if let Some(pp) = pingpong.as_mut().filter(|pp| pp.due()) {
                let gr = &self.fds.guest_rx;
                if let Some(p) = pp.burst(reader.region(), &|| {
                    let _ = gr[0].write(1);
                }) {
                    let payload = Payload::default()
                        .u64(p.guest_ticks)
                        .u64(p.host_ns)
                        .u64(p.rtt_ns);
                    host.lock()
                        .expect("not poisoned")
                        .event(serve_stream, ev::SYNC_POINT, host_now_ns(), 0, &payload.0)
                        .map_err(host_err)?;
                }
            }
            if pass.packets > 0 {
                idle = POLL_MIN;
                continue;
            }
            // Idle: make everything handed over visible, then sleep.
            self.deliver(
                &mut writer,
                &mut pending,
                &mut delivered,
                &host,
                serve_stream,
            )?;
            let timeout = pingpong
                .as_ref()
                .map_or(self.cfg.safety_timeout, |pp| pp.until_due())
                .min(self.cfg.safety_timeout);
            let wake = if doorbell {
                notifier.announce_sleep(reader.region());
                let again = {
                    let mut sink = Sink {
                        writer: &mut writer,
                        pending: &mut pending,
                    };
                    reader.drain_available(&mut sink)?
                };
                if again.packets > 0 {
                    notifier.recheck_hit(reader.region());
                    continue;
                }
                let w = notifier.block(timeout);
                notifier.awake(reader.region());
                w?
            } else {
                let w = notifier.block(idle.min(timeout))?;
                idle = (idle * 2).min(POLL_MAX);
                w
            };
            if wake.doorbells > 0 {
                received_total += wake.doorbells;
                let payload = Payload::default().u64(wake.doorbells).u64(received_total);
                host.lock()
                    .expect("not poisoned")
                    .event(
                        serve_stream,
                        ev::DOORBELL_RECEIVED,
                        wake.at_ns,
                        0,
                        &payload.0,
                    )
                    .map_err(host_err)?;
            }
            if wake.tokens.contains(&TOK_WAKE) {
                self.drain_wake();
            }
            if wake.tokens.contains(&TOK_CONN) {
                if let Some(e) = self.check_conn(notifier) {
                    ending = Some(e);
                }
            }
        };

        // Finalize: last sync if the guest can still answer, the
        // committed prefixes of open packets, the clock, the metadata.
        if end.guest_alive() {
            if let Some(pp) = pingpong.as_mut() {
                let gr = &self.fds.guest_rx;
                pp.burst(reader.region(), &|| {
                    let _ = gr[0].write(1);
                });
            }
        }
        let late = notifier.read_doorbells();
        received_total += late;
        {
            let mut sink = Sink {
                writer: &mut writer,
                pending: &mut pending,
            };
            reader.flush_partial(&mut sink)?;
            reader.finish(&mut sink)?;
        }
        self.deliver(
            &mut writer,
            &mut pending,
            &mut delivered,
            &host,
            serve_stream,
        )?;
        let elapsed = started.elapsed();
        let points = pingpong
            .as_ref()
            .map(|pp| pp.points().to_vec())
            .unwrap_or_default();
        let pp_mapping = pingpong.as_ref().map(|pp| pp.mapping());
        let clock: ClockMapping = match (kvm.as_mut(), fallback.as_mut()) {
            (Some(k), _) => k.finish(),
            (None, Some(f)) => f.finish(),
            (None, None) => PingPongEstimate {
                header: header_clock,
                points: points.clone(),
            }
            .finish(),
        };
        writer.set_clock(clock.clone());
        let mut env = session::trace_env_named(reader.region(), &out, &clock, &self.name);
        env.extra.push((
            "ivtrace_guest_name".into(),
            EnvValue::Str(self.name.clone()),
        ));
        env.extra.push((
            "ivtrace_qemu_pid".into(),
            EnvValue::Int(self.peer.pid.unwrap_or(0) as i64),
        ));
        env.extra.push((
            "ivtrace_clock_sync_span_ns".into(),
            EnvValue::Int(pingpong::span_ns(&points).min(i64::MAX as u64) as i64),
        ));
        writer.set_env(env);
        writer.finish(reader.classes())?;
        let hostev_stats = match hostev.map(|h| h.stop()) {
            Some(Ok(st)) => Some(st),
            Some(Err(e)) => {
                self.log(&format!("host events: {e:#}"));
                None
            }
            None => None,
        };
        let host_counts = match Arc::try_unwrap(host) {
            Ok(m) => m.into_inner().expect("not poisoned").finish()?,
            Err(arc) => {
                arc.lock().expect("not poisoned").flush()?;
                Vec::new()
            }
        };

        let sidecar = session::build_sidecar(
            &reader,
            &writer,
            &self.shm_path,
            "serve",
            &clock,
            elapsed,
            end.describe(),
        );
        let totals = summary::totals(&sidecar.channels);
        let complete_packets = totals.packets.saturating_sub(totals.partial_packets);
        let nstats = NotifyStats {
            doorbells: received_total,
            sleep_attempts: notifier.stats.sleep_attempts - notify_before.sleep_attempts,
            recheck_hits: notifier.stats.recheck_hits - notify_before.recheck_hits,
            blocked: notifier.stats.blocked - notify_before.blocked,
            woken_by_doorbell: notifier.stats.woken_by_doorbell - notify_before.woken_by_doorbell,
            timeouts: notifier.stats.timeouts - notify_before.timeouts,
        };
        let rung = reader.region().protocol().doorbells_rung();
        let latency = delivery_stats(&delivered, &clock);
        let mut extra = serde_json::Map::new();
        extra.insert(
            "serve".into(),
            json!({
                "guest": self.name,
                "qemu_pid": self.peer.pid,
                "qemu_comm": self.peer.comm,
                "peer_ids": {"guest": crate::serve::proto::GUEST_ID, "host": HOST_ID},
                "vectors": self.cfg.vectors,
                "doorbell_device": doorbell,
                "host_trace": "host",
                "host_trace_events": host_counts,
                "host_events": self.cfg.host_events,
                "host_event_stats": hostev_stats,
            }),
        );
        extra.insert(
            "notification".into(),
            json!({
                "mode": if doorbell { "doorbell" } else { "polling" },
                "doorbells_received": received_total,
                "doorbells_rung_by_guest": rung,
                "completed_packets": complete_packets,
                "doorbells_per_completed_packet": if complete_packets > 0 {
                    received_total as f64 / complete_packets as f64 } else { 0.0 },
                "stats": nstats,
            }),
        );
        extra.insert(
            "clock_sync".into(),
            json!({
                "method": clock.method,
                "error_ns": clock.error_ns,
                "kvm": kvm.as_ref().map(|k| json!({
                    "debugfs": k.vm_dir().display().to_string(),
                    "changed": k.changed,
                })),
                "kvm_unavailable": kvm_note,
                "pingpong": pingpong.as_ref().map(|pp| json!({
                    "stats": pp.stats,
                    "points": pp.points().len(),
                    "span_ns": pingpong::span_ns(pp.points()),
                    "mapping": pp_mapping,
                })),
            }),
        );
        extra.insert("delivery".into(), latency);
        // serve's sections go next to the common ones in ivtrace.json
        // (readers of the sidecar ignore keys they do not know).
        let mut doc = serde_json::to_value(&sidecar)?;
        if let Some(obj) = doc.as_object_mut() {
            obj.extend(extra);
        }
        let mut text = serde_json::to_vec_pretty(&doc)?;
        text.push(b'\n');
        ivtrace_ctf::trace::write_atomically(&out, ivtrace_ctf::sidecar::SIDECAR_NAME, &text)?;
        if let Ok(mut s) = self.status.lock() {
            s.clock_method = Some(clock.method.clone());
            s.clock_error_ns = Some(clock.error_ns);
        }
        self.cfg.report(&sidecar, &doc, &out);
        self.log(&format!(
            "trace {} finalized ({}): {} events, {} lost, {} doorbells for {} completed packets, \
             clock {} (error <= {} ns)",
            out.display(),
            end.describe(),
            totals.events,
            totals.lost.total(),
            received_total,
            complete_packets,
            clock.method,
            clock.error_ns
        ));
        Ok(end)
    }

    /// Flushes the stream files; stamps the packets handed over since the
    /// last flush with now and logs them in the host trace.
    fn deliver(
        &self,
        writer: &mut CtfWriter,
        pending: &mut Vec<Delivery>,
        delivered: &mut Vec<Delivery>,
        host: &Arc<Mutex<HostTrace>>,
        stream: usize,
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        writer.flush_streams()?;
        let now = host_now_ns();
        let mut h = host.lock().expect("not poisoned");
        for mut d in pending.drain(..) {
            d.at_ns = now;
            let payload = Payload::default()
                .u32(d.chan)
                .u64(d.seq)
                .u64(d.ts_begin)
                .u64(d.ts_end)
                .u32(d.events);
            h.event(stream, ev::PACKET_DELIVERED, now, 0, &payload.0)?;
            if delivered.len() < 1 << 20 {
                delivered.push(d);
            }
        }
        h.flush()?;
        Ok(())
    }

    /// Answers control and status requests.
    fn serve_requests(
        &mut self,
        reader: &Reader,
        host: &Arc<Mutex<HostTrace>>,
        stream: usize,
        notifier: &Notifier,
        received: u64,
    ) {
        loop {
            let req = match self.requests.try_recv() {
                Ok(r) => r,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            };
            match req {
                Request::Control { cmd, reply } => {
                    let region = reader.region().protocol();
                    let timeout = region.ack_timeout(true);
                    let res = region.send_command(cmd, &|| self.kick(), timeout);
                    if let Ok(a) = &res {
                        let payload = Payload::default()
                            .u32(cmd.code())
                            .u64(cmd.arg())
                            .i32(a.status)
                            .u64(a.latency.as_nanos() as u64);
                        let _ = host.lock().expect("not poisoned").event(
                            stream,
                            ev::CONTROL,
                            host_now_ns(),
                            0,
                            &payload.0,
                        );
                    }
                    let _ = reply.send(res.map_err(|e| format!("{e:#}")));
                }
                Request::Status { reply } => {
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
                    s.doorbells = received;
                    let _ = notifier;
                    s.doorbells_rung = reader.region().protocol().doorbells_rung();
                    let _ = reply.send(s);
                }
            }
        }
    }
}

/// Delivery latency: host time the packet reached the file minus the
/// mapped guest time of its first and last events.
fn delivery_stats(delivered: &[Delivery], clock: &ClockMapping) -> serde_json::Value {
    let mut first: Vec<i128> = Vec::new();
    let mut last: Vec<i128> = Vec::new();
    for d in delivered.iter().filter(|d| d.events > 0) {
        first.push(d.at_ns as i128 - clock.realtime_ns(d.ts_begin));
        last.push(d.at_ns as i128 - clock.realtime_ns(d.ts_end));
    }
    first.sort_unstable();
    last.sort_unstable();
    let ms = |v: Option<i128>| v.map(|x| x as f64 / 1e6);
    json!({
        "packets": first.len(),
        "note": "host time the packet reached the trace file minus the mapped guest time of its oldest (first) / newest (last) event",
        "oldest_event_ms": {"p50": ms(percentile(&first, 0.5)), "p99": ms(percentile(&first, 0.99)),
                             "max": ms(first.last().copied()), "min": ms(first.first().copied())},
        "newest_event_ms": {"p50": ms(percentile(&last, 0.5)), "p99": ms(percentile(&last, 0.99)),
                            "max": ms(last.last().copied()), "min": ms(last.first().copied())},
    })
}
