//! The VM view end to end on recorded-format data: host tracefs pages
//! built from this machine's real format files (sched_switch, sched_wakeup,
//! sched_migrate_task, kvm_exit, kvm_entry, kvm_hypercall: the kvm_* never
//! fire here, guests run under TCG), decoded by the recorder's decoder
//! into a host trace as `--host-events` writes it; a guest kernel trace
//! drained from a region as the recorder drains it; then the derivation,
//! and babeltrace2 reading the VM view merged with the guest's events.
//!
//! The host side holds the edge cases: a hypercall whose exit and
//! entry happen on different host CPUs (the vCPU thread slept in a HLT
//! and woke on another CPU), an exit without entry at the end of the
//! trace, and two guests at once (their vCPU 0 threads interleaved on one
//! host CPU, told apart by the host state dump).

use std::fs;
use std::path::{Path, PathBuf};

use ivtrace_ctf::host_trace::{HostTrace, HostTraceDesc, STREAM_KERNEL};
use ivtrace_ctf::sidecar::Sidecar;
use ivtrace_region::abi::{IVT_HC_EVENT_FIRST, IVT_HC_VMSYNC};
use ivtrace_testutil::{
    babeltrace2_lines, have_tool, sched_switch_payload, task_rename_payload, RegionBuilder,
};
use ivtrace_tracefs::decode::Decoder;
use ivtrace_tracefs::format::{parse_event, parse_header_page, EventFmt, HeaderPage};
use ivtrace_tracefs::page::{build_record, walk, PageBuilder};
use ivtrace_tracefs::statedump::{self, process_state_payload, ThreadState};
use ivtrace_vmview::derive::{derive, Derived, GuestTraces, Request};

/// Host time 0 of the scenario: the guest region's clock maps its tick 0
/// here (RegionBuilder's reference point), at 1 GHz.
const BASE: u64 = 1_700_000_000_000_000_000;
const QEMU_A: i32 = 1000;
const A_VCPU0: i32 = 1001;
const A_VCPU1: i32 = 1002;
const QEMU_B: i32 = 2000;
const B_VCPU0: i32 = 2001;
const HOG: i32 = 3000;
const RIP: u64 = 0xffff_ffff_8100_1234;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tracefs/tests/fixtures/tracefs")
}

fn fmt(system: &str, name: &str) -> EventFmt {
    let text = fs::read_to_string(fixtures().join(format!("{name}.format"))).unwrap();
    parse_event(system, &text).unwrap()
}

fn header_page() -> HeaderPage {
    parse_header_page(&fs::read_to_string(fixtures().join("header_page")).unwrap()).unwrap()
}

struct Formats {
    switch: EventFmt,
    wakeup: EventFmt,
    migrate: EventFmt,
    exit: EventFmt,
    entry: EventFmt,
    hyper: EventFmt,
}

impl Formats {
    fn load() -> Formats {
        Formats {
            switch: fmt("sched", "sched_switch"),
            wakeup: fmt("sched", "sched_wakeup"),
            migrate: fmt("sched", "sched_migrate_task"),
            exit: fmt("kvm", "kvm_exit"),
            entry: fmt("kvm", "kvm_entry"),
            hyper: fmt("kvm", "kvm_hypercall"),
        }
    }

    fn switch(&self, prev: (i32, &str), state: u64, next: (i32, &str)) -> Vec<u8> {
        let ints = [
            ("prev_pid", prev.0 as u64),
            ("prev_prio", 120),
            ("prev_state", state),
            ("next_pid", next.0 as u64),
            ("next_prio", 120),
        ];
        build_record(
            &self.switch,
            prev.0,
            &ints,
            &[("prev_comm", prev.1), ("next_comm", next.1)],
        )
    }

    fn exit(&self, tid: i32, vcpu: u64, reason: u64) -> Vec<u8> {
        let ints = [
            ("exit_reason", reason),
            ("guest_rip", RIP),
            ("isa", 1),
            ("vcpu_id", vcpu),
        ];
        build_record(&self.exit, tid, &ints, &[])
    }

    fn entry(&self, tid: i32, vcpu: u64) -> Vec<u8> {
        build_record(
            &self.entry,
            tid,
            &[("vcpu_id", vcpu), ("rip", RIP + 3)],
            &[],
        )
    }

    fn hyper(&self, tid: i32, nr: u64, a: [u64; 4]) -> Vec<u8> {
        let ints = [
            ("nr", nr),
            ("a0", a[0]),
            ("a1", a[1]),
            ("a2", a[2]),
            ("a3", a[3]),
        ];
        build_record(&self.hyper, tid, &ints, &[])
    }
}

