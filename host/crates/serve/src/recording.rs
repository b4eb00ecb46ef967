//! One recording of a served guest: from the region the module formatted
//! to a finalized trace directory `OUTROOT/<name>` (guest traces, the host
//! trace, `ivtrace.json` with serve's own sections), on ivtrace-engine's
//! loop with serve's waiter, clock, output and hooks.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::eventfd::EventFd;
use serde_json::{json, Value};

use ivtrace_ctf::host_trace::STREAM_IVTRACE;
use ivtrace_ctf::sidecar::{ChannelSummary, Sidecar, SIDECAR_NAME};
use ivtrace_ctf::{EnvValue, OutDir};
use ivtrace_engine::host_side::{GuestOutput, HostSide};
use ivtrace_engine::notify::NotifyStats;
use ivtrace_engine::{session, Core, Output, Parts, Recorded, Step, StopReason};
use ivtrace_migration::{self as migration, Resumed};
use ivtrace_region::{abi, Reader, Region};
use ivtrace_time::pingpong::{Entry, Kick};
use ivtrace_time::{pingpong, ClockSync, GuestClock};

use crate::error::Report;
use crate::guest::{describe, Guest, GuestWaiter};
use crate::hostlog::{kick, serve_classes, Deliveries, Delivering, ServeHooks};
use crate::migration::Resume;
use crate::proto::{GUEST_ID, HOST_ID};
use crate::{Result, ServeError};

/// Claims `root/name`, or `name-2`, `name-3`... (atomic `mkdirat`
/// relative to the root's descriptor, then opened without following a
/// link: see ivtrace-ctf's `outdir`).
pub fn claim_dir(root: &OutDir, name: &str) -> Result<OutDir> {
    for k in 1u32.. {
        let n = if k == 1 {
            name.to_string()
        } else {
            format!("{name}-{k}")
        };
        match root.create_dir(&n) {
            Ok(d) => return Ok(d),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(ServeError::io(format!(
                    "create {}",
                    root.join(&n).display()
                ))(e))
            }
        }
    }
    unreachable!("u32 names exhausted")
}

/// What a finished recording adds to the sidecar besides the engine's
/// results.
struct Observed {
    out: PathBuf,
    /// Which part of a migrated guest's trace this is (0: the first).
    part: u32,
    resumed: Option<(PathBuf, Resumed)>,
    dir: OutDir,
    doorbell: bool,
    /// Doorbells received, late ones included.
    received: u64,
    notify: NotifyStats,
    host_counts: Vec<u64>,
    host_event_stats: Option<ivtrace_tracefs::host_events::HostEventStats>,
    tap: Option<Arc<ivtrace_engine::relayd::RelayTap>>,
    relay: Option<Value>,
    vm_view: Option<ivtrace_vmview::derive::Derived>,
    /// The boot analysis of the finished kernel trace (docs/boot.md).
    boot: Option<Value>,
}

/// A recording in progress: the engine's state and everything serve keeps
/// beside it, stepped by a drain worker ([`crate::pool`]).
pub struct Live {
    core: Core<Delivering>,
    clock: GuestClock,
    host: HostSide,
    stream: usize,
    out: PathBuf,
    dir: OutDir,
    /// Which part of a migrated guest's trace this is (0: the first).
    part: u32,
    resumed: Option<(PathBuf, Resumed)>,
    doorbell: bool,
    notify_before: NotifyStats,
    /// Doorbells received so far (the hooks count them).
    received: u64,
    /// `ivtrace ctl handoff` came: the next step ends this part.
    handoff: bool,
    tap: Option<Arc<ivtrace_engine::relayd::RelayTap>>,
}

