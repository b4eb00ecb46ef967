//! The kernel stream expanded as its packets arrive (what a relay
//! connection needs: LTTng's consumers never rewrite what they sent).
//!
//! Each packet is rewritten as [`super`] describes, with what is known when
//! it arrives instead of what the whole recording knows:
//!
//! * thread names: the latest name a naming event drained so far gave the
//!   thread (any CPU's), else the guest's thread name table, which the
//!   guest module keeps current in the metadata area and the engine
//!   re-reads while recording, else empty (`comm_unknown`). A name given by
//!   an event that another CPU's channel delivers later is not used: the
//!   table usually has it already;
//! * interrupt names: the state dump's, as they arrive;
//! * system calls: each number gets its `syscall_{entry,exit}_<name>`
//!   class the first time it occurs (ids up to 30 first, for 4-byte event
//!   headers), so the metadata only grows, by appended event declarations.
//!
//! The wire classes may grow too (the module registers events): plans are
//! rebuilt when their generation changes, output classes already declared
//! never change.

use std::collections::HashMap;
use std::time::Instant;

use ivtrace_region::abi;
use ivtrace_region::classes::StreamClasses;
use ivtrace_region::names::NameTable;

use super::lttng;
use super::names::{sanitize_comm, Comm, IrqNames, TableNames, COMM_LEN};
use super::plan::{self, ClassPlan, Naming, Out, Plans};
use super::rewrite::{self, Event, Timeline, WriteEvent};
use super::{syscalls, KernelExpansion};
use ivtrace_region::bytes::le_u32;
use ivtrace_time::ClockMapping;

/// Most thread names kept (the table of a guest with more threads than this
/// still names the rest).
const MAX_THREADS: usize = 1 << 20;

/// The online kernel expander of one recording.
pub struct OnlineKernel {
    wire_generation: Option<u64>,
    plans: Plans,
    names: HashMap<u32, Comm>,
    table: TableNames,
    irqs: IrqNames,
    classes: StreamClasses,
    /// Output class per syscall number, [entry, exit] (0: none yet).
    syscall_ids: [HashMap<u64, u32>; 2],
    unknown_declared: [bool; 2],
    used_ids: Vec<bool>,
    generation: u64,
    pub stats: KernelExpansion,
    out: Vec<u8>,
}

impl Default for OnlineKernel {
    fn default() -> Self {
        OnlineKernel {
            wire_generation: None,
            plans: Plans::default(),
            names: HashMap::new(),
            table: TableNames::default(),
            irqs: IrqNames::default(),
            classes: StreamClasses::default(),
            syscall_ids: [HashMap::new(), HashMap::new()],
            unknown_declared: [false; 2],
            used_ids: vec![false; abi::IVT_EVENT_IDS_MAX as usize],
            generation: 0,
            stats: KernelExpansion::default(),
            out: Vec::new(),
        }
    }
}

impl OnlineKernel {
    /// The output classes declared so far.
    pub fn classes(&self) -> &StreamClasses {
        &self.classes
    }

    /// Changes whenever [`OnlineKernel::classes`] grows.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The guest's thread name table as read now (replaces the last one).
    pub fn set_table(&mut self, table: &NameTable) {
        self.table = TableNames::new(table);
        self.stats.name_table_entries = self.table.len() as u64;
    }

    /// Takes new wire classes into the plans and declares their output.
    fn follow_wire(&mut self, wire: &StreamClasses, generation: u64) {
        if self.wire_generation == Some(generation) {
            return;
        }
        self.wire_generation = Some(generation);
        self.plans = plan::plan(wire);
        for c in wire.iter() {
            self.used_ids[c.id as usize] = true;
            if self.classes.get(c.id).is_some() {
                continue;
            }
            let Some(p) = self.plans.get(c.id) else {
                continue;
            };
            let fields = match &p.out {
                Out::Verbatim => c.fields.iter().map(plan::plain).collect(),
                Out::Expand(ops) => plan::expanded_fields(c, ops),
                Out::Syscall { .. } => continue,
            };
            plan::insert(&mut self.classes, c.id, c.name.clone(), fields);
            self.generation += 1;
        }
    }

    /// The output id of syscall `nr`, declaring its class on first use;
    /// None: it keeps the wire class (`_unknown`).
    fn syscall_id(&mut self, exit: bool, nr: u64) -> Option<u32> {
        if let Some(&id) = self.syscall_ids[exit as usize].get(&nr) {
            return Some(id);
        }
        let s = syscalls::get(nr)?;
        let id = self.used_ids.iter().position(|u| !u)? as u32;
        self.used_ids[id as usize] = true;
        let name = format!("syscall_{}_{}", if exit { "exit" } else { "entry" }, s.name);
        plan::insert(
            &mut self.classes,
            id,
            name,
            lttng::fields(if exit { s.exit } else { s.entry }),
        );
        self.syscall_ids[exit as usize].insert(nr, id);
        self.stats.syscall_classes += 1;
        self.generation += 1;
        Some(id)
    }

