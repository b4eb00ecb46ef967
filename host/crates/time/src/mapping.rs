//! The mapping from the writers' clock (ticks) to host wall-clock time,
//! and its CTF 1.8 clock-block form.
//!
//! How the mapping is estimated is the estimators' business
//! ([`crate::estimator`], [`crate::kvm`], [`crate::pingpong`]); this is the
//! result, which ivtrace-ctf writes as each trace's clock:
//!
//! ```text
//! realtime_ns(t) = ref_realtime_ns + (t - ref_ticks) * 1e9 / freq_hz
//! ```

use ivtrace_region::ns::NsScale;
use ivtrace_region::packet::TickRange;
use serde::{Deserialize, Serialize};

/// Seconds past the reference point that a cycle-only CTF offset must
/// still reach without overflowing int64 ([`ClockMapping::offset_fits_cycles`]).
const OFFSET_HEADROOM_S: i128 = 365 * 24 * 3600;

/// How far from its reference point a clock is asked to place timestamps
/// ([`ClockMapping::expressible`]): no recording spans a century, and
/// within it CTF readers' int64 nanoseconds (which end in 2262) leave the
/// final mapping, re-estimated while recording, decades of room.
const HORIZON_S: i128 = 100 * YEAR_S;
const YEAR_S: i128 = 365 * 24 * 3600;
const NS_PER_S: i128 = 1_000_000_000;

/// A linear tick -> realtime mapping with an error bound.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockMapping {
    /// Ticks per second.
    pub freq_hz: u64,
    /// A tick value ...
    pub ref_ticks: u64,
    /// ... and the CLOCK_REALTIME nanoseconds it corresponds to.
    pub ref_realtime_ns: u64,
    /// Bound on |mapped - true| in nanoseconds, as far as the method knows.
    pub error_ns: u64,
    /// How it was obtained, e.g. "loopback-tsc-fit", "header-reference".
    pub method: String,
    /// True when the bound is a guess rather than a measurement.
    pub coarse: bool,
    /// Samples the estimate is based on.
    pub samples: u32,
}

impl ClockMapping {
    /// CTF's `offset_s` and `offset` (cycles):
    /// `ns_from_origin = (offset_s + (offset + value) / freq) * 1e9`.
    ///
    /// The whole offset is in `offset` (`offset_s = 0`) whenever
    /// [`offset_fits_cycles`](Self::offset_fits_cycles): Trace Compass
    /// before 6.3 reads only `offset` (a signed 64-bit cycle count) and
    /// would put a date kept in `offset_s` in January 1970; babeltrace 1
    /// and 2 read both. Otherwise (a clock past ~5 GHz in the 2020s, or a
    /// mapping before the epoch) the offset is split into whole seconds
    /// and cycles in [0, freq), exact for every reader that honours
    /// `offset_s`.
    pub fn ctf_offset(&self) -> (i64, u64) {
        let origin_cycles = self.origin_cycles();
        if self.offset_fits_cycles() {
            return (0, origin_cycles as u64);
        }
        let freq = self.freq_hz.max(1) as i128;
        let offset_s = origin_cycles.div_euclid(freq);
        let offset = origin_cycles.rem_euclid(freq);
        (offset_s as i64, offset as u64)
    }

    /// True when the whole offset fits CTF's `offset` as a cycle count
    /// that every CTF 1.8 reader takes: not negative (babeltrace 1 reads
    /// it unsigned), and small enough that a reader adding it to a
    /// timestamp in signed 64-bit arithmetic (Trace Compass) cannot
    /// overflow for a year after the reference point. For a 3 GHz TSC
    /// that holds for dates until 2066, for 5 GHz until 2027.
    pub fn offset_fits_cycles(&self) -> bool {
        let freq = self.freq_hz.max(1) as i128;
        let origin_cycles = self.origin_cycles();
        let year_after_ref = self.ref_ticks as i128 + freq * OFFSET_HEADROOM_S;
        origin_cycles >= 0 && origin_cycles + year_after_ref <= i64::MAX as i128
    }

    /// The clock value at the epoch, negated: realtime cycles at the
    /// reference point minus the reference tick value.
    fn origin_cycles(&self) -> i128 {
        // u64 * u64 fits in u128; divided by 1e9 it fits in i128.
        let epoch_cycles =
            (self.ref_realtime_ns as u128 * self.freq_hz.max(1) as u128 / 1_000_000_000) as i128;
        epoch_cycles - self.ref_ticks as i128
    }

