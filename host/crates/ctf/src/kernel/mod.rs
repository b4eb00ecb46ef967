//! The kernel stream, from its compact wire form to LTTng-kernel-compatible
//! CTF (docs/abi.md, "Kernel stream").
//!
//! The guest module keeps events small: `sched_switch` carries thread ids
//! but no names, `irq_handler_entry` an irq number but no name, system calls
//! one `syscall_entry`/`syscall_exit` class with the number as a field. The
//! output is what Trace Compass's kernel analyses and babeltrace2 expect from
//! lttng-modules 2.13:
//!
//! 1. before every u32 field flagged `IVT_FF_TID_COMM` (`prev_tid`), a
//!    `char[16]` with the thread's name *at the event's time* (`prev_comm`),
//!    from the naming events of every CPU ([`names`]); tid 0 is
//!    `swapper/<cpu>`;
//! 2. after `irq_handler_entry`'s `irq`, a `name` string from the state
//!    dump's `lttng_statedump_interrupt` records;
//! 3. `syscall_entry_<name>` / `syscall_exit_<name>` per x86-64 system
//!    call that occurs ([`syscalls`]), `_unknown` (with `id`) for the rest.
//!
//! [`plan`] decides what each wire class becomes, [`wire`] reads packets.
//!
//! # Stage, then expand (why not online)
//!
//! A name must be looked up as it was at the event's time, and the event
//! that gives it may sit on another CPU's channel that the host drains
//! later (a fork on CPU 0 names the child a switch on CPU 1 runs first; a
//! state dump on one CPU names threads every CPU already switched to). An
//! online expansion would need a reorder window as long as the longest
//! drain lag across channels, which the guest controls (a CPU that goes
//! quiet keeps its packet open until the flush timer), plus a final pass for
//! whatever the window missed. Instead the host stages the kernel's wire
//! packets while it records, exactly as it used to write them, in a hidden
//! directory inside the output (`DIR/.kernel-wire/`; it holds no file named
//! `metadata`, so babeltrace2's discovery never treats it as a trace), and
//! expands them when the recording ends:
//!
//! * pass 1 merges the naming events of all channels in time order (a heap
//!   over one cursor per channel) into the name timeline, the interrupt
//!   names and the syscall numbers that occur. Lookups then never depend on
//!   drain order, and the timeline keeps one entry per name *change*, so its
//!   memory is bounded by the trace (and capped, [`names::MAX_NAME_ENTRIES`]),
//!   never by what the guest claims;
//! * pass 2 rewrites every packet into `DIR/kernel/kernel_chanN`, one packet
//!   buffer reused, no allocation per event; then `.kernel-wire` is removed.
//!
//! The drain loop and the user stream are untouched (a kernel packet costs
//! the same write as before); the price is a second read of the kernel data
//! at the end (see docs/abi.md for the measured rate). If the recorder dies
//! before it expands, `.kernel-wire/` keeps the wire packets and their
//! metadata as `metadata.wire` (rename it to `metadata` to read them).

pub mod lttng;
pub mod names;
pub mod online;
pub mod plan;
pub mod rewrite;
pub mod syscalls;
pub mod wire;

#[cfg(test)]
pub(crate) mod tests;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::{self, BufWriter, Write};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use ivtrace_region::abi;
use ivtrace_region::classes::StreamClasses;

use lttng::SyscallWire;

use crate::outdir::OutDir;
use crate::trace::{create_err, write_err, CtfError};
use ivtrace_region::bytes::le_u32;
use ivtrace_region::names::NameTable;
use ivtrace_time::ClockMapping;
use names::{sanitize_comm, Comm, Name, TableNames, ThreadNames, COMM_LEN};
use plan::{Facts, Naming, Output, Plans};
use rewrite::{Timeline, WriteEvent};
use wire::{align_event, event_header, packet_content, Offsets, PacketFile};

/// Hidden directory (inside the output) holding the staged wire packets.
pub const STAGING_DIR: &str = ".kernel-wire";
/// Name of the wire-form metadata in [`STAGING_DIR`] (not `metadata`, so
/// CTF readers do not pick the directory up).
pub const WIRE_METADATA: &str = "metadata.wire";

/// One kernel channel's staged wire file (in the staging directory) and
/// its output file (in `kernel/`), both named `kernel_chanN`.
#[derive(Debug, Clone)]
pub struct Staged {
    pub chan: u32,
    pub name: String,
}