/// Starts recording one formatted region; `resume`: the guest arrived by
/// migration and this part continues that handoff.
pub fn start(
    g: &Guest,
    waiter: &mut GuestWaiter,
    region: Region,
    resume: Option<&Resume>,
) -> Result<Live> {
    let dir = claim_dir(&g.cfg.outroot, &g.name)?;
    let out = dir.path().to_path_buf();
    announce(g, &region, &out);
    let doorbell = waiter.start_recording(region.header().features & abi::IVT_FEAT_DOORBELL != 0);
    region.protocol().set_doorbell_target(HOST_ID as u16, 0);
    let clock = GuestClock::start(
        &region,
        g.peer.pid,
        clock_entry(g.interrupts.first(), &region),
        g.cfg.sync_interval,
    );
    let mapping = clock.initial_mapping();
    let mut reader = Reader::new(region, mapping.expressible());
    reader.set_user_clock(mapping.ns_scale(), mapping.expressible());
    let resumed = match resume {
        Some((path, h)) => {
            let r = reader.resume(h).map_err(|source| ServeError::Resume {
                path: path.clone(),
                source,
            })?;
            g.log(&format!(
                "part {} of the trace: {} packets the previous part already holds skipped",
                r.part, r.already_recorded
            ));
            Some((path.clone(), r))
        }
        None => None,
    };
    let part = resumed.as_ref().map_or(0, |(_, r)| r.part);
    let region = reader.region();
    g.log(&clock.describe());
    let (host, stream) = host_side(g, &dir)?;
    let writer = session::ctf_writer_part(
        region,
        &dir,
        &clock.initial_mapping(),
        &g.name,
        g.cfg.limits,
        "serve",
        part,
    );
    let mut sinks = ivtrace_engine::Sinks::new(writer);
    let tap = match g.cfg.relay.as_ref() {
        Some(hub) => {
            let freq = region.header().clock.freq_hz;
            let tap = ivtrace_engine::relayd::attach(hub, &g.name, freq, &mut sinks);
            host.add_sink(tap.sink())?;
            Some(tap)
        }
        None => None,
    };
    let output = Deliveries::around(sinks, Arc::clone(host.trace()), stream);
    Ok(Live {
        core: Core::new(reader, output),
        clock,
        host,
        stream,
        out,
        dir,
        part,
        resumed,
        doorbell,
        notify_before: waiter.stats(),
        received: 0,
        handoff: false,
        tap,
    })
}

/// Serve's hooks for one step (they borrow the guest's channels and the
/// trace directory's name; the doorbell count and a requested handoff
/// live in [`Live`] between steps).
fn hooks<'a>(
    g: &'a Guest,
    host: &HostSide,
    stream: usize,
    out: &'a Path,
    (received, handoff): (u64, bool),
) -> ServeHooks<'a> {
    ServeHooks {
        requests: &g.requests,
        status: &g.status,
        stop: &g.stop,
        kick: g.interrupts.first().map(|fd| &**fd),
        host: Arc::clone(host.trace()),
        stream,
        received,
        safety_timeout: g.cfg.safety_timeout,
        out,
        handoff,
    }
}

/// One engine step ([`Core::step`]).
pub fn step(g: &Guest, waiter: &mut GuestWaiter, live: &mut Live) -> Result<Step> {
    let carried = (live.received, live.handoff);
    let mut h = hooks(g, &live.host, live.stream, &live.out, carried);
    let mut parts = Parts {
        clock: &mut live.clock,
        wait: waiter,
        hooks: &mut h,
    };
    let step = live.core.step(&mut parts);
    (live.received, live.handoff) = (h.received, h.handoff);
    Ok(step?)
}

/// The wait of a [`Step::Block`] ended ([`Core::woke`]).
pub fn woke(
    g: &Guest,
    waiter: &mut GuestWaiter,
    live: &mut Live,
    woken: Result<ivtrace_engine::Woken, ivtrace_engine::EngineError>,
) -> Result<()> {
    let carried = (live.received, live.handoff);
    let mut h = hooks(g, &live.host, live.stream, &live.out, carried);
    let mut parts = Parts {
        clock: &mut live.clock,
        wait: waiter,
        hooks: &mut h,
    };
    let res = live.core.woke(&mut parts, woken);
    (live.received, live.handoff) = (h.received, h.handoff);
    Ok(res?)
}

/// A recording whose traces are finished, its relay session closing:
/// [`conclude`] writes the sidecar and the summary once the relay took
/// the last packets or gave up ([`Ending::relay_pending`]).
pub struct Ending {
    rec: Recorded<Delivering>,
    clock: GuestClock,
    observed: Observed,
}

