//! The kernel expansion on synthetic kernel wire packets (ring's Rust
//! model of the writer), drained by the real reader into the real writer.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use ivtrace_region::abi;
use ivtrace_region::bytes::{int_at, le_u32, le_u64, put_u64, uint_at};
use ivtrace_region::classes::{EventClasses, FieldType, StreamClasses};
use ivtrace_region::names::NameTable;
use ivtrace_region::region::{Access, Region};
use ivtrace_region::{PacketSink, Reader};
use ivtrace_testutil::{have_tool, RegionBuilder, TestRegion, LTTNG_SCHED_SWITCH_FIELDS};

use super::names::ThreadNamesBuilder;
use super::wire::{align_event, event_header, packet_content, Layout, Offsets, PacketFile};
use super::{expand_with, Staged};
use crate::tsdl::TraceEnv;
use crate::CtfWriter;
use ivtrace_time::ClockMapping;

// Kernel event ids (docs/abi.md, "Kernel stream").
const SWITCH: u32 = 0;
const WAKEUP: u32 = 1;
const IRQ_ENTRY: u32 = 2;
const SYS_ENTRY: u32 = 12;
const SYS_EXIT: u32 = 13;
const FORK: u32 = 16;
const EXEC: u32 = 17;
const RENAME: u32 = 20;
const DUMP_PROCESS: u32 = 23;
const DUMP_IRQ: u32 = 24;
/// The first id after the module's own events (the kernel API's first).
const FREE: u32 = ivtrace_testutil::KERNEL_EVENTS.len() as u32;

fn comm16(name: &[u8]) -> [u8; 16] {
    let mut c = [0u8; 16];
    let n = name.len().min(16);
    c[..n].copy_from_slice(&name[..n]);
    c
}

fn switch(prev: u32, state: u16, next: u32) -> Vec<u8> {
    let mut p = prev.to_le_bytes().to_vec();
    p.push(20);
    p.extend_from_slice(&state.to_le_bytes());
    p.extend_from_slice(&next.to_le_bytes());
    p.push(20);
    p
}

fn wakeup(tid: u32, cpu: u16) -> Vec<u8> {
    let mut p = tid.to_le_bytes().to_vec();
    p.push(20);
    p.extend_from_slice(&cpu.to_le_bytes());
    p
}

/// The initial pid namespace's inode number (Linux's PROC_PID_INIT_INO).
const INIT_PID_NS: u32 = 0xEFFF_FFFC;

fn fork(parent: u32, child: u32, name: &[u8]) -> Vec<u8> {
    let mut p = parent.to_le_bytes().to_vec();
    p.extend_from_slice(&parent.to_le_bytes());
    p.extend_from_slice(&INIT_PID_NS.to_le_bytes());
    p.extend_from_slice(&comm16(name));
    p.extend_from_slice(&child.to_le_bytes());
    bytes_field(&mut p, &child.to_le_bytes()); // vtids: one level
    p.extend_from_slice(&child.to_le_bytes());
    p.extend_from_slice(&INIT_PID_NS.to_le_bytes());
    p
}

fn exec(tid: u32, file: &str, name: &[u8]) -> Vec<u8> {
    let mut p = file.as_bytes().to_vec();
    p.push(0);
    p.extend_from_slice(&tid.to_le_bytes());
    p.extend_from_slice(&tid.to_le_bytes());
    p.extend_from_slice(&comm16(name));
    p
}

fn rename(tid: u32, name: &[u8]) -> Vec<u8> {
    let mut p = tid.to_le_bytes().to_vec();
    p.extend_from_slice(&comm16(name));
    p
}

