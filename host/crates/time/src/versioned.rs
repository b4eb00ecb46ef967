//! KVM's guest TSC as a versioned mapping: the parameters
//! (`guest_tsc = ((host_tsc * ratio) >> frac_bits) + offset`, per vCPU,
//! [`VcpuTsc`]) change while a guest runs — a guest write of IA32_TSC
//! or IA32_TSC_ADJUST, a vCPU hot-plug or reset, an incoming migration
//! (QEMU sets the TSC it migrated) — and KVM says so with the tracepoint
//! `kvm_write_tsc_offset` (vcpu_id, previous_tsc_offset, next_tsc_offset;
//! host time of the write). Each change starts a new *version* of that
//! vCPU's mapping; a guest tick is converted with the version it was
//! written under.
//!
//! Conversion is integer arithmetic, checked, in one place
//! ([`VersionedTsc::host_ns`]): guest ticks -> host TSC (the inverse of
//! KVM's scaling, rounded down as KVM's multiply is) -> host ns through
//! [`HostTscLine`] (two host (TSC, ns) samples). A value that would
//! overflow, a version that does not exist, a tick before its version's
//! start is `None`: never a wrapped or wild time.
//!
//! Every field of a write is guest-influenced (the guest chooses the TSC
//! it writes): a write whose `previous` is not the offset in force, a
//! write for a vCPU the VM did not have at the start, or one older than
//! the last version is rejected and counted, never applied.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::kvm::{HostSample, VcpuTsc};

/// Versions kept per vCPU (a guest that writes its TSC in a loop cannot
/// grow the mapping past this; later writes are counted as rejected).
pub const VERSIONS_MAX: usize = 4096;

/// One `kvm_write_tsc_offset` event: at host time `host_ns`, vCPU `vcpu`'s
/// offset went from `previous` to `next` (the tracepoint's u64s, KVM's
/// two's-complement offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TscWrite {
    pub host_ns: u64,
    pub vcpu: u32,
    pub previous: u64,
    pub next: u64,
}

/// The host TSC as a line of host time through two samples, in integers:
/// `ns = a.ns + (tsc - a.tsc) * span_ns / span_ticks` (rounded down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostTscLine {
    pub ref_tsc: u64,
    pub ref_ns: u64,
    pub span_ticks: u64,
    pub span_ns: u64,
}

impl HostTscLine {
    /// The line through `a` and `b` (`b` later on both axes), None if not.
    pub fn through(a: HostSample, b: HostSample) -> Option<HostTscLine> {
        let span_ticks = b.tsc.checked_sub(a.tsc).filter(|&t| t > 0)?;
        let span_ns = b.ns.checked_sub(a.ns).filter(|&n| n > 0)?;
        Some(HostTscLine {
            ref_tsc: a.tsc,
            ref_ns: a.ns,
            span_ticks,
            span_ns,
        })
    }

    /// Host ns at host TSC `tsc` (before the reference too), None past u64.
    pub fn ns_at(&self, tsc: u64) -> Option<u64> {
        let d = i128::from(tsc) - i128::from(self.ref_tsc);
        let scaled = d
            .checked_mul(i128::from(self.span_ns))?
            .div_euclid(i128::from(self.span_ticks));
        u64::try_from(i128::from(self.ref_ns).checked_add(scaled)?).ok()
    }

    /// Host TSC at host ns `ns` (rounded down), None past u64.
    pub fn tsc_at(&self, ns: u64) -> Option<u64> {
        let d = i128::from(ns) - i128::from(self.ref_ns);
        let scaled = d
            .checked_mul(i128::from(self.span_ticks))?
            .div_euclid(i128::from(self.span_ns));
        u64::try_from(i128::from(self.ref_tsc).checked_add(scaled)?).ok()
    }
}

impl VcpuTsc {
    /// The host TSC at which this vCPU's TSC reads `guest` (the inverse of
    /// [`VcpuTsc::guest_at`], rounded down), None when scaling is degenerate
    /// or the result is past u64.
    pub fn host_at(&self, guest: u64) -> Option<u64> {
        let scaled = guest.wrapping_sub(self.offset as u64);
        if self.frac_bits >= 64 || self.ratio == 0 {
            return None;
        }
        let host = (u128::from(scaled) << self.frac_bits) / u128::from(self.ratio);
        u64::try_from(host).ok()
    }
}

