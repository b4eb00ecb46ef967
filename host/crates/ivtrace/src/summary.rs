//! The end-of-run summary: per channel events, bytes, packets, losses by
//! reason, rates, bytes per event and event-header bytes per event.

use ivtrace_region::sanitize::Shown;
use std::io::{self, Write};
use std::path::Path;

use anyhow::Result;

use ivtrace_ctf::ftrace::FtraceStats;
use ivtrace_ctf::kernel::KernelExpansion;
use ivtrace_ctf::sidecar::{ChannelSummary, Lost, Sidecar};

fn per_event(bytes: u64, events: u64) -> f64 {
    if events == 0 {
        0.0
    } else {
        bytes as f64 / events as f64
    }
}

fn rate(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

/// Human-readable count with an SI suffix.
pub fn si(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{:.2} G", v / 1e9),
        v if v >= 1e6 => format!("{:.2} M", v / 1e6),
        v if v >= 1e3 => format!("{:.2} k", v / 1e3),
        v => format!("{v:.0} "),
    }
}

fn lost_line(l: &Lost, no_channel: u64) -> String {
    format!(
        "writer: full={} too_big={} nested={}; region: no_channel={}; host: overwritten={} torn={} corrupt={} over_limit={} unattributed={}",
        l.full, l.too_big, l.nested, no_channel, l.overwritten, l.torn, l.corrupt, l.over_limit, l.unattributed
    )
}

/// The sidecar's notes that need a reader's attention: counters clamped
/// for CTF readers, a recording that is not finalized.
pub fn notes(s: &Sidecar) -> Vec<String> {
    let mut notes: Vec<String> = s
        .clamped
        .iter()
        .map(|c| {
            format!(
                "chan{}: the guest's counters put {} at {}; clamped to {} (CTF readers refuse more)",
                c.channel, c.field, c.value, c.written
            )
        })
        .collect();
    if s.state != ivtrace_ctf::sidecar::STATE_FINALIZED {
        notes.push(format!("state: {} ({})", s.state, s.stop_reason));
    }
    notes
}

fn row(out: &mut impl Write, name: &str, c: &ChannelSummary, secs: f64) -> io::Result<()> {
    writeln!(
        out,
        "  {name:<10} {:>12} {:>9} {:>14} {:>10} {:>10}ev/s {:>6.1} {:>6.2}",
        c.events,
        c.packets,
        c.bytes,
        c.lost.total(),
        si(rate(c.events, secs)),
        per_event(c.event_bytes, c.events),
        per_event(c.header_bytes, c.events),
    )
}

/// Prints the summary of `s` (to stdout; JSON if asked).
pub fn print(s: &Sidecar, out_dir: &Path, json: bool) -> Result<()> {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if json {
        crate::json_out::write_pretty(&mut out, s)?;
        return Ok(());
    }
    let t = ChannelSummary::totals(&s.channels);
    print_table(&mut out, s, &t, out_dir)?;
    print_losses(&mut out, s, &t)?;
    if let Some(k) = &s.kernel_expansion {
        print_expansion(&mut out, k)?;
    }
    if let Some(f) = &s.ftrace {
        print_ftrace(&mut out, f)?;
    }
    let c = &s.clock;
    writeln!(
        out,
        "clock: {} freq {} Hz, error <= {} ns{}",
        Shown(&c.method),
        c.freq_hz,
        c.error_ns,
        if c.coarse { " (coarse)" } else { "" }
    )?;
    for w in s.warnings.iter().take(WARNINGS_SHOWN) {
        eprintln!("ivtrace: warning: {}", Shown(w));
    }
    if let Some(more) = s
        .warnings
        .len()
        .checked_sub(WARNINGS_SHOWN)
        .filter(|&n| n > 0)
    {
        eprintln!("ivtrace: warning: {more} more warnings: see `warnings` in the sidecar");
    }
    Ok(())
}

/// Warnings printed (a sidecar from elsewhere may hold any number; the
/// recorder keeps at most 64 of the region's own).
const WARNINGS_SHOWN: usize = 16;

/// The headline, then one row per channel and the totals.
fn print_table(
    out: &mut impl Write,
    s: &Sidecar,
    t: &ChannelSummary,
    out_dir: &Path,
) -> io::Result<()> {
    let secs = s.elapsed_s;
    writeln!(
        out,
        "ivtrace {}: {} events, {} bytes in {:.3} s ({}events/s, {}B/s) -> {} ({})",
        Shown(&s.mode),
        t.events,
        t.bytes,
        secs,
        si(rate(t.events, secs)),
        si(rate(t.bytes, secs)),
        Shown(&out_dir.display().to_string()),
        Shown(&s.stop_reason)
    )?;
    writeln!(
        out,
        "  {:<10} {:>12} {:>9} {:>14} {:>10} {:>14} {:>6} {:>6}",
        "channel", "events", "packets", "bytes", "lost", "rate", "B/ev", "hdrB/ev"
    )?;
    for c in &s.channels {
        let name = c
            .file
            .as_deref()
            .and_then(|f| f.rsplit('/').next())
            .map_or_else(|| format!("chan{}", c.channel), str::to_string);
        row(out, &Shown(&name).to_string(), c, secs)?;
    }
    row(out, "total", t, secs)
}

