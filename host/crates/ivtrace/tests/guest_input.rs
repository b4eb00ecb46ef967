//! Guest input that stopped the recorder or spoiled a whole trace (issue
//! 23), end to end: `ivtrace record` reads a region built by the writer
//! model, exits with a documented status, and babeltrace2 reads every
//! honest event of what it wrote.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{ivtrace_shm, report_json, run};
use ivtrace_region::abi;
use ivtrace_region::packet::PacketHeader;
use ivtrace_testutil::{babeltrace2_lines, have_tool, RegionBuilder, TestRegion};
use ivtrace_tracefs::format::HeaderPage;
use ivtrace_tracefs::page::PageBuilder;

/// A tracefs format file of event `name` (id `id`) with one u64 field `v`
/// at `off`, `size` bytes, as the guest publishes it.
fn format_text(name: &str, id: u16, off: &str, size: &str) -> Vec<u8> {
    format!(
        "name: {name}\nID: {id}\nformat:\n\
         \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
         \tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
         \tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
         \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
         \tfield:u64 v;\toffset:{off};\tsize:{size};\tsigned:0;\n\n\
         print fmt: \"v=%llu\", REC->v\n"
    )
    .into_bytes()
}

/// A region with a kernel channel (0), an ftrace relay channel (1) and a
/// user channel (2): `users` loadgen events on channel 2, and one ftrace
/// page whose records are of the types `records` on channel 1, described
/// by `formats` (id, text).
fn ftrace_region(formats: &[(u16, Vec<u8>)], records: &[u16], users: u64) -> Vec<u8> {
    ftrace_region_at(formats, records, users, 5_000)
}

/// [`ftrace_region`] with the page's records from `t0` on, the relay
/// writing the page just after them.
fn ftrace_region_at(formats: &[(u16, Vec<u8>)], records: &[u16], users: u64, t0: u64) -> Vec<u8> {
    let mut r = RegionBuilder::new(3, 8, 8192)
        .kernel(1)
        .ftrace(1)
        .build_region();
    r.register_kernel_events();
    r.register_ftrace_wire();
    r.register_loadgen(0);
    for (_, text) in formats {
        r.publish_ftrace(abi::IVT_FTRACE_FORMAT, "demo", text);
    }
    let mut page = PageBuilder::new(HeaderPage::default(), 4096, t0);
    for (i, ty) in records.iter().enumerate() {
        let mut rec = vec![0u8; 16];
        rec[0..2].copy_from_slice(&ty.to_le_bytes());
        rec[4..8].copy_from_slice(&77i32.to_le_bytes());
        rec[8..16].copy_from_slice(&(i as u64).to_le_bytes());
        page.record(t0 + i as u64, &rec, false);
    }
    let written = t0 + records.len() as u64;
    r.emit_ftrace_page(1, written, &page.finish());
    for i in 0..users {
        let payload = TestRegion::loadgen_payload(0, i, b"honest");
        r.emit(2, 1_000 + i * 100, 0, &payload);
    }
    (0..3).for_each(|c| r.close(c));
    r.close_region();
    r.bytes
}

/// `ivtrace record` of `region` into DIR/t: its exit status and DIR/t.
fn record(dir: &Path, region: &[u8]) -> (Option<i32>, std::path::PathBuf) {
    let shm = dir.join("region.shm");
    std::fs::write(&shm, region).unwrap();
    let out = dir.join("t");
    let r = run(&mut ivtrace_shm(&["record"], &shm, &out));
    (r.status.code(), out)
}

fn count(lines: &[String], needle: &str) -> usize {
    lines.iter().filter(|l| l.contains(needle)).count()
}

/// Case 1: a field at the end of the address space in the guest's format
/// text made `off + size` overflow in the tracefs decoder: `record`
/// exited 101 and left a trace babeltrace2 could not read. Now the format
/// is refused and counted, and everything else is recorded.
#[test]
fn a_hostile_ftrace_format_is_refused_and_the_trace_is_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let formats = [
        (700, format_text("good", 700, "8", "8")),
        (701, format_text("evil", 701, "18446744073709551615", "8")),
        (702, format_text("evil2", 702, "8", "18446744073709551615")),
    ];
    let region = ftrace_region(&formats, &[700, 701, 702, 700], 100);
    let (status, out) = record(tmp.path(), &region);
    assert_eq!(status, Some(0));
    let report = report_json(&out);
    assert_eq!(report["lost_total"], 0, "{report}");
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("ivtrace.json")).unwrap()).unwrap();
    let ftrace = &sidecar["ftrace"];
    assert_eq!(ftrace["formats_refused"], 2, "{ftrace}");
    assert_eq!(ftrace["cpus"][0]["recorded"], 2, "{ftrace}");
    assert_eq!(ftrace["cpus"][0]["unknown_type"], 2, "{ftrace}");
    if !have_tool("babeltrace2") {
        eprintln!("babeltrace2 not installed: the trace is not read back");
        return;
    }
    let lines = babeltrace2_lines(&[], &out);
    assert_eq!(count(&lines, "ftrace:demo:good"), 2, "{lines:?}");
    assert_eq!(count(&lines, "loadgen:payload"), 100);
}

