//! Guest clock -> host time by ping-pong through the region's sync
//! mailbox (`struct ivt_sync`), for guests whose TSC relation to the host
//! is unknown (TCG, or KVM without debugfs).
//!
//! One exchange (NTP's on-wire method; the words and their ordering are
//! ivtrace-region's `protocol`): the host posts a request at host time
//! t1 and kicks the guest, the guest answers with its TSC when it saw the
//! request (t2) and when it answered (t3), the host sees the answer at t4.
//!
//! The pair (guest (t2+t3)/2, host (t1+t4)/2) is off the true relation by
//! at most half the round trip `delta = (t4-t1) - (t3-t2)` (Cristian 1989).
//! A burst of exchanges keeps its minimum-delta sample; bursts repeat to
//! follow drift; a least-squares line through the kept points is the
//! mapping. Its error bound, inside the span of the points, is
//! `max_i(delta_i/2 + |residual_i|)`: at each point the truth is within
//! `delta_i/2` of the point and the line within `|residual_i|` of it, and
//! between points both the true relation (a TSC) and the line are linear.
//! Outside the span the error grows with the frequency error; the sidecar
//! records the span.

use std::time::{Duration, Instant};

use ivtrace_region::region::ClockRef;
use ivtrace_region::Region;

use crate::estimator::{plausible_freq, plausible_ref_realtime, ClockEstimator};
use crate::mapping::ClockMapping;
use crate::timebase::host_now_ns;

/// Exchanges per burst; the minimum-delta one is kept.
pub const BURST: usize = 32;
/// Busy-wait for an answer this long, then poll with sleeps.
const SPIN: Duration = Duration::from_micros(300);
/// Give up on an exchange after this long (lost kick, busy guest).
const EXCHANGE_TIMEOUT: Duration = Duration::from_millis(30);
/// A burst gives up after this many timeouts in a row.
const MAX_TIMEOUTS_IN_A_ROW: u32 = 3;
/// The first bursts come quickly, to have a slope early.
const EARLY: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_millis(500),
    Duration::from_millis(1000),
];

/// One kept sample: a guest tick and the host time it corresponds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SyncPoint {
    pub guest_ticks: u64,
    pub host_ns: u64,
    /// Round trip minus the guest's own time between t2 and t3.
    pub rtt_ns: u64,
}

/// Statistics of the exchanges so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SyncStats {
    pub bursts: u64,
    pub exchanges: u64,
    pub answered: u64,
    pub timeouts: u64,
    pub rejected: u64,
    pub min_rtt_ns: Option<u64>,
}

/// The ping-pong engine of one region.
pub struct PingPong {
    header: ClockRef,
    seq: u64,
    points: Vec<SyncPoint>,
    pub stats: SyncStats,
    started: Instant,
    next_due: Instant,
    interval: Duration,
}

impl PingPong {
    /// `interval`: time between bursts after the first three.
    pub fn new(region: &Region, interval: Duration) -> PingPong {
        let now = Instant::now();
        PingPong {
            header: region.header().clock,
            seq: region.protocol().last_sync_request(),
            points: Vec::new(),
            stats: SyncStats::default(),
            started: now,
            next_due: now,
            interval: interval.max(Duration::from_millis(100)),
        }
    }

    pub fn points(&self) -> &[SyncPoint] {
        &self.points
    }

    /// Time left until the next burst is due.
    pub fn until_due(&self) -> Duration {
        self.next_due.saturating_duration_since(Instant::now())
    }

    pub fn due(&self) -> bool {
        Instant::now() >= self.next_due
    }

    fn schedule(&mut self) {
        let n = self.stats.bursts as usize;
        self.next_due = match EARLY.get(n) {
            Some(&d) => self.started + d,
            None => Instant::now() + self.interval,
        };
    }

