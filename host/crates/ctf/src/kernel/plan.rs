//! What each wire event class of the kernel stream is for, and what it
//! becomes in the output.
//!
//! Roles are recognized by the event's (sanitized) name *and* the fields
//! the role needs, with their types; a class that only looks half right
//! keeps its wire form. Any class may carry `IVT_FF_TID_COMM` fields (the
//! flag, not the name, decides where a thread name goes).
//!
//! | wire class | pass 1 (collect) | pass 2 (write) |
//! |---|---|---|
//! | `lttng_statedump_process_state` (tid, name) | thread name | as is |
//! | `sched_process_fork` (child_tid, child_comm) | thread name | `parent_comm` before `parent_tid` |
//! | `sched_process_exec` (tid, comm) | thread name | as is |
//! | `task_rename` (tid, newcomm) | thread name | as is |
//! | `lttng_statedump_interrupt` (irq, action) | irq name | as is |
//! | `irq_handler_entry` (irq) | | `name` string after `irq` |
//! | `syscall_entry` (id, args, strings) / `syscall_exit` (id, ret, args, data) | which ids occur | `syscall_{entry,exit}_<name>` with LTTng's fields, or `_unknown` as on the wire |
//! | anything with `[c]` fields | | `<x>_comm` `char[16]` before each `<x>_tid` |
//! | fields LTTng declares wider ([`lttng::widened`]) | | re-encoded in LTTng's type |

use std::collections::HashSet;

use ivtrace_region::abi;
use ivtrace_region::classes::{EventClass, Field, FieldType, StreamClasses};
use ivtrace_region::sanitize;

use super::lttng;
use super::names::{IrqNames, ThreadNamesBuilder, COMM_LEN};
use super::syscalls;
use super::wire::Layout;
use ivtrace_region::bytes::le_u32;

/// Wire syscall ids are u16: one counter per possible id.
pub const SYSCALL_IDS: usize = 1 << 16;
/// "No output class": the event keeps the `_unknown` wire class.
pub const NO_ID: u16 = u16::MAX;

/// What pass 1 takes from an event of this class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// Thread `fields[tid]` is called `fields[comm]` from now on.
    Thread { tid: u8, comm: u8 },
    /// Interrupt `fields[irq]` has a handler called `fields[action]`.
    IrqAction { irq: u8, action: u8 },
    /// A system call entry or exit ([`lttng::SyscallWire`]).
    Syscall { exit: bool },
}

/// One insertion into a payload, in field order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The thread name of the tid in field `i`, before field `i`.
    Comm(u8),
    /// The interrupt name of the irq in field `i`, after field `i`.
    IrqName(u8),
    /// Field `i` (an integer) re-encoded as the wider type LTTng declares.
    Widen(u8, FieldType),
    /// Field `i` reshaped into LTTng's form, or dropped.
    Reshape(u8, lttng::Reshape),
}

impl Op {
    /// The index of the field the op is about.
    pub fn field(&self) -> u8 {
        match *self {
            Op::Comm(i) | Op::IrqName(i) | Op::Widen(i, _) | Op::Reshape(i, _) => i,
        }
    }
}

/// What pass 2 writes for an event of this class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// The wire event, as it is.
    Verbatim,
    /// The wire event with insertions (same id).
    Expand(Box<[Op]>),
    /// A system call: renamed by its number, fields as LTTng's.
    Syscall { exit: bool },
}

/// The plan of one wire event class.
#[derive(Debug, Clone)]
pub struct ClassPlan {
    pub layout: Layout,
    pub naming: Option<Naming>,
    pub out: Out,
}

/// Plans of every wire class, by id.
#[derive(Debug, Default)]
pub struct Plans {
    by_id: Vec<Option<ClassPlan>>,
    /// The wire syscall classes (entry, exit), if recognized.
    pub syscall_class: [Option<u32>; 2],
}

impl Plans {
    #[inline]
    pub fn get(&self, id: u32) -> Option<&ClassPlan> {
        self.by_id.get(id as usize)?.as_ref()
    }

    pub fn has_syscalls(&self) -> bool {
        self.syscall_class.iter().any(Option::is_some)
    }
}

