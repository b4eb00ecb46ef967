//! Estimating the writer-clock -> host-realtime mapping.
//!
//! [`ClockEstimator`] is the seam every estimator implements: here the
//! loopback estimator (writers on this host read the same TSC: sample
//! rdtsc/CLOCK_REALTIME pairs at start and end, fit frequency and offset)
//! and the header's reference pair as a coarse fallback; KVM's TSC offset
//! ([`crate::kvm`]) and the ping-pong ([`crate::pingpong`]) are the others.

use std::time::Duration;

use ivtrace_region::region::{ClockRef, Header};
use ivtrace_region::Region;

use crate::mapping::ClockMapping;
use crate::pingpong::SyncPoint;
use crate::timebase::realtime_ns;

/// Samples per burst; the one with the smallest rdtsc gap wins.
const BURST: usize = 64;
/// Shortest start-to-end span over which a frequency fit is trusted.
const MIN_FIT_SPAN_NS: u64 = 200_000_000;
/// Error assumed for a mapping nobody measured.
const COARSE_ERROR_NS: u64 = 1_000_000;
/// Writer clock frequencies believed (the header is guest-written).
const FREQ_PLAUSIBLE: std::ops::RangeInclusive<u64> = 1_000..=100_000_000_000;
/// Used when the header's frequency is not plausible.
const FREQ_FALLBACK: u64 = 1_000_000_000;

/// Latest reference date believed (2160): a century before CTF readers'
/// int64 nanoseconds end, so that the clock can express a recording's
/// timestamps ([`ClockMapping::expressible`]).
const REF_REALTIME_PLAUSIBLE_MAX: u64 = 5_995_000_000_000_000_000;

/// The header's reference date if plausible, else now (the header is
/// guest-written: a date past the end of readers' time would leave the
/// clock nothing it can express).
pub(crate) fn plausible_ref_realtime(ns: u64) -> u64 {
    if ns <= REF_REALTIME_PLAUSIBLE_MAX {
        ns
    } else {
        realtime_ns()
    }
}

/// The header's frequency if plausible, else 1 GHz.
pub(crate) fn plausible_freq(freq_hz: u64) -> u64 {
    if FREQ_PLAUSIBLE.contains(&freq_hz) {
        freq_hz
    } else {
        FREQ_FALLBACK
    }
}

/// Produces a clock mapping at the start of a recording and a final one
/// at its end.
pub trait ClockEstimator: Send {
    /// The mapping to use while recording.
    fn initial(&self) -> ClockMapping;
    /// The final mapping, with everything learnt during the recording.
    fn finish(&mut self) -> ClockMapping;
}

/// A clock as a recording drives it: the mapping to write with, exchanges
/// with the writer while recording (the ping-pong's bursts), the final
/// mapping. Every [`ClockEstimator`] is one that never exchanges.
pub trait ClockSync {
    /// The mapping to use while recording.
    fn initial_mapping(&self) -> ClockMapping;
    /// The mapping in force now, with what the exchanges so far taught
    /// (the drain converts the user streams' times with it). The initial
    /// mapping by default: [`ClockSync::initial_mapping`] of a clock that
    /// exchanges already is its best line through the points so far.
    fn current_mapping(&self) -> ClockMapping {
        self.initial_mapping()
    }
    /// Time until the next exchange is due (None: this clock never
    /// exchanges).
    fn until_due(&self) -> Option<Duration> {
        None
    }
    /// Runs the exchange that is due; the point it kept, if any.
    fn exchange(&mut self, _region: &Region) -> Option<SyncPoint> {
        None
    }
    /// The final mapping. `writer_may_answer`: a last exchange is worth
    /// trying (the writer was not gone when the recording ended).
    fn final_mapping(&mut self, region: &Region, writer_may_answer: bool) -> ClockMapping;
    /// How the mapping was measured, for the sidecar's `clock_sync`
    /// (`mapping`: the final one). None for a clock that never exchanges.
    fn sync_section(&self, _mapping: &ClockMapping) -> Option<crate::guest::ClockSyncSection> {
        None
    }
}

impl<E: ClockEstimator + ?Sized> ClockSync for E {
    fn initial_mapping(&self) -> ClockMapping {
        self.initial()
    }
    fn final_mapping(&mut self, _region: &Region, _writer_may_answer: bool) -> ClockMapping {
        self.finish()
    }
}

impl ClockEstimator for Box<dyn ClockEstimator> {
    fn initial(&self) -> ClockMapping {
        (**self).initial()
    }
    fn finish(&mut self) -> ClockMapping {
        (**self).finish()
    }
}

/// Picks the best estimator the region allows.
pub fn estimator_for(header: &Header) -> Box<dyn ClockEstimator> {
    if header.is_loopback() && tsc_available() {
        Box::new(LoopbackTscFit::start(header.clock))
    } else {
        Box::new(HeaderReference {
            clock: header.clock,
        })
    }
}

/// The formatter's (ticks, realtime) pair and measured frequency.
pub struct HeaderReference {
    pub clock: ClockRef,
}

impl ClockEstimator for HeaderReference {
    fn initial(&self) -> ClockMapping {
        ClockMapping {
            freq_hz: plausible_freq(self.clock.freq_hz),
            ref_ticks: self.clock.ref_ticks,
            ref_realtime_ns: plausible_ref_realtime(self.clock.ref_realtime_ns),
            error_ns: COARSE_ERROR_NS,
            method: "header-reference".into(),
            coarse: true,
            samples: 1,
        }
    }

    fn finish(&mut self) -> ClockMapping {
        self.initial()
    }
}

