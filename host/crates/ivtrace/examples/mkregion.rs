//! Writes a region file filled by the Rust writer model (testutil), for
//! trying ivtrace without the C library and for fuzz seeds:
//!
//!     cargo run --example mkregion -- /dev/shm/x EVENTS [overwrite] [subbufs] [subbuf_size] [channels]

use ivtrace_region::abi;
use ivtrace_testutil::{RegionBuilder, TestRegion};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect(
        "usage: mkregion PATH EVENTS [overwrite|discard] [subbufs] [subbuf_size] [channels]",
    );
    let events: u64 = args.get(2).map_or(1000, |s| s.parse().expect("EVENTS"));
    let mode = if args.get(3).map(String::as_str) == Some("overwrite") {
        abi::IVT_MODE_OVERWRITE
    } else {
        abi::IVT_MODE_DISCARD
    };
    let subbufs: u32 = args.get(4).map_or(8, |s| s.parse().expect("subbufs"));
    let size: u32 = args
        .get(5)
        .map_or(4096, |s| s.parse().expect("subbuf_size"));
    let channels: u32 = args.get(6).map_or(2, |s| s.parse().expect("channels"));
    let mut b = RegionBuilder::new(channels, subbufs, size).mode(mode);
    b.features = abi::IVT_FEAT_LOOPBACK;
    let mut r = b.build_region();
    r.register_loadgen(0);
    r.register(
        1,
        40,
        "demo:text",
        &[
            ("msg", abi::IVT_FT_STRING, 0),
            ("comm", abi::IVT_FT_CHARS, 8),
            ("v", abi::IVT_FT_S32, 0),
        ],
    );
    let mut ts = 1_000_000u64;
    for i in 0..events {
        let c = (i % channels as u64) as u32;
        ts += 700 + (i % 5) * 100_000;
        if i % 10 == 9 {
            let payload = [&b"hello\0"[..], b"abcdefgh", &(-(i as i32)).to_le_bytes()].concat();
            r.emit(c, ts, 40, &payload);
        } else {
            r.emit(
                c,
                ts,
                0,
                &TestRegion::loadgen_payload(c as u16, i, &i.to_le_bytes()),
            );
        }
    }
    r.close_region();
    std::fs::write(path, &r.bytes).expect("write region");
}