/// Losses by reason (per channel when several lost), skipped and partial
/// packets, and what a snapshot found already overwritten.
fn print_losses(out: &mut impl Write, s: &Sidecar, t: &ChannelSummary) -> io::Result<()> {
    writeln!(
        out,
        "lost events: {}",
        lost_line(&t.lost, s.lost_no_channel)
    )?;
    let several = s.channels.len() > 1;
    for c in s.channels.iter().filter(|c| several && c.lost.total() > 0) {
        let l = &c.lost;
        writeln!(
            out,
            "  chan{}: full={} too_big={} nested={} overwritten={} torn={} corrupt={} over_limit={} unattributed={}",
            c.channel, l.full, l.too_big, l.nested, l.overwritten, l.torn, l.corrupt, l.over_limit, l.unattributed
        )?;
    }
    for note in notes(s) {
        writeln!(out, "note: {}", Shown(&note))?;
    }
    if !t.skipped_packets.is_empty() {
        writeln!(out, "skipped packets: {:?}", t.skipped_packets)?;
    }
    if t.partial_packets > 0 {
        writeln!(out, "partial packets flushed: {}", t.partial_packets)?;
    }
    if s.mode == "snapshot" {
        writeln!(
            out,
            "older events already overwritten: {}",
            t.older_overwritten
        )?;
    }
    Ok(())
}

/// The ftrace relay's pages, decoded: per CPU what ftrace produced, what
/// the trace holds and what was lost (docs/ftrace.md "Losses").
fn print_ftrace(out: &mut impl Write, f: &FtraceStats) -> io::Result<()> {
    writeln!(
        out,
        "ftrace relay: {} formats, {} event classes, decoded in {:.3} s",
        f.formats, f.classes, f.seconds
    )?;
    for c in &f.cpus {
        writeln!(
            out,
            "  cpu{:<3} {:>10} recorded {:>10} lost (overrun {}, dropped {}, clock reset {},              read elsewhere {}) of {} produced{}",
            c.cpu,
            c.recorded,
            c.lost,
            c.overrun,
            c.dropped.saturating_add(c.commit_overrun),
            c.clock_reset,
            c.read_not_recorded,
            c.produced,
            match (c.no_stats, c.entries) {
                (true, _) => " (no counters: pages only)".to_string(),
                (false, 0) => String::new(),
                (false, n) => format!(", {n} still in ftrace's buffer after the relay's last read"),
            }
        )?;
        if c.unknown_type > 0 || c.bad_pages > 0 || c.ts_clamped > 0 {
            eprintln!(
                "ivtrace: warning: ftrace cpu{}: {} records of no published format, {} pages                  that did not walk, {} timestamps clamped",
                c.cpu, c.unknown_type, c.bad_pages, c.ts_clamped
            );
        }
        if c.lost_clamped {
            eprintln!(
                "ivtrace: warning: ftrace cpu{}: the guest's counters put its losses at {}; \
                 the trace says {} (CTF readers refuse more)",
                c.cpu,
                c.lost,
                i64::MAX
            );
        }
    }
    Ok(())
}

/// What the kernel stream's expansion did (a warning if it had to drop).
fn print_expansion(out: &mut impl Write, k: &KernelExpansion) -> io::Result<()> {
    writeln!(
        out,
        "kernel stream expanded to LTTng's layout: {} events in {:.3} s ({}events/s), \
         {} threads named ({} name fields empty), {} irqs named, {} syscall classes",
        k.events,
        k.seconds,
        si(k.events_per_s),
        k.threads,
        k.comm_unknown,
        k.irqs_named,
        k.syscall_classes
    )?;
    if k.names_dropped > 0 || k.packets_skipped > 0 {
        eprintln!(
            "ivtrace: warning: kernel expansion: {} thread-name changes past the table's \
             limit ignored, {} staged packets skipped (their {} events are counted as \
             corrupt and announced as discarded)",
            k.names_dropped, k.packets_skipped, k.events_lost
        );
    }
    Ok(())
}

/// What the VM view found (stderr, after the host events' line).
/// The self-check's lines on stderr.
pub fn print_self_check(c: &ivtrace_vmview::selfcheck::SelfCheck) {
    for line in ivtrace_vmview::selfcheck::describe(c) {
        eprintln!("ivtrace: {line}");
    }
}

pub fn print_vm_view(d: &ivtrace_vmview::derive::Derived) {
    let Some(dir) = &d.dir else {
        eprintln!(
            "ivtrace: vm view: nothing derived ({} host events read, vCPU threads: {})",
            d.host_records, d.vcpu_source
        );
        return;
    };
    eprintln!(
        "ivtrace: vm view: {} intervals, {} hypercalls, {} vmsync events (vCPU threads: {}) -> {}",
        d.intervals,
        d.hypercalls,
        d.vmsync,
        d.vcpu_source,
        dir.display()
    );
    for line in ivtrace_vmview::derive::describe(d) {
        eprintln!("ivtrace:   {line}");
    }
    let c = &d.counters;
    if c.inconsistent + c.exits_without_entry + c.entries_without_exit > 0 {
        eprintln!(
            "ivtrace:   host events that did not add up (lost by tracefs?): {} transitions, \
             {} exits without entry, {} entries without exit",
            c.inconsistent, c.exits_without_entry, c.entries_without_exit
        );
    }
    for e in &d.read_errors {
        eprintln!("ivtrace: warning: vm view: {e}");
    }
}
