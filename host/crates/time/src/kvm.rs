//! Guest TSC -> host time under KVM, from what KVM publishes in debugfs
//! (docs/kvm.md "Guest time under KVM"), composed with a fit of the host's own TSC
//! against the host time base.
//!
//! KVM: `guest_tsc = ((host_tsc * ratio) >> frac_bits) + tsc_offset`
//! (mod 2^64), per vCPU, in `/sys/kernel/debug/kvm/<pid>-<fd>/vcpuN/`:
//! `tsc-offset` (signed), and with TSC scaling `tsc-scaling-ratio` and
//! `tsc-scaling-ratio-frac-bits`. `<fd>` is QEMU's `anon_inode:kvm-vm`
//! descriptor. The host TSC is fitted against [`crate::timebase`] by
//! minimum-gap samples at the start and the end. The result is exact up to
//! that fit (and to vCPUs disagreeing, which the bound includes). A TSC
//! write during the recording (guest reset, migration) changes the offset:
//! [`KvmTsc::follow`] takes KVM's `kvm_write_tsc_offset` events into a
//! [`VersionedTsc`] (one version per change, its start time known); a
//! change found only by reading debugfs again at the end is a version of
//! unknown start, and widens the single CTF clock's bound by the change
//! (the trace's clock is one line until the writer converts per version).
//!
//! Needs root and a mounted debugfs; otherwise the caller falls back to
//! the ping-pong ([`crate::pingpong`]).

use std::fs;
use std::path::{Path, PathBuf};

use crate::estimator::{rdtsc, ClockEstimator};
use crate::mapping::ClockMapping;
use crate::timebase::host_now_ns;
use crate::versioned::{HostTscLine, TscWrite, VersionedTsc};

/// One vCPU's TSC parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VcpuTsc {
    pub offset: i64,
    pub ratio: u64,
    pub frac_bits: u32,
}

impl VcpuTsc {
    /// The guest TSC at host TSC `host`.
    pub fn guest_at(&self, host: u64) -> u64 {
        let scaled = if self.frac_bits >= 64 {
            0
        } else {
            ((host as u128 * self.ratio as u128) >> self.frac_bits) as u64
        };
        scaled.wrapping_add(self.offset as u64)
    }

    /// Guest ticks per host tick (1.0 without scaling).
    pub fn scale(&self) -> f64 {
        self.ratio as f64 / 2f64.powi(self.frac_bits as i32)
    }
}

/// Where debugfs is mounted, if it is.
pub fn debugfs_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, ty) = (f.next()?, f.next()?, f.next()?);
        (ty == "debugfs").then(|| PathBuf::from(dir))
    })
}

