//! End to end: regions (from the Rust writer model, and from the C
//! library's ivtrace-loadgen when it is built) -> `ivtrace` -> CTF read
//! back by babeltrace2 and Python bt2, plus exit codes and messages.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{ivtrace, ivtrace_shm, report_json, run};
use ivtrace_region::abi;
use ivtrace_testutil::{babeltrace2_lines, have_tool, RegionBuilder, TestRegion};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

fn loadgen() -> Option<PathBuf> {
    ["bin/ivtrace-loadgen", "guest/lib/build/ivtrace-loadgen"]
        .iter()
        .map(|p| repo().join(p))
        .find(|p| p.is_file())
}

/// (events, discarded events) as Python bt2 sees the trace.
fn bt2_counts(dir: &Path) -> Option<(u64, u64)> {
    if !Path::new("/usr/bin/python3").exists() {
        return None;
    }
    let script = r#"
import sys
try:
    import bt2
except ImportError:
    print("no-bt2"); sys.exit(0)
ev = disc = 0
for m in bt2.TraceCollectionMessageIterator(sys.argv[1]):
    if type(m) is bt2._EventMessageConst: ev += 1
    elif type(m) is bt2._DiscardedEventsMessageConst:
        assert m.count is not None, "discarded events without a count"
        disc += m.count
print(ev, disc)
"#;
    let out = run(Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(dir));
    assert!(out.status.success(), "bt2 failed to read {}", dir.display());
    let text = String::from_utf8(out.stdout).unwrap();
    if text.trim() == "no-bt2" {
        eprintln!("SKIP bt2 check: python3-bt2 is not installed");
        return None;
    }
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    Some((v[0], v[1]))
}

/// Events babeltrace2's CLI prints (it must also exit 0).
fn babeltrace_events(dir: &Path) -> Option<u64> {
    if !have_tool("babeltrace2") {
        eprintln!("SKIP babeltrace2 check: babeltrace2 is not installed");
        return None;
    }
    Some(
        babeltrace2_lines(&[], dir)
            .iter()
            .filter(|l| !l.is_empty())
            .count() as u64,
    )
}

/// A closed region with `n` events on two channels, some dropped.
fn model_region(path: &Path, n: u64) -> (u64, u64) {
    let mut r = RegionBuilder::new(2, 2, 4096).build_region();
    r.register_loadgen(0);
    r.register(
        1,
        33,
        "demo:text",
        &[("msg", abi::IVT_FT_STRING, 0), ("v", abi::IVT_FT_S64, 0)],
    );
    r.register(1, 5, "demo:tick", &[]);
    let mut kept = 0;
    for i in 0..n {
        let c = (i % 2) as u32;
        let ok = if i % 11 == 0 {
            r.emit(c, 1000 + i * 50, 5, &[])
        } else if i % 7 == 0 {
            r.emit(
                c,
                1000 + i * 50,
                33,
                &[&b"hi\xff\0"[..], &(-(i as i64)).to_le_bytes()].concat(),
            )
        } else {
            r.emit(
                c,
                1000 + i * 50,
                0,
                &TestRegion::loadgen_payload(c as u16, i, &[1, 2, 3]),
            )
        };
        kept += ok as u64;
    }
    r.close_region();
    std::fs::write(path, &r.bytes).unwrap();
    (kept, n - kept)
}

#[test]
fn record_writes_ctf_that_babeltrace2_reads_with_every_loss_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("region");
    let out = tmp.path().join("trace");
    let (kept, dropped) = model_region(&shm, 1500);
    assert!(dropped > 0);
    let o = run(&mut ivtrace_shm(&["record"], &shm, &out));
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{kept} events")));
    assert!(out.join("user/metadata").is_file() && out.join("ivtrace.json").is_file());
    let rep = report_json(&out);
    assert_eq!(rep["events"], kept);
    assert_eq!(rep["discarded"], dropped);
    if let Some(n) = babeltrace_events(&out) {
        assert_eq!(
            n, kept,
            "babeltrace2 prints every event and ignores ivtrace.json"
        );
    }
    if let Some((ev, disc)) = bt2_counts(&out) {
        assert_eq!((ev, disc), (kept, dropped));
    }
}

