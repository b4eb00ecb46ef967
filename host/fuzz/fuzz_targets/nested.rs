//! The nested-forwarding stream as an L1 guest forwards it: chunks of
//! messages (an introduction, class metadata, L2 packets, a clock) on any
//! channel, in any order, and clock brackets. The input is a sequence of
//! records `[op][chan][len u16 LE][len bytes]`: op bit 0 picks a chunk
//! (kind = op >> 1) or a sync point. Reassembly, the messages' JSON and
//! the forwarded packets are refused or counted, never a panic, and
//! finishing writes whatever guests were introduced.
#![no_main]

use ivtrace_ctf::OutDir;
use ivtrace_fuzz::mapping_from;
use ivtrace_nested::Expander;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let root = OutDir::root(tmp.path(), &Default::default()).expect("the output root");
    let mut x = Expander::new(&root);
    let mut rest = data;
    while let [op, chan, l0, l1, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*l0, *l1])).min(tail.len());
        let (body, next) = tail.split_at(len);
        let chan = u32::from(*chan % 4);
        if op & 1 == 0 {
            x.chunk(chan, u32::from(op >> 1), body);
        } else {
            let mut b = [0u8; 20];
            let n = body.len().min(20);
            b[..n].copy_from_slice(&body[..n]);
            let ticks = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
            let mono = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
            let phase = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
            x.sync(chan, ticks, mono, phase);
        }
        rest = next;
    }
    let outer = mapping_from(data);
    let _ = x.finish(&outer, "fuzz");
});
