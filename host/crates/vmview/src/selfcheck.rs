//! The self-check: the clock mapping tested against the traces themselves,
//! on pairs of events where one causes the other, so that the effect can
//! never truly come first (what trace-checker does for trace-cmd).
//!
//! - A guest CPU runs no code while its vCPU is off its host CPU (TCG: the
//!   vCPU thread switched out, asleep or preempted; KVM: also between
//!   `kvm_exit` and `kvm_entry`). So the guest's last event before a
//!   switch-out precedes it (e.g. the idle path before HLT, which puts a
//!   TCG vCPU thread to sleep), and the switch-in precedes the guest's
//!   first event after it. Each off-CPU stretch of a vCPU (merged from the
//!   VM view's intervals) gives one pair on each side: "guest event ->
//!   vCPU switch-out" and "vCPU switch-in -> guest event" (kvm_exit and
//!   kvm_entry under KVM), for guest events within [`PAIR_HORIZON_NS`] of
//!   the stretch.
//! - A guest event mapped inside a stretch is impossible: the least error
//!   that explains it is the smaller of its distances to the stretch's
//!   ends, and it counts as that side's lead.
//! - With serve, each doorbell the guest rang (`ivtrace_doorbell`, written
//!   before the ring) precedes serve's wake-up for it
//!   (`ivtrace_doorbell_received`); the k-th ring pairs with the k-th
//!   reception.
//!
//! A pair's *lead* is cause minus effect, mapped: negative (the effect
//! follows by that much) is consistent; positive means the mapping put the
//! effect first, which a mapping within its bound can do by at most the
//! bound. A violation is a lead beyond the bound: proof that the mapping is
//! off by more than it says. No violation proves nothing by itself: a pair
//! catches an error only if it is larger than the pair's true gap, and
//! only in one direction (late causes for the first kind, early effects
//! for the second), which is why both kinds are checked.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Interval, State};

/// A guest event this far from a stretch's end or start, at most, pairs
/// with it (farther, the guest ran on for a while: no causal chain).
pub const PAIR_HORIZON_NS: u64 = 1_000_000;
/// Off-CPU stretches kept per vCPU (memory stays bounded by this, whatever
/// the host trace holds); those past it are not checked, and counted.
const STRETCHES_MAX: usize = 1 << 22;

/// One kind of pair, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairKind {
    pub cause: String,
    pub effect: String,
    pub pairs: u64,
    /// Pairs whose lead is beyond the bound.
    pub violations: u64,
    /// The largest lead (cause minus effect, mapped), ns.
    pub largest_lead_ns: Option<i64>,
}

impl PairKind {
    fn new(cause: &str, effect: &str) -> PairKind {
        PairKind {
            cause: cause.into(),
            effect: effect.into(),
            ..PairKind::default()
        }
    }

    fn pair(&mut self, lead: i64, bound: u64) {
        self.pairs += 1;
        self.violations += u64::from(lead > 0 && lead.unsigned_abs() > bound);
        self.largest_lead_ns = Some(self.largest_lead_ns.map_or(lead, |l| l.max(lead)));
    }
}

/// The self-check of a recording (the sidecar's `self_check`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelfCheck {
    /// The mapping's error bound the leads are held to.
    pub bound_ns: u64,
    pub pairs: u64,
    pub violations: u64,
    pub largest_lead_ns: Option<i64>,
    pub kinds: Vec<PairKind>,
    /// Guest events mapped inside an off-CPU stretch (each also counts in
    /// its pair's lead).
    pub events_inside: u64,
    /// Stretches whose end the host trace does not show (a switch-in it
    /// did not trace, the end of the trace): only their start is checked.
    pub stretches_open_ended: u64,
    /// Stretches past the per-vCPU limit, not checked.
    pub stretches_dropped: u64,
    /// Doorbell rings and receptions that did not pair up (a count
    /// differing between the traces: not checked then).
    pub doorbells_unpaired: Option<(u64, u64)>,
}

/// A stretch a vCPU ran no guest code: from a switch-out (or `kvm_exit`) to
/// a switch-in (or `kvm_entry`), host ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stretch {
    start: u64,
    end: u64,
    /// Its end is a switch-in the host trace shows (not a wait whose end it
    /// did not trace, not the end of the trace).
    resumes: bool,
    /// It began with a KVM exit.
    kvm: bool,
}

/// Leads gathered for one stretch while the guest's events go by.
#[derive(Debug, Default, Clone, Copy)]
struct Leads {
    before: Option<i64>,
    after: Option<i64>,
}

fn max_opt(a: Option<i64>, b: i64) -> Option<i64> {
    Some(a.map_or(b, |a| a.max(b)))
}

