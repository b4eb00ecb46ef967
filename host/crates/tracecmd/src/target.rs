//! What each ivtrace event class becomes in a trace-cmd file: a kernel
//! event in the kernel's own layout where there is one (the native probes'
//! events, the relayed ftrace events, the host's events), else an event
//! described by a generated format; and how a record is written from an
//! event read back (field values, the writing thread, the threads it names).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;
use std::sync::Arc;

use ivtrace_ctf::read::Record;
use ivtrace_ctf::sidecar::TracefsFormats;
use ivtrace_region::bytes::{i32_at, u32_at};
use ivtrace_region::classes::{EventClass, FieldType};
use ivtrace_tracefs::decode::{
    class_for, class_with, lttng_name, Adjust, EventDecoder, FieldPlan, Value,
};
use ivtrace_tracefs::format::{parse_event, EventFmt};
use ivtrace_tracefs::ftrace_relay::{relayed_class, LTTNG_SYSTEMS};

use crate::formats::{self, builtin, clean_text, generated, ident, with_line, Source};

/// Which trace of a recording an event comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The guest kernel trace: native probes (stream class 0), relayed
    /// ftrace (stream class 2).
    Kernel,
    User,
    /// The VM view (guest clock).
    Vm,
    Host,
}

impl Origin {
    /// The trace's directory name in a recording.
    pub fn label(self) -> &'static str {
        match self {
            Origin::Kernel => "kernel",
            Origin::User => "user",
            Origin::Vm => "vm",
            Origin::Host => "host",
        }
    }
}

/// How a record's writing thread (`common_pid`) is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid {
    /// The thread running on the CPU, from the context switches so far.
    Current,
    /// A field of the event.
    Field(usize),
    /// The `_tid` event context.
    Context,
    /// The thread that owned the channel (user events).
    Owner,
    Zero,
}

/// An ivtrace event class as one trace-cmd event.
pub struct Target {
    pub system: String,
    pub event: String,
    /// `system:event`.
    pub key: String,
    pub id: u16,
    /// Its format file (ID included).
    pub format: String,
    /// True when the format is the kernel's own.
    pub kernel: bool,
    dec: EventDecoder,
    src: Vec<Source>,
    pub pid: Pid,
    /// (thread name field, thread id field) pairs the event carries.
    pub names: Vec<(usize, usize)>,
    /// A context switch: the field of the thread switched in.
    pub switch_in: Option<usize>,
}

/// An event's field as a value to write.
enum Got<'a> {
    Int(i64),
    Text(Cow<'a, [u8]>),
}

fn hex(b: &[u8]) -> Vec<u8> {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s.into_bytes()
}

/// Field `i` of `r` as what `s` asks for.
fn got<'a>(r: &'a Record, s: Source, name_of: &dyn Fn(i32) -> Option<[u8; 16]>) -> Option<Got<'a>> {
    Some(match s {
        Source::Field(i) => match r.class.fields.get(i)?.ty {
            FieldType::Chars(_) | FieldType::String | FieldType::TextSeqU64 => {
                Got::Text(Cow::Borrowed(r.text(i)?))
            }
            _ => Got::Int(r.int(i)?),
        },
        Source::Hex(i) => Got::Text(Cow::Owned(hex(r.field(i)?.get(4..)?))),
        Source::List(i) => {
            let b = r.field(i)?.get(1..)?;
            let v: Vec<String> = b
                .chunks_exact(4)
                .filter_map(|c| Some(i32_at(c, 0)?.to_string()))
                .collect();
            Got::Text(Cow::Owned(v.join(",").into_bytes()))
        }
        Source::Elem(i, k) => Got::Int(u32_at(r.field(i)?, 4 * k as usize)?.into()),
        Source::NameOf(i) => {
            let name = name_of(r.int(i)? as i32)?;
            let n = name.iter().position(|&c| c == 0).unwrap_or(16);
            Got::Text(Cow::Owned(name[..n].to_vec()))
        }
        Source::Const(v) => Got::Int(v),
        Source::Zero => return None,
    })
}