    fn declare_unknown(&mut self, exit: bool, wire: &StreamClasses, wire_id: u32) {
        if std::mem::replace(&mut self.unknown_declared[exit as usize], true) {
            return;
        }
        let Some(c) = wire.get(wire_id) else { return };
        let name = format!("syscall_{}_unknown", if exit { "exit" } else { "entry" });
        plan::insert(
            &mut self.classes,
            wire_id,
            name,
            c.fields.iter().map(plan::plain).collect(),
        );
        self.generation += 1;
    }

    /// The expanded form of one wire packet, its times in nanoseconds with
    /// the mapping in force on its stream's `time`; None if it does not
    /// walk (the drain validated it, so only a host bug gets here) or a
    /// time has no nanosecond value: the caller counts its events as lost.
    pub fn packet(
        &mut self,
        (wire, generation): (&StreamClasses, u64),
        pkt: &[u8],
        time: (&ClockMapping, &mut Timeline),
    ) -> Option<&[u8]> {
        let started = Instant::now();
        self.follow_wire(wire, generation);
        self.stats.bytes_in += pkt.len() as u64;
        let mut out = std::mem::take(&mut self.out);
        let plans = std::mem::take(&mut self.plans);
        let events = rewrite::packet(&plans, pkt, time, &mut Writer { k: self, wire }, &mut out);
        self.plans = plans;
        self.out = out;
        self.stats.seconds += started.elapsed().as_secs_f64();
        let events = events?;
        self.stats.events += events;
        self.stats.packets += 1;
        self.stats.bytes_out += self.out.len() as u64;
        self.stats.events_per_s = if self.stats.seconds > 0.0 {
            self.stats.events as f64 / self.stats.seconds
        } else {
            0.0
        };
        Some(&self.out)
    }

    /// What a naming event teaches: a thread's name, an interrupt's.
    fn learn(&mut self, plan: &ClassPlan, payload: &[u8], offs: &[u32]) {
        let field = |i: u8| &payload[offs[i as usize] as usize..offs[i as usize + 1] as usize];
        match plan.naming {
            Some(Naming::Thread { tid, comm }) => {
                let tid = le_u32(field(tid), 0);
                if tid != 0 && (self.names.len() < MAX_THREADS || self.names.contains_key(&tid)) {
                    let name = sanitize_comm(field(comm));
                    if self.names.insert(tid, name) == Some(name) {
                        self.stats.names_repeated += 1;
                    } else {
                        self.stats.name_changes += 1;
                    }
                    self.stats.threads = self.names.len() as u64;
                }
            }
            Some(Naming::IrqAction { irq, action }) => {
                let text = field(action);
                self.irqs
                    .add(le_u32(field(irq), 0), &text[..text.len().saturating_sub(1)]);
                self.stats.irqs_named = self.irqs.len() as u64;
            }
            _ => {}
        }
    }

    fn comm(&mut self, tid: u32, idle: &Comm) -> Comm {
        self.stats.comm_fields += 1;
        if tid == 0 {
            return *idle;
        }
        if let Some(c) = self.names.get(&tid) {
            return *c;
        }
        match self.table.get(tid) {
            Some(c) => {
                self.stats.comm_from_table += 1;
                *c
            }
            None => {
                self.stats.comm_unknown += 1;
                [0; COMM_LEN]
            }
        }
    }
}

/// The online expander writing one packet of wire classes `wire`.
struct Writer<'a> {
    k: &'a mut OnlineKernel,
    wire: &'a StreamClasses,
}

impl WriteEvent for Writer<'_> {
    fn saw(&mut self, plan: &ClassPlan, e: &Event) {
        self.k.learn(plan, e.payload, e.offs);
    }

    fn thread_name(&mut self, tid: u32, _ts: u64, idle: &Comm) -> Comm {
        self.k.comm(tid, idle)
    }

    fn irq_name(&mut self, irq: u32) -> &[u8] {
        let name = self.k.irqs.get(irq);
        self.k.stats.irq_names_unknown += name.is_empty() as u64;
        name
    }

    fn syscall_id(&mut self, exit: bool, nr: u64) -> Option<u32> {
        self.k.syscall_id(exit, nr)
    }

    fn unknown_syscall(&mut self, exit: bool, wire_id: u32) {
        self.k.declare_unknown(exit, self.wire, wire_id);
    }

    fn stats(&mut self) -> &mut KernelExpansion {
        &mut self.k.stats
    }
}
