//! What every front end shares around a recording: preparing the output
//! directory, the names and `env` of its traces, and turning the reader's
//! counters into the sidecar.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::json;
use thiserror::Error;

use ivtrace_ctf::dir::DirError;
use ivtrace_ctf::outdir::{OutDir, OutputPolicy};
use ivtrace_ctf::sidecar::{
    ChannelSummary, Clamped, EnvRecord, Lost, RecordedFormats, Sidecar, StreamLayout,
    SIDECAR_FORMAT, STATE_FINALIZED,
};
use ivtrace_ctf::streams::Limits;
use ivtrace_ctf::trace::{stream_dir, Progress};
use ivtrace_ctf::{ClockMapping, CtfWriter, EnvValue, TraceEnv};
use ivtrace_region::meta::MetaStats;
use ivtrace_region::{abi, sanitize, Access, Reader, Region};

use crate::error::EngineError;

/// Entries of an output directory that the engine writes besides the
/// traces (ivtrace-ctf's `dir` knows those); --force removes them too.
const ENGINE_ENTRIES: &[&str] = &[
    ivtrace_ctf::dir::HANDOFF_NAME,
    ivtrace_ctf::dir::NESTED_DIR,
    // `ivtrace boot`'s chart (ivtrace-boot's CHART_SVG, CHART_PNG).
    "boot.svg",
    "boot.png",
];

/// A problem the user can fix, with a hint how.
#[derive(Debug, Error)]
#[error("{message}")]
pub struct UserError {
    pub message: String,
    pub hint: String,
}

pub use ivtrace_ctf::dir::open_root;

/// Opens the output directory `dir` for a new recording (ivtrace-ctf's
/// `dir::prepare`, with the engine's own entries).
pub fn prepare_output(dir: &Path, force: bool, policy: &OutputPolicy) -> Result<OutDir, DirError> {
    ivtrace_ctf::dir::prepare(dir, force, policy, ENGINE_ENTRIES)
}

/// This host's name (`/proc/sys/kernel/hostname`, else `localhost`), as
/// it is: callers sanitize it where it becomes a name.
pub fn this_host() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".into(), |s| s.trim().to_string())
}

/// The host-name sanitizer is ivtrace-region's (one definition); this name
/// stays for the callers that still import it from here.
pub use ivtrace_region::sanitize::host_name as sanitize_host_name;

/// The name the traces of `region` carry as `hostname`: `name` (the user's
/// `--name`) if given, else this host's name for a loopback region, else
/// the region file's stem (`/dev/shm/guest0` -> `guest0`): the region
/// does not name its guest. Always sanitized.
pub fn host_name(region: &Region, shm: &Path, name: Option<&str>) -> String {
    let chosen = match name {
        Some(n) => n.to_string(),
        None if region.header().is_loopback() => this_host(),
        None => shm
            .file_stem()
            .map_or_else(|| "guest".into(), |s| s.to_string_lossy().into_owned()),
    };
    sanitize::host_name_or(&chosen, "guest")
}

/// `hostname` when nothing names the region: this host (loopback) or
/// `guest-<uuid prefix>`.
fn default_host_name(region: &Region) -> String {
    let h = region.header();
    if h.is_loopback() {
        sanitize_host_name(&this_host())
    } else {
        format!("guest-{}", &h.uuid_string()[..8])
    }
}

/// The `env` block of the traces written from `region`, named by
/// `default_host_name`; see [`trace_env_named`].
pub fn trace_env(region: &Region, out: &Path, clock: &ClockMapping) -> TraceEnv {
    trace_env_named(region, out, clock, &default_host_name(region))
}