#[test]
fn exit_codes_and_messages_follow_the_documentation() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("region");
    let mut r = RegionBuilder::new(1, 2, 4096).build_region();
    r.close_region();
    std::fs::write(&shm, &r.bytes).unwrap();
    let out = tmp.path().join("o");
    let o = run(&mut ivtrace_shm(&["record"], &shm, &out));
    assert_eq!(o.status.code(), Some(1), "nothing recorded");
    let o = run(&mut ivtrace_shm(&["record"], &shm, tmp.path()));
    assert_eq!(o.status.code(), Some(2), "non-empty output directory");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("ivtrace: record failed: output directory") && err.contains("hint: "),
        "{err}"
    );
    std::fs::write(&shm, vec![0xabu8; 1 << 16]).unwrap();
    let o = run(&mut ivtrace_shm(&["snapshot"], &shm, &tmp.path().join("s")));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad magic"));
    let o = run(ivtrace().arg("report").arg(tmp.path().join("nope")));
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn record_waits_for_the_region_and_stops_after_duration() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(&mut ivtrace_shm(
        &["record", "--duration", "0.3"],
        &tmp.path().join("later"),
        &tmp.path().join("o"),
    ));
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("waiting for"));
}

fn loadgen_or_skip() -> Option<PathBuf> {
    let l = loadgen();
    if l.is_none() {
        eprintln!("SKIP: bin/ivtrace-loadgen is not built (make lib); loadgen end-to-end tests did not run");
    }
    l
}

fn loadgen_json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("loadgen --json prints JSON");
    serde_json::from_str(line).unwrap()
}

#[test]
fn live_loadgen_run_is_recorded_completely() {
    let Some(lg) = loadgen_or_skip() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("region");
    let out = tmp.path().join("trace");
    let rec = ivtrace_shm(&["record", "--duration", "60"], &shm, &out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lo = run(Command::new(lg).arg("--shm").arg(&shm).args([
        "--events",
        "200000",
        "--size",
        "0-40",
        "--threads",
        "3",
        "--subbufs",
        "16",
        "--subbuf-size",
        "65536",
        "--channels",
        "4",
        "--json",
    ]));
    assert!(lo.status.success());
    let stats = loadgen_json(&lo);
    let rec = rec.wait_with_output().unwrap();
    eprintln!(
        "record stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&rec.stdout),
        String::from_utf8_lossy(&rec.stderr)
    );
    assert_eq!(rec.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&rec.stdout).contains("region closed"));
    let written = stats["total"]["written"].as_u64().unwrap();
    let dropped = stats["total"]["dropped"].as_u64().unwrap();
    let rep = report_json(&out);
    assert_eq!(rep["events"], written);
    assert_eq!(rep["discarded"], dropped);
    if let Some((ev, disc)) = bt2_counts(&out) {
        assert_eq!((ev, disc), (written, dropped));
    }
}

#[test]
fn snapshot_salvages_an_overwrite_region_left_open() {
    let Some(lg) = loadgen_or_skip() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("region");
    let lo = run(Command::new(lg).arg("--shm").arg(&shm).args([
        "--events",
        "100000",
        "--size",
        "16",
        "--threads",
        "1",
        "--mode",
        "overwrite",
        "--subbufs",
        "4",
        "--subbuf-size",
        "16384",
        "--channels",
        "2",
        "--no-close",
        "--json",
    ]));
    assert!(lo.status.success());
    let before = std::fs::read(&shm).unwrap();
    let out = tmp.path().join("snap");
    let o = run(&mut ivtrace_shm(&["snapshot"], &shm, &out));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        std::fs::read(&shm).unwrap(),
        before,
        "snapshot never writes to the region"
    );
    let side: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("ivtrace.json")).unwrap()).unwrap();
    let ch = &side["channels"][0];
    let kept = ch["events"].as_u64().unwrap();
    let older = ch["older_overwritten"].as_u64().unwrap();
    assert!(kept > 0 && older > 0);
    assert_eq!(
        kept + older,
        100000,
        "every written event is either salvaged or known overwritten"
    );
    if let Some(n) = babeltrace_events(&out) {
        assert_eq!(n, kept);
    }
}

