//! A KVM-like host-guest recording and its trace-cmd export, for the
//! readers that need KVM events (KernelShark's KVM combo plot, the tests of
//! tracecmd's merged timeline): this machine's guests run under TCG, where
//! kvm_entry/kvm_exit never fire (docs/kvm.md), so the host side is built
//! the way `--host-events` records it from records laid out by this host's
//! real format files (sched_switch, sched_wakeup, kvm_entry, kvm_exit:
//! ivtrace-tracefs's fixtures), decoded by the recorder's decoder into the
//! host trace; the guest side is a region written by the C writer's model
//! (ivtrace-testutil) on a 2.4 GHz clock, drained as the recorder drains.
//!
//! Two vCPUs (threads `CPU 0/KVM`, `CPU 1/KVM` of QEMU pid 4000) on host
//! CPUs 0 and 1 enter and leave the guest for 400 ms: runs of 100-500 us
//! ended by an external interrupt, an I/O exit or a HLT (the thread then
//! sleeps 2 ms); the guest's kernel switches tasks only while its vCPU runs.
//! Halfway through, host CPU 0's ring loses 5 events and guest CPU 1 drops
//! an event too large for a packet: both are counted losses.
//!
//! Usage: cargo run --release -p ivtrace-tracecmd --example kvm_session -- OUT
//! (OUT/rec the recording, OUT/trace-cmd the export).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use ivtrace_ctf::host_trace::{HostTrace, HostTraceDesc, STREAM_KERNEL};
use ivtrace_ctf::sidecar::{Sidecar, TracefsFormats};
use ivtrace_testutil::{sched_switch_payload, task_rename_payload, RegionBuilder, TestRegion};
use ivtrace_tracefs::decode::Decoder;
use ivtrace_tracefs::format::{parse_event, parse_header_page, EventFmt, HeaderPage};
use ivtrace_tracefs::page::{build_record, walk, PageBuilder};
use ivtrace_tracefs::statedump::{self, process_state_payload, ThreadState};

/// The guest region's clock maps its tick 0 to this host time.
pub const BASE: u64 = 1_700_000_000_000_000_000;
pub const GUEST_HZ: u64 = 2_400_000_000;
pub const QEMU: i32 = 4000;
pub const VCPUS: [i32; 2] = [4001, 4002];
pub const SPAN_NS: u64 = 400_000_000;
/// Exit reasons, in turn: EXTERNAL_INTERRUPT, IO_INSTRUCTION, HLT.
pub const REASONS: [u64; 3] = [1, 30, 12];
const HLT: u64 = 12;
const RIP: u64 = 0xffff_ffff_8100_2000;

/// What the session holds, for the tests' expectations.
#[derive(Debug, Default)]
pub struct Session {
    pub rec: PathBuf,
    /// Per vCPU: (entry, exit) host times of its runs in the guest.
    pub runs: BTreeMap<u32, Vec<(u64, u64)>>,
    /// Per guest CPU: host times of its context switches.
    pub guest_switches: BTreeMap<u32, Vec<u64>>,
    pub host_switches: u64,
    pub wakeups: u64,
    /// Events lost on host CPU 0 and on guest CPU 1, halfway through.
    pub host_lost: u64,
    pub guest_lost: u64,
}

/// Where the losses happen (ns after BASE).
pub const LOSS_AT: u64 = SPAN_NS / 2;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tracefs/tests/fixtures/tracefs")
}

fn text(name: &str) -> String {
    fs::read_to_string(fixtures().join(name)).expect("a tracefs fixture")
}

struct Formats {
    switch: EventFmt,
    wakeup: EventFmt,
    exit: EventFmt,
    entry: EventFmt,
}

impl Formats {
    fn load() -> Formats {
        let f = |sys, name: &str| parse_event(sys, &text(&format!("{name}.format"))).unwrap();
        Formats {
            switch: f("sched", "sched_switch"),
            wakeup: f("sched", "sched_wakeup"),
            exit: f("kvm", "kvm_exit"),
            entry: f("kvm", "kvm_entry"),
        }
    }

