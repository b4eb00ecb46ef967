//! One connected QEMU: its thread waits for the guest module to format the
//! region, records it ([`crate::recording`], on ivtrace-engine's
//! loop, sleeping on the doorbell when idle), and starts over when the
//! module re-formats the region (unload, load: a new trace directory),
//! until something ends it: Ctrl-C, QEMU exiting or killed, the peer
//! misbehaving.
//!
//! Nothing here may take the server down: errors end this guest's
//! recording (after finalizing what was recorded) and are logged.

use ivtrace_region::sanitize::ShownText;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;

use ivtrace_engine::notify::{Notifier, NotifyStats, Wake};
use ivtrace_engine::{Backoff, EngineError, RegionWait, Step, StopReason, Wait, Woken};
use ivtrace_region::{Ack, Command, FtraceAck, RegionError};

use crate::admission::Seat;
use crate::error::Report;
use crate::migration::{self, Resume};
use crate::proto::{PeerInfo, Shm};
use crate::{recording, Result, ServeConfig, ServeError};

/// Epoll tokens.
const TOK_CONN: u64 = 1;
const TOK_WAKE: u64 = 2;
/// While waiting for the module to format the region.
const FORMAT_POLL: Duration = Duration::from_millis(200);
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
    /// One ftrace request (docs/ftrace.md), its text as the guest gets it.
    Ftrace {
        text: String,
        reply: Sender<Result<FtraceAck, String>>,
    },
    /// The guest migrated away: end the recording with a handoff
    /// (`ivtrace ctl handoff`). The reply names the trace directory.
    Handoff {
        reply: Sender<Result<String, String>>,
    },
    /// The guest arrived by migration: record from the previous host's
    /// handoff (`ivtrace ctl resume FILE`; None: from the region alone).
    Resume {
        from: Option<PathBuf>,
        reply: Sender<Result<String, String>>,
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

/// How the server words why a guest's recording ended (the sidecar's
/// `stop_reason`).
pub fn describe(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Interrupted | StopReason::DurationReached => "server stopped",
        StopReason::Disconnected => "peer disconnected (QEMU exited or was killed)",
        StopReason::Misbehaved => "peer sent data (protocol violation), disconnected",
        StopReason::Handoff => "handed off: the guest migrated, the next host continues",
        StopReason::Closed => "region closed by the guest module (unloaded)",
        StopReason::OwnerGone => "region owner exited without closing",
        StopReason::Withdrawn => "region withdrawn for reformatting",
        StopReason::Shrunk => "region shrank under the reader (truncated by another process)",
        StopReason::OutputFailed => "output failed (the trace holds every whole packet before it)",
    }
}

/// Whether the guest (its module) is still there after a recording ended
/// this way: then the next format of the region starts a new trace.
fn guest_alive(reason: StopReason) -> bool {
    matches!(reason, StopReason::Interrupted | StopReason::Closed)
}

/// Everything one guest thread owns.
pub struct Guest {
    /// The registry's id of this guest (the connection number).
    pub id: u64,
    pub name: String,
    pub peer: PeerInfo,
    /// The region as serve created it (kept open with the guest).
    pub shm: Shm,
    /// Guest -> host doorbells, vector k (the waiter reads them).
    pub doorbells: Vec<EventFd>,
    /// Host -> guest interrupts, MSI-X vector k (0: control and sync).
    pub interrupts: Vec<Arc<EventFd>>,
    pub wake: Arc<EventFd>,
    pub requests: Receiver<Request>,
    pub status: Arc<Mutex<GuestStatus>>,
    /// Its place in the descriptor budget (waiting, recording or gone).
    pub seat: Arc<Seat>,
    pub cfg: Arc<ServeConfig>,
    pub stop: Arc<AtomicBool>,
}

/// How a guest thread waits: on the guest's doorbells, QEMU's connection
/// (hang-up, stray bytes) and its wake-up eventfd (control requests,
/// server stopping).
pub struct GuestWaiter {
    pub notifier: Notifier,
    conn: Arc<UnixStream>,
    conn_open: bool,
    wake: Arc<EventFd>,
    name: String,
    /// This recording's region has doorbells (else: poll with backoff).
    doorbell: bool,
    backoff: Backoff,
}