impl Ending {
    /// Whether the relay session is still closing (concluding now would
    /// wait for it: a drain worker gives its turn to other guests instead).
    pub fn relay_pending(&self) -> bool {
        self.observed
            .tap
            .as_ref()
            .is_some_and(|t| !t.close_settled())
    }
}

/// Finalizes the recording that ended for `reason`: the traces and the
/// host trace; starts closing the relay session without waiting for it.
pub fn end(g: &Guest, waiter: &mut GuestWaiter, live: Live, reason: StopReason) -> Result<Ending> {
    let Live {
        core,
        mut clock,
        host,
        stream,
        out,
        dir,
        part,
        resumed,
        doorbell,
        notify_before,
        received,
        handoff,
        tap,
    } = live;
    let mut h = hooks(g, &host, stream, &out, (received, handoff));
    let mut parts = Parts {
        clock: &mut clock,
        wait: waiter,
        hooks: &mut h,
    };
    let rec = core.finalize(&mut parts, reason)?;
    let received = h.received + waiter.late_doorbells();
    drop(h);
    let mut observed = Observed {
        out,
        dir,
        part,
        resumed,
        doorbell,
        received,
        notify: notify_since(waiter.stats(), notify_before, &rec, received),
        host_counts: Vec::new(),
        host_event_stats: None,
        tap,
        relay: None,
        vm_view: None,
        boot: None,
    };
    let rec = finish_traces(g, rec, &clock, host, &mut observed)?;
    if let Some(tap) = &observed.tap {
        tap.begin_close();
    }
    Ok(Ending {
        rec,
        clock,
        observed,
    })
}

/// A migrated guest's part: the handoff it leaves when it handed off, its
/// trace UUID and the sidecar's `migration` section.
fn migration_sidecar(
    sidecar: &mut Sidecar,
    rec: &Recorded<Delivering>,
    observed: &Observed,
) -> Result<()> {
    let handed_off = rec.reason == StopReason::Handoff;
    if handed_off {
        migration::write_handoff(&observed.dir, &rec.reader.handoff(observed.part))?;
    }
    if observed.part == 0 && !handed_off {
        return Ok(());
    }
    let uuid = migration::part_uuid(rec.reader.region().header().uuid, observed.part);
    sidecar.trace_uuid = ivtrace_region::region::format_uuid(&uuid);
    let file = observed.out.join(migration::HANDOFF_NAME);
    sidecar.migration = Some(migration::migration_section(
        observed.part,
        observed.resumed.as_ref().map(|(p, r)| (p.as_path(), r)),
        handed_off.then_some(file.as_path()),
    ));
    Ok(())
}

fn announce(g: &Guest, region: &Region, out: &Path) {
    g.log(&format!(
        "region formatted (uuid {}, {} channels): recording into {}",
        region.header().uuid_string(),
        region.layout().nr_channels,
        out.display()
    ));
    if let Ok(mut s) = g.status.lock() {
        s.traces.push(out.display().to_string());
        s.state = "recording".into();
    }
}

/// The ping-pong's kick: an interrupt on the guest's MSI-X vector 0.
fn clock_kick(fd: Arc<EventFd>) -> Kick {
    Box::new(move || kick(Some(&fd)))
}

/// How the clock exchange meets the guest: a kick on MSI-X vector 0, else
/// (no interrupt vector) at its control poll if its writer spins.
fn clock_entry(kick_fd: Option<&Arc<EventFd>>, region: &Region) -> Option<Entry> {
    match kick_fd {
        Some(fd) => Some(Entry::Kick(clock_kick(Arc::clone(fd)))),
        None => ivtrace_time::pingpong::Entry::poll_for(region, false),
    }
}

