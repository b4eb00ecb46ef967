//! A recording cut by a crash: `ivtrace record` SIGKILLed mid-run leaves
//! a trace whose last packet may be incomplete and whose kernel stream is
//! still staged in `.kernel-wire/`; `ivtrace recover DIR` makes it whole
//! (babeltrace2 reads it, the kernel trace included, and the sidecar
//! says what happened).

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{ivtrace, ivtrace_shm, report_json, run};
use ivtrace_testutil::{have_tool, RegionBuilder};

/// A live region (never closed): kernel events on two CPUs, user events.
fn live_region() -> Vec<u8> {
    let mut r = RegionBuilder::new(3, 8, 4096).kernel(2).build_region();
    r.register_kernel_events();
    r.register_loadgen(0);
    for i in 0..2000u64 {
        let c = (i % 2) as u32;
        let mut p = 42u32.to_le_bytes().to_vec(); // sched_wakeup: tid, prio, target_cpu
        p.extend_from_slice(&[20, 1, 0]);
        r.emit(c, 1000 + i * 50, 1, &p);
        let payload = ivtrace_testutil::TestRegion::loadgen_payload(0, i, b"abcdefgh");
        r.emit(2, 1000 + i * 50, 0, &payload);
    }
    r.bytes
}

/// `ivtrace record` of a [`live_region`] in `dir` into `out`, running.
fn record_live_region(dir: &Path, out: &Path) -> Child {
    let shm = dir.join("live.shm");
    std::fs::write(&shm, live_region()).unwrap();
    ivtrace_shm(&["record"], &shm, out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn sidecar(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("ivtrace.json")).unwrap()).unwrap()
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_recording_is_recovered_kernel_trace_included() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("t");
    let mut rec = record_live_region(tmp.path(), &out);
    let staged = out.join(".kernel-wire/kernel_chan0");
    wait_until("the staged kernel stream", || staged.exists());
    wait_until("the user stream", || out.join("user/user_chan2").exists());
    std::thread::sleep(Duration::from_millis(300));
    rec.kill().unwrap(); // SIGKILL
    rec.wait().unwrap();
    assert_eq!(sidecar(&out)["state"], "recording");
    assert!(!out.join("kernel").exists(), "expanded only at the end");
    // A write the kill cut short: half a packet at the end of a stream file.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(out.join("user/user_chan2"))
        .unwrap();
    let whole = f.metadata().unwrap().len();
    f.write_all(&std::fs::read(out.join("user/user_chan2")).unwrap()[..1000])
        .unwrap();
    drop(f);

    let r = run(ivtrace().arg("recover").arg(&out));
    assert!(r.status.success());
    let side = sidecar(&out);
    assert_eq!(side["state"], "recovered");
    assert!(side["stop_reason"].as_str().unwrap().contains("recover"));
    assert_eq!(
        std::fs::metadata(out.join("user/user_chan2"))
            .unwrap()
            .len(),
        whole
    );
    assert!(!out.join(".kernel-wire").exists());
    let rep = report_json(&out);
    let events: u64 = side["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["events"].as_u64().unwrap())
        .sum();
    assert_eq!(rep["events"].as_u64().unwrap(), events);
    assert!(
        events >= 2 * 8 * 4096 / 40,
        "most of the region was recorded: {events}"
    );
    let kernel: u64 = rep["event_types"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "sched_wakeup")
        .map(|e| e["count"].as_u64().unwrap())
        .sum();
    assert!(kernel > 0, "the kernel trace was expanded");
    if have_tool("babeltrace2") {
        let bt = run(Command::new("babeltrace2").arg(&out));
        assert!(bt.status.success());
        let lines = String::from_utf8_lossy(&bt.stdout).lines().count() as u64;
        assert_eq!(lines, events);
        assert!(String::from_utf8_lossy(&bt.stdout).contains("sched_wakeup"));
    }
}

/// Staged ftrace pages cannot be decoded without the guest's format files
/// (in the region, not in the recording): recovery cuts them to whole
/// packets and keeps them, and says so, instead of deleting them.
#[test]
fn recovery_keeps_staged_ftrace_pages_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("t");
    let mut rec = record_live_region(tmp.path(), &out);
    let staged = out.join(".kernel-wire/kernel_chan0");
    wait_until("the staged kernel stream", || {
        std::fs::metadata(&staged).is_ok_and(|m| m.len() > 0)
    });
    rec.kill().unwrap(); // SIGKILL
    rec.wait().unwrap();
    // Stand-in relay pages: whole packets, then half of one.
    let mut packets = std::fs::read(&staged).unwrap();
    packets.truncate(whole_packets(&packets));
    assert!(!packets.is_empty());
    let mut pages = packets.clone();
    pages.extend_from_slice(&packets[..packets.len().min(1000)]);
    let ftrace = out.join(".kernel-wire/ftrace_chan5");
    std::fs::write(&ftrace, &pages).unwrap();

    let r = run(ivtrace().arg("recover").arg(&out));
    assert!(r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("ftrace pages stay undecoded"));
    assert_eq!(
        std::fs::read(&ftrace).unwrap(),
        packets,
        "cut to whole packets"
    );
    assert!(!staged.exists(), "the kernel stream was expanded");
    let side = sidecar(&out);
    assert_eq!(side["state"], "recovered");
    let warnings = side["warnings"].to_string();
    assert!(warnings.contains("ftrace pages"), "{warnings}");
}

/// Bytes of the whole packets at the start of `b` (the kill may have cut
/// the last one).
fn whole_packets(b: &[u8]) -> usize {
    use ivtrace_region::{abi, packet::PacketHeader};
    let mut off = 0;
    while off + abi::PACKET_HDR_SIZE <= b.len() {
        let size = (PacketHeader::parse(&b[off..]).packet_size / 8) as usize;
        if size < abi::PACKET_HDR_SIZE || off + size > b.len() {
            break;
        }
        off += size;
    }
    off
}