/// One version of a vCPU's mapping: its parameters from host time
/// `from_host_ns` until the next version's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TscVersion {
    pub from_host_ns: u64,
    pub offset: i64,
    pub ratio: u64,
    pub frac_bits: u32,
    /// The guest TSC at `from_host_ns` (where this version's ticks begin).
    pub from_guest_ticks: u64,
    /// True when the change's time is known only as "between two reads of
    /// debugfs" (no `kvm_write_tsc_offset` seen): `from_host_ns` is the
    /// later read, and ticks before it may belong to this version.
    pub time_unknown: bool,
}

impl TscVersion {
    fn params(&self) -> VcpuTsc {
        VcpuTsc {
            offset: self.offset,
            ratio: self.ratio,
            frac_bits: self.frac_bits,
        }
    }
}

/// Why a write was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// A vCPU the VM did not have when the mapping was made.
    UnknownVcpu,
    /// Its `previous` is not the offset in force (a write missed, or a
    /// record that is not what it claims).
    NotFromCurrent,
    /// Older than the vCPU's latest version.
    OutOfOrder,
    /// The vCPU has [`VERSIONS_MAX`] versions already.
    TooMany,
    /// Its time is outside the host line's range.
    OutOfRange,
}

/// Every vCPU's versions, with the host TSC line they share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionedTsc {
    pub line: HostTscLine,
    pub vcpus: BTreeMap<u32, Vec<TscVersion>>,
    /// Writes rejected (each kind of [`Rejected`] counted together).
    pub writes_rejected: u64,
}

impl VersionedTsc {
    /// The mapping at host time `at_ns`: each vCPU's parameters as read then.
    pub fn new(line: HostTscLine, at_ns: u64, vcpus: &[(u32, VcpuTsc)]) -> Option<VersionedTsc> {
        let mut m = VersionedTsc {
            line,
            vcpus: BTreeMap::new(),
            writes_rejected: 0,
        };
        let host = line.tsc_at(at_ns)?;
        for (i, v) in vcpus {
            let first = version(at_ns, *v, host, false);
            m.vcpus.insert(*i, vec![first]);
        }
        Some(m)
    }

    /// Applies one `kvm_write_tsc_offset` (same ratio, new offset).
    pub fn apply(&mut self, w: &TscWrite) -> Result<(), Rejected> {
        let r = self.try_apply(w);
        self.writes_rejected += u64::from(r.is_err());
        r
    }

    fn try_apply(&mut self, w: &TscWrite) -> Result<(), Rejected> {
        let host = self.line.tsc_at(w.host_ns).ok_or(Rejected::OutOfRange)?;
        let list = self.vcpus.get_mut(&w.vcpu).ok_or(Rejected::UnknownVcpu)?;
        // Before the versions of unknown start (a change debugfs showed at
        // the end), which a write explains: the writes come from the host
        // trace, read after the recording's last debugfs read.
        let known = list
            .iter()
            .rposition(|v| !v.time_unknown)
            .expect("the first is known");
        let last = list[known];
        if w.host_ns < last.from_host_ns {
            return Err(Rejected::OutOfOrder);
        }
        if w.previous != last.offset as u64 {
            return Err(Rejected::NotFromCurrent);
        }
        if list.len() >= VERSIONS_MAX {
            return Err(Rejected::TooMany);
        }
        let params = VcpuTsc {
            offset: w.next as i64,
            ..last.params()
        };
        let at = known + 1;
        if list.get(at).is_some_and(|u| u.params() == params) {
            list.remove(at);
        }
        list.insert(at, version(w.host_ns, params, host, false));
        Ok(())
    }

    /// A change found by reading debugfs again at `at_ns` without a write
    /// event for it: a version whose start is known only to be before.
    pub fn observed(&mut self, at_ns: u64, vcpus: &[(u32, VcpuTsc)]) {
        let Some(host) = self.line.tsc_at(at_ns) else {
            return;
        };
        for (i, v) in vcpus {
            let Some(list) = self.vcpus.get_mut(i) else {
                self.writes_rejected += 1;
                continue;
            };
            let last = list.last().expect("a vCPU has a first version");
            if last.params() != *v && list.len() < VERSIONS_MAX && at_ns >= last.from_host_ns {
                list.push(version(at_ns, *v, host, true));
            }
        }
    }

