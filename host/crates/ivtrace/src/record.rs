//! `ivtrace record`: wait for a region, drain it into CTF until it is
//! closed or the user stops, flush what was committed, summarize. The
//! recording itself is ivtrace-engine's loop, polling with a backoff.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use ivtrace_ctf::sidecar::HostLost;
use ivtrace_engine::host::{GuestOutput, HostSide};
use ivtrace_engine::{session, Backoff, Engine, Hooks, Output, Recorded, RegionWait, StopReason};
use ivtrace_region::{abi, Reader, Region, RegionError};
use ivtrace_tracefs::host::{process_mapping, HostEventStats, HostEvents};

use crate::cli::RecordArgs;
use crate::summary;

/// Idle polling backs off from MIN to MAX sleep.
const IDLE_SLEEP_MIN: Duration = Duration::from_micros(20);
const IDLE_SLEEP_MAX: Duration = Duration::from_millis(5);
/// Region polling while waiting for it to appear.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// How `ivtrace record` words why it stopped (the sidecar's
/// `stop_reason`).
pub fn describe(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Interrupted => "interrupted",
        StopReason::DurationReached => "duration reached",
        StopReason::Closed => "region closed by its owner",
        StopReason::OwnerGone => "region owner exited without closing",
        StopReason::Withdrawn => "region withdrawn for reformatting",
        StopReason::Disconnected => "peer disconnected",
        StopReason::Misbehaved => "peer misbehaved",
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

/// Stop requests: a signal, or the end of `--duration`.
struct Stop<'a> {
    signal: &'a AtomicBool,
    deadline: Option<Instant>,
}

impl Stop<'_> {
    fn requested(&self) -> Option<StopReason> {
        if self.signal.load(Ordering::Relaxed) {
            return Some(StopReason::Interrupted);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(StopReason::DurationReached);
        }
        None
    }
}

/// Waiting for the region, saying why (once per reason).
struct Waiting<'a> {
    shm: &'a Path,
    stop: &'a Stop<'a>,
    last_said: String,
}

impl RegionWait for Waiting<'_> {
    fn not_yet(&mut self, err: RegionError, transient: bool) -> Result<()> {
        let shm = self.shm.display();
        if !transient {
            return Err(err).with_context(|| format!("cannot use region {shm}"));
        }
        let msg = match err {
            RegionError::Missing { .. } => {
                format!("waiting for {shm} to appear (start the writer)")
            }
            _ => format!("waiting for a writer to format {shm} ({err})"),
        };
        if msg != self.last_said {
            eprintln!("ivtrace: {msg}");
            self.last_said = msg;
        }
        Ok(())
    }

    fn pause(&mut self) -> bool {
        if self.stop.requested().is_some() {
            return false;
        }
        sleep(WAIT_POLL);
        true
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

/// What `record` adds to the engine's loop: its stop requests, the
/// loopback owner's liveness, a progress line on a terminal.
struct RecordHooks<'a> {
    stop: &'a Stop<'a>,
    /// The loopback region's owner process (None: not loopback).
    owner: Option<u32>,
    progress: Option<ProgressBar>,
}

impl Hooks for RecordHooks<'_> {
    fn stop_requested(&mut self) -> Option<StopReason> {
        self.stop.requested()
    }

    fn slow_check(&mut self, reader: &Reader, bytes: u64) -> Option<StopReason> {
        if let Some(pid) = self.owner.filter(|&pid| !owner_alive(pid)) {
            eprintln!("ivtrace: warning: region owner pid {pid} is gone without closing the region; draining what it committed");
            return Some(StopReason::OwnerGone);
        }
        if let Some(pb) = &self.progress {
            let events: u64 = (0..reader.nr_channels())
                .map(|c| reader.channel_stats(c).events)
                .sum();
            pb.set_message(format!("{events} events, {:.1} MB", bytes as f64 / 1e6));
            pb.tick();
        }
        None
    }
}

/// Runs `ivtrace record`. Returns the events seen (recorded + lost).
pub fn run(args: &RecordArgs) -> Result<u64> {
    let out = session::prepare_output(&args.output, args.force)?;
    let signal = install_stop_flag()?;
    let stop = Stop {
        signal: &signal,
        deadline: args
            .duration
            .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0))),
    };
    let mut waiting = Waiting {
        shm: &args.shm,
        stop: &stop,
        last_said: String::new(),
    };
    let Some(region) = ivtrace_engine::wait_for_region(&args.shm, None, &mut waiting)? else {
        eprintln!(
            "ivtrace: stopped before {} became a valid region; nothing recorded",
            args.shm.display()
        );
        return Ok(0);
    };
    raise_file_limit();
    let host = session::host_name(&region, &args.shm, args.name.as_deref());
    let vcpus = match &args.qmp {
        Some(path) => crate::qmp::vcpu_threads(path)?,
        None => HashMap::new(),
    };
    let host_side = match args.host_events {
        true => Some(start_host_events(args.qemu_pid, &args.shm, &out, &host)?),
        false => None,
    };
    let host_side = host_side.map(|side| HostRun { side, vcpus });
    let names = Names {
        out: &out,
        host: &host,
    };
    record_region(region, args, names, &stop, host_side)
}

/// Where a recording goes and what its traces call the guest.
#[derive(Clone, Copy)]
struct Names<'a> {
    out: &'a Path,
    host: &'a str,
}

