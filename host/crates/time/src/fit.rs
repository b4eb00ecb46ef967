//! The line through the clock exchange's kept points, and how far from the
//! truth it can be.
//!
//! Point i says: at guest tick `g_i` the host time was `h_i`, within
//! `r_i = rtt_i / 2` (Cristian 1989: the guest read its clock somewhere in
//! the round trip). The mapping is a weighted least-squares line L through
//! the points (weight `1 / r_i^2`: a fast round trip says more), written
//! with an integer frequency and reference as CTF's clock needs, and its
//! residuals are taken with that rounded line.
//!
//! The bound assumes the true relation is linear: a TSC against a host
//! clock that is not being slewed (under TCG the guest TSC is the host's
//! TSC plus a constant, docs/kvm.md). Then `D = truth - L` is linear, and
//! at each point `|D(g_i)| <= b_i = r_i + |L(g_i) - h_i|`. The bound over
//! a range of guest time is the largest `|D(x)|` any linear D meeting all
//! those constraints reaches in the range: a small linear program
//! ([`Fit::bound_over`], over the recording: what `error_ns` reports). It
//! needs no point near x: a line pinned within 0.2 us at two points 10 s
//! apart is within about 0.6 us 5 s beyond them. So an exchange that went
//! slow (an interrupt, a preempted vCPU) costs nothing once fast points
//! pin the line.

use serde::Serialize;

use crate::mapping::ClockMapping;
use crate::pingpong::SyncPoint;

/// Round trips are never taken as shorter than this for weighting (a
/// hostile zero would weigh infinitely).
const MIN_WEIGHT_RTT_NS: f64 = 20.0;
/// Points whose constraints the bound's linear program takes: the best-
/// bounded ones (O(n^3) in them).
const LP_POINTS: usize = 24;

/// A round trip at most this long is a *fast* point: both sides were
/// running and spinning (a cache-line exchange takes 0.2-0.6 us here,
/// docs/abi.md); a longer one had an interrupt, a preemption or a late
/// host inside it.
pub const FAST_RTT_NS: u64 = 1_000;

/// A line through the points, in the form a [`ClockMapping`] writes.
#[derive(Debug, Clone)]
pub struct Fit {
    /// The mapping (its `error_ns` is the bound over the points' span).
    pub mapping: ClockMapping,
    /// Per point, in guest-tick order: `b_i` (ns).
    bounds: Vec<(SyncPoint, u64)>,
    /// Which points the line was drawn through (the sidecar says it).
    pub line: FitLine,
}

/// The points a line was drawn through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FitLine {
    EveryPoint,
    /// Those with a round trip of at most [`FAST_RTT_NS`].
    FastPoints,
}

/// One point as the sidecar lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PointReport {
    pub host_ns: u64,
    pub rtt_ns: u64,
    /// Mapped minus measured host time at the point, ns.
    pub residual_ns: i64,
    /// `rtt/2 + |residual|`: how far the mapping can be off at this point.
    pub bound_ns: u64,
}

/// The line's weighted least-squares slope (ns per tick) and centre, or
/// None when the points do not determine one.
fn weighted_line(pts: &[SyncPoint]) -> Option<(f64, f64, f64)> {
    let (x0, y0) = (pts[0].guest_ticks as i128, pts[0].host_ns as i128);
    let w = |p: &SyncPoint| {
        let r = (p.rtt_ns as f64 / 2.0).max(MIN_WEIGHT_RTT_NS);
        1.0 / (r * r)
    };
    let xy = |p: &SyncPoint| {
        (
            (p.guest_ticks as i128 - x0) as f64,
            (p.host_ns as i128 - y0) as f64,
        )
    };
    let sw: f64 = pts.iter().map(w).sum();
    let mx = pts.iter().map(|p| w(p) * xy(p).0).sum::<f64>() / sw;
    let my = pts.iter().map(|p| w(p) * xy(p).1).sum::<f64>() / sw;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for p in pts {
        let (x, y) = xy(p);
        sxx += w(p) * (x - mx) * (x - mx);
        sxy += w(p) * (x - mx) * (y - my);
    }
    (pts.len() >= 2 && sxx > 0.0 && sxy > 0.0).then_some((
        sxy / sxx,
        mx + x0 as f64,
        my + y0 as f64,
    ))
}

fn clamp_u64(v: f64) -> u64 {
    v.round().clamp(0.0, u64::MAX as f64) as u64
}

