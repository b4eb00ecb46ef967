//! Property tests: valid regions and packets, mutated at random, through
//! the whole pipeline. Every outcome must be Ok or a typed error (or a
//! counted skip); nothing may panic; nothing may be written outside the
//! output directory, and only names ivtrace chose may appear inside it.

use std::path::Path;

use proptest::prelude::*;

use ivtrace_region::abi;
use ivtrace_region::{Access, Region};
use ivtrace_testutil::{region_with_packet, RegionBuilder, TestRegion};

/// A small valid region with events of every field type on two channels.
fn valid_region(events: u64, overwrite: bool) -> Vec<u8> {
    let mode = if overwrite {
        abi::IVT_MODE_OVERWRITE
    } else {
        abi::IVT_MODE_DISCARD
    };
    let mut r = RegionBuilder::new(2, 2, 4096).mode(mode).build_region();
    r.register_loadgen(0);
    r.register(
        1,
        3,
        "text",
        &[
            ("s", abi::IVT_FT_STRING, 0),
            ("c", abi::IVT_FT_CHARS, 4),
            ("v", abi::IVT_FT_S16, 0),
        ],
    );
    for i in 0..events {
        let c = (i % 2) as u32;
        if i % 3 == 0 {
            r.emit(
                c,
                100 + i * (1 << 20),
                3,
                &[&b"str\0abcd"[..], &7i16.to_le_bytes()].concat(),
            );
        } else {
            r.emit(
                c,
                100 + i * 1000,
                0,
                &TestRegion::loadgen_payload(c as u16, i, &vec![9; (i % 20) as usize]),
            );
        }
    }
    r.close_region();
    r.bytes
}

/// Byte offsets worth hitting: the header page, the channel table, the
/// metadata area, the first sub-buffer headers, anywhere.
fn interesting_offset(len: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..256,
        4096usize..4096 + 512,
        8192usize..8192 + 1024,
        (12288usize..12288 + 256),
        (16384usize..16384 + 256),
        0..len,
    ]
}

fn mutations(len: usize) -> impl Strategy<Value = Vec<(usize, u8)>> {
    prop::collection::vec((interesting_offset(len), any::<u8>()), 1..24)
}

/// Everything under `root` is `out` or inside it, with ivtrace's names.
fn assert_only_expected_files(root: &Path, out: &Path) {
    for entry in std::fs::read_dir(root).unwrap() {
        let p = entry.unwrap().path();
        assert_eq!(
            p, out,
            "unexpected entry {p:?} next to the output directory"
        );
    }
    if !out.exists() {
        return;
    }
    for entry in std::fs::read_dir(out).unwrap() {
        let e = entry.unwrap();
        let name = e.file_name().into_string().unwrap();
        match name.as_str() {
            "ivtrace.json" => {}
            "user" | "kernel" => {
                for f in std::fs::read_dir(e.path()).unwrap() {
                    let f = f.unwrap().file_name().into_string().unwrap();
                    // A region whose layout says it has ftrace channels
                    // gets their decoded streams in the kernel trace.
                    let chan = |prefix: &str| {
                        f.strip_prefix(prefix)
                            .is_some_and(|n| n.parse::<u32>().is_ok())
                    };
                    let ok = f == "metadata"
                        || (name == "user" && f == ivtrace_ctf::trace::NO_CHANNEL_FILE)
                        || chan(&format!("{name}_chan"))
                        || (name == "kernel" && chan("ftrace_chan"));
                    assert!(ok, "unexpected file {name}/{f}");
                }
            }
            other => panic!("unexpected entry {other} in the output directory"),
        }
    }
}