impl Staged {
    pub fn channel(chan: u32) -> Staged {
        Staged {
            chan,
            name: crate::trace::stream_file_name(abi::IVT_STREAM_KERNEL, chan),
        }
    }
}

/// Expands the staged files of `staging` into a new `kernel/` directory
/// of `root`, times in nanoseconds with `clock` (the final mapping);
/// returns what the expansion did and that directory.
pub fn expand_dir(
    root: &OutDir,
    staging: &OutDir,
    wire: &StreamClasses,
    (files, clock): (&[Staged], &ClockMapping),
    table: &NameTable,
) -> Result<(Expanded, OutDir), CtfError> {
    let name = crate::trace::stream_dir(abi::IVT_STREAM_KERNEL);
    let shown = root.join(name).display().to_string();
    let out = root.create_dir(name).map_err(create_err(&shown))?;
    let dirs = Dirs { staging, out: &out };
    let expanded = expand(wire, &dirs, (files, clock), table).map_err(write_err(&shown))?;
    Ok((expanded, out))
}

/// Where the staged files are read and the expanded ones written.
pub struct Dirs<'a> {
    pub staging: &'a OutDir,
    pub out: &'a OutDir,
}

/// Read buffer per staged file in pass 1 (all are open at once): bounded
/// in total whatever the number of kernel channels.
fn read_buffer(files: usize) -> usize {
    ((16usize << 20) / files.max(1)).clamp(8 << 10, 64 << 10)
}

/// What the expansion did (the sidecar's `kernel_expansion`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelExpansion {
    pub events: u64,
    pub packets: u64,
    /// Staged packets that could not be walked: each is written empty,
    /// its events counted as lost (the packets after it carry them in
    /// `events_discarded`), per channel in `lost_by_channel`.
    pub packets_skipped: u64,
    #[serde(default)]
    pub events_lost: u64,
    #[serde(default)]
    pub lost_by_channel: BTreeMap<u32, u64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Threads with at least one name, and the name changes kept.
    pub threads: u64,
    pub name_changes: u64,
    /// Naming events that repeated a thread's current name.
    pub names_repeated: u64,
    /// Name changes not kept: the table was full.
    pub names_dropped: u64,
    /// Thread-name fields written, and how many of them had to take the
    /// thread's earliest later name, or had none at all (empty).
    pub comm_fields: u64,
    pub comm_later: u64,
    pub comm_unknown: u64,
    /// Thread-name fields no naming event gave, taken from the guest's
    /// thread name table (crash salvage), and that table's names.
    #[serde(default)]
    pub comm_from_table: u64,
    #[serde(default)]
    pub name_table_entries: u64,
    /// Interrupts named by the state dump; irq names written empty.
    pub irqs_named: u64,
    pub irq_names_unknown: u64,
    /// `syscall_*_<name>` classes created; syscall events written under
    /// them and under `syscall_*_unknown`.
    pub syscall_classes: u64,
    pub syscalls_named: u64,
    pub syscalls_unknown: u64,
    /// Times written as the stream's previous one (a guest time that went
    /// back, or the mapping in force moved back between two packets of
    /// the streaming expansion), and times the clock has no nanosecond
    /// value for (their packets are skipped, their events lost).
    #[serde(default)]
    pub ts_clamped: u64,
    #[serde(default)]
    pub ts_unmapped: u64,
    /// Wall-clock seconds of both passes, and events per second.
    pub seconds: f64,
    pub events_per_s: f64,
}

/// The expanded kernel trace: its classes and what it took.
#[derive(Debug)]
pub struct Expanded {
    pub classes: StreamClasses,
    pub stats: KernelExpansion,
}

/// Expands the staged `files` (wire classes `wire`) into their output
/// files, which must not exist yet, times in nanoseconds with `clock`.
/// `table`: the guest's thread name table, for threads that no naming
/// event in the trace names.
pub fn expand(
    wire: &StreamClasses,
    dirs: &Dirs,
    files: (&[Staged], &ClockMapping),
    table: &NameTable,
) -> io::Result<Expanded> {
    expand_with(wire, dirs, files, Facts::default().names, table)
}