impl GuestWaiter {
    fn new(guest: &mut Guest, conn: Arc<UnixStream>) -> Result<GuestWaiter> {
        let doorbells = std::mem::take(&mut guest.doorbells);
        let notifier = Notifier::new(doorbells).map_err(|source| ServeError::Waiter {
            what: "set up notification",
            source,
        })?;
        notifier
            .watch(conn.as_fd(), TOK_CONN)
            .and_then(|()| notifier.watch(guest.wake.as_fd(), TOK_WAKE))
            .map_err(|source| ServeError::Waiter {
                what: "watch the connection",
                source,
            })?;
        let _ = conn.set_nonblocking(true);
        Ok(GuestWaiter {
            notifier,
            conn,
            conn_open: true,
            wake: Arc::clone(&guest.wake),
            name: guest.name.clone(),
            doorbell: false,
            backoff: Backoff::new(POLL_MIN, POLL_MAX),
        })
    }

    /// A new recording: sleep on the doorbell if its region rings one.
    pub fn start_recording(&mut self, region_rings: bool) -> bool {
        self.doorbell = region_rings && self.notifier.has_doorbell();
        self.backoff.reset();
        self.doorbell
    }

    pub fn stats(&self) -> NotifyStats {
        self.notifier.stats
    }

    /// How long a parked recording may sleep for a wait of at most `limit`
    /// (without doorbells: the next backoff step).
    pub fn park_timeout(&mut self, limit: Duration) -> Duration {
        match self.doorbell {
            true => limit,
            false => self.backoff.step(limit),
        }
    }

    /// What woke a parked recording (or nothing: its timeout), without
    /// blocking.
    pub fn collect(&mut self) -> Result<Woken, EngineError> {
        let wake = self.notifier.block(Duration::ZERO)?;
        let ending = self.tokens(&wake);
        Ok(Woken {
            doorbells: wake.doorbells,
            at_ns: wake.at_ns,
            ending,
        })
    }

    /// The descriptor a pool watches while the recording is parked: the
    /// notifier's epoll (readable when a doorbell, the connection or the
    /// wake-up fd is).
    pub fn watch_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.notifier.as_fd()
    }

    /// Doorbells that arrived after the last wait.
    pub fn late_doorbells(&mut self) -> u64 {
        self.notifier.read_doorbells()
    }

    /// Reads what the peer sent: EOF means QEMU is gone; data is a
    /// protocol violation (QEMU never sends any).
    fn check_conn(&mut self) -> Option<StopReason> {
        if !self.conn_open {
            return Some(StopReason::Disconnected);
        }
        let mut buf = [0u8; 256];
        let gone = match (&*self.conn).read(&mut buf) {
            Ok(0) => StopReason::Disconnected,
            Ok(n) => {
                eprintln!("ivtrace serve: [{}] the peer sent {n} bytes; QEMU never sends data: closing the connection", self.name);
                let _ = self.conn.shutdown(std::net::Shutdown::Both);
                StopReason::Misbehaved
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return None,
            Err(_) => StopReason::Disconnected,
        };
        self.conn_open = false;
        self.notifier.unwatch(self.conn.as_fd());
        Some(gone)
    }

    /// What the descriptors that woke `wake` say: the wake-up eventfd is
    /// drained; a readable connection may mean the peer is gone.
    fn tokens(&mut self, wake: &Wake) -> Option<StopReason> {
        if wake.tokens.contains(&TOK_WAKE) {
            let _ = self.wake.read();
        }
        if wake.tokens.contains(&TOK_CONN) || !self.conn_open {
            return self.check_conn();
        }
        None
    }
}

impl Wait for GuestWaiter {
    fn doorbell(&self) -> bool {
        self.doorbell
    }

    fn block(&mut self, limit: Duration) -> Result<Woken, EngineError> {
        let timeout = match self.doorbell {
            true => limit,
            false => self.backoff.step(limit),
        };
        let wake = self.notifier.block(timeout)?;
        let ending = self.tokens(&wake);
        Ok(Woken {
            doorbells: wake.doorbells,
            at_ns: wake.at_ns,
            ending,
        })
    }

    fn busy(&mut self) {
        self.backoff.reset();
    }
}

