//! Arbitrary packet bytes against a fixed set of event classes: the walker
//! directly, then the whole drain path (header checks, walk, rewrite) with
//! the packet as a complete packet and as a committed prefix.
#![no_main]

use ivtrace_fuzz::mapping_from;
use ivtrace_region::packet::{self, PacketHeader, TickRange};
use ivtrace_region::reader::PacketSink;
use ivtrace_region::{abi, meta::ScanMode, Access, EventClasses, Reader, Region};
use ivtrace_testutil::{packet_template, region_with_packet};
use libfuzzer_sys::fuzz_target;

struct Discard;

impl PacketSink for Discard {
    type Error = ();
    fn packet(&mut self, _c: u32, _s: u32, bytes: &[u8], classes: &EventClasses) -> Result<(), ()> {
        // What the drain emits must walk cleanly again (report relies on it).
        let mut copy = bytes.to_vec();
        ivtrace_region::reader::walk_own_packet(&mut copy, classes, &mut ())
            .expect("emitted packets re-walk");
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < abi::PACKET_HDR_SIZE {
        return;
    }
    let template =
        Region::from_bytes(&packet_template().bytes, Access::ReadOnly).expect("template");
    let mut reader = Reader::new(template, TickRange::ALL);
    reader.scan_metadata(ScanMode::Final);
    let h = PacketHeader::parse(data);
    let mut copy = data[..data.len().min(4096)].to_vec();
    let _ = packet::walk(
        &mut copy,
        reader.classes().stream(1),
        h.timestamp_begin,
        Some(h.timestamp_end),
        &mut (),
    );
    // The drain checks packets against what a clock of the guest's
    // frequency can express; the fuzzer picks the clock too.
    let ticks = mapping_from(data).expressible();
    for complete in [true, false] {
        let region = Region::from_bytes(&region_with_packet(data, complete), Access::ReadWrite)
            .expect("valid region");
        let mut reader = Reader::new(region, ticks);
        let _ = reader.drain_available(&mut Discard);
        let _ = reader.flush_partial(&mut Discard);
        let _ = reader.finish(&mut Discard);
    }
});
