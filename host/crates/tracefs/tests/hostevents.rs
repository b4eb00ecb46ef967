//! Host events on recorded data (tests/fixtures/tracefs, captured on this
//! kind of machine by capture.py): real sched_switch sub-buffers decoded
//! against the kernel's own text view, kvm_exit/kvm_entry/kvm_hypercall
//! records built from this host's real format files (they never fire here:
//! the guests run under TCG, /dev/kvm is PVM-backed), and the merge of a
//! host trace with a guest trace by babeltrace2.

use std::fs;
use std::path::{Path, PathBuf};

use ivtrace_ctf::host_trace::{HostTrace, HostTraceDesc, STREAM_KERNEL};
use ivtrace_region::bytes;
use ivtrace_testutil::{babeltrace2_lines, have_tool, RegionBuilder};
use ivtrace_tracefs::decode::Decoder;
use ivtrace_tracefs::format::{parse_event, parse_header_page, EventFmt, HeaderPage};
use ivtrace_tracefs::page::{build_record, walk, PageBuilder};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tracefs")
}

fn fmt(system: &str, file: &str) -> EventFmt {
    parse_event(system, &fs::read_to_string(fixtures().join(file)).unwrap()).unwrap()
}

fn header_page() -> HeaderPage {
    parse_header_page(&fs::read_to_string(fixtures().join("header_page")).unwrap()).unwrap()
}

fn le_i32(b: &[u8], at: usize) -> i32 {
    bytes::i32_at(b, at).unwrap()
}

fn le_i64(b: &[u8], at: usize) -> i64 {
    bytes::int_at(b, at, 8).unwrap()
}

fn comm(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap()).into_owned()
}

/// (cpu, ts_ns, payload) of every record in the captured pages.
fn captured(decoder: &Decoder) -> Vec<(u32, u64, i32, Vec<u8>)> {
    let hp = header_page();
    let mut out = Vec::new();
    for cpu in 0..8u32 {
        let Ok(raw) = fs::read(fixtures().join(format!("cpu{cpu}.raw"))) else {
            continue;
        };
        for page in raw.chunks(4096) {
            let info = walk(page, &hp, |ts, rec| {
                let d = decoder.decode(rec).expect("a sched_switch record");
                out.push((cpu, ts, d.tid, d.payload));
            });
            assert!(!info.malformed, "cpu{cpu}: {info:?}");
        }
    }
    out
}

#[test]
fn captured_sched_switch_pages_match_the_kernels_text() {
    let f = fmt("sched", "sched_switch.format");
    let (decoder, classes) = Decoder::new(&[(f, 100)]);
    assert_eq!(classes[0].name, "sched_switch");
    let got = captured(&decoder);
    let expected = fs::read_to_string(fixtures().join("sched_switch.expected")).unwrap();
    let expected: Vec<Vec<&str>> = expected
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\t').collect())
        .collect();
    assert!(expected.len() >= 50, "fixture too small");
    assert_eq!(got.len(), expected.len());
    let state = |s: &str| -> i64 {
        match s.trim_end_matches('+') {
            "R" => 0,
            "S" => 1,
            "D" => 2,
            "T" => 4,
            "t" => 8,
            "X" => 16,
            "Z" => 32,
            "P" => 64,
            "I" => 128,
            other => panic!("state {other}"),
        }
    };
    // Per CPU, in order (the text view is merged by time).
    for cpu in 0..8u32 {
        let g: Vec<_> = got.iter().filter(|e| e.0 == cpu).collect();
        let e: Vec<_> = expected
            .iter()
            .filter(|e| e[0].parse::<u32>().unwrap() == cpu)
            .collect();
        assert_eq!(g.len(), e.len(), "cpu {cpu}");
        for ((_, ts, tid, p), x) in g.iter().zip(e) {
            // The text shows microseconds, rounded (ns2usecs adds 500).
            assert_eq!((*ts + 500) / 1000, x[1].parse::<u64>().unwrap() / 1000);
            assert_eq!(comm(&p[0..16]), x[2]);
            assert_eq!(le_i32(p, 16).to_string(), x[3]);
            assert_eq!(le_i32(p, 20) + 100, x[4].parse::<i32>().unwrap());
            assert_eq!(le_i64(p, 24), state(x[5]), "{x:?}");
            assert_eq!(comm(&p[32..48]), x[6]);
            assert_eq!(le_i32(p, 48).to_string(), x[7]);
            assert_eq!(le_i32(p, 52) + 100, x[8].parse::<i32>().unwrap());
            assert_eq!(*tid, le_i32(p, 16), "common_pid is the previous task");
        }
    }
}