impl Fit {
    /// The line through `points`; `header_freq` when they do not give a
    /// plausible slope (one point, or a hostile set). None without points.
    pub fn new(points: &[SyncPoint], header_freq: u64) -> Option<Fit> {
        Fit::through(points, points, header_freq, FitLine::EveryPoint)
    }

    /// Of the line through every point and the line through the fast points
    /// only ([`FAST_RTT_NS`]), the one whose bound over host times
    /// `[from_ns, to_ns]` is smaller. Both are bounded by every point's
    /// constraint, so the choice can only narrow a sound bound. The
    /// weights already all but ignore slow points; what they cannot ignore
    /// is a cluster of middling ones (1-5 us, a busy host) that pulls the
    /// line off the fast points at one end of the recording.
    pub fn best(points: &[SyncPoint], header_freq: u64, from_ns: u64, to_ns: u64) -> Option<Fit> {
        let all = Fit::new(points, header_freq)?;
        let fast: Vec<SyncPoint> = points
            .iter()
            .filter(|p| p.rtt_ns <= FAST_RTT_NS)
            .copied()
            .collect();
        if fast.len() < 2 || fast.len() == points.len() {
            return Some(all);
        }
        let fast = Fit::through(points, &fast, header_freq, FitLine::FastPoints)
            .filter(|f| !f.mapping.coarse);
        match fast {
            Some(f) if f.bound_over(from_ns, to_ns) < all.bound_over(from_ns, to_ns) => Some(f),
            _ => Some(all),
        }
    }

    /// The line through `through` (a subset of `points`, `which`),
    /// bounded by every one of `points`.
    fn through(
        points: &[SyncPoint],
        through: &[SyncPoint],
        header_freq: u64,
        which: FitLine,
    ) -> Option<Fit> {
        let mut pts = points.to_vec();
        pts.sort_by_key(|p| p.guest_ticks);
        let mut line = through.to_vec();
        line.sort_by_key(|p| p.guest_ticks);
        let first = *line.first()?;
        let (freq, method, coarse, cx, cy) = match weighted_line(&line) {
            Some((slope, cx, cy)) if (1e3..=1e11).contains(&(1e9 / slope)) => {
                ((1e9 / slope).round() as u64, "pingpong-fit", false, cx, cy)
            }
            Some((_, cx, cy)) => (
                header_freq,
                "pingpong (implausible slope; header frequency)",
                true,
                cx,
                cy,
            ),
            None => (
                header_freq,
                "pingpong-1point (header frequency)",
                true,
                first.guest_ticks as f64,
                first.host_ns as f64,
            ),
        };
        let mapping = ClockMapping {
            freq_hz: freq,
            ref_ticks: clamp_u64(cx),
            ref_realtime_ns: clamp_u64(cy),
            error_ns: 0,
            method: method.into(),
            coarse,
            samples: pts.len() as u32,
        };
        let bounds = pts.iter().map(|p| (*p, point_bound(&mapping, p))).collect();
        let mut fit = Fit {
            mapping,
            bounds,
            line: which,
        };
        fit.mapping.error_ns = fit.span_bound();
        Some(fit)
    }

    /// Each point with its residual and bound, in time order.
    pub fn points(&self) -> Vec<PointReport> {
        self.bounds
            .iter()
            .map(|(p, b)| PointReport {
                host_ns: p.host_ns,
                rtt_ns: p.rtt_ns,
                residual_ns: residual(&self.mapping, p).clamp(i64::MIN as i128, i64::MAX as i128)
                    as i64,
                bound_ns: *b,
            })
            .collect()
    }

    /// The bound anywhere inside the points' span.
    fn span_bound(&self) -> u64 {
        let (Some(first), Some(last)) = (self.bounds.first(), self.bounds.last()) else {
            return 0;
        };
        self.bound_at_ticks(first.0.guest_ticks as f64, last.0.guest_ticks as f64)
    }

    /// The guest tick the mapping puts at host time `ns`.
    fn ticks_at(&self, ns: u64) -> f64 {
        let m = &self.mapping;
        m.ref_ticks as f64 + (ns as f64 - m.ref_realtime_ns as f64) * m.freq_hz as f64 / 1e9
    }

    /// The bound over host times `[from_ns, to_ns]` (the recording) and
    /// the points' span together.
    pub fn bound_over(&self, from_ns: u64, to_ns: u64) -> u64 {
        let (Some(first), Some(last)) = (self.bounds.first(), self.bounds.last()) else {
            return 0;
        };
        let lo = self.ticks_at(from_ns).min(first.0.guest_ticks as f64);
        let hi = self.ticks_at(to_ns).max(last.0.guest_ticks as f64);
        self.bound_at_ticks(lo, hi)
    }