/// The VM's debugfs directory: `<debugfs>/kvm/<pid>-<fd>` where `fd` is
/// the process's `anon_inode:kvm-vm` descriptor. `Err` says why not.
pub fn find_vm_dir(debugfs: &Path, proc_root: &Path, pid: i32) -> Result<PathBuf, String> {
    let fd_dir = proc_root.join(pid.to_string()).join("fd");
    let entries =
        fs::read_dir(&fd_dir).map_err(|e| format!("cannot list {}: {e}", fd_dir.display()))?;
    let mut vm_fds = Vec::new();
    for e in entries.flatten() {
        if let Ok(target) = fs::read_link(e.path()) {
            if target.as_os_str() == "anon_inode:kvm-vm" {
                vm_fds.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    let fd = match vm_fds.as_slice() {
        [] => return Err(format!("process {pid} has no KVM VM (not using KVM: TCG?)")),
        [fd] => fd.clone(),
        _ => return Err(format!("process {pid} has {} KVM VMs", vm_fds.len())),
    };
    let dir = debugfs.join("kvm").join(format!("{pid}-{fd}"));
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!(
            "{} does not exist (debugfs without KVM entries?)",
            dir.display()
        ))
    }
}

fn read_num<T: std::str::FromStr>(p: &Path) -> Option<T> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// The TSC parameters of every vCPU in `vm_dir`, by vCPU index.
pub fn read_vcpus(vm_dir: &Path) -> Result<Vec<(u32, VcpuTsc)>, String> {
    let mut out = Vec::new();
    let entries =
        fs::read_dir(vm_dir).map_err(|e| format!("cannot list {}: {e}", vm_dir.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(idx) = name
            .strip_prefix("vcpu")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let d = e.path();
        let offset: i64 = read_num(&d.join("tsc-offset"))
            .ok_or_else(|| format!("cannot read {}/tsc-offset", d.display()))?;
        // Without TSC scaling support the files do not exist: identity.
        let frac_bits: u32 = read_num(&d.join("tsc-scaling-ratio-frac-bits")).unwrap_or(48);
        let ratio: u64 =
            read_num(&d.join("tsc-scaling-ratio")).unwrap_or(1u64 << frac_bits.min(63));
        out.push((
            idx,
            VcpuTsc {
                offset,
                ratio,
                frac_bits,
            },
        ));
    }
    if out.is_empty() {
        return Err(format!("no vcpu* directory in {}", vm_dir.display()));
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out)
}

/// A (host TSC, host time) pair: the TSC midpoint around a time read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSample {
    pub tsc: u64,
    pub ns: u64,
    pub gap_ticks: u64,
}

/// The tightest of 64 samples.
pub fn host_sample() -> HostSample {
    (0..64)
        .map(|_| {
            let a = rdtsc();
            let ns = host_now_ns();
            let b = rdtsc();
            let gap = b.saturating_sub(a);
            HostSample {
                tsc: a + gap / 2,
                ns,
                gap_ticks: gap,
            }
        })
        .min_by_key(|s| s.gap_ticks)
        .expect("64 samples")
}

/// Composes the host TSC fit (two samples) with vCPU TSC parameters.
/// `spread_ns`: how far the vCPUs' offsets disagree, in ns.
pub fn compose(a: HostSample, b: HostSample, v: VcpuTsc, spread_ns: u64) -> Option<ClockMapping> {
    let span_ns = b.ns.checked_sub(a.ns)?;
    let span_ticks = b.tsc.checked_sub(a.tsc)?;
    if span_ns == 0 || span_ticks == 0 {
        return None;
    }
    let host_freq = span_ticks as f64 * 1e9 / span_ns as f64;
    let guest_freq = (host_freq * v.scale()).round();
    if !(1e3..=1e11).contains(&guest_freq) {
        return None;
    }
    let gap_ns = |g: u64| (g as f64 * 1e9 / host_freq) as u64;
    // Each fit point is within half its gap of the truth (plus a tick of
    // scaling and a ns of frequency rounding per second of span).
    let error = gap_ns(a.gap_ticks.max(b.gap_ticks)) / 2 + gap_ns(1) + 2 + spread_ns;
    Some(ClockMapping {
        freq_hz: guest_freq as u64,
        ref_ticks: v.guest_at(a.tsc),
        ref_realtime_ns: a.ns,
        error_ns: error,
        method: "kvm-tsc-offset (debugfs)".into(),
        coarse: false,
        samples: 2,
    })
}

/// [`ClockEstimator`] from KVM's debugfs.
pub struct KvmTsc {
    vm_dir: PathBuf,
    vcpus: Vec<(u32, VcpuTsc)>,
    start: HostSample,
    /// Set when the parameters changed during the recording.
    pub changed: Option<String>,
    /// Writes of the TSC offset that came before a host line existed (the
    /// versions need two host samples), applied at [`KvmTsc::versions`].
    writes: Vec<TscWrite>,
    /// The versions, once the recording ended (debugfs read again).
    versioned: Option<VersionedTsc>,
}

impl KvmTsc {
    /// Reads the VM of process `pid`. `Err` says why KVM time is not
    /// available (the caller falls back to the ping-pong).
    pub fn start(pid: i32) -> Result<KvmTsc, String> {
        let debugfs = debugfs_root().ok_or_else(|| {
            "debugfs is not mounted (mount -t debugfs none /sys/kernel/debug)".to_string()
        })?;
        let vm_dir = find_vm_dir(&debugfs, Path::new("/proc"), pid)?;
        let vcpus = read_vcpus(&vm_dir)?;
        Ok(KvmTsc {
            vm_dir,
            vcpus,
            start: host_sample(),
            changed: None,
            writes: Vec::new(),
            versioned: None,
        })
    }

    /// One `kvm_write_tsc_offset` of this VM (ivtrace-tracefs's `kvmtsc`):
    /// a version of the mapping starts there. Kept at most
    /// [`crate::versioned::VERSIONS_MAX`] per vCPU's worth; past that,
    /// counted as rejected when applied.
    pub fn follow(&mut self, w: TscWrite) {
        let cap = crate::versioned::VERSIONS_MAX * self.vcpus.len().max(1);
        if self.writes.len() < cap {
            self.writes.push(w);
        }
    }

    /// The versioned mapping (after [`ClockEstimator::finish`]): the
    /// parameters at the start, each write followed, and a version of
    /// unknown start for a change debugfs showed at the end that no write
    /// explained.
    pub fn versions(&self) -> Option<&VersionedTsc> {
        self.versioned.as_ref()
    }

    fn build_versions(&self, end: HostSample, now: &[(u32, VcpuTsc)]) -> Option<VersionedTsc> {
        let line = HostTscLine::through(self.start, end)?;
        let mut v = VersionedTsc::new(line, self.start.ns, &self.vcpus)?;
        for w in &self.writes {
            let _ = v.apply(w);
        }
        v.observed(end.ns, now);
        Some(v)
    }

    pub fn vm_dir(&self) -> &Path {
        &self.vm_dir
    }

    fn spread_ns(vcpus: &[(u32, VcpuTsc)], freq: f64) -> u64 {
        let min = vcpus.iter().map(|(_, v)| v.offset).min().unwrap_or(0);
        let max = vcpus.iter().map(|(_, v)| v.offset).max().unwrap_or(0);
        ((max as i128 - min as i128) as f64 * 1e9 / freq.max(1.0)) as u64
    }

    fn mapping_with(&self, end: HostSample) -> Option<ClockMapping> {
        let v = self.vcpus.first()?.1;
        let freq = 2.0e9; // only scales the spread, which is normally 0
        compose(self.start, end, v, Self::spread_ns(&self.vcpus, freq))
    }
}

impl ClockEstimator for KvmTsc {
    fn initial(&self) -> ClockMapping {
        // A short host fit now; finish() refits over the whole recording.
        std::thread::sleep(std::time::Duration::from_millis(20));
        self.mapping_with(host_sample())
            .unwrap_or_else(|| ClockMapping {
                freq_hz: 1_000_000_000,
                ref_ticks: 0,
                ref_realtime_ns: 0,
                error_ns: u64::MAX / 4,
                method: "kvm-tsc-offset (no host fit)".into(),
                coarse: true,
                samples: 0,
            })
    }

    fn finish(&mut self) -> ClockMapping {
        let end = host_sample();
        let mut m = self.initial_from(end);
        let now = read_vcpus(&self.vm_dir).ok();
        self.versioned = self.build_versions(end, now.as_deref().unwrap_or(&self.vcpus));
        if let Some(now) = now {
            if now != self.vcpus {
                let d = now
                    .iter()
                    .zip(&self.vcpus)
                    .map(|((_, a), (_, b))| (a.offset as i128 - b.offset as i128).unsigned_abs())
                    .max()
                    .unwrap_or(0);
                let d_ns = (d as f64 * 1e9 / m.freq_hz.max(1) as f64) as u64;
                self.changed = Some(format!(
                    "vCPU TSC parameters changed during the recording (offset moved by {d} ticks)"
                ));
                m.error_ns = m.error_ns.saturating_add(d_ns);
                m.method = "kvm-tsc-offset (debugfs; offset changed)".into();
            }
        }
        m
    }
}

impl KvmTsc {
    fn initial_from(&self, end: HostSample) -> ClockMapping {
        self.mapping_with(end).unwrap_or_else(|| self.initial())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_dir_is_found_from_the_kvm_vm_descriptor() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_fd = tmp.path().join("proc/4242/fd");
        fs::create_dir_all(&proc_fd).unwrap();
        std::os::unix::fs::symlink("/dev/null", proc_fd.join("3")).unwrap();
        std::os::unix::fs::symlink("anon_inode:kvm-vm", proc_fd.join("11")).unwrap();
        let vm = tmp.path().join("debug/kvm/4242-11");
        for (i, off) in [(0, "-123456789"), (1, "-123456789")] {
            let d = vm.join(format!("vcpu{i}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("tsc-offset"), format!("{off}\n")).unwrap();
        }
        let dir = find_vm_dir(&tmp.path().join("debug"), &tmp.path().join("proc"), 4242).unwrap();
        assert_eq!(dir, vm);
        let v = read_vcpus(&dir).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].1.offset, -123_456_789);
        assert_eq!(v[0].1.scale(), 1.0);
        let none = find_vm_dir(&tmp.path().join("debug"), &tmp.path().join("proc"), 1);
        assert!(none.is_err());
    }

    #[test]
    fn composition_inverts_kvm_scaling() {
        // Host 3 GHz TSC, guest scaled to 1.5 GHz (VMX: 48 fraction bits).
        let v = VcpuTsc {
            offset: -1_000_000,
            ratio: 1u64 << 47,
            frac_bits: 48,
        };
        let a = HostSample {
            tsc: 3_000_000_000_000,
            ns: 1_700_000_000_000_000_000,
            gap_ticks: 30,
        };
        let b = HostSample {
            tsc: a.tsc + 3_000_000_000 * 10,
            ns: a.ns + 10_000_000_000,
            gap_ticks: 30,
        };
        let m = compose(a, b, v, 0).unwrap();
        assert_eq!(m.freq_hz, 1_500_000_000);
        // A host TSC value 4 s after `a` maps back to a.ns + 4 s.
        let host = a.tsc + 3_000_000_000 * 4;
        let ns = m.realtime_ns(v.guest_at(host));
        assert!((ns - (a.ns as i128 + 4_000_000_000)).abs() <= m.error_ns as i128);
        assert!(m.error_ns < 100);
    }
}