impl Target {
    /// The record of event `r` written by thread `pid`; `name_of` knows the
    /// threads' names so far.
    pub fn encode(
        &self,
        r: &Record,
        pid: i32,
        name_of: &dyn Fn(i32) -> Option<[u8; 16]>,
    ) -> Vec<u8> {
        let gots: Vec<Option<Got>> = self.src.iter().map(|&s| got(r, s, name_of)).collect();
        let values: Vec<Option<Value>> = gots
            .iter()
            .map(|g| {
                g.as_ref().map(|g| match g {
                    Got::Int(v) => Value::Int(*v),
                    Got::Text(t) => Value::Text(t),
                })
            })
            .collect();
        self.dec.encode(self.id, pid, &values)
    }
}

/// The `system/event` of a native probe's event (LTTng's name), where the
/// kernel has one.
pub fn native_event(name: &str) -> Option<String> {
    const SAME: &[&str] = &[
        "sched_switch",
        "sched_wakeup",
        "sched_wakeup_new",
        "sched_process_fork",
        "sched_process_exec",
        "sched_process_exit",
        "sched_process_free",
        "sched_migrate_task",
    ];
    if SAME.contains(&name) {
        return Some(format!("sched/{name}"));
    }
    let fixed = [
        ("task_rename", "task/task_rename"),
        ("irq_handler_entry", "irq/irq_handler_entry"),
        ("irq_handler_exit", "irq/irq_handler_exit"),
        ("irq_softirq_entry", "irq/softirq_entry"),
        ("irq_softirq_exit", "irq/softirq_exit"),
        ("timer_hrtimer_expire_entry", "timer/hrtimer_expire_entry"),
        ("timer_hrtimer_expire_exit", "timer/hrtimer_expire_exit"),
        ("kmem_kmalloc", "kmem/kmalloc"),
        ("kmem_kfree", "kmem/kfree"),
        ("kmem_mm_page_alloc", "kmem/mm_page_alloc"),
        ("kmem_mm_page_free", "kmem/mm_page_free"),
        ("printk_console", "printk/console"),
    ];
    if let Some((_, e)) = fixed.iter().find(|(n, _)| *n == name) {
        return Some(e.to_string());
    }
    let v = name.strip_prefix("x86_irq_vectors_")?;
    let (vector, end) = v.rsplit_once('_')?;
    let vector = if vector == "ipi" {
        "x86_platform_ipi"
    } else {
        vector
    };
    Some(format!("irq_vectors/{vector}_{end}"))
}

/// The thread-naming field pairs of `c`: a name field (`comm`, `X_comm`,
/// `newcomm`, a state dump's `name`) with its thread id (`tid`, `X_tid`,
/// or ftrace's `pid`, `X_pid`).
fn name_pairs(c: &EventClass) -> Vec<(usize, usize)> {
    let idx = |n: &str| c.fields.iter().position(|f| f.name == n);
    let mut out = Vec::new();
    for (i, f) in c.fields.iter().enumerate() {
        let prefix = match f.name.as_str() {
            "comm" | "newcomm" => "",
            "name" if c.name.ends_with("statedump_process_state") => "",
            n => match n.strip_suffix("_comm") {
                Some(p) => p,
                None => continue,
            },
        };
        let sep = if prefix.is_empty() { "" } else { "_" };
        let tid = idx(&format!("{prefix}{sep}tid")).or_else(|| idx(&format!("{prefix}{sep}pid")));
        if let Some(t) = tid {
            out.push((i, t));
        }
    }
    out
}

/// The field of the thread a context switch switches in.
fn switch_in(c: &EventClass) -> Option<usize> {
    c.name.ends_with("sched_switch").then(|| {
        c.fields
            .iter()
            .position(|f| f.name == "next_tid" || f.name == "next_pid")
    })?
}

/// How a kernel format's fields were named in the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// LTTng's names (the native probes, the host's events).
    Lttng,
    /// The relay's: the writing thread first, then ftrace's names.
    Relayed,
}

