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

use ivtrace_ctf::streams::Limits;
use ivtrace_ctf::OutDir;
use ivtrace_engine::host_side::{host_lost, vcpu_source, GuestOutput, HostSide};
use ivtrace_engine::{session, Backoff, Engine, Hooks, Output, Recorded, RegionWait, StopReason};
use ivtrace_migration::{self as migration, Handoff, Resumed};
use ivtrace_nested::{nesting, Expander, Forwarder, Hello, Nesting};
use ivtrace_region::{Reader, Region, RegionError};
use ivtrace_time::pingpong::Entry;
use ivtrace_time::{ClockSync, GuestClock};
use ivtrace_tracefs::host_events::{process_mapping, HostEventStats, HostEvents};

use crate::cli::RecordArgs;
use crate::summary;

pub mod resume;

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
        StopReason::Handoff => "handed off (the guest migrated; the next host continues)",
        StopReason::Shrunk => "region shrank under the reader (truncated by another process)",
        StopReason::OutputFailed => "output failed (the trace holds every whole packet before it)",
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

/// SIGUSR1: the guest migrated, end this part with a handoff.
fn install_handoff_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, Arc::clone(&flag))
        .context("cannot install the SIGUSR1 handler")?;
    Ok(flag)
}

/// Stop requests: a signal, or the end of `--duration`.
struct Stop<'a> {
    signal: &'a AtomicBool,
    handoff: &'a AtomicBool,
    deadline: Option<Instant>,
}

impl Stop<'_> {
    fn requested(&self) -> Option<StopReason> {
        if self.handoff.load(Ordering::Relaxed) {
            return Some(StopReason::Handoff);
        }
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
    /// Gives up on a lasting error ([`ivtrace_engine::EngineError::Region`]
    /// then says "cannot use region PATH: why").
    fn not_yet(&mut self, err: RegionError, transient: bool) -> Result<(), RegionError> {
        let shm = self.shm.display();
        if !transient {
            return Err(err);
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
    ivtrace_engine::limits::raise_nofile_limit();
    let policy = args.access.policy()?;
    let out = match args.resume {
        true => resume::open(&args.output, &policy)?,
        false => session::prepare_output(&args.output, args.force, &policy)?,
    };
    let signal = install_stop_flag()?;
    let handoff = install_handoff_flag()?;
    let stop = Stop {
        signal: &signal,
        handoff: &handoff,
        deadline: args
            .duration
            .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0))),
    };
    let resume_from = match &args.resume_from {
        Some(path) => match wait_for_handoff(path, &stop)? {
            Some(h) => Some((path.as_path(), h)),
            None => return Ok(0),
        },
        None => None,
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
    let hub = args.relay.start()?;
    let host = session::host_name(&region, &args.shm, args.name.as_deref());
    let vcpus = match &args.qmp {
        Some(path) => crate::qmp::vcpu_threads(path)?,
        None => HashMap::new(),
    };
    let host_side = match args.host_events {
        true => Some(start_host_events(args.qemu_pid, &args.shm, &out, &host)?),
        false => None,
    };
    let clock = clock_for(&region, args);
    let mapping = clock.initial_mapping();
    let mut reader = Reader::new(region, mapping.expressible());
    // A forwarding L1 keeps L2's ticks: L0 places them with the composed
    // mapping (docs/nested.md); its own user trace then counts ticks too.
    if args.forward.is_none() {
        reader.set_user_clock(mapping.ns_scale(), mapping.expressible());
    }
    let resumed = match &resume_from {
        Some((path, h)) => Some((*path, resume_handoff(&mut reader, h, path)?)),
        None => None,
    };
    let host_side = host_side.map(|side| HostRun { side, vcpus });
    let names = Names {
        out: &out,
        host: &host,
        hub: hub.as_ref(),
        resumed,
    };
    record_region(reader, clock, args, names, &stop, host_side)
}

/// `--resume-from`: waits for the previous part's handoff (None: stopped
/// meanwhile).
fn wait_for_handoff(path: &Path, stop: &Stop) -> Result<Option<Handoff>> {
    Ok(migration::wait_for_handoff(path, &mut || {
        stop.requested().is_none()
    })?)
}

fn resume_handoff(reader: &mut Reader, h: &Handoff, path: &Path) -> Result<Resumed> {
    let r = reader
        .resume(h)
        .with_context(|| format!("cannot resume from {}", path.display()))?;
    eprintln!(
        "ivtrace: part {} of the trace, resumed from {} ({} packets the previous part already \
         holds skipped)",
        r.part,
        path.display(),
        r.already_recorded
    );
    Ok(r)
}

/// Where a recording goes, what its traces call the guest, and which part
/// of a migrated guest's trace it is.
#[derive(Clone, Copy)]
struct Names<'a> {
    out: &'a OutDir,
    host: &'a str,
    /// The relay sender, with `--relayd`.
    hub: Option<&'a ivtrace_relayd::Hub>,
    resumed: Option<(&'a Path, Resumed)>,
}

impl Names<'_> {
    fn part(&self) -> u32 {
        self.resumed.map_or(0, |(_, r)| r.part)
    }
}