    /// The tick values this clock places on every reader's timeline, the
    /// one rule the drain's timestamp validation follows (docs/hardening.md,
    /// "Timestamps"); it depends only on how ticks become a reader's time,
    /// so a change of the CTF clock changes this function alone:
    ///
    /// - nanoseconds from the origin within int64, less a year (babeltrace2
    ///   refuses a whole trace with one timestamp past it), not before the
    ///   epoch (the kernel trace's clock counts nanoseconds since the epoch
    ///   in unsigned values, [`Self::ns_value`]), and within a century
    ///   (`HORIZON_S`) of the reference point;
    /// - while the offset is in cycles ([`Self::offset_fits_cycles`]), the
    ///   offset plus the value within int64 less a year of cycles (Trace
    ///   Compass adds them as signed 64-bit cycles).
    pub fn expressible(&self) -> TickRange {
        let freq = i128::from(self.freq_hz.max(1));
        let ref_ns = i128::from(self.ref_realtime_ns);
        let year_ns = YEAR_S * NS_PER_S;
        let horizon_ns = HORIZON_S * NS_PER_S;
        let hi_ns = (i128::from(i64::MAX) - year_ns).min(ref_ns.saturating_add(horizon_ns));
        let lo_ns = ref_ns.saturating_sub(horizon_ns).max(0);
        // ticks(ns) = ref_ticks + (ns - ref_ns) * freq / 1e9, saturating
        // (a u64 frequency times 2^65 ns can pass i128).
        let ticks_at = |ns: i128| {
            ns.saturating_sub(ref_ns)
                .saturating_mul(freq)
                .checked_div(NS_PER_S)
                .unwrap_or(0)
                .saturating_add(i128::from(self.ref_ticks))
        };
        let mut max = ticks_at(hi_ns);
        if self.offset_fits_cycles() {
            let room = i128::from(i64::MAX)
                .saturating_sub(freq.saturating_mul(YEAR_S))
                .saturating_sub(self.origin_cycles());
            max = max.min(room);
        }
        let min = ticks_at(lo_ns).max(0);
        if max < min {
            // A reference at the end of time (a guest's header says
            // anything): nothing this clock maps fits a reader.
            return TickRange {
                min: u64::MAX,
                max: 0,
            };
        }
        let clamp = |t: i128| u64::try_from(t).unwrap_or(u64::MAX);
        TickRange {
            min: clamp(min),
            max: clamp(max),
        }
    }

    /// The error bound in clock cycles (CTF `precision`), at least 1.
    pub fn precision_cycles(&self) -> u64 {
        let cycles = self.error_ns as u128 * self.freq_hz as u128 / 1_000_000_000;
        cycles.clamp(1, u64::MAX as u128) as u64
    }

    /// The conversion of ticks to a 1 GHz clock's values
    /// (`ivtrace_region::ns`, the one definition: the drain's rewrite of
    /// the user trace uses it as well).
    pub fn ns_scale(&self) -> NsScale {
        NsScale::new(self.freq_hz, self.ref_ticks, self.ref_realtime_ns)
    }

    /// Wall-clock nanoseconds of tick value `ticks`:
    /// `ref_realtime_ns + (ticks - ref_ticks) * 1e9 / freq_hz`, the
    /// quotient rounded down ([`NsScale::realtime_ns`]).
    #[inline]
    pub fn realtime_ns(&self, ticks: u64) -> i128 {
        self.ns_scale().realtime_ns(ticks)
    }

    /// Tick value `ticks` as a value of a 1 GHz CTF clock with offset 0:
    /// its wall-clock nanoseconds since the epoch, exact to the mapping
    /// (integer arithmetic, no double). None where no such clock value
    /// exists (before the epoch, past int64), which the drain's validation
    /// ([`Self::expressible`]) keeps out for the mapping in force; a later
    /// mapping may still move a tick at the edge out, which the caller
    /// counts.
    pub fn ns_value(&self, ticks: u64) -> Option<u64> {
        self.ns_scale().ns(ticks)
    }