/// The kernel's format `text` of `system`, as the event class `class` of
/// the trace was named with `plan`: None if it does not parse or if none
/// of its fields are in the class.
fn kernel_encoding(
    text: &str,
    system: &str,
    plan: Plan,
    class: &EventClass,
) -> Option<(EventFmt, EventDecoder, Vec<Source>)> {
    let fmt = parse_event(system, &clean_text(text)).ok()?;
    if ident(&fmt.name) != fmt.name {
        return None;
    }
    let (kclass, dec, skip) = match plan {
        Plan::Lttng => {
            let (c, d) = class_for(&fmt, 0);
            (c, d, 0)
        }
        Plan::Relayed => {
            let (c, d) = relayed_class(&fmt);
            (c, d, 1)
        }
    };
    let index = |n: &str| class.fields.iter().position(|f| f.name == n);
    let rename_tid = index("tid");
    let src: Vec<Source> = kclass.fields[skip..]
        .iter()
        .map(|f| match index(&f.name) {
            Some(i) => Source::Field(i),
            // The name a renamed thread had: known from the trace so far.
            None if f.name == "oldcomm" => rename_tid.map_or(Source::Zero, Source::NameOf),
            None => Source::Zero,
        })
        .collect();
    let mapped = src.iter().any(|s| matches!(s, Source::Field(_)));
    (mapped || kclass.fields.len() == skip).then_some((fmt, dec, src))
}

/// The system and event of a relayed class's name (`ftrace:SYS:EVENT`,
/// `ftrace:EVENT` for the tracers' own, the bare name of LTTng's systems).
fn relayed_name(name: &str, formats: &TracefsFormats) -> Option<(String, String)> {
    if let Some(rest) = name.strip_prefix("ftrace:") {
        return Some(match rest.split_once(':') {
            Some((s, e)) => (s.to_string(), e.to_string()),
            None => ("ftrace".to_string(), rest.to_string()),
        });
    }
    LTTNG_SYSTEMS
        .iter()
        .find(|s| formats.events.contains_key(&format!("{s}/{name}")))
        .map(|s| (s.to_string(), name.to_string()))
}

/// The host format whose event the host trace names `name` (LTTng's name).
fn host_format<'a>(name: &str, formats: &'a TracefsFormats) -> Option<(String, &'a String)> {
    formats.events.iter().find_map(|(key, text)| {
        let (system, _) = key.split_once('/')?;
        let fmt = parse_event(system, &clean_text(text)).ok()?;
        (lttng_name(&fmt) == name).then(|| (system.to_string(), text))
    })
}

/// Where a class's kernel format is: (system, text, naming plan).
fn kernel_format<'a>(
    origin: Origin,
    class: &EventClass,
    recorded: &'a TracefsFormats,
) -> Option<(String, Cow<'a, str>, Plan)> {
    if relayed(origin, class) {
        let (system, event) = relayed_name(&class.name, recorded)?;
        let text = recorded.events.get(&format!("{system}/{event}"))?;
        return Some((system, Cow::Borrowed(text), Plan::Relayed));
    }
    if origin == Origin::Host {
        if let Some((system, text)) = host_format(&class.name, recorded) {
            return Some((system, Cow::Borrowed(text), Plan::Lttng));
        }
    }
    if !matches!(origin, Origin::Kernel | Origin::Host) || class.stream != 0 {
        return None;
    }
    let key = native_event(&class.name)?;
    // The guest's own file when the relay published one, else the built-in.
    let text = match recorded.events.get(&key) {
        Some(t) => Cow::Borrowed(t.as_str()),
        None => Cow::Borrowed(builtin().get(&key)?),
    };
    let system = key.split_once('/')?.0.to_string();
    Some((system, text, Plan::Lttng))
}

/// The generated event's system for a class of `origin` with no kernel format.
fn generated_system(origin: Origin, class: &EventClass) -> (String, String) {
    if relayed(origin, class) {
        if let Some(rest) = class.name.strip_prefix("ftrace:") {
            if let Some((s, e)) = rest.split_once(':') {
                return (ident(s), ident(e));
            }
            return ("ftrace".into(), ident(rest));
        }
    }
    let system = match origin {
        Origin::User => "ivtrace_user",
        Origin::Vm => "ivtrace_vm",
        _ => "ivtrace",
    };
    (system.into(), ident(&class.name))
}