fn dump_process(tid: u32, name: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [tid, tid, tid, tid, 1, 1] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p.extend_from_slice(&comm16(name));
    for v in [0u32, 0, 0, 5, 0, INIT_PID_NS, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

fn dump_irq(irq: u32, chip: &str, action: &[u8]) -> Vec<u8> {
    let mut p = irq.to_le_bytes().to_vec();
    p.extend_from_slice(chip.as_bytes());
    p.push(0);
    p.extend_from_slice(action);
    p.push(0);
    p
}

/// A wire BYTES field: u32 length, then the bytes.
fn bytes_field(p: &mut Vec<u8>, b: &[u8]) {
    p.extend_from_slice(&(b.len() as u32).to_le_bytes());
    p.extend_from_slice(b);
}

/// A syscall_entry as the module writes it: `args` (as many as the call
/// has), then its user strings, each with its NUL.
fn sys_entry_with(nr: u16, args: &[u64], strings: &[&str]) -> Vec<u8> {
    let mut p = nr.to_le_bytes().to_vec();
    let a: Vec<u8> = args.iter().flat_map(|a| a.to_le_bytes()).collect();
    bytes_field(&mut p, &a);
    let mut st = Vec::new();
    for s in strings {
        st.extend_from_slice(s.as_bytes());
        st.push(0);
    }
    bytes_field(&mut p, &st);
    p
}

/// A syscall_entry whose arguments are `a0, 1, 2, ...` (the table's count;
/// six for numbers it does not know), its user strings `"s<arg>"`.
fn sys_entry(nr: u16, a0: u64) -> Vec<u8> {
    let row = super::syscalls::get(nr as u64);
    let n = row.map_or(6, |s| s.nargs as u64);
    let args: Vec<u64> = (0..n).map(|i| if i == 0 { a0 } else { i }).collect();
    let mask = row.map_or(0, |s| s.str_mask);
    let strings: Vec<String> = (0..n)
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| format!("s{i}"))
        .collect();
    let strings: Vec<&str> = strings.iter().map(String::as_str).collect();
    sys_entry_with(nr, &args, &strings)
}

fn sys_exit_with(nr: u16, ret: i64, out_args: &[u64], data: &[u8]) -> Vec<u8> {
    let mut p = nr.to_le_bytes().to_vec();
    p.extend_from_slice(&ret.to_le_bytes());
    let a: Vec<u8> = out_args.iter().flat_map(|a| a.to_le_bytes()).collect();
    bytes_field(&mut p, &a);
    bytes_field(&mut p, data);
    p
}

/// A syscall_exit with the table's out-arguments (each 0x1000 + its index).
fn sys_exit(nr: u16, ret: i64) -> Vec<u8> {
    let mask = super::syscalls::get(nr as u64).map_or(0, |s| s.out_mask);
    let out: Vec<u64> = (0..6)
        .filter(|i| mask & (1 << i) != 0)
        .map(|i| 0x1000 + i)
        .collect();
    sys_exit_with(nr, ret, &out, &[])
}

/// A region with `cpus` kernel channels and the module's events.
fn kernel_region(cpus: u32) -> TestRegion {
    let mut r = RegionBuilder::new(cpus + 1, 4, 4096)
        .kernel(cpus)
        .build_region();
    r.register_kernel_events();
    r
}

#[derive(Debug, Clone, PartialEq)]
enum Val {
    Int(i128),
    Text(String),
}

impl Val {
    fn text(&self) -> &str {
        match self {
            Val::Text(s) => s,
            v => panic!("{v:?} is not text"),
        }
    }
    fn int(&self) -> i128 {
        match self {
            Val::Int(i) => *i,
            v => panic!("{v:?} is not an integer"),
        }
    }
}

#[derive(Debug)]
struct Ev {
    chan: u32,
    ts: u64,
    name: String,
    f: BTreeMap<String, Val>,
    /// The raw bytes of `char[N]` fields.
    raw: BTreeMap<String, Vec<u8>>,
}

/// Decodes every event of an expanded kernel stream file with `classes`
/// (an independent walk: only the output classes say what is where).
fn decode_file(path: &Path, chan: u32, classes: &StreamClasses, out: &mut Vec<Ev>) {
    let mut file = PacketFile::open(path).unwrap();
    while file.next_packet().unwrap() {
        let (h, content) = packet_content(&file.buf).expect("a sane packet");
        assert_eq!(file.buf.len() % 8, 0);
        let c = &file.buf[..content];
        let (mut off, mut last) = (abi::PACKET_HDR_SIZE, h.timestamp_begin);
        let mut n = 0;
        while off < c.len() {
            assert_eq!(off % 4, 0);
            let eh = event_header(c, off, last).expect("event header");
            let class = classes.get(eh.id).expect("declared id");
            let layout = Layout::new(class.fields.iter().map(|f| f.ty));
            let mut scratch: Offsets = [0; 33];
            let p = &c[off + eh.len..];
            let offs = layout.offsets(p, &mut scratch).expect("payload walks");
            let mut f = BTreeMap::new();
            let mut raw = BTreeMap::new();
            for (i, fd) in class.fields.iter().enumerate() {
                let b = &p[offs[i] as usize..offs[i + 1] as usize];
                let v = match fd.ty {
                    FieldType::Chars(_) | FieldType::String => {
                        let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
                        if let FieldType::Chars(_) = fd.ty {
                            raw.insert(fd.name.clone(), b.to_vec());
                        }
                        Val::Text(std::str::from_utf8(&b[..end]).expect("UTF-8").into())
                    }
                    FieldType::Bytes => Val::Int(b.len() as i128),
                    FieldType::U32Array(n) => {
                        raw.insert(fd.name.clone(), b.to_vec());
                        Val::Int(n as i128)
                    }
                    FieldType::S32SeqU8 => {
                        raw.insert(fd.name.clone(), b[1..].to_vec());
                        Val::Int(b[0] as i128)
                    }
                    FieldType::TextSeqU64 => {
                        Val::Text(std::str::from_utf8(&b[8..]).expect("UTF-8").into())
                    }
                    t => {
                        let (bytes, signed) = t.integer().unwrap();
                        assert_eq!(b.len(), bytes as usize, "{} is {t:?}", fd.name);
                        Val::Int(if signed {
                            int_at(b, 0, b.len()).unwrap() as i128
                        } else {
                            uint_at(b, 0, b.len()).unwrap() as i128
                        })
                    }
                };
                f.insert(fd.name.clone(), v);
            }
            out.push(Ev {
                chan,
                ts: eh.ts,
                name: class.name.clone(),
                f,
                raw,
            });
            n += 1;
            last = eh.ts;
            off = align_event(off + eh.len + offs[offs.len() - 1] as usize);
        }
        assert_eq!(n, h.event_count as u64, "event_count");
        assert!(last <= h.timestamp_end);
    }
}

struct Out {
    dir: tempfile::TempDir,
    writer: CtfWriter,
    classes: StreamClasses,
    events: Vec<Ev>,
}

pub(crate) fn clock() -> ClockMapping {
    ClockMapping {
        freq_hz: 1_000_000_000,
        ref_ticks: 0,
        ref_realtime_ns: 1_700_000_000_000_000_000,
        error_ns: 1,
        method: "test".into(),
        coarse: true,
        samples: 1,
    }
}

/// Drains `r` like `ivtrace record` (complete packets, then the committed
/// prefixes), expands, decodes the kernel trace (sorted by time).
fn record(r: &TestRegion) -> Out {
    let mut out = record_with(r, clock());
    // The output counts nanoseconds since the epoch; at 1 GHz from tick 0
    // they are the ticks the tests emitted, plus the reference date.
    for e in &mut out.events {
        e.ts =
            e.ts.checked_sub(clock().ref_realtime_ns)
                .expect("not before the reference");
    }
    out
}

/// [`record`] with `clock` as the final mapping; times as written (ns).
fn record_with(r: &TestRegion, clock: ClockMapping) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
    let cpus = region.layout().nr_kernel_channels;
    let mut writer = writer_with(dir.path(), &region, clock);
    let mut reader = Reader::new(region, ivtrace_region::packet::TickRange::ALL);
    reader.drain_available(&mut writer).unwrap();
    reader.flush_partial(&mut writer).unwrap();
    reader.finish(&mut writer).unwrap();
    if let Some(t) = ivtrace_region::names::read_thread_names(reader.region()) {
        writer.set_thread_name_table(t);
    }
    finish_as_made(&mut writer, reader.classes());
    assert!(
        !dir.path().join(super::STAGING_DIR).exists(),
        "staging removed"
    );
    let classes = writer.output_classes(0, reader.classes()).clone();
    let mut events = Vec::new();
    for c in 0..cpus {
        let p = dir.path().join(format!("kernel/kernel_chan{c}"));
        if p.exists() {
            decode_file(&p, c, &classes, &mut events);
        }
    }
    events.sort_by_key(|e| (e.ts, e.chan));
    Out {
        dir,
        writer,
        classes,
        events,
    }
}

fn named<'a>(out: &'a Out, name: &str) -> Vec<&'a Ev> {
    out.events.iter().filter(|e| e.name == name).collect()
}

/// The scenario of the "real guest" issue, on two CPUs: the child's fork
/// is on CPU 1, in a packet the host only gets at the end (left open),
/// while CPU 0's switches to it (before and after the fork) are complete
/// packets drained first; then exec and task_rename rename it.
fn fork_exec_rename_region() -> TestRegion {
    let mut r = kernel_region(2);
    // CPU 1: state dump, fork, exec, rename; its packet stays open.
    r.emit(1, 10, DUMP_PROCESS, &dump_process(7, b"init"));
    r.emit(1, 100, FORK, &fork(7, 42, b"kid"));
    r.emit(1, 120, WAKEUP, &wakeup(42, 0));
    r.emit(1, 300, EXEC, &exec(42, "/bin/worker", b"worker"));
    r.emit(1, 400, RENAME, &rename(42, b"renamed"));
    r.emit(1, 420, SWITCH, &switch(0, 0, 99));
    // CPU 0: switches to the child before and after each renaming.
    r.emit(0, 50, SWITCH, &switch(0, 0, 42));
    r.emit(0, 60, SWITCH, &switch(42, 1, 0));
    r.emit(0, 200, SWITCH, &switch(0, 0, 42));
    r.emit(0, 250, SWITCH, &switch(42, 0, 0));
    r.emit(0, 350, SWITCH, &switch(0, 0, 42));
    r.emit(0, 410, SWITCH, &switch(42, 0, 0));
    r.close(0);
    r.close_region();
    r
}

