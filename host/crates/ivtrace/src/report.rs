//! `ivtrace report DIR`: walks the stream files ivtrace wrote with the
//! same walker the drain uses and the layouts from the sidecar; prints
//! counts per event type, losses, time span, rates and bytes per event.

use ivtrace_region::sanitize::Shown;
use std::io::{self, BufReader, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use ivtrace_ctf::outdir::{open_regular, read_limited};
use ivtrace_ctf::read::{Clock, Trace};
use ivtrace_ctf::sidecar::{HostLost, Lost, Sidecar, SIDECAR_MAX_BYTES, SIDECAR_NAME};
use ivtrace_ctf::trace::{stream_dir, stream_file_name, NO_CHANNEL_FILE};
use ivtrace_region::packet::{EventVisitor, PacketHeader};
use ivtrace_region::reader::walk_own_packet;
use ivtrace_region::{abi, EventClasses};
use ivtrace_time::pingpong::ExchangeSummary;
use ivtrace_vmview::model::comm_str;
use ivtrace_vmview::report::VmReport;
use ivtrace_vmview::selfcheck::SelfCheck;
use ivtrace_vmview::timeline::NOT_TRACED;

use crate::cli::ReportArgs;
use crate::summary::si;
use ivtrace_engine::UserError;

/// Per-event-id counts of one stream class.
struct Counts(Vec<u64>);

impl EventVisitor for Counts {
    #[inline]
    fn event(&mut self, id: u32, _ts: u64) {
        self.0[id as usize] += 1;
    }
}

#[derive(Debug, Default, Serialize)]
pub struct ChannelReport {
    pub channel: u32,
    pub file: String,
    pub events: u64,
    pub packets: u64,
    /// events_discarded of the channel's last packet: every loss CTF shows.
    pub discarded: u64,
    pub bytes: u64,
    pub event_bytes: u64,
    pub header_bytes: u64,
    /// The first and last times, as the channel's trace writes them (its
    /// clock's values: ticks in the user trace, nanoseconds since the
    /// epoch in the kernel trace), and on the host's wall clock.
    pub first_ts: Option<u64>,
    pub last_ts: Option<u64>,
    pub first_realtime_ns: Option<i128>,
    pub last_realtime_ns: Option<i128>,
    pub events_per_s: f64,
    pub bytes_per_event: f64,
}

#[derive(Debug, Serialize)]
pub struct EventTypeReport {
    pub stream_class: u32,
    pub id: u32,
    pub name: String,
    pub count: u64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub trace_uuid: String,
    pub events: u64,
    /// Every loss the traces announce to a CTF reader (the streams' last
    /// `events_discarded`: channels, the no-channel stream, the host trace).
    pub discarded: u64,
    /// Every loss recorded, by reason (`lost_by_reason`, `lost_no_channel`,
    /// `host_lost.missed`, `lost_ftrace`): equal to `discarded` unless a
    /// count was clamped.
    pub lost_total: u64,
    pub lost_by_reason: Lost,
    pub lost_no_channel: u64,
    /// ftrace's events the relay's streams lost (the sidecar's
    /// `ftrace.cpus[].lost`, docs/ftrace.md "Losses"; also in `lost_total`).
    pub lost_ftrace: u64,
    /// What the host trace lost, if the recording had host events.
    pub host_lost: Option<HostLost>,
    /// What the no-channel stream and the host trace announce (also in
    /// `discarded`).
    pub discarded_no_channel: u64,
    pub discarded_host: u64,
    pub first_realtime_ns: Option<i128>,
    pub last_realtime_ns: Option<i128>,
    pub span_s: f64,
    pub events_per_s: f64,
    pub bytes_per_event: f64,
    pub header_bytes_per_event: f64,
    pub event_types: Vec<EventTypeReport>,
    /// The writer-clock -> host-time mapping the traces carry, with its bound.
    pub clock: ivtrace_ctf::ClockMapping,
    /// The clock exchange that measured it, if one ran (the sidecar's
    /// `clock_sync.pingpong`): the bound in force over its points, bursts,
    /// retries, cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_exchange: Option<ExchangeSummary>,
    /// The mapping checked on cause -> effect pairs of the guest and host
    /// traces (recordings with host events; the sidecar's `self_check`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_check: Option<SelfCheck>,
    pub channels: Vec<ChannelReport>,
    /// `finalized`, or `recording` / `incomplete` / `recovered`.
    pub state: String,
    pub stop_reason: String,
    /// Guest counters clamped for CTF readers, and other notes.
    pub notes: Vec<String>,
    /// The VM view (`DIR/vm/`, recorded with host events): vCPUs preempted,
    /// blocked, in the hypervisor; guest threads that lost time; host tasks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_view: Option<VmReport>,
}

fn read_sidecar(dir: &Path) -> Result<Sidecar> {
    let path = dir.join(SIDECAR_NAME);
    let text = open_regular(&path)
        .and_then(|f| read_limited(f, SIDECAR_MAX_BYTES, &path))
        .map_err(|e| UserError {
            message: format!("cannot read {}: {e}", path.display()),
            hint: "pass a directory written by `ivtrace record` or `ivtrace snapshot`".into(),
        })?;
    serde_json::from_slice(&text)
        .with_context(|| format!("{} is not an ivtrace sidecar", path.display()))
}

/// Reads the next packet of a stream file into `buf`; false at the end.
fn next_packet(f: &mut impl Read, buf: &mut Vec<u8>) -> Result<bool> {
    buf.resize(abi::PACKET_HDR_SIZE, 0);
    match f.read_exact(buf) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        r => r?,
    }
    let h = PacketHeader::parse(buf);
    let size = h.packet_size / 8;
    if !h.packet_size.is_multiple_of(8)
        || size < abi::PACKET_HDR_SIZE as u64
        || size > abi::IVT_SUBBUF_MAX as u64
    {
        bail!("packet_size {} bits is not valid", h.packet_size);
    }
    buf.resize(size as usize, 0);
    f.read_exact(&mut buf[abi::PACKET_HDR_SIZE..])?;
    Ok(true)
}

