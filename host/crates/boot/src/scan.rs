//! Pass 1: the boot's timeline from its events, in time order.
//!
//! - Levels start at `initcall_level` (the kernel's own word), sub-levels
//!   (`_sync`, `rootfs`) at the first initcall whose table entry names
//!   them ([`crate::levels`]); a sub-level never goes back.
//! - The trace may begin inside a level: ftrace empties its buffer when a
//!   boot tracer starts (`ftrace=function_graph` registers at core level),
//!   so an initcall that returns before any starts says where it began.
//! - `post_initcalls` runs from the last initcall's return to the exec of
//!   pid 1 (/init: user space), `workload` from the first trace_marker line
//!   starting with `ivtrace-boot` (or the exec of a named program). The
//!   boot ends where the workload starts, else where the trace ends.
//! - What ran on each vCPU: the context switches, up to the boot's end.
//!
//! Everything in the trace is guest input: the lists are bounded and what
//! does not fit is counted in a note.

use std::collections::HashMap;

use ivtrace_region::kallsyms::Symbols;

use crate::events::{Event, What};
use crate::levels::{known_level, level_of, order, InitcallLevels};
use crate::model::{Boot, CpuTime, Initcall, Mark, Phase};

/// More initcalls, marks or (vCPU, thread) pairs than a boot has.
pub const LIST_MAX: usize = 1 << 20;

/// The phase of a trace that begins inside an initcall level the symbols
/// do not name.
pub const UNKNOWN_LEVEL: &str = "unknown_level";

/// What a trace_marker line starts with to mark the boot's end.
pub const MARKER: &str = "ivtrace-boot";

/// The name a symbol table gives an address, else its hex.
pub fn func_name(symbols: &Symbols, addr: u64) -> String {
    match symbols.function(addr) {
        Some((s, 0)) => s.name.clone(),
        Some((s, off)) => format!("{}+{off:#x}", s.name),
        None => format!("{addr:#x}"),
    }
}

/// The pass-1 state.
pub struct Scan<'a> {
    reset: u64,
    symbols: &'a Symbols,
    levels: InitcallLevels,
    /// A program whose exec starts the workload (basename).
    workload: Option<String>,
    first: Option<u64>,
    last: u64,
    /// Where each level or sub-level starts, in order.
    starts: Vec<(u64, &'static str)>,
    level: Option<&'static str>,
    sub: Option<&'static str>,
    /// The trace began inside this sub-level (an initcall returned first).
    began_inside: Option<&'static str>,
    initcalls: Vec<Initcall>,
    open: HashMap<i32, usize>,
    marks: Vec<Mark>,
    userland: Option<u64>,
    end: Option<u64>,
    running: HashMap<u32, (i32, u64)>,
    cpu_time: HashMap<(u32, i32), u64>,
    comms: HashMap<i32, String>,
    /// The module each thread loaded last.
    loaded: HashMap<i32, String>,
    dropped: u64,
}

