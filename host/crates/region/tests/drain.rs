//! The drain engine against regions built by the writer model: what is
//! emitted, what is counted as lost and why, what is rewritten.

use ivtrace_region::abi;
use ivtrace_region::bytes::le_u64;
use ivtrace_region::packet::{PacketHeader, TickRange};
use ivtrace_region::reader::PacketSink;
use ivtrace_region::{Access, EventClasses, Reader, Region};
use ivtrace_testutil::{RegionBuilder, TestRegion};

#[derive(Default)]
struct Collect(Vec<(u32, Vec<u8>)>);

impl PacketSink for Collect {
    type Error = std::convert::Infallible;
    fn packet(
        &mut self,
        chan: u32,
        _stream: u32,
        bytes: &[u8],
        _c: &EventClasses,
    ) -> Result<(), Self::Error> {
        self.0.push((chan, bytes.to_vec()));
        Ok(())
    }
}

impl Collect {
    fn headers(&self, chan: u32) -> Vec<PacketHeader> {
        self.0
            .iter()
            .filter(|(c, _)| *c == chan)
            .map(|(_, b)| PacketHeader::parse(b))
            .collect()
    }
}

const EV: usize = 4 + 14 + 8; // compact header + loadgen payload with 8 data bytes
/// Events of EV bytes (each 4-aligned) in one 4 KiB packet after its
/// 88-byte header.
const PER_PACKET: u64 = ((4096 - 88) / EV.next_multiple_of(4)) as u64;

fn region(mode: u32, subbufs: u32) -> TestRegion {
    let mut r = RegionBuilder::new(2, subbufs, 4096)
        .mode(mode)
        .build_region();
    r.register_loadgen(0);
    r
}

fn emit(r: &mut TestRegion, chan: u32, n: u64, ts0: u64) -> u64 {
    let mut kept = 0;
    for i in 0..n {
        kept += r.emit(
            chan,
            ts0 + i * 10,
            0,
            &TestRegion::loadgen_payload(chan as u16, i, &[7; 8]),
        ) as u64;
    }
    kept
}

fn reader(r: &TestRegion) -> Reader {
    Reader::new(
        Region::from_bytes(&r.bytes, Access::ReadWrite).unwrap(),
        TickRange::ALL,
    )
}

fn drain_all(reader: &mut Reader) -> Collect {
    let mut sink = Collect::default();
    reader.drain_available(&mut sink).unwrap();
    reader.flush_partial(&mut sink).unwrap();
    reader.finish(&mut sink).unwrap();
    sink
}

#[test]
fn discard_drain_keeps_every_event_and_releases_subbuffers() {
    let mut r = region(abi::IVT_MODE_DISCARD, 8);
    emit(&mut r, 0, PER_PACKET * 3 + 5, 100);
    let mut rd = reader(&r);
    let mut sink = Collect::default();
    let pass = rd.drain_available(&mut sink).unwrap();
    assert_eq!(pass.packets, 3, "three complete packets");
    assert_eq!(
        rd.region().protocol().consumed(0),
        0,
        "nothing handed back before the sink wrote it"
    );
    rd.commit_written();
    let consumed = rd.region().protocol().consumed(0);
    assert_eq!(consumed, 3, "sub-buffers handed back");
    rd.flush_partial(&mut sink).unwrap();
    rd.finish(&mut sink).unwrap();
    let st = rd.channel_stats(0);
    assert_eq!(st.events, PER_PACKET * 3 + 5);
    assert_eq!((st.packets, st.partial_packets), (4, 1));
    let hs = sink.headers(0);
    assert_eq!(
        hs.iter().map(|h| h.event_count as u64).sum::<u64>(),
        st.events
    );
    for (seq, h) in hs.iter().enumerate() {
        assert_eq!(h.packet_seq_num, seq as u64);
        assert_eq!(
            h.packet_size,
            h.content_size.next_multiple_of(64),
            "trimmed to content rounded to 8 bytes"
        );
        assert_eq!(h.events_discarded, 0);
    }
    let partial = hs.last().unwrap();
    assert_eq!(partial.event_count, 5);
    assert!(
        partial.timestamp_end > partial.timestamp_begin,
        "end recomputed from the events"
    );
}

