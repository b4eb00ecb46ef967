//! The ftrace relay's decoder (ivtrace_tracefs::ftrace_relay) on real guest pages and on built
//! ones: fixtures/guest holds ftrace pages and format files a real guest (Debian 6.1,
//! ivtrace.ko ftrace=1, trace_event=sched,block, dd on a virtio-blk disk) wrote into its
//! region, extracted by fixtures/guest/extract.py. The staged wire packets are built here as
//! the relay writes them; the output is walked with the same walker `ivtrace report` uses.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use ivtrace_ctf::ftrace::{FtraceCpu, FtraceInput, FtraceStaged};
use ivtrace_ctf::outdir::{OutDir, OutputPolicy};
use ivtrace_ctf::sidecar::TracefsFormats;
use ivtrace_region::abi;
use ivtrace_region::bytes::{le_u32, le_u64};
use ivtrace_region::classes::{EventClasses, FieldType, StreamClasses};
use ivtrace_region::ftrace::{FtraceFile, FtraceFormats, FtraceText};
use ivtrace_region::packet::{EventVisitor, PacketHeader, TickRange};
use ivtrace_region::reader::walk_own_packet;
use ivtrace_tracefs::format::HeaderPage;
use ivtrace_tracefs::ftrace_relay::{expand, trace_name};
use ivtrace_tracefs::page::PageBuilder;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/guest")
}

/// The ftrace type id of the guest fixture's block_rq_issue format.
fn block_rq_issue_id() -> u16 {
    let issue = fs::read_to_string(fixtures().join("block.block_rq_issue.format")).unwrap();
    let id = issue
        .split("\nID: ")
        .nth(1)
        .unwrap()
        .lines()
        .next()
        .unwrap();
    id.parse().unwrap()
}

fn text(file: FtraceFile, system: &str, name: &str) -> FtraceText {
    FtraceText {
        file,
        system: system.into(),
        text: fs::read(fixtures().join(name)).unwrap(),
    }
}

fn guest_formats() -> FtraceFormats {
    let mut f = FtraceFormats::default();
    f.push(text(FtraceFile::HeaderPage, "", "header_page"));
    f.push(text(
        FtraceFile::Format,
        "block",
        "block.block_rq_issue.format",
    ));
    f.push(text(
        FtraceFile::Format,
        "block",
        "block.block_rq_complete.format",
    ));
    f
}

/// When the relay wrote the pages of [`wire_packet`]: after every record
/// of the tests' pages.
const RELAY_AT: u64 = 1 << 50;

/// One staged wire packet as the relay writes it: ftrace_page events, then ftrace_stats.
fn wire_packet(cpu: u32, seq: u64, pages: &[&[u8]], stats: Option<[u64; 8]>) -> Vec<u8> {
    wire_packet_at(cpu, seq, RELAY_AT, pages, stats)
}

/// [`wire_packet`] with the relay writing its pages at `at`.
fn wire_packet_at(
    cpu: u32,
    seq: u64,
    at: u64,
    pages: &[&[u8]],
    stats: Option<[u64; 8]>,
) -> Vec<u8> {
    let events: Vec<(u32, &[u8])> = pages
        .iter()
        .map(|p| (abi::IVT_FTRACE_EV_PAGE, *p))
        .collect();
    wire_events_packet_at(cpu, seq, at, &events, stats)
}

/// A staged wire packet of byte events (pages, symbol chunks), then
/// ftrace_stats, written at [`RELAY_AT`].
fn wire_events_packet(
    cpu: u32,
    seq: u64,
    events: &[(u32, &[u8])],
    stats: Option<[u64; 8]>,
) -> Vec<u8> {
    wire_events_packet_at(cpu, seq, RELAY_AT, events, stats)
}

/// [`wire_events_packet`] written at `at`.
fn wire_events_packet_at(
    cpu: u32,
    seq: u64,
    at: u64,
    events: &[(u32, &[u8])],
    stats: Option<[u64; 8]>,
) -> Vec<u8> {
    let events: Vec<(u64, u32, &[u8])> = events.iter().map(|&(id, p)| (at, id, p)).collect();
    wire_timed_packet(cpu, seq, &events, stats.map(|s| (at, s)))
}

