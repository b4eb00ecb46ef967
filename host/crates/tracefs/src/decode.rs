//! tracefs records -> host trace events, driven by the parsed formats.
//!
//! Names follow LTTng's kernel tracer so Trace Compass's analyses apply:
//! `sched_switch` with `prev_tid`/`next_tid` (tracefs says `*_pid`), the
//! other `sched` events with `tid` (`parent_tid`, `child_tid`, `old_tid`),
//! priorities minus 100
//! (`MAX_RT_PRIO`) and `prev_state` 0 for a preempted
//! task (tracefs reports `TASK_REPORT_MAX` then; the low 8 bits are the
//! task state), `kvm_x86_exit` / `kvm_x86_entry` / `kvm_x86_hypercall`
//! for kvm_exit / kvm_entry / kvm_hypercall. Every other field is carried
//! as the format file declares it (integers by size and sign, `char[N]`
//! arrays as text, `__data_loc char[]` as strings); arrays of other types
//! are left out. The writing thread's id (`common_pid`) becomes the
//! event's `_tid` context.

// Guest input (a guest's format files and ftrace pages): every arithmetic
// is checked or saturating, every narrowing cast explicit (docs/hardening.md).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::collections::HashMap;

use ivtrace_region::bytes::{i32_at, slice_at, u16_at, u32_at, uint_at};
use ivtrace_region::classes::{EventClass, Field, FieldType};

use ivtrace_ctf::host_trace::STREAM_KERNEL;

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

/// LTTng's name and value adjustment of a `sched` (or `task`) event's
/// field: thread ids are `tid` (tracefs says `pid`), priorities lose
/// `MAX_RT_PRIO`.
fn sched_field(event: &str, field: &str) -> (Option<&'static str>, Adjust) {
    match (event, field) {
        (_, "prev_pid") => (Some("prev_tid"), Adjust::None),
        (_, "next_pid") => (Some("next_tid"), Adjust::None),
        ("sched_switch", "prev_state") => (None, Adjust::State),
        ("sched_process_fork", "parent_pid") => (Some("parent_tid"), Adjust::None),
        ("sched_process_fork", "child_pid") => (Some("child_tid"), Adjust::None),
        ("sched_process_exec", "old_pid") => (Some("old_tid"), Adjust::None),
        ("sched_process_fork", _) => (None, Adjust::None),
        (_, "pid") => (Some("tid"), Adjust::None),
        (_, "prio" | "prev_prio" | "next_prio") => (None, Adjust::Prio),
        _ => (None, Adjust::None),
    }
}

/// How a field's value changes on its way to the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjust {
    None,
    /// `prio - MAX_RT_PRIO`, as LTTng records priorities.
    Prio,
    /// `prev_state & 0xff`: TASK_REPORT_MAX (preempted) becomes 0.
    State,
    /// A block request's `rwbs` text (`char rwbs[8]`, "WS", "FWFS", ...)
    /// as LTTng's u32 flag bits ([`rwbs_flags`]), which Trace Compass's
    /// disk analysis reads.
    Rwbs,
}

/// What one field of a format becomes: its name in the trace, how its
/// value changes, whether it is shown in hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPlan {
    pub name: String,
    pub adjust: Adjust,
    pub hex: bool,
}

/// LTTng's `RWBS_FLAG_*` bits (lttng-modules' block instrumentation).
pub mod rwbs {
    pub const WRITE: u32 = 1 << 0;
    pub const DISCARD: u32 = 1 << 1;
    pub const READ: u32 = 1 << 2;
    pub const RAHEAD: u32 = 1 << 3;
    pub const SYNC: u32 = 1 << 5;
    pub const META: u32 = 1 << 6;
    pub const SECURE: u32 = 1 << 7;
    pub const FLUSH: u32 = 1 << 8;
    pub const FUA: u32 = 1 << 9;
    pub const PREFLUSH: u32 = 1 << 10;
}

