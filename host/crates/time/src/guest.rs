//! A guest's clock as a recording keeps it: KVM's TSC offset when
//! debugfs has the VM, else the clock exchange through the region, else (a
//! writer that answers no sync request, e.g. libivtrace on a served
//! region) the region's own estimator.
//!
//! The exchange runs whenever the writer answers sync requests and the
//! host has a way in ([`Entry`]): it is the method under TCG and a
//! cross-check under KVM. A kicked writer's first burst runs when the
//! recording starts, so the first mapping already has a point; a polled
//! writer's as soon as its poll comes.

use std::time::Duration;

use ivtrace_region::abi;
use ivtrace_region::Region;

use crate::estimator::{estimator_for, ClockEstimator, ClockSync};
use crate::kvm::KvmTsc;
use crate::mapping::ClockMapping;
use crate::pingpong::{Entry, PingPong, SyncPoint, SyncReport};

/// The sidecar's `clock_sync`: how the final mapping was measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClockSyncSection {
    pub method: String,
    pub error_ns: u64,
    /// KVM's TSC parameters (debugfs), when they were read.
    pub kvm: Option<KvmSection>,
    /// Why they were not.
    pub kvm_unavailable: Option<String>,
    /// The clock exchange through the region, when it ran.
    pub pingpong: Option<SyncReport>,
}

impl ClockSyncSection {
    /// KVM's `kvm_write_tsc_offset` events of the recording (read back
    /// from the host trace) applied to the versioned mapping.
    pub fn follow_tsc_writes(&mut self, writes: &[crate::versioned::TscWrite]) {
        let Some(v) = self.kvm.as_mut().and_then(|k| k.versions.as_mut()) else {
            return;
        };
        for w in writes {
            let _ = v.apply(w);
        }
    }
}

/// KVM's part of [`ClockSyncSection`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct KvmSection {
    pub debugfs: String,
    pub changed: Option<String>,
    /// The mapping's versions (the vCPUs' TSC parameters and from when),
    /// once the recording ended ([`crate::versioned`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions: Option<crate::versioned::VersionedTsc>,
}

/// Every estimate a guest's recording has, and which one counts.
pub struct GuestClock {
    kvm: Option<KvmTsc>,
    /// Why KVM's numbers are not available (None: they are).
    pub kvm_unavailable: Option<String>,
    pingpong: Option<PingPong>,
    fallback: Option<Box<dyn ClockEstimator>>,
}

impl GuestClock {
    /// Starts every estimate `region` allows: KVM's for QEMU process
    /// `qemu_pid`, the exchange if the writer answers sync requests and
    /// `entry` gets it in, bursts every `interval`.
    pub fn start(
        region: &Region,
        qemu_pid: Option<i32>,
        entry: Option<Entry>,
        interval: Duration,
    ) -> GuestClock {
        let kvm = match qemu_pid {
            Some(pid) => KvmTsc::start(pid),
            None => Err("no QEMU pid".into()),
        };
        let header = region.header();
        let entry = entry.filter(|_| header.features & abi::IVT_FEAT_SYNC != 0);
        let mut pingpong = entry.map(|e| PingPong::new(region, e, interval));
        if let Some(pp) = pingpong.as_mut().filter(|pp| !pp.polled()) {
            pp.step(region);
        }
        let fallback = (kvm.is_err() && pingpong.is_none()).then(|| estimator_for(header));
        GuestClock {
            kvm_unavailable: kvm.as_ref().err().cloned(),
            kvm: kvm.ok(),
            pingpong,
            fallback,
        }
    }

    /// Which estimate counts, and why, for the log.
    pub fn describe(&self) -> String {
        match (&self.kvm, &self.pingpong) {
            (Some(k), _) => format!(
                "guest time from KVM's TSC offset/scaling ({})",
                k.vm_dir().display()
            ),
            (None, Some(pp)) => format!(
                "guest time by the clock exchange through the region, the writer {} ({})",
                match (pp.polled(), pp.spins()) {
                    (false, true) => "kicked, then spinning",
                    (true, true) => "met at its control poll, then spinning",
                    (false, false) => "kicked for every round trip (no IVT_FEAT_SYNC_SPIN)",
                    (true, false) => "answering once per control poll (no IVT_FEAT_SYNC_SPIN)",
                },
                self.kvm_unavailable.as_deref().unwrap_or("no KVM clock")
            ),
            (None, None) => {
                "guest time from the region header (no KVM clock, no sync mailbox)".into()
            }
        }
    }

    pub fn kvm(&self) -> Option<&KvmTsc> {
        self.kvm.as_ref()
    }

    pub fn pingpong(&self) -> Option<&PingPong> {
        self.pingpong.as_ref()
    }

    /// The points the ping-pong kept so far.
    pub fn points(&self) -> &[SyncPoint] {
        self.pingpong.as_ref().map_or(&[], |pp| pp.points())
    }
}

impl ClockSync for GuestClock {
    fn initial_mapping(&self) -> ClockMapping {
        match (&self.kvm, &self.pingpong, &self.fallback) {
            (Some(k), _, _) => k.initial(),
            (None, Some(pp), _) => pp.mapping(),
            (None, None, Some(f)) => f.initial(),
            (None, None, None) => unreachable!("fallback is set when both are missing"),
        }
    }

    fn until_due(&self) -> Option<Duration> {
        self.pingpong.as_ref().map(PingPong::until_due)
    }

    fn sync_section(&self, mapping: &ClockMapping) -> Option<ClockSyncSection> {
        Some(ClockSyncSection {
            method: mapping.method.clone(),
            error_ns: mapping.error_ns,
            kvm: self.kvm.as_ref().map(|k| KvmSection {
                debugfs: k.vm_dir().display().to_string(),
                changed: k.changed.clone(),
                versions: k.versions().cloned(),
            }),
            kvm_unavailable: self.kvm_unavailable.clone(),
            pingpong: self.pingpong.as_ref().map(PingPong::report),
        })
    }

    fn exchange(&mut self, region: &Region) -> Option<SyncPoint> {
        self.pingpong.as_mut()?.step(region)
    }

    fn final_mapping(&mut self, region: &Region, writer_may_answer: bool) -> ClockMapping {
        if writer_may_answer {
            if let Some(pp) = self.pingpong.as_mut() {
                pp.last_burst(region);
            }
        }
        match (self.kvm.as_mut(), self.fallback.as_mut(), &self.pingpong) {
            (Some(k), _, _) => k.finish(),
            (None, Some(f), _) => f.finish(),
            (None, None, Some(pp)) => pp.mapping(),
            (None, None, None) => unreachable!("fallback is set when both are missing"),
        }
    }
}
