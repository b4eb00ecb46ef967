use std::sync::Arc;

use ivtrace_region::abi::{self, IVT_CTF_MAGIC};
use ivtrace_region::bytes::le_u32;
use ivtrace_region::classes::{EventClass, Field, FieldType, StreamClasses};
use ivtrace_testutil::{RegionBuilder, TestRegion};
use ivtrace_time::ClockMapping;

use super::*;
use crate::host_trace::{
    HostTrace, HostTraceDesc, Payload, PACKET_HDR, STREAM_IVTRACE, STREAM_KERNEL,
};
use crate::tsdl::{self, TraceDesc, TraceEnv};

fn host_classes() -> Vec<EventClass> {
    vec![
        EventClass::new(
            0,
            STREAM_IVTRACE,
            "mark".into(),
            vec![Field::new("n", FieldType::U64, false)],
        ),
        EventClass::new(
            100,
            STREAM_KERNEL,
            "sched_switch".into(),
            vec![
                Field::new("prev_comm", FieldType::Chars(16), false),
                Field::new("prev_tid", FieldType::S32, false),
                Field::new("s", FieldType::String, false),
            ],
        ),
    ]
}

/// A host trace in `root/host`: 20 000 sched_switch on CPU 3 (several
/// packets, 4 lost after the first 10 000), one mark.
fn write_host(root: &std::path::Path) -> PathBuf {
    let desc = HostTraceDesc {
        hostname: "h",
        trace_name: "t",
        error_ns: 1,
        env: vec![],
    };
    let out = crate::OutDir::root(root, &Default::default()).unwrap();
    let mut t = HostTrace::create(&out, "host", &desc, host_classes()).unwrap();
    let a = t.add_stream(STREAM_IVTRACE, 0, "ivtrace_host").unwrap();
    let b = t.add_stream(STREAM_KERNEL, 3, "host_cpu3").unwrap();
    let mut p = b"qemu".to_vec();
    p.resize(16, 0);
    p.extend_from_slice(&7i32.to_le_bytes());
    p.extend_from_slice(b"hello\0");
    for i in 0..20_000u64 {
        if i == 10_000 {
            t.flush().unwrap();
            t.discarded(b, 4).unwrap();
        }
        t.event(b, 100, 1000 + i, 42, &p).unwrap();
    }
    t.event(a, 0, 5, 0, &Payload::default().u64(9).0).unwrap();
    t.finish().unwrap();
    root.join("host")
}

#[test]
fn what_the_host_writer_wrote_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_host(tmp.path());
    let trace = Trace::open(&dir).unwrap();
    assert_eq!(trace.kind, TraceKind::Host);
    assert_eq!(trace.clock().freq, 1_000_000_000);
    let mut streams = trace.streams().unwrap();
    assert_eq!(streams.len(), 2);
    let (mut n, mut lost) = (0u64, 0u64);
    while let Some(item) = streams[0].next_item().unwrap() {
        match item {
            Item::Event(rec) => {
                assert_eq!(
                    (rec.ts, rec.class_id(), rec.tid, rec.cpu()),
                    (1000 + n, 100, Some(42), 3)
                );
                assert_eq!(rec.offsets, [0, 16, 20, 26]);
                assert_eq!(rec.text_named("s"), Some(&b"hello"[..]));
                assert_eq!(rec.text_named("prev_comm"), Some(&b"qemu"[..]));
                assert_eq!(rec.int_named("prev_tid"), Some(7));
                n += 1;
            }
            Item::Discarded(d) => {
                assert_eq!((n, d.count, d.packet.cpu), (10_000, 4, 3));
                lost += d.count;
            }
        }
    }
    assert_eq!((n, lost), (20_000, 4), "several packets");
    let rec = streams[1].next_record().unwrap().unwrap();
    assert_eq!(
        (rec.ts, rec.class.stream, rec.tid),
        (5, STREAM_IVTRACE, None)
    );
    assert_eq!(rec.payload, 9u64.to_le_bytes());
    assert!(streams[1].next_record().unwrap().is_none());
}

fn loadgen_class() -> EventClass {
    EventClass::new(
        3,
        abi::IVT_STREAM_USER,
        "loadgen:payload".into(),
        vec![
            Field::new("thread", FieldType::U16, false),
            Field::new("seq", FieldType::U64, false),
            Field::new("data", FieldType::Bytes, false),
        ],
    )
}

