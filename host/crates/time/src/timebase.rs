//! The host time base every host-side timestamp uses: CLOCK_MONOTONIC
//! shifted onto CLOCK_REALTIME by one offset measured when the process
//! first asks for it.
//!
//! Why not CLOCK_REALTIME itself: it can step (NTP, an administrator),
//! which would make host streams go backwards and break the fits of
//! [`crate::pingpong`]. Why not raw CLOCK_MONOTONIC: CTF clocks, the guest
//! traces' mappings and the tracefs `mono` clock must all land on one
//! absolute base that babeltrace2 can merge and people can read as dates.
//! So: `host_ns = monotonic_ns + offset`, with `offset = realtime -
//! monotonic` taken once from the tightest of a burst of paired reads.
//! tracefs's `mono` trace clock is `ktime_get_mono_fast_ns()`, the same
//! CLOCK_MONOTONIC, so host kernel events convert with the same offset.

use std::sync::OnceLock;

use nix::time::{clock_gettime, ClockId};

fn read(clock: ClockId) -> u64 {
    // clock_gettime on MONOTONIC/REALTIME cannot fail on Linux; a zero
    // would only make the offset meaningless, never unsafe.
    clock_gettime(clock).map_or(0, |t| {
        (t.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec() as u64)
    })
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn mono_ns() -> u64 {
    read(ClockId::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in nanoseconds since the epoch.
pub fn realtime_ns() -> u64 {
    read(ClockId::CLOCK_REALTIME)
}

/// The monotonic -> realtime offset of this process.
#[derive(Debug, Clone, Copy)]
pub struct TimeBase {
    /// realtime - monotonic, nanoseconds.
    pub offset_ns: i64,
    /// Half the gap between the two monotonic reads around the realtime
    /// read that gave the offset: the offset's own uncertainty.
    pub error_ns: u64,
}

static BASE: OnceLock<TimeBase> = OnceLock::new();

/// Measures realtime - monotonic: the pair with the smallest monotonic
/// gap around a realtime read, out of 64.
pub fn measure() -> TimeBase {
    let mut best = (u64::MAX, 0i64);
    for _ in 0..64 {
        let a = mono_ns();
        let r = realtime_ns();
        let b = mono_ns();
        let gap = b.saturating_sub(a);
        if gap < best.0 {
            let mid = a + gap / 2;
            best = (gap, r as i64 - mid as i64);
        }
    }
    TimeBase {
        offset_ns: best.1,
        error_ns: best.0 / 2 + 1,
    }
}

/// This process's time base (measured on first use).
pub fn base() -> TimeBase {
    *BASE.get_or_init(measure)
}

/// A CLOCK_MONOTONIC value on the host time base.
pub fn mono_to_host(mono: u64) -> u64 {
    (mono as i128 + base().offset_ns as i128).clamp(0, u64::MAX as i128) as u64
}

/// Now, on the host time base (nanoseconds, realtime-aligned).
pub fn host_now_ns() -> u64 {
    mono_to_host(mono_ns())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_time_is_realtime_aligned_and_monotonic() {
        let a = host_now_ns();
        let r = realtime_ns();
        let b = host_now_ns();
        assert!(b >= a);
        // Same base as realtime within a few ms (the machine may be busy).
        assert!((r as i128 - a as i128).abs() < 50_000_000, "{a} vs {r}");
        assert!(base().error_ns < 10_000_000);
    }
}
