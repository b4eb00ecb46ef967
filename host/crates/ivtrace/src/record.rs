//! `ivtrace record`: wait for a region, drain it into CTF until it is
//! closed or the user stops, flush what was committed, summarize.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use ivtrace_ctf::host::{HostTrace, HostTraceDesc};
use ivtrace_region::{abi, Access, Reader, Region, RegionError};
use ivtrace_tracefs::host::{HostEventStats, Running};

use crate::cli::RecordArgs;

use crate::session;
use crate::summary;

/// Idle polling backs off from MIN to MAX sleep.
const IDLE_SLEEP_MIN: Duration = Duration::from_micros(20);
const IDLE_SLEEP_MAX: Duration = Duration::from_millis(5);
/// How often slow checks (owner liveness, progress) run.
const SLOW_CHECK: Duration = Duration::from_millis(100);
/// Region polling while waiting for it to appear.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// Why a recording ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Signal,
    Duration,
    Closed,
    OwnerGone,
    Withdrawn,
}

impl StopReason {
    pub fn describe(self) -> &'static str {
        match self {
            StopReason::Signal => "interrupted",
            StopReason::Duration => "duration reached",
            StopReason::Closed => "region closed by its owner",
            StopReason::OwnerGone => "region owner exited without closing",
            StopReason::Withdrawn => "region withdrawn for reformatting",
        }
    }
}

/// SIGINT/SIGTERM set the flag; a second one exits at once.
fn install_stop_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&flag))
            .context("cannot install signal handlers")?;
        signal_hook::flag::register(sig, Arc::clone(&flag))
            .context("cannot install signal handlers")?;
    }
    Ok(flag)
}

/// Errors that mean "not yet": the file may still be created or formatted.
fn is_transient(e: &RegionError) -> bool {
    matches!(
        e,
        RegionError::Missing { .. }
            | RegionError::TooSmall { .. }
            | RegionError::NotFormatted
            | RegionError::SizeMismatch { .. }
    )
}

/// A formatted header whose size disagrees with the file may be a region
/// being re-created (truncated, then reformatted); past this it is an error.
const SIZE_MISMATCH_GRACE: Duration = Duration::from_secs(2);

/// Opens the region, waiting (and saying so) while it does not exist or
/// is not formatted. None if stopped while waiting.
fn wait_for_region(
    shm: &Path,
    stop: &AtomicBool,
    deadline: Option<Instant>,
) -> Result<Option<Region>> {
    let mut last_said = String::new();
    let mut mismatch_since: Option<Instant> = None;
    loop {
        match Region::open(shm, Access::ReadWrite) {
            Ok(r) => return Ok(Some(r)),
            Err(e @ RegionError::SizeMismatch { .. })
                if mismatch_since.get_or_insert_with(Instant::now).elapsed()
                    >= SIZE_MISMATCH_GRACE =>
            {
                return Err(e).with_context(|| format!("cannot use region {}", shm.display()))
            }
            Err(e) if is_transient(&e) => {
                let msg = match e {
                    RegionError::Missing { .. } => {
                        format!("waiting for {} to appear (start the writer)", shm.display())
                    }
                    _ => format!("waiting for a writer to format {} ({e})", shm.display()),
                };
                if msg != last_said {
                    eprintln!("ivtrace: {msg}");
                    last_said = msg;
                }
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot use region {}", shm.display()))
            }
        }
        if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        sleep(WAIT_POLL);
    }
}

/// Whether the loopback region's owner process still exists.
fn owner_alive(pid: u32) -> bool {
    pid == 0 || Path::new(&format!("/proc/{pid}")).exists()
}

fn progress_bar() -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("valid template"),
    );
    Some(pb)
}

/// Raises the open-files limit: one stream file per channel, up to 4096.
fn raise_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let want = hard.min(abi::IVT_CHANNELS_MAX as u64 + 64);
        if soft < want {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, want, hard);
        }
    }
}

struct Loop<'a> {
    reader: Reader,
    writer: ivtrace_ctf::CtfWriter,
    stop: &'a AtomicBool,
    deadline: Option<Instant>,
    progress: Option<ProgressBar>,
    events_hint: u64,
    bytes: u64,
}

impl Loop<'_> {
    /// Drains until a stop condition; returns why.
    fn run(&mut self) -> Result<StopReason> {
        let region_owner = self.reader.region().header().owner_pid;
        let loopback = self.reader.region().header().is_loopback();
        let mut idle = IDLE_SLEEP_MIN;
        let mut last_slow = Instant::now();
        let mut ending: Option<StopReason> = None;
        let mut heartbeat = 0u64;
        loop {
            let pass = self.reader.drain_available(&mut self.writer)?;
            self.bytes += pass.bytes;
            heartbeat += 1;
            self.reader.region().protocol().heartbeat(heartbeat);
            if let Some(reason) = ending {
                return Ok(reason);
            }
            if self.stop.load(Ordering::Relaxed) {
                return Ok(StopReason::Signal);
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(StopReason::Duration);
            }
            if self.reader.region().protocol().writer_closed() {
                ending = Some(StopReason::Closed);
                continue;
            }
            if last_slow.elapsed() >= SLOW_CHECK {
                last_slow = Instant::now();
                if !self.reader.region().protocol().still_formatted() {
                    eprintln!(
                        "ivtrace: warning: the region was withdrawn (reformatting); stopping"
                    );
                    return Ok(StopReason::Withdrawn);
                }
                if loopback && !owner_alive(region_owner) {
                    eprintln!("ivtrace: warning: region owner pid {region_owner} is gone without closing the region; draining what it committed");
                    ending = Some(StopReason::OwnerGone);
                    continue;
                }
                self.show_progress();
            }
            if pass.packets == 0 {
                sleep(idle);
                idle = (idle * 2).min(IDLE_SLEEP_MAX);
            } else {
                idle = IDLE_SLEEP_MIN;
            }
        }
    }

    fn show_progress(&mut self) {
        if let Some(pb) = &self.progress {
            let events: u64 = (0..self.reader.nr_channels())
                .map(|c| self.reader.channel_stats(c).events)
                .sum();
            self.events_hint = events;
            pb.set_message(format!(
                "{events} events, {:.1} MB",
                self.bytes as f64 / 1e6
            ));
            pb.tick();
        }
    }
}

