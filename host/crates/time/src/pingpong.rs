//! Guest clock -> host time by the clock exchange through the region's
//! sync mailbox (`struct ivt_sync`), for guests whose TSC relation to the
//! host is unknown (TCG, or KVM without debugfs).
//!
//! One round trip (NTP's on-wire method; the words and their ordering are
//! ivtrace-region's `protocol`): the host posts a request at host time t1,
//! the guest answers with its TSC when it saw the request (t2) and when it
//! answered (t3), the host sees the answer at t4. The pair (guest
//! (t2+t3)/2, host (t1+t4)/2) is off the true relation by at most half the
//! round trip `delta = (t4-t1) - (t3-t2)` (Cristian 1989).
//!
//! A burst first gets the writer into the exchange ([`Entry`]): a kick on
//! MSI-X vector 0 (serve), or, on ivshmem-plain, a request posted just
//! before the writer's next control poll while the host spins. A writer
//! with `IVT_FEAT_SYNC_SPIN` then stays, spinning for the next request
//! (bounded by `IVT_SYNC_*`), and the host posts request after request,
//! spinning for each answer: a round trip is two cache-line transfers,
//! not an interrupt. The burst keeps its minimum-delta round trip; bursts
//! repeat to follow drift; [`crate::fit`] draws the line and its bound.

use std::time::{Duration, Instant};

use ivtrace_region::abi;
use ivtrace_region::protocol::Protocol;
use ivtrace_region::region::ClockRef;
use ivtrace_region::Region;

use crate::estimator::{plausible_freq, plausible_ref_realtime};
use crate::fit::{Fit, FitLine, PointReport, FAST_RTT_NS};
use crate::mapping::ClockMapping;
use crate::realtime::Boost;
use crate::timebase::host_now_ns;

/// Round trips per burst; the minimum-delta one is kept.
pub const BURST: usize = 32;
/// A writer in the exchange answers within a round trip (about a
/// microsecond); no answer for this long means it left (its patience or
/// budget ran out) or its vCPU lost its host CPU.
const ROUND_TIMEOUT: Duration = Duration::from_micros(50);
/// After a kick, spin this long for the first answer (interrupt delivery
/// under TCG takes 7-30 us, a millisecond or two on a loaded host), then
/// poll with short sleeps ...
const ENTER_SPIN: Duration = Duration::from_micros(3000);
/// ... until this long (a lost kick, a vCPU that is not running).
const ENTER_TIMEOUT: Duration = Duration::from_millis(30);
/// Kicks per burst at most (each costs the guest at most
/// `IVT_SYNC_BUDGET_NS` of spinning).
const MAX_ENTRIES: u32 = 4;
/// A burst gives up after this many kicks in a row went unanswered.
const MAX_FAILED_ENTRIES: u32 = 3;
/// The first bursts come quickly, to have a slope early: the second and
/// third this long after the one before; so does the next after a burst in
/// which the writer never spun (the host or its vCPU was not running).
const SOON: Duration = Duration::from_millis(500);
/// Bursts that come [`SOON`] at the start.
const EARLY_BURSTS: u64 = 3;
/// A burst whose best round trip was slow (above [`FAST_RTT_NS`]: the
/// writer's vCPU or the host lost its CPU inside every round trip, or the
/// writer never spun) is tried again this long after it, then after each
/// next delay while they stay slow (a loaded host's CPU comes back within
/// tens to hundreds of milliseconds), and then waits for the schedule. The
/// host's spin budget still applies ([`SPIN_BUDGET`]). Only while the
/// bound so far is above [`RETRY_ABOVE_NS`]: between fast points a slow
/// burst costs the line nothing (the truth is a line pinned at both ends),
/// so once they hold the bound, retries would only spend CPU.
const RETRY_AFTER: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
];
/// Windows a polled writer may miss in a row before the host looks for
/// its poll time again.
const WINDOW_TRIES: u32 = 3;
/// A polled writer: the window opens this long before its expected entry
/// and closes this long after it when a measured mapping places it (the
/// writer's timer fires within a fraction of a millisecond of its time
/// when its vCPU runs; an entry that is later waited for a host CPU, and
/// would rarely stay on it through the round trips) ...
const WINDOW: (Duration, Duration) = (Duration::from_micros(300), Duration::from_micros(1000));
/// ... and when only a host that noticed an entry placed it.
const WINDOW_ROUGH: (Duration, Duration) = (Duration::from_millis(2), Duration::from_millis(3));
/// The share of a host CPU the host may spend spinning for a writer,
/// beyond a first allowance: past it, the next burst or window waits (a
/// writer whose vCPU rarely runs on time must not cost the host more).
const SPIN_BUDGET: f64 = 0.008;
/// Spinning allowed before the budget counts (the first bursts).
const SPIN_ALLOWANCE: Duration = Duration::from_millis(20);
/// A polled writer whose poll time is unknown: how often the host looks
/// whether it answered a posted request ...
const HUNT_EVERY: Duration = Duration::from_millis(1);
/// ... for at most this many poll periods.
const HUNT_PERIODS: u32 = 4;

/// Slow bursts in a row, and the retry the next one gets.
#[derive(Debug, Default)]
struct Retries {
    in_row: usize,
}