/// A staged wire packet of byte events written at the times given, then
/// ftrace_stats at its own (extended event headers, the whole time in
/// each).
fn wire_timed_packet(
    cpu: u32,
    seq: u64,
    events: &[(u64, u32, &[u8])],
    stats: Option<(u64, [u64; 8])>,
) -> Vec<u8> {
    let mut b = vec![0u8; abi::PACKET_HDR_SIZE];
    let mut times = Vec::new();
    for &(at, id, p) in events {
        b.extend_from_slice(&abi::IVT_EV_ID_EXTENDED.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&at.to_le_bytes());
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(p);
        b.resize(b.len().next_multiple_of(4), 0);
        times.push(at);
    }
    let count = events.len() as u32 + stats.is_some() as u32;
    if let Some((at, s)) = stats {
        b.extend_from_slice(&abi::IVT_EV_ID_EXTENDED.to_le_bytes());
        b.extend_from_slice(&abi::IVT_FTRACE_EV_STATS.to_le_bytes());
        b.extend_from_slice(&at.to_le_bytes());
        s.iter().for_each(|v| b.extend_from_slice(&v.to_le_bytes()));
        times.push(at);
    }
    let content = b.len();
    b.resize(content.next_multiple_of(8), 0);
    PacketHeader {
        magic: abi::IVT_CTF_MAGIC,
        stream_id: abi::IVT_STREAM_FTRACE,
        stream_instance_id: 2 + cpu as u64,
        timestamp_begin: times[0],
        timestamp_end: *times.last().unwrap(),
        content_size: content as u64 * 8,
        packet_size: b.len() as u64 * 8,
        packet_seq_num: seq,
        events_discarded: 0,
        first_event_seq: 0,
        event_count: count,
        cpu_id: cpu,
        owner_pid: 0,
        owner_tid: 0,
    }
    .write(&mut b);
    b
}

struct Run {
    classes: StreamClasses,
    cpus: Vec<FtraceCpu>,
    /// Symbols kept in DIR/kallsyms, and refused.
    symbols: (u64, u64),
    formats: TracefsFormats,
    /// Per output packet: (events_discarded, [(class name, payload)]).
    packets: Vec<(u64, Vec<(String, u64)>)>,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

struct Ids(Vec<(u32, u64)>);

impl EventVisitor for Ids {
    fn event(&mut self, id: u32, ts: u64) {
        self.0.push((id, ts));
    }
}

/// A kernel trace clock whose nanoseconds are its ticks (the times these
/// tests check are the ticks they staged).
static NS_IS_TICK: ivtrace_ctf::ClockMapping = ivtrace_ctf::ClockMapping {
    freq_hz: 1_000_000_000,
    ref_ticks: 0,
    ref_realtime_ns: 0,
    error_ns: 1,
    method: String::new(),
    coarse: false,
    samples: 1,
};

/// Stages `packets` for one channel, expands, walks the output with the output classes.
fn run(formats: &FtraceFormats, packets: &[Vec<u8>]) -> Run {
    run_with(formats, packets, TickRange::ALL)
}

/// [`run`] with a kernel trace clock (1 GHz) that expresses `ticks`.
fn run_with(formats: &FtraceFormats, packets: &[Vec<u8>], ticks: TickRange) -> Run {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("wire")).unwrap();
    fs::write(dir.path().join("wire/ftrace_chan2"), packets.concat()).unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o750)).unwrap();
    let root = OutDir::root(dir.path(), &OutputPolicy::default()).unwrap();
    let staging = root.open_dir("wire").unwrap();
    root.create_dir("kernel").unwrap();
    let out = dir.path().join("kernel/ftrace_chan2");
    let files = [FtraceStaged {
        chan: 2,
        name: "ftrace_chan2".into(),
    }];
    let input = FtraceInput {
        wire: &StreamClasses::default(),
        formats,
        files: &files,
        staging: &staging,
        ticks,
        freq_hz: 1_000_000_000,
        clock: &NS_IS_TICK,
        root: &root,
    };
    let res = expand(&input).unwrap();
    let mut all = EventClasses::default();
    for c in res.classes.iter() {
        all.stream_mut(abi::IVT_STREAM_FTRACE).insert(c.clone());
    }
    let bytes = fs::read(&out).unwrap();
    let mut packets = Vec::new();
    let mut off = 0;
    while off < bytes.len() {
        let h = PacketHeader::parse(&bytes[off..]);
        let mut pkt = bytes[off..off + (h.packet_size / 8) as usize].to_vec();
        let mut ids = Ids(Vec::new());
        let (h, _) = walk_own_packet(&mut pkt, &all, &mut ids).expect("output packets walk");
        assert_eq!((h.stream_id, h.cpu_id), (abi::IVT_STREAM_FTRACE, 0));
        let names = ids
            .0
            .iter()
            .map(|&(id, ts)| (res.classes.get(id).unwrap().name.clone(), ts))
            .collect();
        packets.push((h.events_discarded, names));
        off += pkt.len();
    }
    Run {
        classes: res.classes,
        symbols: (res.stats.symbols, res.stats.symbols_refused),
        cpus: res.stats.cpus,
        formats: res.formats,
        packets,
        out,
        _dir: dir,
    }
}