/// Waiting for the guest module to format the region: one look at a
/// time (the pool parks the guest between looks).
struct OneLook<'a> {
    guest: &'a Guest,
    said: &'a mut String,
}

impl RegionWait for OneLook<'_> {
    fn not_yet(&mut self, err: RegionError, _transient: bool) -> Result<(), RegionError> {
        if matches!(err, RegionError::NotFormatted | RegionError::Missing { .. }) {
            return Ok(());
        }
        let msg = format!("the region is not usable yet: {err}");
        if msg != *self.said {
            self.guest.log(&msg);
            *self.said = msg;
        }
        Ok(())
    }

    fn pause(&mut self) -> bool {
        false
    }
}

/// Where a guest is.
enum Phase {
    /// QEMU runs with `-incoming`: the region fills with the source's pages
    /// until `ivtrace ctl resume` says the migration is over.
    AwaitingResume,
    /// The module has not formatted the region (again) yet.
    Awaiting,
    /// A recording runs; `parked`: it waits for its waiter ([`Step::Block`]).
    Recording {
        live: Box<recording::Live>,
        parked: bool,
    },
    /// A recording's traces are finished; its relay session is closing.
    Closing(Box<recording::Ending>),
    Done,
}

/// What a guest asks of the pool after a turn.
pub enum Turn {
    /// Give it another turn (after the others).
    Again,
    /// Park it until its waiter's descriptor is readable or the deadline.
    Park(Instant),
    /// Park it until the deadline only: its doorbell rang for nothing
    /// (`storm_pause`).
    Sleep(Instant),
    /// Finished: its trace(s) are finalized.
    Done,
}

/// Steps of a recording per turn before the next guest's turn.
const STEPS_PER_TURN: u32 = 16;

/// The pause of a guest whose doorbell woke it `idle_rings` times in a
/// row with no completed packet: 1 ms, doubling, at most
/// [`STORM_PAUSE_MAX`]. A guest rings at most once per completed packet
/// (docs/abi.md), so an honest one is rarely woken for nothing (a ring for
/// a packet the previous turn already took): its next ring that brings a
/// packet ends the pause. A guest that rings in a loop is drained once
/// per pause (a turn is ~80 us: ~0.2 % of a core at 50 ms), and its
/// completed packets, control requests and hang-up wait at most a pause.
fn storm_pause(idle_rings: u32) -> Duration {
    Duration::from_millis(1u64 << idle_rings.saturating_sub(1).min(6)).min(STORM_PAUSE_MAX)
}

/// How often a guest whose relay session is closing looks whether it is
/// done (the close itself gives up after a few seconds).
const RELAY_CLOSE_POLL: Duration = Duration::from_millis(50);

/// The longest pause of a guest that rings for nothing.
const STORM_PAUSE_MAX: Duration = Duration::from_millis(50);

/// One connected QEMU as the drain pool runs it: the region's formats,
/// each recorded, until the guest goes or the server stops.
pub struct GuestTask {
    guest: Guest,
    waiter: GuestWaiter,
    phase: Phase,
    last_uuid: Option<[u8; 16]>,
    /// Doorbell wake-ups in a row that found no completed packet.
    idle_rings: u32,
    /// Where the first recording of a migrated guest starts.
    resume: Option<Resume>,
    said: String,
    /// Gives the registry entry back, once.
    retire: Option<Box<dyn FnOnce() + Send>>,
}

impl GuestTask {
    /// `conn` is QEMU's connection.
    pub fn new(
        mut guest: Guest,
        conn: Arc<UnixStream>,
        retire: Box<dyn FnOnce() + Send>,
    ) -> Result<GuestTask> {
        let waiter = GuestWaiter::new(&mut guest, conn)?;
        let phase = match guest.peer.incoming {
            true => {
                migration::announce_wait(&guest);
                Phase::AwaitingResume
            }
            false => {
                guest.set_state("waiting for the guest module to format the region");
                Phase::Awaiting
            }
        };
        Ok(GuestTask {
            guest,
            waiter,
            phase,
            last_uuid: None,
            idle_rings: 0,
            resume: None,
            said: String::new(),
            retire: Some(retire),
        })
    }

    pub fn name(&self) -> &str {
        &self.guest.name
    }