#[test]
fn names_are_those_at_the_event_time_whatever_the_drain_order() {
    let out = record(&fork_exec_rename_region());
    let sw: Vec<(u64, &str, &str)> = named(&out, "sched_switch")
        .iter()
        .map(|e| (e.ts, e.f["prev_comm"].text(), e.f["next_comm"].text()))
        .collect();
    assert_eq!(
        sw,
        [
            (50, "swapper/0", "kid"), // before the fork: its earliest later name
            (60, "kid", "swapper/0"),
            (200, "swapper/0", "kid"),
            (250, "kid", "swapper/0"),
            (350, "swapper/0", "worker"),  // after exec
            (410, "renamed", "swapper/0"), // after task_rename
            (420, "swapper/1", ""),        // tid 99 is never named: empty
        ]
    );
    let f = named(&out, "sched_process_fork")[0];
    assert_eq!(f.f["parent_comm"].text(), "init");
    assert_eq!(f.f["child_comm"].text(), "kid");
    assert_eq!(f.f["parent_tid"].int(), 7);
    assert_eq!(named(&out, "sched_wakeup")[0].f["comm"].text(), "kid");
    // Every wire field keeps its value next to the inserted one.
    let s = named(&out, "sched_switch")[1];
    assert_eq!(
        (
            s.f["prev_tid"].int(),
            s.f["prev_state"].int(),
            s.f["next_prio"].int()
        ),
        (42, 1, 20)
    );
    let stats = out.writer.kernel_expansion().unwrap();
    // before the fork: the switches at 50 and 60
    assert_eq!((stats.comm_later, stats.comm_unknown), (2, 1));
    assert_eq!(stats.events, out.events.len() as u64);
    assert_eq!(stats.threads, 2);
}

#[test]
fn switch_fields_are_in_lttng_order() {
    let out = record(&fork_exec_rename_region());
    let fields = |id| -> Vec<&str> {
        let c = out.classes.get(id).unwrap();
        c.fields.iter().map(|f| f.name.as_str()).collect()
    };
    assert_eq!(fields(SWITCH), LTTNG_SCHED_SWITCH_FIELDS);
    assert_eq!(
        fields(FORK),
        [
            "parent_comm",
            "parent_tid",
            "parent_pid",
            "parent_ns_inum",
            "child_comm",
            "child_tid",
            "vtids",
            "child_pid",
            "child_ns_inum"
        ]
    );
    // Types as LTTng 2.10 declares them, the wire's narrower ones widened.
    let ty = |id, name: &str| {
        let c = out.classes.get(id).unwrap();
        c.fields.iter().find(|f| f.name == name).unwrap().ty
    };
    assert_eq!(ty(SWITCH, "prev_tid"), FieldType::S32);
    assert_eq!(ty(SWITCH, "prev_prio"), FieldType::S32);
    assert_eq!(ty(SWITCH, "prev_state"), FieldType::S64);
    assert_eq!(ty(WAKEUP, "target_cpu"), FieldType::S32);
    assert_eq!(ty(FORK, "vtids"), FieldType::S32SeqU8);
    // LTTng's exec has no comm (the wire's is for naming only)
    let exec = out.classes.get(EXEC).unwrap();
    let names: Vec<&str> = exec.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["filename", "tid", "old_tid"]);
}

#[test]
fn irq_names_come_from_the_interrupt_state_dump() {
    let mut r = kernel_region(2);
    r.emit(0, 10, DUMP_IRQ, &dump_irq(11, "IO-APIC", b"virtio0"));
    r.emit(0, 11, DUMP_IRQ, &dump_irq(11, "IO-APIC", b"ehci_hcd:usb1"));
    r.emit(1, 5, IRQ_ENTRY, &11u32.to_le_bytes()); // before the dump, other CPU
    r.emit(1, 20, IRQ_ENTRY, &4u32.to_le_bytes()); // never named
    r.close(0);
    r.close(1);
    r.close_region();
    let out = record(&r);
    let irqs: Vec<(i128, &str)> = named(&out, "irq_handler_entry")
        .iter()
        .map(|e| (e.f["irq"].int(), e.f["name"].text()))
        .collect();
    assert_eq!(irqs, [(11, "virtio0,ehci_hcd:usb1"), (4, "")]);
    let stats = out.writer.kernel_expansion().unwrap();
    assert_eq!((stats.irqs_named, stats.irq_names_unknown), (1, 1));
}

/// Syscalls of every kind: named ones with out-arguments, strings and
/// data, numbers the table does not have, a wire that is not the table's.
fn syscall_trace() -> Out {
    let mut r = kernel_region(1);
    for i in 0..3u64 {
        r.emit(0, 10 + i * 10, SYS_ENTRY, &sys_entry(0, i)); // read
        r.emit(0, 15 + i * 10, SYS_EXIT, &sys_exit(0, 4096));
    }
    r.emit(0, 100, SYS_ENTRY, &sys_entry(60, 7)); // exit
    r.emit(0, 110, SYS_ENTRY, &sys_entry(999, 9)); // not in the table
    r.emit(0, 120, SYS_EXIT, &sys_exit(999, -38));
    r.emit(0, 130, SYS_ENTRY, &sys_entry(400, 1)); // a hole of the table
    let at_fdcwd = -100i64 as u64;
    let openat = sys_entry_with(257, &[at_fdcwd, 0x7000, 0o101, 0o644], &["/tmp/a b"]);
    r.emit(0, 140, SYS_ENTRY, &openat);
    r.emit(
        0,
        150,
        SYS_EXIT,
        &sys_exit_with(293, 0, &[], &[3, 0, 0, 0, 4, 0, 0, 0]),
    ); // pipe2
    r.emit(0, 160, SYS_ENTRY, &sys_entry_with(0, &[1, 2], &[])); // read with 2 args: not the table's
    r.emit(0, 170, SYS_ENTRY, &sys_entry(40, 5)); // sendfile, LTTng's sendfile64
    r.close_region();
    record(&r)
}

#[test]
fn syscalls_have_lttng_names_and_fields() {
    let out = syscall_trace();
    let names: Vec<&str> = out.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "syscall_entry_read",
            "syscall_exit_read",
            "syscall_entry_read",
            "syscall_exit_read",
            "syscall_entry_read",
            "syscall_exit_read",
            "syscall_entry_exit",
            "syscall_entry_unknown",
            "syscall_exit_unknown",
            "syscall_entry_unknown",
            "syscall_entry_openat",
            "syscall_exit_pipe2",
            "syscall_entry_unknown",
            "syscall_entry_sendfile64",
        ]
    );
    // LTTng's fields, in its order, with the wire's values.
    let keys = |e: &Ev| e.f.keys().cloned().collect::<Vec<_>>();
    let e = &out.events[4];
    assert_eq!(keys(e), ["count", "fd"]);
    assert_eq!((e.f["fd"].int(), e.f["count"].int()), (2, 2));
    let x = &out.events[1];
    assert_eq!((x.f["ret"].int(), x.f["buf"].int()), (4096, 0x1001));
    assert_eq!(out.events[6].f["error_code"].int(), 7);
    let u = &out.events[7];
    assert_eq!(u.f["id"].int(), 999);
    assert_eq!(out.events[8].f["ret"].int(), -38);
    assert_eq!(out.events[9].f["id"].int(), 400);
    let o = &out.events[10];
    assert_eq!(o.f["filename"].text(), "/tmp/a b");
    assert_eq!(
        (o.f["dfd"].int(), o.f["flags"].int(), o.f["mode"].int()),
        (-100, 0o101, 0o644)
    );
    assert_eq!(out.events[11].raw["fildes"], [3, 0, 0, 0, 4, 0, 0, 0]);
    assert_eq!(out.events[13].f["out_fd"].int(), 5);
}