/// The block_rq_issue payloads of an output file, decoded by the class's field types.
fn block_issues(r: &Run) -> Vec<(u32, u64, u32, u32)> {
    let class = r
        .classes
        .iter()
        .find(|c| c.name == "block_rq_issue")
        .unwrap();
    let types: Vec<FieldType> = class.fields.iter().map(|f| f.ty).collect();
    assert_eq!(
        class
            .fields
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        [
            "tid",
            "dev",
            "sector",
            "nr_sector",
            "bytes",
            "rwbs",
            "comm",
            "cmd"
        ]
    );
    assert_eq!(types[5], FieldType::U32, "rwbs as LTTng's flag bits");
    // Every event of the output, raw: header (4 or 16 bytes), then the payload.
    let bytes = fs::read(&r.out).unwrap();
    let mut out = Vec::new();
    let mut off = 0;
    while off < bytes.len() {
        let h = PacketHeader::parse(&bytes[off..]);
        let end = off + (h.content_size / 8) as usize;
        let mut at = off + abi::PACKET_HDR_SIZE;
        while at < end {
            let (id, hl) = match le_u32(&bytes, at) & 31 {
                31 => (le_u32(&bytes, at + 4), 16),
                id => (id, 4),
            };
            let p = &bytes[at + hl..];
            let c = r.classes.get(id).unwrap();
            let len = payload_len(&c.fields.iter().map(|f| f.ty).collect::<Vec<_>>(), p);
            if id == class.id {
                let sector = le_u64(p, 8);
                out.push((le_u32(p, 4), sector, le_u32(p, 16), le_u32(p, 24)));
            }
            at = (at + hl + len).next_multiple_of(4);
        }
        off += (h.packet_size / 8) as usize;
    }
    out
}

fn payload_len(types: &[FieldType], p: &[u8]) -> usize {
    let mut n = 0;
    for t in types {
        n += match *t {
            FieldType::Chars(k) => k as usize,
            FieldType::String => p[n..].iter().position(|&c| c == 0).unwrap() + 1,
            t => t.integer().unwrap().0 as usize,
        };
    }
    n
}

#[test]
fn real_guest_pages_decode_to_lttng_block_events() {
    // One CPU's pages (a channel carries one CPU's, in order).
    let pages: Vec<Vec<u8>> = fs::read(fixtures().join("cpu0.pages"))
        .unwrap()
        .chunks(4096)
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(pages.len(), 6);
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let r = run(&guest_formats(), &[wire_packet(0, 0, &refs, None)]);
    let c = &r.cpus[0];
    assert_eq!((c.bad_pages, c.ts_clamped, c.pages), (0, 0, 6), "{c:?}");
    assert!(
        c.recorded > 10 && c.unknown_type > 0,
        "{c:?} (sched records have no format here)"
    );
    // The formats of the events that occurred, as published, for exports.
    let kept: Vec<&str> = r.formats.events.keys().map(String::as_str).collect();
    assert!(kept.contains(&"block/block_rq_issue"), "{kept:?}");
    let published = fs::read_to_string(fixtures().join("block.block_rq_issue.format")).unwrap();
    assert_eq!(r.formats.events["block/block_rq_issue"], published);
    assert!(r.formats.header_page.contains("commit"));
    let issues = block_issues(&r);
    assert!(!issues.is_empty());
    for (dev, sector, nr, rwbs) in issues {
        assert_eq!(dev >> 20, 254, "virtio-blk's major");
        assert!(
            nr == 8 || nr == 128,
            "the workload's 4 KiB and 64 KiB requests: {nr}"
        );
        assert!(sector < 64 << 11, "inside the 64 MiB disk: {sector}");
        // reads of 64 KiB, writes of 4 KiB (dd in the guest); WRITE = 1, READ = 4
        assert_eq!(
            rwbs & 0b101,
            if nr == 128 { 4 } else { 1 },
            "rwbs {rwbs:#x}"
        );
    }
    let mut last = 0;
    for (_, evs) in &r.packets {
        for (_, ts) in evs {
            assert!(*ts >= last, "time goes forward in a CPU's stream");
            last = *ts;
        }
    }
}