/// The clock of a recording: the clock exchange through the region's sync
/// mailbox when the writer spins in it (the guest module), met at its
/// control poll (ivshmem-plain has no interrupt); with `--clock-sync` also
/// with a writer that answers once per poll; else the region's estimator.
fn clock_for(region: &Region, args: &RecordArgs) -> Box<dyn ClockSync> {
    if let Some(entry) = Entry::poll_for(region, args.clock_sync) {
        return Box::new(GuestClock::start(
            region,
            None,
            Some(entry),
            args.sync_interval(),
        ));
    }
    Box::new(ivtrace_time::estimator_for(region.header()))
}

fn record_region(
    mut reader: Reader,
    mut clock: Box<dyn ClockSync>,
    args: &RecordArgs,
    names: Names,
    stop: &Stop,
    host_side: Option<HostRun>,
) -> Result<u64> {
    let Names { out, host, hub, .. } = names;
    let region = reader.region();
    let limits = Limits {
        max_bytes: args.max_size,
        ..Limits::default()
    };
    let (initial, part) = (clock.initial_mapping(), names.part());
    let mut writer = session::ctf_writer_part(region, out, &initial, host, limits, "record", part);
    if !reader.user_in_ns() {
        writer.keep_user_ticks();
    }
    let mut sinks = ivtrace_engine::Sinks::new(writer);
    let tap = match hub {
        Some(hub) => {
            let freq = region.header().clock.freq_hz;
            let tap = ivtrace_engine::relayd::attach(hub, host, freq, &mut sinks);
            if let Some(run) = host_side.as_ref() {
                run.side
                    .add_sink(tap.sink())
                    .context("cannot send the host trace's metadata to the relay")?;
            }
            Some(tap)
        }
        None => None,
    };
    let forward = forwarder(args, region, host)?;
    let mut writer = nesting(sinks, forward, Some(Expander::new(out)));
    let h = region.header();
    let owner = h.is_loopback().then_some(h.owner_pid);
    if args.resume {
        resume::continue_recording(out, &mut reader, &mut writer.inner.dir)?;
    }
    let mut hooks = RecordHooks {
        stop,
        owner,
        progress: progress_bar(),
    };
    let mut wait = Backoff::new(IDLE_SLEEP_MIN, IDLE_SLEEP_MAX);
    let engine = Engine::new(reader, writer, &mut *clock, &mut wait, &mut hooks);
    let rec = engine.run()?;
    let sync = clock.sync_section(&rec.clock);
    if let Some(pb) = &hooks.progress {
        pb.finish_and_clear();
    }
    if rec.reason == StopReason::Withdrawn {
        eprintln!("ivtrace: warning: the region was withdrawn (reformatting); stopping");
    }
    if rec.reason == StopReason::Shrunk {
        eprintln!(
            "ivtrace: warning: {} shrank under the reader (another process truncated it): \
             stopped; the trace holds what was read before",
            args.shm.display()
        );
    }
    let sides = Sides {
        host: host_side,
        tap,
        sync,
    };
    finish_trace(rec, args, names, sides)
}

/// What a recording has beside its trace: the host events, the relay, how
/// its clock was measured.
struct Sides {
    host: Option<HostRun>,
    tap: Option<Arc<ivtrace_engine::relayd::RelayTap>>,
    sync: Option<ivtrace_time::guest::ClockSyncSection>,
}

/// `--forward FIFO`: this recording's packets also go to FIFO (nested
/// tracing; blocks until `ivtrace-forward` opens it).
fn forwarder(args: &RecordArgs, region: &Region, host: &str) -> Result<Option<Forwarder>> {
    let Some(path) = &args.forward else {
        return Ok(None);
    };
    let hello = Hello {
        name: host.to_string(),
        uuid: region.header().uuid,
        nr_channels: region.layout().nr_channels,
    };
    Ok(Forwarder::open(path, &hello).map(Some)?)
}

