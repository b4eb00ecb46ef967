//! The host's own tracefs: a private instance that records the QEMU's
//! vCPU threads (and, where KVM runs the guest, its kvm_* events), read
//! one binary sub-buffer at a time per CPU and decoded into `DIR/host/`.
//!
//! How (as trace-cmd does): a private tracefs instance
//! (`instances/ivtrace-<pid>-<n>`, so the global buffer and other users'
//! settings stay untouched) with `trace_clock = mono`, the events enabled
//! with a filter on the vCPU threads' ids, one non-blocking
//! `per_cpu/cpuN/trace_pipe_raw` per CPU read one sub-buffer at a time
//! and decoded with the format files of the running kernel ([`crate::format`],
//! [`crate::page`]). Binary pages rather than text `trace_pipe`: no printf/parse
//! round trip, exact field values, the kernel's own missed-event counts.
//! Timestamps are CLOCK_MONOTONIC, shifted onto the host time base
//! ([`ivtrace_time::timebase`]), the base the guest traces are mapped to.
//!
//! vCPU threads are the QEMU process's tasks whose `comm` is `CPU n/TCG`
//! or `CPU n/KVM` (QEMU names them with `-name ...,debug-threads=on`);
//! without names every thread of the process is traced, and the summary
//! says so. The set is re-read every second (filters rewritten on change).
//! Their context switches, wake-ups and migrations are recorded (what the
//! VM view needs to tell a preempted vCPU from a blocked one), and a
//! `host_statedump` stream names every thread of the QEMU with its pid
//! (new threads at the next re-read). Under this machine's PVM-backed
//! /dev/kvm, and under TCG, kvm_* events never fire for the guest; they
//! are enabled anyway (cheap) when the kernel has them.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use thiserror::Error;

use ivtrace_region::classes::EventClass;

use ivtrace_ctf::host_trace::{HostTrace, STREAM_KERNEL};
use ivtrace_ctf::sidecar::TracefsFormats;
use ivtrace_ctf::CtfError;
use ivtrace_time::timebase::mono_to_host;

use crate::decode::Decoder;
use crate::format::{self, EventFmt, FormatError, HeaderPage};
use crate::page;
use crate::statedump::{self, pid_ns_inum, process_state_payload, threads_of};

/// Events recorded, by tracefs system and name. The wake-ups and
/// migrations of the vCPU threads complete their scheduling (the VM view
/// needs when a blocked vCPU thread became runnable: from then on it waits
/// for a host CPU, as the kernel's run-queue wait counts it).
pub const EVENTS: &[(&str, &str)] = &[
    ("sched", "sched_switch"),
    ("sched", "sched_wakeup"),
    ("sched", "sched_migrate_task"),
    ("kvm", "kvm_exit"),
    ("kvm", "kvm_entry"),
    ("kvm", "kvm_hypercall"),
    // KVM's changes of a vCPU's TSC offset (crate::kvmtsc): the versions of
    // the guest's clock mapping.
    ("kvm", "kvm_write_tsc_offset"),
];
/// Class ids of host kernel events start here (serve's own use 0..).
pub const FIRST_CLASS_ID: u32 = 100;
/// Per-CPU buffer of the instance.
const BUFFER_KB: u32 = 2048;
/// Longest wait between reads (the kernel wakes pollers only when a
/// buffer is `buffer_percent` full).
const READ_PERIOD: Duration = Duration::from_millis(500);
const RESCAN: Duration = Duration::from_secs(1);

/// Reads a tracefs file with large reads: some of them (header_page)
/// answer a small first read (std's probe) with a fragment, then EOF.
pub fn read_tracefs(path: &Path) -> io::Result<String> {
    let mut f = fs::File::open(path)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Where tracefs is mounted.
pub fn tracefs_root() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events/header_page").exists())
}