/// Case 2 for the ftrace relay: a page whose records are near 2^63 (the
/// relay's own event too) was decoded as it was, and babeltrace2 refused
/// the whole kernel trace. Now the wire packet is skipped as
/// unexpressible and counted, and the user trace is whole.
#[test]
fn an_ftrace_page_near_2_63_does_not_spoil_the_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let formats = [(700, format_text("good", 700, "8", "8"))];
    let region = ftrace_region_at(&formats, &[700, 700], 100, 1 << 63);
    let (status, out) = record(tmp.path(), &region);
    assert_eq!(status, Some(0));
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("ivtrace.json")).unwrap()).unwrap();
    let relay = sidecar["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel"] == 1)
        .unwrap();
    assert_eq!(relay["skipped_packets"]["time_unexpressible"], 1, "{relay}");
    assert_eq!(relay["lost"]["corrupt"], 1, "{relay}");
    if let Some(n) = honest_events_read(&out) {
        assert_eq!(n, 100);
    }
}

/// A user channel of 8 x 4 KiB sub-buffers holding `events` loadgen events
/// 100 ticks apart (about 166 per packet), every packet closed.
fn user_region(events: u64) -> TestRegion {
    let mut r = RegionBuilder::new(1, 8, 4096).build_region();
    r.register_loadgen(0);
    for i in 0..events {
        let payload = TestRegion::loadgen_payload(0, i, b"honest");
        assert!(r.emit(0, 1_000 + i * 100, 0, &payload));
    }
    r.close(0);
    r.close_region();
    r
}

/// Moves packet `seq` of channel 0 `delta` ticks later, whole: its begin,
/// its end and every event (a multiple of 2^27 keeps the compact headers'
/// low bits, so the walk finds the events moved too). Returns its events.
fn shift_packet(r: &mut TestRegion, seq: u64, delta: u64) -> u64 {
    assert_eq!(delta % (1 << 27), 0);
    let at = r.subbuf_offset(0, seq);
    let mut h = PacketHeader::parse(&r.bytes[at..at + abi::PACKET_HDR_SIZE]);
    assert_eq!(h.packet_seq_num, seq);
    h.timestamp_begin += delta;
    h.timestamp_end += delta;
    h.write(&mut r.bytes[at..at + abi::PACKET_HDR_SIZE]);
    u64::from(h.event_count)
}

/// The sidecar's skipped packets of channel 0 by reason, and its lost count.
fn skipped(out: &Path) -> (serde_json::Value, serde_json::Value) {
    let sidecar: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("ivtrace.json")).unwrap()).unwrap();
    let c = &sidecar["channels"][0];
    (c["skipped_packets"].clone(), c["lost"].clone())
}

/// babeltrace2's loadgen events of DIR, if babeltrace2 is installed.
fn honest_events_read(out: &Path) -> Option<usize> {
    if !have_tool("babeltrace2") {
        eprintln!("babeltrace2 not installed: the trace is not read back");
        return None;
    }
    Some(count(&babeltrace2_lines(&[], out), "loadgen:payload"))
}

/// Case 2: one packet whose timestamps are near 2^63 was written as it
/// was; nanoseconds from the clock's origin overflowed int64 and
/// babeltrace2 refused the whole trace (0 of 500 events shown). Now the
/// packet is skipped and counted as `time_unexpressible`, and every other
/// event is read.
#[test]
fn a_packet_the_clock_cannot_express_is_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = user_region(500);
    let lost = shift_packet(&mut r, 1, 1 << 63);
    let (status, out) = record(tmp.path(), &r.bytes);
    assert_eq!(status, Some(0));
    let (why, lost_json) = skipped(&out);
    assert_eq!(why["time_unexpressible"], 1, "{why}");
    assert_eq!(lost_json["corrupt"], lost, "{lost_json}");
    if let Some(n) = honest_events_read(&out) {
        assert_eq!(n as u64, 500 - lost);
    }
}