/// Host CPU 0 and 1's records (ns after BASE): the scenario.
fn scenario(f: &Formats) -> [Vec<(u64, Vec<u8>)>; 2] {
    let (a0, a1, b0) = (
        (A_VCPU0, "CPU 0/KVM"),
        (A_VCPU1, "CPU 1/KVM"),
        (B_VCPU0, "CPU 0/KVM"),
    );
    let cpu0 = vec![
        // Guest A's vCPU 0: a hypercall of the event channel.
        (1_000, f.exit(A_VCPU0, 0, 18)),
        (
            1_100,
            f.hyper(A_VCPU0, IVT_HC_EVENT_FIRST + 1, [11, 22, 33, 44]),
        ),
        (1_500, f.entry(A_VCPU0, 0)),
        // A HLT: the thread sleeps, guest B's vCPU 0 runs meanwhile.
        (2_000, f.exit(A_VCPU0, 0, 12)),
        (2_100, f.switch(a0, 1, b0)),
        (2_200, f.exit(B_VCPU0, 0, 30)),
        (2_300, f.entry(B_VCPU0, 0)),
    ];
    let cpu1 = vec![
        // A's vCPU 0 is woken onto host CPU 1, waits, runs, enters.
        (
            2_500,
            build_record(
                &f.wakeup,
                1,
                &[("pid", A_VCPU0 as u64), ("prio", 120), ("target_cpu", 1)],
                &[("comm", a0.1)],
            ),
        ),
        (
            2_600,
            build_record(
                &f.migrate,
                1,
                &[
                    ("pid", A_VCPU0 as u64),
                    ("prio", 120),
                    ("orig_cpu", 0),
                    ("dest_cpu", 1),
                ],
                &[],
            ),
        ),
        (2_700, f.switch((0, "swapper/1"), 0, a0)),
        (2_800, f.entry(A_VCPU0, 0)),
        // A vmsync hypercall.
        (3_000, f.exit(A_VCPU0, 0, 18)),
        (3_050, f.hyper(A_VCPU0, IVT_HC_VMSYNC, [5, 0x1234, 0, 0])),
        (3_200, f.entry(A_VCPU0, 0)),
        (3_300, f.switch(a0, 1, a1)),
        // A's vCPU 1 is preempted by a hog for 6 us.
        (3_500, f.switch(a1, 0, (HOG, "hog"))),
        (9_500, f.switch((HOG, "hog"), 0, a1)),
        // An exit without entry when the trace ends.
        (9_600, f.exit(A_VCPU1, 1, 48)),
        (9_650, f.hyper(A_VCPU1, IVT_HC_EVENT_FIRST, [1, 2, 3, 4])),
    ];
    [cpu0, cpu1]
}

/// DIR/host as `--host-events` writes it: the pages decoded by the
/// recorder's decoder, and the state dump of both QEMUs' vCPU threads.
fn write_host_trace(dir: &Path) -> HostTrace {
    let f = Formats::load();
    let fmts = [
        &f.switch, &f.wakeup, &f.migrate, &f.exit, &f.entry, &f.hyper,
    ];
    let with_ids: Vec<(EventFmt, u32)> = fmts
        .iter()
        .enumerate()
        .map(|(i, x)| ((*x).clone(), 100 + i as u32))
        .collect();
    let (decoder, mut classes) = Decoder::new(&with_ids);
    classes.extend(statedump::classes());
    let desc = HostTraceDesc {
        hostname: "host",
        trace_name: "a-host",
        error_ns: 1,
        env: vec![],
    };
    let root = ivtrace_ctf::OutDir::root(dir, &Default::default()).unwrap();
    let mut t = HostTrace::create(&root, "host", &desc, classes).unwrap();
    let dump = t.add_stream(STREAM_KERNEL, 0, "host_statedump").unwrap();
    for (tid, pid, name) in [
        (A_VCPU0, QEMU_A, "CPU 0/KVM"),
        (A_VCPU1, QEMU_A, "CPU 1/KVM"),
        (B_VCPU0, QEMU_B, "CPU 0/KVM"),
    ] {
        let mut n = [0u8; 16];
        n[..name.len()].copy_from_slice(name.as_bytes());
        let th = ThreadState {
            tid,
            pid,
            ppid: 1,
            name: n,
            state: b'S',
            cpu: 0,
        };
        t.event(
            dump,
            statedump::PROCESS_STATE,
            BASE,
            0,
            &process_state_payload(&th, 4026531836),
        )
        .unwrap();
    }
    let hp = header_page();
    for (cpu, recs) in scenario(&f).into_iter().enumerate() {
        let mut b = PageBuilder::new(hp, 4096, BASE);
        for (ts, r) in recs {
            b.record(BASE + ts, &r, false);
        }
        let stream = t
            .add_stream(STREAM_KERNEL, cpu as u32, &format!("host_cpu{cpu}"))
            .unwrap();
        let info = walk(&b.finish(), &hp, |ts, rec| {
            let d = decoder.decode(rec).expect("a known record");
            t.event(stream, d.class_id, ts, d.tid, &d.payload).unwrap();
        });
        assert!(!info.malformed);
    }
    t
}