/// Why recording the host's events failed: the message says which file
/// or step, and what to do where the host can be fixed (mount tracefs,
/// run as root).
#[derive(Debug, Error)]
pub enum HostEventsError {
    #[error("no QEMU pid to select the vCPU threads of")]
    NoPid,
    #[error("mounted tracefs at {} but it has no events/header_page", .0.display())]
    MountedEmpty(PathBuf),
    /// `why` is in the text (the advice follows it), so it is no `source`:
    /// a chain printed with `{:#}` would say it twice.
    #[error(
        "tracefs is not mounted and mounting it at {at} failed ({why}): run \
         `mount -t tracefs nodev {at}` as root (host events need root anyway)",
        at = .at.display()
    )]
    Mount { at: PathBuf, why: nix::Error },
    #[error("cannot read events/header_page")]
    HeaderPage(#[source] io::Error),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("none of the host events exist in this kernel's tracefs")]
    NoEvents,
    #[error("cannot create {}", .path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot write `{val}` to {}", .path.display())]
    Write {
        val: String,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cannot list the CPUs of {}", .path.display())]
    ListCpus { path: PathBuf, source: io::Error },
    #[error("cannot open {}", .path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot start the host events thread")]
    Spawn(#[source] io::Error),
    #[error("reading trace_pipe_raw")]
    Read(#[source] io::Error),
    #[error(transparent)]
    Trace(#[from] CtfError),
    #[error("the host events thread panicked")]
    Panicked,
}

/// What this module's fallible steps return.
type Result<T, E = HostEventsError> = std::result::Result<T, E>;

/// Where tracefs is mounted, mounting it at /sys/kernel/tracing first if
/// it is not (as trace-cmd does: a machine without systemd, or a
/// container, may boot without it). Mounting needs root; without it the
/// error says how.
pub fn tracefs_root_or_mount() -> Result<PathBuf> {
    if let Some(root) = tracefs_root() {
        return Ok(root);
    }
    let at = Path::new("/sys/kernel/tracing");
    let mounted = nix::mount::mount(
        Some("nodev"),
        at,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
    match mounted {
        Ok(()) if at.join("events/header_page").exists() => Ok(at.to_path_buf()),
        Ok(()) => Err(HostEventsError::MountedEmpty(at.to_path_buf())),
        Err(why) => Err(HostEventsError::Mount {
            at: at.to_path_buf(),
            why,
        }),
    }
}

/// The QEMU threads to trace: vCPU threads by name, else all.
pub fn vcpu_threads(pid: i32) -> (Vec<i32>, bool) {
    let mut all = Vec::new();
    let mut vcpus = Vec::new();
    if let Ok(rd) = fs::read_dir(format!("/proc/{pid}/task")) {
        for e in rd.flatten() {
            let Ok(tid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            all.push(tid);
            let comm = fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let comm = comm.trim();
            if comm.starts_with("CPU ") && (comm.ends_with("/TCG") || comm.ends_with("/KVM")) {
                vcpus.push(tid);
            }
        }
    }
    all.sort_unstable();
    vcpus.sort_unstable();
    if vcpus.is_empty() {
        (all, false)
    } else {
        (vcpus, true)
    }
}

/// The process that maps `path` (the QEMU of an ivshmem-plain region).
pub fn process_mapping(path: &Path) -> Option<i32> {
    let want = fs::canonicalize(path).ok()?;
    let want = want.to_string_lossy();
    let me = std::process::id() as i32;
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(maps) = fs::read_to_string(e.path().join("maps")) else {
            continue;
        };
        if maps.lines().any(|l| l.ends_with(&*want)) {
            return Some(pid);
        }
    }
    None
}

/// A private tracefs instance, removed on drop.
struct Instance {
    dir: PathBuf,
}

impl Instance {
    fn create(root: &Path) -> Result<Instance> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = root
            .join("instances")
            .join(format!("ivtrace-{}-{n}", std::process::id()));
        if let Err(source) = fs::create_dir(&dir) {
            return Err(HostEventsError::Create { path: dir, source });
        }
        Ok(Instance { dir })
    }

    fn write(&self, rel: &str, val: &str) -> Result<()> {
        let p = self.dir.join(rel);
        fs::write(&p, val).map_err(|source| HostEventsError::Write {
            val: val.to_string(),
            path: p,
            source,
        })
    }

    fn subbuf_size(&self) -> usize {
        fs::read_to_string(self.dir.join("buffer_subbuf_size_kb"))
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .map_or(4096, |kb| kb * 1024)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("tracing_on"), "0");
        for (sys, ev) in EVENTS {
            let _ = fs::write(self.dir.join(format!("events/{sys}/{ev}/enable")), "0");
        }
        // The kernel refuses to remove a busy instance; retry briefly.
        for _ in 0..20 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Counters for the summary.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct HostEventStats {
    pub qemu_pid: i32,
    pub threads: Vec<i32>,
    /// Threads chosen by their `CPU n/...` names (false: all threads).
    pub vcpu_names: bool,
    pub events_enabled: Vec<String>,
    pub events: u64,
    /// `lttng_statedump_process_state` events written (threads of the QEMU).
    pub statedump_threads: u64,
    pub pages: u64,
    /// Events the host kernel's ring buffer dropped (the pages' counts;
    /// the host trace carries them as discarded events).
    pub missed: u64,
    /// Pages that say events were dropped before them without a count
    /// (no number a CTF reader could be given).
    pub missed_uncounted_pages: u64,
    pub malformed_pages: u64,
    pub unknown_records: u64,
    /// The format files the events were decoded with (the sidecar's
    /// `tracefs_formats.host`, not this summary).
    #[serde(skip)]
    pub formats: TracefsFormats,
}

/// Prepared: formats parsed, classes added to the host trace's list.
pub struct HostEvents {
    root: PathBuf,
    pid: i32,
    hp: HeaderPage,
    fmts: Vec<EventFmt>,
    decoder: Decoder,
    /// Their texts, for the sidecar.
    formats: TracefsFormats,
}

/// Reading in the background.
pub struct Running {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<HostEventStats>>,
}

/// The fields that name the thread an event is about: the switched
/// threads, the woken or migrated one, else the writing thread.
fn filter_fields(fmt: &EventFmt) -> (&'static str, Option<&'static str>) {
    match (fmt.system.as_str(), fmt.name.as_str()) {
        ("sched", "sched_switch") => ("prev_pid", Some("next_pid")),
        ("sched", "sched_wakeup" | "sched_migrate_task") => ("pid", None),
        _ => ("common_pid", None),
    }
}

fn filter(field: &str, other: Option<&str>, tids: &[i32]) -> String {
    let mut parts = Vec::new();
    for t in tids {
        parts.push(format!("{field} == {t}"));
        if let Some(o) = other {
            parts.push(format!("{o} == {t}"));
        }
    }
    parts.join(" || ")
}

impl HostEvents {
    /// Parses the formats of [`EVENTS`] this kernel has and appends their
    /// classes to `classes`.
    pub fn prepare(pid: Option<i32>, classes: &mut Vec<EventClass>) -> Result<HostEvents> {
        let pid = pid.ok_or(HostEventsError::NoPid)?;
        let root = tracefs_root_or_mount()?;
        let header_page =
            read_tracefs(&root.join("events/header_page")).map_err(HostEventsError::HeaderPage)?;
        let hp = format::parse_header_page(&header_page)?;
        let mut formats = TracefsFormats {
            header_page,
            events: Default::default(),
        };
        let mut fmts = Vec::new();
        for (sys, ev) in EVENTS {
            if let Ok(text) = read_tracefs(&root.join(format!("events/{sys}/{ev}/format"))) {
                fmts.push(format::parse_event(sys, &text)?);
                formats.events.insert(format!("{sys}/{ev}"), text);
            }
        }
        if fmts.is_empty() {
            return Err(HostEventsError::NoEvents);
        }
        let with_ids: Vec<(EventFmt, u32)> = fmts
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, f)| (f, FIRST_CLASS_ID + i as u32))
            .collect();
        let (decoder, new) = Decoder::new(&with_ids);
        classes.extend(new);
        classes.extend(statedump::classes());
        Ok(HostEvents {
            root,
            pid,
            hp,
            fmts,
            decoder,
            formats,
        })
    }

    /// The QEMU whose threads are traced.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    fn set_filters(&self, inst: &Instance, tids: &[i32]) -> Result<()> {
        for f in &self.fmts {
            let rel = format!("events/{}/{}/filter", f.system, f.name);
            let (field, other) = filter_fields(f);
            let expr = filter(field, other, tids);
            inst.write(&rel, if expr.is_empty() { "0" } else { &expr })?;
        }
        Ok(())
    }

    /// Creates the instance, starts tracing and the reader thread, which
    /// writes per-CPU streams `host_cpuN` of `trace` (and `host_statedump`:
    /// the QEMU's threads, now and as they appear).
    pub fn start(self, trace: Arc<Mutex<HostTrace>>) -> Result<Running> {
        let inst = Instance::create(&self.root)?;
        inst.write("tracing_on", "0")?;
        inst.write("trace_clock", "mono")?;
        inst.write("buffer_size_kb", &BUFFER_KB.to_string())?;
        let (tids, named) = vcpu_threads(self.pid);
        self.set_filters(&inst, &tids)?;
        let mut enabled = Vec::new();
        for f in &self.fmts {
            inst.write(&format!("events/{}/{}/enable", f.system, f.name), "1")?;
            enabled.push(format!("{}:{}", f.system, f.name));
        }
        let (readers, dump) = {
            let mut t = trace.lock().expect("not poisoned");
            let readers = open_readers(&inst, &mut t)?;
            (readers, StateDump::start(&mut t, self.pid)?)
        };
        inst.write("tracing_on", "1")?;
        let state = LoopState {
            stats: HostEventStats {
                qemu_pid: self.pid,
                threads: tids.clone(),
                vcpu_names: named,
                events_enabled: enabled,
                statedump_threads: dump.dumped.len() as u64,
                formats: self.formats.clone(),
                ..Default::default()
            },
            tids,
            dump,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("ivt-hostev".into())
            .spawn(move || self.read_loop(inst, readers, trace, stop2, state))
            .map_err(HostEventsError::Spawn)?;
        Ok(Running { stop, thread })
    }

    fn read_loop(
        self,
        inst: Instance,
        mut readers: Vec<(u32, fs::File, usize)>,
        trace: Arc<Mutex<HostTrace>>,
        stop: Arc<AtomicBool>,
        mut state: LoopState,
    ) -> Result<HostEventStats> {
        let sub = inst.subbuf_size().max(4096);
        let mut page = vec![0u8; sub];
        let mut last_scan = Instant::now();
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            if stopping {
                // Everything recorded so far, then nothing more.
                let _ = inst.write("tracing_on", "0");
            } else {
                let mut fds: Vec<PollFd> = readers
                    .iter()
                    .map(|(_, f, _)| PollFd::new(f.as_fd(), PollFlags::POLLIN))
                    .collect();
                let ms = READ_PERIOD.as_millis() as u16;
                let _ = poll(&mut fds, PollTimeout::from(ms));
            }
            for (_, file, stream) in &mut readers {
                loop {
                    let n = match file.read(&mut page) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(HostEventsError::Read(e)),
                    };
                    page[n..].fill(0);
                    self.page(&page, *stream, &trace, &mut state.stats)?;
                }
            }
            if stopping {
                break;
            }
            if last_scan.elapsed() >= RESCAN {
                last_scan = Instant::now();
                self.rescan(&inst, &trace, &mut state)?;
            }
        }
        // Close the per-CPU files first: the kernel refuses to remove an
        // instance whose buffers are open.
        drop(readers);
        drop(inst);
        Ok(state.stats)
    }

    /// The QEMU's threads again: filters follow a changed vCPU set, new
    /// threads get their state dump.
    fn rescan(
        &self,
        inst: &Instance,
        trace: &Mutex<HostTrace>,
        state: &mut LoopState,
    ) -> Result<()> {
        let (now, named) = vcpu_threads(self.pid);
        if !now.is_empty() && now != state.tids {
            self.set_filters(inst, &now)?;
            state.stats.threads = now.clone();
            state.stats.vcpu_names = named;
            state.tids = now;
        }
        let mut t = trace.lock().expect("not poisoned");
        state.stats.statedump_threads += state.dump.dump_new(&mut t, self.pid)?;
        Ok(())
    }

    fn page(
        &self,
        page: &[u8],
        stream: usize,
        trace: &Arc<Mutex<HostTrace>>,
        stats: &mut HostEventStats,
    ) -> Result<()> {
        stats.pages += 1;
        let mut t = trace.lock().expect("not poisoned");
        // Lost before this page: counted before its events, so the host
        // trace announces the loss where it happened.
        let (missed, missed_uncounted) = page::missed_before(page, &self.hp);
        stats.missed += missed.unwrap_or(0);
        stats.missed_uncounted_pages += missed_uncounted as u64;
        t.discarded(stream, missed.unwrap_or(0))?;
        let mut err = None;
        let mut unknown = 0u64;
        let info = page::walk(page, &self.hp, |ts, rec| {
            if err.is_some() {
                return;
            }
            match self.decoder.decode(rec) {
                Some(d) => {
                    if let Err(e) = t.event(stream, d.class_id, mono_to_host(ts), d.tid, &d.payload)
                    {
                        err = Some(e);
                    }
                }
                None => unknown += 1,
            }
        });
        if let Some(e) = err {
            return Err(e.into());
        }
        stats.events += info.events - unknown;
        stats.unknown_records += unknown;
        if info.malformed {
            stats.malformed_pages += 1;
        }
        Ok(())
    }
}

/// What the reader thread keeps between passes.
struct LoopState {
    stats: HostEventStats,
    tids: Vec<i32>,
    dump: StateDump,
}

/// One non-blocking `trace_pipe_raw` per CPU of the instance, each with
/// its stream `host_cpuN` in `t`.
fn open_readers(inst: &Instance, t: &mut HostTrace) -> Result<Vec<(u32, fs::File, usize)>> {
    let mut cpus = Vec::new();
    let per_cpu = inst.dir.join("per_cpu");
    let list = fs::read_dir(&per_cpu).map_err(|source| HostEventsError::ListCpus {
        path: per_cpu.clone(),
        source,
    })?;
    for e in list.flatten() {
        if let Some(n) = e
            .file_name()
            .to_string_lossy()
            .strip_prefix("cpu")
            .and_then(|n| n.parse::<u32>().ok())
        {
            cpus.push(n);
        }
    }
    cpus.sort_unstable();
    let mut readers = Vec::new();
    for &cpu in &cpus {
        let path = inst.dir.join(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(|source| HostEventsError::Open {
                path: path.clone(),
                source,
            })?;
        let stream = t.add_stream(STREAM_KERNEL, cpu, &format!("host_cpu{cpu}"))?;
        readers.push((cpu, file, stream));
    }
    Ok(readers)
}

/// The `host_statedump` stream: one `lttng_statedump_process_state` per
/// thread of the QEMU, when it is first seen. A stream of its own (not the
/// per-CPU ones): its events are stamped when /proc is read, which may be
/// after tracefs events of the same CPU still waiting to be read.
struct StateDump {
    stream: usize,
    dumped: HashSet<i32>,
    ns_inum: u32,
}

impl StateDump {
    fn start(t: &mut HostTrace, pid: i32) -> Result<StateDump> {
        let mut d = StateDump {
            stream: t.add_stream(STREAM_KERNEL, 0, "host_statedump")?,
            dumped: HashSet::new(),
            ns_inum: pid_ns_inum(pid),
        };
        d.dump_new(t, pid)?;
        Ok(d)
    }

    /// Dumps the threads of `pid` not dumped yet; how many.
    fn dump_new(&mut self, t: &mut HostTrace, pid: i32) -> Result<u64> {
        let now = mono_to_host(ivtrace_time::timebase::mono_ns());
        let mut n = 0;
        for th in threads_of(pid) {
            if self.dumped.insert(th.tid) {
                let p = process_state_payload(&th, self.ns_inum);
                t.event(self.stream, statedump::PROCESS_STATE, now, 0, &p)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

impl Running {
    /// Stops tracing, reads what is left, removes the instance.
    pub fn stop(self) -> Result<HostEventStats> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(r) => r,
            Err(_) => Err(HostEventsError::Panicked),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_name_every_thread() {
        assert_eq!(
            filter("prev_pid", Some("next_pid"), &[3, 4]),
            "prev_pid == 3 || next_pid == 3 || prev_pid == 4 || next_pid == 4"
        );
        assert_eq!(filter("common_pid", None, &[]), "");
    }

    #[test]
    fn this_process_threads_are_listed() {
        let (tids, named) = vcpu_threads(std::process::id() as i32);
        assert!(!named);
        assert!(tids.contains(&(std::process::id() as i32)));
    }
}