fn field(c: &EventClass, name: &str, ok: fn(FieldType) -> bool) -> Option<u8> {
    c.fields
        .iter()
        .position(|f| f.name == name && ok(f.ty))
        .map(|i| i as u8)
}

/// A thread id: s32 as LTTng declares it, or u32 (older modules).
fn is_tid(t: FieldType) -> bool {
    matches!(t, FieldType::U32 | FieldType::S32)
}

fn is_chars(t: FieldType) -> bool {
    matches!(t, FieldType::Chars(_))
}

fn is_string(t: FieldType) -> bool {
    t == FieldType::String
}

fn naming_of(c: &EventClass) -> Option<Naming> {
    let thread = |tid: &str, comm: &str| {
        Some(Naming::Thread {
            tid: field(c, tid, is_tid)?,
            comm: field(c, comm, is_chars)?,
        })
    };
    match c.name.as_str() {
        "lttng_statedump_process_state" => thread("tid", "name"),
        "sched_process_fork" => thread("child_tid", "child_comm"),
        "sched_process_exec" => thread("tid", "comm"),
        "task_rename" => thread("tid", "newcomm"),
        "lttng_statedump_interrupt" => Some(Naming::IrqAction {
            irq: field(c, "irq", is_tid)?,
            action: field(c, "action", is_string)?,
        }),
        "syscall_entry" | "syscall_exit" => {
            use FieldType::{Bytes, S64, U16};
            let exit = c.name == "syscall_exit";
            // The id is a u16, as the module writes it: every number has a counter.
            let want: &[(&str, FieldType)] = if exit {
                &[("id", U16), ("ret", S64), ("args", Bytes), ("data", Bytes)]
            } else {
                &[("id", U16), ("args", Bytes), ("strings", Bytes)]
            };
            let same = c.fields.len() == want.len()
                && c.fields
                    .iter()
                    .zip(want)
                    .all(|(f, &(n, t))| f.name == n && f.ty == t && !f.tid_comm);
            same.then_some(Naming::Syscall { exit })
        }
        _ => None,
    }
}

fn out_of(c: &EventClass, naming: Option<Naming>) -> Out {
    if let Some(Naming::Syscall { exit }) = naming {
        return Out::Syscall { exit };
    }
    let mut ops = Vec::new();
    let irq = (c.name == "irq_handler_entry")
        .then(|| field(c, "irq", is_tid))
        .flatten();
    for (i, f) in c.fields.iter().enumerate() {
        if f.tid_comm && is_tid(f.ty) {
            ops.push(Op::Comm(i as u8));
        }
        if let Some(to) = lttng::widened(&c.name, &f.name) {
            if f.ty.integer().is_some() && f.ty != to {
                ops.push(Op::Widen(i as u8, to));
            }
        }
        if let Some(r) = lttng::reshaped(&c.name, &f.name, f.ty) {
            ops.push(Op::Reshape(i as u8, r));
        }
        if irq == Some(i as u8) {
            ops.push(Op::IrqName(i as u8));
        }
    }
    if ops.is_empty() {
        Out::Verbatim
    } else {
        Out::Expand(ops.into_boxed_slice())
    }
}

/// The plans of the wire classes of the kernel stream.
pub fn plan(wire: &StreamClasses) -> Plans {
    let mut plans = Plans::default();
    for c in wire.iter() {
        let naming = naming_of(c);
        if let Some(Naming::Syscall { exit }) = naming {
            plans.syscall_class[exit as usize] = Some(c.id);
        }
        let id = c.id as usize;
        if plans.by_id.len() <= id {
            plans.by_id.resize(id + 1, None);
        }
        plans.by_id[id] = Some(ClassPlan {
            layout: Layout::new(c.fields.iter().map(|f| f.ty)),
            naming,
            out: out_of(c, naming),
        });
    }
    plans
}

/// What pass 1 collected.
#[derive(Debug, Default)]
pub struct Facts {
    pub names: ThreadNamesBuilder,
    pub irqs: IrqNames,
    /// Events per syscall number: [entry, exit] (empty without syscall classes).
    pub syscalls: [Vec<u64>; 2],
    /// Syscall events the table cannot name, or whose wire does not match
    /// their number's row: [entry, exit].
    pub syscalls_unknown: [u64; 2],
}