/// The guest: spin (42) then sh (43) on CPU 0, dd (44) on CPU 1; drained
/// as the recorder drains (DIR/kernel, the sidecar).
fn write_guest_trace(dir: &Path) {
    let mut r = RegionBuilder::new(3, 4, 4096).kernel(2).build_region();
    r.register_kernel_events();
    let (rename, switch) = (task_rename_payload, sched_switch_payload);
    for (tid, name) in [(42, "spin"), (43, "sh"), (44, "dd")] {
        r.emit(0, 10, 20, &rename(tid, name));
    }
    r.emit(0, 500, 0, &switch(0, 42));
    r.emit(0, 4_000, 0, &switch(42, 43));
    r.emit(1, 100, 0, &switch(0, 44));
    r.close(0);
    r.close(1);
    r.close_region();
    ivtrace_engine::session::drain_bytes_to_dir(&r.bytes, dir).unwrap();
}

/// The clock UUID in a trace's metadata.
fn clock_uuid(metadata: &Path) -> String {
    let text = fs::read_to_string(metadata).unwrap();
    let clock = &text[text.find("clock {").unwrap()..];
    let at = clock.find("uuid = \"").unwrap() + 8;
    clock[at..at + 36].to_string()
}

fn derive_for(dir: &Path, host: &mut HostTrace, pid: i32) -> Derived {
    let sidecar: Sidecar =
        serde_json::from_slice(&fs::read(dir.join("ivtrace.json")).unwrap()).unwrap();
    let classes = sidecar.event_classes();
    let uuid = clock_uuid(&dir.join("kernel/metadata"));
    let root = ivtrace_ctf::OutDir::root(dir, &Default::default()).unwrap();
    let guest = GuestTraces {
        root: &root,
        kernel_classes: classes.stream(0),
        clock: &sidecar.clock,
        clock_uuid: &uuid,
        hostname: "a",
    };
    let req = Request {
        qemu_pid: Some(pid),
        vcpu_source: "names".into(),
        ..Request::default()
    };
    derive(&guest, host, &req).unwrap()
}

fn recording() -> (tempfile::TempDir, Derived) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    write_guest_trace(&dir);
    let mut host = write_host_trace(&dir);
    let d = derive_for(&dir, &mut host, QEMU_A);
    host.finish().unwrap();
    (tmp, d)
}

#[test]
fn guest_a_sees_its_own_vcpus_exits_and_hypercalls() {
    let (_tmp, d) = recording();
    assert!(d.read_errors.is_empty(), "{:?}", d.read_errors);
    assert_eq!(
        d.vcpu_threads,
        [(A_VCPU0, 0), (A_VCPU1, 1)],
        "guest B's thread is not A's"
    );
    assert_eq!(d.guest_cpus.len(), 2);
    let s = &d.summary;
    let v0 = &s.vcpus[0];
    // HLT: 100 ns in KVM, 400 blocked, 200 waiting on host CPU 1, 100 in
    // KVM; then asleep from 3300 to the end of the trace (9650).
    assert_eq!(
        (v0.blocked_ns, v0.preempted_ns, v0.preempted_count),
        (400 + 6_350, 200, 1)
    );
    assert_eq!((v0.exits, v0.truncated), (3, 1));
    assert_eq!(v0.hypervisor_ns, 500 + 100 + 100 + 200);
    let v1 = &s.vcpus[1];
    assert_eq!((v1.preempted_ns, v1.preempted_longest_ns), (6_000, 6_000));
    assert_eq!(
        (v1.truncated, v1.exits),
        (1, 1),
        "the exit without entry is cut at the end"
    );
    let hlt = s.exits.iter().find(|e| e.reason == 12).unwrap();
    assert_eq!(
        (hlt.name.as_str(), hlt.count, hlt.total_ns),
        ("HLT", 1, 800),
        "exit to entry, across CPUs"
    );
    let vmcall = s.exits.iter().find(|e| e.reason == 18).unwrap();
    assert_eq!((vmcall.count, vmcall.total_ns), (2, 700));
    let h = &s.hypercalls;
    assert_eq!((h.count, h.incomplete, h.exit_overhead_max_ns), (3, 1, 500));
    assert_eq!(d.vmsync, 2);
    // The guest threads that lost time: dd on vCPU 1 (preempted by the hog).
    assert_eq!(s.guest_threads[0].comm, "dd");
    assert_eq!(s.guest_threads[0].preempted_ns, 6_000);
    assert_eq!(s.host_tasks[0].comm, "hog");
    assert_eq!((s.host_tasks[0].ns, s.host_tasks[0].took_cpu), (6_000, 1));
}