    /// One exchange; `kick` wakes the guest (MSI-X vector 0).
    fn exchange(&mut self, region: &Region, kick: &dyn Fn()) -> Option<SyncPoint> {
        self.stats.exchanges += 1;
        self.seq = self.seq.wrapping_add(1).max(1);
        let seq = self.seq;
        let t1 = host_now_ns();
        let host = region.protocol();
        host.request_sync(seq, t1);
        kick();
        let start = Instant::now();
        let (t2, t3) = loop {
            if let Some(answer) = host.sync_answer(seq) {
                break answer;
            }
            let waited = start.elapsed();
            if waited >= EXCHANGE_TIMEOUT {
                self.stats.timeouts += 1;
                return None;
            }
            if waited < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        };
        let t4 = host_now_ns();
        self.stats.answered += 1;
        let freq = plausible_freq(self.header.freq_hz);
        // Hostile or broken answers: t3 before t2, or a guest-side gap of
        // more than the whole exchange.
        let guest_gap_ns = (t3.checked_sub(t2)? as u128 * 1_000_000_000 / freq as u128) as u64;
        let rtt = t4.saturating_sub(t1);
        if guest_gap_ns > rtt {
            self.stats.rejected += 1;
            return None;
        }
        Some(SyncPoint {
            guest_ticks: t2 + (t3 - t2) / 2,
            host_ns: t1 + rtt / 2,
            rtt_ns: rtt - guest_gap_ns,
        })
    }

    /// A burst: up to [`BURST`] exchanges, keeps the minimum-delta one.
    /// Schedules the next burst.
    pub fn burst(&mut self, region: &Region, kick: &dyn Fn()) -> Option<SyncPoint> {
        let mut best: Option<SyncPoint> = None;
        let mut timeouts_in_a_row = 0;
        for _ in 0..BURST {
            match self.exchange(region, kick) {
                Some(p) => {
                    timeouts_in_a_row = 0;
                    if best.is_none_or(|b| p.rtt_ns < b.rtt_ns) {
                        best = Some(p);
                    }
                }
                None => {
                    timeouts_in_a_row += 1;
                    if timeouts_in_a_row >= MAX_TIMEOUTS_IN_A_ROW {
                        break;
                    }
                }
            }
        }
        self.stats.bursts += 1;
        self.schedule();
        if let Some(p) = best {
            self.stats.min_rtt_ns =
                Some(self.stats.min_rtt_ns.map_or(p.rtt_ns, |m| m.min(p.rtt_ns)));
            self.points.push(p);
        }
        best
    }

    /// The mapping from the points so far (header reference if none).
    pub fn mapping(&self) -> ClockMapping {
        fit(&self.points, self.header)
    }
}

/// Drops points whose round trip is far above the best one (a burst that
/// only saw slow answers), keeping at least two.
fn filtered(points: &[SyncPoint]) -> Vec<SyncPoint> {
    let Some(min) = points.iter().map(|p| p.rtt_ns).min() else {
        return Vec::new();
    };
    let limit = (3 * min).max(min + 50_000);
    let kept: Vec<SyncPoint> = points
        .iter()
        .copied()
        .filter(|p| p.rtt_ns <= limit)
        .collect();
    if kept.len() >= 2 || points.len() < 2 {
        return kept;
    }
    let mut by_rtt = points.to_vec();
    by_rtt.sort_by_key(|p| p.rtt_ns);
    by_rtt.truncate(2);
    by_rtt.sort_by_key(|p| p.guest_ticks);
    by_rtt
}

/// Least-squares line `host_ns = a * guest_ticks + b` through the points,
/// as a [`ClockMapping`] with its error bound (module docs).
pub fn fit(points: &[SyncPoint], header: ClockRef) -> ClockMapping {
    let pts = filtered(points);
    let header_freq = plausible_freq(header.freq_hz);
    let Some(first) = pts.first() else {
        return ClockMapping {
            freq_hz: header_freq,
            ref_ticks: header.ref_ticks,
            ref_realtime_ns: plausible_ref_realtime(header.ref_realtime_ns),
            error_ns: 1_000_000,
            method: "header-reference (no sync answer)".into(),
            coarse: true,
            samples: 0,
        };
    };
    let (x0, y0) = (first.guest_ticks, first.host_ns);
    let n = pts.len() as f64;
    let xs: Vec<f64> = pts
        .iter()
        .map(|p| (p.guest_ticks as i128 - x0 as i128) as f64)
        .collect();
    let ys: Vec<f64> = pts
        .iter()
        .map(|p| (p.host_ns as i128 - y0 as i128) as f64)
        .collect();
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let (freq, method, coarse) = if pts.len() >= 2 && sxx > 0.0 && sxy > 0.0 {
        let f = (1e9 * sxx / sxy).round();
        if (1e3..=1e11).contains(&f) {
            (f as u64, "pingpong-fit", false)
        } else {
            (
                header_freq,
                "pingpong (implausible slope; header frequency)",
                true,
            )
        }
    } else {
        (header_freq, "pingpong-1point (header frequency)", true)
    };
    let mut m = ClockMapping {
        freq_hz: freq,
        ref_ticks: (x0 as i128 + mx.round() as i128).clamp(0, u64::MAX as i128) as u64,
        ref_realtime_ns: (y0 as i128 + my.round() as i128).clamp(0, u64::MAX as i128) as u64,
        error_ns: 0,
        method: method.into(),
        coarse,
        samples: pts.len() as u32,
    };
    // Residuals with the rounded frequency and reference, as written.
    let bound = pts
        .iter()
        .map(|p| {
            let resid = (m.realtime_ns(p.guest_ticks) - p.host_ns as i128).unsigned_abs();
            (p.rtt_ns / 2) as u128 + resid
        })
        .max()
        .unwrap_or(0);
    m.error_ns = (bound + 1).min(u64::MAX as u128) as u64;
    m
}