/// A relayed ftrace event (its first field is the writing thread).
fn relayed(origin: Origin, class: &EventClass) -> bool {
    origin == Origin::Kernel && class.stream == ivtrace_region::abi::IVT_STREAM_FTRACE
}

fn pid_of(origin: Origin, class: &EventClass, plan: Option<Plan>) -> Pid {
    match (origin, plan) {
        (Origin::Kernel, _) if relayed(origin, class) => Pid::Field(0),
        (Origin::Kernel, _) if class.name == "sched_switch" => class
            .fields
            .iter()
            .position(|f| f.name == "prev_tid")
            .map_or(Pid::Current, Pid::Field),
        (Origin::Kernel, _) => Pid::Current,
        (Origin::User, _) => Pid::Owner,
        (Origin::Vm | Origin::Host, _) if class.stream == 0 => Pid::Context,
        _ => Pid::Zero,
    }
}

/// A target before its name and id are settled.
struct Parts {
    system: String,
    event: String,
    text: String,
    dec: EventDecoder,
    src: Vec<Source>,
    plan: Option<Plan>,
}

fn generated_parts(origin: Origin, class: &EventClass) -> Parts {
    let (system, event) = generated_system(origin, class);
    let syscall = class
        .name
        .strip_prefix("syscall_entry_")
        .map(|n| (n, false))
        .or_else(|| class.name.strip_prefix("syscall_exit_").map(|n| (n, true)));
    let made = syscall
        .filter(|_| origin == Origin::Kernel)
        .and_then(|(n, exit)| formats::syscall(n, exit, 0, class))
        .map(|(t, s)| ("syscalls".to_string(), t, s));
    let skip = relayed(origin, class) as usize;
    let (system, text, src) = made.unwrap_or_else(|| {
        let (t, s) = generated(&event, 0, class, skip);
        (system, t, s)
    });
    let fmt = parse_event(&system, &text).expect("generated formats parse");
    let (_, dec) = class_with(&fmt, 0, class.stream, fmt.name.clone(), &|f| FieldPlan {
        name: f.name.clone(),
        adjust: Adjust::None,
        hex: false,
    });
    Parts {
        system,
        event: fmt.name,
        text,
        dec,
        src,
        plan: None,
    }
}

fn kernel_parts(origin: Origin, class: &EventClass, recorded: &TracefsFormats) -> Option<Parts> {
    let (system, text, plan) = kernel_format(origin, class, recorded)?;
    let (fmt, dec, src) = kernel_encoding(&text, &system, plan, class)?;
    Some(Parts {
        system,
        event: fmt.name,
        text: clean_text(&text),
        dec,
        src,
        plan: Some(plan),
    })
}

/// The events one file declares: their formats and ids.
#[derive(Default)]
pub struct Catalog {
    /// Per (system, event) name: the format text as found, and the target.
    declared: HashMap<(String, String), (String, Arc<Target>)>,
    used: HashSet<u16>,
    next: u16,
}

impl Catalog {
    /// An id for a new event: `wanted` if free, else the next free one
    /// (past 60 000 events, which no recording comes near, the last id
    /// again: never a hang).
    fn id(&mut self, wanted: Option<u16>) -> u16 {
        if let Some(w) = wanted.filter(|w| !self.used.contains(w)) {
            self.used.insert(w);
            return w;
        }
        self.next = self.next.max(FIRST_NEW_ID);
        while self.used.contains(&self.next) && self.next < u16::MAX {
            self.next += 1;
        }
        self.used.insert(self.next);
        self.next
    }