impl Facts {
    pub fn new(plans: &Plans) -> Facts {
        let counts = || {
            if plans.has_syscalls() {
                vec![0u64; SYSCALL_IDS]
            } else {
                Vec::new()
            }
        };
        Facts {
            syscalls: [counts(), counts()],
            ..Facts::default()
        }
    }
}

/// The output classes and the syscall renaming.
#[derive(Debug)]
pub struct Output {
    pub classes: StreamClasses,
    /// Output class id per syscall number, [entry, exit]; [`NO_ID`]: the
    /// `_unknown` class (the wire class's id).
    pub syscall_ids: [Box<[u16]>; 2],
    /// Syscall classes created (entry and exit counted apart).
    pub syscall_classes: u64,
}

impl Output {
    /// The output class id of syscall `nr` (entry or exit), if it has one.
    #[inline]
    pub fn syscall_id(&self, exit: bool, nr: u64) -> Option<u32> {
        let id = *self.syscall_ids[exit as usize].get(nr as usize)?;
        (id != NO_ID).then_some(id as u32)
    }
}

fn comm_field_name(tid: &str) -> String {
    if tid == "tid" {
        "comm".into()
    } else if let Some(prefix) = tid.strip_suffix("_tid") {
        format!("{prefix}_comm")
    } else {
        format!("{tid}_comm")
    }
}

pub(crate) fn plain(f: &Field) -> Field {
    Field {
        tid_comm: false,
        ..f.clone()
    }
}

/// The output fields of a wire class expanded by `ops`.
pub(crate) fn expanded_fields(c: &EventClass, ops: &[Op]) -> Vec<Field> {
    let mut taken: HashSet<String> = HashSet::new();
    for f in &c.fields {
        taken.insert(f.name.clone());
        if f.ty == FieldType::Bytes {
            taken.insert(format!("{}_len", f.name));
        }
    }
    let mut out = Vec::with_capacity(c.fields.len() + ops.len());
    for (i, f) in c.fields.iter().enumerate() {
        if ops.contains(&Op::Comm(i as u8)) {
            let (name, _) = sanitize::dedupe(comm_field_name(&f.name), &mut taken);
            out.push(Field::new(name, FieldType::Chars(COMM_LEN as u16), false));
        }
        let mut field = Some(plain(f));
        for op in ops {
            match *op {
                Op::Widen(j, to) if j as usize == i => {
                    field.as_mut().expect("not dropped").ty = to;
                }
                Op::Reshape(j, r) if j as usize == i => {
                    field = lttng::reshaped_type(r).map(|ty| Field { ty, ..plain(f) });
                }
                _ => {}
            }
        }
        out.extend(field);
        if ops.contains(&Op::IrqName(i as u8)) {
            let (name, _) = sanitize::dedupe("name".into(), &mut taken);
            out.push(Field::new(name, FieldType::String, false));
        }
    }
    out
}

pub(crate) fn insert(classes: &mut StreamClasses, id: u32, name: String, fields: Vec<Field>) {
    let (name, _) = sanitize::dedupe(name, classes.names_mut());
    let inserted = classes.insert(EventClass::new(id, abi::IVT_STREAM_KERNEL, name, fields));
    debug_assert!(inserted, "output id {id} is free");
}