/// A packet far in the future but still expressible (50 years on) was
/// written, and every later packet of its channel was then refused as
/// going back in time: one wild packet erased the rest of its channel.
/// Now it is the packet out of line between its neighbours that goes
/// (`time_after_next`), and the packets after it are kept.
#[test]
fn a_packet_out_of_line_with_its_successor_is_the_one_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let mut r = user_region(500);
    let fifty_years = (50 * 365 * 86_400 * 1_000_000_000u64) & !((1 << 27) - 1);
    let lost = shift_packet(&mut r, 1, fifty_years);
    let (status, out) = record(tmp.path(), &r.bytes);
    assert_eq!(status, Some(0));
    let (why, lost_json) = skipped(&out);
    assert_eq!(why, serde_json::json!({"time_after_next": 1}), "{why}");
    assert_eq!(lost_json["corrupt"], lost, "{lost_json}");
    if let Some(n) = honest_events_read(&out) {
        assert_eq!(n as u64, 500 - lost);
    }
}

// ---------------------------------------------------------------- case 5

// Nested forwarding's reassembly is bounded in total: an L1 guest that
// starts a large forwarded message on every channel and never finishes one
// made `ivtrace record` buffer them all (each up to 16 MiB; 4096 channels
// could ask for 64 GiB).

/// Channels that each hold one unfinished message.
const FWD_CHANNELS: u32 = 16;
/// What each unfinished message delivered before the region closed.
const SENT: usize = 4 << 20;
/// What each claims it will be: the largest message a forwarded packet
/// can make (a 16 MiB sub-buffer and its 8-byte prefix).
const CLAIMED: u32 = (16 << 20) + 8;
const CHUNK: usize = 3072;

/// A region whose channels each carry the first `SENT` bytes of a
/// forwarded packet message that never ends.
fn unfinished_messages() -> Vec<u8> {
    let mut r = RegionBuilder::new(FWD_CHANNELS, 8, 1 << 20).build_region();
    r.register(
        abi::IVT_STREAM_USER,
        0,
        "ivtrace:forward",
        &[("kind", abi::IVT_FT_U32, 0), ("data", abi::IVT_FT_BYTES, 0)],
    );
    let chunk = vec![0x5a; CHUNK];
    for c in 0..FWD_CHANNELS {
        for (i, offset) in (0..SENT).step_by(CHUNK).enumerate() {
            let mut p = 3u32.to_le_bytes().to_vec(); // PACKET
            p.extend_from_slice(&((8 + CHUNK) as u32).to_le_bytes());
            p.extend_from_slice(&CLAIMED.to_le_bytes());
            p.extend_from_slice(&(offset as u32).to_le_bytes());
            p.extend_from_slice(&chunk);
            assert!(r.emit(c, 1_000 + i as u64, 0, &p), "the region holds it");
        }
        r.close(c);
    }
    r.close_region();
    r.bytes
}