impl Retries {
    /// After a burst: the delay of its retry if it was slow and retries
    /// are left in this row of slow bursts; None otherwise (a fast burst,
    /// or the row used all of [`RETRY_AFTER`]: back to the schedule, and
    /// the next slow burst starts a new row).
    fn after(&mut self, slow: bool) -> Option<Duration> {
        let d = RETRY_AFTER.get(self.in_row).copied().filter(|_| slow);
        self.in_row = if d.is_some() { self.in_row + 1 } else { 0 };
        d
    }
}

/// The bound of the mapping so far (over the recording until now) above
/// which a slow burst is retried: comfortably under the 0.5 us goal.
pub const RETRY_ABOVE_NS: u64 = 300;

/// Wakes the writer so that it answers a sync request (MSI-X vector 0).
pub type Kick = Box<dyn Fn() + Send>;

/// How the host gets the writer into the exchange.
pub enum Entry {
    /// A kick (MSI-X vector 0 of ivshmem-doorbell) wakes the writer.
    Kick(Kick),
    /// The writer looks at the mailbox at its control poll, every `period`
    /// (ivshmem-plain: the header's flush interval).
    Poll { period: Duration },
}

impl Entry {
    /// The clock exchange with a writer the host cannot kick: if it spins in
    /// the exchange, met at its entries every `IVT_SYNC_POLL_MS`; with
    /// `any_writer` also one that answers only at its control poll, every flush
    /// interval (the module's default of 100 ms when the header says 0).
    pub fn poll_for(region: &Region, any_writer: bool) -> Option<Entry> {
        let features = region.header().features;
        if features & abi::IVT_FEAT_SYNC == 0 {
            return None;
        }
        let ms = if features & abi::IVT_FEAT_SYNC_SPIN != 0 {
            abi::IVT_SYNC_POLL_MS
        } else if any_writer {
            match region.protocol().flush_interval_ms() {
                0 => 100,
                ms => ms.min(60_000),
            }
        } else {
            return None;
        };
        Some(Entry::Poll {
            period: Duration::from_millis(ms.into()),
        })
    }
}

/// One kept sample: a guest tick and the host time it corresponds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SyncPoint {
    pub guest_ticks: u64,
    pub host_ns: u64,
    /// Round trip minus the guest's own time between t2 and t3.
    pub rtt_ns: u64,
}

/// Statistics of the exchanges so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SyncStats {
    pub bursts: u64,
    /// Bursts that kept no point (the writer never answered).
    pub bursts_failed: u64,
    /// Requests posted (round trips tried).
    pub exchanges: u64,
    pub answered: u64,
    /// Requests not answered in time.
    pub timeouts: u64,
    /// Answers discarded as impossible (t3 before t2, or a guest-side gap
    /// longer than the round trip): a hostile or broken writer.
    pub rejected: u64,
    /// Times the writer entered the exchange (a first answer).
    pub entries: u64,
    /// Polled writer: windows it did not enter in.
    pub windows_missed: u64,
    pub min_rtt_ns: Option<u64>,
    /// Bursts whose best round trip was above [`FAST_RTT_NS`] (or that
    /// kept no point), and the bursts run again soon for those that found
    /// the bound above [`RETRY_ABOVE_NS`].
    pub slow_bursts: u64,
    pub retries: u64,
    /// Host time spent spinning for answers (the exchange's host cost).
    pub host_spin_ns: u64,
    /// The host spun at real-time priority (crate::realtime).
    pub realtime: bool,
}

/// What one round trip measured.
#[derive(Debug, Clone, Copy)]
struct Raw {
    t1: u64,
    t2: u64,
    t3: u64,
    t4: u64,
}

/// Where a burst with a polled writer stands.
#[derive(Debug, Clone, Copy)]
enum Poll {
    /// The writer's poll time is not known: the next burst starts by
    /// posting a request and looking for its answer.
    Unknown,
    /// Its next poll is expected at `expect`: post just before, spin
    /// through the window (`missed` windows so far in this burst).
    Window { expect: Instant, missed: u32 },
    /// Looking for the writer's poll since `since`: request `seq` was
    /// posted at host time `posted_ns` (posted anew at every look, so that
    /// the writer's answer is bracketed by one look's interval); the writer
    /// answers at its next poll, which tells when it polls.
    Hunting {
        seq: u64,
        since: Instant,
        posted_ns: u64,
    },
}

/// A polled writer's entry this far from where the grid of its past
/// entries puts it is off the grid (its timer keeps its phase, so a late
/// entry is a vCPU that was not running, not a new phase) ...
const ON_GRID: Duration = Duration::from_millis(2);
/// ... unless this many in a row agree with each other (a new grid: the
/// module was loaded anew).
const REANCHOR_AFTER: u32 = 2;
/// A mapping good enough to place a window by (its bound, ns).
const PHASE_MAPPING_NS: u64 = 1_000_000;

/// An entry of the writer into the exchange: its clock then (its answer's
/// `t2`), and the instant of this host it was, as well as the host knows.
#[derive(Debug, Clone, Copy)]
struct Sighting {
    t2: u64,
    at: Instant,
    /// `at` is exact (a host that spun saw it, or a measured mapping gave
    /// it), not when a late host happened to notice.
    exact: bool,
}