    /// Nanoseconds spanned by `ticks` ticks.
    pub fn ticks_to_ns(&self, ticks: u64) -> f64 {
        ticks as f64 * 1e9 / self.freq_hz.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(freq_hz: u64, ref_ticks: u64, ref_realtime_ns: u64) -> ClockMapping {
        ClockMapping {
            freq_hz,
            ref_ticks,
            ref_realtime_ns,
            error_ns: 250,
            method: "test".into(),
            coarse: false,
            samples: 1,
        }
    }

    /// What a reader computes from the clock block, exactly.
    fn reader_ns(m: &ClockMapping, ticks: u64) -> i128 {
        let (s, off) = m.ctf_offset();
        (s as i128 * 1_000_000_000)
            + (off as i128 + ticks as i128) * 1_000_000_000 / m.freq_hz as i128
    }

    /// 2026-11-24, a date this code meets in practice.
    const NOV_2026_NS: u64 = 1_795_500_000_000_000_000;

    #[test]
    fn ctf_offset_reproduces_the_mapping() {
        for freq in [1_000_000_000, 2_400_000_000, 5_500_000_000] {
            let m = mapping(freq, 123_456_789_000, NOV_2026_NS + 123_456_789);
            for t in [m.ref_ticks, m.ref_ticks + freq * 7 + 5] {
                let got = reader_ns(&m, t);
                assert!(
                    (got - m.realtime_ns(t)).abs() <= 1,
                    "{freq} Hz: {got} vs {}",
                    m.realtime_ns(t)
                );
            }
        }
    }

    #[test]
    fn a_2026_date_is_all_in_offset_up_to_5_ghz() {
        for freq in [
            1_000_000_000,
            2_400_000_000,
            3_500_000_000,
            4_500_000_000,
            5_000_000_000,
        ] {
            let m = mapping(freq, 9_000_000_000_000, NOV_2026_NS);
            assert!(m.offset_fits_cycles(), "{freq} Hz");
            let (s, off) = m.ctf_offset();
            assert_eq!(s, 0, "{freq} Hz");
            assert!(off <= i64::MAX as u64, "{freq} Hz: {off}");
            // a reader adding a timestamp a day later in i64 does not overflow
            assert!((off as i64)
                .checked_add((m.ref_ticks + freq * 86_400) as i64)
                .is_some());
        }
    }

    #[test]
    fn an_offset_past_int64_falls_back_to_seconds_and_cycles() {
        // 5.5 GHz x 1.8e9 s is 9.9e18 cycles > i64::MAX
        let m = mapping(5_500_000_000, 9_000_000_000_000, NOV_2026_NS);
        assert!(!m.offset_fits_cycles());
        let (s, off) = m.ctf_offset();
        assert!(s > 1_795_000_000 && off < m.freq_hz, "{s} {off}");
    }

    #[test]
    fn the_cycle_offset_fits_until_the_documented_years() {
        // 3 GHz: until 2066 (i64::MAX cycles is 2067.4, less a year of headroom)
        let year = 365 * 86_400 * 1_000_000_000u64;
        let at = |years_after_1970: u64| mapping(3_000_000_000, 0, years_after_1970 * year);
        assert!(at(2066 - 1970).offset_fits_cycles());
        assert!(!at(2067 - 1970).offset_fits_cycles());
        let at5 = |years_after_1970: u64| mapping(5_000_000_000, 0, years_after_1970 * year);
        assert!(at5(2027 - 1970).offset_fits_cycles());
        assert!(!at5(2028 - 1970).offset_fits_cycles());
    }

    #[test]
    fn offset_is_normalized_when_ticks_exceed_the_epoch_offset() {
        let m = mapping(1_000_000_000, 5_000_000_000, 1_000_000_000);
        assert_eq!(m.ctf_offset(), (-4, 0));
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let m = mapping(u64::MAX, u64::MAX, u64::MAX);
        let _ = (
            m.ctf_offset(),
            m.precision_cycles(),
            m.realtime_ns(0),
            m.realtime_ns(u64::MAX),
        );
    }

    /// What a reader computes for the range's ends fits int64 nanoseconds
    /// (and int64 cycles while the offset is in cycles); a century of
    /// ticks past the reference is out (issue 23, case 2).
    #[test]
    fn the_expressible_range_is_what_readers_can_place() {
        for freq in [1_000_000_000, 2_400_000_000, 5_500_000_000] {
            let m = mapping(freq, 123_456_789_000, NOV_2026_NS);
            let r = m.expressible();
            assert!(
                r.min <= m.ref_ticks && m.ref_ticks <= r.max,
                "{freq}: {r:?}"
            );
            assert!(reader_ns(&m, r.max) <= i64::MAX as i128, "{freq}");
            if m.offset_fits_cycles() {
                assert!(m.ctf_offset().1 as i128 + r.max as i128 <= i64::MAX as i128);
            }
            let decades = m.ref_ticks + freq * 3600 * 24 * 365 * 30;
            assert!(r.contains(decades), "{freq}: 30 years of uptime fit");
            let century_and_half = (m.ref_ticks as u128 + freq as u128 * 3600 * 24 * 365 * 150)
                .min(u64::MAX as u128) as u64;
            assert!(!r.contains(century_and_half), "{freq}: 150 years do not");
            assert!(!r.contains(u64::MAX));
        }
        // a reference at the end of time: nothing fits
        let r = mapping(1_000_000_000, 0, u64::MAX).expressible();
        assert!(!r.contains(0) && !r.contains(u64::MAX), "{r:?}");
        let _ = mapping(u64::MAX, u64::MAX, u64::MAX).expressible();
        let _ = mapping(1, u64::MAX, 0).expressible();
    }

    #[test]
    fn ns_values_are_the_mapping_and_refuse_what_has_none() {
        let m = mapping(2_400_000_000, 123_456_789_000, NOV_2026_NS);
        for t in [
            m.ref_ticks,
            m.ref_ticks + 1,
            m.ref_ticks + 2_400_000_007 * 3,
        ] {
            assert_eq!(m.ns_value(t).map(i128::from), Some(m.realtime_ns(t)));
        }
        // 1/2.4 ns a tick: consecutive ticks may share a nanosecond, never go back
        let ns: Vec<u64> = (0..10)
            .map(|i| m.ns_value(m.ref_ticks + i).unwrap())
            .collect();
        assert!(ns.windows(2).all(|w| w[0] <= w[1]), "{ns:?}");
        assert!(
            matches!(ns[9] - ns[0], 3 | 4),
            "9 ticks are 3.75 ns: {ns:?}"
        );
        // before the epoch, past int64: no value
        let early = mapping(1_000_000_000, 5_000_000_000, 1_000_000_000);
        assert_eq!(early.ns_value(0), None);
        assert_eq!(early.ns_value(4_000_000_000), Some(0));
        assert_eq!(mapping(1, 0, 0).ns_value(u64::MAX), None);
        let _ = mapping(u64::MAX, u64::MAX, u64::MAX).ns_value(0);
        // whatever the drain lets through, the same mapping gives a value for
        for freq in [1_000_000_000, 2_400_000_000, 5_500_000_000] {
            let m = mapping(freq, 123_456_789_000, NOV_2026_NS);
            let r = m.expressible();
            assert!(
                m.ns_value(r.min).is_some() && m.ns_value(r.max).is_some(),
                "{freq}"
            );
        }
        let r = mapping(1_000_000_000, 5_000_000_000, 1_000_000_000).expressible();
        assert_eq!(r.min, 4_000_000_000, "{r:?}");
    }

    /// The split computation is the plain 128-bit formula, to the ns,
    /// rounded down on both sides of the reference point.
    #[test]
    fn realtime_ns_is_the_128_bit_formula() {
        let plain = |m: &ClockMapping, t: u64| {
            let delta = t as i128 - m.ref_ticks as i128;
            m.ref_realtime_ns as i128 + (delta * 1_000_000_000).div_euclid(m.freq_hz.max(1) as i128)
        };
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let freqs = [
            1,
            999_999_999,
            1_000_000_000,
            2_400_000_007,
            19_000_000_000,
            u64::MAX,
        ];
        for _ in 0..20_000 {
            let f = freqs[(next() % freqs.len() as u64) as usize];
            let m = mapping(f, next() >> (next() % 64), next() >> (next() % 64));
            for t in [next() >> (next() % 64), m.ref_ticks, 0, u64::MAX] {
                assert_eq!(m.realtime_ns(t), plain(&m, t), "{m:?} at {t}");
            }
        }
    }

    #[test]
    fn precision_is_in_cycles() {
        assert_eq!(mapping(2_000_000_000, 0, 0).precision_cycles(), 500);
    }
}