/// Builds the output classes once pass 1 knows which syscalls occur.
///
/// Each syscall number that occurs and has a row in the table gets its own
/// class (entry and exit apart) with LTTng's fields, the most frequent
/// first, on the ids no wire class uses: ids up to 30 first (4-byte event
/// headers), then upwards. Numbers without a row, events whose wire does
/// not match their row, and numbers past the 4096 ids a stream class has
/// use the wire class renamed `syscall_{entry,exit}_unknown`.
pub fn output(wire: &StreamClasses, plans: &Plans, facts: &Facts) -> Output {
    let mut used = vec![false; abi::IVT_EVENT_IDS_MAX as usize];
    for c in wire.iter() {
        used[c.id as usize] = true;
    }
    let mut free = (0..abi::IVT_EVENT_IDS_MAX).filter(|&id| !used[id as usize]);
    // (count, exit, nr) of every named syscall that occurs, most frequent first.
    let mut wanted: Vec<(u64, bool, u32)> = Vec::new();
    let mut unknown = facts.syscalls_unknown;
    for exit in [false, true] {
        for (nr, &n) in facts.syscalls[exit as usize].iter().enumerate() {
            if n > 0 {
                wanted.push((n, exit, nr as u32));
            }
        }
    }
    wanted.sort_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let mut ids = [
        vec![NO_ID; SYSCALL_IDS].into_boxed_slice(),
        vec![NO_ID; SYSCALL_IDS].into_boxed_slice(),
    ];
    let mut generated = Vec::new();
    for (n, exit, nr) in wanted {
        match free.next() {
            Some(id) => {
                ids[exit as usize][nr as usize] = id as u16;
                generated.push((id, exit, nr));
            }
            None => unknown[exit as usize] += n,
        }
    }

    let mut classes = StreamClasses::default();
    for c in wire.iter() {
        let Some(plan) = plans.get(c.id) else {
            continue;
        };
        match &plan.out {
            Out::Verbatim => insert(
                &mut classes,
                c.id,
                c.name.clone(),
                c.fields.iter().map(plain).collect(),
            ),
            Out::Expand(ops) => insert(&mut classes, c.id, c.name.clone(), expanded_fields(c, ops)),
            // Declared only when an event uses it.
            Out::Syscall { exit } if unknown[*exit as usize] > 0 => {
                let name = format!("syscall_{}_unknown", if *exit { "exit" } else { "entry" });
                insert(
                    &mut classes,
                    c.id,
                    name,
                    c.fields.iter().map(plain).collect(),
                );
            }
            Out::Syscall { .. } => {}
        }
    }
    generated.sort_unstable();
    for &(id, exit, nr) in &generated {
        let s = syscalls::get(nr as u64).expect("counted only with a row");
        let name = format!("syscall_{}_{}", if exit { "exit" } else { "entry" }, s.name);
        insert(
            &mut classes,
            id,
            name,
            lttng::fields(if exit { s.exit } else { s.entry }),
        );
    }
    Output {
        classes,
        syscall_ids: ids,
        syscall_classes: generated.len() as u64,
    }
}

/// What a [`write_expanded`] op needs from the expander beyond the event's bytes.
pub enum Lookup {
    /// The thread name (COMM_LEN bytes) of this tid.
    Comm(u32),
    /// The name of this irq, NUL-terminated.
    IrqName(u32),
}

/// Writes an event's payload as LTTng declares it (after its header): the
/// plan's ops applied (a thread name before a tid, an irq's name after it,
/// integers widened, fields reshaped or dropped). `lookup` appends the
/// names; the staged and the streaming expansion differ only there.
pub fn write_expanded(
    (plan, ops): (&ClassPlan, &[Op]),
    (payload, offs): (&[u8], &[u32]),
    out: &mut Vec<u8>,
    lookup: &mut dyn FnMut(Lookup, &mut Vec<u8>),
) {
    let field = |i: u8| (offs[i as usize] as usize, offs[i as usize + 1] as usize);
    let mut copied = 0usize;
    for op in ops {
        let (at, end) = field(op.field());
        // Fields before this one are copied as they are; a name goes before
        // the tid (Comm) or after the irq (IrqName); other ops replace it.
        let (upto, resume) = match op {
            Op::Comm(_) => (at, at),
            Op::IrqName(_) => (end, end),
            Op::Widen(..) | Op::Reshape(..) => (at, end),
        };
        out.extend_from_slice(&payload[copied..upto]);
        copied = resume;
        match *op {
            Op::Comm(_) => lookup(Lookup::Comm(le_u32(payload, at)), out),
            Op::IrqName(_) => lookup(Lookup::IrqName(le_u32(payload, at)), out),
            Op::Widen(i, to) => {
                let from = plan.layout.types()[i as usize];
                lttng::put_int(out, to, lttng::read_int(from, &payload[at..end]));
            }
            Op::Reshape(_, r) => lttng::write_reshaped(out, r, &payload[at..end]),
        }
    }
    out.extend_from_slice(&payload[copied..]);
}