/// [`expand`] with a given (empty) name timeline, e.g. a smaller cap in tests.
pub fn expand_with(
    wire: &StreamClasses,
    dirs: &Dirs,
    (files, clock): (&[Staged], &ClockMapping),
    names: names::ThreadNamesBuilder,
    table: &NameTable,
) -> io::Result<Expanded> {
    let started = Instant::now();
    let plans = plan::plan(wire);
    let mut facts = Facts::new(&plans);
    facts.names = names;
    collect(&plans, dirs, files, &mut facts)?;
    let output = plan::output(wire, &plans, &facts);
    let mut stats = KernelExpansion {
        names_repeated: facts.names.repeated,
        names_dropped: facts.names.dropped,
        irqs_named: facts.irqs.len() as u64,
        syscall_classes: output.syscall_classes,
        ..KernelExpansion::default()
    };
    let names = facts.names.build();
    stats.threads = names.threads() as u64;
    stats.name_changes = names.entries() as u64;
    let table = TableNames::new(table);
    stats.name_table_entries = table.len() as u64;
    let mut x = Expander {
        plans: &plans,
        names: &names,
        table: &table,
        irqs: &facts.irqs,
        output: &output,
        clock,
        stats: &mut stats,
    };
    let mut out = Vec::new();
    for f in files {
        x.file(dirs, f, &mut out)?;
    }
    stats.seconds = started.elapsed().as_secs_f64();
    stats.events_per_s = if stats.seconds > 0.0 {
        stats.events as f64 / stats.seconds
    } else {
        0.0
    };
    Ok(Expanded {
        classes: output.classes,
        stats,
    })
}

/// A naming fact: (time, channel, tid, name); ordered by time first.
type NameFact = (u64, u32, u32, Comm);

/// Pass 1 over one channel: yields its thread-name facts in order and
/// records the other facts (irq names, syscall numbers) on the way.
struct Cursor {
    file: PacketFile,
    chan: u32,
    content: usize,
    off: usize,
    last_ts: u64,
    offs: Offsets,
}

impl Cursor {
    fn open(dir: &OutDir, f: &Staged, buffer: usize) -> io::Result<Cursor> {
        Ok(Cursor {
            file: PacketFile::new(dir.open_read(&f.name)?, buffer),
            chan: f.chan,
            content: 0,
            off: 0,
            last_ts: 0,
            offs: [0; abi::IVT_FIELDS_MAX as usize + 1],
        })
    }

    fn next_name(&mut self, plans: &Plans, facts: &mut Facts) -> io::Result<Option<NameFact>> {
        loop {
            if self.off >= self.content {
                if !self.file.next_packet()? {
                    return Ok(None);
                }
                (self.content, self.off) = (0, 0);
                if let Some((h, content)) = packet_content(&self.file.buf) {
                    (self.content, self.off) = (content, abi::PACKET_HDR_SIZE);
                    self.last_ts = h.timestamp_begin;
                }
                continue;
            }
            let content = &self.file.buf[..self.content];
            // A packet that does not walk is skipped here and counted in pass 2.
            let Some(h) = event_header(content, self.off, self.last_ts) else {
                self.off = self.content;
                continue;
            };
            let Some(plan) = plans.get(h.id) else {
                self.off = self.content;
                continue;
            };
            let p0 = self.off + h.len;
            let Some(offs) = plan.layout.offsets(&content[p0..], &mut self.offs) else {
                self.off = self.content;
                continue;
            };
            let payload = &content[p0..p0 + offs[offs.len() - 1] as usize];
            self.last_ts = h.ts;
            self.off = align_event(p0 + payload.len());
            let field = |i: u8| &payload[offs[i as usize] as usize..offs[i as usize + 1] as usize];
            match plan.naming {
                Some(Naming::Thread { tid, comm }) => {
                    let tid = le_u32(field(tid), 0);
                    if tid != 0 {
                        return Ok(Some((h.ts, self.chan, tid, sanitize_comm(field(comm)))));
                    }
                }
                Some(Naming::IrqAction { irq, action }) => {
                    let text = field(action);
                    facts
                        .irqs
                        .add(le_u32(field(irq), 0), &text[..text.len().saturating_sub(1)]);
                }
                Some(Naming::Syscall { exit }) => {
                    let w = SyscallWire::parse(exit, payload, offs);
                    let named = syscalls::get(w.nr).filter(|s| w.matches(exit, s));
                    let counts = &mut facts.syscalls[exit as usize];
                    match named.and_then(|_| counts.get_mut(w.nr as usize)) {
                        Some(n) => *n += 1,
                        None => facts.syscalls_unknown[exit as usize] += 1,
                    }
                }
                None => {}
            }
        }
    }
}