/// Linux's `blk_fill_rwbs()` text back to LTTng's flag bits: an optional
/// `F` (preflush), the operation (`W`, `D`, `DE` secure erase, `F` flush,
/// `R`, `N` none), then `F` (FUA), `A` (read-ahead), `S` (sync), `M` (meta).
pub fn rwbs_flags(text: &[u8]) -> u32 {
    let mut rest = text.split(|&c| c == 0).next().unwrap_or(&[]);
    let mut flags = 0;
    // A leading F before an operation is a preflush.
    if let [b'F', op, ..] = rest {
        if b"WDFRN".contains(op) {
            flags |= rwbs::PREFLUSH;
            rest = &rest[1..];
        }
    }
    rest = match rest {
        [b'W', tail @ ..] => {
            flags |= rwbs::WRITE;
            tail
        }
        [b'D', b'E', tail @ ..] => {
            flags |= rwbs::DISCARD | rwbs::SECURE;
            tail
        }
        [b'D', tail @ ..] => {
            flags |= rwbs::DISCARD;
            tail
        }
        [b'F', tail @ ..] => {
            flags |= rwbs::FLUSH;
            tail
        }
        [b'R', tail @ ..] => {
            flags |= rwbs::READ;
            tail
        }
        [_, tail @ ..] => tail,
        [] => rest,
    };
    for c in rest {
        flags |= match c {
            b'F' => rwbs::FUA,
            b'A' => rwbs::RAHEAD,
            b'S' => rwbs::SYNC,
            b'M' => rwbs::META,
            _ => 0,
        };
    }
    flags
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
    /// `char buf[]` of size 0 (print's text, trace_marker): the rest of
    /// the record, up to a NUL, as a string.
    TailStr {
        off: usize,
    },
    /// `char rwbs[n]` written as a u32 ([`Adjust::Rwbs`]).
    Rwbs {
        off: usize,
        n: usize,
    },
}

/// Text up to its first NUL as a CTF string (invalid UTF-8 replaced).
fn put_text(out: &mut Vec<u8>, raw: &[u8]) {
    let text = raw.split(|&c| c == 0).next().unwrap_or(&[]);
    out.extend_from_slice(String::from_utf8_lossy(text).as_bytes());
    out.push(0);
}

/// Linux's `blk_fill_rwbs()` text of LTTng's flag bits (the inverse of
/// [`rwbs_flags`]; no operation bit is `N`).
pub fn rwbs_text(flags: u32) -> Vec<u8> {
    let mut t = Vec::with_capacity(8);
    let has = |bit: u32| flags & bit != 0;
    if has(rwbs::PREFLUSH) {
        t.push(b'F');
    }
    if has(rwbs::WRITE) {
        t.push(b'W');
    } else if has(rwbs::DISCARD) && has(rwbs::SECURE) {
        t.extend_from_slice(b"DE");
    } else if has(rwbs::DISCARD) {
        t.push(b'D');
    } else if has(rwbs::FLUSH) {
        t.push(b'F');
    } else if has(rwbs::READ) {
        t.push(b'R');
    } else {
        t.push(b'N');
    }
    for (bit, c) in [
        (rwbs::FUA, b'F'),
        (rwbs::RAHEAD, b'A'),
        (rwbs::SYNC, b'S'),
        (rwbs::META, b'M'),
    ] {
        if has(bit) {
            t.push(c);
        }
    }
    t
}

/// How to turn one event's records into payloads, and back.
#[derive(Debug, Clone)]
pub struct EventDecoder {
    pub class_id: u32,
    ops: Vec<Op>,
    /// The record's fixed part (common fields and fields), and where the
    /// common type and pid are in it.
    len: usize,
    type_off: usize,
    pid_off: usize,
}

/// Writes `bytes` at `off` of `r`; nothing if they do not fit.
fn put(r: &mut [u8], off: usize, bytes: &[u8]) {
    if let Some(dst) = r.get_mut(off..off.saturating_add(bytes.len())) {
        dst.copy_from_slice(bytes);
    }
}

/// A value to write into a record's field ([`EventDecoder::encode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Int(i64),
    Text(&'a [u8]),
}