#[test]
fn syscall_classes_are_lttngs_and_declared_only_when_used() {
    let out = syscall_trace();
    let class = |n: &str| out.classes.iter().find(|c| c.name == n).unwrap();
    let fields: Vec<(&str, FieldType, bool)> = class("syscall_entry_openat")
        .fields
        .iter()
        .map(|f| (f.name.as_str(), f.ty, f.hex))
        .collect();
    assert_eq!(
        fields,
        [
            ("dfd", FieldType::S32, false),
            ("filename", FieldType::String, false),
            ("flags", FieldType::S32, false),
            ("mode", FieldType::U16, false)
        ]
    );
    assert_eq!(
        class("syscall_exit_pipe2").fields[1].ty,
        FieldType::U32Array(2)
    );
    // Classes exist only for the syscalls that occur; the most frequent
    // get the free ids first (from FREE on), the wire ids keep `_unknown`.
    let id_of = |n: &str| out.classes.iter().find(|c| c.name == n).map(|c| c.id);
    assert_eq!(id_of("syscall_entry_read"), Some(FREE));
    assert_eq!(id_of("syscall_exit_read"), Some(FREE + 1));
    assert_eq!(id_of("syscall_entry_unknown"), Some(SYS_ENTRY));
    assert_eq!(id_of("syscall_exit_unknown"), Some(SYS_EXIT));
    assert_eq!(id_of("syscall_entry_write"), None);
    assert_eq!(id_of("syscall_entry"), None);
    let stats = out.writer.kernel_expansion().unwrap();
    assert_eq!(
        (
            stats.syscall_classes,
            stats.syscalls_named,
            stats.syscalls_unknown
        ),
        (6, 10, 4)
    );
}

#[test]
fn syscalls_past_the_compact_ids_use_extended_headers() {
    let mut r = kernel_region(1);
    // 10 distinct syscalls (read, write, ... mmap), nr i 11 - i times:
    // 20 classes on the free ids FREE.., most frequent first; ids past 30
    // (all of them, when the module's own events take 0..30) have the
    // extended header, whatever the wire event had.
    let mut want = Vec::new();
    for nr in 0u16..10 {
        for k in 0..(11 - nr as u64) {
            let ts = 1_000_000 * nr as u64 + 2 * k;
            r.emit(0, ts, SYS_ENTRY, &sys_entry(nr, k));
            r.emit(0, ts + 1, SYS_EXIT, &sys_exit(nr, k as i64));
            want.extend([ts, ts + 1]);
        }
    }
    r.close_region();
    let out = record(&r);
    let id_of = |n: &str| out.classes.iter().find(|c| c.name == n).map(|c| c.id);
    assert_eq!(id_of("syscall_entry_read"), Some(FREE));
    assert_eq!(id_of("syscall_exit_open"), Some(FREE + 5));
    assert_eq!(id_of("syscall_entry_close"), Some(FREE + 6));
    assert_eq!(id_of("syscall_exit_mmap"), Some(FREE + 19));
    assert_eq!(out.classes.len() as u32, FREE - 2 + 20);
    // Timestamps survive the header rewrite (compact -> extended).
    let ts: Vec<u64> = out.events.iter().map(|e| e.ts).collect();
    assert_eq!(ts, want);
    assert_eq!(named(&out, "syscall_entry_read").len(), 11);
    assert_eq!(named(&out, "syscall_exit_mmap").len(), 2);
    assert_eq!(named(&out, "syscall_exit_mmap")[1].f["ret"].int(), 1);
}

#[test]
fn hostile_names_are_sanitized_never_garbage() {
    let mut r = kernel_region(1);
    r.emit(0, 10, FORK, &fork(1, 50, b"a\"b\\c\n\x1b[2J\xff\xfe"));
    r.emit(0, 20, DUMP_PROCESS, &dump_process(51, b"0123456789abcdef")); // no NUL
    r.emit(0, 30, RENAME, &rename(52, b"ok\0GARBAGE-AFTER"));
    r.emit(0, 40, SWITCH, &switch(50, 0, 51));
    r.emit(0, 50, SWITCH, &switch(51, 0, 52));
    r.close_region();
    let out = record(&r);
    let sw = named(&out, "sched_switch");
    assert_eq!(sw[0].f["prev_comm"].text(), "a?b?c??[2J??");
    assert_eq!(sw[0].f["next_comm"].text(), "0123456789abcde");
    assert_eq!(
        sw[1].raw["next_comm"],
        comm16(b"ok"),
        "zero-padded, nothing after the NUL"
    );
    assert_eq!(sw[0].raw["next_comm"][15], 0, "always NUL-terminated");
}

#[test]
fn kernel_api_events_with_flagged_fields_are_expanded_by_the_flag() {
    let mut r = kernel_region(1);
    r.register_flagged(
        0,
        FREE,
        "my_module_event",
        &[
            ("tid", abi::IVT_FT_U32, 0, abi::IVT_FF_TID_COMM),
            ("comm", abi::IVT_FT_STRING, 0, 0),
            ("owner", abi::IVT_FT_U32, 0, abi::IVT_FF_TID_COMM),
            ("n", abi::IVT_FT_U16, 0, abi::IVT_FF_TID_COMM), // not a u32: ignored
        ],
    );
    r.emit(0, 10, DUMP_PROCESS, &dump_process(5, b"five"));
    let mut p = 5u32.to_le_bytes().to_vec();
    p.extend_from_slice(b"x\0");
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&3u16.to_le_bytes());
    r.emit(0, 20, FREE, &p);
    r.close_region();
    let out = record(&r);
    let e = named(&out, "my_module_event")[0];
    let names: Vec<&str> = e.f.keys().map(String::as_str).collect();
    assert_eq!(names, ["comm", "comm_2", "n", "owner", "owner_comm", "tid"]);
    assert_eq!(e.f["comm_2"].text(), "five");
    assert_eq!(e.f["comm"].text(), "x");
    assert_eq!(e.f["owner_comm"].text(), "swapper/0");
}

/// A sink that keeps every packet (the staged wire form, for [`expand_with`]).
#[derive(Default)]
struct Capture(Vec<(u32, Vec<u8>)>);

impl PacketSink for Capture {
    type Error = std::convert::Infallible;
    fn packet(&mut self, c: u32, _: u32, b: &[u8], _: &EventClasses) -> Result<(), Self::Error> {
        self.0.push((c, b.to_vec()));
        Ok(())
    }
}

