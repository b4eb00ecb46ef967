//! The two traces read back as the derivation's inputs, through
//! ivtrace-ctf's [`read`](ivtrace_ctf::read): the host trace's events
//! merged across its stream files in time order and decoded by name
//! ([`HostDecoder`], [`HostMerge`]), and the guest kernel trace's context
//! switches per CPU, mapped to host time ([`GuestSwitches`]). Only the
//! event classes the traces were written with say what is where; a stream
//! that does not read is dropped with a message, the others go on.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use ivtrace_ctf::host_trace::{STREAM_IVTRACE, STREAM_KERNEL};
use ivtrace_ctf::read::{
    stream_class_of, stream_files, Classes, Clock, Item, Merge, Packets, Record, StreamDecl,
    StreamReader, Trace,
};
use ivtrace_region::abi::IVT_STREAM_KERNEL;
use ivtrace_region::classes::{EventClass, StreamClasses};
use ivtrace_time::versioned::TscWrite;
use ivtrace_tracefs::kvmtsc;

use crate::model::{Comm, GuestSwitch, HostEvent, HostKind, Task};

/// A field's position in a payload.
type F = usize;

fn find(c: &EventClass, name: &str) -> Option<F> {
    c.fields.iter().position(|f| f.name == name)
}

/// A text field (char[N] or string) as a thread name.
fn comm(r: &Record, f: F) -> Option<Comm> {
    let text = r.text(f)?;
    let mut c = [0u8; 16];
    let n = text.len().min(15);
    c[..n].copy_from_slice(&text[..n]);
    Some(c)
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
        if r.class.stream != STREAM_KERNEL {
            return None;
        }
        let int = |f: F| r.int(f);
        let kind = match *self.kinds.get(&r.class_id())? {
            Kind::Switch {
                prev_comm,
                prev_tid,
                prev_state,
                next_comm,
                next_tid,
            } => HostKind::Switch {
                prev: Task {
                    tid: int(prev_tid)? as i32,
                    comm: comm(r, prev_comm)?,
                },
                prev_state: int(prev_state)?,
                next: Task {
                    tid: int(next_tid)? as i32,
                    comm: comm(r, next_comm)?,
                },
            },
            Kind::Wakeup { tid, target_cpu } => HostKind::Wakeup {
                tid: int(tid)? as i32,
                target_cpu: int(target_cpu)? as u32,
            },
            Kind::Migrate { tid, dest_cpu } => HostKind::Migrate {
                tid: int(tid)? as i32,
                dest_cpu: int(dest_cpu)? as u32,
            },
            Kind::Exit {
                vcpu_id,
                reason,
                isa,
                rip,
            } => HostKind::Exit {
                vcpu_id: int(vcpu_id)? as u32,
                reason: int(reason)? as u32,
                isa: isa.and_then(int).unwrap_or(0) as u32,
                guest_rip: int(rip)? as u64,
            },
            Kind::Entry { vcpu_id } => HostKind::Entry {
                vcpu_id: int(vcpu_id)? as u32,
            },
            Kind::Hypercall { nr, args } => HostKind::Hypercall {
                nr: int(nr)? as u64,
                args: [
                    int(args[0])? as u64,
                    int(args[1])? as u64,
                    int(args[2])? as u64,
                    int(args[3])? as u64,
                ],
            },
            Kind::Process { tid, pid, name } => HostKind::Process {
                tid: int(tid)? as i32,
                pid: int(pid)? as i32,
                name: comm(r, name)?,
            },
        };
        Some(HostEvent {
            ts: r.ts,
            cpu: r.cpu(),
            tid: r.tid.unwrap_or(0),
            kind,
        })
    }
}

/// The host trace's kernel-class streams merged in time order.
pub struct HostMerge {
    merge: Merge,
    decoder: HostDecoder,
    pub records: u64,
}