    /// `max |D(x)|` over guest ticks `[lo, hi]` and every linear D with
    /// `|D(g_i)| <= b_i` (module docs). |D| is convex, so the maximum over
    /// x is at `lo` or `hi`; for each, the maximum over D is a linear
    /// program in D's slope and intercept, whose optimum is a vertex: two
    /// of the constraints met with equality. The vertices are tried among
    /// the best-bounded [`LP_POINTS`] points (fewer constraints can only
    /// widen the bound). One point, or all at one tick: that point's bound.
    fn bound_at_ticks(&self, lo: f64, hi: f64) -> u64 {
        let mut best: Vec<(f64, f64)> = self
            .bounds
            .iter()
            .map(|(p, b)| (p.guest_ticks as f64, *b as f64))
            .collect();
        best.sort_by(|a, b| a.1.total_cmp(&b.1));
        best.truncate(LP_POINTS);
        let x0 = best[0].0;
        let pts: Vec<(f64, f64)> = best.iter().map(|&(g, b)| (g - x0, b)).collect();
        let (ulo, uhi) = (lo - x0, hi - x0);
        let mut worst: Option<f64> = None;
        for (i, &(ui, bi)) in pts.iter().enumerate() {
            for &(uj, bj) in &pts[i + 1..] {
                if (ui - uj).abs() < 0.5 {
                    continue;
                }
                for (si, sj) in [(1.0, 1.0), (1.0, -1.0), (-1.0, 1.0), (-1.0, -1.0)] {
                    let slope = (si * bi - sj * bj) / (ui - uj);
                    let c = si * bi - slope * ui;
                    let feasible = pts
                        .iter()
                        .all(|&(u, b)| (slope * u + c).abs() <= b * (1.0 + 1e-9) + 1e-3);
                    if feasible {
                        let v = (slope * ulo + c).abs().max((slope * uhi + c).abs());
                        worst = Some(worst.map_or(v, |w| w.max(v)));
                    }
                }
            }
        }
        match worst {
            Some(w) => clamp_u64(w.ceil()).saturating_add(1),
            None => clamp_u64(pts[0].1).saturating_add(1),
        }
    }

    /// The bound in force at each point's time (the linear program's at
    /// that guest tick): how far the mapping can be off there, from every
    /// point's constraint, in time order.
    pub fn bounds_in_force(&self) -> Vec<u64> {
        self.bounds
            .iter()
            .map(|(p, _)| {
                let g = p.guest_ticks as f64;
                self.bound_at_ticks(g, g)
            })
            .collect()
    }

    /// The mapping with its bound over `[from_ns, to_ns]`.
    pub fn mapping_over(&self, from_ns: u64, to_ns: u64) -> ClockMapping {
        let mut m = self.mapping.clone();
        m.error_ns = self.bound_over(from_ns, to_ns);
        m
    }
}

/// Mapped minus measured host time at `p`, ns.
fn residual(m: &ClockMapping, p: &SyncPoint) -> i128 {
    m.realtime_ns(p.guest_ticks) - p.host_ns as i128
}

/// `rtt/2 + |residual|` at `p`, rounded up.
fn point_bound(m: &ClockMapping, p: &SyncPoint) -> u64 {
    let b = p.rtt_ns.div_ceil(2) as u128 + residual(m, p).unsigned_abs();
    b.min(u64::MAX as u128) as u64
}

