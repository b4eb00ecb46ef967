//! ivtrace-vmview: the guest seen from the host.
//!
//! The host trace (`DIR/host/`) says when each QEMU vCPU thread was taken
//! off its host CPU, slept, woke, and (under KVM) left the guest for the
//! hypervisor; the guest kernel trace (`DIR/kernel/`) says which guest
//! thread ran on each vCPU. This crate relates the two:
//!
//! - [`timeline`]: the derivation, a pure state machine over decoded host
//!   events: intervals when a vCPU did not run guest code (preempted,
//!   blocked, in the hypervisor, by exit reason), hypercalls aggregated
//!   from kvm_exit + kvm_hypercall + kvm_entry, vmsync events;
//! - [`attribute`]: each interval's guest thread, from the guest's
//!   context switches;
//! - [`stats`]: the numbers `ivtrace report` prints;
//! - [`classes`]: the VM view's events (`DIR/vm/`, on the guest's clock);
//! - [`report`]: the VM view read back into the same statistics;
//! - [`selfcheck`]: the clock mapping checked on cause -> effect pairs of
//!   the two traces (a guest event before its vCPU's switch-out, a
//!   switch-in before the guest's next event, a doorbell before its
//!   reception);
//! - [`input`] reads the two traces back (CTF, with the layouts they were
//!   written with) and [`derive`](mod@derive) runs it all at the end of a recording.
//!
//! [`model`] holds the plain values everything passes around.

pub mod attribute;
pub mod classes;
pub mod derive;
pub mod error;
pub mod input;
pub mod model;
pub mod report;
pub mod selfcheck;
pub mod stats;
pub mod timeline;