impl EventDecoder {
    /// A record of this event in its format's layout, from the values of
    /// its class's fields (in class order; None leaves the field zero):
    /// each value turned back as the field's plan changed it (priorities
    /// plus `MAX_RT_PRIO`, rwbs flag bits to text; a preempted task's
    /// `prev_state` lost its `TASK_REPORT_MAX` and stays without it), text
    /// arrays NUL-padded and cut to their size, dynamic strings after the
    /// fixed part. `ty` and `pid` are its `common_type` and `common_pid`.
    // Offsets and sizes are a format's the catalog accepted (every field
    // ends within a record, 1 MiB: format::check_bounds); each write goes
    // through `put`, which skips a field outside the record. The casts:
    // rwbs flags are 32 bits; a dynamic string's place and length are
    // below u16::MAX (checked).
    #[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
    pub fn encode(&self, ty: u16, pid: i32, values: &[Option<Value>]) -> Vec<u8> {
        let len = self
            .len
            .max(self.pid_off.saturating_add(4))
            .max(self.type_off.saturating_add(2));
        let mut r = vec![0u8; len];
        put(&mut r, self.type_off, &ty.to_le_bytes());
        put(&mut r, self.pid_off, &pid.to_le_bytes());
        for (op, v) in self.ops.iter().zip(values) {
            match (*op, *v) {
                (Op::Int { off, size, adjust }, Some(Value::Int(x))) => {
                    let x = match adjust {
                        Adjust::Prio => x.wrapping_add(100),
                        _ => x,
                    };
                    put(&mut r, off, &x.to_le_bytes()[..size.min(8)]);
                }
                (Op::Chars { off, n }, Some(Value::Text(t))) => {
                    put(&mut r, off, &t[..t.len().min(n)]);
                }
                (Op::Rwbs { off, n }, Some(Value::Int(x))) => {
                    let t = rwbs_text(x as u32);
                    put(&mut r, off, &t[..t.len().min(n)]);
                }
                (Op::DataLocStr { off }, Some(Value::Text(t))) => {
                    let t = &t[..t.len().min(u16::MAX as usize - 1)];
                    let at = r.len();
                    if at.saturating_add(t.len()) < u16::MAX as usize {
                        let loc = at as u32 | ((t.len() as u32 + 1) << 16);
                        put(&mut r, off, &loc.to_le_bytes());
                        r.extend_from_slice(t);
                        r.push(0);
                    }
                }
                _ => {}
            }
        }
        r
    }
}

fn is_hex(name: &str) -> bool {
    name.ends_with("rip")
        || name.starts_with("info")
        || name == "requests"
        || name == "gpa"
        || name.starts_with("addr")
}

/// The host's plan for a field: LTTng's names and values of the `sched`
/// events ([`sched_field`]).
fn host_plan(fmt: &EventFmt, f: &FieldFmt) -> FieldPlan {
    let mut name = f.name.clone();
    let mut adjust = Adjust::None;
    if matches!(fmt.system.as_str(), "sched" | "task") {
        let (renamed, adj) = sched_field(&fmt.name, &name);
        if let Some(r) = renamed {
            name = r.into();
        }
        adjust = adj;
    }
    let hex = is_hex(&name);
    FieldPlan { name, adjust, hex }
}

/// The class and decoder of one format, as the host trace names it.
pub fn class_for(fmt: &EventFmt, class_id: u32) -> (EventClass, EventDecoder) {
    class_with(fmt, class_id, STREAM_KERNEL, lttng_name(fmt), &|f| {
        host_plan(fmt, f)
    })
}

/// The class (of stream class `stream`, named `name`) and decoder of one
/// format, each field as `plan` says; fields no CTF type describes
/// (arrays of integers, dynamic arrays other than text) are left out.
pub fn class_with(
    fmt: &EventFmt,
    class_id: u32,
    stream: u32,
    name: String,
    plan: &dyn Fn(&FieldFmt) -> FieldPlan,
) -> (EventClass, EventDecoder) {
    let mut fields = Vec::new();
    let mut ops = Vec::new();
    for f in &fmt.fields {
        let p = plan(f);
        let Some((ty, op)) = field_kind(f) else {
            continue;
        };
        let (ty, op) = match op {
            Op::Int { off, size, .. } => (
                ty,
                Op::Int {
                    off,
                    size,
                    adjust: p.adjust,
                },
            ),
            Op::Chars { off, n } if p.adjust == Adjust::Rwbs => {
                (FieldType::U32, Op::Rwbs { off, n })
            }
            o => (ty, o),
        };
        let hex = matches!(op, Op::Int { .. }) && p.hex;
        fields.push(Field::new(p.name, ty, hex));
        ops.push(op);
    }
    let len = fmt
        .common
        .iter()
        .chain(&fmt.fields)
        .map(|f| f.offset.saturating_add(f.size))
        .max()
        .unwrap_or(8);
    let common = |name, size, default| {
        fmt.common(name)
            .filter(|c| c.size == size)
            .map_or(default, |c| c.offset)
    };
    let dec = EventDecoder {
        class_id,
        ops,
        len,
        type_off: common("common_type", 2, 0),
        pid_off: common("common_pid", 4, 4),
    };
    (EventClass::new(class_id, stream, name, fields), dec)
}