/// kvm_* samples: decoded fields follow whichever format file is given.
#[test]
fn kvm_records_decode_with_the_running_kernels_layout() {
    let exit = fmt("kvm", "kvm_exit.format");
    let entry = fmt("kvm", "kvm_entry.format");
    let hyper = fmt("kvm", "kvm_hypercall.format");
    let entry61 = fmt("kvm", "kvm_entry-6.1.192.format");
    assert_ne!(
        entry.fields.len(),
        entry61.fields.len(),
        "the two kvm_entry layouts differ (the reason formats are parsed at run time)"
    );
    let (d, classes) = Decoder::new(&[
        (exit.clone(), 101),
        (entry.clone(), 102),
        (hyper.clone(), 103),
    ]);
    let names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["kvm_x86_exit", "kvm_x86_entry", "kvm_x86_hypercall"]
    );
    let hp = header_page();
    let mut b = PageBuilder::new(hp, 4096, 5_000_000_000);
    // A guest vmcall: exit (VMX reason 18), hypercall, entry.
    b.record(
        5_000_000_100,
        &build_record(
            &exit,
            4242,
            &[
                ("exit_reason", 18),
                ("guest_rip", 0xffff_ffff_8100_1234),
                ("isa", 1),
                ("vcpu_id", 1),
            ],
            &[],
        ),
        false,
    );
    b.record(
        5_000_000_400,
        &build_record(&hyper, 4242, &[("nr", 0x1f7a), ("a0", 7)], &[]),
        false,
    );
    b.record(
        5_000_000_900,
        &build_record(
            &entry,
            4242,
            &[("vcpu_id", 1), ("rip", 0xffff_ffff_8100_1237)],
            &[],
        ),
        false,
    );
    let page = b.finish();
    let mut got = Vec::new();
    walk(&page, &hp, |ts, rec| got.push((ts, d.decode(rec).unwrap())));
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].1.class_id, 101);
    assert_eq!(got[0].1.tid, 4242);
    let p = &got[0].1.payload;
    assert_eq!(bytes::le_u32(p, 0), 18);
    assert_eq!(bytes::le_u64(p, 4), 0xffff_ffff_8100_1234);
    assert_eq!(got[1].1.class_id, 103);
    assert_eq!(bytes::le_u64(&got[1].1.payload, 0), 0x1f7a);
    assert_eq!(got[2].0, 5_000_000_900);
    // The 6.1.y layout decodes too (vcpu_id, rip, immediate_exit).
    let (d61, c61) = Decoder::new(&[(entry61.clone(), 102)]);
    let f61: Vec<&str> = c61[0].fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(f61, ["vcpu_id", "rip", "immediate_exit"]);
    let r = build_record(
        &entry61,
        1,
        &[("vcpu_id", 3), ("rip", 0x1000), ("immediate_exit", 1)],
        &[],
    );
    let p = d61.decode(&r).unwrap().payload;
    assert_eq!(p, [3, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 1]);
}