/// The `env` block of the traces written from `region`; `host` is its
/// `hostname` ([`host_name`]).
pub fn trace_env_named(region: &Region, out: &Path, clock: &ClockMapping, host: &str) -> TraceEnv {
    let h = region.header();
    let trace_name = out
        .file_name()
        .map_or_else(|| "ivtrace".into(), |n| n.to_string_lossy().into_owned());
    let host = host.to_string();
    let version: Vec<i64> = env!("CARGO_PKG_VERSION")
        .split('.')
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    let (offset_s, offset) = clock.ctf_offset();
    if !clock.offset_fits_cycles() {
        eprintln!(
            "ivtrace: warning: {}: the clock's offset from the epoch does not fit int64 cycles \
             at {} Hz, so the CTF clock keeps it in offset_s: babeltrace and Trace Compass >= 6.3 \
             show the right dates, Trace Compass < 6.3 shows 1970",
            out.display(),
            clock.freq_hz
        );
    }
    let extra = vec![
        (
            "ivtrace_clock_method".into(),
            EnvValue::Str(clock.method.clone()),
        ),
        (
            "ivtrace_clock_freq_hz".into(),
            EnvValue::Int(clock.freq_hz as i64),
        ),
        (
            "ivtrace_clock_error_ns".into(),
            EnvValue::Int(clock.error_ns.min(i64::MAX as u64) as i64),
        ),
        (
            "ivtrace_clock_coarse".into(),
            EnvValue::Int(clock.coarse as i64),
        ),
        ("ivtrace_clock_offset_s".into(), EnvValue::Int(offset_s)),
        (
            "ivtrace_clock_offset_cycles".into(),
            EnvValue::Int(offset as i64),
        ),
        (
            "ivtrace_region_features".into(),
            EnvValue::Int(h.features as i64),
        ),
    ];
    TraceEnv {
        hostname: host,
        trace_name,
        creation_datetime: ivtrace_ctf::tsdl::creation_datetime(SystemTime::now()),
        tracer_major: version.first().copied().unwrap_or(0),
        tracer_minor: version.get(1).copied().unwrap_or(0),
        extra,
    }
}

/// A fresh writer for `region` into `out` (default `hostname`).
pub fn ctf_writer(region: &Region, out: &OutDir, clock: &ClockMapping) -> CtfWriter {
    ctf_writer_named(
        region,
        out,
        clock,
        &default_host_name(region),
        Limits::default(),
        "record",
    )
}

/// A fresh writer for `region` into `out` whose traces name `host`,
/// within `limits`; `mode` (record, serve) goes into the sidecar it
/// writes while recording.
pub fn ctf_writer_named(
    region: &Region,
    out: &OutDir,
    clock: &ClockMapping,
    host: &str,
    limits: Limits,
    mode: &str,
) -> CtfWriter {
    ctf_writer_part(region, out, clock, host, limits, mode, 0)
}

/// A fresh writer for part `part` of `region`'s trace (a guest that
/// migrated: ivtrace-migration); part 0 is [`ctf_writer_named`].
pub fn ctf_writer_part(
    region: &Region,
    out: &OutDir,
    clock: &ClockMapping,
    host: &str,
    limits: Limits,
    mode: &str,
    part: u32,
) -> CtfWriter {
    let env = trace_env_named(region, out.path(), clock, host);
    let mut w = CtfWriter::new(
        out.clone(),
        ivtrace_region::reader::part_uuid(region.header().uuid, part),
        clock.clone(),
        env,
        region.layout().nr_channels,
        limits,
    );
    // The ftrace relay's pages, if any, are decoded with the guest's
    // formats (ivtrace-tracefs's relay) when the writer finishes.
    w.set_ftrace_expander(Box::new(ivtrace_tracefs::ftrace_relay::RelayExpander));
    w.set_progress(Progress::Sidecar {
        mode: mode.into(),
        region: region_section(region, &out.path().display().to_string()),
    });
    w
}