/// A stream file of the guest's traces: `rel` (from trusted names only)
/// under `dir`, reported as channel `chan`.
struct StreamFile {
    rel: String,
    chan: u32,
}

impl StreamFile {
    fn channel(stream: u32, chan: u32) -> StreamFile {
        StreamFile {
            rel: format!("{}/{}", stream_dir(stream), stream_file_name(stream, chan)),
            chan,
        }
    }
}

fn walk_channel(
    dir: &Path,
    file: StreamFile,
    classes: &EventClasses,
    counts: &mut Counts,
) -> Result<ChannelReport> {
    let StreamFile { rel, chan } = file;
    let path = dir.join(&rel);
    let mut f = BufReader::with_capacity(
        1 << 20,
        open_regular(&path).with_context(|| format!("cannot open {}", path.display()))?,
    );
    let mut r = ChannelReport {
        channel: chan,
        file: rel,
        ..Default::default()
    };
    let mut buf = Vec::new();
    while next_packet(&mut f, &mut buf)
        .with_context(|| format!("{}: packet {}", path.display(), r.packets))?
    {
        let (h, s) = walk_own_packet(&mut buf, classes, counts)
            .with_context(|| format!("{}: packet {}", path.display(), r.packets))?;
        r.packets += 1;
        r.events += s.events;
        r.bytes += buf.len() as u64;
        r.event_bytes += h.content_size / 8 - abi::PACKET_HDR_SIZE as u64;
        r.header_bytes += s.header_bytes();
        r.discarded = r.discarded.max(h.events_discarded);
        if s.events > 0 {
            r.first_ts.get_or_insert(h.timestamp_begin);
            r.last_ts = Some(s.last_ts);
        }
    }
    Ok(r)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The clock of stream class `stream`'s trace, as its metadata declares
/// it; the recording's mapping in ticks if the metadata cannot be read.
fn trace_clock(dir: &Path, stream: u32, sidecar: &Sidecar) -> Clock {
    if let Ok(t) = Trace::open(&dir.join(stream_dir(stream))) {
        return t.clock().clone();
    }
    let (offset_s, offset) = sidecar.clock.ctf_offset();
    Clock {
        freq: sidecar.clock.freq_hz.max(1),
        offset_s,
        offset,
        ..Clock::default()
    }
}

/// Seconds from `a` to `b` (nanoseconds), 0 unless both are known.
fn seconds(a: Option<i128>, b: Option<i128>) -> f64 {
    match (a, b) {
        (Some(a), Some(b)) => (b - a).max(0) as f64 / 1e9,
        _ => 0.0,
    }
}

/// Builds the report of `dir`.
pub fn build(dir: &Path) -> Result<Report> {
    let sidecar = read_sidecar(dir)?;
    let classes = sidecar.event_classes();
    let mut counts: [Counts; abi::IVT_STREAM_CLASSES as usize] =
        std::array::from_fn(|_| Counts(vec![0; abi::IVT_EVENT_IDS_MAX as usize]));
    let mut channels = Vec::new();
    let mut lost = Lost::default();
    for c in &sidecar.channels {
        // A relay channel's losses are pages, counted again in events by
        // ftrace's accounting (`lost_ftrace`), unless nothing was decoded.
        if c.stream_class != abi::IVT_STREAM_FTRACE || sidecar.ftrace.is_none() {
            lost.add(&c.lost);
        }
        if c.file.is_none() {
            continue;
        }
        let stream = c.stream_class.min(abi::IVT_STREAM_CLASSES - 1);
        let file = StreamFile::channel(stream, c.channel);
        let mut r = walk_channel(dir, file, &classes, &mut counts[stream as usize])?;
        let clock = trace_clock(dir, stream, &sidecar);
        r.first_realtime_ns = r.first_ts.map(|t| clock.ns_from_origin(t));
        r.last_realtime_ns = r.last_ts.map(|t| clock.ns_from_origin(t));
        let span = seconds(r.first_realtime_ns, r.last_realtime_ns);
        r.events_per_s = ratio(r.events as f64, span);
        r.bytes_per_event = ratio(r.event_bytes as f64, r.events as f64);
        channels.push(r);
    }
    let event_types = event_types(&classes, &counts);
    let first = channels.iter().filter_map(|c| c.first_realtime_ns).min();
    let last = channels.iter().filter_map(|c| c.last_realtime_ns).max();
    let span_s = seconds(first, last);
    let events: u64 = channels.iter().map(|c| c.events).sum();
    let event_bytes: u64 = channels.iter().map(|c| c.event_bytes).sum();
    let header_bytes: u64 = channels.iter().map(|c| c.header_bytes).sum();
    let extra = other_losses(dir, &sidecar, &classes)?;
    let discarded = channels
        .iter()
        .fold(0u64, |a, c| a.saturating_add(c.discarded))
        .saturating_add(extra.no_channel)
        .saturating_add(extra.host);
    let host_missed = sidecar.host_lost.as_ref().map_or(0, |h| h.missed);
    let lost_ftrace = sidecar.ftrace.as_ref().map_or(0, |f| {
        f.cpus.iter().fold(0u64, |a, c| a.saturating_add(c.lost))
    });
    Ok(Report {
        trace_uuid: sidecar.trace_uuid.clone(),
        events,
        discarded,
        lost_total: lost
            .total()
            .saturating_add(sidecar.lost_no_channel)
            .saturating_add(host_missed)
            .saturating_add(lost_ftrace),
        lost_by_reason: lost,
        lost_no_channel: sidecar.lost_no_channel,
        lost_ftrace,
        host_lost: sidecar.host_lost.clone(),
        discarded_no_channel: extra.no_channel,
        discarded_host: extra.host,
        first_realtime_ns: first,
        last_realtime_ns: last,
        span_s,
        events_per_s: ratio(events as f64, span_s),
        bytes_per_event: ratio(event_bytes as f64, events as f64),
        header_bytes_per_event: ratio(header_bytes as f64, events as f64),
        event_types,
        channels,
        clock: sidecar.clock.clone(),
        clock_exchange: clock_exchange(&sidecar)?,
        self_check: self_check(&sidecar)?,
        notes: crate::summary::notes(&sidecar),
        state: sidecar.state.clone(),
        stop_reason: sidecar.stop_reason.clone(),
        vm_view: vm_view(dir)?,
    })
}

/// The sidecar's self-check, if the recording had one.
fn self_check(sidecar: &Sidecar) -> Result<Option<SelfCheck>> {
    let Some(v) = &sidecar.self_check else {
        return Ok(None);
    };
    let c = serde_json::from_value(v.clone())
        .context("the sidecar's self_check is not one ivtrace wrote (a newer ivtrace?)")?;
    Ok(Some(c))
}

/// The sidecar's clock exchange, if one ran.
fn clock_exchange(sidecar: &Sidecar) -> Result<Option<ExchangeSummary>> {
    let section = sidecar.clock_sync.as_ref().and_then(|c| c.get("pingpong"));
    let Some(v) = section.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let e = serde_json::from_value(v.clone())
        .context("the sidecar's clock_sync.pingpong is not one ivtrace wrote (a newer ivtrace?)")?;
    Ok(Some(e))
}

/// `DIR/vm/` read back, if the recording has one.
fn vm_view(dir: &Path) -> Result<Option<VmReport>> {
    let vm = dir.join("vm");
    if !vm.join("metadata").is_file() {
        return Ok(None);
    }
    Ok(Some(ivtrace_vmview::report::summarize(&vm)?))
}

/// Losses announced by streams that are no channel's.
struct OtherLosses {
    no_channel: u64,
    host: u64,
}

/// The no-channel stream's count (`user/user_no_channel`, if the sidecar
/// says it was written) and the host trace's (`DIR/host/`, if present).
fn other_losses(dir: &Path, sidecar: &Sidecar, classes: &EventClasses) -> Result<OtherLosses> {
    let no_channel = match sidecar.no_channel_stream {
        Some(_) => {
            let file = StreamFile {
                rel: format!("{}/{NO_CHANNEL_FILE}", stream_dir(abi::IVT_STREAM_USER)),
                chan: sidecar
                    .region
                    .get("nr_channels")
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0) as u32,
            };
            let mut none = Counts(vec![0; abi::IVT_EVENT_IDS_MAX as usize]);
            walk_channel(dir, file, classes, &mut none)?.discarded
        }
        None => 0,
    };
    let host_dir = dir.join("host");
    let host = match host_dir.is_dir() {
        true => ivtrace_ctf::host_trace::trace_discarded(&host_dir)
            .with_context(|| format!("cannot read the host trace {}", host_dir.display()))?,
        false => 0,
    };
    Ok(OtherLosses { no_channel, host })
}