/// kvm_write_tsc_offset records built from this host's format file, on a
/// page, walked and read as writes: the versioned mapping follows them (a
/// guest reset of its TSC on vCPU 0, then vCPU 1 following), and a record
/// whose `previous` is not the offset in force is counted, not applied.
#[test]
fn tsc_offset_writes_on_a_page_version_the_guest_clock() {
    use ivtrace_time::kvm::{HostSample, VcpuTsc};
    use ivtrace_time::versioned::{HostTscLine, VersionedTsc};
    use ivtrace_tracefs::kvmtsc::tsc_write;

    let f = fmt("kvm", "kvm_write_tsc_offset.format");
    let (d, classes) = Decoder::new(&[(f.clone(), 104)]);
    assert_eq!(classes[0].name, "kvm_write_tsc_offset");
    // Host: a 2.5 GHz TSC; host ns t0 at TSC 1e12 (page times are host ns here).
    let t0 = 5_000_000_000u64;
    let a = HostSample {
        tsc: 1_000_000_000_000,
        ns: t0,
        gap_ticks: 10,
    };
    let b = HostSample {
        tsc: a.tsc + 25_000_000_000,
        ns: t0 + 10_000_000_000,
        gap_ticks: 10,
    };
    let line = HostTscLine::through(a, b).unwrap();
    let start = VcpuTsc {
        offset: -(a.tsc as i64),
        ratio: 1 << 48,
        frac_bits: 48,
    };
    let mut m = VersionedTsc::new(line, t0, &[(0, start), (1, start)]).unwrap();
    // 1 s in, vCPU 0's TSC is written back to 0 (the guest's write of
    // IA32_TSC at reset); vCPU 1 follows 2 us later; then a bogus record.
    let w1 = t0 + 1_000_000_000;
    let reset = 0u64.wrapping_sub(line.tsc_at(w1).unwrap());
    let prev = start.offset as u64;
    let hp = header_page();
    let mut page = PageBuilder::new(hp, 4096, t0);
    let rec = |vcpu: u64, p: u64, n: u64| {
        let r = [
            ("vcpu_id", vcpu),
            ("previous_tsc_offset", p),
            ("next_tsc_offset", n),
        ];
        build_record(&f, 4242, &r, &[])
    };
    page.record(w1, &rec(0, prev, reset), false);
    page.record(w1 + 2_000, &rec(1, prev, reset), false);
    page.record(w1 + 3_000, &rec(1, 12345, 0), false);
    let page = page.finish();
    let mut rejected = Vec::new();
    walk(&page, &hp, |ts, r| {
        assert_eq!(
            d.decode(r).unwrap().class_id,
            104,
            "the host trace gets it too"
        );
        let w = tsc_write(&f, ts, r).expect("a kvm_write_tsc_offset record");
        if let Err(e) = m.apply(&w) {
            rejected.push(e);
        }
    });
    assert_eq!(rejected.len(), 1, "the record from an offset not in force");
    assert_eq!(m.writes_rejected, 1);
    assert_eq!((m.versions(0).len(), m.versions(1).len()), (2, 2));
    // A guest tick 0.5 s after the reset (1.25e9 ticks) is host t0 + 1.5 s,
    // exactly; one from before the reset keeps version 0's mapping.
    // In stream order: an event 0.9 s in, then one after the reset (its
    // tick went back: the next version).
    let before = start.guest_at(line.tsc_at(t0 + 900_000_000).unwrap());
    assert_eq!(m.version_of(0, 0, None, before), Some(0));
    assert_eq!(m.host_ns(0, 0, before), Some(t0 + 900_000_000));
    let after = 1_250_000_000u64;
    let v = m.version_of(0, 0, Some(before), after).unwrap();
    assert_eq!((v, m.host_ns(0, v, after)), (1, Some(w1 + 500_000_000)));
    // A short record is no write (hostile data, never a panic).
    let short = rec(0, prev, reset);
    assert_eq!(tsc_write(&f, w1, &short[..20]), None);
}

/// Host time = monotonic capture time + an offset onto 2023-11-14.
const BASE: u64 = 1_700_000_000_000_000_000;

