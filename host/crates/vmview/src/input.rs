//! The two traces read back as the derivation's inputs: the host trace's
//! events merged across its stream files in time order and decoded by
//! name ([`HostDecoder`], [`HostMerge`]), and the guest kernel trace's
//! context switches per CPU, mapped to host time ([`GuestSwitches`]).
//! Only the event classes the traces were written with say what is
//! where; a stream that does not read is dropped with a message, the
//! others go on.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use ivtrace_ctf::host::{STREAM_IVTRACE, STREAM_KERNEL};
use ivtrace_ctf::host_read::{stream_files, Classes, Record, StreamReader};
use ivtrace_ctf::kernel::wire::{
    align_event, event_header, packet_content, Layout, Offsets, PacketFile,
};
use ivtrace_region::classes::{EventClass, FieldType, StreamClasses};
use ivtrace_time::versioned::TscWrite;
use ivtrace_time::ClockMapping;
use ivtrace_tracefs::kvmtsc;

use crate::model::{Comm, GuestSwitch, HostEvent, HostKind, Task};

/// A field's position and type in a payload.
#[derive(Debug, Clone, Copy)]
struct F {
    idx: usize,
    ty: FieldType,
}

fn find(c: &EventClass, name: &str) -> Option<F> {
    c.fields.iter().position(|f| f.name == name).map(|idx| F {
        idx,
        ty: c.fields[idx].ty,
    })
}

/// A payload with its field offsets.
struct Fields<'a> {
    payload: &'a [u8],
    offs: &'a [u32],
}

impl Fields<'_> {
    fn bytes(&self, f: F) -> Option<&[u8]> {
        let (a, b) = (
            *self.offs.get(f.idx)? as usize,
            *self.offs.get(f.idx + 1)? as usize,
        );
        self.payload.get(a..b)
    }

    /// An integer field, sign- or zero-extended.
    fn int(&self, f: F) -> Option<i64> {
        let (bytes, signed) = f.ty.integer()?;
        let b = self.bytes(f)?;
        let mut v = [0u8; 8];
        v.get_mut(..bytes as usize)?
            .copy_from_slice(b.get(..bytes as usize)?);
        let shift = 64 - 8 * bytes;
        let u = u64::from_le_bytes(v);
        Some(if signed && shift > 0 {
            ((u << shift) as i64) >> shift
        } else {
            u as i64
        })
    }

    /// A text field (char[N] or string) as a thread name.
    fn comm(&self, f: F) -> Option<Comm> {
        let b = self.bytes(f)?;
        let text = b.split(|&c| c == 0).next().unwrap_or(&[]);
        let mut c = [0u8; 16];
        let n = text.len().min(15);
        c[..n].copy_from_slice(&text[..n]);
        Some(c)
    }
}

/// How to decode one host class.
#[derive(Debug, Clone)]
enum Kind {
    Switch {
        prev_comm: F,
        prev_tid: F,
        prev_state: F,
        next_comm: F,
        next_tid: F,
    },
    Wakeup {
        tid: F,
        target_cpu: F,
    },
    Migrate {
        tid: F,
        dest_cpu: F,
    },
    Exit {
        vcpu_id: F,
        reason: F,
        isa: Option<F>,
        rip: F,
    },
    Entry {
        vcpu_id: F,
    },
    Hypercall {
        nr: F,
        args: [F; 4],
    },
    Process {
        tid: F,
        pid: F,
        name: F,
    },
}

fn kind_of(c: &EventClass) -> Option<Kind> {
    let g = |n| find(c, n);
    Some(match c.name.as_str() {
        "sched_switch" => Kind::Switch {
            prev_comm: g("prev_comm")?,
            prev_tid: g("prev_tid")?,
            prev_state: g("prev_state")?,
            next_comm: g("next_comm")?,
            next_tid: g("next_tid")?,
        },
        "sched_wakeup" => Kind::Wakeup {
            tid: g("tid")?,
            target_cpu: g("target_cpu")?,
        },
        "sched_migrate_task" => Kind::Migrate {
            tid: g("tid")?,
            dest_cpu: g("dest_cpu")?,
        },
        "kvm_x86_exit" => Kind::Exit {
            vcpu_id: g("vcpu_id")?,
            reason: g("exit_reason")?,
            isa: g("isa"),
            rip: g("guest_rip")?,
        },
        "kvm_x86_entry" => Kind::Entry {
            vcpu_id: g("vcpu_id")?,
        },
        "kvm_x86_hypercall" => Kind::Hypercall {
            nr: g("nr")?,
            args: [g("a0")?, g("a1")?, g("a2")?, g("a3")?],
        },
        "lttng_statedump_process_state" => Kind::Process {
            tid: g("tid")?,
            pid: g("pid")?,
            name: g("name")?,
        },
        _ => return None,
    })
}

