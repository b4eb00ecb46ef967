//! The VM view's events (`DIR/vm/`, one stream per vCPU whose `cpu_id` is
//! the guest CPU, on the guest's clock; docs/kvm.md "The VM view"), their
//! payloads written and read back.
//!
//! An interval is an event at its start (`vcpu_preempted`,
//! `vcpu_blocked` or `vcpu_hypervisor`, with its duration, so a reader
//! needs no pairing) and `vcpu_interval_end` at its end, so that in a
//! merged view the guest's events before and after it sit on either side.
//! A preempted interval is followed by one `vcpu_host_ran` per host task
//! that ran on the vCPU thread's CPU meanwhile. `vcpu_runnable_untraced`
//! marks a wait whose end the host kernel did not trace (its duration is
//! an upper bound). Every event's `_tid` context is the guest thread that
//! was running on the vCPU.

use ivtrace_ctf::host_trace::{Payload, STREAM_KERNEL};
use ivtrace_ctf::read::Record;
use ivtrace_region::classes::{EventClass, Field, FieldType};

use crate::model::{Comm, ExitRef, GuestThread, Hypercall, Interval, State, Task};

pub const PREEMPTED: u32 = 0;
pub const BLOCKED: u32 = 1;
pub const HYPERVISOR: u32 = 2;
pub const HOST_RAN: u32 = 3;
pub const INTERVAL_END: u32 = 4;
pub const HYPERCALL: u32 = 5;
pub const UNTRACED: u32 = 6;

/// `host_tid` of the `vcpu_host_ran` that sums the tasks past the listed
/// ones.
pub const OTHER_TASKS: i32 = -2;

fn f(name: &str, ty: FieldType) -> Field {
    Field::new(name, ty, false)
}

fn hex(name: &str) -> Field {
    Field::new(name, FieldType::U64, true)
}

/// The fields of the three interval events.
fn interval_fields() -> Vec<Field> {
    vec![
        f("guest_comm", FieldType::Chars(16)),
        f("duration_ns", FieldType::U64),
        f("host_tid", FieldType::S32),
        f("host_cpu", FieldType::U32),
        f("exit_isa", FieldType::U32),
        f("exit_reason", FieldType::S64),
        hex("guest_rip"),
        f("exit_first", FieldType::U8),
        f("truncated", FieldType::U8),
        f("taken_by_tid", FieldType::S32),
        f("taken_by_comm", FieldType::Chars(16)),
    ]
}

/// Every class of the VM view, ids as above.
pub fn classes() -> Vec<EventClass> {
    let c = |id, name: &str, fields| EventClass::new(id, STREAM_KERNEL, name.into(), fields);
    vec![
        c(PREEMPTED, "vcpu_preempted", interval_fields()),
        c(UNTRACED, "vcpu_runnable_untraced", interval_fields()),
        c(BLOCKED, "vcpu_blocked", interval_fields()),
        c(HYPERVISOR, "vcpu_hypervisor", interval_fields()),
        c(
            HOST_RAN,
            "vcpu_host_ran",
            vec![
                f("host_tid", FieldType::S32),
                f("host_comm", FieldType::Chars(16)),
                f("duration_ns", FieldType::U64),
            ],
        ),
        c(
            INTERVAL_END,
            "vcpu_interval_end",
            vec![f("state", FieldType::U8), f("duration_ns", FieldType::U64)],
        ),
        c(
            HYPERCALL,
            "vm_hypercall",
            vec![
                f("guest_comm", FieldType::Chars(16)),
                hex("nr"),
                hex("a0"),
                hex("a1"),
                hex("a2"),
                hex("a3"),
                f("vcpu_id", FieldType::U32),
                hex("guest_rip"),
                f("exit_overhead_ns", FieldType::U64),
                f("entry_seen", FieldType::U8),
                f("host_tid", FieldType::S32),
                f("exit_cpu", FieldType::U32),
                f("entry_cpu", FieldType::S32),
            ],
        ),
    ]
}

pub fn class_of(state: State) -> u32 {
    match state {
        State::Preempted => PREEMPTED,
        State::Blocked => BLOCKED,
        State::Hypervisor => HYPERVISOR,
        State::Untraced => UNTRACED,
    }
}

fn chars(p: Payload, c: &Comm) -> Payload {
    let mut v = p.0;
    v.extend_from_slice(c);
    Payload(v)
}

