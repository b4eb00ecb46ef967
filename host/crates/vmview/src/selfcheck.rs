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
//! - A stretch whose end the host trace does not show (open-ended: the
//!   vCPU thread was next seen switching out again, or the trace ended)
//!   proves nothing about the guest's events after its start: the thread
//!   came back at a moment the trace does not have, possibly before the
//!   wake-up it shows (a host kernel that traces neither a switch-in from
//!   its idle task nor some wake-ups on that CPU, then a later wake-up of
//!   the running thread, traced: docs/kvm.md). So it
//!   gives no pair; it is counted, and so are those the guest's events
//!   show it ran in before the wake-up the trace shows.
//! - With serve, each doorbell the guest rang (`ivtrace_doorbell`, written
//!   before the ring) precedes serve's wake-up for it
//!   (`ivtrace_doorbell_received`); the k-th ring pairs with the k-th
//!   reception.
//!
//! A pair's *lead* is cause minus effect, mapped: negative (the effect
//! follows by that much) is consistent; positive means the mapping put the
//! effect first, which a mapping within its bound can do by at most the
//! bound. A violation is a lead beyond the bound: proof that the mapping is
//! off by more than it says, or that the host trace is. No violation proves
//! nothing by itself: a pair catches an error only if it is larger than the
//! pair's true gap, and only in one direction (late causes for the first
//! kind, early effects for the second), which is why both kinds are checked.
//!
//! A lead beyond the bound comes from guest events mapped inside a stretch.
//! A clock error explains them only one way: the mapping is late by at
//! least the farthest one's distance from the start (all of them truly ran
//! before the switch-out) or early by at least the farthest one's distance
//! from the end (all truly after the switch-in), never both. Either way the
//! guest was truly silent for the whole stretch, so its events show a
//! silence as long as the stretch right after the last event inside (late)
//! or right before the first (early). A stretch whose guest ran *through*
//! it (no such silence on either side) while the stretches around it on
//! the same vCPU show no guest event inside them is one the host trace got
//! wrong ([`SelfCheck::host_record_missing`]: a switch-in and a switch-out
//! it did not trace), not a clock error: a clock error shifts every pair of
//! a kind, so the stretches around it would show it too. Those stretches
//! are counted and their leads reported apart; they are not violations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Interval, State};

/// A guest event this far from a stretch's end or start, at most, pairs
/// with it (farther, the guest ran on for a while: no causal chain).
pub const PAIR_HORIZON_NS: u64 = 1_000_000;
/// Off-CPU stretches kept per vCPU (memory stays bounded by this, whatever
/// the host trace holds); those past it are not checked, and counted.
const STRETCHES_MAX: usize = 1 << 22;
/// The stretches around one whose guest ran through it, either side: a
/// clock error is shared by the stretches this close (it drifts by
/// nanoseconds over this time).
const NEIGHBOURHOOD_NS: u64 = 50_000_000;
/// Stretches with pairs that must lie around a stretch for it to be set
/// aside as one the host trace got wrong (fewer: no evidence, it stays a
/// violation), and how far out they are looked for, either side.
const NEIGHBOURS_MIN: u64 = 4;
const NEIGHBOURS_SCAN: usize = 64;

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
    /// Pairs of stretches the host trace got wrong, not held to the bound
    /// (not in `pairs`).
    #[serde(default)]
    pub host_record_missing: u64,
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
    /// Stretches the host trace got wrong: the guest ran through them (no
    /// clock error explains their events inside) while the stretches around
    /// them hold. Their pairs are set aside, not violations.
    #[serde(default)]
    pub host_record_missing: u64,
    /// How far, at most, the guest ran into those stretches (their largest
    /// lead), ns.
    #[serde(default)]
    pub host_record_missing_largest_lead_ns: Option<i64>,
    /// Stretches whose end the host trace does not show (a switch-in it
    /// did not trace, the end of the trace): not checked (their vCPU may
    /// have run again at any moment after their start).
    pub stretches_open_ended: u64,
    /// Of those, the stretches the guest's events show it ran in before
    /// the wake-up the host trace shows (that wake-up was not the one that
    /// ended the sleep: the host kernel traced neither that one nor the
    /// switch-in).
    #[serde(default)]
    pub open_ended_guest_ran: u64,
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
    /// The guest ran through it (see [`Inside::ran_through`]).
    ran_through: bool,
    /// Open-ended, with guest events after its start.
    ran_open_ended: bool,
}

