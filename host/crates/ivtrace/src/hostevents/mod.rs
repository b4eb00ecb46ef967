//! Host kernel events from tracefs into `DIR/host/`: sched_switch of the
//! QEMU vCPU threads and, where KVM runs the guest, kvm_exit / kvm_entry /
//! kvm_hypercall (written as LTTng's `kvm_x86_*`).
//!
//! Placeholder until the tracefs reader lands.

use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};

use crate::hosttrace::{HClass, HostTrace};

/// Prepared (event classes known) but not started.
pub struct HostEvents;

/// Running.
pub struct Running;

impl HostEvents {
    pub fn prepare(_pid: Option<i32>, _classes: &mut Vec<HClass>) -> Result<HostEvents> {
        bail!("not implemented yet")
    }
    pub fn start(self, _trace: Arc<Mutex<HostTrace>>) -> Result<Running> {
        bail!("not implemented yet")
    }
}

impl Running {
    pub fn stop(self) -> Result<()> {
        Ok(())
    }
}
