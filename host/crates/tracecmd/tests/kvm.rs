//! The trace-cmd export of a KVM-like session (examples/kvm_session.rs:
//! host records laid out by this host's real sched and kvm format files,
//! a guest region on a 2.4 GHz clock), read by trace-cmd 3.1.6: every
//! event there, guest and host on one timeline (each guest event inside
//! its vCPU's kvm_entry .. kvm_exit), the losses where they happened, the
//! host file naming the guest's vCPU threads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ivtrace_testutil::have_tool;
use ivtrace_tracecmd::{export, Exported, Options};

#[path = "../examples/kvm_session.rs"]
#[allow(dead_code)]
mod kvm_session;

use kvm_session::{Session, BASE, VCPUS};

fn session() -> (tempfile::TempDir, Session, Exported) {
    let tmp = tempfile::tempdir().unwrap();
    let s = kvm_session::build(&tmp.path().join("web1"));
    let o = Options {
        out: tmp.path().join("tc"),
        force: false,
        policy: Default::default(),
    };
    let e = export(std::slice::from_ref(&s.rec), &o).unwrap();
    (tmp, s, e)
}

fn files(tmp: &Path) -> (PathBuf, PathBuf) {
    (tmp.join("tc/host.dat"), tmp.join("tc/guest-web1.dat"))
}

#[test]
fn every_event_is_written_in_the_kernels_format() {
    let (_tmp, s, e) = session();
    let runs: u64 = s.runs.values().map(|r| r.len() as u64).sum();
    let h = &e.host.events;
    assert_eq!(h["kvm:kvm_entry"], runs);
    assert_eq!(h["kvm:kvm_exit"], runs);
    assert_eq!(h["sched:sched_switch"], s.host_switches);
    assert_eq!(h["sched:sched_wakeup"], s.wakeups);
    let g = &e.guests[0];
    let switches: u64 = s.guest_switches.values().map(|v| v.len() as u64).sum();
    assert_eq!(g.file.events["sched:sched_switch"], switches);
    assert_eq!(g.vcpus, [(0, VCPUS[0]), (1, VCPUS[1])]);
    assert_eq!((e.host.lost, g.file.lost), (s.host_lost, s.guest_lost));
    // The kernel's own formats: the recorded host ones, the built-in guest ones.
    assert_eq!(g.file.classes["kernel:sched_switch"], "sched:sched_switch");
    assert_eq!(e.host.classes["host:kvm_x86_exit"], "kvm:kvm_exit");
    assert!(e.host.kernel_formats >= 4 && g.file.kernel_formats >= 2);
    // The guest's kernel trace counts nanoseconds since the epoch (its
    // 2.4 GHz ticks from BASE converted when it was written), as the host
    // trace does: no shift.
    assert_eq!(g.time_shift_ns, 0);
    assert!(e.read_errors.is_empty() && e.warnings.is_empty(), "{e:?}");
}

/// One line of `trace-cmd report -t` with several inputs.
#[derive(Debug)]
struct Line {
    file: String,
    pid: i32,
    cpu: u32,
    ns: u64,
    event: String,
    info: String,
}