#[test]
fn the_vm_view_read_back_says_what_the_derivation_said() {
    let (tmp, d) = recording();
    let r = ivtrace_vmview::report::summarize(&tmp.path().join("a/vm")).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.summary, d.summary);
    // 9 intervals (each with its end), 2 vcpu_host_ran, 3 hypercalls.
    assert_eq!(r.events, 9 * 2 + 2 + 3);
}

#[test]
fn guest_b_sees_only_its_own_thread() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    write_guest_trace(&dir);
    let mut host = write_host_trace(&dir);
    let d = derive_for(&dir, &mut host, QEMU_B);
    assert_eq!(d.vcpu_threads, [(B_VCPU0, 0)]);
    let e: Vec<_> = d
        .summary
        .exits
        .iter()
        .map(|e| (e.reason, e.count, e.total_ns))
        .collect();
    assert_eq!(e, [(30, 1, 100)]);
    assert_eq!((d.hypercalls, d.vmsync), (0, 0));
    assert!(d
        .summary
        .vcpus
        .iter()
        .all(|v| v.preempted_ns == 0 && v.host_tids == [B_VCPU0]));
}

#[test]
fn babeltrace2_shows_the_vm_view_between_the_guests_events() {
    if !have_tool("babeltrace2") {
        eprintln!("babeltrace2 not installed: skipping");
        return;
    }
    let (tmp, _) = recording();
    let lines = babeltrace2_lines(&[], &tmp.path().join("a"));
    if std::env::var_os("VMVIEW_PRINT").is_some() {
        eprintln!("{}", lines.join("\n"));
    }
    let pos = |pat: &str| {
        lines
            .iter()
            .position(|l| l.contains(pat))
            .unwrap_or_else(|| panic!("no {pat}:\n{}", lines.join("\n")))
    };
    // The hypercall: one event, the guest thread on vCPU 0 then (spin),
    // its arguments and the exit's overhead.
    let h = &lines[pos("vm_hypercall:")];
    for needle in [
        "guest_comm = \"spin\"",
        "a0 = 0xB",
        "a3 = 0x2C",
        "exit_overhead_ns = 500",
        "vcpu_id = 0",
        "cpu_id = 0",
        "exit_cpu = 0, entry_cpu = 0",
    ] {
        assert!(h.contains(needle), "{needle} in {h}");
    }
    // vCPU 1's preemption sits between dd's switch-in and the end, with
    // the hog that ran meanwhile.
    let p = pos("vcpu_preempted:");
    assert!(lines[p..]
        .iter()
        .any(|l| l.contains("vcpu_host_ran:") && l.contains("host_comm = \"hog\"")));
    let switch_dd = pos("next_comm = \"dd\"");
    let preempt_dd = lines
        .iter()
        .position(|l| l.contains("vcpu_preempted:") && l.contains("guest_comm = \"dd\""))
        .unwrap();
    assert!(switch_dd < preempt_dd);
    // vmsync in the host trace, gh then hg with cnt + 1.
    let gh = pos("vmsync_gh_host:");
    let hg = pos("vmsync_hg_host:");
    assert!(
        gh < hg && lines[gh].contains("cnt = 5") && lines[hg].contains("cnt = 6"),
        "{}\n{}",
        lines[gh],
        lines[hg]
    );
    assert!(lines[gh].contains("vm_uid = 4660"));
    // The VM view is on the guest's clock, time-ordered with the rest.
    let ts: Vec<&str> = lines.iter().map(|l| &l[1..l.find(']').unwrap()]).collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]));
}
