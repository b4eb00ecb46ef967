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

/// A linear tick -> realtime mapping with an error bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// CTF's `offset_s` and `offset` (cycles, normalized to [0, freq)):
    /// `ns_from_origin = (offset_s + (offset + value) / freq) * 1e9`.
    pub fn ctf_offset(&self) -> (i64, u64) {
        let freq = self.freq_hz.max(1) as i128;
        // u64 * u64 fits in u128; divided by 1e9 it fits in i128.
        let epoch_cycles =
            (self.ref_realtime_ns as u128 * self.freq_hz.max(1) as u128 / 1_000_000_000) as i128;
        let origin_cycles = epoch_cycles - self.ref_ticks as i128;
        let offset_s = origin_cycles.div_euclid(freq);
        let offset = origin_cycles.rem_euclid(freq);
        (offset_s as i64, offset as u64)
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

    #[test]
    fn ctf_offset_reproduces_the_mapping() {
        let m = mapping(2_400_000_000, 123_456_789_000, 1_700_000_000_123_456_789);
        let (s, off) = m.ctf_offset();
        assert!(off < m.freq_hz);
        for t in [m.ref_ticks, m.ref_ticks + 2_400_000_000 * 7 + 5] {
            let ctf_ns = (s as i128 * 1_000_000_000)
                + (off as i128 + t as i128) * 1_000_000_000 / m.freq_hz as i128;
            assert!(
                (ctf_ns - m.realtime_ns(t)).abs() <= 1,
                "{ctf_ns} vs {}",
                m.realtime_ns(t)
            );
        }
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