/// `DIR/host/`: serve's stream, and the host events if asked for (a
/// failure there is logged, the recording goes on without them).
fn host_side(g: &Guest, out: &OutDir) -> Result<(HostSide, usize)> {
    let mut classes = serve_classes();
    let events = g.cfg.host_events.then(|| {
        ivtrace_tracefs::host_events::HostEvents::prepare(g.peer.pid, &mut classes)
            .map_err(|e| g.log(&format!("host events not recorded: {}", Report(&e))))
            .ok()
    });
    let env = vec![
        ("ivtrace_guest_name".into(), EnvValue::Str(g.name.clone())),
        qemu_pid_env(g),
    ];
    let mut host = HostSide::create(out, &g.name, env, classes)?;
    let stream =
        host.trace()
            .lock()
            .expect("not poisoned")
            .add_stream(STREAM_IVTRACE, 0, "ivtrace_host")?;
    if let Some(Some(events)) = events {
        if let Err(e) = host.start_events(events) {
            g.log(&format!("host events not recorded: {}", Report(&e)));
        }
    }
    Ok((host, stream))
}

fn qemu_pid_env(g: &Guest) -> (String, EnvValue) {
    let pid = g.peer.pid.unwrap_or(0) as i64;
    ("ivtrace_qemu_pid".into(), EnvValue::Int(pid))
}

fn stop_host_events(
    g: &Guest,
    host: &mut HostSide,
) -> Option<ivtrace_tracefs::host_events::HostEventStats> {
    match host.stop_events()? {
        Ok(stats) => Some(stats),
        Err(e) => {
            g.log(&format!("host events: {}", Report(&e)));
            None
        }
    }
}

/// The notifier's counters during this recording, with the engine's
/// handshake counts and every doorbell received.
fn notify_since(
    now: NotifyStats,
    before: NotifyStats,
    rec: &Recorded<Delivering>,
    received: u64,
) -> NotifyStats {
    NotifyStats {
        doorbells: received,
        sleep_attempts: rec.handshake.sleep_attempts,
        recheck_hits: rec.handshake.recheck_hits,
        blocked: now.blocked - before.blocked,
        woken_by_doorbell: now.woken_by_doorbell - before.woken_by_doorbell,
        timeouts: now.timeouts - before.timeouts,
    }
}

/// The traces' env and metadata, the host trace and the VM view.
fn finish_traces(
    g: &Guest,
    mut rec: Recorded<Delivering>,
    clock: &GuestClock,
    mut host: HostSide,
    observed: &mut Observed,
) -> Result<Recorded<Delivering>> {
    let env = trace_env(g, &rec, clock, &observed.out);
    let Recorded {
        reader,
        output,
        clock: mapping,
        output_error,
        ..
    } = &mut rec;
    let finished = match output_error {
        Some(_) => Output::finish_incomplete(output, mapping, env, reader.classes()),
        None => Output::finish(output, mapping, env, reader.classes()),
    };
    if let Err(e) = finished {
        // A full disk while finishing (the kernel expansion): the sidecar
        // still says so; `ivtrace recover` finishes the rest.
        let why = format!("finishing the trace failed: {}", Report(&e));
        g.log(&why);
        output_error.get_or_insert(why);
    }
    observed.boot = match &rec.output_error {
        None => {
            ivtrace_boot::derive::at_end(rec.output.inner.dir.root(), &g.cfg.boot, |m| g.log(m))
        }
        Some(_) => None,
    };
    observed.host_event_stats = stop_host_events(g, &mut host);
    observed.vm_view = vm_view(g, &mut host, &rec, observed.host_event_stats.as_ref());
    observed.host_counts = host.finish()?;
    Ok(rec)
}