#[test]
fn losses_come_from_ftraces_counters_and_pages() {
    let hp = HeaderPage::default();
    let mut formats = guest_formats();
    let id = block_rq_issue_id();
    let mut rec = vec![0u8; 64];
    rec[0..2].copy_from_slice(&id.to_le_bytes());
    rec[32..34].copy_from_slice(b"RS");
    let mut p1 = PageBuilder::new(hp, 4096, 1_000).missed(5);
    (0..3).for_each(|i| p1.record(1_000 + i, &rec, false));
    let mut p2 = PageBuilder::new(hp, 4096, 2_000);
    (0..3).for_each(|i| p2.record(2_000 + i, &rec, false));
    let (p1, p2) = (p1.finish(), p2.finish());
    // entries, overrun, commit overrun, dropped, read, bytes, clock_reset, pages
    let stats = [0, 9, 0, 0, 6, 0, 0, 2];
    formats.push(text(
        FtraceFile::Format,
        "block",
        "block.block_rq_complete.format",
    ));
    let r = run(
        &formats,
        &[
            wire_packet(0, 0, &[&p1], None),
            wire_packet(0, 1, &[&p2], Some(stats)),
        ],
    );
    let c = &r.cpus[0];
    assert_eq!(
        (c.recorded, c.lost, c.produced, c.overrun),
        (6, 9, 15, 9),
        "{c:?}"
    );
    assert_eq!(c.recorded + c.lost, c.produced);
    // the losses before the first event get their own packet, the rest is at the end
    let discarded: Vec<u64> = r.packets.iter().map(|p| p.0).collect();
    assert_eq!(discarded, [0, 9], "{:?}", r.packets);
    assert_eq!(r.packets[0].1.len(), 0);
    let rwbs = block_issues(&r).iter().map(|i| i.3).collect::<Vec<_>>();
    assert_eq!(rwbs, [4 | 32; 6], "RS: read, sync");
}

#[test]
fn the_kernel_symbols_are_checked_into_the_recordings_directory() {
    let p = PageBuilder::new(HeaderPage::default(), 4096, 50).finish();
    let chunks: [&[u8]; 2] = [
        b"ffffffff8aa00000 T _text\nffffffff8aa02460 T do_one_initcall\n",
        b"ffffffffc0a01000 t virtblk_probe\t[virtio_blk]\nffffffff81000000 T \x1b[2Jevil\n",
    ];
    let events = [
        (abi::IVT_FTRACE_EV_PAGE, &p[..]),
        (abi::IVT_FTRACE_EV_SYMBOLS, chunks[0]),
        (abi::IVT_FTRACE_EV_SYMBOLS, chunks[1]),
    ];
    let r = run(&guest_formats(), &[wire_events_packet(0, 0, &events, None)]);
    assert_eq!(
        r.symbols,
        (3, 1),
        "three lines kept, the escape sequence refused"
    );
    let root = r.out.parent().unwrap().parent().unwrap();
    let text = fs::read_to_string(root.join("kallsyms")).unwrap();
    assert_eq!(
        text,
        "ffffffff8aa00000 T _text\nffffffff8aa02460 T do_one_initcall\n\
         ffffffffc0a01000 t virtblk_probe\t[virtio_blk]\n"
    );
    assert_eq!(
        r.cpus[0].pages, 1,
        "the page still decodes: {:?}",
        r.cpus[0]
    );
}

#[test]
fn absurd_counters_are_clamped_to_what_ctf_readers_accept() {
    let p = PageBuilder::new(HeaderPage::default(), 4096, 50);
    let stats = [0, u64::MAX, u64::MAX, 7, 0, 0, 0, 1];
    let r = run(
        &guest_formats(),
        &[wire_packet(0, 0, &[&p.finish()], Some(stats))],
    );
    let c = &r.cpus[0];
    assert!(c.lost_clamped && c.lost == u64::MAX, "{c:?}");
    let last = r.packets.last().unwrap().0;
    assert_eq!(last, i64::MAX as u64, "{:?}", r.packets);
}

