//! Writes the committed fuzz seed corpus (host/fuzz/corpus/) from the
//! writer model: small regions (trailing zeros trimmed; the fuzz target
//! zero-extends them) and single packets for the packet target.
//!
//!     cargo run --example mkseeds -- host/fuzz/corpus

use std::path::Path;

use ivtrace_region::abi;
use ivtrace_testutil::{packet_template, RegionBuilder, TestRegion};

fn trim(mut b: Vec<u8>) -> Vec<u8> {
    while b.last() == Some(&0) {
        b.pop();
    }
    b
}

fn region(mode: u32, events: u64, open_tail: bool) -> Vec<u8> {
    let mut r = RegionBuilder::new(2, 2, 4096).mode(mode).build_region();
    r.register_loadgen(0);
    r.register(
        1,
        1,
        "text",
        &[("s", abi::IVT_FT_STRING, 0), ("c", abi::IVT_FT_CHARS, 8)],
    );
    r.register(1, 40, "ext", &[("x", abi::IVT_FT_U16, 0)]);
    for i in 0..events {
        let c = (i % 2) as u32;
        let ts = 1000 + i * if i % 5 == 0 { 1 << 28 } else { 300 };
        match i % 4 {
            0 => r.emit(c, ts, 1, &[&b"msg\xff\0"[..], b"comm\0\0\0\0"].concat()),
            1 => r.emit(c, ts, 40, &7u16.to_le_bytes()),
            _ => r.emit(
                c,
                ts,
                0,
                &TestRegion::loadgen_payload(c as u16, i, &vec![3; (i % 9) as usize]),
            ),
        };
    }
    if !open_tail {
        r.close(0);
        r.close(1);
        r.close_region();
    }
    trim(r.bytes)
}

fn packets() -> Vec<Vec<u8>> {
    let mut r = packet_template();
    for i in 0..60u64 {
        let ts = 500 + i * if i % 7 == 0 { 1 << 27 } else { 90 };
        match i % 4 {
            0 => r.emit(0, ts, 1, b"hello\0abcdefgh"),
            1 => r.emit(0, ts, 2, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]),
            2 => r.emit(0, ts, 40, &9u16.to_le_bytes()),
            _ => r.emit(0, ts, 0, &TestRegion::loadgen_payload(0, i, &[5; 6])),
        };
    }
    r.close(0);
    let at = r.subbuf_offset(0, 0);
    let full = r.bytes[at..at + 4096].to_vec();
    let content = abi::le_u64(&full, abi::pkt::CONTENT_SIZE) as usize / 8;
    vec![
        full[..content].to_vec(),
        full[..content / 2].to_vec(),
        full[..abi::PACKET_HDR_SIZE + 4].to_vec(),
    ]
}

fn main() {
    let root = std::env::args().nth(1).expect("usage: mkseeds CORPUS_DIR");
    let root = Path::new(&root);
    let seeds = [
        ("model-discard", region(abi::IVT_MODE_DISCARD, 300, false)),
        (
            "model-overwrite",
            region(abi::IVT_MODE_OVERWRITE, 700, false),
        ),
        ("model-open", region(abi::IVT_MODE_DISCARD, 90, true)),
        ("model-empty", region(abi::IVT_MODE_DISCARD, 0, false)),
    ];
    for (name, bytes) in seeds {
        std::fs::write(root.join("region").join(name), bytes).expect("write seed");
    }
    for (i, p) in packets().into_iter().enumerate() {
        std::fs::write(root.join("packet").join(format!("model-{i}")), p).expect("write seed");
    }
}