/// A guest user trace in `root/user`, written by the C writer's model
/// (compact and extended headers, several packets, one event too big for a
/// packet between them), on a 2.4 GHz clock; the events' (ts, seq).
fn write_guest(root: &std::path::Path, clock: &ClockMapping) -> Vec<(u64, u64)> {
    let mut r: TestRegion = RegionBuilder::new(1, 8, 4096).build_region();
    let mut want = Vec::new();
    for seq in 0..300u64 {
        let ts = 1_000_000 + seq * seq * 40_000;
        let data = if seq == 150 {
            vec![7u8; 5000]
        } else {
            vec![seq as u8; 9]
        };
        if r.emit(0, ts, 3, &TestRegion::loadgen_payload(1, seq, &data)) {
            want.push((ts, seq));
        }
    }
    r.close(0);
    let dir = root.join("user");
    std::fs::create_dir_all(&dir).unwrap();
    let mut file = Vec::new();
    for seq in 0..8 {
        let at = r.subbuf_offset(0, seq);
        if le_u32(&r.bytes, at) == IVT_CTF_MAGIC {
            file.extend_from_slice(&r.bytes[at..at + 4096]);
        }
    }
    std::fs::write(dir.join("user_chan0"), file).unwrap();
    let env = TraceEnv {
        hostname: "g".into(),
        trace_name: "g".into(),
        creation_datetime: "x".into(),
        tracer_major: 0,
        tracer_minor: 1,
        extra: vec![],
    };
    let desc = TraceDesc {
        uuid: "u",
        clock_uuid: "c",
        clock,
        timebase: tsdl::Timebase::Ticks,
        env: &env,
    };
    let mut classes = StreamClasses::default();
    classes.insert(loadgen_class());
    let text = tsdl::metadata(&desc, abi::IVT_STREAM_USER, &classes);
    std::fs::write(dir.join("metadata"), text).unwrap();
    want
}

fn guest_clock() -> ClockMapping {
    ClockMapping {
        freq_hz: 2_400_000_000,
        ref_ticks: 0,
        ref_realtime_ns: 1_700_000_000_000_000_000,
        error_ns: 100,
        method: "test".into(),
        ..ClockMapping::default()
    }
}

#[test]
fn what_the_guest_writer_wrote_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let want = write_guest(tmp.path(), &guest_clock());
    assert!(want.len() == 299, "one event too big for a packet");
    let trace = Trace::open(&tmp.path().join("user")).unwrap();
    assert_eq!(trace.kind, TraceKind::User);
    let mut s = trace.streams().unwrap();
    let mut got = Vec::new();
    let mut lost = 0;
    while let Some(item) = s[0].next_item().unwrap() {
        match item {
            Item::Event(r) => {
                let seq = r.int_named("seq").unwrap() as u64;
                let data = r.field(2).unwrap();
                assert_eq!(&data[4..], vec![seq as u8; 9].as_slice());
                assert_eq!(r.packet.owner_pid, 1);
                got.push((r.ts, seq));
            }
            Item::Discarded(d) => lost += d.count,
        }
    }
    assert_eq!(got, want);
    assert_eq!(lost, 1, "the event too big for a packet");
}

#[test]
fn merge_takes_each_timestamp_through_its_own_clock() {
    let tmp = tempfile::tempdir().unwrap();
    write_guest(tmp.path(), &guest_clock());
    write_host(tmp.path());
    let rec = Recording::open(tmp.path()).unwrap();
    assert!(rec.sidecar.is_none());
    let (guest, host) = (
        rec.trace(TraceKind::User).unwrap(),
        rec.trace(TraceKind::Host).unwrap(),
    );
    let mut m = Merge::default();
    m.add_trace(guest, 0).unwrap();
    m.add_trace(host, 1).unwrap();
    let mapping = guest_clock();
    let mut last = i128::MIN;
    let (mut from_guest, mut from_host) = (0, 0);
    for x in m.by_ref() {
        assert!(x.ns >= last, "time order");
        last = x.ns;
        if let Item::Event(r) = &x.item {
            if x.source == 0 {
                assert!((x.ns - mapping.realtime_ns(r.ts)).abs() <= 1);
                from_guest += 1;
            } else {
                assert_eq!(x.ns, r.ts as i128);
                from_host += 1;
            }
        }
    }
    assert_eq!((from_guest, from_host), (299, 20_001));
    assert!(m.errors.is_empty(), "{:?}", m.errors);
}

#[test]
fn damaged_files_are_errors_not_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let cl = Classes::new(&host_classes());
    let decl = StreamDecl {
        id: 0,
        packets: Packets::Host,
        tid_context: true,
    };
    let mut junk = vec![0u8; 200];
    junk[..4].copy_from_slice(&IVT_CTF_MAGIC.to_le_bytes());
    for (size, content) in [(200u64 * 8, 199 * 8), (8 << 30, 100), (80 * 8, 90 * 8)] {
        junk[32..40].copy_from_slice(&(content as u64).to_le_bytes());
        junk[40..48].copy_from_slice(&size.to_le_bytes());
        let f = tmp.path().join("s");
        std::fs::write(&f, &junk).unwrap();
        let mut r = StreamReader::open(&f, decl, Arc::clone(&cl)).unwrap();
        assert!(read_to_error(&mut r), "{size} {content}");
    }
    // A truncated event: header past the content; then a packet cut short.
    junk[32..40].copy_from_slice(&((PACKET_HDR as u64 + 10) * 8).to_le_bytes());
    junk[40..48].copy_from_slice(&(200u64 * 8).to_le_bytes());
    let f = tmp.path().join("s");
    std::fs::write(&f, &junk).unwrap();
    assert!(read_to_error(
        &mut StreamReader::open(&f, decl, Arc::clone(&cl)).unwrap()
    ));
    std::fs::write(&f, &junk[..150]).unwrap();
    assert!(read_to_error(
        &mut StreamReader::open(&f, decl, cl).unwrap()
    ));
}

/// Reads until the end; true if that end was an error.
fn read_to_error(r: &mut StreamReader) -> bool {
    loop {
        match r.next_item() {
            Ok(Some(_)) => continue,
            Ok(None) => return false,
            Err(_) => return true,
        }
    }
}