#[test]
fn without_counters_the_pages_marks_are_the_losses() {
    let hp = HeaderPage::default();
    let mut p = PageBuilder::new(hp, 4096, 50).missed(4);
    p.record(60, &[0u8; 16], false);
    let r = run(&guest_formats(), &[wire_packet(0, 0, &[&p.finish()], None)]);
    let c = &r.cpus[0];
    assert!(c.no_stats && c.lost == 4 && c.unknown_type == 1, "{c:?}");
}

#[test]
fn hostile_pages_and_formats_never_panic() {
    let mut formats = guest_formats();
    for (i, junk) in ["name: x\nID: 1\nformat:\n\tfield:char a[99999999];\toffset:0;\tsize:4;",
        "name: \nID: 99999999\n", "ID: 2\n", "\u{0}\u{1}garbage", "name: y\nID: 3\nformat:\n\tfield:int common_type;\toffset:0;\tsize:2;signed:0;\n\tfield:int v;\toffset:4000000;\tsize:8;signed:1;\n"]
        .iter()
        .enumerate()
    {
        formats.push(FtraceText {
            file: if i == 3 { FtraceFile::HeaderPage } else { FtraceFile::Format },
            system: "s".into(),
            text: junk.as_bytes().to_vec(),
        });
    }
    let mut page = vec![0u8; 4096];
    let mut x = 0x9e37_79b9_u32;
    let mut packets = Vec::new();
    for seq in 0..40u64 {
        for b in page.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
        page[8..16].copy_from_slice(&(x as u64 & 0xfff).to_le_bytes());
        let stats = (seq % 3 == 0).then_some([u64::MAX; 8]);
        packets.push(wire_packet(0, seq, &[&page], stats));
    }
    let r = run(&formats, &packets);
    assert_eq!(r.cpus.len(), 1);
}

/// A guest whose published format puts a field at the end of the address
/// space: the format is refused and counted, its records are counted as of
/// no format, the rest of the CPU's events are written (issue 23, case 1:
/// `off + size` overflowed and the recorder exited 101).
#[test]
fn a_format_with_overflowing_offsets_is_refused_not_a_crash() {
    let mut formats = guest_formats();
    let hostile = |id: u16, off: &str, size: &str| {
        FtraceText {
        file: FtraceFile::Format,
        system: "evil".into(),
        text: format!(
            "name: e{id}\nID: {id}\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\tfield:u64 v;\toffset:{off};\tsize:{size};\tsigned:0;\n"
        )
        .into_bytes(),
    }
    };
    formats.push(hostile(901, "18446744073709551615", "8"));
    formats.push(hostile(902, "8", "18446744073709551615"));
    let good = block_rq_issue_id();
    let mut page = PageBuilder::new(HeaderPage::default(), 4096, 1_000);
    for (i, ty) in [901u16, good, 902, good].iter().enumerate() {
        let mut rec = vec![0u8; 64];
        rec[0..2].copy_from_slice(&ty.to_le_bytes());
        page.record(1_000 + i as u64, &rec, false);
    }
    let r = run(&formats, &[wire_packet(0, 0, &[&page.finish()], None)]);
    let c = &r.cpus[0];
    assert_eq!((c.recorded, c.unknown_type), (2, 2), "{c:?}");
    let names: Vec<&str> = r
        .packets
        .iter()
        .flat_map(|p| p.1.iter().map(|e| e.0.as_str()))
        .collect();
    assert_eq!(names, ["block_rq_issue", "block_rq_issue"]);
}