    /// The target of event class `class` of a trace of `origin` whose
    /// tracefs events were decoded with `recorded`: a kernel format where
    /// one applies, else a generated one. An event declared before with the
    /// same format text keeps its id; another text under a taken name gets
    /// a suffixed name.
    pub fn target(
        &mut self,
        origin: Origin,
        class: &EventClass,
        recorded: &TracefsFormats,
    ) -> Arc<Target> {
        let p =
            kernel_parts(origin, class, recorded).unwrap_or_else(|| generated_parts(origin, class));
        let mut event = p.event.clone();
        let mut k = 2;
        while let Some((text, t)) = self.declared.get(&(p.system.clone(), event.clone())) {
            if *text == p.text {
                return self.reuse(t.clone(), p, origin, class);
            }
            event = format!("{}_{k}", p.event);
            k += 1;
        }
        let kernel = p.plan.is_some();
        let wanted = parse_event(&p.system, &p.text)
            .ok()
            .map(|f| f.id)
            .filter(|_| kernel);
        let id = self.id(wanted);
        let t = Arc::new(Target {
            format: with_line(&with_line(&p.text, "ID", &id.to_string()), "name", &event),
            key: format!("{}:{event}", p.system),
            system: p.system.clone(),
            event: event.clone(),
            id,
            kernel,
            dec: p.dec,
            src: p.src,
            pid: pid_of(origin, class, p.plan),
            names: name_pairs(class),
            switch_in: switch_in(class),
        });
        self.declared
            .insert((p.system, event), (p.text, Arc::clone(&t)));
        t
    }

    /// A class of another trace whose event is declared already: the same
    /// id and format, its own field positions.
    fn reuse(&self, t: Arc<Target>, p: Parts, origin: Origin, class: &EventClass) -> Arc<Target> {
        Arc::new(Target {
            format: t.format.clone(),
            key: t.key.clone(),
            system: t.system.clone(),
            event: t.event.clone(),
            id: t.id,
            kernel: t.kernel,
            dec: p.dec,
            src: p.src,
            pid: pid_of(origin, class, p.plan),
            names: name_pairs(class),
            switch_in: switch_in(class),
        })
    }

    /// The declared formats: the `ftrace` system's, and every other
    /// system's.
    pub fn formats(&self) -> (Vec<String>, Vec<(String, Vec<String>)>) {
        let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for ((system, _), (_, t)) in &self.declared {
            by.entry(system.clone()).or_default().push(t.format.clone());
        }
        let ftrace = by.remove("ftrace").unwrap_or_default();
        (ftrace, by.into_iter().collect())
    }

    /// Events declared in the kernel's own format, and in generated ones.
    pub fn counts(&self) -> (usize, usize) {
        let kernel = self.declared.values().filter(|(_, t)| t.kernel).count();
        (kernel, self.declared.len() - kernel)
    }
}