#[test]
fn a_flood_of_distinct_threads_is_bounded() {
    let mut r = RegionBuilder::new(1, 64, 65536).kernel(1).build_region();
    r.register_kernel_events();
    let n = 20_000u32;
    for tid in 1..=n {
        r.emit(0, tid as u64, DUMP_PROCESS, &dump_process(tid, b"t"));
    }
    r.emit(0, n as u64 + 1, SWITCH, &switch(5, 0, n));
    r.close_region();
    let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
    let mut reader = Reader::new(region, ivtrace_region::packet::TickRange::ALL);
    let mut cap = Capture::default();
    reader.drain_available(&mut cap).unwrap();
    reader.flush_partial(&mut cap).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = cap.0.iter().flat_map(|(_, p)| p.clone()).collect();
    let root = crate::OutDir::root(dir.path(), &Default::default()).unwrap();
    let (staging, out) = (
        root.create_dir("wire").unwrap(),
        root.create_dir("out").unwrap(),
    );
    let staged = [Staged::channel(0)];
    std::fs::write(dir.path().join("wire").join(&staged[0].name), bytes).unwrap();
    let dirs = super::Dirs {
        staging: &staging,
        out: &out,
    };
    let x = expand_with(
        reader.classes().stream(0),
        &dirs,
        (&staged, &ns_is_tick()),
        ThreadNamesBuilder::with_limit(1000),
        &NameTable::default(),
    )
    .unwrap();
    assert_eq!(x.stats.names_dropped, (n - 1000) as u64);
    assert_eq!((x.stats.threads, x.stats.name_changes), (1000, 1000));
    assert_eq!(x.stats.events, n as u64 + 1);
    let mut evs = Vec::new();
    decode_file(
        &dir.path().join("out").join(&staged[0].name),
        0,
        &x.classes,
        &mut evs,
    );
    let sw = evs.iter().find(|e| e.name == "sched_switch").unwrap();
    assert_eq!(sw.f["prev_comm"].text(), "t"); // kept
    assert_eq!(sw.f["next_comm"].text(), ""); // past the cap: empty
}

#[test]
fn babeltrace2_reads_the_expanded_trace_without_warnings() {
    if !have_tool("babeltrace2") {
        eprintln!("SKIP: babeltrace2 is not installed");
        return;
    }
    let mut r = fork_exec_rename_region();
    // and a user channel, so `babeltrace2 DIR` sees two traces
    r.register_loadgen(0);
    r.emit(2, 30, 0, &TestRegion::loadgen_payload(0, 0, b"x"));
    let out = record(&r);
    for path in [out.dir.path().join("kernel"), out.dir.path().to_path_buf()] {
        let o = Command::new("babeltrace2")
            .args(["--log-level=W"])
            .arg(&path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{}: {stderr}", path.display());
        assert!(stderr.trim().is_empty(), "babeltrace2 said: {stderr}");
        assert!(
            stdout.contains("prev_comm = \"swapper/0\", prev_tid = 0, prev_prio = 20, prev_state = 0, next_comm = \"worker\", next_tid = 42"),
            "{stdout}"
        );
        assert!(
            stdout.contains("parent_comm = \"init\", parent_tid = 7"),
            "{stdout}"
        );
    }
    let meta = kernel_metadata_has(
        out.dir.path(),
        &[
            "domain = \"kernel\";",
            "tracer_name = \"lttng-modules\";",
            "tracer_major = 2;",
            "tracer_minor = 13;",
            "tracer_patchlevel = 0;",
            "sysname = \"Linux\";",
            "hostname = \"guest0\";",
            "cpu_id;",
        ],
    );
    let user = std::fs::read_to_string(out.dir.path().join("user/metadata")).unwrap();
    let uuid = |m: &str| {
        m.lines()
            .find(|l| l.contains("uuid ="))
            .unwrap()
            .to_string()
    };
    assert_ne!(uuid(&meta), uuid(&user), "each trace has its own UUID");
}

#[test]
fn naming_events_with_other_field_types_are_not_trusted() {
    let mut r = RegionBuilder::new(2, 4, 4096).kernel(1).build_region();
    for (id, (name, fields)) in ivtrace_testutil::KERNEL_EVENTS.iter().enumerate() {
        if *name == "task_rename" {
            // tid as a u64: not the layout the role needs
            let f = [
                ("tid", abi::IVT_FT_U64, 0, 0),
                ("newcomm", abi::IVT_FT_CHARS, 16, 0),
            ];
            r.register_flagged(0, id as u32, name, &f);
        } else {
            r.register_flagged(0, id as u32, name, fields);
        }
    }
    let mut p = 42u64.to_le_bytes().to_vec();
    p.extend_from_slice(&comm16(b"evil"));
    r.emit(0, 10, RENAME, &p);
    r.emit(0, 20, SWITCH, &switch(0, 0, 42));
    r.close_region();
    let out = record(&r);
    assert_eq!(named(&out, "sched_switch")[0].f["next_comm"].text(), "");
    let rename = named(&out, "task_rename")[0];
    assert_eq!(
        (rename.f["tid"].int(), rename.f["newcomm"].text()),
        (42, "evil")
    );
}

/// The Rust model of the kernel events (testutil's `KERNEL_EVENTS`) is
/// the table of abi/include/ivtrace/kernel_events.h, which
/// abi/tests/kernel_events.c prints as abi/kernel_events.json (`make -C abi
/// test` fails when that file is stale): same events, ids, fields, types,
/// counts and flags.
#[test]
fn kernel_events_match_the_abi_table() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../abi/kernel_events.json"
    );
    let text = std::fs::read_to_string(path).expect("abi/kernel_events.json is readable");
    let table: serde_json::Value = serde_json::from_str(&text).expect("it is JSON");
    let type_code = |t: &str| match t {
        "u8" => abi::IVT_FT_U8,
        "u16" => abi::IVT_FT_U16,
        "u32" => abi::IVT_FT_U32,
        "u64" => abi::IVT_FT_U64,
        "s8" => abi::IVT_FT_S8,
        "s16" => abi::IVT_FT_S16,
        "s32" => abi::IVT_FT_S32,
        "s64" => abi::IVT_FT_S64,
        "string" => abi::IVT_FT_STRING,
        "bytes" => abi::IVT_FT_BYTES,
        "chars" => abi::IVT_FT_CHARS,
        other => panic!("unknown field type {other} in abi/kernel_events.json"),
    };
    let flag = |f: &str| match f {
        "" => 0,
        "hex" => abi::IVT_FF_HEX,
        "tid_comm" => abi::IVT_FF_TID_COMM,
        other => panic!("unknown flag {other} in abi/kernel_events.json"),
    };
    type Model = (String, Vec<(String, u8, u16, u8)>);
    let from_abi: Vec<Model> = table
        .as_array()
        .expect("an array of events")
        .iter()
        .enumerate()
        .map(|(i, e)| {
            assert_eq!(e["id"].as_u64(), Some(i as u64), "ids are positions");
            let fields = e["fields"].as_array().expect("fields");
            let fields = fields
                .iter()
                .map(|f| {
                    (
                        f["name"].as_str().unwrap().to_string(),
                        type_code(f["type"].as_str().unwrap()),
                        f["count"].as_u64().unwrap() as u16,
                        flag(f["flag"].as_str().unwrap()),
                    )
                })
                .collect();
            (e["name"].as_str().unwrap().to_string(), fields)
        })
        .collect();
    let model: Vec<Model> = ivtrace_testutil::KERNEL_EVENTS
        .iter()
        .map(|(name, fields)| {
            let fields = fields
                .iter()
                .map(|&(n, t, c, f)| (n.to_string(), t, c, f))
                .collect();
            (name.to_string(), fields)
        })
        .collect();
    for (i, (a, m)) in from_abi.iter().zip(&model).enumerate() {
        assert_eq!(
            a, m,
            "kernel event {i}: abi/kernel_events.json (left) and testutil::KERNEL_EVENTS (right) differ"
        );
    }
    assert_eq!(
        from_abi.len(),
        model.len(),
        "abi/kernel_events.json and testutil::KERNEL_EVENTS have different event counts"
    );
}