fn signed(a: u64, b: u64) -> i64 {
    (a as i128 - b as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Gathers the off-CPU stretches while the VM view is derived, then checks
/// each guest CPU's events against its vCPU's stretches.
#[derive(Debug, Default)]
pub struct Checker {
    stretches: BTreeMap<u32, Vec<Stretch>>,
    check: SelfCheck,
}

impl Checker {
    /// One interval of the VM view (each vCPU's in time order): pieces
    /// that follow each other make one stretch.
    pub fn interval(&mut self, i: &Interval) {
        let list = self.stretches.entry(i.vcpu).or_default();
        let follows = list.last().is_some_and(|l| l.end == i.start);
        if i.state == State::Untraced {
            // It ran somewhere in there: the stretch before ends unseen.
            if let (true, Some(last)) = (follows, list.last_mut()) {
                last.resumes = false;
            }
            return;
        }
        if let (true, Some(last)) = (follows, list.last_mut()) {
            last.end = i.end;
            last.resumes = !i.truncated;
            return;
        }
        if list.len() >= STRETCHES_MAX {
            self.check.stretches_dropped += 1;
            return;
        }
        list.push(Stretch {
            start: i.start,
            end: i.end,
            resumes: !i.truncated,
            kvm: i.state == State::Hypervisor,
        });
    }

    /// Checks guest CPU `cpu`'s events (host ns, in time order) against
    /// its vCPU's stretches, with the mapping's `bound`.
    pub fn guest_cpu(&mut self, cpu: u32, events: impl Iterator<Item = u64>, bound: u64) {
        let Some(list) = self.stretches.remove(&cpu) else {
            return;
        };
        let mut leads = vec![Leads::default(); list.len()];
        let mut j = 0;
        for m in events {
            while j < list.len() && list[j].end <= m {
                let s = list[j];
                if s.resumes && m - s.end <= PAIR_HORIZON_NS && leads[j].after.is_none() {
                    leads[j].after = Some(signed(s.end, m));
                }
                j += 1;
            }
            let Some(s) = list.get(j) else { continue };
            if m <= s.start {
                if s.start - m <= PAIR_HORIZON_NS {
                    // The latest event before the stretch (overwritten by later ones).
                    leads[j].before = Some(signed(m, s.start));
                }
                continue;
            }
            self.check.events_inside += 1;
            let (since, until) = (m - s.start, s.end - m);
            if since <= until || !s.resumes {
                leads[j].before = max_opt(leads[j].before, since as i64);
            } else {
                leads[j].after = max_opt(leads[j].after, until as i64);
            }
        }
        self.count(&list, &leads, bound);
    }

    fn count(&mut self, list: &[Stretch], leads: &[Leads], bound: u64) {
        for (s, l) in list.iter().zip(leads) {
            self.check.stretches_open_ended += u64::from(!s.resumes);
            let (out, back) = match s.kvm {
                true => (("guest event", "kvm_exit"), ("kvm_entry", "guest event")),
                false => (
                    ("guest event", "vCPU switch-out"),
                    ("vCPU switch-in", "guest event"),
                ),
            };
            if let Some(lead) = l.before {
                self.kind(out.0, out.1).pair(lead, bound);
            }
            if let Some(lead) = l.after {
                self.kind(back.0, back.1).pair(lead, bound);
            }
        }
    }

    fn kind(&mut self, cause: &str, effect: &str) -> &mut PairKind {
        let kinds = &mut self.check.kinds;
        match kinds
            .iter()
            .position(|k| k.cause == cause && k.effect == effect)
        {
            Some(i) => &mut kinds[i],
            None => {
                kinds.push(PairKind::new(cause, effect));
                kinds.last_mut().expect("just pushed")
            }
        }
    }

    /// The doorbells: `rang` the guest's rings (host ns), `received` serve's
    /// wake-ups (host ns, doorbells counted by it).
    pub fn doorbells(&mut self, mut rang: Vec<u64>, received: &[(u64, u64)], bound: u64) {
        rang.sort_unstable();
        let mut recv: Vec<u64> = Vec::new();
        for &(ns, count) in received {
            // A count is the guest's to inflate: at most one per ring.
            let n = count.min(rang.len().saturating_sub(recv.len()) as u64 + 1);
            recv.extend(std::iter::repeat_n(ns, n as usize));
        }
        recv.sort_unstable();
        if rang.is_empty() && recv.is_empty() {
            return;
        }
        if rang.len() != recv.len() {
            self.check.doorbells_unpaired = Some((rang.len() as u64, recv.len() as u64));
            return;
        }
        let kind = self.kind("doorbell rung (guest)", "doorbell received (serve)");
        for (r, v) in rang.iter().zip(&recv) {
            kind.pair(signed(*r, *v), bound);
        }
    }

    /// The result, with the bound it was held to.
    pub fn finish(mut self, bound: u64) -> SelfCheck {
        let c = &mut self.check;
        c.bound_ns = bound;
        c.pairs = c.kinds.iter().map(|k| k.pairs).sum();
        c.violations = c.kinds.iter().map(|k| k.violations).sum();
        c.largest_lead_ns = c.kinds.iter().filter_map(|k| k.largest_lead_ns).max();
        self.check
    }
}

fn lead_text(lead: Option<i64>) -> String {
    match lead {
        Some(l) if l > 0 => format!("{l} ns (an effect mapped before its cause)"),
        Some(l) => format!("{l} ns (every effect after its cause)"),
        None => "-".into(),
    }
}

/// What the self-check found, in lines for people (the recorders'
/// summaries and `ivtrace report`).
pub fn describe(c: &SelfCheck) -> Vec<String> {
    let mut lines = vec![format!(
        "self-check of the clock on cause -> effect pairs: {} pairs, {} violations beyond the \
         bound of {} ns, largest lead {}",
        c.pairs,
        c.violations,
        c.bound_ns,
        lead_text(c.largest_lead_ns)
    )];
    for k in &c.kinds {
        lines.push(format!(
            "  {} -> {}: {} pairs, {} violations, largest lead {}",
            k.cause,
            k.effect,
            k.pairs,
            k.violations,
            lead_text(k.largest_lead_ns)
        ));
    }
    if c.events_inside > 0 {
        lines.push(format!(
            "  {} guest events mapped inside a stretch their vCPU was off its CPU",
            c.events_inside
        ));
    }
    if let Some((rang, received)) = c.doorbells_unpaired {
        lines.push(format!(
            "  doorbells not checked: {rang} rung in the guest trace, {received} received in the \
             host trace"
        ));
    }
    if c.pairs == 0 {
        lines.push(
            "  no pair to check: the host trace shows no vCPU thread leaving its CPU near a \
             guest event (name QEMU's threads with -name NAME,debug-threads=on)"
                .into(),
        );
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(vcpu: u32, state: State, start: u64, end: u64) -> Interval {
        Interval::bare(vcpu, state, (start, end), 100)
    }

    #[test]
    fn events_around_stretches_pair_and_events_inside_lead() {
        let mut c = Checker::default();
        // vCPU 0: asleep 1000..5000 (woken at 4000, back on its CPU at 5000)
        c.interval(&iv(0, State::Blocked, 1000, 4000));
        c.interval(&iv(0, State::Preempted, 4000, 5000));
        // preempted 9000..9500
        c.interval(&iv(0, State::Preempted, 9000, 9500));
        // guest: 900 (before the first), 5100 (after it), 9000 (at the
        // second's start: consistent), 9400 (inside, 100 before its end)
        c.guest_cpu(0, [900u64, 5100, 9000, 9400].into_iter(), 50);
        let r = c.finish(50);
        assert_eq!(r.events_inside, 1);
        assert_eq!(r.pairs, 4, "{r:?}");
        assert_eq!(r.violations, 1, "a 100 ns lead beyond a 50 ns bound");
        assert_eq!(r.largest_lead_ns, Some(100));
        let out = &r.kinds[0];
        assert_eq!(
            (out.effect.as_str(), out.largest_lead_ns),
            ("vCPU switch-out", Some(0))
        );
    }

    #[test]
    fn an_untraced_wait_leaves_the_stretch_open_ended() {
        let mut c = Checker::default();
        c.interval(&iv(1, State::Blocked, 1000, 2000));
        c.interval(&iv(1, State::Untraced, 2000, 8000));
        c.interval(&iv(1, State::Preempted, 8000, 8100));
        // 3000: in the untraced wait (it ran then); 8200 after the last.
        c.guest_cpu(1, [3000u64, 8200].into_iter(), 10);
        let r = c.finish(10);
        assert_eq!(r.violations, 0, "{r:?}");
        assert_eq!(r.stretches_open_ended, 1);
        assert_eq!(r.events_inside, 0);
    }

    #[test]
    fn doorbells_pair_in_order_and_a_count_mismatch_is_reported() {
        let mut c = Checker::default();
        c.doorbells(vec![300, 100, 200], &[(150, 1), (260, 2)], 5);
        let r = c.finish(5);
        assert_eq!((r.pairs, r.violations), (3, 1), "{r:?}");
        assert_eq!(r.largest_lead_ns, Some(40));
        let mut c = Checker::default();
        c.doorbells(vec![100], &[(150, 1), (160, 1)], 5);
        assert_eq!(c.finish(5).doorbells_unpaired, Some((1, 2)));
    }

    #[test]
    fn far_events_are_no_pairs_and_hostile_counts_stay_bounded() {
        let mut c = Checker::default();
        c.interval(&iv(0, State::Blocked, 10_000_000, 11_000_000));
        c.guest_cpu(0, [1u64, 50_000_000].into_iter(), 1000);
        assert_eq!(c.finish(1000).pairs, 0);
        let mut c = Checker::default();
        c.doorbells(vec![5], &[(6, u64::MAX)], 0);
        assert_eq!(c.finish(0).doorbells_unpaired, Some((1, 2)));
    }
}