fn event_types(
    classes: &EventClasses,
    counts: &[Counts; abi::IVT_STREAM_CLASSES as usize],
) -> Vec<EventTypeReport> {
    let mut out = Vec::new();
    for stream in 0..abi::IVT_STREAM_CLASSES {
        for class in classes.stream(stream).iter() {
            out.push(EventTypeReport {
                stream_class: stream,
                id: class.id,
                name: class.name.clone(),
                count: counts[stream as usize].0[class.id as usize],
            });
        }
    }
    out
}

fn print_table(r: &Report, out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "trace {}: {} events over {:.6} s ({}events/s), {:.1} B/event, {:.2} header B/event",
        Shown(&r.trace_uuid),
        r.events,
        r.span_s,
        si(r.events_per_s),
        r.bytes_per_event,
        r.header_bytes_per_event
    )?;
    if let (Some(a), Some(b)) = (r.first_realtime_ns, r.last_realtime_ns) {
        writeln!(out, "time span (realtime ns since epoch): {a} .. {b}")?;
    }
    let c = &r.clock;
    writeln!(
        out,
        "clock: {} ({} Hz, {} samples), host-time error <= {} ns{}",
        Shown(&c.method),
        c.freq_hz,
        c.samples,
        c.error_ns,
        if c.coarse {
            " (coarse: a guess, not a measurement)"
        } else {
            ""
        }
    )?;
    if let Some(e) = &r.clock_exchange {
        writeln!(out, "{}", Shown(&e.describe()))?;
    }
    for line in r
        .self_check
        .iter()
        .flat_map(ivtrace_vmview::selfcheck::describe)
    {
        writeln!(out, "{line}")?;
    }
    print_losses(r, out)?;
    writeln!(out, "stopped: {}", Shown(&r.stop_reason))?;
    for note in &r.notes {
        writeln!(out, "note: {}", Shown(note))?;
    }
    writeln!(
        out,
        "\n  {:<8} {:>4} {:<32} {:>12}",
        "stream", "id", "event", "count"
    )?;
    for e in &r.event_types {
        writeln!(
            out,
            "  {:<8} {:>4} {:<32} {:>12}",
            stream_label(e.stream_class),
            e.id,
            Shown(&e.name).to_string(),
            e.count
        )?;
    }
    writeln!(
        out,
        "\n  {:<20} {:>12} {:>8} {:>10} {:>14} {:>8}",
        "channel", "events", "packets", "discarded", "rate", "B/ev"
    )?;
    for c in &r.channels {
        writeln!(
            out,
            "  {:<20} {:>12} {:>8} {:>10} {:>10}ev/s {:>8.1}",
            Shown(&c.file).to_string(),
            c.events,
            c.packets,
            c.discarded,
            si(c.events_per_s),
            c.bytes_per_event
        )?;
    }
    Ok(())
}