/// Host trace records -> [`HostEvent`]s, by the classes' names and fields.
#[derive(Debug, Clone, Default)]
pub struct HostDecoder {
    kinds: HashMap<u32, Kind>,
}

impl HostDecoder {
    pub fn new(classes: &[EventClass]) -> HostDecoder {
        let kinds = classes
            .iter()
            .filter(|c| c.stream == STREAM_KERNEL)
            .filter_map(|c| Some((c.id, kind_of(c)?)))
            .collect();
        HostDecoder { kinds }
    }

    /// The event a record is, None for events the derivation does not use.
    pub fn decode(&self, r: &Record) -> Option<HostEvent> {
        if r.stream_class != STREAM_KERNEL {
            return None;
        }
        let f = Fields {
            payload: &r.payload,
            offs: &r.offsets,
        };
        let kind = match *self.kinds.get(&r.class_id)? {
            Kind::Switch {
                prev_comm,
                prev_tid,
                prev_state,
                next_comm,
                next_tid,
            } => HostKind::Switch {
                prev: Task {
                    tid: f.int(prev_tid)? as i32,
                    comm: f.comm(prev_comm)?,
                },
                prev_state: f.int(prev_state)?,
                next: Task {
                    tid: f.int(next_tid)? as i32,
                    comm: f.comm(next_comm)?,
                },
            },
            Kind::Wakeup { tid, target_cpu } => HostKind::Wakeup {
                tid: f.int(tid)? as i32,
                target_cpu: f.int(target_cpu)? as u32,
            },
            Kind::Migrate { tid, dest_cpu } => HostKind::Migrate {
                tid: f.int(tid)? as i32,
                dest_cpu: f.int(dest_cpu)? as u32,
            },
            Kind::Exit {
                vcpu_id,
                reason,
                isa,
                rip,
            } => HostKind::Exit {
                vcpu_id: f.int(vcpu_id)? as u32,
                reason: f.int(reason)? as u32,
                isa: isa.and_then(|i| f.int(i)).unwrap_or(0) as u32,
                guest_rip: f.int(rip)? as u64,
            },
            Kind::Entry { vcpu_id } => HostKind::Entry {
                vcpu_id: f.int(vcpu_id)? as u32,
            },
            Kind::Hypercall { nr, args } => HostKind::Hypercall {
                nr: f.int(nr)? as u64,
                args: [
                    f.int(args[0])? as u64,
                    f.int(args[1])? as u64,
                    f.int(args[2])? as u64,
                    f.int(args[3])? as u64,
                ],
            },
            Kind::Process { tid, pid, name } => HostKind::Process {
                tid: f.int(tid)? as i32,
                pid: f.int(pid)? as i32,
                name: f.comm(name)?,
            },
        };
        Some(HostEvent {
            ts: r.ts,
            cpu: r.cpu,
            tid: r.tid,
            kind,
        })
    }
}

/// The host trace's kernel-class streams merged in time order (a heap over
/// one reader per stream file).
pub struct HostMerge {
    readers: Vec<StreamReader>,
    heads: Vec<Option<Record>>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    decoder: HostDecoder,
    /// Streams that stopped on a read error, with why.
    pub errors: Vec<String>,
    pub records: u64,
}

impl HostMerge {
    /// Every stream file of `dir` (a host trace written with `classes`).
    pub fn open(dir: &Path, classes: &[EventClass]) -> std::io::Result<HostMerge> {
        let shared = Classes::new(classes);
        let mut m = HostMerge {
            readers: Vec::new(),
            heads: Vec::new(),
            heap: BinaryHeap::new(),
            decoder: HostDecoder::new(classes),
            errors: Vec::new(),
            records: 0,
        };
        for path in stream_files(dir)? {
            m.readers
                .push(StreamReader::open(&path, Arc::clone(&shared))?);
            m.heads.push(None);
            m.refill(m.readers.len() - 1);
        }
        Ok(m)
    }

    fn refill(&mut self, i: usize) {
        match self.readers[i].next_record() {
            Ok(Some(r)) if r.stream_class == STREAM_KERNEL => {
                self.heap.push(Reverse((r.ts, i)));
                self.heads[i] = Some(r);
            }
            Ok(_) => self.heads[i] = None,
            Err(e) => {
                self.errors.push(e.to_string());
                self.heads[i] = None;
            }
        }
    }

    /// The next host event the derivation uses, in time order.
    pub fn next_event(&mut self) -> Option<HostEvent> {
        while let Some(Reverse((_, i))) = self.heap.pop() {
            let r = self.heads[i].take()?;
            self.refill(i);
            self.records += 1;
            if let Some(ev) = self.decoder.decode(&r) {
                return Some(ev);
            }
        }
        None
    }
}