/// Span of host time the points cover (the bound holds inside it).
pub fn span_ns(points: &[SyncPoint]) -> u64 {
    match (points.first(), points.last()) {
        (Some(a), Some(b)) => b.host_ns.saturating_sub(a.host_ns),
        _ => 0,
    }
}

/// [`ClockEstimator`] over a finished set of points (the drain loop owns
/// the [`PingPong`] engine and hands over its points).
pub struct PingPongEstimate {
    pub header: ClockRef,
    pub points: Vec<SyncPoint>,
}

impl ClockEstimator for PingPongEstimate {
    fn initial(&self) -> ClockMapping {
        fit(&self.points, self.header)
    }
    fn finish(&mut self) -> ClockMapping {
        fit(&self.points, self.header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(g: u64, h: u64, rtt: u64) -> SyncPoint {
        SyncPoint {
            guest_ticks: g,
            host_ns: h,
            rtt_ns: rtt,
        }
    }

    /// Points from a known line host = 1.7e18 + (g - 5e12) / 2.3 (2.3 GHz),
    /// each off by up to rtt/2.
    #[test]
    fn fit_recovers_a_known_line_within_its_bound() {
        let truth =
            |g: u64| 1_700_000_000_000_000_000i128 + (g as i128 - 5_000_000_000_000) * 10 / 23;
        let mut pts = Vec::new();
        for i in 0..20u64 {
            let g = 5_000_000_000_000 + i * 2_300_000_000 * 5; // every 5 s
            let err = [(7i128), -9, 3, 0, -4][i as usize % 5] * 1000; // up to 9 us
            pts.push(pt(g, (truth(g) + err) as u64, 20_000));
        }
        let m = fit(&pts, ClockRef::default());
        assert_eq!(m.method, "pingpong-fit");
        assert!(!m.coarse);
        assert!(
            (m.freq_hz as f64 - 2.3e9).abs() / 2.3e9 < 5e-6,
            "{}",
            m.freq_hz
        );
        for p in &pts {
            let e = (m.realtime_ns(p.guest_ticks) - truth(p.guest_ticks)).unsigned_abs();
            assert!(e as u64 <= m.error_ns, "error {e} > bound {}", m.error_ns);
        }
        assert!(m.error_ns < 40_000, "bound {}", m.error_ns);
    }

    #[test]
    fn one_point_uses_the_header_frequency_and_is_coarse() {
        let h = ClockRef {
            freq_hz: 2_000_000_000,
            ..Default::default()
        };
        let m = fit(&[pt(1000, 5_000, 400)], h);
        assert!(m.coarse);
        assert_eq!(
            (m.freq_hz, m.ref_ticks, m.ref_realtime_ns),
            (2_000_000_000, 1000, 5_000)
        );
        assert_eq!(m.error_ns, 201);
        let none = fit(&[], h);
        assert!(none.coarse && none.samples == 0);
    }

    #[test]
    fn slow_bursts_are_filtered_and_hostile_points_do_not_panic() {
        let pts = [
            pt(0, 0, 10_000),
            pt(1_000_000, 500_000, 10_000_000),
            pt(2_000_000, 1_000_000, 12_000),
        ];
        assert_eq!(filtered(&pts).len(), 2);
        let hostile = [pt(u64::MAX, 0, u64::MAX), pt(0, u64::MAX, 0), pt(7, 7, 0)];
        let m = fit(&hostile, ClockRef::default());
        let _ = (m.ctf_offset(), m.precision_cycles());
    }
}