/// The stream column of the table: the ftrace streams are in the kernel
/// trace, but their own stream class.
fn stream_label(stream: u32) -> &'static str {
    if stream == abi::IVT_STREAM_FTRACE {
        "ftrace"
    } else {
        stream_dir(stream)
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The VM view's part of the table: per vCPU, the guest threads that lost
/// the most, the host tasks that ran meanwhile, exits, hypercalls.
fn print_vm_view(v: &VmReport, out: &mut impl Write) -> io::Result<()> {
    let s = &v.summary;
    writeln!(out, "\nVM view ({}): {} events", Shown(&v.dir), v.events)?;
    writeln!(
        out,
        "  {:<6} {:>14} {:>8} {:>12} {:>12} {:>14} {:>7}",
        "vCPU", "preempted ms", "count", "longest ms", "blocked ms", "hypervisor ms", "exits"
    )?;
    for c in &s.vcpus {
        writeln!(
            out,
            "  {:<6} {:>14.3} {:>8} {:>12.3} {:>12.3} {:>14.3} {:>7}",
            c.vcpu,
            ms(c.preempted_ns),
            c.preempted_count,
            ms(c.preempted_longest_ns),
            ms(c.blocked_ns),
            ms(c.hypervisor_ns),
            c.exits
        )?;
    }
    writeln!(out, "  guest threads that lost the most time to the host:")?;
    for t in &s.guest_threads {
        writeln!(
            out,
            "    {:<16} tid {:<7} {:>12.3} ms preempted ({} times), {:.3} ms in the hypervisor",
            Shown(&t.comm).to_string(),
            t.tid,
            ms(t.preempted_ns),
            t.preempted_count,
            ms(t.hypervisor_ns)
        )?;
    }
    print_host_tasks(s, out)?;
    for c in s.vcpus.iter().filter(|c| c.untraced_count > 0) {
        writeln!(
            out,
            "  vCPU {}: {} waits whose end the host kernel did not trace: at most {:.3} ms more preempted",
            c.vcpu,
            c.untraced_count,
            ms(c.untraced_max_ns)
        )?;
    }
    for e in &s.exits {
        writeln!(
            out,
            "  exit {:<20} {:>9} exits {:>12.3} ms total {:>9.3} us mean",
            Shown(&e.name).to_string(),
            e.count,
            ms(e.total_ns),
            e.mean_ns as f64 / 1e3
        )?;
    }
    let h = &s.hypercalls;
    if h.count > 0 {
        writeln!(
            out,
            "  hypercalls: {} ({} without entry), exit overhead {:.3} us mean, {:.3} us max",
            h.count,
            h.incomplete,
            (h.exit_overhead_total_ns as f64 / 1e3)
                / h.count.saturating_sub(h.incomplete).max(1) as f64,
            h.exit_overhead_max_ns as f64 / 1e3
        )?;
    }
    for e in &v.errors {
        writeln!(out, "  warning: {}", Shown(e))?;
    }
    Ok(())
}

/// The host tasks that ran while a vCPU thread waited, most time first.
fn print_host_tasks(s: &ivtrace_vmview::stats::Summary, out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "  host tasks that ran on a CPU a vCPU thread waited for:"
    )?;
    for t in &s.host_tasks {
        writeln!(
            out,
            "    {:<16} tid {:<7} {:>12.3} ms (took the CPU {} times)",
            Shown(&t.comm).to_string(),
            t.tid,
            ms(t.ns),
            t.took_cpu
        )?;
    }
    if s.host_tasks.iter().any(|t| t.tid == NOT_TRACED.tid) {
        writeln!(
            out,
            "    ({}: host tasks that handed the CPU among themselves meanwhile; the host \
             trace keeps only the vCPU threads' switches)",
            comm_str(&NOT_TRACED.comm)
        )?;
    }
    Ok(())
}