/// The relay session's end (at once once [`Ending::relay_pending`] is
/// false), the sidecar with serve's sections, the status, the summary and
/// the log line.
pub fn conclude(g: &Guest, ending: Ending) -> Result<StopReason> {
    let Ending {
        rec,
        clock,
        mut observed,
    } = ending;
    let (clock, observed) = (&clock, &mut observed);
    observed.relay = observed
        .tap
        .take()
        .map(|t| ivtrace_engine::relayd::close(&t, |m| g.log(m)));
    let mut sidecar = session::build_sidecar(
        &rec.reader,
        &rec.output.inner.dir,
        &g.shm.path,
        "serve",
        &rec.clock,
        rec.elapsed,
        &stop_reason(&rec),
    );
    sidecar.relay = observed.relay.clone();
    sidecar.boot = observed.boot.take();
    sidecar.host_lost = observed
        .host_event_stats
        .as_ref()
        .map(ivtrace_engine::host_side::host_lost);
    sidecar.self_check = observed
        .vm_view
        .as_ref()
        .and_then(|d| d.self_check.as_ref())
        .map(|c| serde_json::to_value(c).expect("plain data"));
    sidecar.tracefs_formats.host = observed
        .host_event_stats
        .as_ref()
        .map(|s| s.formats.clone());
    migration_sidecar(&mut sidecar, &rec, observed)?;
    if rec.output_error.is_some() {
        sidecar.state = ivtrace_ctf::sidecar::STATE_INCOMPLETE.into();
    }
    let mut doc = sidecar_with_serve_sections(g, &sidecar, &rec, clock, observed)?;
    if g.cfg.trace_cmd {
        trace_cmd_files(g, observed, &mut doc)?;
    }
    if let Ok(mut s) = g.status.lock() {
        s.clock_method = Some(rec.clock.method.clone());
        s.clock_error_ns = Some(rec.clock.error_ns);
    }
    g.cfg.report(&sidecar, &doc, &observed.out);
    log_finished(g, &sidecar, &rec, observed);
    Ok(rec.reason)
}

/// `--trace-cmd`: the finished recording's trace-cmd files in
/// `DIR/trace-cmd/` (read back from what was just written); what was
/// written, or why not, goes into the sidecar's `trace_cmd` (a failure
/// there is logged; the recording itself is finished).
fn trace_cmd_files(g: &Guest, observed: &Observed, doc: &mut Value) -> Result<()> {
    let written = observed
        .dir
        .create_dir("trace-cmd")
        .map_err(ivtrace_tracecmd::export::ExportError::from)
        .and_then(|out| {
            ivtrace_tracecmd::export_into(std::slice::from_ref(&observed.out), &out, false)
        });
    let section = match written {
        Ok(e) => {
            let events = |f: &ivtrace_tracecmd::side::FileSummary| f.events.values().sum::<u64>();
            let guests: u64 = e.guests.iter().map(|x| events(&x.file)).sum();
            g.log(&format!(
                "trace-cmd files in {}: host.dat ({} events), {} guest file(s) ({guests} events)",
                observed.dir.join("trace-cmd").display(),
                events(&e.host),
                e.guests.len()
            ));
            serde_json::to_value(&e)?
        }
        Err(e) => {
            let why = Report(&e).to_string();
            g.log(&format!("trace-cmd files not written: {why}"));
            json!({ "error": why })
        }
    };
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("trace_cmd".into(), section);
    }
    let mut text = serde_json::to_vec_pretty(doc)?;
    text.push(b'\n');
    observed
        .dir
        .write_atomically(SIDECAR_NAME, &text)
        .map_err(ServeError::io(format!(
            "write {}",
            observed.dir.join(SIDECAR_NAME).display()
        )))
}

fn trace_env(
    g: &Guest,
    rec: &Recorded<Delivering>,
    clock: &GuestClock,
    out: &Path,
) -> ivtrace_ctf::TraceEnv {
    let mut env = session::trace_env_named(rec.reader.region(), out, &rec.clock, &g.name);
    let span = pingpong::span_ns(clock.points()).min(i64::MAX as u64) as i64;
    env.extra.extend([
        ("ivtrace_guest_name".into(), EnvValue::Str(g.name.clone())),
        qemu_pid_env(g),
        ("ivtrace_clock_sync_span_ns".into(), EnvValue::Int(span)),
    ]);
    env
}

/// Completed packets: what a doorbell is rung for at most once.
fn complete_packets(sidecar: &Sidecar) -> u64 {
    let totals = ChannelSummary::totals(&sidecar.channels);
    totals.packets.saturating_sub(totals.partial_packets)
}