fn record_region(
    region: Region,
    args: &RecordArgs,
    names: Names,
    stop: &Stop,
    host_side: Option<HostRun>,
) -> Result<u64> {
    let Names { out, host } = names;
    let mut clock = ivtrace_time::estimator_for(region.header());
    let writer = session::ctf_writer_named(&region, out, &clock.initial(), host);
    let h = region.header();
    let mut hooks = RecordHooks {
        stop,
        owner: h.is_loopback().then_some(h.owner_pid),
        progress: progress_bar(),
    };
    let mut wait = Backoff::new(IDLE_SLEEP_MIN, IDLE_SLEEP_MAX);
    let engine = Engine::new(
        Reader::new(region),
        writer,
        &mut clock,
        &mut wait,
        &mut hooks,
    );
    let rec = engine.run()?;
    if let Some(pb) = &hooks.progress {
        pb.finish_and_clear();
    }
    if rec.reason == StopReason::Withdrawn {
        eprintln!("ivtrace: warning: the region was withdrawn (reformatting); stopping");
    }
    finish_trace(rec, args, names, host_side)
}

/// The recorded trace's env and metadata, the host trace and VM view, the
/// sidecar, the summary.
fn finish_trace(
    rec: Recorded<ivtrace_ctf::CtfWriter>,
    args: &RecordArgs,
    names: Names,
    host_side: Option<HostRun>,
) -> Result<u64> {
    let Names { out, host } = names;
    let Recorded {
        reader,
        output: mut writer,
        clock,
        elapsed,
        reason,
        ..
    } = rec;
    let env = session::trace_env_named(reader.region(), out, &clock, host);
    Output::finish(&mut writer, &clock, env, reader.classes())?;
    let guest = GuestOutput::of(&writer, reader.classes(), &clock);
    let host_lost = host_side
        .map(|h| finish_host_events(h, &guest))
        .transpose()?;
    let mut sidecar = session::build_sidecar(
        &reader,
        &writer,
        &args.shm,
        "record",
        &clock,
        elapsed,
        describe(reason),
    );
    sidecar.host_lost = host_lost;
    writer.write_sidecar(&sidecar)?;
    summary::print(&sidecar, out, args.json)?;
    Ok(session::events_seen(&sidecar))
}

/// `--host-events`: the host events of the QEMU behind the region file
/// (`--qemu-pid`, or the process that maps it) into `DIR/host/`, for as
/// long as the recording runs.
fn start_host_events(
    qemu_pid: Option<i32>,
    shm: &Path,
    out: &Path,
    name: &str,
) -> Result<HostSide> {
    let pid = match qemu_pid {
        Some(p) => p,
        None => process_mapping(shm).with_context(|| {
            format!(
                "no process maps {}: pass --qemu-pid (the QEMU whose vCPU threads to trace)",
                shm.display()
            )
        })?,
    };
    let mut classes = Vec::new();
    let events = HostEvents::prepare(Some(pid), &mut classes)?;
    let env = vec![(
        "ivtrace_qemu_pid".into(),
        ivtrace_ctf::EnvValue::Int(pid as i64),
    )];
    let mut side = HostSide::create(out, name, env, classes)?;
    side.start_events(events)?;
    Ok(side)
}

/// The host side of a recording and the vCPU threads QMP named (empty
/// without --qmp).
struct HostRun {
    side: HostSide,
    vcpus: HashMap<i32, u32>,
}

/// Stops the host events, derives the VM view from them and the finished
/// guest traces, closes the host trace, says what was recorded; the host
/// trace's losses.
fn finish_host_events(run: HostRun, guest: &GuestOutput) -> Result<HostLost> {
    let HostRun { mut side, vcpus } = run;
    let stats = side.stop_events().context("host events never started")??;
    let dir = side.dir().to_path_buf();
    eprintln!(
        "ivtrace: host events: {} events of QEMU pid {} ({} threads{}), {} missed ({} pages \
         without a count) -> {}",
        stats.events,
        stats.qemu_pid,
        stats.threads.len(),
        if stats.vcpu_names {
            ", vCPU threads by name"
        } else {
            "; no `CPU n/...` thread names: all threads (start QEMU with -name NAME,debug-threads=on)"
        },
        stats.missed,
        stats.missed_uncounted_pages,
        dir.display()
    );
    let source = vcpu_source(!vcpus.is_empty(), stats.vcpu_names);
    match side.vm_view(guest, vcpus, source) {
        Some(Ok(d)) => crate::summary::print_vm_view(&d),
        Some(Err(e)) => eprintln!("ivtrace: warning: no VM view: {e:#}"),
        None => {}
    }
    side.finish()?;
    Ok(host_lost(&stats))
}

/// The sidecar's account of what the host trace lost.
pub fn host_lost(stats: &HostEventStats) -> HostLost {
    HostLost {
        missed: stats.missed,
        missed_uncounted_pages: stats.missed_uncounted_pages,
    }
}

/// How the VM view knows the vCPU threads.
pub fn vcpu_source(qmp: bool, named: bool) -> &'static str {
    match (qmp, named) {
        (true, _) => "qmp query-cpus-fast",
        (false, true) => "thread names (CPU n/...)",
        (false, false) => "kvm_entry vcpu_id only (no CPU n/... thread names)",
    }
}
