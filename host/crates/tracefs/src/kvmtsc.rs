//! `kvm_write_tsc_offset` records (host tracepoint: a vCPU's TSC offset
//! changed) as the writes of KVM's versioned guest-TSC mapping
//! ([`ivtrace_time::versioned`]). The layout comes from the running
//! kernel's format file, like every host event's ([`crate::decode`]).

use ivtrace_time::versioned::TscWrite;

use crate::format::EventFmt;

/// The tracepoint's name, in the `kvm` system.
pub const EVENT: &str = "kvm_write_tsc_offset";

/// Record `rec` of format `f` (`kvm:kvm_write_tsc_offset`), at host time
/// `host_ns`, as a write; None when `f` is another event or lacks one of
/// `vcpu_id`, `previous_tsc_offset`, `next_tsc_offset`, or `rec` is short.
pub fn tsc_write(f: &EventFmt, host_ns: u64, rec: &[u8]) -> Option<TscWrite> {
    if f.name != EVENT {
        return None;
    }
    let vcpu = f.field("vcpu_id")?.uint(rec)?;
    Some(TscWrite {
        host_ns,
        vcpu: u32::try_from(vcpu).ok()?,
        previous: f.field("previous_tsc_offset")?.uint(rec)?,
        next: f.field("next_tsc_offset")?.uint(rec)?,
    })
}
