//! Arbitrary bytes as a whole region file, through open/validate/drain
//! into a temporary directory. Any outcome but a panic is fine.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let image = ivtrace_testutil::region_image(data);
    // tmpfs when there is one: the drain writes files every run.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir");
    let _ = ivtrace_engine::session::drain_bytes_to_dir(&image, &dir.path().join("out"));
});