    fn recorded(&self) -> TracefsFormats {
        let mut events = BTreeMap::new();
        for (sys, name) in [
            ("sched", "sched_switch"),
            ("sched", "sched_wakeup"),
            ("kvm", "kvm_exit"),
            ("kvm", "kvm_entry"),
        ] {
            events.insert(format!("{sys}/{name}"), text(&format!("{name}.format")));
        }
        TracefsFormats {
            header_page: text("header_page"),
            events,
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
        let texts = [("prev_comm", prev.1), ("next_comm", next.1)];
        build_record(&self.switch, prev.0, &ints, &texts)
    }
}

/// Records at times (ns after BASE).
type Timed = Vec<(u64, Vec<u8>)>;

/// One vCPU's host records and its runs in the guest.
fn vcpu_records(f: &Formats, v: u32) -> (Timed, Vec<(u64, u64)>) {
    let tid = VCPUS[v as usize];
    let me = (tid, if v == 0 { "CPU 0/KVM" } else { "CPU 1/KVM" });
    let idle = (0, if v == 0 { "swapper/0" } else { "swapper/1" });
    let (mut recs, mut runs) = (Vec::new(), Vec::new());
    let mut t = 1_000_000 + v as u64 * 37_000;
    let mut k = 0u64;
    while t < SPAN_NS {
        let run = 100_000 + (k * 7919 + v as u64 * 104_729) % 400_000;
        let reason = REASONS[(k % 3) as usize];
        let entry = [("vcpu_id", v as u64), ("rip", RIP)];
        recs.push((t, build_record(&f.entry, tid, &entry, &[])));
        let exit = [
            ("exit_reason", reason),
            ("guest_rip", RIP + k),
            ("isa", 1),
            ("vcpu_id", v as u64),
        ];
        recs.push((t + run, build_record(&f.exit, tid, &exit, &[])));
        runs.push((t, t + run));
        t += run;
        if reason == HLT {
            recs.push((t + 5_000, f.switch(me, 1, idle)));
            let woken = t + 2_000_000;
            let wake = [("pid", tid as u64), ("prio", 120), ("target_cpu", v as u64)];
            let comm = [("comm", me.1)];
            recs.push((woken, build_record(&f.wakeup, 0, &wake, &comm)));
            recs.push((woken + 3_000, f.switch(idle, 0, me)));
            t = woken + 8_000;
        } else {
            t += 20_000;
        }
        k += 1;
    }
    (recs, runs)
}

/// `DIR/host` as `--host-events` writes it: each CPU's records in pages,
/// decoded by the recorder's decoder; the QEMU threads' state dump.
fn write_host(dir: &Path, f: &Formats, s: &mut Session) {
    let fmts = [&f.switch, &f.wakeup, &f.exit, &f.entry];
    let with_ids: Vec<(EventFmt, u32)> = fmts
        .iter()
        .enumerate()
        .map(|(i, x)| ((*x).clone(), 100 + i as u32))
        .collect();
    let (decoder, mut classes) = Decoder::new(&with_ids);
    classes.extend(statedump::classes());
    let env = vec![(
        "ivtrace_qemu_pid".into(),
        ivtrace_ctf::EnvValue::Int(QEMU as i64),
    )];
    let desc = HostTraceDesc {
        hostname: "kvmhost",
        trace_name: "kvm-host",
        error_ns: 1,
        env,
    };
    let root = ivtrace_ctf::OutDir::root(dir, &Default::default()).unwrap();
    let mut t = HostTrace::create(&root, "host", &desc, classes).unwrap();
    let dump = t.add_stream(STREAM_KERNEL, 0, "host_statedump").unwrap();
    for (v, &tid) in VCPUS.iter().enumerate() {
        let mut name = [0u8; 16];
        let n = format!("CPU {v}/KVM");
        name[..n.len()].copy_from_slice(n.as_bytes());
        let th = ThreadState {
            tid,
            pid: QEMU,
            ppid: 1,
            name,
            state: b'S',
            cpu: v as u32,
        };
        let p = process_state_payload(&th, 4026531836);
        t.event(dump, statedump::PROCESS_STATE, BASE, 0, &p)
            .unwrap();
    }
    let hp = parse_header_page(&text("header_page")).unwrap();
    for v in 0..2u32 {
        let (recs, runs) = vcpu_records(f, v);
        s.runs.insert(v, runs);
        let stream = t
            .add_stream(STREAM_KERNEL, v, &format!("host_cpu{v}"))
            .unwrap();
        let mut lost = v != 0;
        for page in pages(&hp, &recs) {
            if !lost && ivtrace_region::bytes::le_u64(&page, 0) >= BASE + LOSS_AT {
                // As the recorder does for a page that says events were missed.
                t.flush().unwrap();
                t.discarded(stream, 5).unwrap();
                s.host_lost += 5;
                lost = true;
            }
            let info = walk(&page, &hp, |ts, rec| {
                let d = decoder.decode(rec).expect("a known record");
                s.host_switches += (d.class_id == 100) as u64;
                s.wakeups += (d.class_id == 101) as u64;
                t.event(stream, d.class_id, ts, d.tid, &d.payload).unwrap();
            });
            assert!(!info.malformed);
        }
    }
    t.finish().unwrap();
}

/// `recs` (ns after BASE) in as many pages as they take.
fn pages(hp: &HeaderPage, recs: &[(u64, Vec<u8>)]) -> Vec<Vec<u8>> {
    let mut sorted = recs.to_vec();
    sorted.sort_by_key(|r| r.0);
    let mut out = Vec::new();
    let mut page: Option<PageBuilder> = None;
    for (ts, r) in sorted {
        let ts = BASE + ts;
        if page.as_ref().is_some_and(|p| !p.fits(ts, r.len())) {
            out.push(page.take().expect("checked").finish());
        }
        page.get_or_insert_with(|| PageBuilder::new(*hp, 4096, ts))
            .record(ts, &r, false);
    }
    out.extend(page.map(PageBuilder::finish));
    out
}

fn guest_ticks(host_ns_after_base: u64) -> u64 {
    (host_ns_after_base as u128 * GUEST_HZ as u128 / 1_000_000_000) as u64
}

/// The guest: on each CPU, while its vCPU runs, a context switch every
/// ~60 us between two tasks; drained as the recorder drains (DIR/kernel).
fn write_guest(dir: &Path, s: &mut Session) {
    let mut b = RegionBuilder::new(3, 64, 16384).kernel(2);
    b.freq_hz = GUEST_HZ;
    let mut r: TestRegion = b.build_region();
    r.register_kernel_events();
    let (rename, switch) = (task_rename_payload, sched_switch_payload);
    for cpu in 0..2u32 {
        let (a, b) = (100 + 2 * cpu, 101 + 2 * cpu);
        let first = s.runs[&cpu][0].0;
        r.emit(
            cpu,
            guest_ticks(first),
            20,
            &rename(a, &format!("worker{cpu}a")),
        );
        r.emit(
            cpu,
            guest_ticks(first),
            20,
            &rename(b, &format!("worker{cpu}b")),
        );
        let mut on = a;
        let mut times = Vec::new();
        for &(entry, exit) in &s.runs[&cpu] {
            let mut t = entry + 10_000;
            while t + 10_000 < exit {
                if cpu == 1 && s.guest_lost == 0 && t >= LOSS_AT {
                    assert!(
                        !r.emit(cpu, guest_ticks(t), 0, &[0; 20_000]),
                        "too big: dropped"
                    );
                    s.guest_lost += 1;
                }
                let next = if on == a { b } else { a };
                assert!(r.emit(cpu, guest_ticks(t), 0, &switch(on, next)));
                times.push(t);
                on = next;
                t += 60_000;
            }
        }
        s.guest_switches.insert(cpu, times);
        r.close(cpu);
    }
    r.close_region();
    ivtrace_engine::session::drain_bytes_to_dir(&r.bytes, dir).unwrap();
}

/// The recording in `dir` (created): guest, host, and the host's formats
/// in the sidecar as serve keeps them.
pub fn build(dir: &Path) -> Session {
    let mut s = Session {
        rec: dir.to_path_buf(),
        ..Session::default()
    };
    let f = Formats::load();
    // The host's runs first: the guest runs only inside them.
    for v in 0..2u32 {
        s.runs.insert(v, vcpu_records(&f, v).1);
    }
    write_guest(dir, &mut s);
    write_host(dir, &f, &mut s);
    let side = dir.join("ivtrace.json");
    let mut sidecar: Sidecar = serde_json::from_slice(&fs::read(&side).unwrap()).unwrap();
    sidecar.tracefs_formats.host = Some(f.recorded());
    fs::write(&side, serde_json::to_vec_pretty(&sidecar).unwrap()).unwrap();
    s
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "kvm-session".into()),
    );
    let rec = out.join("rec");
    if rec.exists() {
        fs::remove_dir_all(&rec)?;
    }
    let s = build(&rec);
    let o = ivtrace_tracecmd::Options {
        out: out.join("trace-cmd"),
        force: true,
        policy: Default::default(),
    };
    let e = ivtrace_tracecmd::export(&[rec], &o)?;
    println!("{}", serde_json::to_string_pretty(&e)?);
    let runs: usize = s.runs.values().map(Vec::len).sum();
    eprintln!(
        "kvm_session: {runs} vCPU runs, host and guest files in {}",
        o.out.display()
    );
    Ok(())
}