    pub fn watch_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.waiter.watch_fd()
    }

    /// One turn: a look for the region, or up to `STEPS_PER_TURN` steps of
    /// the recording, or its end.
    pub fn turn(&mut self) -> Turn {
        let t = match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::AwaitingResume => self.await_resume(),
            Phase::Awaiting => self.look(),
            Phase::Recording { live, parked } => self.record(live, parked),
            Phase::Closing(ending) => self.conclude(ending),
            Phase::Done => Turn::Done,
        };
        if matches!(t, Turn::Done) {
            self.finished();
        }
        t
    }

    /// Whether the peer is still there and the server runs (what woke a
    /// guest that waits for its region is read here).
    fn still_wanted(&mut self) -> bool {
        match self.waiter.collect() {
            Ok(w) if w.ending.is_none() => {}
            Ok(_) => {
                self.guest
                    .log("disconnected before the guest module formatted the region: no trace");
                return false;
            }
            Err(e) => {
                self.guest.log(&format!("wait failed: {}", Report(&e)));
                return false;
            }
        }
        !self.guest.stop.load(Ordering::Relaxed)
    }

    /// An incoming guest: has `ivtrace ctl resume` come?
    fn await_resume(&mut self) -> Turn {
        if !self.still_wanted() {
            return Turn::Done;
        }
        match migration::take_resume(&self.guest) {
            Some(resume) => {
                self.resume = resume;
                self.guest
                    .set_state("waiting for the guest module to format the region");
                self.phase = Phase::Awaiting;
                Turn::Again
            }
            None => {
                self.phase = Phase::AwaitingResume;
                Turn::Park(Instant::now() + FORMAT_POLL)
            }
        }
    }

    /// A look for the region. A control request wakes the guest too: the
    /// look comes first, so that a request sent just after the module
    /// formatted the region (before this guest's next poll) is served by the
    /// recording it starts instead of being refused.
    fn look(&mut self) -> Turn {
        if !self.still_wanted() {
            self.guest.answer_requests_without_region();
            return Turn::Done;
        }
        let mut once = OneLook {
            guest: &self.guest,
            said: &mut self.said,
        };
        let path = self.guest.shm.path.clone();
        let Ok(Some(region)) = ivtrace_engine::wait_for_region(&path, self.last_uuid, &mut once)
        else {
            self.guest.answer_requests_without_region();
            self.phase = Phase::Awaiting;
            return Turn::Park(Instant::now() + FORMAT_POLL);
        };
        if !self.guest.seat.start_recording() {
            // The accept loop saw the hang-up first and no longer counts
            // this guest's descriptors: it must not open a trace now.
            self.guest
                .log("QEMU hung up before the recording of its formatted region started: no trace");
            return Turn::Done;
        }
        self.last_uuid = Some(region.header().uuid);
        let resume = self.resume.take();
        match recording::start(&self.guest, &mut self.waiter, region, resume.as_ref()) {
            Ok(live) => {
                self.phase = Phase::Recording {
                    live: Box::new(live),
                    parked: false,
                };
                Turn::Again
            }
            Err(e) => {
                self.guest.log(&format!("recording failed: {}", Report(&e)));
                Turn::Done
            }
        }
    }

    fn record(&mut self, mut live: Box<recording::Live>, parked: bool) -> Turn {
        let (g, w) = (&self.guest, &mut self.waiter);
        let mut rang = false;
        if parked {
            let woken = w.collect();
            rang = matches!(&woken, Ok(x) if x.doorbells > 0 && x.ending.is_none());
            if let Err(e) = recording::woke(g, w, &mut live, woken) {
                g.log(&format!("recording failed: {}", Report(&e)));
                return Turn::Done;
            }
        }
        for i in 0..STEPS_PER_TURN {
            match recording::step(g, w, &mut live) {
                Ok(Step::Again) => {
                    self.idle_rings = 0;
                    continue;
                }
                Ok(Step::Block(limit)) => {
                    let now = Instant::now();
                    let deadline = now + w.park_timeout(limit);
                    self.phase = Phase::Recording { live, parked: true };
                    // Woken by the doorbell, and the first step found nothing.
                    if rang && i == 0 {
                        self.idle_rings = self.idle_rings.saturating_add(1);
                        return Turn::Sleep(deadline.min(now + storm_pause(self.idle_rings)));
                    }
                    return Turn::Park(deadline);
                }
                Ok(Step::Ended(reason)) => return self.ended(*live, reason),
                Err(e) => {
                    g.log(&format!("recording failed: {}", Report(&e)));
                    return Turn::Done;
                }
            }
        }
        self.phase = Phase::Recording {
            live,
            parked: false,
        };
        Turn::Again
    }

    /// A recording ended: finalize it; a guest still there may format the
    /// region again (a new trace).
    fn ended(&mut self, live: recording::Live, reason: StopReason) -> Turn {
        match recording::end(&self.guest, &mut self.waiter, live, reason) {
            Ok(ending) => self.conclude(Box::new(ending)),
            Err(e) => {
                self.guest.log(&format!("recording failed: {}", Report(&e)));
                Turn::Done
            }
        }
    }

    /// A finished recording whose relay session may still be closing: the
    /// drain worker does not wait for a slow relay; the guest sleeps
    /// [`RELAY_CLOSE_POLL`] turns until the relay took the session's last
    /// packets or the close gave up (its losses counted), then concludes.
    fn conclude(&mut self, ending: Box<recording::Ending>) -> Turn {
        if ending.relay_pending() {
            self.phase = Phase::Closing(ending);
            return Turn::Sleep(Instant::now() + RELAY_CLOSE_POLL);
        }
        match recording::conclude(&self.guest, *ending) {
            Ok(end)
                if (guest_alive(end) && !self.guest.stop.load(Ordering::Relaxed))
                    || end == StopReason::Withdrawn =>
            {
                self.guest.seat.stop_recording();
                self.guest
                    .set_state("waiting for the guest module to format the region");
                self.phase = Phase::Awaiting;
                Turn::Again
            }
            Ok(_) => Turn::Done,
            Err(e) => {
                self.guest.log(&format!("recording failed: {}", Report(&e)));
                Turn::Done
            }
        }
    }

    /// The guest is done: its region file goes (unless kept), its entry
    /// is given back. Runs once.
    pub fn finished(&mut self) {
        self.finish_as("done");
    }

    /// The recording panicked (a bug: the pool caught it): the guest is
    /// given back like a finished one, but `ctl list` says it failed and
    /// how to finish its trace, never "done".
    pub fn panicked(&mut self) {
        self.finish_as(
            "failed: the recording panicked; `ivtrace recover` on its trace directory \
             finishes what was written",
        );
    }

    fn finish_as(&mut self, state: &str) {
        let Some(retire) = self.retire.take() else {
            return;
        };
        self.guest.set_state(state);
        if !self.guest.cfg.keep_shm {
            self.guest.shm.remove();
        }
        self.guest.log("finished");
        retire();
    }
}