/// The writer's entries as the host learns them: the guest module enters
/// every `period` (the header's flush interval) from a timer that keeps
/// its phase on the guest's clock, so the grid is kept in guest ticks, and
/// a mapping (once one is measured) puts it on this host's time.
struct PollPhase {
    period: Duration,
    freq_hz: u64,
    anchor: Option<Sighting>,
    /// Entries seen off the grid in a row, and the last one's `t2`.
    off_grid: (u32, Option<u64>),
    state: Poll,
}

impl PollPhase {
    fn new(period: Duration, freq_hz: u64) -> PollPhase {
        PollPhase {
            period: period.max(Duration::from_millis(1)),
            freq_hz: freq_hz.max(1),
            anchor: None,
            off_grid: (0, None),
            state: Poll::Unknown,
        }
    }

    /// The first grid point at or after `after`; `mapping`, when good,
    /// places the anchor exactly.
    fn next_poll(&self, after: Instant, mapping: Option<&ClockMapping>) -> Option<Instant> {
        let a = self.anchor?;
        let anchor = mapping
            .and_then(|m| instant_of(m.realtime_ns(a.t2)))
            .unwrap_or(a.at);
        let period = self.period;
        let mut at = anchor + period;
        if after > at {
            let behind = (after - at).as_nanos() / period.as_nanos();
            at += period * u32::try_from(behind).unwrap_or(u32::MAX / 2);
            if at < after {
                at += period;
            }
        }
        Some(at)
    }

    /// How far writer tick `t2` is from the grid through `from` (ticks).
    fn off_by(&self, from: u64, t2: u64) -> Duration {
        let p = self.period.as_nanos() as i128;
        let d = (t2 as i128 - from as i128) * 1_000_000_000 / self.freq_hz as i128;
        let r = d.rem_euclid(p);
        Duration::from_nanos(r.min(p - r) as u64)
    }

    /// An entry seen: on the grid it refreshes the anchor (keeping an exact
    /// one over a rough one); off it, it is a late entry, ignored, unless
    /// [`REANCHOR_AFTER`] in a row agree on a new grid.
    fn seen(&mut self, s: Sighting) {
        let Some(a) = self.anchor else {
            self.anchor = Some(s);
            return;
        };
        if self.off_by(a.t2, s.t2) <= ON_GRID {
            if s.exact || !a.exact {
                self.anchor = Some(s);
            }
            self.off_grid = (0, None);
            return;
        }
        let agrees = self
            .off_grid
            .1
            .is_some_and(|prev| self.off_by(prev, s.t2) <= ON_GRID);
        let n = if agrees { self.off_grid.0 + 1 } else { 1 };
        self.off_grid = (n, Some(s.t2));
        if n >= REANCHOR_AFTER {
            self.anchor = Some(s);
            self.off_grid = (0, None);
        }
    }
}

/// How long before and after an expected entry its window is open: a
/// mapping places it within its bound, which widens the window when the
/// mapping is a loose one (points from hunts only).
fn window_of(mapping: &Option<ClockMapping>) -> (Duration, Duration) {
    match mapping {
        Some(m) => {
            let bound = Duration::from_nanos(m.error_ns);
            (WINDOW.0.max(bound), WINDOW.1.max(bound))
        }
        None => WINDOW_ROUGH,
    }
}

/// How long before an expected entry its window opens.
fn lead(mapping: &Option<ClockMapping>) -> Duration {
    window_of(mapping).0
}

/// The instant of this host at host time `ns` (None if far from now).
fn instant_of(ns: i128) -> Option<Instant> {
    let (now, now_ns) = (Instant::now(), host_now_ns() as i128);
    let d = ns - now_ns;
    let dur = Duration::from_nanos(
        u64::try_from(d.unsigned_abs())
            .ok()
            .filter(|&n| n < 3_600_000_000_000)?,
    );
    if d >= 0 {
        now.checked_add(dur)
    } else {
        now.checked_sub(dur)
    }
}

/// The clock exchange of one region.
pub struct PingPong {
    header: ClockRef,
    seq: u64,
    points: Vec<SyncPoint>,
    pub stats: SyncStats,
    started_ns: u64,
    started: Instant,
    /// When [`PingPong::step`] must run next.
    next_due: Instant,
    /// When the next burst is due (the schedule).
    next_burst: Instant,
    interval: Duration,
    /// The writer spins in the exchange (`IVT_FEAT_SYNC_SPIN`).
    spins: bool,
    kick: Option<Kick>,
    poll: Option<PollPhase>,
    /// The writer's `resp_spun` when recording started, and lately.
    writer_spun: (u64, u64),
    retries: Retries,
}

impl PingPong {
    /// `interval`: time between bursts after the first three.
    pub fn new(region: &Region, entry: Entry, interval: Duration) -> PingPong {
        let now = Instant::now();
        let header = region.header();
        let spun = region.protocol().sync_writer_spun();
        let (kick, poll) = match entry {
            Entry::Kick(k) => (Some(k), None),
            Entry::Poll { period } => (
                None,
                Some(PollPhase::new(period, plausible_freq(header.clock.freq_hz))),
            ),
        };
        PingPong {
            header: header.clock,
            seq: region.protocol().last_sync_request(),
            points: Vec::new(),
            stats: SyncStats::default(),
            started: now,
            started_ns: host_now_ns(),
            next_due: now,
            next_burst: now,
            interval: interval.max(Duration::from_millis(100)),
            spins: header.features & abi::IVT_FEAT_SYNC_SPIN != 0,
            kick,
            poll,
            writer_spun: (spun, spun),
            retries: Retries::default(),
        }
    }