/// `ivtrace.json`: the common sidecar plus serve's `serve`,
/// `notification`, `clock_sync` and `delivery` sections (readers of the
/// sidecar ignore keys they do not know). Written atomically.
fn sidecar_with_serve_sections(
    g: &Guest,
    sidecar: &Sidecar,
    rec: &Recorded<Delivering>,
    clock: &GuestClock,
    observed: &Observed,
) -> Result<Value> {
    let mut doc = serde_json::to_value(sidecar)?;
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("serve".into(), serve_section(g, observed));
        let notification = notification_section(rec, observed, complete_packets(sidecar));
        obj.insert("notification".into(), notification);
        let mut sync = clock.sync_section(&rec.clock);
        if let (Some(s), Some(d)) = (sync.as_mut(), observed.vm_view.as_ref()) {
            s.follow_tsc_writes(&d.tsc_writes);
        }
        obj.insert("clock_sync".into(), serde_json::to_value(sync)?);
        obj.insert("delivery".into(), rec.output.watcher.latency(&rec.clock));
    }
    let mut text = serde_json::to_vec_pretty(&doc)?;
    text.push(b'\n');
    observed
        .dir
        .write_atomically(SIDECAR_NAME, &text)
        .map_err(ServeError::io(format!(
            "write {}",
            observed.dir.join(SIDECAR_NAME).display()
        )))?;
    Ok(doc)
}

fn serve_section(g: &Guest, observed: &Observed) -> Value {
    json!({
        "guest": g.name,
        "qemu_pid": g.peer.pid,
        "qemu_comm": g.peer.comm,
        "peer_ids": {"guest": GUEST_ID, "host": HOST_ID},
        "vectors": g.cfg.vectors,
        "doorbell_device": observed.doorbell,
        "host_trace": "host",
        "host_trace_events": observed.host_counts,
        "host_events": g.cfg.host_events,
        "host_event_stats": observed.host_event_stats,
        "vm_view": observed.vm_view,
    })
}

/// The VM view of the recording (when host events were recorded), logged.
fn vm_view(
    g: &Guest,
    host: &mut HostSide,
    rec: &Recorded<Delivering>,
    stats: Option<&ivtrace_tracefs::host_events::HostEventStats>,
) -> Option<ivtrace_vmview::derive::Derived> {
    let guest = GuestOutput::of(&rec.output.inner.dir, rec.reader.classes(), &rec.clock);
    let named = stats.is_some_and(|s| s.vcpu_names);
    let source = ivtrace_engine::host_side::vcpu_source(false, named);
    match host.vm_view(&guest, HashMap::new(), source)? {
        Ok(d) => {
            for line in ivtrace_vmview::derive::describe(&d) {
                g.log(&format!("vm view: {line}"));
            }
            for line in d
                .self_check
                .iter()
                .flat_map(ivtrace_vmview::selfcheck::describe)
            {
                g.log(&line);
            }
            Some(d)
        }
        Err(e) => {
            g.log(&format!("no VM view: {}", Report(&e)));
            None
        }
    }
}

fn notification_section(rec: &Recorded<Delivering>, observed: &Observed, complete: u64) -> Value {
    let received = observed.received;
    json!({
        "mode": if observed.doorbell { "doorbell" } else { "polling" },
        "doorbells_received": received,
        "doorbells_rung_by_guest": rec.reader.region().protocol().doorbells_rung(),
        "completed_packets": complete,
        "doorbells_per_completed_packet": if complete > 0 {
            received as f64 / complete as f64 } else { 0.0 },
        "stats": observed.notify,
    })
}

/// The sidecar's `stop_reason`: why, and what the output said if it failed.
fn stop_reason(rec: &Recorded<Delivering>) -> String {
    match &rec.output_error {
        Some(e) => format!("{}: {e}", describe(rec.reason)),
        None => describe(rec.reason).to_string(),
    }
}

fn log_finished(g: &Guest, sidecar: &Sidecar, rec: &Recorded<Delivering>, observed: &Observed) {
    let totals = ChannelSummary::totals(&sidecar.channels);
    g.log(&format!(
        "trace {} finalized ({}): {} events, {} lost, {} doorbells for {} completed packets, \
         clock {} (error <= {} ns)",
        observed.out.display(),
        describe(rec.reason),
        totals.events,
        totals.lost.total(),
        observed.received,
        complete_packets(sidecar),
        rec.clock.method,
        rec.clock.error_ns
    ));
}