impl Guest {
    pub fn log(&self, msg: &str) {
        // Messages may quote the guest (its region's warnings, errors).
        eprintln!("ivtrace serve: [{}] {}", self.name, ShownText(msg));
    }

    pub fn set_state(&self, state: &str) {
        if let Ok(mut s) = self.status.lock() {
            s.state = state.to_string();
        }
    }

    fn answer_requests_without_region(&self) {
        while let Ok(req) = self.requests.try_recv() {
            self.refuse_without_region(req, "the guest module has not formatted the region yet");
        }
    }

    /// Answers a request that needs a recording: status as it is, the
    /// others refused with `why`.
    pub(crate) fn refuse_without_region(&self, req: Request, why: &str) {
        match req {
            Request::Control { reply, .. } => {
                let _ = reply.send(Err(why.into()));
            }
            Request::Handoff { reply } | Request::Resume { reply, .. } => {
                let _ = reply.send(Err(why.into()));
            }
            Request::Ftrace { reply, .. } => {
                let _ = reply.send(Err(why.into()));
            }
            Request::Status { reply } => {
                let _ = reply.send(self.status.lock().map(|s| s.clone()).unwrap_or_default());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_ringing_for_nothing_pauses_longer_up_to_the_bound() {
        let pauses: Vec<u128> = (1..=9).map(|n| storm_pause(n).as_millis()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 50, 50, 50]);
        assert_eq!(storm_pause(u32::MAX), STORM_PAUSE_MAX);
    }
}
