//! Runs the clock exchange against a live region, as `ivtrace record` does
//! on ivshmem-plain (the writer met at its control poll), and prints what
//! each burst kept and the mapping with its bound:
//!
//! ```sh
//! cargo run --release --example sync_probe -- /dev/shm/NAME [SECONDS]
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use ivtrace_region::region::Access;
use ivtrace_region::Region;
use ivtrace_time::pingpong::{Entry, PingPong};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: sync_probe /dev/shm/NAME [SECONDS]");
        std::process::exit(2);
    };
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let region = loop {
        match Region::open(Path::new(&path), Access::ReadWrite) {
            Ok(r) => break r,
            Err(e) => {
                eprintln!("waiting for the region: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    };
    let ms = match region.protocol().flush_interval_ms() {
        0 => 100,
        ms => ms,
    };
    let period = Duration::from_millis(ms.into());
    let mut pp = PingPong::new(&region, Entry::Poll { period }, Duration::from_secs(1));
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        std::thread::sleep(pp.until_due());
        if let Some(p) = pp.step(&region) {
            println!("point: rtt {} ns at {}", p.rtt_ns, p.host_ns);
        }
    }
    let r = pp.report();
    println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    println!("mapping: {:?}", pp.mapping());
}