    /// Versions of `vcpu` (empty for a vCPU the VM does not have).
    pub fn versions(&self, vcpu: u32) -> &[TscVersion] {
        self.vcpus.get(&vcpu).map_or(&[], Vec::as_slice)
    }

    /// True when some vCPU's mapping changed.
    pub fn changed(&self) -> bool {
        self.vcpus.values().any(|v| v.len() > 1)
    }

    /// Host ns of guest tick `ticks` written by `vcpu` under version
    /// `version`: the one conversion (integers, checked).
    pub fn host_ns(&self, vcpu: u32, version: usize, ticks: u64) -> Option<u64> {
        let v = self.vcpus.get(&vcpu)?.get(version)?;
        let host = v.params().host_at(ticks)?;
        self.line.ns_at(host)
    }

    /// The version a tick of `vcpu` read in stream order belongs to, from
    /// `hint` (the version of the stream's previous event, whose tick was
    /// `prev`) on. Within a version the writer's ticks only go forward, so
    /// a tick below `prev` means a write came in between: the next version
    /// at least. Then the first version whose guest-tick range (its first
    /// tick up to the guest TSC at the next version's start) holds the
    /// tick, the last otherwise. A write that moved the TSC back by more
    /// than the gap between two events is always seen; one by less makes
    /// the two ranges overlap by that much and the events in the overlap
    /// keep the older version (an error of at most the jump, which the
    /// sidecar shows: the versions' offsets). None: no such vCPU.
    pub fn version_of(
        &self,
        vcpu: u32,
        hint: usize,
        prev: Option<u64>,
        ticks: u64,
    ) -> Option<usize> {
        let list = self.vcpus.get(&vcpu)?;
        let mut at = hint.min(list.len() - 1);
        if prev.is_some_and(|p| ticks < p) && at + 1 < list.len() {
            at += 1;
        }
        while let Some(next) = list.get(at + 1) {
            let cur = list[at];
            let end = self
                .line
                .tsc_at(next.from_host_ns)
                .map_or(u64::MAX, |h| cur.params().guest_at(h));
            if (cur.from_guest_ticks..end).contains(&ticks) {
                break;
            }
            at += 1;
        }
        Some(at)
    }
}