    pub fn points(&self) -> &[SyncPoint] {
        &self.points
    }

    /// True when the writer stays in the exchange, spinning.
    pub fn spins(&self) -> bool {
        self.spins
    }

    /// True when the writer is met at its control poll (no kick).
    pub fn polled(&self) -> bool {
        self.poll.is_some()
    }

    /// Time left until [`PingPong::step`] is due.
    pub fn until_due(&self) -> Duration {
        self.next_due.saturating_duration_since(Instant::now())
    }

    /// Schedules the next burst after one ended (`spun`: the writer
    /// answered round trips while spinning; `retry`: it was slow and the
    /// bound is at risk).
    fn schedule(&mut self, spun: bool, retry: bool) {
        self.stats.bursts += 1;
        let wanted = Instant::now() + self.delay_after(spun, retry);
        self.next_burst = wanted.max(self.budget_allows());
        self.next_due = self.next_burst;
        let mapping = self.phase_mapping();
        let after = self.next_burst + lead(&mapping);
        let next = self
            .poll
            .as_ref()
            .and_then(|p| p.next_poll(after, mapping.as_ref()));
        if let Some(expect) = next {
            let expect = self.within_budget(expect, &mapping);
            self.set_poll(Poll::Window { expect, missed: 0 });
            self.next_due = expect - lead(&mapping);
        }
    }

