//! `DIR/vm/`: the VM view, a CTF 1.8 trace of what the host did to the
//! guest's vCPUs (preempted, blocked, in the hypervisor; hypercalls), on
//! the **guest's** time base.
//!
//! Its packets are [`crate::host_trace`]'s (byte-aligned integers, a u32 id and a
//! u64 timestamp per event, `cpu_id` in the packet context, a `_tid` event
//! context in stream class 0), so [`crate::host_trace::HostTrace`] writes them
//! and [`crate::read`] reads them back. What differs is the clock: the
//! guest kernel trace's own clock block (the same name, UUID, frequency
//! and offset), timestamps in its nanoseconds since the epoch, which are
//! the host times the events happened at (the mapping's inverse, then the
//! mapping, is the identity). Readers therefore see one
//! machine: babeltrace2 interleaves the VM view with the guest's events,
//! and Trace Compass, which identifies a machine by its clock UUID, puts
//! the VM view's streams beside the guest kernel's. A stream's `cpu_id` is
//! the guest CPU (= KVM's `vcpu_id`), and an event's `_tid` is the guest
//! thread that was running on that vCPU.

use std::fmt::Write;

use ivtrace_region::classes::EventClass;
use ivtrace_time::ClockMapping;

use crate::host_trace::{random_uuid, STREAM_IVTRACE, STREAM_KERNEL};
use crate::tsdl::{
    creation_datetime, escape, write_clock_block, write_env_entries, write_event,
    write_host_stream, EnvValue, Timebase, CLOCK_NAME, HOST_PRELUDE,
};

/// What the VM view's metadata says about itself.
pub struct VmTraceDesc<'a> {
    /// The guest's name (the guest traces' `hostname`).
    pub hostname: &'a str,
    pub trace_name: &'a str,
    /// The guest traces' clock mapping and clock UUID.
    pub clock: &'a ClockMapping,
    pub clock_uuid: &'a str,
    pub env: Vec<(String, EnvValue)>,
}

/// The complete metadata of a VM view trace declaring `classes`.
pub fn vm_metadata(desc: &VmTraceDesc, classes: &[EventClass]) -> String {
    let mut t = String::from("/* CTF 1.8 */\n\n");
    t.push_str(HOST_PRELUDE);
    let _ = write!(
        t,
        "trace {{\n\tmajor = 1;\n\tminor = 8;\n\tuuid = \"{}\";\n\tbyte_order = le;\n\
         \tpacket.header := struct {{\n\t\th_u32 magic;\n\t\th_u32 stream_id;\n\
         \t\th_u64 stream_instance_id;\n\t}};\n}};\n\n",
        random_uuid()
    );
    write_vm_env(&mut t, desc);
    write_guest_clock(&mut t, desc);
    write_host_stream(
        &mut t,
        STREAM_KERNEL,
        "\tevent.context := struct {\n\t\tinteger { size = 32; align = 8; signed = true; } _tid;\n\t};\n",
    );
    write_host_stream(&mut t, STREAM_IVTRACE, "");
    for c in classes {
        write_event(&mut t, c);
    }
    t
}

/// Not an LTTng kernel trace (Trace Compass must not run its kernel
/// analysis on it): ivtrace's own tracer name, domain `vm`.
fn write_vm_env(t: &mut String, desc: &VmTraceDesc) {
    t.push_str("env {\n");
    let _ = writeln!(t, "\thostname = \"{}\";", escape(desc.hostname));
    t.push_str("\tdomain = \"vm\";\n\ttracer_name = \"ivtrace\";\n");
    let version: Vec<i64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    let _ = writeln!(t, "\ttracer_major = {};", version.first().unwrap_or(&0));
    let _ = writeln!(t, "\ttracer_minor = {};", version.get(1).unwrap_or(&0));
    let _ = writeln!(t, "\ttrace_name = \"{}\";", escape(desc.trace_name));
    let _ = writeln!(
        t,
        "\ttrace_creation_datetime = \"{}\";",
        creation_datetime(std::time::SystemTime::now())
    );
    t.push_str("\tivtrace_vm_view = 1;\n");
    write_env_entries(t, &desc.env);
    t.push_str("};\n\n");
}

/// The guest kernel trace's clock block, word for word what its metadata
/// says (nanoseconds since the epoch, [`Timebase::Nanoseconds`]), and the
/// byte-aligned clock type of [`crate::host_trace`]'s packets mapped to it.
fn write_guest_clock(t: &mut String, desc: &VmTraceDesc) {
    write_clock_block(t, desc.clock_uuid, desc.clock, Timebase::Nanoseconds);
    let _ = writeln!(
        t,
        "typealias integer {{ size = 64; align = 8; signed = false; map = clock.{CLOCK_NAME}.value; }} := h_clock_t;\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_region::classes::{Field, FieldType};

    fn clock() -> ClockMapping {
        ClockMapping {
            freq_hz: 2_400_000_000,
            ref_ticks: 5_000_000_000,
            ref_realtime_ns: 1_795_500_000_000_000_000,
            error_ns: 30_000,
            method: "pingpong-fit".into(),
            coarse: false,
            samples: 12,
        }
    }

    #[test]
    fn metadata_names_the_guest_clock() {
        let c = clock();
        let desc = VmTraceDesc {
            hostname: "web1",
            trace_name: "web1-vm",
            clock: &c,
            clock_uuid: "c1c1c1c1-0000-4000-8000-00000000000c",
            env: vec![("ivtrace_qemu_pid".into(), EnvValue::Int(42))],
        };
        let classes = [EventClass::new(
            0,
            STREAM_KERNEL,
            "vcpu_preempted".into(),
            vec![Field::new("duration_ns", FieldType::U64, false)],
        )];
        let m = vm_metadata(&desc, &classes);
        for needle in [
            "name = \"ivt_clock\";",
            "uuid = \"c1c1c1c1-0000-4000-8000-00000000000c\";",
            "freq = 1000000000;",
            "precision = 30000;",
            "offset_s = 0;",
            "offset = 0;",
            "map = clock.ivt_clock.value; } := h_clock_t;",
            "domain = \"vm\";",
            "hostname = \"web1\";",
            "ivtrace_qemu_pid = 42;",
            "_tid;",
            "name = \"vcpu_preempted\";",
        ] {
            assert!(m.contains(needle), "missing {needle:?} in\n{m}");
        }
    }
}