impl Leads {
    fn beyond(&self, bound: u64) -> bool {
        let over = |l: Option<i64>| l.is_some_and(|l| l > 0 && l.unsigned_abs() > bound);
        over(self.before) || over(self.after)
    }

    fn paired(&self) -> bool {
        self.before.is_some() || self.after.is_some()
    }
}

/// The guest's events mapped inside the stretch being checked: the first
/// and the last, and the event before the first (at any distance).
#[derive(Debug, Default, Clone, Copy)]
struct Inside {
    prev: Option<u64>,
    first: Option<u64>,
    last: Option<u64>,
}

impl Inside {
    /// The guest ran through stretch `s`, `next` its first event after
    /// it: no clock error explains its events inside. Late, they all ran
    /// before the switch-out and the guest was silent for the stretch
    /// after the last of them; early, they all ran after the switch-in and
    /// it was silent for the stretch before the first. `slack` is how much
    /// the error may differ between the two ends.
    fn ran_through(&self, s: &Stretch, next: Option<u64>, slack: u64) -> bool {
        let (Some(first), Some(last)) = (self.first, self.last) else {
            return false;
        };
        let length = s.end.saturating_sub(s.start).saturating_sub(slack);
        let silent = |from: u64, to: Option<u64>| to.is_none_or(|to| to.abs_diff(from) >= length);
        !silent(last, next) && !silent(first, self.prev)
    }
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
        let (mut j, mut last, mut inside) = (0, None, Inside::default());
        let slack = bound.saturating_mul(2);
        for m in events {
            while j < list.len() && list[j].end <= m {
                let (s, l) = (list[j], &mut leads[j]);
                l.ran_through = inside.ran_through(&s, Some(m), slack);
                if s.resumes && m - s.end <= PAIR_HORIZON_NS && l.after.is_none() {
                    l.after = Some(signed(s.end, m));
                }
                (j, inside) = (j + 1, Inside::default());
            }
            let previous = last.replace(m);
            let (Some(s), Some(l)) = (list.get(j), leads.get_mut(j)) else {
                continue;
            };
            if m <= s.start {
                if s.resumes && s.start - m <= PAIR_HORIZON_NS {
                    // The latest event before the stretch (overwritten by later ones).
                    l.before = Some(signed(m, s.start));
                }
                continue;
            }
            if !s.resumes {
                // Its thread may have run again already: no pair.
                l.ran_open_ended = true;
                continue;
            }
            self.check.events_inside += 1;
            if inside.first.is_none() {
                (inside.prev, inside.first) = (previous, Some(m));
            }
            inside.last = Some(m);
            let (since, until) = (m - s.start, s.end - m);
            if since <= until {
                l.before = max_opt(l.before, since as i64);
            } else {
                l.after = max_opt(l.after, until as i64);
            }
        }
        let missing = host_record_missing(&list, &leads, bound);
        self.count(&list, &leads, &missing, bound);
    }

    fn count(&mut self, list: &[Stretch], leads: &[Leads], missing: &[bool], bound: u64) {
        for ((s, l), &missing) in list.iter().zip(leads).zip(missing) {
            if !s.resumes {
                self.check.stretches_open_ended += 1;
                self.check.open_ended_guest_ran += u64::from(l.ran_open_ended);
                continue;
            }
            let (out, back) = match s.kvm {
                true => (("guest event", "kvm_exit"), ("kvm_entry", "guest event")),
                false => (
                    ("guest event", "vCPU switch-out"),
                    ("vCPU switch-in", "guest event"),
                ),
            };
            if missing {
                self.check.host_record_missing += 1;
            }
            for (lead, (cause, effect)) in [(l.before, out), (l.after, back)] {
                let Some(lead) = lead else { continue };
                let kind = self.kind(cause, effect);
                if missing {
                    kind.host_record_missing += 1;
                    let c = &mut self.check;
                    c.host_record_missing_largest_lead_ns =
                        max_opt(c.host_record_missing_largest_lead_ns, lead);
                } else {
                    kind.pair(lead, bound);
                }
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

/// Which stretches the host trace got wrong: those with a lead beyond the
/// bound whose guest ran through them (see [`Inside::ran_through`]) while
/// the stretches with pairs around them, on the same vCPU within
/// [`NEIGHBOURHOOD_NS`], have no lead beyond it (at least
/// [`NEIGHBOURS_MIN`] of them, and at most one in four with such a lead: a
/// clock error would shift theirs too).
fn host_record_missing(list: &[Stretch], leads: &[Leads], bound: u64) -> Vec<bool> {
    let suspect: Vec<bool> = leads.iter().map(|l| l.beyond(bound)).collect();
    (0..list.len())
        .map(|j| suspect[j] && leads[j].ran_through && isolated(list, leads, &suspect, j))
        .collect()
}

/// Stretch `j` stands alone: the stretches with pairs around it hold.
fn isolated(list: &[Stretch], leads: &[Leads], suspect: &[bool], j: usize) -> bool {
    let near = |i: &usize| list[*i].start.abs_diff(list[j].start) <= NEIGHBOURHOOD_NS;
    let before = (j.saturating_sub(NEIGHBOURS_SCAN)..j)
        .rev()
        .take_while(near);
    let after = (j + 1..list.len().min(j + 1 + NEIGHBOURS_SCAN)).take_while(near);
    let (mut paired, mut beyond) = (0u64, 0u64);
    for i in before.chain(after).filter(|&i| leads[i].paired()) {
        paired += 1;
        beyond += u64::from(suspect[i]);
    }
    paired >= NEIGHBOURS_MIN && beyond.saturating_mul(4) <= paired
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
    if c.stretches_open_ended > 0 {
        let ran = match c.open_ended_guest_ran {
            0 => String::new(),
            n => format!(
                "; in {n} of them the guest ran before the wake-up the host trace shows (the \
                 host kernel traced neither the real wake-up nor the switch-in)"
            ),
        };
        lines.push(format!(
            "  {} stretches not checked: the host trace shows no switch-in ending them{ran}",
            c.stretches_open_ended
        ));
    }
    if c.host_record_missing > 0 {
        lines.push(format!(
            "  {} stretches the host trace got wrong, not held to the bound: the guest ran \
             through them (up to {} ns in) while the stretches around them hold (a context \
             switch the host kernel did not trace)",
            c.host_record_missing,
            c.host_record_missing_largest_lead_ns.unwrap_or(0)
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

    const US: u64 = 1000;

    /// How the host trace shows the one stretch the guest truly ran through
    /// (10 ms after its switch-out), if any.
    #[derive(Clone, Copy)]
    enum RanThrough {
        /// Its switch-out and its switch-in, 10 ms apart: the host trace
        /// lost a switch-in and a switch-out in between.
        Closed(usize),
        /// Its switch-out and a wake-up 10 ms later, not the switch-in, nor
        /// the next switch-out until 300 us after the wake-up.
        OpenEnded(usize),
    }

    /// A busy guest on vCPU 0 (an event every 20 us while it runs, the
    /// first 2 us after each switch-in, the last 1 us before each
    /// switch-out) and 100 stretches off its CPU after 1 ms runs, every
    /// fourth 8 ms long (asleep) and the others 300 us (preempted); its
    /// events mapped `shift` ns off. With `ran`, the vCPU truly ran through
    /// that stretch, shown as [`RanThrough`] says.
    fn busy_vcpu(c: &mut Checker, shift: i64, ran: Option<RanThrough>, bound: u64) {
        let (mut t, mut events) = (100_000 * US, Vec::new());
        for k in 0..100 {
            let (run_end, length) = (t + 1000 * US, if k % 4 == 0 { 8000 * US } else { 300 * US });
            events.extend((t + 2 * US..run_end - US).step_by(20_000));
            events.push(run_end - US);
            let (wake, out) = (run_end + 10_000 * US, run_end + 10_300 * US);
            match ran {
                Some(RanThrough::Closed(j)) if j == k => {
                    c.interval(&iv(0, State::Preempted, run_end, wake));
                    events.extend((run_end..wake).step_by(20_000));
                    t = wake;
                    continue;
                }
                Some(RanThrough::OpenEnded(j)) if j == k => {
                    c.interval(&iv(0, State::Blocked, run_end, wake));
                    c.interval(&iv(0, State::Untraced, wake, out));
                    events.extend((run_end..out).step_by(20_000));
                    t = out;
                    continue;
                }
                _ => {}
            }
            let state = if length > 300 * US {
                State::Blocked
            } else {
                State::Preempted
            };
            c.interval(&iv(0, state, run_end, run_end + length));
            t = run_end + length;
        }
        let mapped = events.into_iter().map(|e| e.saturating_add_signed(shift));
        c.guest_cpu(0, mapped, bound);
    }

    fn recording(shift: i64, ran: Option<RanThrough>, bound: u64) -> SelfCheck {
        let mut c = Checker::default();
        busy_vcpu(&mut c, shift, ran, bound);
        c.finish(bound)
    }

    /// The shape of a full `make test` run's violations on this project's
    /// machine (its kernel traces neither a switch-in from its idle task
    /// nor some wake-ups on that CPU): vCPU 1, mostly idle,
    /// switched out asleep every 95 ms; each time an untraced wake-up and
    /// switch-in 5 ms later, the guest running from then on (an event
    /// every 20 us), a traced wake-up of the running thread 92 ms after
    /// the switch-out and the next switch-out 3 ms after that. The host
    /// trace shows blocked until that wake-up, then an untraced wait.
    fn idle_vcpu_untraced_wakeups(c: &mut Checker, shift: i64, bound: u64) {
        let (mut t, mut events) = (100_000 * US, Vec::new());
        for _ in 0..10 {
            let (woken, traced_wake, out) = (t + 5_000 * US, t + 92_000 * US, t + 95_000 * US);
            c.interval(&iv(1, State::Blocked, t, traced_wake));
            c.interval(&iv(1, State::Untraced, traced_wake, out));
            events.extend((woken..out).step_by(20_000));
            t = out;
        }
        let mapped = events.into_iter().map(|e| e.saturating_add_signed(shift));
        c.guest_cpu(1, mapped, bound);
    }

    #[test]
    fn a_right_mapping_passes() {
        let r = recording(0, None, 500);
        assert!(r.pairs >= 190, "{r:?}");
        assert_eq!(
            (r.violations, r.host_record_missing, r.events_inside),
            (0, 0, 0)
        );
        assert!(r.largest_lead_ns.is_some_and(|l| l <= 0), "{r:?}");
    }

    #[test]
    fn a_mapping_late_or_early_by_5_us_is_caught_on_both_kinds() {
        for (shift, kind) in [(5_000, 0), (-5_000, 1)] {
            let r = recording(shift, None, 500);
            assert_eq!(r.host_record_missing, 0, "{shift}: {r:?}");
            assert!(r.kinds[kind].violations >= 90, "{shift}: {r:?}");
            assert!(
                r.largest_lead_ns
                    .is_some_and(|l| (3_000..=5_000).contains(&l)),
                "{r:?}"
            );
        }
    }

    #[test]
    fn a_mapping_late_or_early_by_5_ms_is_caught() {
        for shift in [5_000_000, -5_000_000] {
            let r = recording(shift, None, 500);
            assert_eq!(r.host_record_missing, 0, "{shift}: {r:?}");
            assert!(r.violations >= 25, "{shift}: {r:?}");
            // The lead is to the nearer end: 3 ms of an 8 ms stretch at least.
            assert!(
                r.largest_lead_ns.is_some_and(|l| l >= 3_000_000),
                "{shift}: {r:?}"
            );
        }
    }

    #[test]
    fn a_stretch_the_guest_ran_through_is_a_missing_host_record_not_a_violation() {
        let r = recording(0, Some(RanThrough::Closed(50)), 500);
        assert_eq!((r.violations, r.host_record_missing), (0, 1), "{r:?}");
        let lead = r.host_record_missing_largest_lead_ns.expect("its lead");
        assert!(lead > 4_000_000, "the guest ran through 10 ms: {r:?}");
        assert!(
            r.largest_lead_ns.is_some_and(|l| l <= 0),
            "held apart: {r:?}"
        );
        let out = r.kinds.iter().find(|k| k.effect == "vCPU switch-out");
        assert_eq!(out.map(|k| k.host_record_missing), Some(1), "{r:?}");
        let text = describe(&r).join("\n");
        assert!(
            text.contains("1 stretches the host trace got wrong"),
            "{text}"
        );
        // The same stretch in a recording whose mapping is 5 us late: the
        // stretches around it do not hold, so it is a violation like them.
        let r = recording(5_000, Some(RanThrough::Closed(50)), 500);
        assert_eq!(r.host_record_missing, 0, "{r:?}");
    }

    #[test]
    fn an_open_ended_stretch_the_guest_ran_in_is_counted_not_checked() {
        let r = recording(0, Some(RanThrough::OpenEnded(50)), 500);
        assert_eq!((r.violations, r.host_record_missing), (0, 0), "{r:?}");
        assert_eq!((r.stretches_open_ended, r.open_ended_guest_ran), (1, 1));
        assert!(r.largest_lead_ns.is_some_and(|l| l <= 0), "{r:?}");
        let text = describe(&r).join("\n");
        assert!(text.contains("1 stretches not checked"), "{text}");
        assert!(text.contains("in 1 of them the guest ran before"), "{text}");
    }

    #[test]
    fn untraced_wake_ups_on_an_idle_vcpu_are_no_violation_and_a_clock_error_still_is() {
        let run = |shift: i64| {
            let mut c = Checker::default();
            busy_vcpu(&mut c, shift, None, 500);
            idle_vcpu_untraced_wakeups(&mut c, shift, 500);
            c.finish(500)
        };
        let r = run(0);
        assert_eq!((r.violations, r.host_record_missing), (0, 0), "{r:?}");
        assert_eq!((r.stretches_open_ended, r.open_ended_guest_ran), (10, 10));
        assert!(r.largest_lead_ns.is_some_and(|l| l <= 0), "{r:?}");
        // Late or early by 5 us or 5 ms: the busy vCPU's pairs show it,
        // nothing is set aside.
        for shift in [5_000, -5_000, 5_000_000, -5_000_000] {
            let r = run(shift);
            assert!(r.violations >= 25, "{shift}: {r:?}");
            assert_eq!(r.host_record_missing, 0, "{shift}: {r:?}");
        }
    }

    #[test]
    fn a_lone_stretch_without_neighbours_stays_a_violation() {
        // The guest ran through it, but nothing around it says the mapping
        // holds there.
        let mut c = Checker::default();
        c.interval(&iv(0, State::Blocked, 1_000_000, 2_000_000));
        c.guest_cpu(0, (900_000u64..2_100_000).step_by(20_000), 500);
        let r = c.finish(500);
        assert_eq!((r.violations, r.host_record_missing), (2, 0), "{r:?}");
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