/// Problems met while reading the guest trace, shared by its readers.
pub type Errors = Rc<RefCell<Vec<String>>>;

/// One guest kernel stream file walked event by event, times mapped to
/// host time: [`GuestSwitches`] keeps its context switches (the VM view's
/// attribution), [`GuestWalk::next_event`] every event (the self-check).
pub struct GuestWalk {
    file: PacketFile,
    path: String,
    layouts: Rc<GuestLayouts>,
    clock: ClockMapping,
    /// The current packet's next event offset, content end, last timestamp.
    pos: usize,
    end: usize,
    last_ts: u64,
    cpu: u32,
    errors: Errors,
    done: bool,
}

/// Per class id: is it `sched_switch`, its layout, and (for it) the
/// fields prev_comm, prev_tid, next_comm, next_tid.
type GuestLayouts = HashMap<u32, (bool, Layout, [Option<F>; 4])>;

fn guest_layouts(classes: &StreamClasses) -> GuestLayouts {
    classes
        .iter()
        .map(|c| {
            let layout = Layout::new(c.fields.iter().map(|f| f.ty));
            let names = ["prev_comm", "prev_tid", "next_comm", "next_tid"];
            let fields = names.map(|n| find(c, n));
            let switch = c.name == "sched_switch" && fields.iter().all(Option::is_some);
            (c.id, (switch, layout, fields))
        })
        .collect()
}

/// One guest event: its time on host time (ns), its class, and its
/// fields if it is a context switch.
pub struct GuestEvent {
    pub ts: u64,
    pub class: u32,
    pub switch: Option<GuestSwitch>,
}

impl GuestWalk {
    fn fail(&mut self, what: String) {
        self.errors
            .borrow_mut()
            .push(format!("{}: {what}", self.path));
    }

    /// The guest CPU this file is (from its first packet).
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    /// The next packet; false at the end (or on an error, noted).
    fn load_packet(&mut self) -> bool {
        match self.file.next_packet() {
            Ok(true) => match packet_content(&self.file.buf) {
                Some((h, content)) => {
                    self.pos = ivtrace_region::abi::PACKET_HDR_SIZE;
                    self.end = content;
                    self.last_ts = h.timestamp_begin;
                    self.cpu = h.cpu_id;
                    true
                }
                None => {
                    self.fail("a packet whose sizes do not add up".into());
                    false
                }
            },
            Ok(false) => false,
            Err(e) => {
                self.fail(e.to_string());
                false
            }
        }
    }

    /// Steps over one event (Err: the rest of the packet cannot be read).
    fn step(&mut self) -> Result<GuestEvent, String> {
        let content = &self.file.buf[..self.end];
        let h = event_header(content, self.pos, self.last_ts)
            .ok_or("an event header past the content")?;
        let (switch, layout, fields) = self
            .layouts
            .get(&h.id)
            .ok_or(format!("unknown event id {}", h.id))?;
        let payload = &content[self.pos + h.len..];
        let mut scratch: Offsets = [0; 33];
        let offs = layout
            .offsets(payload, &mut scratch)
            .ok_or("a payload past the content")?;
        let len = *offs.last().expect("end offset") as usize;
        self.last_ts = h.ts;
        self.pos = align_event(self.pos + h.len + len);
        let ts = self.clock.realtime_ns(h.ts).clamp(0, u64::MAX as i128) as u64;
        if !switch {
            return Ok(GuestEvent {
                ts,
                class: h.id,
                switch: None,
            });
        }
        let f = Fields { payload, offs };
        let [pc, pt, nc, nt] = fields.map(|x| x.expect("a switch has its fields"));
        let switch = GuestSwitch {
            ts,
            cpu: self.cpu,
            prev_tid: f.int(pt).ok_or("prev_tid")? as i32,
            prev_comm: f.comm(pc).ok_or("prev_comm")?,
            next_tid: f.int(nt).ok_or("next_tid")? as i32,
            next_comm: f.comm(nc).ok_or("next_comm")?,
        };
        Ok(GuestEvent {
            ts,
            class: h.id,
            switch: Some(switch),
        })
    }

    /// The next event, None at the end of the file.
    pub fn next_event(&mut self) -> Option<GuestEvent> {
        while !self.done {
            if self.pos >= self.end {
                self.done = !self.load_packet();
                continue;
            }
            match self.step() {
                Ok(e) => return Some(e),
                Err(what) => {
                    self.fail(what);
                    self.pos = self.end;
                }
            }
        }
        None
    }
}

