//! The kernel expansion on synthetic kernel wire packets (ring's Rust
//! model of the writer), drained by the real reader into the real writer.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use ivtrace_region::abi;
use ivtrace_region::classes::{EventClasses, FieldType, StreamClasses};
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

fn fork(parent: u32, child: u32, name: &[u8]) -> Vec<u8> {
    let mut p = parent.to_le_bytes().to_vec();
    p.extend_from_slice(&parent.to_le_bytes());
    p.extend_from_slice(&comm16(name));
    p.extend_from_slice(&child.to_le_bytes());
    p.extend_from_slice(&child.to_le_bytes());
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
    for v in [tid, tid, 1] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p.extend_from_slice(&comm16(name));
    for v in [0i32, 0, 0, 5, 0] {
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

fn sys_entry(nr: u16, a0: u64) -> Vec<u8> {
    let mut p = nr.to_le_bytes().to_vec();
    for a in [a0, 1, 2, 3, 4, 5] {
        p.extend_from_slice(&a.to_le_bytes());
    }
    p
}

fn sys_exit(nr: u16, ret: i64) -> Vec<u8> {
    let mut p = nr.to_le_bytes().to_vec();
    p.extend_from_slice(&ret.to_le_bytes());
    p
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
                    t => {
                        let (bytes, signed) = t.integer().unwrap();
                        let mut raw = [0u8; 8];
                        raw[..bytes as usize].copy_from_slice(b);
                        let u = u64::from_le_bytes(raw);
                        let shift = 64 - bytes * 8;
                        Val::Int(if signed {
                            (((u << shift) as i64) >> shift) as i128
                        } else {
                            u as i128
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

fn clock() -> ClockMapping {
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
    let dir = tempfile::tempdir().unwrap();
    let region = Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap();
    let env = TraceEnv {
        hostname: "guest0".into(),
        trace_name: "t".into(),
        creation_datetime: "d".into(),
        tracer_major: 0,
        tracer_minor: 1,
        extra: vec![],
    };
    let n = region.layout().nr_channels;
    let cpus = region.layout().nr_kernel_channels;
    let root = crate::OutDir::root(dir.path(), &Default::default()).unwrap();
    let limits = crate::streams::Limits::default();
    let mut writer = CtfWriter::new(root, region.header().uuid, clock(), env, n, limits);
    let mut reader = Reader::new(region);
    reader.drain_available(&mut writer).unwrap();
    reader.flush_partial(&mut writer).unwrap();
    reader.finish(&mut writer).unwrap();
    writer.finish(reader.classes()).unwrap();
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
            "child_comm",
            "child_tid",
            "child_pid"
        ]
    );
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

#[test]
fn syscalls_are_renamed_from_the_x86_64_table() {
    let mut r = kernel_region(1);
    for i in 0..3u64 {
        r.emit(0, 10 + i * 10, SYS_ENTRY, &sys_entry(0, i)); // read
        r.emit(0, 15 + i * 10, SYS_EXIT, &sys_exit(0, 4096));
    }
    r.emit(0, 100, SYS_ENTRY, &sys_entry(60, 7)); // exit
    r.emit(0, 110, SYS_ENTRY, &sys_entry(999, 9)); // not in the table
    r.emit(0, 120, SYS_EXIT, &sys_exit(999, -38));
    r.emit(0, 130, SYS_ENTRY, &sys_entry(400, 1)); // a hole of the table
    r.close_region();
    let out = record(&r);
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
        ]
    );
    let e = &out.events[4];
    assert_eq!((e.f["args0"].int(), e.f["args5"].int()), (2, 5));
    assert!(!e.f.contains_key("id"), "a named syscall drops its number");
    assert_eq!(out.events[1].f["ret"].int(), 4096);
    let u = &out.events[7];
    assert_eq!((u.f["id"].int(), u.f["args0"].int()), (999, 9));
    assert_eq!(out.events[8].f["ret"].int(), -38);
    assert_eq!(out.events[9].f["id"].int(), 400);
    // Classes exist only for the syscalls that occur; the most frequent
    // get the free compact ids (25..30), the wire ids keep `_unknown`.
    let id_of = |n: &str| out.classes.iter().find(|c| c.name == n).map(|c| c.id);
    assert_eq!(id_of("syscall_entry_read"), Some(25));
    assert_eq!(id_of("syscall_exit_read"), Some(26));
    assert_eq!(id_of("syscall_entry_exit"), Some(27));
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
        (3, 7, 3)
    );
}

#[test]
fn syscalls_past_the_compact_ids_use_extended_headers() {
    let mut r = kernel_region(1);
    // 10 distinct syscalls (read, write, ... mmap), nr i 11 - i times:
    // 20 classes; the 6 most frequent get the compact ids 25..30.
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
    assert_eq!(id_of("syscall_entry_read"), Some(25));
    assert_eq!(id_of("syscall_exit_open"), Some(30));
    assert_eq!(id_of("syscall_entry_close"), Some(31));
    assert_eq!(id_of("syscall_exit_mmap"), Some(44));
    assert_eq!(out.classes.len(), 25 - 2 + 20);
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
        25,
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
    r.emit(0, 20, 25, &p);
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
    let mut reader = Reader::new(region);
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
        &staged,
        ThreadNamesBuilder::with_limit(1000),
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
    let meta = std::fs::read_to_string(out.dir.path().join("kernel/metadata")).unwrap();
    for needle in [
        "domain = \"kernel\";",
        "tracer_name = \"lttng-modules\";",
        "tracer_major = 2;",
        "tracer_minor = 13;",
        "tracer_patchlevel = 0;",
        "sysname = \"Linux\";",
        "hostname = \"guest0\";",
        "cpu_id;",
    ] {
        assert!(meta.contains(needle), "{needle} missing");
    }
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
