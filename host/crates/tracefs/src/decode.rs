//! tracefs records -> host trace events, driven by the parsed formats.
//!
//! Names follow LTTng's kernel tracer so Trace Compass's analyses apply:
//! `sched_switch` with `prev_tid`/`next_tid` (tracefs says `*_pid`),
//! `sched_wakeup` / `sched_migrate_task` with `tid`, priorities minus 100
//! (`MAX_RT_PRIO`) and `prev_state` 0 for a preempted
//! task (tracefs reports `TASK_REPORT_MAX` then; the low 8 bits are the
//! task state), `kvm_x86_exit` / `kvm_x86_entry` / `kvm_x86_hypercall`
//! for kvm_exit / kvm_entry / kvm_hypercall. Every other field is carried
//! as the format file declares it (integers by size and sign, `char[N]`
//! arrays as text, `__data_loc char[]` as strings); arrays of other types
//! are left out. The writing thread's id (`common_pid`) becomes the
//! event's `_tid` context.

use std::collections::HashMap;

use ivtrace_region::classes::{EventClass, Field, FieldType};

use ivtrace_ctf::host::STREAM_KERNEL;

use crate::format::{EventFmt, FieldFmt};

/// The LTTng name of a tracefs event.
pub fn lttng_name(fmt: &EventFmt) -> String {
    match (fmt.system.as_str(), fmt.name.as_str()) {
        ("kvm", "kvm_exit") => "kvm_x86_exit".into(),
        ("kvm", "kvm_entry") => "kvm_x86_entry".into(),
        ("kvm", "kvm_hypercall") => "kvm_x86_hypercall".into(),
        (_, n) => n.into(),
    }
}