/// Case 2 for the ftrace relay: one page whose records claim a time the
/// kernel trace's clock cannot express (near 2^63) was written as it was,
/// and babeltrace2 refused the whole kernel trace; a page from after the
/// relay wrote it pushed every later record of its CPU to its time
/// (clamped). Both are skipped now, their records counted lost, and the
/// pages around them written as they are.
#[test]
fn pages_out_of_time_are_skipped_and_counted() {
    let id = block_rq_issue_id();
    let mut rec = vec![0u8; 64];
    rec[0..2].copy_from_slice(&id.to_le_bytes());
    let page = |t0: u64| {
        let mut p = PageBuilder::new(HeaderPage::default(), 4096, t0);
        (0..3).for_each(|i| p.record(t0 + i, &rec, false));
        p.finish()
    };
    let ticks = TickRange {
        min: 0,
        max: 1 << 62,
    };
    let packets = [
        wire_packet_at(0, 0, 2_000_000, &[&page(1_000)], None),
        wire_packet_at(0, 1, 3_000_000, &[&page(1 << 63)], None),
        wire_packet_at(0, 2, 4_000_000, &[&page(900_000_000)], None),
        wire_packet_at(0, 3, 5_000_000, &[&page(4_000_000)], None),
    ];
    let r = run_with(&guest_formats(), &packets, ticks);
    let c = &r.cpus[0];
    assert_eq!((c.pages_out_of_time, c.events_out_of_time), (2, 6), "{c:?}");
    assert_eq!((c.recorded, c.lost, c.ts_clamped), (6, 6, 0), "{c:?}");
    let times: Vec<u64> = r
        .packets
        .iter()
        .flat_map(|p| p.1.iter().map(|e| e.1))
        .collect();
    assert_eq!(
        times,
        [1_000, 1_001, 1_002, 4_000_000, 4_000_001, 4_000_002]
    );
    assert_eq!(
        r.packets.last().unwrap().0,
        6,
        "the losses reach CTF's events_discarded"
    );
}

/// The relay stamps a page's event when it reserves it and reads the page
/// into it after: ftrace records on meanwhile, for as long as the relay is
/// preempted in between (a loaded machine: milliseconds). A CI run lost
/// two disk reads' events to the bound being the page's own time (plus
/// 1 ms of skew): the bound is the relay's next event on the channel,
/// written after the read, in the same packet or the next; the channel's
/// last page has only its own time. (Skew here: 1 ms = 1,000,000 ticks.)
#[test]
fn a_page_read_after_its_event_is_bounded_by_the_relays_next_event() {
    let id = block_rq_issue_id();
    let mut rec = vec![0u8; 64];
    rec[0..2].copy_from_slice(&id.to_le_bytes());
    let page = |times: &[u64]| {
        let mut p = PageBuilder::new(HeaderPage::default(), 4096, times[0]);
        times.iter().for_each(|&t| p.record(t, &rec, false));
        p.finish()
    };
    let ev = abi::IVT_FTRACE_EV_PAGE;
    // Read 3 ms after its event, before the next page's event.
    let a = page(&[2_000, 4_000_000]);
    // Read 2 ms after its event, the last of its packet: before the next packet's.
    let b = page(&[7_000_000, 7_000_001, 7_000_002]);
    // Records after the relay's next event (the counters at 10 ms): refused.
    let c = page(&[20_000_000, 20_000_001, 20_000_002]);
    // The channel's last page, 2 ms after its own event: nothing vouches for it.
    let d = page(&[32_000_000, 32_000_001, 32_000_002]);
    let mut stats = [0u64; 8];
    stats[4] = 11; // read: every record of the four pages
    let packets = [
        wire_timed_packet(0, 0, &[(1_000_000, ev, &a), (5_000_000, ev, &b)], None),
        wire_timed_packet(0, 1, &[(9_000_000, ev, &c)], Some((10_000_000, stats))),
        wire_timed_packet(0, 2, &[(30_000_000, ev, &d)], None),
    ];
    let r = run_with(
        &guest_formats(),
        &packets,
        TickRange {
            min: 0,
            max: 1 << 62,
        },
    );
    let c = &r.cpus[0];
    assert_eq!((c.pages_out_of_time, c.events_out_of_time), (2, 6), "{c:?}");
    assert_eq!((c.recorded, c.lost), (5, 6), "{c:?}");
    let times: Vec<u64> = r
        .packets
        .iter()
        .flat_map(|p| p.1.iter().map(|e| e.1))
        .collect();
    assert_eq!(times, [2_000, 4_000_000, 7_000_000, 7_000_001, 7_000_002]);
}

#[test]
fn names_follow_lttng_where_it_has_them() {
    assert_eq!(trace_name("block", "block_rq_issue"), "block_rq_issue");
    assert_eq!(trace_name("net", "net_dev_xmit"), "net_dev_xmit");
    assert_eq!(
        trace_name("sched", "sched_switch"),
        "ftrace:sched:sched_switch"
    );
    assert_eq!(trace_name("ftrace", "function"), "ftrace:function");
    assert_eq!(trace_name("kprobes", "myopen"), "ftrace:kprobes:myopen");
}