/// A guest kernel stream file's `sched_switch` events, on host time.
pub struct GuestSwitches(GuestWalk);

impl Iterator for GuestSwitches {
    type Item = GuestSwitch;

    fn next(&mut self) -> Option<GuestSwitch> {
        while let Some(e) = self.0.next_event() {
            if let Some(s) = e.switch {
                return Some(s);
            }
        }
        None
    }
}

/// Every guest kernel stream file of `kernel_dir` (the expanded kernel
/// trace, written with `classes`), each with the CPU its first packet
/// says, times mapped to host time with `clock`.
pub fn guest_walks(
    kernel_dir: &Path,
    classes: &StreamClasses,
    clock: &ClockMapping,
    errors: &Errors,
) -> std::io::Result<Vec<(u32, GuestWalk)>> {
    let layouts = Rc::new(guest_layouts(classes));
    let mut out = Vec::new();
    for path in stream_files(kernel_dir)? {
        let mut g = GuestWalk {
            file: PacketFile::open(&path)?,
            path: path.display().to_string(),
            layouts: Rc::clone(&layouts),
            clock: clock.clone(),
            pos: 0,
            end: 0,
            last_ts: 0,
            cpu: 0,
            errors: Rc::clone(errors),
            done: false,
        };
        // The first packet says which CPU the file is.
        if g.load_packet() {
            out.push((g.cpu, g));
        }
    }
    Ok(out)
}

/// The context switches of every guest CPU in `kernel_dir`, each CPU's in
/// time order, their times mapped to host time with `clock`.
pub fn guest_switches(
    kernel_dir: &Path,
    classes: &StreamClasses,
    clock: &ClockMapping,
    errors: &Errors,
) -> std::io::Result<Vec<(u32, GuestSwitches)>> {
    let walks = guest_walks(kernel_dir, classes, clock, errors)?;
    Ok(walks
        .into_iter()
        .map(|(cpu, w)| (cpu, GuestSwitches(w)))
        .collect())
}

/// The events named `name` of stream class `stream` in a host trace:
/// each one's host ns and its integer fields `fields` (0 for a field it
/// lacks or cannot hold), in file order.
fn host_records(
    dir: &Path,
    classes: &[EventClass],
    stream: u32,
    name: &str,
    fields: &[&str],
) -> std::io::Result<Vec<(u64, Vec<i64>)>> {
    let Some(class) = classes
        .iter()
        .find(|c| c.stream == stream && c.name == name)
    else {
        return Ok(Vec::new());
    };
    let wanted: Vec<Option<F>> = fields.iter().map(|f| find(class, f)).collect();
    let shared = Classes::new(classes);
    let mut out = Vec::new();
    for path in stream_files(dir)? {
        let mut r = StreamReader::open(&path, Arc::clone(&shared))?;
        while let Ok(Some(rec)) = r.next_record() {
            if rec.stream_class != stream || rec.class_id != class.id {
                continue;
            }
            let f = Fields {
                payload: &rec.payload,
                offs: &rec.offsets,
            };
            let values = wanted.iter().map(|w| w.and_then(|w| f.int(w)).unwrap_or(0));
            out.push((rec.ts, values.collect()));
        }
    }
    Ok(out)
}

/// serve's doorbell receptions in a host trace (`ivtrace_doorbell_received`:
/// host ns, doorbells the eventfd counted), in file order.
pub fn doorbells_received(dir: &Path, classes: &[EventClass]) -> std::io::Result<Vec<(u64, u64)>> {
    let recs = host_records(
        dir,
        classes,
        STREAM_IVTRACE,
        "ivtrace_doorbell_received",
        &["count"],
    )?;
    Ok(recs.into_iter().map(|(ts, v)| (ts, v[0] as u64)).collect())
}

/// KVM's changes of a vCPU's TSC offset in a host trace
/// (`kvm_write_tsc_offset`), in file order: the versions of the guest's
/// clock mapping ([`ivtrace_time::versioned`]).
pub fn tsc_writes(dir: &Path, classes: &[EventClass]) -> std::io::Result<Vec<TscWrite>> {
    let fields = ["vcpu_id", "previous_tsc_offset", "next_tsc_offset"];
    let recs = host_records(dir, classes, STREAM_KERNEL, kvmtsc::EVENT, &fields)?;
    let mut out: Vec<TscWrite> = recs
        .into_iter()
        .filter_map(|(ts, v)| {
            Some(TscWrite {
                host_ns: ts,
                vcpu: u32::try_from(v[0]).ok()?,
                previous: v[1] as u64,
                next: v[2] as u64,
            })
        })
        .collect();
    // Per-CPU files: one time order across them.
    out.sort_by_key(|w| w.host_ns);
    Ok(out)
}