#[test]
fn padding_is_zeroed() {
    let mut r = region(abi::IVT_MODE_DISCARD, 8);
    emit(&mut r, 0, 3, 100);
    r.close(0);
    let p = r.subbuf_offset(0, 0);
    let content = le_u64(&r.bytes, p + abi::pkt::CONTENT_SIZE) as usize / 8;
    r.bytes[p + content..p + content + 8].fill(0xee);
    let sink = drain_all(&mut reader(&r));
    let (_, bytes) = &sink.0[0];
    assert!(bytes[content..].iter().all(|&b| b == 0));
}

#[test]
fn overwrite_lap_counts_overwritten_events_exactly() {
    let mut r = region(abi::IVT_MODE_OVERWRITE, 4);
    emit(&mut r, 0, PER_PACKET * 10, 100); // packets 0..9 closed, ring holds 4
    r.close(0);
    let mut rd = reader(&r);
    let sink = drain_all(&mut rd);
    let st = rd.channel_stats(0);
    assert_eq!(st.packets, 4);
    assert_eq!(st.skipped.get("overwritten"), Some(&6));
    assert_eq!(st.host_lost.overwritten, PER_PACKET * 6);
    let hs = sink.headers(0);
    let (lead, first) = (&hs[0], &hs[1]);
    assert_eq!(
        (lead.event_count, lead.events_discarded),
        (0, 0),
        "an empty zero-loss packet leads"
    );
    assert_eq!(
        (lead.packet_seq_num, lead.timestamp_end),
        (5, first.timestamp_begin)
    );
    assert_eq!(first.packet_seq_num, 6);
    assert_eq!(
        first.events_discarded,
        PER_PACKET * 6,
        "babeltrace sees the overwritten events"
    );
}

#[test]
fn corrupt_packet_is_skipped_and_its_events_counted_as_lost() {
    let mut r = region(abi::IVT_MODE_DISCARD, 8);
    emit(&mut r, 1, PER_PACKET * 3, 100);
    r.close(1);
    let p = r.subbuf_offset(1, 1);
    r.bytes[p + 88] = (r.bytes[p + 88] & !31) | 29; // first event of packet 1: unknown id 29
    let mut rd = reader(&r);
    let sink = drain_all(&mut rd);
    let st = rd.channel_stats(1);
    assert_eq!(st.events, PER_PACKET * 2);
    assert_eq!(st.skipped.get("unknown_event_id"), Some(&1));
    assert_eq!(st.host_lost.corrupt, PER_PACKET);
    let hs = sink.headers(1);
    assert_eq!(hs.len(), 2);
    assert_eq!(hs[1].events_discarded, PER_PACKET);
}

#[test]
fn trailing_drops_get_a_final_empty_packet() {
    let mut r = region(abi::IVT_MODE_DISCARD, 2);
    let emitted = emit(&mut r, 0, 2000, 100);
    r.close(0);
    let dropped = 2000 - emitted;
    assert!(dropped > 0, "the two-packet ring overflowed");
    let mut rd = reader(&r);
    let sink = drain_all(&mut rd);
    let hs = sink.headers(0);
    let last = hs.last().unwrap();
    assert_eq!(
        (last.event_count, last.content_size),
        (0, 88 * 8),
        "an empty packet"
    );
    assert_eq!(last.events_discarded, dropped);
    assert_eq!(rd.channel_stats(0).writer_lost.full, dropped);
}

/// Registers a class and writes an event of it on channel 1 while the
/// reader is busy with channel 0 (after its metadata scan of this pass).
struct RegisterLate {
    file: std::fs::File,
    region: TestRegion,
    done: bool,
}

impl PacketSink for RegisterLate {
    type Error = std::convert::Infallible;
    fn packet(
        &mut self,
        chan: u32,
        _s: u32,
        _b: &[u8],
        _c: &EventClasses,
    ) -> Result<(), Self::Error> {
        use std::os::unix::fs::FileExt;
        if chan == 0 && !self.done {
            self.done = true;
            self.region
                .register(1, 9, "late", &[("x", abi::IVT_FT_U32, 0)]);
            self.region.emit(1, 100, 9, &5u32.to_le_bytes());
            self.region.close(1);
            self.file.write_all_at(&self.region.bytes, 0).unwrap();
        }
        Ok(())
    }
}