/// The sidecar's `region` section.
fn region_section(region: &Region, path: &str) -> BTreeMap<String, serde_json::Value> {
    let h = region.header();
    let l = h.layout;
    let v = json!({
        "path": path,
        "size": h.region_size,
        "abi": format!("{}.{}", h.abi_major, h.abi_minor),
        "features": h.features,
        "loopback": h.is_loopback(),
        "default_mode": if h.default_mode == abi::IVT_MODE_OVERWRITE { "overwrite" } else { "discard" },
        "nr_channels": l.nr_channels,
        "nr_kernel_channels": l.nr_kernel_channels,
        "nr_ftrace_channels": l.nr_ftrace_channels,
        "nr_subbufs": l.nr_subbufs,
        "subbuf_size": l.subbuf_size,
        "owner_pid": h.owner_pid,
    });
    serde_json::from_value(v).expect("an object")
}

/// Counters of one channel, as the sidecar stores them.
fn channel_summary(reader: &Reader, writer: &CtfWriter, c: u32) -> ChannelSummary {
    let s = reader.channel_stats(c);
    // Staged kernel packets the expansion could not walk count as corrupt:
    // their events are in the kernel stream's events_discarded too.
    let unexpanded = writer
        .kernel_expansion()
        .and_then(|k| k.lost_by_channel.get(&c).copied())
        .unwrap_or(0);
    let lost = Lost {
        full: s.writer_lost.full,
        too_big: s.writer_lost.too_big,
        nested: s.writer_lost.nested,
        overwritten: s.host_lost.overwritten,
        torn: s.host_lost.torn,
        corrupt: s.host_lost.corrupt.saturating_add(unexpanded),
        over_limit: s.host_lost.over_limit,
        unattributed: s.host_lost.earlier_run,
    };
    ChannelSummary {
        channel: c,
        stream_class: reader.region().layout().stream_of(c),
        file: writer.file_of(c),
        events: s.events.saturating_sub(unexpanded),
        packets: s.packets,
        partial_packets: s.partial_packets,
        bytes: s.bytes_out,
        event_bytes: s.event_bytes,
        header_bytes: s.header_bytes,
        lost,
        skipped_packets: s.skipped.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        utf8_fixed: s.utf8_fixed,
        older_overwritten: s.older_overwritten,
        first_ts: s.first_ts,
        last_ts: (s.events > 0).then_some(s.last_ts),
        ts_clamped: s.ts_clamped,
        retimed_slow: s.retimed_slow,
    }
}