/// The loss line: what CTF readers are told, by reason; a warning when
/// the two differ (a count past what CTF readers accept was clamped).
fn print_losses(r: &Report, out: &mut impl Write) -> io::Result<()> {
    let l = &r.lost_by_reason;
    let host = r.host_lost.as_ref().map_or(String::new(), |h| {
        format!(
            "; host trace: missed={} (+{} pages without a count)",
            h.missed, h.missed_uncounted_pages
        )
    });
    writeln!(
        out,
        "lost events: {} in CTF (events_discarded), {} recorded; by reason: full={} too_big={} \
         nested={} overwritten={} torn={} corrupt={} over_limit={} unattributed={}; \
         no_channel={}; ftrace={}{host}",
        r.discarded,
        r.lost_total,
        l.full,
        l.too_big,
        l.nested,
        l.overwritten,
        l.torn,
        l.corrupt,
        l.over_limit,
        l.unattributed,
        r.lost_no_channel,
        r.lost_ftrace
    )?;
    if r.discarded != r.lost_total {
        eprintln!(
            "ivtrace: warning: the traces announce {} discarded events but {} losses were \
             recorded (see the sidecar's warnings: a count past what CTF readers accept is \
             clamped)",
            r.discarded, r.lost_total
        );
    }
    Ok(())
}

/// Runs `ivtrace report`. Returns the events found plus those the trace
/// says were lost (0: an empty trace).
pub fn run(args: &ReportArgs) -> Result<u64> {
    let r = build(&args.dir)?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if args.json {
        crate::json_out::write_pretty(&mut out, &r)?;
    } else {
        print_table(&r, &mut out)?;
        if let Some(v) = &r.vm_view {
            print_vm_view(v, &mut out)?;
        }
    }
    Ok(r.events.saturating_add(r.discarded))
}