#[test]
fn an_unknown_id_triggers_one_metadata_rescan() {
    let mut r = region(abi::IVT_MODE_DISCARD, 8);
    emit(&mut r, 0, 3, 100);
    r.close(0);
    let tmp = tempfile_path();
    std::fs::write(&tmp, &r.bytes).unwrap();
    let mut rd = Reader::new(
        Region::open(&tmp, Access::ReadWrite).unwrap(),
        TickRange::ALL,
    );
    let file = std::fs::OpenOptions::new().write(true).open(&tmp).unwrap();
    let mut sink = RegisterLate {
        file,
        region: r,
        done: false,
    };
    rd.drain_available(&mut sink).unwrap();
    std::fs::remove_file(&tmp).unwrap();
    assert!(sink.done);
    assert_eq!(
        rd.channel_stats(1).events,
        1,
        "the late class was found by the re-scan"
    );
    assert!(rd.channel_stats(1).skipped.is_empty());
}

fn tempfile_path() -> std::path::PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm".into()
    } else {
        std::env::temp_dir()
    };
    dir.join(
        format!(
            "ivtrace-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        )
        .replace(['(', ')'], ""),
    )
}

#[test]
fn torn_copies_are_detected_by_open_seq() {
    let mut r = region(abi::IVT_MODE_OVERWRITE, 4);
    emit(&mut r, 0, PER_PACKET * 3, 100);
    r.close(0);
    // The writer announced packet 4, which lives where packet 0 is.
    let ch = le_u64(&r.bytes, abi::hdr::LAYOUT) as usize;
    r.bytes[ch + 8..ch + 16].copy_from_slice(&4u64.to_le_bytes());
    let mut rd = reader(&r);
    drain_all(&mut rd);
    let st = rd.channel_stats(0);
    assert_eq!(st.skipped.get("torn"), Some(&1));
    assert_eq!(st.packets, 2);
    assert_eq!(st.host_lost.torn, PER_PACKET);
}

#[test]
fn snapshot_takes_the_newest_packets_and_the_open_prefix() {
    let mut r = region(abi::IVT_MODE_OVERWRITE, 4);
    emit(&mut r, 0, PER_PACKET * 6 + 3, 100); // 6 closed, 1 open with 3 events
    let mut rd = Reader::new(
        Region::from_bytes(&r.bytes, Access::ReadOnly).unwrap(),
        TickRange::ALL,
    );
    let mut sink = Collect::default();
    rd.snapshot(&mut sink).unwrap();
    let st = rd.channel_stats(0);
    assert_eq!(
        st.packets, 4,
        "3 complete (one slot is the open packet) + the prefix"
    );
    assert_eq!(st.events, PER_PACKET * 3 + 3);
    assert_eq!(st.older_overwritten, PER_PACKET * 3);
    assert_eq!(sink.headers(0)[0].packet_seq_num, 3);
}

#[test]
fn a_wild_commit_pos_costs_at_most_one_ring_of_work() {
    let mut r = region(abi::IVT_MODE_DISCARD, 4);
    emit(&mut r, 0, 10, 100);
    let ch = le_u64(&r.bytes, abi::hdr::LAYOUT) as usize;
    r.bytes[ch..ch + 8].copy_from_slice(&(u64::MAX - 5).to_le_bytes());
    let mut rd = reader(&r);
    let sink = drain_all(&mut rd);
    let st = rd.channel_stats(0);
    assert!(sink.0.len() <= 6);
    assert!(st.skipped.values().sum::<u64>() > 0);
}