/// Pass 1: every channel's naming events, merged in time order.
fn collect(plans: &Plans, dirs: &Dirs, files: &[Staged], facts: &mut Facts) -> io::Result<()> {
    let buffer = read_buffer(files.len());
    let mut cursors = files
        .iter()
        .map(|f| Cursor::open(dirs.staging, f, buffer))
        .collect::<io::Result<Vec<_>>>()?;
    let mut heap: BinaryHeap<Reverse<(NameFact, usize)>> = BinaryHeap::new();
    for (i, c) in cursors.iter_mut().enumerate() {
        if let Some(fact) = c.next_name(plans, facts)? {
            heap.push(Reverse((fact, i)));
        }
    }
    while let Some(Reverse(((ts, _, tid, comm), i))) = heap.pop() {
        facts.names.add(tid, ts, comm);
        if let Some(fact) = cursors[i].next_name(plans, facts)? {
            heap.push(Reverse((fact, i)));
        }
    }
    Ok(())
}

/// Pass 2: rewrites packets.
struct Expander<'a> {
    plans: &'a Plans,
    names: &'a ThreadNames,
    table: &'a TableNames,
    irqs: &'a names::IrqNames,
    output: &'a Output,
    clock: &'a ClockMapping,
    stats: &'a mut KernelExpansion,
}

impl Expander<'_> {
    fn file(&mut self, dirs: &Dirs, f: &Staged, out: &mut Vec<u8>) -> io::Result<()> {
        let mut input = PacketFile::new(dirs.staging.open_read(&f.name)?, 64 << 10);
        let file = dirs.out.create_file(&f.name)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        // Events of this channel's skipped packets so far: every later
        // packet's running events_discarded includes them.
        let mut lost = 0u64;
        let mut time = Timeline::default();
        while input.next_packet()? {
            self.stats.bytes_in += input.buf.len() as u64;
            let (plans, clock) = (self.plans, self.clock);
            match rewrite::packet(plans, &input.buf, (clock, &mut time), self, out) {
                Some(events) => {
                    self.stats.events += events;
                    self.stats.packets += 1;
                }
                None => {
                    let at = (clock, &mut time);
                    let n = rewrite::skipped(self.stats, f.chan, &input.buf, at, out);
                    lost = lost.saturating_add(n);
                }
            }
            rewrite::add_discarded(out, lost);
            self.stats.bytes_out += out.len() as u64;
            w.write_all(out)?;
        }
        w.flush()
    }

    #[inline]
    fn comm(&mut self, tid: u32, ts: u64, idle: &Comm) -> Comm {
        self.stats.comm_fields += 1;
        if tid == 0 {
            return *idle;
        }
        match self.names.lookup(tid, ts) {
            Name::AtOrBefore(c) => *c,
            Name::Later(c) => {
                self.stats.comm_later += 1;
                *c
            }
            Name::Unknown => match self.table.get(tid) {
                Some(c) => {
                    self.stats.comm_from_table += 1;
                    *c
                }
                None => {
                    self.stats.comm_unknown += 1;
                    [0; COMM_LEN]
                }
            },
        }
    }
}

impl WriteEvent for Expander<'_> {
    fn thread_name(&mut self, tid: u32, ts: u64, idle: &Comm) -> Comm {
        self.comm(tid, ts, idle)
    }

    fn irq_name(&mut self, irq: u32) -> &[u8] {
        let name = self.irqs.get(irq);
        self.stats.irq_names_unknown += name.is_empty() as u64;
        name
    }

    fn syscall_id(&mut self, exit: bool, nr: u64) -> Option<u32> {
        self.output.syscall_id(exit, nr)
    }

    fn stats(&mut self) -> &mut KernelExpansion {
        self.stats
    }
}

/// Removes the staging directory of `root` (best effort: a leftover hidden
/// directory without `metadata` does not disturb CTF readers).
pub fn remove_staging(root: &OutDir) {
    let _ = root.remove_tree(STAGING_DIR);
}