/// A names record (`struct ivt_names_rec`) holding `entries` (tid, name).
fn name_table(entries: &[(u32, &str)]) -> Vec<u8> {
    use ivtrace_region::names::{NAMES_REC_SIZE, NAME_ENTRY_SIZE};
    let len = NAMES_REC_SIZE + 8 * NAME_ENTRY_SIZE;
    let mut r = vec![0u8; len];
    r[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    r[4..8].copy_from_slice(&abi::IVT_META_COMMIT.to_le_bytes());
    r[8..10].copy_from_slice(&ivtrace_region::names::IVT_META_NAMES.to_le_bytes());
    r[12..16].copy_from_slice(&8u32.to_le_bytes());
    for (i, (tid, name)) in entries.iter().enumerate() {
        let e = NAMES_REC_SIZE + i * NAME_ENTRY_SIZE;
        r[e..e + 4].copy_from_slice(&tid.to_le_bytes());
        r[e + 4..e + 8].copy_from_slice(&2u32.to_le_bytes());
        r[e + 16..e + 32].copy_from_slice(&comm16(name.as_bytes()));
    }
    r
}

/// A salvaged flight recorder: the rings kept no naming event for thread
/// 50, the guest's name table has it; thread 51's fork in the trace wins
/// over the table's (later) name.
#[test]
fn the_name_table_names_threads_no_naming_event_names() {
    let mut r = kernel_region(1);
    r.append_meta(&name_table(&[
        (50, "old-daemon"),
        (51, "renamed-later"),
        (52, "bad\n"),
    ]));
    r.emit(0, 10, FORK, &fork(1, 51, b"kid"));
    r.emit(0, 20, SWITCH, &switch(50, 0, 51));
    r.emit(0, 30, SWITCH, &switch(51, 0, 52));
    r.emit(0, 40, SWITCH, &switch(52, 0, 53));
    r.close_region();
    let out = record(&r);
    let sw = named(&out, "sched_switch");
    assert_eq!(sw[0].f["prev_comm"].text(), "old-daemon");
    assert_eq!(sw[0].f["next_comm"].text(), "kid");
    assert_eq!(
        sw[1].f["next_comm"].text(),
        "bad?",
        "table names are sanitized"
    );
    assert_eq!(sw[2].f["next_comm"].text(), "", "in neither: unnamed");
    let stats = out.writer.kernel_expansion().unwrap();
    assert_eq!(stats.name_table_entries, 3);
    // thread 53 and the fork's parent 1 are named nowhere
    assert_eq!((stats.comm_from_table, stats.comm_unknown), (3, 2));
}

/// Fields reshaped into LTTng's form: fork's vtids (a u8-counted s32
/// sequence), printk's msg (a u64-counted text sequence), exec's comm
/// (left out); babeltrace2 reads them.
#[test]
fn reshaped_fields_are_lttngs() {
    const PRINTK: u32 = 14;
    let mut r = kernel_region(1);
    r.emit(0, 10, FORK, &fork(1, 77, b"kid"));
    r.emit(0, 20, PRINTK, b"hello ivtrace\0");
    r.emit(0, 30, EXEC, &exec(77, "/bin/true", b"true"));
    r.close_region();
    let out = record(&r);
    let f = named(&out, "sched_process_fork")[0];
    assert_eq!(f.f["vtids"].int(), 1);
    assert_eq!(f.raw["vtids"], 77u32.to_le_bytes());
    assert_eq!(
        named(&out, "printk_console")[0].f["msg"].text(),
        "hello ivtrace"
    );
    let x = named(&out, "sched_process_exec")[0];
    assert!(!x.f.contains_key("comm"));
    assert_eq!(x.f["filename"].text(), "/bin/true");
    if have_tool("babeltrace2") {
        let o = Command::new("babeltrace2")
            .arg(out.dir.path().join("kernel"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains("vtids = [ [0] = 77 ]"), "{text}");
        assert!(text.contains("msg = \"hello ivtrace\""), "{text}");
    }
}

/// A staged packet the expansion cannot walk (here: its content ends in
/// the middle of an event header) is written empty, its events counted as
/// lost and carried in the running events_discarded of every later packet
/// of its channel.
#[test]
fn a_staged_packet_that_does_not_walk_becomes_a_counted_loss() {
    let mut r = RegionBuilder::new(1, 8, 4096).kernel(1).build_region();
    r.register_kernel_events();
    let mut ts = 10;
    for _ in 0..3 {
        for _ in 0..5 {
            r.emit(0, ts, SWITCH, &switch(1, 0, 2));
            ts += 10;
        }
        r.close(0);
    }
    r.close_region();
    let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
    let mut reader = Reader::new(region, ivtrace_region::packet::TickRange::ALL);
    let mut cap = Capture::default();
    reader.drain_available(&mut cap).unwrap();
    reader.finish(&mut cap).unwrap();
    assert_eq!(cap.0.len(), 3);
    let cut = (abi::PACKET_HDR_SIZE as u64 + 2) * 8;
    put_u64(&mut cap.0[1].1, abi::pkt::CONTENT_SIZE, cut);
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = cap.0.iter().flat_map(|(_, p)| p.clone()).collect();
    let root = crate::OutDir::root(dir.path(), &Default::default()).unwrap();
    let (staging, out) = (
        root.create_dir("wire").unwrap(),
        root.create_dir("out").unwrap(),
    );
    let staged = [Staged::channel(0)];
    std::fs::write(dir.path().join("wire").join(&staged[0].name), bytes).unwrap();
    let dirs = super::Dirs {
        staging: &staging,
        out: &out,
    };
    let names = ThreadNamesBuilder::with_limit(100);
    let files = (&staged[..], &ns_is_tick());
    let x = expand_with(
        reader.classes().stream(0),
        &dirs,
        files,
        names,
        &NameTable::default(),
    )
    .unwrap();
    let expanded = dir.path().join("out").join(&staged[0].name);
    assert_eq!((x.stats.packets, x.stats.packets_skipped), (2, 1));
    assert_eq!((x.stats.events, x.stats.events_lost), (10, 5));
    assert_eq!(x.stats.lost_by_channel.get(&0), Some(&5));
    let mut evs = Vec::new();
    decode_file(&expanded, 0, &x.classes, &mut evs);
    assert_eq!(evs.len(), 10);
    let mut file = PacketFile::open(&expanded).unwrap();
    let mut seen = Vec::new();
    while file.next_packet().unwrap() {
        let (h, _) = packet_content(&file.buf).unwrap();
        seen.push((h.packet_seq_num, h.event_count, h.events_discarded));
    }
    assert_eq!(seen, [(0, 5, 0), (1, 0, 5), (2, 5, 5)]);
}

/// Every time of the kernel trace is the final mapping's nanoseconds
/// since the epoch, exact (integer arithmetic), whatever the tick rate:
/// packet bounds and events, across gaps past what a compact header holds
/// in ticks, and the metadata declares a 1 GHz clock with offset 0.
#[test]
fn kernel_times_are_the_mappings_nanoseconds() {
    let mapping = ClockMapping {
        freq_hz: 2_400_000_000,
        ref_ticks: 5_000_000_000_000,
        ref_realtime_ns: 1_795_500_000_123_456_789,
        error_ns: 700,
        method: "test".into(),
        coarse: false,
        samples: 9,
    };
    let mut r = kernel_region(1);
    let mut ticks = Vec::new();
    let mut t = mapping.ref_ticks - 3_000_000_000;
    for (i, gap) in [
        1u64,
        2,
        3,
        7,
        1 << 27,
        (1 << 27) + 1,
        1 << 30,
        9,
        1 << 33,
        1,
    ]
    .iter()
    .enumerate()
    {
        t += gap;
        r.emit(0, t, SWITCH, &switch(0, 0, 40 + i as u32));
        ticks.push(t);
    }
    r.close_region();
    let out = record_with(&r, mapping.clone());
    let got: Vec<u64> = out.events.iter().map(|e| e.ts).collect();
    let want: Vec<u64> = ticks
        .iter()
        .map(|&t| mapping.ns_value(t).unwrap())
        .collect();
    assert_eq!(got, want);
    let mut file = PacketFile::open(&out.dir.path().join("kernel/kernel_chan0")).unwrap();
    while file.next_packet().unwrap() {
        let (h, _) = packet_content(&file.buf).unwrap();
        assert!(want.first() <= Some(&h.timestamp_begin), "{h:?}");
        assert!(
            h.timestamp_begin <= h.timestamp_end && h.timestamp_end <= want[9],
            "{h:?}"
        );
    }
    kernel_metadata_has(
        out.dir.path(),
        &[
            "freq = 1000000000;",
            "offset_s = 0;",
            "offset = 0;",
            "precision = 700;",
        ],
    );
}

/// A kernel trace clock whose nanoseconds are its ticks: the times these
/// tests check are the ticks they emitted.
fn ns_is_tick() -> ClockMapping {
    ClockMapping {
        freq_hz: 1_000_000_000,
        error_ns: 1,
        ..ClockMapping::default()
    }
}

/// An output event header is compact when its id fits in 5 bits and its
/// time is less than 2^27 past the previous one (a renamed event, a time
/// in nanoseconds), else extended with the whole time.
#[test]
fn output_headers_are_compact_when_id_and_time_fit() {
    use ivtrace_region::packet::put_event_header;
    let ts = 0x0123_4567_89ab_cdef_u64;
    let mut out = Vec::new();
    put_event_header(&mut out, 29, ts, ts - abi::IVT_EV_TS_MASK);
    let word = le_u32(&out, 0);
    assert_eq!(
        (out.len(), word & 0x1f, word >> 5),
        (4, 29, (ts & abi::IVT_EV_TS_MASK) as u32)
    );
    for (id, prev) in [(31, ts), (29, ts - abi::IVT_EV_TS_MASK - 1)] {
        out.clear();
        put_event_header(&mut out, id, ts, prev);
        assert_eq!(out.len(), abi::IVT_EV_EXT_SIZE, "id {id}");
        assert_eq!((le_u32(&out, 0), le_u32(&out, 4)), (31, id));
        assert_eq!(le_u64(&out, 8), ts);
    }
}

/// What a live sink handed to its sink: metadata as appended by a
/// relay (first text whole, then the declarations of new classes) and the
/// packets per file; and the latest whole text of each trace's metadata.
#[derive(Default)]
struct CaptureTap {
    metadata: std::sync::Mutex<BTreeMap<String, (String, Vec<u32>)>>,
    latest: std::sync::Mutex<BTreeMap<String, String>>,
    files: std::sync::Mutex<BTreeMap<String, Vec<u8>>>,
}

/// Shared, so the test reads what the live sink it gave a clone to sent.
impl crate::TraceSink for std::sync::Arc<CaptureTap> {
    fn metadata(
        &mut self,
        trace: &'static str,
        text: &str,
        classes: Option<&StreamClasses>,
    ) -> Result<(), crate::CtfError> {
        let mut latest = self.latest.lock().unwrap();
        latest.insert(trace.to_string(), text.to_string());
        let mut m = self.metadata.lock().unwrap();
        let (sent, ids) = m.entry(trace.to_string()).or_default();
        let now: Vec<u32> = classes
            .into_iter()
            .flat_map(|c| c.iter().map(|e| e.id))
            .collect();
        if sent.is_empty() {
            *sent = text.to_string();
        } else {
            for c in classes.into_iter().flat_map(|c| c.iter()) {
                if !ids.contains(&c.id) {
                    crate::tsdl::write_event(sent, c);
                }
            }
        }
        *ids = now;
        Ok(())
    }
    fn packet(
        &mut self,
        trace: &'static str,
        file: &str,
        bytes: &[u8],
        _events: u64,
    ) -> Result<(), crate::CtfError> {
        let mut f = self.files.lock().unwrap();
        f.entry(format!("{trace}/{file}"))
            .or_default()
            .extend_from_slice(bytes);
        Ok(())
    }
}

/// The events of `dir`'s kernel_chan`chan`, decoded with `classes`.
fn kernel_chan_events(dir: &Path, chan: u32, classes: &StreamClasses) -> Vec<Ev> {
    let mut evs = Vec::new();
    decode_file(
        &dir.join(format!("kernel/kernel_chan{chan}")),
        chan,
        classes,
        &mut evs,
    );
    evs
}

/// The kernel trace's metadata under `dir`, after checking that it holds
/// each of `needles`.
fn kernel_metadata_has(dir: &Path, needles: &[&str]) -> String {
    let meta = std::fs::read_to_string(dir.join("kernel/metadata")).unwrap();
    for needle in needles {
        assert!(meta.contains(needle), "{needle} not in\n{meta}");
    }
    meta
}

/// A writer of `region`'s traces into `dir`.
fn writer_into(dir: &Path, region: &Region) -> CtfWriter {
    writer_with(dir, region, clock())
}

/// The env of the tests' traces.
fn test_env() -> TraceEnv {
    TraceEnv {
        hostname: "guest0".into(),
        trace_name: "t".into(),
        creation_datetime: "d".into(),
        tracer_major: 0,
        tracer_minor: 1,
        extra: vec![],
    }
}

/// A writer of `region`'s traces into `dir` with `clock` as its mapping.
pub(crate) fn writer_with(dir: &Path, region: &Region, clock: ClockMapping) -> CtfWriter {
    let n = region.layout().nr_channels;
    let root = crate::OutDir::root(dir, &Default::default()).unwrap();
    let limits = crate::streams::Limits::default();
    CtfWriter::new(root, region.header().uuid, clock, test_env(), n, limits)
}

/// Finishes `writer` with the clock and env it was made with.
pub(crate) fn finish_as_made(writer: &mut CtfWriter, classes: &EventClasses) {
    let (clock, env) = (writer.clock().clone(), writer.env().clone());
    writer.finish(&clock, env, classes).unwrap();
}

/// A resumed recording's kernel stays staged: its adopted files hold wire
/// packets, which the expansion at the end turns into `DIR/kernel/`.
#[test]
fn a_resumed_kernel_stays_staged() {
    let r = fork_exec_rename_region();
    let dir = tempfile::tempdir().unwrap();
    let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
    // The first recorder stages the packets and dies before finishing.
    let mut first = writer_into(dir.path(), &region);
    let mut reader = Reader::new(region, ivtrace_region::packet::TickRange::ALL);
    reader.drain_available(&mut first).unwrap();
    reader.flush_partial(&mut first).unwrap();
    first.commit().unwrap();
    drop(first);
    let staging = dir.path().join(super::STAGING_DIR);
    let mut adopted = Vec::new();
    for chan in 0..2 {
        let len = std::fs::metadata(staging.join(format!("kernel_chan{chan}")))
            .unwrap()
            .len();
        adopted.push((chan, abi::IVT_STREAM_KERNEL, len));
    }
    let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
    let mut resumed = writer_into(dir.path(), &region);
    resumed.adopt(&adopted, reader.classes()).unwrap();
    finish_as_made(&mut resumed, reader.classes());
    assert!(!staging.exists(), "the staging directory was expanded");
    let classes = resumed.output_classes(0, reader.classes()).clone();
    let mut evs = Vec::new();
    for chan in 0..2 {
        let path = dir.path().join(format!("kernel/kernel_chan{chan}"));
        decode_file(&path, chan, &classes, &mut evs);
    }
    assert!(evs.iter().any(|e| e.name == "sched_switch"), "{evs:?}");
}

/// The directory and a live sink beside it, fed the same packets (what
/// the engine's sinks do).
struct DirAndLive {
    dir: CtfWriter,
    live: crate::live::LiveOut,
}

impl PacketSink for DirAndLive {
    type Error = crate::CtfError;

    fn packet(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Result<(), crate::CtfError> {
        self.dir.packet(chan, stream, bytes, classes)?;
        self.live.packet(chan, stream, bytes, classes)
    }
}

/// Writes what `tap` got under `dir` as the relay's copy would hold it
/// (each trace's metadata and stream files).
fn write_relay_copy(tap: &CaptureTap, dir: &Path) {
    for (trace, (meta, _)) in tap.metadata.lock().unwrap().iter() {
        std::fs::create_dir_all(dir.join(trace)).unwrap();
        std::fs::write(dir.join(trace).join("metadata"), meta).unwrap();
    }
    for (rel, bytes) in tap.files.lock().unwrap().iter() {
        std::fs::write(dir.join(rel), bytes).unwrap();
    }
}

/// A live sink expands kernel packets as they arrive while the directory
/// beside it stages them: names come from what was drained so far and
/// the guest's name table, syscall classes are declared as they occur,
/// and the relay's copy (append-only metadata, the packets sent) reads
/// like the directory's trace.
#[test]
fn a_live_sink_expands_as_packets_arrive() {
    let mut r = fork_exec_rename_region();
    r.append_meta(&name_table(&[(42, "from-table")]));
    let dir = tempfile::tempdir().unwrap();
    let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
    let writer = writer_into(dir.path(), &region);
    let tap = std::sync::Arc::new(CaptureTap::default());
    let live = crate::live::LiveOut::beside(&writer, Box::new(tap.clone()));
    let mut both = DirAndLive { dir: writer, live };
    let mut reader = Reader::new(region, ivtrace_region::packet::TickRange::ALL);
    if let Some(t) = ivtrace_region::names::read_thread_names(reader.region()) {
        both.dir.set_thread_name_table(t.clone());
        both.live.set_thread_name_table(t);
    }
    reader.drain_available(&mut both).unwrap();
    reader.flush_partial(&mut both).unwrap();
    reader.finish(&mut both).unwrap();
    finish_as_made(&mut both.dir, reader.classes());
    both.live
        .finish(&clock(), test_env(), reader.classes())
        .unwrap();
    let relay = tempfile::tempdir().unwrap();
    write_relay_copy(&tap, relay.path());
    // CPU 0's packet is drained before CPU 1's fork: the table names 42.
    let classes = both.live.kernel_classes().unwrap().clone();
    let evs = kernel_chan_events(relay.path(), 0, &classes);
    let sw = evs.iter().find(|e| e.name == "sched_switch").unwrap();
    assert_eq!(sw.f["next_comm"].text(), "from-table");
    let stats = both.live.kernel_expansion().unwrap();
    assert!(stats.comm_from_table > 0, "{stats:?}");
    if !have_tool("babeltrace2") {
        return;
    }
    let count = |p: &Path| {
        let o = Command::new("babeltrace2").arg(p).output().unwrap();
        assert!(
            o.status.success() && o.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).lines().count()
    };
    let local = count(&dir.path().join("kernel"));
    assert_eq!(local, 12, "6 events on each CPU");
    assert_eq!(count(&relay.path().join("kernel")), local);
}

/// The live expansion converts with the mapping in force when a
/// packet arrives: a later mapping that puts a stream's next times before
/// its last one cannot make them go back (clamped and counted), and the
/// clock block states the bound of the mapping the packets were converted
/// with.
#[test]
fn a_live_sink_keeps_each_stream_monotonic_across_mappings() {
    let mut r = kernel_region(1);
    for (i, ts) in [100u64, 200, 300].into_iter().enumerate() {
        r.emit(0, ts, SWITCH, &switch(0, 0, 40 + i as u32));
    }
    r.close(0);
    for (i, ts) in [310u64, 2_000, 3_000].into_iter().enumerate() {
        r.emit(0, ts, SWITCH, &switch(0, 0, 50 + i as u32));
    }
    let dir = tempfile::tempdir().unwrap();
    let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
    let tap = std::sync::Arc::new(CaptureTap::default());
    let sink = Box::new(tap.clone());
    let mut live = crate::live::LiveOut::beside(&writer_into(dir.path(), &region), sink);
    let mut reader = Reader::new(region, ivtrace_region::packet::TickRange::ALL);
    reader.drain_available(&mut live).unwrap();
    // The estimator moves the mapping 500 ns back, with a larger bound.
    let earlier = ClockMapping {
        ref_realtime_ns: clock().ref_realtime_ns - 500,
        error_ns: 1_234,
        ..clock()
    };
    live.set_clock(earlier.clone());
    reader.flush_partial(&mut live).unwrap();
    reader.finish(&mut live).unwrap();
    live.finish(&earlier, test_env(), reader.classes()).unwrap();
    let relay = tempfile::tempdir().unwrap();
    write_relay_copy(&tap, relay.path());
    let classes = live.kernel_classes().unwrap().clone();
    let evs = kernel_chan_events(relay.path(), 0, &classes);
    let base = clock().ref_realtime_ns;
    let got: Vec<u64> = evs.iter().map(|e| e.ts - base).collect();
    // 310 and 2000 map to -190 and 1500: -190 is before 300, so 300.
    assert_eq!(got, [100, 200, 300, 300, 1_500, 2_500]);
    let stats = live.kernel_expansion().unwrap();
    assert!(stats.ts_clamped >= 1, "{stats:?}");
    let meta = tap.latest.lock().unwrap()["kernel"].clone();
    assert!(meta.contains("precision = 1234;"), "{meta}");
}