fn meta_counters(m: &MetaStats) -> BTreeMap<String, u64> {
    [
        ("event_classes", m.classes),
        ("invalid_records", m.invalid),
        ("duplicate_ids", m.duplicates),
        ("uncommitted_skipped", m.skipped_uncommitted),
        ("renamed", m.renamed),
        ("unknown_kinds", m.unknown_kind),
        ("ftrace_files", m.ftrace_files),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Everything about a finished run, for the sidecar and the summary.
pub fn build_sidecar(
    reader: &Reader,
    writer: &CtfWriter,
    shm: &Path,
    mode: &str,
    clock: &ClockMapping,
    elapsed: Duration,
    stop_reason: &str,
) -> Sidecar {
    let h = reader.region().header();
    let streams = (0..abi::IVT_STREAM_CLASSES)
        .filter(|&s| writer.has_stream(s))
        .map(|s| {
            StreamLayout::from_classes(s, stream_dir(s), writer.output_classes(s, reader.classes()))
        })
        .collect();
    let lost_no_channel = reader.lost_no_channel();
    let no_channel_stream = writer.file_of(reader.no_channel_stream());
    Sidecar {
        format: SIDECAR_FORMAT.into(),
        tracer_version: env!("CARGO_PKG_VERSION").into(),
        mode: mode.into(),
        state: STATE_FINALIZED.into(),
        trace_uuid: h.uuid_string(),
        region: region_section(reader.region(), &shm.display().to_string()),
        clock: clock.clone(),
        clock_sync: None,
        self_check: None,
        streams,
        channels: (0..reader.nr_channels())
            .map(|c| channel_summary(reader, writer, c))
            .filter(|c| c.packets > 0 || c.lost.total() > 0 || !c.skipped_packets.is_empty())
            .collect(),
        lost_no_channel,
        no_channel_stream,
        elapsed_s: elapsed.as_secs_f64(),
        stop_reason: stop_reason.into(),
        metadata: meta_counters(&reader.meta().stats),
        warnings: reader.meta().warnings.clone(),
        host_lost: None,
        kernel_expansion: writer.kernel_expansion().cloned(),
        ftrace: writer.ftrace_stats().cloned(),
        env: Some(EnvRecord::from(writer.env())),
        clamped: clamped(reader),
        resources: Some(json!({
            "stream_files": writer.stream_stats(),
            "read_buffer_bytes": reader.region().layout().subbuf_size as u64 + 8,
        })),
        relay: None,
        migration: None,
        nested: None,
        boot: None,
        tracefs_formats: RecordedFormats {
            host: None,
            guest: writer.ftrace_formats().cloned(),
        },
    }
}

/// Channels whose running loss count had to be clamped for CTF readers.
fn clamped(reader: &Reader) -> Vec<Clamped> {
    (0..reader.nr_channels())
        .filter_map(|c| {
            let value = reader.channel_stats(c).discarded_clamped?;
            Some(Clamped {
                channel: c,
                field: "events_discarded".into(),
                value,
                written: ivtrace_region::reader::CTF_DISCARDED_MAX,
            })
        })
        .collect()
}

/// Events a run saw: recorded plus lost (recorded losses are a result too:
/// a trace whose every packet was corrupt still documents what was lost).
pub fn events_seen(s: &Sidecar) -> u64 {
    s.channels.iter().fold(s.lost_no_channel, |n, c| {
        n.saturating_add(c.events).saturating_add(c.lost.total())
    })
}

/// Drains a private copy of region bytes completely into `out` (as a
/// final record would): the path the fuzzer and property tests exercise.
/// Returns the events written.
pub fn drain_bytes_to_dir(bytes: &[u8], out: &Path) -> Result<u64, EngineError> {
    let region = Region::from_bytes(bytes, Access::ReadWrite).map_err(EngineError::RegionBytes)?;
    fs::create_dir_all(out).map_err(|source| EngineError::CreateDir {
        path: out.to_path_buf(),
        source,
    })?;
    let root = open_root(out, &OutputPolicy::default())?;
    let clock = ivtrace_time::estimator::HeaderReference {
        clock: region.header().clock,
    };
    let clock = ivtrace_time::estimator::ClockEstimator::initial(&clock);
    let limits = Limits {
        reserve_bytes: 0,
        ..Limits::default()
    };
    let host = default_host_name(&region);
    let mut writer = ctf_writer_named(&region, &root, &clock, &host, limits, "record");
    let mut reader = Reader::new(region, clock.expressible());
    reader.set_user_clock(clock.ns_scale(), clock.expressible());
    reader.drain_available(&mut writer)?;
    writer.commit()?;
    reader.commit_written();
    reader.flush_partial(&mut writer)?;
    reader.finish(&mut writer)?;
    writer.finish(&clock, writer.env().clone(), reader.classes())?;
    let sidecar = build_sidecar(
        &reader,
        &writer,
        Path::new("<bytes>"),
        "record",
        &clock,
        Duration::ZERO,
        "drained",
    );
    writer.write_sidecar(&sidecar)?;
    Ok(sidecar.channels.iter().map(|c| c.events).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn force_removes_the_engines_entries_too() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(ivtrace_ctf::dir::NESTED_DIR)).unwrap();
        fs::write(dir.path().join("keep.txt"), b"x").unwrap();
        let policy = OutputPolicy::default();
        prepare_output(dir.path(), true, &policy).unwrap();
        assert!(dir.path().join("keep.txt").exists());
        assert!(!dir.path().join(ivtrace_ctf::dir::NESTED_DIR).exists());
    }
}
