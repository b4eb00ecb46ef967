//! A guest's clock as `ivtrace serve` keeps it: KVM's TSC offset when
//! debugfs has the VM, else the ping-pong through the region, else (a
//! writer that answers no sync request, e.g. libivtrace on a served
//! region) the estimator `ivtrace record` would use.
//!
//! The ping-pong runs whenever the writer answers sync requests: it is the
//! method under TCG and a cross-check under KVM. Its first burst runs
//! when the recording starts, so the first mapping already has a point.

use std::time::Duration;

use ivtrace_region::abi;
use ivtrace_region::region::ClockRef;
use ivtrace_region::Region;

use crate::estimator::{estimator_for, ClockEstimator, ClockSync};
use crate::kvm::KvmTsc;
use crate::mapping::ClockMapping;
use crate::pingpong::{PingPong, PingPongEstimate, SyncPoint};

/// Wakes the guest so that it answers a sync request (MSI-X vector 0).
pub type Kick = Box<dyn Fn() + Send>;

/// Every estimate a served guest has, and which one counts.
pub struct GuestClock {
    kvm: Option<KvmTsc>,
    /// Why KVM's numbers are not available (None: they are).
    pub kvm_unavailable: Option<String>,
    pingpong: Option<PingPong>,
    fallback: Option<Box<dyn ClockEstimator>>,
    header: ClockRef,
    kick: Kick,
}

impl GuestClock {
    /// Starts every estimate `region` allows: KVM's for QEMU process
    /// `qemu_pid`, the ping-pong if the writer answers sync requests and
    /// `kick` reaches it (`can_kick`), bursts every `interval`.
    pub fn start(
        region: &Region,
        qemu_pid: Option<i32>,
        can_kick: bool,
        interval: Duration,
        kick: Kick,
    ) -> GuestClock {
        let kvm = match qemu_pid {
            Some(pid) => KvmTsc::start(pid),
            None => Err("no peer pid (SO_PEERCRED)".into()),
        };
        let header = region.header();
        let can_sync = header.features & abi::IVT_FEAT_SYNC != 0 && can_kick;
        let mut pingpong = can_sync.then(|| PingPong::new(region, interval));
        if let Some(pp) = pingpong.as_mut() {
            pp.burst(region, &*kick);
        }
        let fallback = (kvm.is_err() && pingpong.is_none()).then(|| estimator_for(header));
        GuestClock {
            kvm_unavailable: kvm.as_ref().err().cloned(),
            kvm: kvm.ok(),
            pingpong,
            fallback,
            header: header.clock,
            kick,
        }
    }

    /// Which estimate counts, and why, for the log.
    pub fn describe(&self) -> String {
        match (&self.kvm, &self.pingpong) {
            (Some(k), _) => format!(
                "guest time from KVM's TSC offset/scaling ({})",
                k.vm_dir().display()
            ),
            (None, Some(_)) => format!(
                "guest time by ping-pong through the region ({})",
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

    fn exchange(&mut self, region: &Region) -> Option<SyncPoint> {
        let pp = self.pingpong.as_mut()?;
        pp.burst(region, &*self.kick)
    }

    fn final_mapping(&mut self, region: &Region, writer_may_answer: bool) -> ClockMapping {
        if writer_may_answer {
            if let Some(pp) = self.pingpong.as_mut() {
                pp.burst(region, &*self.kick);
            }
        }
        match (self.kvm.as_mut(), self.fallback.as_mut()) {
            (Some(k), _) => k.finish(),
            (None, Some(f)) => f.finish(),
            (None, None) => PingPongEstimate {
                header: self.header,
                points: self.points().to_vec(),
            }
            .finish(),
        }
    }
}