fn version(at_ns: u64, v: VcpuTsc, host_tsc: u64, time_unknown: bool) -> TscVersion {
    TscVersion {
        from_host_ns: at_ns,
        offset: v.offset,
        ratio: v.ratio,
        frac_bits: v.frac_bits,
        from_guest_ticks: v.guest_at(host_tsc),
        time_unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    /// A 3 GHz host TSC, host ns 1.7e18 at TSC 3e12.
    fn line() -> HostTscLine {
        let a = HostSample {
            tsc: 3_000_000_000_000,
            ns: 1_700_000_000 * SEC,
            gap_ticks: 20,
        };
        let b = HostSample {
            tsc: a.tsc + 30_000_000_000,
            ns: a.ns + 10 * SEC,
            gap_ticks: 20,
        };
        HostTscLine::through(a, b).unwrap()
    }

    fn plain(offset: i64) -> VcpuTsc {
        VcpuTsc {
            offset,
            ratio: 1 << 48,
            frac_bits: 48,
        }
    }

    #[test]
    fn a_write_starts_a_version_and_each_tick_maps_with_its_own() {
        let l = line();
        let t0 = l.ref_ns;
        let mut m = VersionedTsc::new(l, t0, &[(0, plain(-1_000)), (1, plain(-1_000))]).unwrap();
        // 2 s in, the guest writes its TSC back to 5e9 ticks (a reset).
        let at = t0 + 2 * SEC;
        let host = l.tsc_at(at).unwrap();
        let next = 5_000_000_000u64.wrapping_sub(host);
        let w = TscWrite {
            host_ns: at,
            vcpu: 0,
            previous: (-1_000i64) as u64,
            next,
        };
        m.apply(&w).unwrap();
        assert!(m.changed());
        assert_eq!(m.versions(0)[1].from_guest_ticks, 5_000_000_000);
        // A tick 1 s after the write, in each version: exact host ns.
        let before = plain(-1_000).guest_at(l.tsc_at(t0 + SEC).unwrap());
        let after = 5_000_000_000 + 3_000_000_000;
        assert_eq!(m.host_ns(0, 0, before), Some(t0 + SEC));
        assert_eq!(m.host_ns(0, 1, after), Some(at + SEC));
        // Stream order: `before` stays in version 0, the jump back to 5e9
        // ticks moves to version 1; vCPU 1 never changed.
        assert_eq!(m.version_of(0, 0, None, before), Some(0));
        assert_eq!(m.version_of(0, 0, Some(before), after), Some(1));
        assert_eq!(m.version_of(1, 0, None, before), Some(0));
        assert_eq!(m.version_of(7, 0, None, after), None);
    }

    #[test]
    fn hostile_writes_are_counted_never_applied() {
        let l = line();
        let mut m = VersionedTsc::new(l, l.ref_ns + SEC, &[(0, plain(0))]).unwrap();
        let w = |host_ns, vcpu, previous| TscWrite {
            host_ns,
            vcpu,
            previous,
            next: 42,
        };
        assert_eq!(
            m.apply(&w(l.ref_ns + 2 * SEC, 3, 0)),
            Err(Rejected::UnknownVcpu)
        );
        assert_eq!(
            m.apply(&w(l.ref_ns + 2 * SEC, 0, 9)),
            Err(Rejected::NotFromCurrent)
        );
        assert_eq!(m.apply(&w(l.ref_ns, 0, 0)), Err(Rejected::OutOfOrder));
        assert_eq!(m.apply(&w(u64::MAX, 0, 0)), Err(Rejected::OutOfRange));
        assert_eq!((m.writes_rejected, m.changed()), (4, false));
        for i in 0..VERSIONS_MAX as u64 + 10 {
            let previous = m.versions(0).last().unwrap().offset as u64;
            let _ = m.apply(&TscWrite {
                host_ns: l.ref_ns + 2 * SEC + i,
                vcpu: 0,
                previous,
                next: previous.wrapping_add(1),
            });
        }
        assert_eq!(m.versions(0).len(), VERSIONS_MAX);
        assert_eq!(m.writes_rejected, 4 + 11);
    }

    #[test]
    fn scaling_inverts_exactly_and_wild_values_give_none() {
        // Guest at half the host's rate (ratio 0.5, VMX's 48 fraction bits).
        let v = VcpuTsc {
            offset: -7,
            ratio: 1 << 47,
            frac_bits: 48,
        };
        for host in [0u64, 2, 3_000_000_000_000, u64::MAX / 2] {
            let g = v.guest_at(host);
            assert_eq!(v.guest_at(v.host_at(g).unwrap()), g, "host {host}");
        }
        let zero = VcpuTsc { ratio: 0, ..v };
        assert_eq!(zero.host_at(5), None);
        let fast = VcpuTsc {
            ratio: 1 << 40,
            ..v
        };
        assert_eq!(fast.host_at(u64::MAX - 100), None, "past u64 host ticks");
        assert_eq!(line().tsc_at(u64::MAX), None, "past u64 host ticks");
    }

    #[test]
    fn a_change_seen_only_in_debugfs_is_a_version_of_unknown_time() {
        let l = line();
        let mut m = VersionedTsc::new(l, l.ref_ns, &[(0, plain(0))]).unwrap();
        m.observed(l.ref_ns + 5 * SEC, &[(0, plain(-99)), (4, plain(0))]);
        let v = m.versions(0);
        assert_eq!((v.len(), v[1].time_unknown, v[1].offset), (2, true, -99));
        assert_eq!(m.writes_rejected, 1, "vCPU 4 was not there at the start");
        // The write read afterwards from the host trace explains it.
        let w = TscWrite {
            host_ns: l.ref_ns + 3 * SEC,
            vcpu: 0,
            previous: 0,
            next: (-99i64) as u64,
        };
        m.apply(&w).unwrap();
        let v = m.versions(0);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[1].from_host_ns, v[1].time_unknown),
            (l.ref_ns + 3 * SEC, false)
        );
    }
}