/// The high-water mark of `pid`'s resident memory since its exec, in KiB.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn unfinished_forwarded_messages_are_bounded_in_total() {
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("l1.shm");
    std::fs::write(&shm, unfinished_messages()).unwrap();
    let out = tmp.path().join("t");
    let mut child = ivtrace_shm(&["record"], &shm, &out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Polled while it runs: the peak since its exec (a fork's copy of
    // this test's memory before the exec does not count).
    let mut peak_kib = 0;
    let status = loop {
        if let Some(kib) = vm_hwm_kib(child.id()) {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    eprintln!("{stderr}");
    assert!(status.success());
    let peak_mib = peak_kib / 1024;
    let buffered_mib = (FWD_CHANNELS as usize * SENT) >> 20;
    eprintln!("record's peak RSS: {peak_mib} MiB ({buffered_mib} MiB of unfinished messages sent)");
    // The cap is one largest message (16 MiB) for all channels together,
    // next to the recorder's own buffers (about 20 MiB here).
    assert!(
        peak_mib < 56,
        "record held {peak_mib} MiB: the unfinished messages were buffered whole"
    );
    assert!(stderr.contains("forwarded messages refused"), "{stderr}");
}

// ---------------------------------------------------------------- case 6

/// Text with what a hostile guest or file would put in front of a
/// terminal: clear the screen, set the window title, a fake line.
const ESCAPES: &str = "evil\u{1b}[2J\u{1b}]0;owned\u{7}\nivtrace: fake line\u{9b}1m";

fn has_raw_escapes(bytes: &[u8]) -> bool {
    bytes.iter().any(|&b| b == 0x1b || b == 0x07)
        || String::from_utf8_lossy(bytes).contains('\u{9b}')
}

/// `report` and `recover` printed a crafted sidecar's clock method, stop
/// reason, event names and warnings as the file had them: escape
/// sequences reached the terminal. Now they are shown escaped, and JSON
/// keeps them escaped as JSON does.
#[test]
fn a_crafted_sidecar_reaches_the_terminal_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let r = user_region(50);
    let (status, out) = record(tmp.path(), &r.bytes);
    assert_eq!(status, Some(0));
    let path = out.join("ivtrace.json");
    let mut s: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    s["clock"]["method"] = ESCAPES.into();
    s["stop_reason"] = ESCAPES.into();
    s["trace_uuid"] = ESCAPES.into();
    s["warnings"] = serde_json::json!([ESCAPES]);
    s["streams"][0]["event_classes"][0]["name"] = ESCAPES.into();
    std::fs::write(&path, serde_json::to_vec(&s).unwrap()).unwrap();
    let shown = run(common::ivtrace().arg("report").arg(&out));
    assert!(shown.status.success());
    assert!(
        !has_raw_escapes(&shown.stdout),
        "report printed raw escapes"
    );
    assert!(
        !has_raw_escapes(&shown.stderr),
        "report printed raw escapes"
    );
    assert!(String::from_utf8_lossy(&shown.stdout).contains("evil\\x1b[2J"));
    let json = run(common::ivtrace().arg("report").arg(&out).arg("--json"));
    assert!(!has_raw_escapes(&json.stdout));
    let back: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        back["clock"]["method"], ESCAPES,
        "JSON keeps the exact text"
    );
    s["state"] = "recording".into();
    std::fs::write(&path, serde_json::to_vec(&s).unwrap()).unwrap();
    let rec = run(common::ivtrace().arg("recover").arg(&out));
    assert!(
        !has_raw_escapes(&rec.stdout) && !has_raw_escapes(&rec.stderr),
        "recover printed raw escapes"
    );
}

/// A forwarded guest's clock mapping named its method with escape
/// sequences; record's summary printed it raw. Now escaped.
#[test]
fn a_forwarded_clock_method_reaches_the_terminal_escaped() {
    let mut r = RegionBuilder::new(1, 8, 8192).build_region();
    let fwd = [("kind", abi::IVT_FT_U32, 0), ("data", abi::IVT_FT_BYTES, 0)];
    r.register(abi::IVT_STREAM_USER, 0, "ivtrace:forward", &fwd);
    let sync = [("mono", abi::IVT_FT_U64, 0), ("phase", abi::IVT_FT_U32, 0)];
    r.register(abi::IVT_STREAM_USER, 1, "ivtrace:forward_sync", &sync);
    let uuid = [7u8; 16];
    let hello = serde_json::json!({"name": "l2", "uuid": uuid, "nr_channels": 1});
    let clock = serde_json::json!({"freq_hz": 1_000_000_000u64, "ref_ticks": 0, "ref_realtime_ns": 0,
        "error_ns": 5, "method": ESCAPES, "coarse": false, "samples": 1});
    let mut ts = 1_000;
    for (kind, body) in [(1u32, hello), (4, clock)] {
        let body = serde_json::to_vec(&body).unwrap();
        let mut p = kind.to_le_bytes().to_vec();
        p.extend_from_slice(&(8 + body.len() as u32).to_le_bytes());
        p.extend_from_slice(&(body.len() as u32).to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&body);
        ts += 10;
        assert!(r.emit(0, ts, 0, &p));
    }
    for phase in 0..2u32 {
        let mut p = (500 + u64::from(phase)).to_le_bytes().to_vec();
        p.extend_from_slice(&phase.to_le_bytes());
        ts += 10;
        assert!(r.emit(0, ts, 1, &p));
    }
    r.close(0);
    r.close_region();
    let tmp = tempfile::tempdir().unwrap();
    let shm = tmp.path().join("l1.shm");
    std::fs::write(&shm, &r.bytes).unwrap();
    let out = run(&mut ivtrace_shm(&["record"], &shm, &tmp.path().join("t")));
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nested guest l2"), "{stderr}");
    assert!(
        !has_raw_escapes(&out.stderr),
        "record printed raw escapes: {stderr}"
    );
}