fn parse(out: &str) -> (Vec<Line>, Vec<(String, u32, u64)>) {
    let mut lines = Vec::new();
    let mut dropped = Vec::new();
    let mut file = String::new();
    for l in out.lines() {
        let (f, rest) = match l.split_once(".dat: ") {
            Some((f, r)) => (format!("{}.dat", f.trim()), r),
            None => (file.clone(), l),
        };
        file = f.clone();
        if let Some(d) = rest.trim().strip_prefix("CPU:") {
            let (cpu, n) = d.split_once(" [").unwrap();
            let n = n.trim_end_matches(" EVENTS DROPPED]").parse().unwrap();
            dropped.push((f, cpu.parse().unwrap(), n));
            continue;
        }
        let Some((who, tail)) = rest.split_once(" [") else {
            continue;
        };
        let (cpu, tail) = tail.split_once("] ").unwrap();
        let (ts, tail) = tail.trim().split_once(": ").unwrap();
        let (event, info) = tail.split_once(':').unwrap();
        let (secs, frac) = ts.split_once('.').unwrap();
        let ns = secs.parse::<u64>().unwrap() * 1_000_000_000 + frac.parse::<u64>().unwrap();
        let pid = who.trim().rsplit_once('-').unwrap().1.parse().unwrap();
        lines.push(Line {
            file: f,
            pid,
            cpu: cpu.parse().unwrap(),
            ns,
            event: event.trim().to_string(),
            info: info.trim().to_string(),
        });
    }
    (lines, dropped)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn trace_cmd_reads_guest_and_host_as_one_timeline() {
    if !have_tool("trace-cmd") {
        eprintln!("trace-cmd is not installed: skipped");
        return;
    }
    let (tmp, s, _) = session();
    let (host, guest) = files(tmp.path());
    let text = run(Command::new("trace-cmd")
        .args(["report", "-t", "-i"])
        .arg(&host)
        .arg("-i")
        .arg(&guest));
    let (lines, dropped) = parse(&text);
    let mut in_guest = [false; 2];
    let mut seen: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut last = 0;
    for l in &lines {
        assert!(l.ns >= last, "merged in time order: {l:?}");
        last = l.ns;
        match (l.file.ends_with("host.dat"), l.event.as_str()) {
            (true, "kvm_entry") => in_guest[l.cpu as usize] = true,
            (true, "kvm_exit") => in_guest[l.cpu as usize] = false,
            (false, "sched_switch") => {
                // A guest runs only between its vCPU's entry and exit.
                assert!(
                    in_guest[l.cpu as usize],
                    "guest event outside its vCPU's run: {l:?}"
                );
                seen.entry(l.cpu).or_default().push(l.ns - BASE);
            }
            _ => {}
        }
        if l.event == "kvm_entry" || l.event == "kvm_exit" {
            assert_eq!(l.pid, VCPUS[l.cpu as usize], "{l:?}");
            assert!(l.info.contains(&format!("vcpu {}", l.cpu)) || l.event == "kvm_exit");
        }
    }
    // To the nanosecond, the host times the guest's events happened at.
    assert_eq!(seen, s.guest_switches);
    let host = host.display().to_string();
    assert!(dropped.contains(&(host, 0, 5)), "{dropped:?}");
    assert!(dropped
        .iter()
        .any(|d| d.0.ends_with("guest-web1.dat") && d.1 == 1 && d.2 == 1));
}

#[test]
fn trace_cmd_stat_hist_and_dump_run_on_the_files() {
    if !have_tool("trace-cmd") {
        eprintln!("trace-cmd is not installed: skipped");
        return;
    }
    let (tmp, _, e) = session();
    let (host, guest) = files(tmp.path());
    let stat = run(Command::new("trace-cmd")
        .args(["report", "--stat", "-i"])
        .arg(&host)
        .arg("-i")
        .arg(&guest));
    assert!(stat.contains("dropped events: 5"), "{stat}");
    let hist = run(Command::new("trace-cmd").args(["hist", "-i"]).arg(&guest));
    assert!(hist.contains("sched_switch"), "{hist}");
    let opts = run(Command::new("trace-cmd")
        .args(["dump", "--options"])
        .arg(&host));
    // GUEST: the guest's name, its trace id, each vCPU's host thread.
    for (v, tid) in VCPUS.iter().enumerate() {
        assert!(
            opts.contains(&format!("{v} {tid} [guest cpu, host pid]")),
            "{opts}"
        );
    }
    assert!(
        opts.contains(&format!("{:#X}", e.guests[0].file.trace_id)),
        "{opts}"
    );
    let opts = run(Command::new("trace-cmd")
        .args(["dump", "--options"])
        .arg(&guest));
    assert!(
        opts.contains(&format!("{:#X} [peer's trace id]", e.host.trace_id)),
        "{opts}"
    );
    assert!(
        opts.contains(&format!("{BASE} 1 0 0")),
        "time shift: {opts}"
    );
}

#[test]
fn a_damaged_stream_is_reported_and_the_rest_exported() {
    let tmp = tempfile::tempdir().unwrap();
    let s = kvm_session::build(&tmp.path().join("web1"));
    // A crash mid-write: the guest's CPU 1 stream cut inside a packet.
    let f = s.rec.join("kernel/kernel_chan1");
    let len = std::fs::metadata(&f).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(len / 2 + 100).unwrap();
    let o = Options {
        out: tmp.path().join("tc"),
        force: false,
        policy: Default::default(),
    };
    let e = export(std::slice::from_ref(&s.rec), &o).unwrap();
    assert_eq!(e.read_errors.len(), 1, "{:?}", e.read_errors);
    assert!(
        e.read_errors[0].contains("kernel_chan1"),
        "{:?}",
        e.read_errors
    );
    let cpus: Vec<u64> = e.guests[0].file.cpus.iter().map(|c| c.events).collect();
    let want = |c: u32| s.guest_switches[&c].len() as u64;
    assert!(cpus[0] >= want(0) && cpus[1] < want(1), "{cpus:?}");
    // An export over files already there needs --force.
    let again = export(std::slice::from_ref(&s.rec), &o).unwrap_err();
    assert!(format!("{again:#}").contains("--force"), "{again:#}");
}