#[test]
fn a_region_file_that_shrinks_under_the_reader_is_counted_not_fatal() {
    let mut r = RegionBuilder::new(1, 2, 65536).build_region();
    r.register_loadgen(0);
    emit(&mut r, 0, 3000, 10); // packet 0 ends, packet 1 lies past 64 KiB
    r.close(0);
    let path = tempfile_path();
    std::fs::write(&path, &r.bytes).unwrap();
    let mut rd = Reader::new(
        Region::open(&path, Access::ReadWrite).unwrap(),
        TickRange::ALL,
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(65536)
        .unwrap();
    let sink = drain_all(&mut rd);
    std::fs::remove_file(&path).unwrap();
    assert!(
        sink.0.iter().all(|(c, b)| *c == 0 && b.len() == 88),
        "only the final empty packet"
    );
    assert_eq!(rd.channel_stats(0).skipped.get("unreadable"), Some(&2));
}

/// Every event time of channel `chan`'s packets, as a reader unwraps them.
fn event_times(sink: &Collect, chan: u32, classes: &EventClasses) -> Vec<u64> {
    struct Times(Vec<u64>);
    impl ivtrace_region::packet::EventVisitor for Times {
        fn event(&mut self, _id: u32, ts: u64) {
            self.0.push(ts);
        }
    }
    let mut t = Times(Vec::new());
    for (_, bytes) in sink.0.iter().filter(|(c, _)| *c == chan) {
        let mut b = bytes.clone();
        ivtrace_region::reader::walk_own_packet(&mut b, classes, &mut t).unwrap();
    }
    t.0
}

const EPOCH_2026_NS: u64 = 1_780_000_000_000_000_000;

#[test]
fn user_times_are_written_in_exact_nanoseconds() {
    use ivtrace_region::ns::NsScale;
    let mut r = region(abi::IVT_MODE_DISCARD, 8);
    emit(&mut r, 0, PER_PACKET * 2 + 3, 1_000);
    let scale = NsScale::new(2_400_000_007, 500, EPOCH_2026_NS);
    let mut rd = reader(&r);
    rd.set_user_clock(scale, TickRange::ALL);
    let sink = drain_all(&mut rd);
    let want: Vec<u64> = (0..PER_PACKET * 2 + 3)
        .map(|i| scale.ns(1_000 + i * 10).unwrap())
        .collect();
    assert_eq!(event_times(&sink, 0, rd.classes()), want);
    let hs = sink.headers(0);
    assert_eq!(hs[0].timestamp_begin, scale.ns(1_000).unwrap());
    assert!(hs
        .windows(2)
        .all(|w| w[0].timestamp_end <= w[1].timestamp_begin));
    let st = rd.channel_stats(0);
    assert_eq!((st.ts_clamped, st.retimed_slow), (0, 0));
    assert_eq!(st.first_ts, Some(1_000), "the statistics keep ticks");
}

#[test]
fn a_slow_clock_rewrites_its_packets_afresh_and_they_stay_exact() {
    use ivtrace_region::ns::NsScale;
    let mut r = region(abi::IVT_MODE_DISCARD, 8);
    // 10 ticks apart at 10 Hz: a second, past what a compact header says.
    emit(&mut r, 0, PER_PACKET + 3, 1_000);
    let scale = NsScale::new(10, 0, EPOCH_2026_NS);
    let mut rd = reader(&r);
    rd.set_user_clock(scale, TickRange::ALL);
    let sink = drain_all(&mut rd);
    let want: Vec<u64> = (0..PER_PACKET + 3)
        .map(|i| scale.ns(1_000 + i * 10).unwrap())
        .collect();
    assert_eq!(event_times(&sink, 0, rd.classes()), want);
    let st = rd.channel_stats(0);
    assert_eq!(st.retimed_slow, 2, "both packets");
    let h = &sink.headers(0)[0];
    assert_eq!(h.packet_size, h.content_size.next_multiple_of(64));
    assert!(
        h.content_size / 8 > 4096,
        "12 more bytes per event: past the sub-buffer"
    );
}

#[test]
fn a_refined_mapping_never_takes_a_stream_back() {
    use ivtrace_region::ns::NsScale;
    let mut r = region(abi::IVT_MODE_DISCARD, 8);
    emit(&mut r, 0, PER_PACKET + 3, 1_000);
    let mut rd = reader(&r);
    rd.set_user_clock(
        NsScale::new(1_000_000_000, 0, EPOCH_2026_NS),
        TickRange::ALL,
    );
    let mut sink = Collect::default();
    // The first packet (complete; the second is open).
    rd.drain_available(&mut sink).unwrap();
    let first_end = sink.headers(0).last().unwrap().timestamp_end;
    // The exchange finds the guest's clock 1 ms behind what was thought.
    rd.set_user_clock(
        NsScale::new(1_000_000_000, 0, EPOCH_2026_NS - 1_000_000),
        TickRange::ALL,
    );
    rd.flush_partial(&mut sink).unwrap();
    rd.finish(&mut sink).unwrap();
    let times = event_times(&sink, 0, rd.classes());
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "monotonic");
    let hs = sink.headers(0);
    assert_eq!(
        hs[1].timestamp_begin, first_end,
        "clamped to the previous end"
    );
    let st = rd.channel_stats(0);
    assert!(st.ts_clamped > 0, "{st:?}");
}