/// babeltrace2 gives no count for losses announced by a stream's first
/// packet; ivtrace puts an empty zero-loss packet first so it can.
#[test]
fn losses_before_the_first_packet_are_counted_by_bt2() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("region");
    let mut r = RegionBuilder::new(2, 8, 4096).build_region();
    r.register_loadgen(0);
    // Channel 0: the first event is too big (dropped before any packet).
    assert!(!r.emit(0, 10, 0, &vec![0; 5000]));
    let mut kept = 0;
    for i in 0..400u64 {
        kept += r.emit(
            (i % 2) as u32,
            20 + i,
            0,
            &TestRegion::loadgen_payload(0, i, &[4; 12]),
        ) as u64;
    }
    r.close(0);
    r.close(1);
    // Channel 1: its first packet is corrupt.
    let p = r.subbuf_offset(1, 0);
    r.bytes[p..p + 4].copy_from_slice(&0xdead_beef_u32.to_le_bytes());
    r.close_region();
    std::fs::write(&shm, &r.bytes).unwrap();
    let out = tmp.path().join("trace");
    let o = run(&mut ivtrace_shm(&["record"], &shm, &out));
    assert_eq!(o.status.code(), Some(0));
    let rep = report_json(&out);
    let lost_chan1 = kept - rep["events"].as_u64().unwrap();
    assert!(lost_chan1 > 0);
    assert_eq!(rep["discarded"], 1 + lost_chan1);
    if let Some(n) = babeltrace_events(&out) {
        assert_eq!(n, kept - lost_chan1);
    }
    if let Some((ev, disc)) = bt2_counts(&out) {
        assert_eq!((ev, disc), (kept - lost_chan1, 1 + lost_chan1));
    }
}

/// Events that no channel could take (`lost_no_channel`) are the
/// discarded events of the user trace's no-channel stream, whether or not
/// any user channel wrote an event; report, babeltrace2 and bt2 agree.
#[test]
fn events_no_channel_could_take_are_discarded_events_of_their_own_stream() {
    for with_events in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let shm = tmp.path().join("region");
        let (kept, dropped) = match with_events {
            true => model_region(&shm, 600),
            false => {
                let mut r = RegionBuilder::new(2, 2, 4096).build_region();
                r.close_region();
                std::fs::write(&shm, &r.bytes).unwrap();
                (0, 0)
            }
        };
        let mut bytes = std::fs::read(&shm).unwrap();
        ivtrace_region::bytes::put_u64(&mut bytes, abi::hdr::LOST_NO_CHANNEL, 77);
        std::fs::write(&shm, &bytes).unwrap();
        let out = tmp.path().join("trace");
        let o = run(&mut ivtrace_shm(&["record"], &shm, &out));
        assert_eq!(o.status.code(), Some(0));
        assert!(out.join("user/user_no_channel").is_file());
        let rep = report_json(&out);
        assert_eq!(rep["events"], kept);
        assert_eq!(rep["lost_no_channel"], 77);
        assert_eq!(rep["discarded_no_channel"], 77);
        assert_eq!(rep["discarded"], dropped + 77);
        assert_eq!(rep["lost_total"], dropped + 77);
        if let Some(n) = babeltrace_events(&out) {
            assert_eq!(n, kept, "the no-channel stream has no event");
        }
        if let Some((ev, disc)) = bt2_counts(&out) {
            assert_eq!((ev, disc), (kept, dropped + 77));
        }
    }
}

#[test]
fn a_region_whose_size_disagrees_with_its_header_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("region");
    let mut bytes = RegionBuilder::new(1, 2, 4096).build();
    bytes[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&shm, &bytes).unwrap();
    let o = run(&mut ivtrace_shm(
        &["record", "--duration", "20"],
        &shm,
        &tmp.path().join("o"),
    ));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("region_size") && err.contains("hint: "),
        "{err}"
    );
}

#[test]
fn a_run_whose_every_packet_was_corrupt_still_succeeds_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("region");
    let mut r = RegionBuilder::new(1, 4, 4096).build_region();
    r.register_loadgen(0);
    for i in 0..50 {
        r.emit(0, 10 + i, 0, &TestRegion::loadgen_payload(0, i, &[1]));
    }
    r.close(0);
    let p = r.subbuf_offset(0, 0);
    r.bytes[p] ^= 0xff; // packet magic
    r.close_region();
    std::fs::write(&shm, &r.bytes).unwrap();
    let out = tmp.path().join("o");
    let o = run(&mut ivtrace_shm(&["record"], &shm, &out));
    assert_eq!(o.status.code(), Some(0), "the losses are the result");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("corrupt=50") && text.contains("\"magic\": 1"),
        "{text}"
    );
    if let Some((ev, disc)) = bt2_counts(&out) {
        assert_eq!((ev, disc), (0, 50));
    }
}
