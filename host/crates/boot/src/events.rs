//! The events of a kernel trace the boot analysis reads, recognized once
//! per event class (by name, with their fields' indexes) and taken out of
//! each record as plain values.
//!
//! All of them are ftrace's, relayed (docs/ftrace.md): the native probes
//! start only when the initramfs loads ivtrace.ko, the boot is over by
//! then. Names as the relay's decoder writes them: `ftrace:<system>:<event>`
//! and the tracers' own `ftrace:<event>`; the writing thread is
//! `common_pid`.

use std::collections::HashMap;

use ivtrace_ctf::read::Record;
use ivtrace_region::classes::EventClass;

/// What one event says, for the boot analysis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// `initcall:initcall_level`: the kernel starts this level.
    Level(String),
    /// `initcall:initcall_start` / `initcall_finish`.
    InitcallStart {
        func: u64,
    },
    InitcallFinish {
        func: u64,
        ret: i32,
    },
    /// `sched:sched_process_exec`.
    Exec {
        pid: i32,
        filename: String,
    },
    /// `module:module_load`.
    ModuleLoad {
        name: String,
    },
    /// ftrace's `print` (a trace_marker write).
    Print {
        text: String,
    },
    /// `sched:sched_switch`.
    Switch {
        prev: i32,
        next: i32,
        prev_comm: String,
        next_comm: String,
    },
    /// function_graph's `funcgraph_entry` / `funcgraph_exit`.
    Entry {
        func: u64,
        depth: i32,
    },
    Exit {
        func: u64,
        depth: i32,
    },
}

/// One event: when (the trace clock's cycles), where, which thread, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub ts: u64,
    pub cpu: u32,
    pub tid: i32,
    pub what: What,
}

impl Event {
    pub fn is_graph(&self) -> bool {
        matches!(self.what, What::Entry { .. } | What::Exit { .. })
    }
}

/// Which fields of a class hold what an event needs (their indexes).
#[derive(Debug, Clone, Copy)]
enum Kind {
    Level(usize),
    InitcallStart(usize),
    InitcallFinish(usize, usize),
    Exec(usize, usize),
    ModuleLoad(usize),
    Print(usize),
    Switch([usize; 4]),
    Entry(usize, usize),
    Exit(usize, usize),
}

/// The trace names of the graph tracer's events.
pub const GRAPH_ENTRY: &str = "ftrace:funcgraph_entry";
pub const GRAPH_EXIT: &str = "ftrace:funcgraph_exit";
/// initcall_level and initcall_start: a trace with either has a boot to
/// analyse (the levels alone give its phases).
pub const INITCALL_LEVEL: &str = "ftrace:initcall:initcall_level";
pub const INITCALL_START: &str = "ftrace:initcall:initcall_start";

fn kind_of(c: &EventClass) -> Option<Kind> {
    let f = |name: &str| c.fields.iter().position(|x| x.name == name);
    Some(match c.name.as_str() {
        INITCALL_LEVEL => Kind::Level(f("level")?),
        INITCALL_START => Kind::InitcallStart(f("func")?),
        "ftrace:initcall:initcall_finish" => Kind::InitcallFinish(f("func")?, f("ret")?),
        "ftrace:sched:sched_process_exec" => Kind::Exec(f("pid")?, f("filename")?),
        "ftrace:module:module_load" => Kind::ModuleLoad(f("name")?),
        "ftrace:print" => Kind::Print(f("buf")?),
        "ftrace:sched:sched_switch" => Kind::Switch([
            f("prev_pid")?,
            f("next_pid")?,
            f("prev_comm")?,
            f("next_comm")?,
        ]),
        GRAPH_ENTRY => Kind::Entry(f("func")?, f("depth")?),
        GRAPH_EXIT => Kind::Exit(f("func")?, f("depth")?),
        _ => return None,
    })
}

/// Recognizes the events of a trace's classes.
#[derive(Debug, Default)]
pub struct Classifier {
    kinds: HashMap<(u32, u32), (Kind, usize)>,
}

fn text(r: &Record, i: usize) -> Option<String> {
    Some(String::from_utf8_lossy(r.text(i)?).into_owned())
}

fn int32(r: &Record, i: usize) -> Option<i32> {
    // ftrace's ints are 32-bit; a wider value is not one (guest input).
    i32::try_from(r.int(i)?).ok()
}

impl Classifier {
    /// For the classes of stream class `stream` (the ftrace streams').
    pub fn new<'a>(classes: impl IntoIterator<Item = &'a EventClass>, stream: u32) -> Classifier {
        let mut kinds = HashMap::new();
        for c in classes.into_iter().filter(|c| c.stream == stream) {
            let tid = c.fields.iter().position(|x| x.name == "common_pid");
            if let (Some(k), Some(tid)) = (kind_of(c), tid) {
                kinds.insert((c.stream, c.id), (k, tid));
            }
        }
        Classifier { kinds }
    }

    /// Is any class of these names there?
    pub fn knows(classes: &[EventClass], names: &[&str]) -> bool {
        classes.iter().any(|c| names.contains(&c.name.as_str()))
    }

    /// What `r` says, if it is an event the analysis reads and its fields
    /// are what they should be.
    pub fn event(&self, r: &Record) -> Option<Event> {
        let (kind, tid) = *self.kinds.get(&(r.packet.stream_class, r.class.id))?;
        let what = match kind {
            Kind::Level(i) => What::Level(text(r, i)?),
            Kind::InitcallStart(i) => What::InitcallStart {
                func: r.int(i)? as u64,
            },
            Kind::InitcallFinish(i, j) => What::InitcallFinish {
                func: r.int(i)? as u64,
                ret: int32(r, j)?,
            },
            Kind::Exec(i, j) => What::Exec {
                pid: int32(r, i)?,
                filename: text(r, j)?,
            },
            Kind::ModuleLoad(i) => What::ModuleLoad { name: text(r, i)? },
            Kind::Print(i) => What::Print { text: text(r, i)? },
            Kind::Switch([a, b, c, d]) => What::Switch {
                prev: int32(r, a)?,
                next: int32(r, b)?,
                prev_comm: text(r, c)?,
                next_comm: text(r, d)?,
            },
            Kind::Entry(i, j) => What::Entry {
                func: r.int(i)? as u64,
                depth: int32(r, j)?,
            },
            Kind::Exit(i, j) => What::Exit {
                func: r.int(i)? as u64,
                depth: int32(r, j)?,
            },
        };
        Some(Event {
            ts: r.ts,
            cpu: r.cpu(),
            tid: int32(r, tid)?,
            what,
        })
    }
}
