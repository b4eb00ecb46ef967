//! Probe KVM's guest clock parameters for a QEMU process, as `ivtrace serve`
//! reads them (debugfs TSC offset/scaling per vCPU), and the composed
//! guest-TSC -> host-time mapping over one second:
//!
//! ```sh
//! cargo run --release --example kvmclock_probe -- <qemu pid>
//! ```

use ivtrace_time::kvm::{read_vcpus, KvmTsc};
use ivtrace_time::ClockEstimator;

fn main() {
    let Some(pid) = std::env::args().nth(1).and_then(|p| p.parse::<i32>().ok()) else {
        eprintln!("usage: kvmclock_probe <qemu pid>");
        std::process::exit(2);
    };
    match KvmTsc::start(pid) {
        Ok(mut k) => {
            println!("VM directory: {}", k.vm_dir().display());
            for (i, v) in read_vcpus(k.vm_dir()).unwrap_or_default() {
                println!(
                    "vcpu{i}: tsc-offset {} ratio {} frac-bits {} (scale {})",
                    v.offset,
                    v.ratio,
                    v.frac_bits,
                    v.scale()
                );
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
            println!("mapping: {:?}", k.finish());
        }
        Err(why) => {
            println!("no KVM clock for pid {pid}: {why}");
            std::process::exit(1);
        }
    }
}