impl HostMerge {
    /// Every stream file of `dir` (a host trace written with `classes`).
    pub fn open(dir: &Path, classes: &[EventClass]) -> std::io::Result<HostMerge> {
        let shared = Classes::new(classes);
        let clock = Arc::new(Clock::default());
        let mut merge = Merge::default();
        for path in stream_files(dir)? {
            // Host kernel events have a `_tid` context, serve's own do not.
            let Some(id) = stream_class_of(&path)? else {
                continue;
            };
            let decl = StreamDecl {
                id,
                packets: Packets::Host,
                tid_context: id == STREAM_KERNEL,
            };
            let reader = StreamReader::open(&path, decl, Arc::clone(&shared))?;
            merge.add(reader, Arc::clone(&clock), 0);
        }
        Ok(HostMerge {
            merge,
            decoder: HostDecoder::new(classes),
            records: 0,
        })
    }

    /// Streams that stopped on a read error, with why.
    pub fn errors(&self) -> Vec<String> {
        self.merge.errors.clone()
    }

    /// The next host event the derivation uses, in time order.
    pub fn next_event(&mut self) -> Option<HostEvent> {
        for m in self.merge.by_ref() {
            let Item::Event(r) = m.item else { continue };
            if r.class.stream != STREAM_KERNEL {
                continue;
            }
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

/// One guest kernel stream file's `sched_switch` events, on host time.
pub struct GuestSwitches {
    reader: StreamReader,
    /// Per class id: its prev_comm, prev_tid, next_comm, next_tid fields
    /// (`sched_switch` classes only).
    switches: Rc<HashMap<u32, [F; 4]>>,
    /// The kernel trace's clock, as its metadata declares it.
    clock: Clock,
    errors: Errors,
    /// The first event, read to learn the file's CPU.
    first: Option<Record>,
    done: bool,
}

fn switch_fields(classes: &StreamClasses) -> HashMap<u32, [F; 4]> {
    classes
        .iter()
        .filter(|c| c.name == "sched_switch")
        .filter_map(|c| {
            let names = ["prev_comm", "prev_tid", "next_comm", "next_tid"];
            let [a, b, d, e] = names.map(|n| find(c, n));
            Some((c.id, [a?, b?, d?, e?]))
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

impl GuestSwitches {
    fn fail(&mut self, what: String) {
        self.errors.borrow_mut().push(what);
        self.done = true;
    }

    /// The next event of the file, whatever its class (the self-check
    /// reads them all), None at its end or on an error (noted).
    pub fn next_event(&mut self) -> Option<GuestEvent> {
        if self.done {
            return None;
        }
        let r = match self.first.take() {
            Some(r) => r,
            None => match self.reader.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => return None,
                Err(e) => {
                    self.fail(e.to_string());
                    return None;
                }
            },
        };
        Some(GuestEvent {
            ts: self.clock.ns_from_origin(r.ts).clamp(0, u64::MAX as i128) as u64,
            class: r.class_id(),
            switch: self.switch(&r),
        })
    }

    fn switch(&self, r: &Record) -> Option<GuestSwitch> {
        let [pc, pt, nc, nt] = *self.switches.get(&r.class_id())?;
        let ts = self.clock.ns_from_origin(r.ts).clamp(0, u64::MAX as i128) as u64;
        Some(GuestSwitch {
            ts,
            cpu: r.cpu(),
            prev_tid: r.int(pt)? as i32,
            prev_comm: comm(r, pc)?,
            next_tid: r.int(nt)? as i32,
            next_comm: comm(r, nc)?,
        })
    }
}

impl Iterator for GuestSwitches {
    type Item = GuestSwitch;

    fn next(&mut self) -> Option<GuestSwitch> {
        while let Some(e) = self.next_event() {
            if let Some(s) = e.switch {
                return Some(s);
            }
        }
        None
    }
}

/// The context switches of every guest CPU in `kernel_dir` (the expanded
/// kernel trace, written with `classes`), each CPU's in time order, their
/// times on host time through the trace's own clock (its metadata: the
/// final mapping, in nanoseconds since the epoch). Only the native probes'
/// streams (stream class 0) are read; the relayed ftrace streams beside
/// them are not.
pub fn guest_switches(
    kernel_dir: &Path,
    classes: &StreamClasses,
    errors: &Errors,
) -> std::io::Result<Vec<(u32, GuestSwitches)>> {
    let clock = Trace::open(kernel_dir)?.clock().clone();
    let shared = Classes::new(&classes.iter().cloned().collect::<Vec<_>>());
    let switches = Rc::new(switch_fields(classes));
    let decl = StreamDecl {
        id: IVT_STREAM_KERNEL,
        packets: Packets::Guest,
        tid_context: false,
    };
    let mut out = Vec::new();
    for path in stream_files(kernel_dir)? {
        if stream_class_of(&path)? != Some(IVT_STREAM_KERNEL) {
            continue;
        }
        let mut reader = StreamReader::open(&path, decl, Arc::clone(&shared))?;
        // The first event says which CPU the file is.
        let first = match reader.next_record() {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                errors.borrow_mut().push(e.to_string());
                continue;
            }
        };
        let g = GuestSwitches {
            reader,
            switches: Rc::clone(&switches),
            clock: clock.clone(),
            errors: Rc::clone(errors),
            done: false,
            first: None,
        };
        out.push((
            first.cpu(),
            GuestSwitches {
                first: Some(first),
                ..g
            },
        ));
    }
    Ok(out)
}

/// The events named `name` of stream class `stream` in a host trace
/// (written with `classes`): each one's host ns and its integer fields
/// `fields` (0 for a field it lacks), in file order.
fn host_records(
    dir: &Path,
    classes: &[EventClass],
    stream: u32,
    name: &str,
    fields: &[&str],
) -> std::io::Result<Vec<(u64, Vec<i64>)>> {
    if !classes.iter().any(|c| c.stream == stream && c.name == name) {
        return Ok(Vec::new());
    }
    let shared = Classes::new(classes);
    let mut out = Vec::new();
    for path in stream_files(dir)? {
        if stream_class_of(&path)? != Some(stream) {
            continue;
        }
        let decl = StreamDecl {
            id: stream,
            packets: Packets::Host,
            tid_context: stream == STREAM_KERNEL,
        };
        let mut r = StreamReader::open(&path, decl, Arc::clone(&shared))?;
        while let Ok(Some(rec)) = r.next_record() {
            if rec.class.name != name {
                continue;
            }
            let values = fields.iter().map(|f| rec.int_named(f).unwrap_or(0));
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
/// (`kvm_write_tsc_offset`), in time order: the versions of the guest's
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

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_ctf::host_trace::{HostTrace, HostTraceDesc, Payload, STREAM_IVTRACE};
    use ivtrace_region::classes::{Field, FieldType};

    #[test]
    fn every_host_stream_reads_with_its_own_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let classes = vec![
            EventClass::new(
                0,
                STREAM_IVTRACE,
                "mark".into(),
                vec![Field::new("n", FieldType::U64, false)],
            ),
            EventClass::new(
                100,
                STREAM_KERNEL,
                "sched_wakeup".into(),
                vec![
                    Field::new("comm", FieldType::Chars(16), false),
                    Field::new("tid", FieldType::S32, false),
                    Field::new("prio", FieldType::S32, false),
                    Field::new("target_cpu", FieldType::S32, false),
                ],
            ),
        ];
        let desc = HostTraceDesc {
            hostname: "h",
            trace_name: "t",
            error_ns: 1,
            env: vec![],
        };
        let root = ivtrace_ctf::OutDir::root(tmp.path(), &Default::default()).unwrap();
        let mut t = HostTrace::create(&root, "host", &desc, classes.clone()).unwrap();
        let own = t.add_stream(STREAM_IVTRACE, 0, "ivtrace_host").unwrap();
        let cpu = t.add_stream(STREAM_KERNEL, 1, "host_cpu1").unwrap();
        t.event(own, 0, 5, 0, &Payload::default().u64(1).0).unwrap();
        let mut p = b"CPU 0/TCG".to_vec();
        p.resize(16, 0);
        let p = Payload(p).i32(77).i32(120).i32(1).0;
        t.event(cpu, 100, 7, 77, &p).unwrap();
        t.finish().unwrap();
        let mut m = HostMerge::open(&tmp.path().join("host"), &classes).unwrap();
        let ev = m.next_event().unwrap();
        assert_eq!((ev.ts, ev.cpu, ev.tid), (7, 1, 77));
        assert!(m.next_event().is_none());
        assert!(m.errors().is_empty(), "{:?}", m.errors());
    }
}