    /// How long after a burst the next one is wanted: a retry soon after
    /// a slow one that put the bound at risk ([`RETRY_AFTER`]), [`SOON`]
    /// early on or after a writer that did not spin, else the interval.
    fn delay_after(&mut self, spun: bool, retry: bool) -> Duration {
        if let Some(d) = self.retries.after(retry) {
            self.stats.retries += 1;
            return d;
        }
        if self.stats.bursts < EARLY_BURSTS || !spun {
            SOON
        } else {
            self.interval
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// Posts a new request at t1 (and kicks, if given); its number.
    fn post(&mut self, host: Protocol, kick: Option<&Kick>) -> (u64, u64) {
        let seq = self.next_seq();
        self.stats.exchanges += 1;
        let t1 = host_now_ns();
        host.request_sync(seq, t1);
        if let Some(k) = kick {
            k();
        }
        (seq, t1)
    }

    /// Waits for the answer to `seq`: spins until `spin`, then sleeps 50 us
    /// at a time until `limit`. (t2, t3, t4).
    fn await_answer(
        &mut self,
        host: Protocol,
        seq: u64,
        limit: Duration,
        spin: Duration,
    ) -> Option<(u64, u64, u64)> {
        let start = Instant::now();
        let spun = |waited: Duration| waited.min(spin).as_nanos() as u64;
        loop {
            if let Some((t2, t3)) = host.sync_answer(seq) {
                let t4 = host_now_ns();
                self.stats.answered += 1;
                self.stats.host_spin_ns += spun(start.elapsed());
                return Some((t2, t3, t4));
            }
            let waited = start.elapsed();
            if waited >= limit {
                self.stats.host_spin_ns += spun(waited);
                return None;
            }
            if waited < spin {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// One round trip with a writer that is in the exchange.
    fn round_trip(&mut self, host: Protocol) -> Option<Raw> {
        let (seq, t1) = self.post(host, None);
        let Some((t2, t3, t4)) = self.await_answer(host, seq, ROUND_TIMEOUT, ROUND_TIMEOUT) else {
            self.stats.timeouts += 1;
            return None;
        };
        Some(Raw { t1, t2, t3, t4 })
    }

    /// The sample of a round trip, or None (counted) for an impossible
    /// answer: t3 before t2, or a guest-side gap longer than the round trip.
    fn sample(&mut self, r: Raw) -> Option<SyncPoint> {
        let freq = plausible_freq(self.header.freq_hz) as u128;
        let point = r.t3.checked_sub(r.t2).and_then(|gap| {
            let gap_ns = u64::try_from(gap as u128 * 1_000_000_000 / freq).ok()?;
            let rtt = r.t4.checked_sub(r.t1)?;
            Some(SyncPoint {
                guest_ticks: r.t2 + gap / 2,
                host_ns: r.t1 + rtt / 2,
                rtt_ns: rtt.checked_sub(gap_ns)?,
            })
        });
        if point.is_none() {
            self.stats.rejected += 1;
        }
        point
    }

    /// Keeps `p` if it is the burst's fastest so far.
    fn consider(best: &mut Option<SyncPoint>, p: Option<SyncPoint>) {
        if let Some(p) = p {
            if best.is_none_or(|b| p.rtt_ns < b.rtt_ns) {
                *best = Some(p);
            }
        }
    }

    /// Round trips while the writer stays, up to `left`; how many answered.
    /// The thread runs lifted meanwhile (crate::realtime): tens of
    /// microseconds, in which losing the CPU would lose the writer.
    fn rounds(&mut self, host: Protocol, left: usize, best: &mut Option<SyncPoint>) -> usize {
        let boost = Boost::lift();
        self.stats.realtime |= boost.lifted();
        let mut n = 0;
        while n < left {
            let Some(raw) = self.round_trip(host) else {
                break;
            };
            n += 1;
            let p = self.sample(raw);
            Self::consider(best, p);
        }
        n
    }

    /// A burst with a kicked writer: kick, wait for the first answer, then
    /// round trips while it spins; kicks again if it left early (a writer
    /// without `IVT_FEAT_SYNC_SPIN` answers once per kick).
    fn kick_burst(&mut self, region: &Region) -> (Option<SyncPoint>, bool) {
        let host = region.protocol();
        let kick = self.kick.take();
        let max_entries = if self.spins {
            MAX_ENTRIES
        } else {
            BURST as u32
        };
        let (mut best, mut answered, mut entries, mut failed) = (None, 0usize, 0u32, 0u32);
        let mut spun = false;
        while answered < BURST && entries < max_entries && failed < MAX_FAILED_ENTRIES {
            entries += 1;
            let (seq, t1) = self.post(host, kick.as_ref());
            let Some((t2, t3, t4)) = self.await_answer(host, seq, ENTER_TIMEOUT, ENTER_SPIN) else {
                self.stats.timeouts += 1;
                failed += 1;
                continue;
            };
            failed = 0;
            self.stats.entries += 1;
            answered += 1;
            let p = self.sample(Raw { t1, t2, t3, t4 });
            Self::consider(&mut best, p);
            if self.spins {
                let n = self.rounds(host, BURST - answered, &mut best);
                answered += n;
                spun |= n > 0;
            }
        }
        self.kick = kick;
        (best, spun || !self.spins)
    }

    /// Runs what is due: a burst (kicked writer), or the next step of one
    /// with a polled writer. The point a finished burst kept, if any.
    pub fn step(&mut self, region: &Region) -> Option<SyncPoint> {
        self.writer_spun.1 = region.protocol().sync_writer_spun();
        if self.poll.is_none() {
            let (best, spun) = self.kick_burst(region);
            return self.burst_done(best, spun);
        }
        self.poll_step(region)
    }

    fn burst_done(&mut self, best: Option<SyncPoint>, spun: bool) -> Option<SyncPoint> {
        match best {
            Some(p) => self.keep(p),
            None => self.stats.bursts_failed += 1,
        }
        let slow = best.is_none_or(|p| p.rtt_ns > FAST_RTT_NS);
        self.stats.slow_bursts += u64::from(slow);
        let retry = slow && self.mapping().error_ns > RETRY_ABOVE_NS;
        self.schedule(spun, retry);
        best
    }

    /// Keeps a point for the fit.
    fn keep(&mut self, p: SyncPoint) {
        self.stats.min_rtt_ns = Some(self.stats.min_rtt_ns.map_or(p.rtt_ns, |m| m.min(p.rtt_ns)));
        self.points.push(p);
    }

    /// One step of a burst with a polled writer.
    fn poll_step(&mut self, region: &Region) -> Option<SyncPoint> {
        let state = self.poll.as_ref().expect("a polled writer").state;
        match state {
            Poll::Unknown => {
                self.hunt_post(region.protocol(), Instant::now());
                None
            }
            Poll::Hunting {
                seq,
                since,
                posted_ns,
            } => self.hunt(region, seq, since, posted_ns),
            Poll::Window { expect, missed } => self.window(region, expect, missed),
        }
    }

    fn set_poll(&mut self, state: Poll) {
        if let Some(p) = self.poll.as_mut() {
            p.state = state;
        }
    }

    /// Posts a request for a hunt that started at `since`, and looks again
    /// in [`HUNT_EVERY`].
    fn hunt_post(&mut self, host: Protocol, since: Instant) {
        let (seq, posted_ns) = self.post(host, None);
        self.set_poll(Poll::Hunting {
            seq,
            since,
            posted_ns,
        });
        self.next_due = Instant::now() + HUNT_EVERY;
    }

    /// Looks whether the writer answered the request posted at `posted_ns`:
    /// its poll time, and the next window. The answer came between the
    /// post and now, about [`HUNT_EVERY`] apart: a point of the exchange
    /// in its own right (Cristian's, its round trip that interval), so that
    /// a writer whose entries stray from their windows is still measured,
    /// loosely, rather than left to the header's guess.
    fn hunt(
        &mut self,
        region: &Region,
        seq: u64,
        since: Instant,
        posted_ns: u64,
    ) -> Option<SyncPoint> {
        let host = region.protocol();
        let Some((t2, t3)) = host.sync_answer(seq) else {
            return self.hunt_on(host, since);
        };
        let t4 = host_now_ns();
        let now = Instant::now();
        self.stats.answered += 1;
        let point = self.sample(Raw {
            t1: posted_ns,
            t2,
            t3,
            t4,
        });
        if let Some(p) = point {
            self.keep(p);
        }
        // The answer's host time, as well as the bracket gives it.
        let rough = point.map_or(HUNT_EVERY / 2, |p| {
            Duration::from_nanos(t4.saturating_sub(p.host_ns))
        });
        let rough = now.checked_sub(rough).unwrap_or(now);
        let mapping = self.phase_mapping();
        let at = mapping.as_ref().and_then(|m| instant_of(m.realtime_ns(t2)));
        let phase = self.poll.as_mut().expect("a polled writer");
        phase.seen(Sighting {
            t2,
            at: at.unwrap_or(rough),
            exact: at.is_some(),
        });
        let expect = phase
            .next_poll(now + lead(&mapping), mapping.as_ref())
            .expect("just seen");
        phase.state = Poll::Window { expect, missed: 0 };
        self.next_due = expect - lead(&mapping);
        point
    }

    /// No answer yet: post anew and look again, for at most
    /// [`HUNT_PERIODS`] poll periods; then the burst failed.
    fn hunt_on(&mut self, host: Protocol, since: Instant) -> Option<SyncPoint> {
        let phase = self.poll.as_mut().expect("a polled writer");
        if since.elapsed() < phase.period * HUNT_PERIODS {
            self.hunt_post(host, since);
            return None;
        }
        self.stats.timeouts += 1;
        phase.state = Poll::Unknown;
        self.burst_done(None, false)
    }

    /// The mapping so far if it is good enough to place a window by.
    fn phase_mapping(&self) -> Option<ClockMapping> {
        let fit = Fit::new(&self.points, plausible_freq(self.header.freq_hz))?;
        let m = fit.mapping_over(self.started_ns, host_now_ns());
        (!m.coarse && m.error_ns <= PHASE_MAPPING_NS).then_some(m)
    }

    /// Posts a request at the window's start and spins through it; the
    /// writer enters at its poll, then round trips while it spins. A missed
    /// window is tried again at the next poll (the host may have been late,
    /// not wrong), then the host looks for the poll time again.
    fn window(&mut self, region: &Region, expect: Instant, missed: u32) -> Option<SyncPoint> {
        let host = region.protocol();
        let boost = Boost::lift();
        self.stats.realtime |= boost.lifted();
        let after = window_of(&self.phase_mapping()).1;
        let (seq, t1) = self.post(host, None);
        let open = expect.saturating_duration_since(Instant::now()) + after;
        let Some((t2, t3, t4)) = self.await_answer(host, seq, open, open) else {
            self.window_missed(host, missed + 1);
            return None;
        };
        let entered = Instant::now();
        self.stats.entries += 1;
        let mut best = None;
        let p = self.sample(Raw { t1, t2, t3, t4 });
        Self::consider(&mut best, p);
        let spun = self.spins && self.rounds(host, BURST - 1, &mut best) > 0;
        // A host that spun through round trips was running when the writer
        // entered; otherwise it may have noticed late.
        let mapped = self
            .phase_mapping()
            .and_then(|m| instant_of(m.realtime_ns(t2)));
        let sighting = match (spun, mapped) {
            (true, _) => Sighting {
                t2,
                at: entered,
                exact: true,
            },
            (false, Some(at)) => Sighting {
                t2,
                at,
                exact: true,
            },
            (false, None) => Sighting {
                t2,
                at: entered,
                exact: false,
            },
        };
        if let Some(phase) = self.poll.as_mut() {
            phase.seen(sighting);
        }
        self.burst_done(best, spun || !self.spins)
    }

    /// When the host's spinning so far is back within [`SPIN_BUDGET`] of
    /// the time recorded.
    fn budget_allows(&self) -> Instant {
        let spent = Duration::from_nanos(self.stats.host_spin_ns).saturating_sub(SPIN_ALLOWANCE);
        self.started + spent.div_f64(SPIN_BUDGET)
    }

    /// `expect`, or the first entry after it at which the host's spinning
    /// is back within [`SPIN_BUDGET`].
    fn within_budget(&self, expect: Instant, mapping: &Option<ClockMapping>) -> Instant {
        let allowed_from = self.budget_allows();
        match self.poll.as_ref() {
            Some(p) if allowed_from > expect => p
                .next_poll(allowed_from + lead(mapping), mapping.as_ref())
                .unwrap_or(expect),
            _ => expect,
        }
    }

    fn window_missed(&mut self, host: Protocol, missed: u32) {
        self.stats.windows_missed += 1;
        let now = Instant::now();
        let mapping = self.phase_mapping();
        let phase = self.poll.as_mut().expect("a polled writer");
        match phase.next_poll(now + lead(&mapping), mapping.as_ref()) {
            Some(expect) if missed < WINDOW_TRIES => {
                let expect = self.within_budget(expect, &mapping);
                self.set_poll(Poll::Window { expect, missed });
                self.next_due = expect - lead(&mapping);
            }
            _ => self.hunt_post(host, now),
        }
    }

    /// A last burst at the end of the recording, when the writer can still
    /// answer: a kicked writer at once, a polled one at its next window (if
    /// its poll time is known).
    pub fn last_burst(&mut self, region: &Region) {
        self.writer_spun.1 = region.protocol().sync_writer_spun();
        if self.poll.is_none() {
            self.step(region);
            return;
        }
        let Some(Poll::Window { .. }) = self.poll.as_ref().map(|p| p.state) else {
            return;
        };
        let mapping = self.phase_mapping();
        let phase = self.poll.as_mut().expect("a polled writer");
        let Some(expect) = phase.next_poll(Instant::now() + lead(&mapping), mapping.as_ref())
        else {
            return;
        };
        std::thread::sleep(expect.saturating_duration_since(Instant::now() + lead(&mapping)));
        self.window(region, expect, WINDOW_TRIES);
    }

    /// The best line through the points so far ([`Fit::best`]) over the
    /// recording until `now_ns`.
    fn fit_until(&self, now_ns: u64) -> Option<Fit> {
        let freq = plausible_freq(self.header.freq_hz);
        Fit::best(&self.points, freq, self.started_ns, now_ns)
    }

    /// The line through the points so far and its bound over the recording
    /// until now (header reference, coarse, if there is no point).
    pub fn mapping(&self) -> ClockMapping {
        let now_ns = host_now_ns();
        match self.fit_until(now_ns) {
            Some(fit) => fit.mapping_over(self.started_ns, now_ns),
            None => self.no_answer_mapping(),
        }
    }

    fn no_answer_mapping(&self) -> ClockMapping {
        ClockMapping {
            freq_hz: plausible_freq(self.header.freq_hz),
            ref_ticks: self.header.ref_ticks,
            ref_realtime_ns: plausible_ref_realtime(self.header.ref_realtime_ns),
            error_ns: 1_000_000,
            method: "header-reference (no sync answer)".into(),
            coarse: true,
            samples: 0,
        }
    }

    /// Writer time spent in the exchange since the recording started.
    fn writer_spin_ns(&self) -> u64 {
        let ticks = self.writer_spun.1.wrapping_sub(self.writer_spun.0);
        let freq = plausible_freq(self.header.freq_hz) as u128;
        u64::try_from(ticks as u128 * 1_000_000_000 / freq).unwrap_or(u64::MAX)
    }

    /// What the sidecar says about the exchange.
    pub fn report(&self) -> SyncReport {
        let fit = self.fit_until(host_now_ns());
        let points = fit.as_ref().map(Fit::points).unwrap_or_default();
        let in_force = fit.as_ref().map(Fit::bounds_in_force).unwrap_or_default();
        let q = crate::fit::quantiles(&points);
        SyncReport {
            entry: if self.poll.is_some() { "poll" } else { "kick" },
            spinning_writer: self.spins,
            stats: self.stats,
            span_ns: span_ns(&self.points),
            points_bound_p50_ns: q.map(|q| q.0),
            points_bound_p90_ns: q.map(|q| q.1),
            points_bound_max_ns: q.map(|q| q.2),
            span_bound_ns: fit.as_ref().map(|f| f.mapping.error_ns),
            bound_in_force: BoundSpread::of(in_force),
            line: fit.as_ref().map(|f| f.line),
            writer_spin_ns: self.writer_spin_ns(),
            poll_period_ns: self.poll.as_ref().map(|p| p.period.as_nanos() as u64),
            points,
        }
    }
}

/// The exchange as the sidecar's `clock_sync.pingpong` says it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SyncReport {
    /// "kick" (serve with doorbells) or "poll" (ivshmem-plain).
    pub entry: &'static str,
    pub spinning_writer: bool,
    pub stats: SyncStats,
    /// Host time between the first and the last point.
    pub span_ns: u64,
    /// The points' own bounds (`rtt/2 + |residual|`): median, 90th
    /// percentile, largest.
    pub points_bound_p50_ns: Option<u64>,
    pub points_bound_p90_ns: Option<u64>,
    pub points_bound_max_ns: Option<u64>,
    /// The bound inside the points' span (the mapping's over the whole
    /// recording is the clock's `error_ns`).
    pub span_bound_ns: Option<u64>,
    /// The bound in force at each point's time, over the points: how
    /// exact the mapping is through the recording (the clock's `error_ns`
    /// is its largest over the whole recording, ends included).
    pub bound_in_force: Option<BoundSpread>,
    /// The points the mapping's line goes through ([`Fit::best`]).
    pub line: Option<FitLine>,
    /// A polled writer's entry period.
    pub poll_period_ns: Option<u64>,
    /// Writer time spent in the exchange since the recording started (its
    /// cost; from `resp_spun`, on the writer's clock).
    pub writer_spin_ns: u64,
    pub points: Vec<PointReport>,
}

/// A distribution of bounds over the sync points, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BoundSpread {
    pub points: usize,
    pub min_ns: u64,
    pub median_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

impl BoundSpread {
    /// Of `bounds` (any order); None when there is none.
    pub fn of(mut bounds: Vec<u64>) -> Option<BoundSpread> {
        bounds.sort_unstable();
        let q = |f: f64| bounds[((bounds.len() - 1) as f64 * f).round() as usize];
        (!bounds.is_empty()).then(|| BoundSpread {
            points: bounds.len(),
            min_ns: q(0.0),
            median_ns: q(0.5),
            p99_ns: q(0.99),
            max_ns: q(1.0),
        })
    }
}

/// What `ivtrace report` reads back of the sidecar's `clock_sync.pingpong`
/// ([`SyncReport`]'s summary; fields a sidecar lacks default to none).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ExchangeSummary {
    pub entry: String,
    pub stats: SyncStats,
    pub span_ns: u64,
    pub bound_in_force: Option<BoundSpread>,
    pub writer_spin_ns: u64,
}

impl ExchangeSummary {
    /// Its line in `ivtrace report`.
    pub fn describe(&self) -> String {
        let s = &self.stats;
        let bound = match self.bound_in_force {
            Some(b) => format!(
                "bound in force at its {} points min/median/p99/max {}/{}/{}/{} ns",
                b.points, b.min_ns, b.median_ns, b.p99_ns, b.max_ns
            ),
            None => "no point".into(),
        };
        let rtt = s
            .min_rtt_ns
            .map_or(String::new(), |r| format!(", best round trip {r} ns"));
        format!(
            "clock exchange ({}): {bound} over {:.1} s; {} bursts, {} slow, {} retried{rtt}; \
             host spun {:.3} s, guest {:.3} s",
            self.entry,
            self.span_ns as f64 / 1e9,
            s.bursts,
            s.slow_bursts,
            s.retries,
            s.host_spin_ns as f64 / 1e9,
            self.writer_spin_ns as f64 / 1e9,
        )
    }
}

/// Span of host time the points cover.
pub fn span_ns(points: &[SyncPoint]) -> u64 {
    let lo = points.iter().map(|p| p.host_ns).min();
    let hi = points.iter().map(|p| p.host_ns).max();
    match (lo, hi) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_line_reads_a_sidecar_section_back() {
        let section = serde_json::json!({
            "entry": "poll", "span_ns": 60_200_000_000u64, "writer_spin_ns": 13_000_000,
            "stats": {"bursts": 34, "slow_bursts": 12, "retries": 10, "min_rtt_ns": 391,
                      "host_spin_ns": 330_000_000u64},
            "bound_in_force": {"points": 150, "min_ns": 220, "median_ns": 264, "p99_ns": 370,
                               "max_ns": 371},
            "points": []
        });
        let s: ExchangeSummary = serde_json::from_value(section).unwrap();
        assert_eq!(
            s.describe(),
            "clock exchange (poll): bound in force at its 150 points min/median/p99/max \
             220/264/370/371 ns over 60.2 s; 34 bursts, 12 slow, 10 retried, best round trip \
             391 ns; host spun 0.330 s, guest 0.013 s"
        );
        let old: ExchangeSummary = serde_json::from_value(serde_json::json!({"entry": "kick"}))
            .expect("a sidecar of an older ivtrace reads back");
        assert!(old.describe().contains("no point"));
    }

    #[test]
    fn slow_bursts_are_retried_four_times_in_a_row_then_wait_for_the_schedule() {
        let mut r = Retries::default();
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis());
        assert_eq!(ms(r.after(false)), None);
        let row: Vec<_> = (0..6).map(|_| ms(r.after(true))).collect();
        assert_eq!(
            row,
            [Some(50), Some(100), Some(200), Some(400), None, Some(50)]
        );
        assert_eq!(ms(r.after(false)), None, "a fast burst ends the row");
        assert_eq!(
            ms(r.after(true)),
            Some(50),
            "and the next slow one starts anew"
        );
    }

    #[test]
    fn the_next_entry_is_on_the_grid_of_the_past_ones() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // a 1 GHz writer clock: t2 in nanoseconds
        let at = |m: u64| Sighting {
            t2: 7_000_000_000 + m * 1_000_000,
            at: t0 + ms(m),
            exact: true,
        };
        let mut p = PollPhase::new(ms(100), 1_000_000_000);
        assert_eq!(p.next_poll(t0, None), None);
        p.seen(at(0));
        assert_eq!(p.next_poll(t0, None), Some(t0 + ms(100)));
        assert_eq!(p.next_poll(t0 + ms(1234), None), Some(t0 + ms(1300)));
        // jitter on the grid moves the anchor
        p.seen(at(501));
        assert_eq!(p.next_poll(t0 + ms(1234), None), Some(t0 + ms(1301)));
        // a late entry (its vCPU was not running) does not, whenever the
        // host noticed it
        p.seen(Sighting {
            at: t0 + ms(790),
            ..at(760)
        });
        assert_eq!(p.next_poll(t0 + ms(1234), None), Some(t0 + ms(1301)));
        // a rough sighting on the grid does not replace an exact anchor
        p.seen(Sighting {
            at: t0 + ms(935),
            exact: false,
            ..at(901)
        });
        assert_eq!(p.next_poll(t0 + ms(1234), None), Some(t0 + ms(1301)));
        // two in a row on another grid: the module started anew
        p.seen(at(2060));
        assert_eq!(p.next_poll(t0 + ms(2061), None), Some(t0 + ms(2101)));
        p.seen(at(2160));
        assert_eq!(p.next_poll(t0 + ms(2161), None), Some(t0 + ms(2260)));
        // hostile t2 values cost the writer its own windows, nothing more
        for t2 in [0, u64::MAX, u64::MAX / 3] {
            p.seen(Sighting { t2, ..at(2170) });
            assert!(p.next_poll(t0 + ms(2171), None).is_some());
        }
    }

    #[test]
    fn the_span_is_from_the_earliest_to_the_latest_point() {
        let p = |h| SyncPoint {
            guest_ticks: 0,
            host_ns: h,
            rtt_ns: 0,
        };
        assert_eq!(span_ns(&[p(30), p(10), p(20)]), 20);
        assert_eq!(span_ns(&[]), 0);
    }
}
