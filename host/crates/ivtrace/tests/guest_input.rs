//! Guest input that stopped the recorder or spoiled a whole trace (issue
//! 23), end to end: `ivtrace record` reads a region built by the writer
//! model, exits with a documented status, and babeltrace2 reads every
//! honest event of what it wrote.

mod common;

use std::path::Path;

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