fn field_kind(f: &FieldFmt) -> Option<(FieldType, Op)> {
    if f.data_loc {
        return (f.is_char() && f.size == 4)
            .then_some((FieldType::String, Op::DataLocStr { off: f.offset }));
    }
    if f.array == Some(0) && f.size == 0 {
        return f
            .is_char()
            .then_some((FieldType::String, Op::TailStr { off: f.offset }));
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

/// Appends the integer `b` (1, 2, 4 or 8 bytes) as `adjust` says.
fn put_int(out: &mut Vec<u8>, b: &[u8], adjust: Adjust) {
    let size = b.len().min(8);
    match adjust {
        Adjust::Prio => {
            // A priority is a C int: its low 4 bytes (zero-padded in a
            // narrower field), sign-extended back.
            let low = uint_at(b, 0, size.min(4)).and_then(|v| u32::try_from(v).ok());
            let prio = (low.unwrap_or(0) as i32).wrapping_sub(100);
            out.extend_from_slice(&i64::from(prio).to_le_bytes()[..size]);
        }
        Adjust::State => {
            let x = uint_at(b, 0, size).unwrap_or(0) & 0xff;
            out.extend_from_slice(&x.to_le_bytes()[..size]);
        }
        Adjust::None | Adjust::Rwbs => out.extend_from_slice(b),
    }
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
        let mut d = Decoder::empty(events.first().map(|(f, _)| f));
        let mut classes = Vec::new();
        for (fmt, id) in events {
            let (class, dec) = class_for(fmt, *id);
            classes.push(class);
            d.by_type.insert(fmt.id, dec);
        }
        (d, classes)
    }

    /// A decoder of no event yet, the common fields' offsets from `common`
    /// (every format of one kernel has the same common fields).
    pub fn empty(common: Option<&EventFmt>) -> Decoder {
        let mut d = Decoder {
            type_off: 0,
            pid_off: 4,
            ..Decoder::default()
        };
        if let Some(f) = common {
            if let Some(c) = f.common("common_type").filter(|c| c.size == 2) {
                d.type_off = c.offset;
            }
            if let Some(c) = f.common("common_pid").filter(|c| c.size == 4) {
                d.pid_off = c.offset;
            }
        }
        d
    }

    /// Decodes records of ftrace type `ty` with `dec`.
    pub fn insert(&mut self, ty: u16, dec: EventDecoder) {
        self.by_type.insert(ty, dec);
    }

    /// The ftrace type id of a record (its `common_type`).
    pub fn type_of(&self, rec: &[u8]) -> Option<u16> {
        u16_at(rec, self.type_off)
    }

    /// The payload of `rec`, or None for an unknown type or a record too
    /// short for its format. Every offset is checked against the record:
    /// formats are the guest's text.
    pub fn decode(&self, rec: &[u8]) -> Option<Decoded> {
        let dec = self.by_type.get(&self.type_of(rec)?)?;
        let tid = i32_at(rec, self.pid_off)?;
        let mut out = Vec::with_capacity(64);
        for op in &dec.ops {
            match *op {
                Op::Int { off, size, adjust } => {
                    put_int(&mut out, slice_at(rec, off, size)?, adjust)
                }
                Op::Chars { off, n } => out.extend_from_slice(slice_at(rec, off, n)?),
                Op::Rwbs { off, n } => {
                    let flags = rwbs_flags(slice_at(rec, off, n)?);
                    out.extend_from_slice(&flags.to_le_bytes());
                }
                Op::DataLocStr { off } => {
                    // __data_loc: offset in the low 16 bits, length in the high.
                    let v = u32_at(rec, off)?;
                    let (start, len) = (v & 0xffff, v >> 16);
                    put_text(
                        &mut out,
                        slice_at(rec, start as usize, len as usize).unwrap_or(&[]),
                    );
                }
                Op::TailStr { off } => put_text(&mut out, rec.get(off..).unwrap_or(&[])),
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
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::format::parse_event;
    use ivtrace_region::bytes::int_at;
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
        assert_eq!(i32_at(&p, 16), Some(4242));
        assert_eq!(i32_at(&p, 20), Some(20));
        assert_eq!(i32_at(&p, 24), Some(1));
    }

    /// Formats built by hand (not through the parser's bounds) still
    /// decode without overflow: every offset a format gives is checked
    /// against the record (issue 23, case 1).
    #[test]
    fn offsets_at_the_end_of_the_address_space_decode_to_nothing() {
        let mut f = parse_event("sched", SCHED_SWITCH).unwrap();
        let rec = {
            let mut r = vec![0u8; 64];
            r[0..2].copy_from_slice(&f.id.to_le_bytes());
            r
        };
        for at in [usize::MAX, usize::MAX - 1, usize::MAX - 3, usize::MAX - 7] {
            f.fields[1].offset = at;
            let (d, _) = Decoder::new(&[(f.clone(), 100)]);
            assert!(d.decode(&rec).is_none(), "offset {at}");
            let mut g = f.clone();
            g.common[0].offset = at;
            let (d, _) = Decoder::new(&[(g, 100)]);
            assert_eq!(d.type_of(&rec), None);
            assert!(d.decode(&rec).is_none());
        }
    }

    #[test]
    fn prints_text_is_the_rest_of_the_record() {
        // Linux 6.1's ftrace/print (trace_marker writes).
        let text = "name: print\nID: 5\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
            \tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n\
            \tfield:char buf[];\toffset:16;\tsize:0;\tsigned:1;\n";
        let f = parse_event("ftrace", text).unwrap();
        let (d, classes) = Decoder::new(&[(f, 5)]);
        let types: Vec<FieldType> = classes[0].fields.iter().map(|f| f.ty).collect();
        assert_eq!(types, [FieldType::U64, FieldType::String]);
        let mut rec = vec![0u8; 16];
        rec[0..2].copy_from_slice(&5u16.to_le_bytes());
        rec.extend_from_slice(b"ivtrace-boot: run\n\0\0\0");
        let p = d.decode(&rec).unwrap().payload;
        assert_eq!(&p[8..], b"ivtrace-boot: run\n\0");
        // No text at all (a record cut at the field): an empty string.
        assert_eq!(&d.decode(&rec[..16]).unwrap().payload[8..], b"\0");
    }

    #[test]
    fn rwbs_text_becomes_lttngs_flag_bits() {
        use super::rwbs::*;
        for (text, want) in [
            (&b"R\0\0\0"[..], READ),
            (b"W", WRITE),
            (b"WS", WRITE | SYNC),
            (b"RA", READ | RAHEAD),
            (b"RM", READ | META),
            (b"FWFS", PREFLUSH | WRITE | FUA | SYNC),
            (b"F", FLUSH),
            (b"FF", PREFLUSH | FLUSH),
            (b"D", DISCARD),
            (b"DE", DISCARD | SECURE),
            (b"N", 0),
            (b"", 0),
        ] {
            assert_eq!(rwbs_flags(text), want, "{}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn rwbs_flags_turn_back_into_the_kernels_text() {
        for text in [
            "R", "W", "WS", "RA", "RM", "FWFS", "F", "FF", "D", "DE", "N", "WFSM",
        ] {
            let flags = rwbs_flags(text.as_bytes());
            assert_eq!(rwbs_text(flags), text.as_bytes(), "{text}");
        }
    }

    #[test]
    fn records_encode_back_to_what_decodes() {
        let f = parse_event("sched", SCHED_SWITCH).unwrap();
        let (d, classes) = Decoder::new(&[(f.clone(), 100)]);
        let ints = [
            ("prev_pid", 77),
            ("prev_prio", 120),
            ("prev_state", 1),
            ("next_pid", 9),
            ("next_prio", 139),
        ];
        let texts = [("prev_comm", "qemu"), ("next_comm", "swapper")];
        let rec = crate::page::build_record(&f, 77, &ints, &texts);
        let e = d.decode(&rec).unwrap();
        // The payload's fields as values, by the class's types.
        let mut values = Vec::new();
        let mut at = 0;
        for field in &classes[0].fields {
            let v = match field.ty {
                FieldType::Chars(n) => {
                    let b = &e.payload[at..at + n as usize];
                    at += n as usize;
                    Value::Text(b.split(|&c| c == 0).next().unwrap())
                }
                ty => {
                    let n = ty.integer().unwrap().0 as usize;
                    at += n;
                    Value::Int(int_at(&e.payload, at - n, n).unwrap())
                }
            };
            values.push(Some(v));
        }
        let back = d.by_type[&f.id].encode(f.id, 77, &values);
        assert_eq!(back, rec);
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
        assert_eq!(i32_at(p, 16), Some(77));
        assert_eq!(i32_at(p, 20), Some(20));
        assert_eq!(int_at(p, 24, 8), Some(0));
        assert_eq!(i32_at(p, 52), Some(39));
        assert!(d.decode(&rec[..40]).is_none());
        rec[0] ^= 0xff;
        assert!(d.decode(&rec).is_none());
    }
}