/// New events' ids start here (above any kernel's, ~1800 in 6.1).
const FIRST_NEW_ID: u16 = 5000;

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_ctf::read::PacketInfo;
    use ivtrace_region::bytes::uint_at;
    use ivtrace_region::classes::Field;
    use ivtrace_tracefs::format::parse_event;

    fn class(stream: u32, name: &str, fields: &[(&str, FieldType)]) -> EventClass {
        let fields = fields
            .iter()
            .map(|(n, t)| Field::new(*n, *t, false))
            .collect();
        EventClass::new(1, stream, name.into(), fields)
    }

    fn record(c: &EventClass, payload: Vec<u8>, offsets: Vec<u32>) -> Record {
        Record {
            ts: 0,
            class: Arc::new(c.clone()),
            tid: None,
            packet: PacketInfo::default(),
            payload,
            offsets,
        }
    }

    #[test]
    fn native_events_take_the_kernels_names() {
        for (lttng, kernel) in [
            ("sched_switch", "sched/sched_switch"),
            ("irq_softirq_entry", "irq/softirq_entry"),
            ("kmem_mm_page_free", "kmem/mm_page_free"),
            (
                "x86_irq_vectors_ipi_entry",
                "irq_vectors/x86_platform_ipi_entry",
            ),
            (
                "x86_irq_vectors_local_timer_exit",
                "irq_vectors/local_timer_exit",
            ),
        ] {
            assert_eq!(native_event(lttng).as_deref(), Some(kernel));
            assert!(builtin().get(kernel).is_some(), "{kernel} is built in");
        }
        assert_eq!(native_event("lttng_statedump_start"), None);
    }

    #[test]
    fn a_native_switch_is_the_kernels_record() {
        let c = class(
            0,
            "sched_switch",
            &[
                ("prev_comm", FieldType::Chars(16)),
                ("prev_tid", FieldType::S32),
                ("prev_prio", FieldType::S32),
                ("prev_state", FieldType::S64),
                ("next_comm", FieldType::Chars(16)),
                ("next_tid", FieldType::S32),
                ("next_prio", FieldType::S32),
            ],
        );
        let mut p = b"sh".to_vec();
        p.resize(16, 0);
        p.extend_from_slice(&42i32.to_le_bytes());
        p.extend_from_slice(&20i32.to_le_bytes());
        p.extend_from_slice(&0x100i64.to_le_bytes()); // preempted
        p.extend_from_slice(b"swapper/0\0\0\0\0\0\0\0");
        p.extend_from_slice(&0i32.to_le_bytes());
        p.extend_from_slice(&20i32.to_le_bytes());
        let r = record(&c, p, vec![0, 16, 20, 24, 32, 48, 52, 56]);
        let mut cat = Catalog::default();
        let t = cat.target(Origin::Kernel, &c, &TracefsFormats::default());
        assert!(t.kernel && t.key == "sched:sched_switch");
        assert_eq!((t.pid, t.switch_in), (Pid::Field(1), Some(5)));
        let rec = t.encode(&r, 42, &|_| None);
        let f = parse_event("sched", builtin().get("sched/sched_switch").unwrap()).unwrap();
        let at = |n: &str| f.field(n).unwrap().offset;
        let int = |o: usize, n: usize| uint_at(&rec, o, n).unwrap() as i64;
        assert_eq!(int(0, 2), t.id as i64);
        assert_eq!(int(4, 4), 42, "common_pid");
        assert_eq!(int(at("prev_pid"), 4), 42);
        assert_eq!(int(at("prev_prio"), 4), 120, "plus MAX_RT_PRIO");
        assert_eq!(int(at("prev_state"), 8), 0x100);
        assert_eq!(&rec[at("next_comm")..at("next_comm") + 9], b"swapper/0");
    }

    #[test]
    fn hostile_guest_formats_fall_back_to_generated_ones() {
        let c = class(
            2,
            "ftrace:evil:ev",
            &[("common_pid", FieldType::S32), ("x", FieldType::U32)],
        );
        let mut evil = TracefsFormats::default();
        for text in [
            "name: ev\u{1b}]0;pwned\u{7}\nID: 7\nformat:\n\tfield:unsigned int x;\toffset:8;\tsize:4;\tsigned:0;\n",
            "name: e v\nID: 7\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n",
            "garbage",
        ] {
            evil.events.insert("evil/ev".into(), text.into());
            let t = Catalog::default().target(Origin::Kernel, &c, &evil);
            assert!(!t.kernel, "{text:?}");
            assert_eq!((t.key.as_str(), t.pid), ("evil:ev", Pid::Field(0)));
            assert!(t.format.chars().all(|ch| ch == '\n' || ch == '\t' || (' '..='~').contains(&ch)));
            let r = record(&c, [7i32.to_le_bytes(), 9u32.to_le_bytes()].concat(), vec![0, 4, 8]);
            let rec = t.encode(&r, 7, &|_| None);
            assert_eq!(&rec[8..12], &9u32.to_le_bytes(), "x, the writing thread left out");
        }
    }

    #[test]
    fn one_format_per_event_name_each_id_once() {
        let mut cat = Catalog::default();
        let a = class(1, "p:e", &[("v", FieldType::U8)]);
        let b = class(1, "p:e", &[("v", FieldType::U64)]);
        let (ta, ta2, tb) = (
            cat.target(Origin::User, &a, &TracefsFormats::default()),
            cat.target(Origin::User, &a, &TracefsFormats::default()),
            cat.target(Origin::User, &b, &TracefsFormats::default()),
        );
        assert_eq!((ta.id, ta.key.as_str()), (ta2.id, "ivtrace_user:p_e"));
        assert_eq!(tb.key, "ivtrace_user:p_e_2", "another layout, another name");
        assert_ne!(ta.id, tb.id);
        let (_, systems) = cat.formats();
        assert_eq!(systems.len(), 1);
        assert_eq!(systems[0].1.len(), 2);
    }
}