impl<'a> Scan<'a> {
    /// `reset`: the clock value of the vCPU's reset
    /// ([`crate::model::reset_value`]), where the timeline starts.
    pub fn new(symbols: &'a Symbols, workload: Option<String>, reset: u64) -> Scan<'a> {
        Scan {
            reset,
            symbols,
            levels: InitcallLevels::new(symbols),
            workload,
            first: None,
            last: 0,
            starts: Vec::new(),
            level: None,
            sub: None,
            began_inside: None,
            initcalls: Vec::new(),
            open: HashMap::new(),
            marks: Vec::new(),
            userland: None,
            end: None,
            running: HashMap::new(),
            cpu_time: HashMap::new(),
            comms: HashMap::new(),
            loaded: HashMap::new(),
            dropped: 0,
        }
    }

    /// The next event (events come in time order).
    pub fn event(&mut self, e: &Event) {
        self.first.get_or_insert(e.ts);
        self.last = self.last.max(e.ts);
        match &e.what {
            What::Level(l) => self.level_starts(e.ts, l),
            What::InitcallStart { func } => self.initcall_start(e, *func),
            What::InitcallFinish { func, ret } => self.initcall_finish(e, *func, *ret),
            What::Exec { pid, filename } => self.exec(e, *pid, filename),
            What::ModuleLoad { name } => self.module_load(e, name),
            What::Print { text } => self.print(e, text),
            What::Switch {
                prev,
                next,
                prev_comm,
                next_comm,
            } => self.switch(e, (*prev, prev_comm), (*next, next_comm)),
            What::Entry { .. } | What::Exit { .. } => {}
        }
    }

    /// Moves to sub-level `sub` at `ts` if it comes later than the one
    /// running (a sub-level never goes back).
    fn advance(&mut self, ts: u64, sub: &'static str) {
        if self.sub.is_some_and(|cur| order(cur) >= order(sub)) {
            return;
        }
        self.starts.push((ts, sub));
        self.sub = Some(sub);
        self.level = level_of(sub);
    }

    fn level_starts(&mut self, ts: u64, level: &str) {
        if let Some(l) = known_level(level) {
            self.advance(ts, l);
        }
    }

    /// An initcall's name and phase: the kernel's by the initcall table; a
    /// module's (user space loads it: do_init_module) by the module its
    /// thread loaded last, when its init function's symbol is gone (a
    /// module's init text is freed before the relay reads kallsyms).
    fn initcall_of(&mut self, e: &Event, func: u64) -> (String, &'static str) {
        if self.userland.is_none() {
            let name = func_name(self.symbols, func);
            if let Some(sub) = self.levels.sublevel(&name, self.level) {
                self.advance(e.ts, sub);
            }
            return (name, self.sub.unwrap_or(UNKNOWN_LEVEL));
        }
        let phase = if self.end.is_some() {
            "workload"
        } else {
            "userland"
        };
        // The symbol at the address counts only if it is the loading
        // module's: the freed init text of one module can be reused by the
        // next one loaded before the relay reads kallsyms.
        let name = match (self.symbols.function(func), self.loaded.get(&e.tid)) {
            (Some((s, 0)), Some(m)) if s.module.as_deref() == Some(m.as_str()) => {
                format!("{} [{m}]", s.name)
            }
            (_, Some(m)) => format!("{m}.init"),
            _ => func_name(self.symbols, func),
        };
        (name, phase)
    }

    fn initcall_start(&mut self, e: &Event, func: u64) {
        let (name, level) = self.initcall_of(e, func);
        if self.initcalls.len() >= LIST_MAX {
            self.dropped += 1;
            return;
        }
        self.open.insert(e.tid, self.initcalls.len());
        self.initcalls.push(Initcall {
            func,
            name,
            level: level.to_string(),
            start: e.ts,
            end: None,
            ret: None,
            cpu: e.cpu,
            tid: e.tid,
        });
    }

    fn initcall_finish(&mut self, e: &Event, func: u64, ret: i32) {
        match self.open.get(&e.tid) {
            Some(&i) if self.initcalls[i].func == func => {
                self.open.remove(&e.tid);
                let c = &mut self.initcalls[i];
                c.end = Some(e.ts);
                c.ret = Some(ret);
            }
            _ if self.starts.is_empty() && self.initcalls.is_empty() => {
                let name = func_name(self.symbols, func);
                let sub = self.levels.sublevel(&name, None);
                self.began_inside = Some(sub.unwrap_or(UNKNOWN_LEVEL));
                if let Some(sub) = sub {
                    self.sub = Some(sub);
                    self.level = level_of(sub);
                }
            }
            _ => {}
        }
    }

    fn push_mark(&mut self, e: &Event, kind: &str, name: &str) {
        if self.marks.len() >= LIST_MAX {
            self.dropped += 1;
            return;
        }
        self.marks.push(Mark {
            ts: e.ts,
            kind: kind.into(),
            name: name.into(),
            cpu: e.cpu,
            tid: e.tid,
        });
    }

    fn mark(&mut self, e: &Event, kind: &str, name: &str) {
        if self.end.is_none() {
            self.push_mark(e, kind, name);
        }
    }

    fn module_load(&mut self, e: &Event, name: &str) {
        if self.loaded.len() < LIST_MAX {
            self.loaded.insert(e.tid, name.to_string());
        }
        self.mark(e, "module", name);
    }

    fn exec(&mut self, e: &Event, pid: i32, filename: &str) {
        let base = filename.rsplit('/').next().unwrap_or(filename);
        self.comms.insert(pid, base.chars().take(15).collect());
        if pid == 1 {
            self.userland.get_or_insert(e.ts);
            self.mark(e, "exec", filename);
        }
        if self.workload.as_deref() == Some(base) && self.userland.is_some() {
            self.workload_starts(e, "workload", filename);
        }
    }

    fn print(&mut self, e: &Event, text: &str) {
        let line = text.trim_end_matches('\n');
        if line.starts_with(MARKER) {
            self.workload_starts(e, "marker", line);
        }
    }

    /// The boot ends here (the first time): what ran is counted up to now.
    fn workload_starts(&mut self, e: &Event, kind: &str, name: &str) {
        if self.end.is_some() {
            return;
        }
        self.push_mark(e, kind, name);
        self.end = Some(e.ts);
        let running: Vec<(u32, (i32, u64))> = self.running.drain().collect();
        for (cpu, (tid, since)) in running {
            self.ran(cpu, tid, e.ts.saturating_sub(since));
        }
    }

    fn ran(&mut self, cpu: u32, tid: i32, cycles: u64) {
        if self.cpu_time.len() >= LIST_MAX && !self.cpu_time.contains_key(&(cpu, tid)) {
            self.dropped += 1;
            return;
        }
        let t = self.cpu_time.entry((cpu, tid)).or_default();
        *t = t.saturating_add(cycles);
    }

    fn switch(&mut self, e: &Event, prev: (i32, &str), next: (i32, &str)) {
        if self.comms.len() < LIST_MAX {
            self.comms.insert(prev.0, prev.1.to_string());
            self.comms.insert(next.0, next.1.to_string());
        }
        if self.end.is_some() {
            return;
        }
        if let Some((tid, since)) = self.running.insert(e.cpu, (next.0, e.ts)) {
            self.ran(e.cpu, tid, e.ts.saturating_sub(since));
        }
    }

    /// The boot: the timeline closed, what ran summed.
    pub fn finish(mut self) -> Boot {
        let (Some(first), last) = (self.first, self.last) else {
            return Boot::default();
        };
        let end = self.end.unwrap_or(last);
        let running: Vec<(u32, (i32, u64))> = self.running.drain().collect();
        for (cpu, (tid, since)) in running {
            self.ran(cpu, tid, end.saturating_sub(since));
        }
        let mut notes = Vec::new();
        let phases = self.phases(first, last, &mut notes);
        if self.dropped > 0 {
            notes.push(format!(
                "{} initcalls, marks or vCPU threads past {LIST_MAX} were left out",
                self.dropped
            ));
        }
        Boot {
            phases,
            cpu_time: self.cpu_times(),
            initcalls: self.initcalls,
            marks: self.marks,
            first,
            last,
            end,
            notes,
            reset: self.reset,
        }
    }

    fn cpu_times(&self) -> Vec<CpuTime> {
        let mut v: Vec<CpuTime> = self
            .cpu_time
            .iter()
            .map(|(&(cpu, tid), &cycles)| CpuTime {
                cpu,
                tid,
                comm: match (tid, self.comms.get(&tid)) {
                    (0, _) => format!("swapper/{cpu}"),
                    (_, Some(c)) => c.clone(),
                    (_, None) => String::new(),
                },
                cycles,
            })
            .collect();
        v.sort_by(|a, b| {
            a.cpu
                .cmp(&b.cpu)
                .then(b.cycles.cmp(&a.cycles))
                .then(a.tid.cmp(&b.tid))
        });
        v
    }
}

/// One phase's start: (when, name, level, stage).
type Start = (u64, &'static str, &'static str, &'static str);

impl Scan<'_> {
    /// Where the kernel's part of the trace begins: inside a level, or
    /// before the first (start_kernel).
    fn kernel_begins(&self, first: u64, notes: &mut Vec<String>) -> Option<Start> {
        if let Some(sub) = self.began_inside {
            notes.push(format!(
                "the trace begins inside {sub}: ftrace emptied its buffer when the boot tracer \
                 started (Linux resets it at a tracer switch), the levels before are not in it"
            ));
            return Some((first, sub, level_of(sub).unwrap_or(""), "kernel"));
        }
        match self.starts.first() {
            Some(&(ts, _)) if ts <= first => None,
            _ => Some((first, "start_kernel", "", "kernel")),
        }
    }

    /// Where user space starts: after the last initcall's return, and at
    /// pid 1's exec.
    fn userland_begins(&self, starts: &mut Vec<Start>, notes: &mut Vec<String>) {
        let Some(userland) = self.userland else {
            notes.push(
                "no exec by pid 1 (/init) in the trace: the kernel's part ends with it \
                 (trace_event=sched:sched_process_exec shows it)"
                    .into(),
            );
            return;
        };
        let last_ret = self
            .initcalls
            .iter()
            .filter_map(|c| c.end)
            .filter(|&e| e <= userland)
            .max();
        let after = starts.last().map_or(0, |s| s.0);
        if let Some(r) = last_ret.filter(|&r| r > after && r < userland) {
            starts.push((r, "post_initcalls", "", "kernel"));
        }
        starts.push((userland, "userland", "", "userland"));
    }

    /// The timeline: every phase from the vCPU's reset (`reset`) to
    /// the trace's end, each ending where the next starts.
    fn phases(&self, first: u64, last: u64, notes: &mut Vec<String>) -> Vec<Phase> {
        let mut starts: Vec<Start> = Vec::new();
        if first > self.reset {
            starts.push((self.reset, "untraced", "", "untraced"));
        }
        starts.extend(self.kernel_begins(first, notes));
        let kernel_end = self.userland.unwrap_or(u64::MAX);
        for &(ts, sub) in self.starts.iter().filter(|s| s.0 < kernel_end) {
            starts.push((ts.max(first), sub, level_of(sub).unwrap_or(""), "kernel"));
        }
        if self.starts.is_empty() && self.began_inside.is_none() {
            notes.push(
                "no initcall levels in the trace (trace_event=initcall on the kernel command line \
                 records them)"
                    .into(),
            );
        }
        self.userland_begins(&mut starts, notes);
        match self.end {
            Some(end) => starts.push((end, "workload", "", "workload")),
            None => notes.push(format!(
                "no workload mark (a trace_marker line starting with '{MARKER}'): the boot is \
                 taken to end with the trace"
            )),
        }
        starts.sort_by_key(|s| s.0);
        let mut phases: Vec<Phase> = Vec::with_capacity(starts.len());
        for (i, &(ts, name, level, stage)) in starts.iter().enumerate() {
            let end = starts.get(i + 1).map_or(last.max(ts), |n| n.0);
            if end > ts || i + 1 == starts.len() {
                phases.push(Phase {
                    name: name.into(),
                    level: level.into(),
                    stage: stage.into(),
                    start: ts,
                    end,
                });
            }
        }
        phases
    }
}