fn drain_into_tempdir(bytes: &[u8]) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    match ivtrace_engine::session::drain_bytes_to_dir(bytes, &out) {
        Ok(_) => assert!(out.join("ivtrace.json").is_file()),
        Err(e) => {
            // A hostile region is refused as a region or by the writer,
            // never by anything else (the output directory is fresh).
            let typed = matches!(
                e,
                ivtrace_engine::EngineError::RegionBytes(_) | ivtrace_engine::EngineError::Ctf(_)
            );
            assert!(typed, "unexpected error: {e:?}");
        }
    }
    assert_only_expected_files(tmp.path(), &out);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_regions_never_panic_or_escape(events in 0u64..400, overwrite: bool, seed_muts in mutations(1 << 16)) {
        let mut bytes = valid_region(events, overwrite);
        for (off, v) in seed_muts {
            let off = off % bytes.len();
            bytes[off] = v;
        }
        drain_into_tempdir(&bytes);
    }

    #[test]
    fn mutated_packets_are_emitted_valid_or_skipped(events in 1u64..200, muts in prop::collection::vec((0usize..4096, any::<u8>()), 1..16), complete: bool) {
        let mut r = RegionBuilder::new(1, 2, 4096).build_region();
        r.register_loadgen(0);
        for i in 0..events {
            r.emit(0, 50 + i * 77, 0, &TestRegion::loadgen_payload(0, i, &vec![1; (i % 13) as usize]));
        }
        r.close(0);
        let at = r.subbuf_offset(0, 0);
        let mut packet = r.bytes[at..at + 4096].to_vec();
        for (off, v) in muts {
            packet[off] = v;
        }
        let bytes = region_with_packet(&packet, complete);
        let region = Region::from_bytes(&bytes, Access::ReadWrite).unwrap();
        let mut reader = ivtrace_region::Reader::new(region, ivtrace_region::packet::TickRange::ALL);
        struct Check;
        impl ivtrace_region::PacketSink for Check {
            type Error = ();
            fn packet(&mut self, _c: u32, _s: u32, b: &[u8], classes: &ivtrace_region::EventClasses) -> Result<(), ()> {
                let mut copy = b.to_vec();
                ivtrace_region::reader::walk_own_packet(&mut copy, classes, &mut ()).map(|_| ()).map_err(|e| panic!("emitted packet does not re-walk: {e}"))
            }
        }
        reader.drain_available(&mut Check).unwrap();
        reader.flush_partial(&mut Check).unwrap();
        reader.finish(&mut Check).unwrap();
        let st = reader.channel_stats(0);
        // A packet either made it out, or its skip was counted.
        prop_assert!(st.packets >= 1 || st.skipped.values().sum::<u64>() >= 1);
    }

    #[test]
    fn random_bytes_as_a_region_are_refused_or_drained(data in prop::collection::vec(any::<u8>(), 0..2048)) {
        let image = ivtrace_testutil::region_image(&data);
        drain_into_tempdir(&image);
    }
}

#[test]
fn template_packets_pass_unmutated() {
    let bytes = valid_region(100, false);
    let tmp = tempfile::tempdir().unwrap();
    let events = ivtrace_engine::session::drain_bytes_to_dir(&bytes, tmp.path()).unwrap();
    assert!(
        events > 0,
        "the unmutated region drains (so mutations test something)"
    );
}

/// Found by the region fuzzer: writer drop counters near u64::MAX
/// overflowed the loss totals.
#[test]
fn huge_guest_drop_counters_saturate() {
    let mut r = RegionBuilder::new(2, 2, 4096).build_region();
    r.register_loadgen(0);
    r.emit(0, 10, 0, &TestRegion::loadgen_payload(0, 0, &[]));
    r.close_region();
    for (chan, field) in [
        (0, abi::chan::LOST_FULL),
        (0, abi::chan::LOST_TOO_BIG),
        (1, abi::chan::LOST_NESTED),
    ] {
        r.set_chan_u64(chan, field, u64::MAX - 1);
    }
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(
        ivtrace_engine::session::drain_bytes_to_dir(&r.bytes, tmp.path()).unwrap(),
        1
    );
    let side: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("ivtrace.json")).unwrap()).unwrap();
    assert_eq!(side["channels"][0]["lost"]["full"], u64::MAX - 1);
}