/// Runs `ivtrace record`. Returns the events seen (recorded + lost).
pub fn run(args: &RecordArgs) -> Result<u64> {
    let out = session::prepare_output(&args.output, args.force)?;
    let stop = install_stop_flag()?;
    let deadline = args
        .duration
        .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let Some(region) = wait_for_region(&args.shm, &stop, deadline)? else {
        eprintln!(
            "ivtrace: stopped before {} became a valid region; nothing recorded",
            args.shm.display()
        );
        return Ok(0);
    };
    raise_file_limit();
    let host = session::host_name(&region, &args.shm, args.name.as_deref());
    let host_events = match args.host_events {
        true => Some(RecordHost::start(args.qemu_pid, &args.shm, &out, &host)?),
        false => None,
    };
    let seen = record_region(region, &args.shm, &out, &stop, deadline, args.json, &host);
    if let Some(h) = host_events {
        h.finish()?;
    }
    seen
}

fn record_region(
    region: Region,
    shm: &Path,
    out: &Path,
    stop: &AtomicBool,
    deadline: Option<Instant>,
    json: bool,
    host: &str,
) -> Result<u64> {
    let mut estimator = ivtrace_time::estimator_for(region.header());
    let initial = estimator.initial();
    let started = Instant::now();
    let writer = session::ctf_writer_named(&region, out, &initial, host);
    let mut lp = Loop {
        reader: Reader::new(region),
        writer,
        stop,
        deadline,
        progress: progress_bar(),
        events_hint: 0,
        bytes: 0,
    };
    let reason = lp.run()?;
    if let Some(pb) = &lp.progress {
        pb.finish_and_clear();
    }
    let Loop {
        mut reader,
        mut writer,
        ..
    } = lp;
    reader.flush_partial(&mut writer)?;
    reader.finish(&mut writer)?;
    let elapsed = started.elapsed();
    let clock = estimator.finish();
    writer.set_clock(clock.clone());
    writer.set_env(session::trace_env_named(reader.region(), out, &clock, host));
    writer.finish(reader.classes())?;
    let sidecar = session::build_sidecar(
        &reader,
        &writer,
        shm,
        "record",
        &clock,
        elapsed,
        reason.describe(),
    );
    writer.write_sidecar(&sidecar)?;
    summary::print(&sidecar, out, json)?;
    Ok(session::events_seen(&sidecar))
}

/// `ivtrace record --host-events`: host events of the QEMU behind a
/// region file, into `DIR/host/`, for as long as the recording runs.
pub struct RecordHost {
    running: Running,
    trace: Arc<Mutex<HostTrace>>,
    dir: PathBuf,
}

impl RecordHost {
    /// Starts recording host events for the process `qemu_pid`, or the
    /// one that maps `shm`.
    pub fn start(qemu_pid: Option<i32>, shm: &Path, out: &Path, name: &str) -> Result<RecordHost> {
        let pid = match qemu_pid {
            Some(p) => p,
            None => ivtrace_tracefs::host::process_mapping(shm).with_context(|| {
                format!(
                    "no process maps {}: pass --qemu-pid (the QEMU whose vCPU threads to trace)",
                    shm.display()
                )
            })?,
        };
        let mut classes = Vec::new();
        let he = ivtrace_tracefs::host::HostEvents::prepare(Some(pid), &mut classes)?;
        let desc = HostTraceDesc {
            hostname: &crate::serve::host_name(),
            trace_name: &format!("{name}-host"),
            error_ns: ivtrace_time::timebase::base().error_ns,
            env: vec![(
                "ivtrace_qemu_pid".into(),
                ivtrace_ctf::EnvValue::Int(pid as i64),
            )],
        };
        let dir = out.join("host");
        let trace = Arc::new(Mutex::new(HostTrace::create(&dir, &desc, classes)?));
        let running = he.start(Arc::clone(&trace))?;
        Ok(RecordHost {
            running,
            trace,
            dir,
        })
    }

    /// Stops, flushes, says what was recorded.
    pub fn finish(self) -> Result<HostEventStats> {
        let stats = self.running.stop()?;
        match Arc::try_unwrap(self.trace) {
            Ok(m) => {
                m.into_inner().expect("not poisoned").finish()?;
            }
            Err(a) => a.lock().expect("not poisoned").flush()?,
        }
        eprintln!(
            "ivtrace: host events: {} events of QEMU pid {} ({} threads{}), {} missed -> {}",
            stats.events,
            stats.qemu_pid,
            stats.threads.len(),
            if stats.vcpu_names {
                ", vCPU threads by name"
            } else {
                "; no `CPU n/...` thread names: all threads (start QEMU with -name NAME,debug-threads=on)"
            },
            stats.missed,
            self.dir.display()
        );
        Ok(stats)
    }
}
