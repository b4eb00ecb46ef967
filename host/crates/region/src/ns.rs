//! Writer ticks as values of a 1 GHz CTF clock: nanoseconds since the
//! epoch, exact to the mapping, in integers.
//!
//! ```text
//! ns(t) = ref_ns + floor((t - ref_ticks) * 1e9 / freq)
//! ```
//!
//! The one definition of that conversion: ivtrace-time's
//! `ClockMapping::ns_value` (the kernel trace, at the end) and the drain's
//! in-place rewrite of user packets ([`crate::retime::Retimer`]) both call
//! [`NsScale::ns`], so a tick has one nanosecond value in every trace.
//! The drain converts each event from its packet's [`Anchor`]: one
//! 128-bit division per packet, then per event a multiply by a
//! precomputed reciprocal and one correction, no division.

/// Nanoseconds per second.
const NS_PER_S: u64 = 1_000_000_000;

/// The largest value a CTF reader takes (babeltrace2 and Trace Compass
/// read clock values as int64 nanoseconds).
pub const NS_MAX: u64 = i64::MAX as u64;

/// A linear tick -> nanosecond mapping (a `ClockMapping`'s frequency and
/// reference point).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsScale {
    freq: u64,
    ref_ticks: u64,
    ref_ns: u64,
    /// floor((2^64 - 1) / freq): the reciprocal [`Anchor::ns`] multiplies
    /// by instead of dividing.
    inv: u64,
    /// The largest tick distance from an anchor its fast path takes:
    /// `d * 1e9 + rem` fits u64 (`rem < freq`).
    reach: u64,
}

impl NsScale {
    /// `freq_hz` ticks per second (0 is taken as 1), tick `ref_ticks` at
    /// `ref_ns` nanoseconds since the epoch.
    pub fn new(freq_hz: u64, ref_ticks: u64, ref_ns: u64) -> NsScale {
        let freq = freq_hz.max(1);
        NsScale {
            freq,
            ref_ticks,
            ref_ns,
            inv: u64::MAX.checked_div(freq).unwrap_or(0),
            reach: u64::MAX
                .saturating_sub(freq)
                .checked_div(NS_PER_S)
                .unwrap_or(0),
        }
    }

    /// `ref_ns + (t - ref_ticks) * 1e9 / freq`, the quotient rounded down
    /// (toward earlier times on both sides of the reference point). The
    /// kernel expansion converts every event with it, so the common case
    /// avoids a 128-bit division: whole seconds of ticks first, then the
    /// rest, whose product with 1e9 fits u64 below 18 GHz; exact either
    /// way.
    #[inline]
    pub fn realtime_ns(&self, t: u64) -> i128 {
        let freq = self.freq;
        let (back, d) = match t.checked_sub(self.ref_ticks) {
            Some(d) => (false, d),
            None => (true, self.ref_ticks.saturating_sub(t)),
        };
        // freq >= 1 (new): the divisions cannot fail.
        #[allow(clippy::arithmetic_side_effects)]
        let (secs, rest) = (d / freq, d % freq);
        // rest < freq: rest * 1e9 < 2^94 in u128; the quotient < 1e9.
        #[allow(clippy::arithmetic_side_effects)]
        let (frac, exact) = match rest.checked_mul(NS_PER_S) {
            Some(p) => (u128::from(p / freq), p % freq == 0),
            None => {
                let p = u128::from(rest) * u128::from(NS_PER_S);
                (p / u128::from(freq), p % u128::from(freq) == 0)
            }
        };
        // secs < 2^64, times 1e9 < 2^94; frac < 1e9.
        #[allow(clippy::arithmetic_side_effects)]
        let delta = i128::from(secs) * i128::from(NS_PER_S) + frac as i128;
        #[allow(clippy::arithmetic_side_effects)]
        let delta = match back {
            false => delta,
            // Rounded down: a fraction of a nanosecond before is one more.
            true => -(delta + i128::from(!exact)),
        };
        #[allow(clippy::arithmetic_side_effects)]
        let ns = i128::from(self.ref_ns) + delta;
        ns
    }

    /// The clock value of tick `t`; None before the epoch or past
    /// [`NS_MAX`] (no CTF reader could show it).
    pub fn ns(&self, t: u64) -> Option<u64> {
        u64::try_from(self.realtime_ns(t))
            .ok()
            .filter(|&ns| ns <= NS_MAX)
    }

    /// [`Self::ns`], saturated to the values a reader takes (a time the
    /// host makes up, such as an empty packet's, where none exists).
    pub fn ns_saturating(&self, t: u64) -> u64 {
        u64::try_from(self.realtime_ns(t).clamp(0, i128::from(NS_MAX))).unwrap_or(NS_MAX)
    }

    /// A tick no later than any tick whose value is `ns` (within a
    /// nanosecond's worth of ticks of them): where a stream written in
    /// nanoseconds left off, in ticks (`ivtrace record --resume`), for
    /// checks that must not refuse what follows it.
    pub fn ticks_at(&self, ns: u64) -> u64 {
        // |d| < 2^64 and freq < 2^64: the product fits i128.
        #[allow(clippy::arithmetic_side_effects)]
        let d = i128::from(ns) - i128::from(self.ref_ns);
        #[allow(clippy::arithmetic_side_effects)]
        let t = i128::from(self.ref_ticks)
            + (d * i128::from(self.freq)).div_euclid(i128::from(NS_PER_S));
        u64::try_from(t.max(0)).unwrap_or(u64::MAX)
    }

