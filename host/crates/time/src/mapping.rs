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

use serde::{Deserialize, Serialize};

/// Seconds past the reference point that a cycle-only CTF offset must
/// still reach without overflowing int64 ([`ClockMapping::offset_fits_cycles`]).
const OFFSET_HEADROOM_S: i128 = 365 * 24 * 3600;

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

    /// The error bound in clock cycles (CTF `precision`), at least 1.
    pub fn precision_cycles(&self) -> u64 {
        let cycles = self.error_ns as u128 * self.freq_hz as u128 / 1_000_000_000;
        cycles.clamp(1, u64::MAX as u128) as u64
    }

    /// Wall-clock nanoseconds of tick value `ticks`.
    pub fn realtime_ns(&self, ticks: u64) -> i128 {
        let delta = ticks as i128 - self.ref_ticks as i128;
        self.ref_realtime_ns as i128 + delta * 1_000_000_000 / self.freq_hz.max(1) as i128
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

    #[test]
    fn precision_is_in_cycles() {
        assert_eq!(mapping(2_000_000_000, 0, 0).precision_cycles(), 500);
    }
}