/// DIR/host/ from the captured sched_switch events (host time: BASE plus
/// their monotonic time since `t0`) and three kvm exits mid-window on a
/// third CPU. Returns the sched_switch events written.
fn write_host_trace(dir: &Path, t0: u64, t1: u64) -> usize {
    let sched = fmt("sched", "sched_switch.format");
    let exit = fmt("kvm", "kvm_exit.format");
    let (decoder, classes) = Decoder::new(&[(sched, 100), (exit.clone(), 101)]);
    let events = captured(&decoder);
    let host = |mono: u64| BASE + (mono - t0);
    let desc = HostTraceDesc {
        hostname: "host",
        trace_name: "fixture-host",
        error_ns: 1,
        env: vec![],
    };
    let root = ivtrace_ctf::OutDir::root(dir, &Default::default()).unwrap();
    let mut t = HostTrace::create(&root, "host", &desc, classes).unwrap();
    let s0 = t.add_stream(STREAM_KERNEL, 0, "host_cpu0").unwrap();
    let s1 = t.add_stream(STREAM_KERNEL, 1, "host_cpu1").unwrap();
    for (cpu, ts, tid, p) in &events {
        t.event(if *cpu == 0 { s0 } else { s1 }, 100, host(*ts), *tid, p)
            .unwrap();
    }
    let mid = t0 + (t1 - t0) / 2;
    let kstream = t.add_stream(STREAM_KERNEL, 2, "host_cpu2").unwrap();
    for k in 0..3u64 {
        let d = decoder
            .decode(&build_record(&exit, 4242, &[("exit_reason", 18)], &[]))
            .unwrap();
        t.event(kstream, d.class_id, host(mid + k * 1000), d.tid, &d.payload)
            .unwrap();
    }
    t.finish().unwrap();
    events.len()
}

/// The guest: one user channel, events every ~(window / 10) ticks at
/// 1 GHz, the header's reference pair mapping tick 0 to BASE; drained
/// into DIR/user/ as the recorder does.
fn write_guest_trace(dir: &Path, span: u64) {
    let mut r = RegionBuilder::new(1, 4, 4096).build_region();
    r.register(
        1,
        0,
        "guest_mark",
        &[("n", ivtrace_region::abi::IVT_FT_U64, 0)],
    );
    for n in 0..10u64 {
        assert!(r.emit(0, span * n / 10 + 1, 0, &n.to_le_bytes()));
    }
    r.close(0);
    r.close_region();
    let mut bytes = r.bytes.clone();
    let at = ivtrace_region::abi::hdr::CLOCK + ivtrace_region::abi::clock::REF_REALTIME_NS;
    bytes[at..at + 8].copy_from_slice(&BASE.to_le_bytes());
    ivtrace_engine::session::drain_bytes_to_dir(&bytes, dir).unwrap();
}

/// The captured host events and kvm samples in DIR/host/, a guest trace in
/// DIR/user/ whose clock maps into the same window: babeltrace2 DIR reads
/// both and interleaves them by time.
#[test]
fn host_and_guest_traces_merge_in_babeltrace2() {
    if !have_tool("babeltrace2") {
        eprintln!("babeltrace2 not installed: skipping the merge check");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (decoder, _) = Decoder::new(&[(fmt("sched", "sched_switch.format"), 100)]);
    let times: Vec<u64> = captured(&decoder).iter().map(|e| e.1).collect();
    let (t0, t1) = (*times.iter().min().unwrap(), *times.iter().max().unwrap());
    let switches = write_host_trace(dir, t0, t1);
    write_guest_trace(dir, t1 - t0);

    let lines = babeltrace2_lines(&["--clock-seconds"], dir);
    let count = |name: &str| {
        lines
            .iter()
            .filter(|l| l.contains(&format!(" {name}: ")))
            .count()
    };
    assert_eq!(count("sched_switch"), switches);
    assert_eq!(count("kvm_x86_exit"), 3);
    assert_eq!(count("guest_mark"), 10);
    // Globally time-ordered, and guest events interleave with host ones.
    let ts: Vec<f64> = lines
        .iter()
        .map(|l| l[1..l.find(']').unwrap()].parse::<f64>().unwrap())
        .collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    let first_guest = lines
        .iter()
        .position(|l| l.contains(" guest_mark: "))
        .unwrap();
    let last_guest = lines
        .iter()
        .rposition(|l| l.contains(" guest_mark: "))
        .unwrap();
    assert!(lines[first_guest..last_guest]
        .iter()
        .any(|l| l.contains(" sched_switch: ")));
    assert!(lines
        .iter()
        .any(|l| l.contains("prev_tid = ") && l.contains("_tid = ")));
}