/// Quantiles of the points' bounds (p50, p90, max), ns.
pub fn quantiles(points: &[PointReport]) -> Option<(u64, u64, u64)> {
    let mut b: Vec<u64> = points.iter().map(|p| p.bound_ns).collect();
    b.sort_unstable();
    let q = |f: f64| b[((b.len() - 1) as f64 * f).round() as usize];
    (!b.is_empty()).then(|| (q(0.5), q(0.9), q(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pt(g: u64, h: u64, rtt: u64) -> SyncPoint {
        SyncPoint {
            guest_ticks: g,
            host_ns: h,
            rtt_ns: rtt,
        }
    }

    /// host = 1.7e18 + (g - 5e12) / 2.3 (a 2.3 GHz guest clock).
    fn truth(g: u64) -> i128 {
        1_700_000_000_000_000_000i128 + (g as i128 - 5_000_000_000_000) * 10 / 23
    }

    #[test]
    fn the_truth_lies_within_the_bound_inside_and_beyond_the_points() {
        let mut pts = Vec::new();
        for i in 0..12u64 {
            let g = 5_000_000_000_000 + i * 2_300_000_000 * 5; // every 5 s
            let err = [300i128, -250, 120, 0, -400, 90][i as usize % 6]; // within rtt/2
            pts.push(pt(g, (truth(g) + err) as u64, 900));
        }
        let fit = Fit::new(&pts, 2_300_000_000).unwrap();
        assert_eq!(fit.mapping.method, "pingpong-fit");
        let (from, to) = (
            pts[0].host_ns - 2_000_000_000,
            pts[11].host_ns + 3_000_000_000,
        );
        let over = fit.bound_over(from, to);
        assert!(over >= fit.mapping.error_ns);
        let g_at =
            |h: u64| (5_000_000_000_000 + (h as i128 - 1_700_000_000_000_000_000) * 23 / 10) as u64;
        for h in (from..=to).step_by(250_000_000) {
            let g = g_at(h);
            let e = (fit.mapping.realtime_ns(g) - truth(g)).unsigned_abs();
            let b = if (pts[0].host_ns..=pts[11].host_ns).contains(&h) {
                fit.mapping.error_ns
            } else {
                over
            };
            assert!(e as u64 <= b, "at {h}: error {e} > bound {b}");
        }
        assert!(fit.mapping.error_ns < 1_200, "{}", fit.mapping.error_ns);
    }

    #[test]
    fn a_slow_point_bracketed_by_fast_ones_costs_nothing() {
        let g = |i: u64| 5_000_000_000_000 + i * 2_300_000_000;
        let fast = [0u64, 1, 3, 4].map(|i| pt(g(i), truth(g(i)) as u64, 600));
        let mut pts = fast.to_vec();
        pts.push(pt(g(2), truth(g(2)) as u64 + 20_000, 50_000)); // a preempted exchange
        let fit = Fit::new(&pts, 0).unwrap();
        assert!(fit.mapping.error_ns <= 310, "{}", fit.mapping.error_ns);
        let slow = fit.points().iter().map(|p| p.bound_ns).max().unwrap();
        assert!(
            slow > 20_000,
            "the slow point's own bound is listed: {slow}"
        );
    }

    #[test]
    fn slow_points_before_the_first_fast_one_are_covered_by_extrapolation() {
        // What a busy host gives: the first bursts caught the writer only
        // through slow round trips, the later ones spun.
        let g = |s: f64| 5_000_000_000_000 + (s * 2.3e9) as u64;
        let pts = [
            pt(g(0.0), truth(g(0.0)) as u64 + 100_000, 7_000_000),
            pt(g(3.5), truth(g(3.5)) as u64 - 700_000, 1_400_000),
            pt(g(3.6), truth(g(3.6)) as u64 + 100, 200),
            pt(g(5.9), truth(g(5.9)) as u64 - 5_000_000, 10_400_000),
            pt(g(8.3), truth(g(8.3)) as u64 - 250, 550),
            pt(g(11.4), truth(g(11.4)) as u64 + 60, 520),
        ];
        let fit = Fit::new(&pts, 2_300_000_000).unwrap();
        let from = truth(g(-0.1)) as u64;
        let to = truth(g(11.6)) as u64;
        let over = fit.bound_over(from, to);
        assert!(over < 1_500, "bound {over}");
        for s in [-0.1, 0.0, 2.0, 3.6, 7.0, 11.6] {
            let e = (fit.mapping.realtime_ns(g(s)) - truth(g(s))).unsigned_abs() as u64;
            assert!(e <= over, "at {s} s: error {e} > bound {over}");
        }
    }

    #[test]
    fn middling_points_at_one_end_do_not_pull_the_line_off_the_fast_ones() {
        // Fast points every second over 20 s, and a busy host's cluster of
        // 3 us round trips in the last two seconds, all on one side of
        // the truth (within their intervals): they weigh enough together
        // to tilt the line through every point.
        let g = |s: f64| 5_000_000_000_000 + (s * 2.3e9) as u64;
        let mut pts: Vec<SyncPoint> = (0..=20)
            .map(|i| {
                let e = [40i128, -60, 0, 80, -30][i % 5];
                pt(g(i as f64), (truth(g(i as f64)) + e) as u64, 400)
            })
            .collect();
        for k in 0..80 {
            let s = 18.0 + k as f64 * 0.025;
            pts.push(pt(g(s), (truth(g(s)) + 1_450) as u64, 3_000));
        }
        let (from, to) = (truth(g(-0.5)) as u64, truth(g(20.5)) as u64);
        let all = Fit::new(&pts, 2_300_000_000).unwrap();
        let best = Fit::best(&pts, 2_300_000_000, from, to).unwrap();
        let (b_all, b_best) = (all.bound_over(from, to), best.bound_over(from, to));
        assert_eq!(best.line, FitLine::FastPoints);
        assert!(
            b_best < b_all,
            "fast line {b_best} ns, all points {b_all} ns"
        );
        assert!(b_best <= 500, "{b_best}");
        for s in [-0.5, 0.0, 7.3, 18.5, 20.0, 20.5] {
            let e = (best.mapping.realtime_ns(g(s)) - truth(g(s))).unsigned_abs() as u64;
            assert!(e <= b_best, "at {s} s: error {e} > bound {b_best}");
        }
        let in_force = best.bounds_in_force();
        assert_eq!(in_force.len(), pts.len());
        assert!(in_force.iter().all(|&b| b <= b_best), "{in_force:?}");
    }

    #[test]
    fn without_two_fast_points_the_line_goes_through_every_point() {
        let g = |s: u64| 5_000_000_000_000 + s * 2_300_000_000;
        let pts = [
            pt(g(0), truth(g(0)) as u64, 400),
            pt(g(5), truth(g(5)) as u64, 5_000),
        ];
        let best = Fit::best(&pts, 2_300_000_000, 0, u64::MAX).unwrap();
        assert_eq!(best.line, FitLine::EveryPoint);
        assert!(Fit::best(&[], 1, 0, 1).is_none());
    }

    #[test]
    fn one_point_uses_the_header_frequency_and_is_coarse() {
        let fit = Fit::new(&[pt(1000, 5_000, 400)], 2_000_000_000).unwrap();
        let m = &fit.mapping;
        assert!(m.coarse);
        assert_eq!(
            (m.freq_hz, m.ref_ticks, m.ref_realtime_ns),
            (2_000_000_000, 1000, 5_000)
        );
        assert_eq!(m.error_ns, 201);
        assert_eq!(
            fit.bound_over(0, 10_000),
            201,
            "no second point: no extrapolation"
        );
        assert!(Fit::new(&[], 1).is_none());
    }

    #[test]
    fn quantiles_of_the_points() {
        let p = |b| PointReport {
            host_ns: 0,
            rtt_ns: 0,
            residual_ns: 0,
            bound_ns: b,
        };
        assert_eq!(quantiles(&[p(5), p(1), p(3)]), Some((3, 5, 5)));
        assert_eq!(quantiles(&[]), None);
    }

    proptest! {
        /// Hostile points: nothing panics, whatever the values.
        #[test]
        fn hostile_points_do_not_panic(
            pts in proptest::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..20),
            from in any::<u64>(),
            to in any::<u64>(),
        ) {
            let pts: Vec<SyncPoint> = pts.into_iter().map(|(g, h, r)| pt(g, h, r)).collect();
            if let Some(fit) = Fit::best(&pts, 1_000_000_000, from, to) {
                let _ = (fit.bound_over(from, to), fit.points(), fit.mapping.ctf_offset());
                let _ = fit.bounds_in_force();
            }
        }

        /// Points within their round trips of a true line (fast and slow
        /// ones): the truth is within the chosen line's bound at every
        /// point and past the ends.
        #[test]
        fn the_bound_holds_for_random_exchanges(
            errs in proptest::collection::vec((-1.0f64..1.0, 200u64..5_000), 2..30),
            freq in 1_000_000_000u64..4_000_000_000,
        ) {
            let truth = |g: u64| 1_750_000_000_000_000_000i128 + g as i128 * 1_000_000_000 / freq as i128;
            let pts: Vec<SyncPoint> = errs.iter().enumerate().map(|(i, (e, rtt))| {
                let g = 10_000_000_000 + i as u64 * freq * 3;
                let off = (e * (*rtt as f64) / 2.0) as i128;
                pt(g, (truth(g) + off) as u64, *rtt)
            }).collect();
            let first = pts[0].host_ns;
            let last = pts[pts.len() - 1].host_ns;
            let (from, to) = (first - 1_000_000_000, last + 2_000_000_000);
            let fit = Fit::best(&pts, freq, from, to).unwrap();
            let over = fit.bound_over(from, to);
            for g in [pts[0].guest_ticks - freq, pts[0].guest_ticks, pts[pts.len() / 2].guest_ticks + freq / 3,
                      pts[pts.len() - 1].guest_ticks, pts[pts.len() - 1].guest_ticks + 2 * freq] {
                let e = (fit.mapping.realtime_ns(g) - truth(g)).unsigned_abs() as u64;
                prop_assert!(e <= over + 1, "error {} > bound {}", e, over);
            }
        }
    }
}