    /// The exact conversion from tick `t` on, cheap for the ticks shortly
    /// after it (a packet's events after its timestamp_begin). None when
    /// `t` has no value.
    pub fn anchor(&self, t: u64) -> Option<Anchor> {
        let ns = self.ns(t)?;
        // As in realtime_ns; the remainder is in [0, freq).
        #[allow(clippy::arithmetic_side_effects)]
        let d = i128::from(t) - i128::from(self.ref_ticks);
        #[allow(clippy::arithmetic_side_effects)]
        let rem = (d * i128::from(NS_PER_S)).rem_euclid(i128::from(self.freq));
        Some(Anchor {
            ticks: t,
            ns,
            rem: u64::try_from(rem).ok()?,
            scale: *self,
        })
    }
}

/// [`NsScale::ns`] around one tick value: `ns(t)` for `t >= ticks` is
/// `ns + floor((rem + (t - ticks) * 1e9) / freq)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    ticks: u64,
    ns: u64,
    /// `(ticks - ref_ticks) * 1e9 mod freq`.
    rem: u64,
    scale: NsScale,
}

impl Anchor {
    /// The anchor's tick.
    pub fn ticks(&self) -> u64 {
        self.ticks
    }

    /// The value of the anchor's own tick.
    pub fn anchor_ns(&self) -> u64 {
        self.ns
    }

    /// [`NsScale::ns`] of `t`, equal to it for every `t`.
    pub fn ns(&self, t: u64) -> Option<u64> {
        Some(self.ns_or_over(t)).filter(|&ns| ns <= NS_MAX)
    }

    /// [`NsScale::ns`] of `t` as one number, above [`NS_MAX`] when `t` has
    /// no value: the drain's walk converts every event with it and checks
    /// the last time only (times in a packet never go back). The common
    /// case (`t` at most ~18 s of ticks past the anchor) divides by
    /// multiplying with the reciprocal: its estimate is the quotient or
    /// one less, and one comparison corrects it.
    #[inline]
    pub fn ns_or_over(&self, t: u64) -> u64 {
        // One comparison for the three overflows: t before the anchor
        // wraps past the reach.
        let d = t.wrapping_sub(self.ticks);
        if d > self.scale.reach {
            return self.scale.ns(t).unwrap_or(u64::MAX);
        }
        let freq = self.scale.freq;
        // d <= reach: d * 1e9 + rem <= u64::MAX - freq + rem < 2^64;
        // x * inv / 2^64 < 2^64; q * freq <= x; x - q * freq < 2 * freq.
        #[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
        let q = {
            let x = d * NS_PER_S + self.rem;
            let q = ((u128::from(x) * u128::from(self.scale.inv)) >> 64) as u64;
            q + u64::from(x - q * freq >= freq)
        };
        self.ns.saturating_add(q)
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values() {
        let s = NsScale::new(3, 100, 1_000_000_000);
        assert_eq!(s.ns(100), Some(1_000_000_000));
        assert_eq!(s.ns(101), Some(1_333_333_333));
        // Rounded down on both sides of the reference point.
        assert_eq!(s.ns(99), Some(666_666_666));
        assert_eq!(NsScale::new(1, 5, 0).ns(4), None, "before the epoch");
        assert_eq!(NsScale::new(1, 0, NS_MAX).ns(1), None, "past int64");
        let a = s.anchor(99).unwrap();
        assert_eq!(
            (a.ns(99), a.ns(100), a.ns(101)),
            (s.ns(99), s.ns(100), s.ns(101))
        );
        assert_eq!(a.ns(98), s.ns(98), "before the anchor: the exact path");
    }

    #[test]
    fn ticks_at_is_never_after_the_ticks_of_that_value() {
        let s = NsScale::new(2_400_000_000, 1 << 40, 1_700_000_000_000_000_000);
        for t in [(1 << 40) - 7, 1 << 40, (1 << 40) + 12_345] {
            let ns = s.ns(t).unwrap();
            let back = s.ticks_at(ns);
            assert!(back <= t && t - back <= 3, "{t} {back}");
            assert!(s.ns(back).unwrap() <= ns);
        }
    }

    proptest! {
        #[test]
        fn the_anchor_agrees_with_the_exact_form(
            freq in prop_oneof![Just(1u64), 1u64..10_000, 900_000_000u64..6_000_000_000, any::<u64>()],
            ref_ticks in any::<u64>(),
            ref_ns in 0u64..=NS_MAX,
            at in any::<u64>(),
            step in prop_oneof![0u64..1_000, 0u64..(1 << 34), any::<u64>()],
        ) {
            let s = NsScale::new(freq, ref_ticks, ref_ns);
            if let Some(a) = s.anchor(at) {
                let t = at.saturating_add(step);
                prop_assert_eq!(a.ns(t), s.ns(t));
                prop_assert_eq!(a.anchor_ns(), s.ns(at).unwrap());
            }
        }

        #[test]
        fn the_fast_form_is_the_floor_of_the_quotient(
            freq in prop_oneof![1u64..10_000, 900_000_000u64..6_000_000_000, any::<u64>()],
            ref_ticks in any::<u64>(),
            ref_ns in 0u64..=NS_MAX,
            t in any::<u64>(),
        ) {
            let s = NsScale::new(freq, ref_ticks, ref_ns);
            let d = i128::from(t) - i128::from(ref_ticks);
            let want = i128::from(ref_ns)
                + (d * i128::from(NS_PER_S)).div_euclid(i128::from(freq.max(1)));
            prop_assert_eq!(s.realtime_ns(t), want);
        }

        #[test]
        fn values_never_go_back(
            freq in 1u64..10_000_000_000,
            ref_ticks in any::<u64>(),
            ref_ns in 0u64..=NS_MAX,
            a in any::<u64>(),
            b in any::<u64>(),
        ) {
            let s = NsScale::new(freq, ref_ticks, ref_ns);
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(s.realtime_ns(lo) <= s.realtime_ns(hi));
        }
    }
}