/// One (tsc, realtime) pair: the TSC midpoint around a realtime read.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub tsc: u64,
    pub realtime_ns: u64,
    /// TSC ticks between the two rdtsc around the realtime read.
    pub gap_ticks: u64,
}

#[cfg(target_arch = "x86_64")]
fn tsc_available() -> bool {
    true
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc_available() -> bool {
    false
}

/// This CPU's time stamp counter (0 where there is none).
#[cfg(target_arch = "x86_64")]
pub(crate) fn rdtsc() -> u64 {
    // SAFETY: rdtsc exists on every x86_64 CPU, reads a counter and has
    // no memory effects (the one use of unsafe outside shared memory).
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn rdtsc() -> u64 {
    0
}

/// The sample of a burst whose two rdtsc are closest together.
pub fn min_gap_sample() -> Sample {
    (0..BURST)
        .map(|_| {
            let t0 = rdtsc();
            let rt = realtime_ns();
            let t1 = rdtsc();
            Sample {
                tsc: t0 + (t1.saturating_sub(t0)) / 2,
                realtime_ns: rt,
                gap_ticks: t1.saturating_sub(t0),
            }
        })
        .min_by_key(|s| s.gap_ticks)
        .expect("BURST > 0")
}

/// Loopback: the writers' TSC is this host's TSC.
pub struct LoopbackTscFit {
    header: ClockRef,
    start: Sample,
}

impl LoopbackTscFit {
    pub fn start(header: ClockRef) -> LoopbackTscFit {
        LoopbackTscFit {
            header,
            start: min_gap_sample(),
        }
    }

    fn header_freq(&self) -> u64 {
        plausible_freq(self.header.freq_hz)
    }

    fn gap_ns(&self, gap_ticks: u64, freq: u64) -> u64 {
        (gap_ticks as u128 * 1_000_000_000 / freq.max(1) as u128) as u64
    }
}

impl ClockEstimator for LoopbackTscFit {
    fn initial(&self) -> ClockMapping {
        let freq = self.header_freq();
        ClockMapping {
            freq_hz: freq,
            ref_ticks: self.start.tsc,
            ref_realtime_ns: self.start.realtime_ns,
            error_ns: self.gap_ns(self.start.gap_ticks, freq) / 2 + 1,
            method: "loopback-tsc (header frequency)".into(),
            coarse: true,
            samples: BURST as u32,
        }
    }

    fn finish(&mut self) -> ClockMapping {
        let end = min_gap_sample();
        let span_ns = end.realtime_ns.saturating_sub(self.start.realtime_ns);
        let span_ticks = end.tsc.saturating_sub(self.start.tsc);
        if span_ns < MIN_FIT_SPAN_NS || span_ticks == 0 {
            return self.initial();
        }
        let freq = (span_ticks as u128 * 1_000_000_000 / span_ns as u128) as u64;
        let gap = self.start.gap_ticks.max(end.gap_ticks);
        ClockMapping {
            freq_hz: freq,
            ref_ticks: self.start.tsc,
            ref_realtime_ns: self.start.realtime_ns,
            // Both fit points are within half a gap of the truth, so is
            // every interpolated point (plus one tick of rounding).
            error_ns: self.gap_ns(gap, freq) / 2 + self.gap_ns(1, freq) + 1,
            method: "loopback-tsc-fit".into(),
            coarse: false,
            samples: 2 * BURST as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_reference_is_marked_coarse() {
        let m = HeaderReference {
            clock: ClockRef {
                freq_hz: 0,
                source: 1,
                ref_ticks: 5,
                ref_realtime_ns: 7,
            },
        }
        .initial();
        assert!(m.coarse);
        assert_eq!(
            (m.freq_hz, m.ref_ticks, m.ref_realtime_ns),
            (1_000_000_000, 5, 7)
        );
        let hostile = HeaderReference {
            clock: ClockRef {
                freq_hz: u64::MAX,
                ..Default::default()
            },
        };
        assert_eq!(hostile.initial().freq_hz, FREQ_FALLBACK);
        // A reference date past the end of readers' time: now instead,
        // and the clock expresses the ticks around its reference again.
        let past_2262 = HeaderReference {
            clock: ClockRef {
                freq_hz: 1_000_000_000,
                ref_ticks: 1 << 40,
                ref_realtime_ns: u64::MAX,
                ..Default::default()
            },
        }
        .initial();
        assert!(past_2262.ref_realtime_ns <= REF_REALTIME_PLAUSIBLE_MAX);
        assert!(past_2262.expressible().contains(1 << 40));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn loopback_fit_recovers_the_tsc_frequency() {
        let mut fit = LoopbackTscFit::start(ClockRef {
            freq_hz: 5_000,
            ..Default::default()
        });
        let (t0, i0) = (rdtsc(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(250));
        let (t1, i1) = (rdtsc(), std::time::Instant::now());
        let independent = (t1 - t0) as f64 / (i1 - i0).as_secs_f64();
        let m = fit.finish();
        assert_eq!(m.method, "loopback-tsc-fit");
        assert!(!m.coarse);
        let rel = (m.freq_hz as f64 - independent).abs() / independent;
        assert!(
            rel < 0.01,
            "fit {} Hz vs monotonic-clock estimate {independent} Hz",
            m.freq_hz
        );
        assert!(m.error_ns < 100_000, "error bound {} ns", m.error_ns);
    }

    #[test]
    fn implausible_header_frequencies_fall_back() {
        assert_eq!(plausible_freq(0), FREQ_FALLBACK);
        assert_eq!(plausible_freq(u64::MAX), FREQ_FALLBACK);
        assert_eq!(plausible_freq(2_600_000_000), 2_600_000_000);
    }
}