/// The payload of an interval's start event.
pub fn interval_payload(i: &Interval, g: &GuestThread) -> Vec<u8> {
    let (isa, reason, rip, first) = match i.exit {
        Some(e) => (e.isa, i64::from(e.reason), e.guest_rip, e.first as u8),
        None => (0, -1, 0, 0),
    };
    let by = i.taken_by.unwrap_or(Task {
        tid: -1,
        comm: [0; 16],
    });
    let p = chars(Payload::default(), &g.comm)
        .u64(i.duration())
        .i32(i.host_tid)
        .u32(i.host_cpu)
        .u32(isa)
        .i64(reason)
        .u64(rip)
        .u8(first)
        .u8(i.truncated as u8)
        .i32(by.tid);
    chars(p, &by.comm).0
}

pub fn host_ran_payload(t: &Task, ns: u64) -> Vec<u8> {
    chars(Payload::default().i32(t.tid), &t.comm).u64(ns).0
}

pub fn interval_end_payload(i: &Interval) -> Vec<u8> {
    Payload::default().u8(i.state as u8).u64(i.duration()).0
}

pub fn hypercall_payload(h: &Hypercall, g: &GuestThread) -> Vec<u8> {
    let mut p = chars(Payload::default(), &g.comm).u64(h.nr);
    for a in h.args {
        p = p.u64(a);
    }
    p.u32(h.vcpu)
        .u64(h.guest_rip)
        .u64(h.exit_ns.unwrap_or(0))
        .u8(h.exit_ns.is_some() as u8)
        .i32(h.host_tid)
        .u32(h.exit_cpu)
        .i32(h.entry_cpu.map_or(-1, |c| c as i32))
        .0
}

fn uint(r: &Record, i: usize) -> Option<u64> {
    r.int(i).map(|v| v as u64)
}

fn int(r: &Record, i: usize) -> Option<i64> {
    r.int(i)
}

fn comm(r: &Record, i: usize) -> Option<Comm> {
    r.field(i)?.try_into().ok()
}

/// An interval's start event read back (`vcpu` is the stream's CPU; the
/// end is start + duration).
pub fn read_interval(r: &Record, vcpu: u32, start: u64) -> Option<(Interval, GuestThread)> {
    let state = match r.class_id() {
        PREEMPTED => State::Preempted,
        BLOCKED => State::Blocked,
        HYPERVISOR => State::Hypervisor,
        UNTRACED => State::Untraced,
        _ => return None,
    };
    let reason = int(r, 5)?;
    let exit = (reason >= 0).then(|| ExitRef {
        isa: uint(r, 4).unwrap_or(0) as u32,
        reason: reason as u32,
        guest_rip: uint(r, 6).unwrap_or(0),
        first: uint(r, 7) == Some(1),
    });
    let by_tid = int(r, 9)? as i32;
    let i = Interval {
        vcpu,
        state,
        start,
        end: start.saturating_add(uint(r, 1)?),
        host_tid: int(r, 2)? as i32,
        host_cpu: uint(r, 3)? as u32,
        exit,
        taken_by: (by_tid >= 0).then(|| Task {
            tid: by_tid,
            comm: comm(r, 10).unwrap_or([0; 16]),
        }),
        ran: Vec::new(),
        ran_other_ns: 0,
        truncated: uint(r, 8) == Some(1),
    };
    Some((
        i,
        GuestThread {
            tid: r.tid.unwrap_or(0),
            comm: comm(r, 0)?,
        },
    ))
}

/// A `vcpu_host_ran` read back: the task and its time.
pub fn read_host_ran(r: &Record) -> Option<(Task, u64)> {
    (r.class_id() == HOST_RAN).then_some(())?;
    let t = Task {
        tid: int(r, 0)? as i32,
        comm: comm(r, 1)?,
    };
    Some((t, uint(r, 2)?))
}

/// A `vm_hypercall` read back (`ts` in host time).
pub fn read_hypercall(r: &Record, ts: u64) -> Option<(Hypercall, GuestThread)> {
    (r.class_id() == HYPERCALL).then_some(())?;
    let complete = uint(r, 9)? == 1;
    let entry_cpu = int(r, 12)?;
    let h = Hypercall {
        vcpu: uint(r, 6)? as u32,
        host_tid: int(r, 10)? as i32,
        ts,
        exit_ts: ts,
        nr: uint(r, 1)?,
        args: [uint(r, 2)?, uint(r, 3)?, uint(r, 4)?, uint(r, 5)?],
        guest_rip: uint(r, 7)?,
        exit_ns: complete.then(|| uint(r, 8)).flatten(),
        exit_cpu: uint(r, 11)? as u32,
        entry_cpu: (entry_cpu >= 0).then_some(entry_cpu as u32),
    };
    Some((
        h,
        GuestThread {
            tid: r.tid.unwrap_or(0),
            comm: comm(r, 0)?,
        },
    ))
}
