//! The kernel stream's expansion: every input is a stream of the guest
//! module's events (testutil's `kernel_fuzz_region`: CPUs, then events
//! with fuzz-chosen thread ids, names, irq numbers, system call numbers,
//! timestamps), drained into a temporary directory as `ivtrace record`
//! would, so that pass 1 (the naming events of all CPUs merged in time)
//! and pass 2 (every packet rewritten with thread and irq names and
//! per-syscall classes) run on every input. Then the expanded trace is
//! walked again with the classes its sidecar declares: what the
//! expansion wrote must be well-formed.
#![no_main]

use std::path::Path;

use ivtrace_ctf::sidecar::Sidecar;
use ivtrace_region::reader::walk_own_packet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let region = ivtrace_testutil::kernel_fuzz_region(data);
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir");
    let out = dir.path().join("out");
    ivtrace_engine::session::drain_bytes_to_dir(&region, &out).expect("a model region drains");
    assert!(!out.join(".kernel-wire").exists(), "staging removed");
    rewalk(&out);
});

/// Every packet of `kernel/` walks with the expanded classes.
fn rewalk(out: &Path) {
    let text = std::fs::read(out.join("ivtrace.json")).expect("sidecar");
    let sidecar: Sidecar = serde_json::from_slice(&text).expect("sidecar parses");
    let classes = sidecar.event_classes();
    let Ok(entries) = std::fs::read_dir(out.join("kernel")) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name() == "metadata" {
            continue;
        }
        let bytes = std::fs::read(e.path()).expect("stream file");
        let mut off = 0;
        while off < bytes.len() {
            let size = u64::from_le_bytes(bytes[off + 40..off + 48].try_into().unwrap()) / 8;
            let mut packet = bytes[off..off + size as usize].to_vec();
            walk_own_packet(&mut packet, &classes, &mut ()).expect("expanded packets walk");
            off += size as usize;
        }
    }
}