/// The recorded trace's env and metadata, the host trace and VM view, the
/// sidecar, the summary, and the nested guests it forwarded or carried.
/// A failed output (a full disk) is an error after the sidecar says so.
fn finish_trace(
    rec: Recorded<Nesting<ivtrace_engine::Sinks>>,
    args: &RecordArgs,
    names: Names,
    sides: Sides,
) -> Result<u64> {
    let Names { out, host, .. } = names;
    let Sides {
        host: host_side,
        tap,
        sync,
    } = sides;
    let Recorded {
        reader,
        output: mut nesting,
        clock,
        elapsed,
        reason,
        mut output_error,
        ..
    } = rec;
    let env = session::trace_env_named(reader.region(), out.path(), &clock, host);
    let finished = match output_error {
        Some(_) => Output::finish_incomplete(&mut nesting, &clock, env, reader.classes()),
        None => Output::finish(&mut nesting, &clock, env, reader.classes()),
    };
    if let Err(e) = finished {
        output_error.get_or_insert(format!("finishing the trace failed: {e:#}"));
    }
    let nested = match nesting.watcher.finish(&clock, host) {
        Ok(nested) => nested,
        Err(e) => {
            output_error.get_or_insert(format!("finishing the nested guests failed: {e:#}"));
            None
        }
    };
    let writer = nesting.inner.dir;
    // A host trace that cannot be finished (the same full disk) is an
    // output error too: the sidecar still says why.
    let guest = GuestOutput::of(&writer, reader.classes(), &clock);
    let host_done = match host_side.map(|h| finish_host_events(h, &guest)).transpose() {
        Ok(done) => done,
        Err(e) => {
            output_error.get_or_insert(format!("finishing the host trace failed: {e:#}"));
            None
        }
    };
    // The boot analysis reads the finished kernel trace (not a failed one).
    let boot = match &output_error {
        None => ivtrace_boot::derive::at_end(&guest.root, &args.boot.options(), |m| {
            eprintln!("ivtrace: {m}")
        }),
        Some(_) => None,
    };
    let why = match &output_error {
        Some(e) => format!("{}: {e}", describe(reason)),
        None => describe(reason).to_string(),
    };
    let mut sidecar =
        session::build_sidecar(&reader, &writer, &args.shm, "record", &clock, elapsed, &why);
    sidecar.boot = boot;
    sidecar.host_lost = host_done.as_ref().map(|d| host_lost(&d.stats));
    sidecar.tracefs_formats.host = host_done.as_ref().map(|d| d.stats.formats.clone());
    let mut sync = sync;
    if let (Some(s), Some(d)) = (sync.as_mut(), host_done.as_ref()) {
        s.follow_tsc_writes(&d.tsc_writes);
    }
    sidecar.self_check = host_done.and_then(|d| d.self_check);
    sidecar.clock_sync = sync.map(|s| serde_json::to_value(s).expect("plain data"));
    sidecar.relay = tap.map(|t| ivtrace_engine::relayd::close(&t, |m| eprintln!("ivtrace: {m}")));
    sidecar.nested = nested;
    record_migration(&mut sidecar, &reader, reason, names)?;
    if output_error.is_some() {
        sidecar.state = ivtrace_ctf::sidecar::STATE_INCOMPLETE.into();
    }
    writer.write_sidecar(&sidecar)?;
    summary::print(&sidecar, out.path(), args.json)?;
    if let Some(e) = output_error {
        anyhow::bail!(
            "{e}: the trace in {} holds every packet written before (babeltrace2 reads its \
             user/ trace; a kernel stream stays staged in .kernel-wire/); the packets not \
             written are still in the region: free space, then `ivtrace record --resume` with \
             the same --shm and -o records them, or `ivtrace recover` finishes the trace as it is",
            out.path().display()
        );
    }
    Ok(session::events_seen(&sidecar))
}

/// A migrated guest's part: its trace UUID, the handoff it leaves (when
/// it handed off) and the sidecar's `migration` section.
fn record_migration(
    sidecar: &mut ivtrace_ctf::sidecar::Sidecar,
    reader: &Reader,
    reason: StopReason,
    names: Names,
) -> Result<()> {
    let part = names.part();
    let handed_off = reason == StopReason::Handoff;
    if handed_off {
        migration::write_handoff(names.out, &reader.handoff(part))?;
    }
    if part == 0 && !handed_off {
        return Ok(());
    }
    let uuid = migration::part_uuid(reader.region().header().uuid, part);
    sidecar.trace_uuid = ivtrace_region::region::format_uuid(&uuid);
    let handoff_file = names.out.join(migration::HANDOFF_NAME);
    sidecar.migration = Some(migration::migration_section(
        part,
        names.resumed.as_ref().map(|(p, r)| (*p, r)),
        handed_off.then_some(handoff_file.as_path()),
    ));
    Ok(())
}

/// `--host-events`: the host events of the QEMU behind the region file
/// (`--qemu-pid`, or the process that maps it) into `DIR/host/`, for as
/// long as the recording runs.
fn start_host_events(
    qemu_pid: Option<i32>,
    shm: &Path,
    out: &OutDir,
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

/// What the host side of a recording gives its sidecar: the host events'
/// statistics and what the VM view found.
struct HostSideDone {
    stats: HostEventStats,
    self_check: Option<serde_json::Value>,
    tsc_writes: Vec<ivtrace_time::versioned::TscWrite>,
}

/// Stops the host events, derives the VM view from them and the finished
/// guest traces, closes the host trace, says what was recorded.
fn finish_host_events(run: HostRun, guest: &GuestOutput) -> Result<HostSideDone> {
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
    let mut self_check = None;
    let mut tsc_writes = Vec::new();
    match side.vm_view(guest, vcpus, source) {
        Some(Ok(d)) => {
            crate::summary::print_vm_view(&d);
            tsc_writes.clone_from(&d.tsc_writes);
            self_check = d.self_check.as_ref().map(|c| {
                crate::summary::print_self_check(c);
                serde_json::to_value(c).expect("plain data")
            });
        }
        Some(Err(e)) => eprintln!("ivtrace: warning: no VM view: {e:#}"),
        None => {}
    }
    side.finish()?;
    Ok(HostSideDone {
        stats,
        self_check,
        tsc_writes,
    })
}