/// LTTng's name and value adjustment of a `sched` event's field: thread
/// ids are `tid` (tracefs says `pid`), priorities lose `MAX_RT_PRIO`.
fn sched_field(event: &str, field: &str) -> (Option<&'static str>, Adjust) {
    match (event, field) {
        (_, "prev_pid") => (Some("prev_tid"), Adjust::None),
        (_, "next_pid") => (Some("next_tid"), Adjust::None),
        ("sched_switch", "prev_state") => (None, Adjust::State),
        ("sched_wakeup" | "sched_waking" | "sched_migrate_task", "pid") => {
            (Some("tid"), Adjust::None)
        }
        (_, "prio" | "prev_prio" | "next_prio") => (None, Adjust::Prio),
        _ => (None, Adjust::None),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adjust {
    None,
    /// `prio - MAX_RT_PRIO`, as LTTng records priorities.
    Prio,
    /// `prev_state & 0xff`: TASK_REPORT_MAX (preempted) becomes 0.
    State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Int {
        off: usize,
        size: usize,
        adjust: Adjust,
    },
    Chars {
        off: usize,
        n: usize,
    },
    DataLocStr {
        off: usize,
    },
}

/// How to turn one event's records into payloads.
#[derive(Debug, Clone)]
pub struct EventDecoder {
    pub class_id: u32,
    ops: Vec<Op>,
}

fn is_hex(name: &str) -> bool {
    name.ends_with("rip")
        || name.starts_with("info")
        || name == "requests"
        || name == "gpa"
        || name.starts_with("addr")
}

/// The class and decoder of one format, or None for an unusable one.
pub fn class_for(fmt: &EventFmt, class_id: u32) -> (EventClass, EventDecoder) {
    let sched = fmt.system == "sched";
    let mut fields = Vec::new();
    let mut ops = Vec::new();
    for f in &fmt.fields {
        let mut name = f.name.clone();
        let mut adjust = Adjust::None;
        if sched {
            let (renamed, adj) = sched_field(&fmt.name, &name);
            if let Some(r) = renamed {
                name = r.into();
            }
            adjust = adj;
        }
        let (ty, op) = match field_kind(f) {
            Some(k) => k,
            None => continue,
        };
        let op = match op {
            Op::Int { off, size, .. } => Op::Int { off, size, adjust },
            o => o,
        };
        let hex = matches!(op, Op::Int { .. }) && is_hex(&name);
        fields.push(Field::new(name, ty, hex));
        ops.push(op);
    }
    (
        EventClass::new(class_id, STREAM_KERNEL, lttng_name(fmt), fields),
        EventDecoder { class_id, ops },
    )
}

fn field_kind(f: &FieldFmt) -> Option<(FieldType, Op)> {
    if f.data_loc {
        return (f.is_char() && f.size == 4)
            .then_some((FieldType::String, Op::DataLocStr { off: f.offset }));
    }
    if let Some(n) = f.array {
        // Text arrays count in u16 (ring's `FieldType::Chars`); a tracefs
        // record, at most a page, never holds a longer one.
        let count = u16::try_from(n).ok()?;
        return (f.is_char() && n > 0 && n == f.size)
            .then_some((FieldType::Chars(count), Op::Chars { off: f.offset, n }));
    }
    let ty = FieldType::from_integer(u32::try_from(f.size).ok()?, f.signed)?;
    Some((
        ty,
        Op::Int {
            off: f.offset,
            size: f.size,
            adjust: Adjust::None,
        },
    ))
}

/// Decodes records of the events it knows.
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    by_type: HashMap<u16, EventDecoder>,
    type_off: usize,
    pid_off: usize,
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub class_id: u32,
    pub tid: i32,
    pub payload: Vec<u8>,
}

impl Decoder {
    /// `events`: (format, class id) pairs; the common fields' offsets are
    /// taken from the first format.
    pub fn new(events: &[(EventFmt, u32)]) -> (Decoder, Vec<EventClass>) {
        let mut d = Decoder {
            type_off: 0,
            pid_off: 4,
            ..Decoder::default()
        };
        if let Some((f, _)) = events.first() {
            if let Some(c) = f.common("common_type") {
                d.type_off = c.offset;
            }
            if let Some(c) = f.common("common_pid") {
                d.pid_off = c.offset;
            }
        }
        let mut classes = Vec::new();
        for (fmt, id) in events {
            let (class, dec) = class_for(fmt, *id);
            classes.push(class);
            d.by_type.insert(fmt.id, dec);
        }
        (d, classes)
    }

    /// The payload of `rec`, or None for an unknown type or a record too
    /// short for its format.
    pub fn decode(&self, rec: &[u8]) -> Option<Decoded> {
        let ty = u16::from_le_bytes(rec.get(self.type_off..self.type_off + 2)?.try_into().ok()?);
        let dec = self.by_type.get(&ty)?;
        let tid = i32::from_le_bytes(rec.get(self.pid_off..self.pid_off + 4)?.try_into().ok()?);
        let mut out = Vec::with_capacity(64);
        for op in &dec.ops {
            match *op {
                Op::Int { off, size, adjust } => {
                    let b = rec.get(off..off + size)?;
                    match adjust {
                        Adjust::None => out.extend_from_slice(b),
                        Adjust::Prio => {
                            let mut v = [0u8; 8];
                            v[..size].copy_from_slice(b);
                            let x = i64::from_le_bytes(v) as i32;
                            out.extend_from_slice(&x.wrapping_sub(100).to_le_bytes()[..size]);
                        }
                        Adjust::State => {
                            let mut v = [0u8; 8];
                            v[..size].copy_from_slice(b);
                            let x = u64::from_le_bytes(v) & 0xff;
                            out.extend_from_slice(&x.to_le_bytes()[..size]);
                        }
                    }
                }
                Op::Chars { off, n } => out.extend_from_slice(rec.get(off..off + n)?),
                Op::DataLocStr { off } => {
                    let v = u32::from_le_bytes(rec.get(off..off + 4)?.try_into().ok()?);
                    let (start, len) = ((v & 0xffff) as usize, (v >> 16) as usize);
                    let raw = rec.get(start..start + len).unwrap_or(&[]);
                    let text = raw.split(|&c| c == 0).next().unwrap_or(&[]);
                    out.extend_from_slice(String::from_utf8_lossy(text).as_bytes());
                    out.push(0);
                }
            }
        }
        Some(Decoded {
            class_id: dec.class_id,
            tid,
            payload: out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::parse_event;
    use ivtrace_testutil::LTTNG_SCHED_SWITCH_FIELDS;

    const SCHED_SWITCH: &str = include_str!("../tests/fixtures/tracefs/sched_switch.format");
    const SCHED_WAKEUP: &str = include_str!("../tests/fixtures/tracefs/sched_wakeup.format");
    const MIGRATE: &str = include_str!("../tests/fixtures/tracefs/sched_migrate_task.format");

    #[test]
    fn wakeups_and_migrations_take_lttng_names() {
        let w = parse_event("sched", SCHED_WAKEUP).unwrap();
        let m = parse_event("sched", MIGRATE).unwrap();
        let (d, classes) = Decoder::new(&[(w.clone(), 101), (m, 102)]);
        let names = |i: usize| -> Vec<String> {
            classes[i].fields.iter().map(|f| f.name.clone()).collect()
        };
        assert_eq!(names(0), ["comm", "tid", "prio", "target_cpu"]);
        assert_eq!(names(1), ["comm", "tid", "prio", "orig_cpu", "dest_cpu"]);
        let mut rec = vec![0u8; 36];
        rec[0..2].copy_from_slice(&w.id.to_le_bytes());
        rec[8..12].copy_from_slice(b"CPU ");
        rec[24..28].copy_from_slice(&4242i32.to_le_bytes());
        rec[28..32].copy_from_slice(&120i32.to_le_bytes());
        rec[32..36].copy_from_slice(&1i32.to_le_bytes());
        let p = d.decode(&rec).unwrap().payload;
        assert_eq!(i32::from_le_bytes(p[16..20].try_into().unwrap()), 4242);
        assert_eq!(i32::from_le_bytes(p[20..24].try_into().unwrap()), 20);
        assert_eq!(i32::from_le_bytes(p[24..28].try_into().unwrap()), 1);
    }

    #[test]
    fn sched_switch_takes_lttng_names_and_values() {
        let f = parse_event("sched", SCHED_SWITCH).unwrap();
        let (d, classes) = Decoder::new(&[(f.clone(), 100)]);
        let names: Vec<&str> = classes[0].fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, LTTNG_SCHED_SWITCH_FIELDS);
        let mut rec = vec![0u8; 64];
        rec[0..2].copy_from_slice(&f.id.to_le_bytes());
        rec[4..8].copy_from_slice(&77i32.to_le_bytes());
        rec[8..12].copy_from_slice(b"qemu");
        rec[24..28].copy_from_slice(&77i32.to_le_bytes());
        rec[28..32].copy_from_slice(&120i32.to_le_bytes());
        rec[32..40].copy_from_slice(&0x100i64.to_le_bytes()); // preempted
        rec[56..60].copy_from_slice(&9i32.to_le_bytes());
        rec[60..64].copy_from_slice(&139i32.to_le_bytes());
        let e = d.decode(&rec).unwrap();
        assert_eq!((e.class_id, e.tid), (100, 77));
        let p = &e.payload;
        assert_eq!(&p[0..4], b"qemu");
        assert_eq!(i32::from_le_bytes(p[16..20].try_into().unwrap()), 77);
        assert_eq!(i32::from_le_bytes(p[20..24].try_into().unwrap()), 20);
        assert_eq!(i64::from_le_bytes(p[24..32].try_into().unwrap()), 0);
        assert_eq!(i32::from_le_bytes(p[52..56].try_into().unwrap()), 39);
        assert!(d.decode(&rec[..40]).is_none());
        rec[0] ^= 0xff;
        assert!(d.decode(&rec).is_none());
    }
}
