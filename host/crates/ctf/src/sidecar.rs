//! `DIR/ivtrace.json`: the machine-readable summary of a recording and the
//! event layouts, so `ivtrace report` can walk the stream files without
//! babeltrace2. It sits at the output root, outside the trace
//! directories, where CTF readers do not look. The kernel stream's layouts
//! are the expanded ones the kernel trace declares (see [`crate::kernel`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use ivtrace_region::classes::{EventClass, EventClasses, Field, FieldType, StreamClasses};

use ivtrace_time::ClockMapping;

use crate::tsdl::{EnvValue, TraceEnv};

/// File name of the sidecar at the output root.
pub const SIDECAR_NAME: &str = "ivtrace.json";
/// Largest sidecar read back (`report`, `recover`, `--resume`): every
/// class the ABI allows (4 stream classes x 4096 ids x 32 fields, some 80
/// bytes a field pretty-printed: about 42 MiB) and 4096 channels' counts
/// stay below it; a larger file is refused, not read.
pub const SIDECAR_MAX_BYTES: u64 = 64 << 20;
/// Value of [`Sidecar::format`].
pub const SIDECAR_FORMAT: &str = "ivtrace-sidecar/1";
/// [`Sidecar::state`] while the recorder runs (or if it died).
pub const STATE_RECORDING: &str = "recording";
/// [`Sidecar::state`] of a trace its recorder finished.
pub const STATE_FINALIZED: &str = "finalized";
/// [`Sidecar::state`] of a trace `ivtrace recover` finished.
pub const STATE_RECOVERED: &str = "recovered";
/// [`Sidecar::state`] of a trace whose output failed (a full disk): it
/// holds whole packets up to the failure and its kernel stream is still
/// staged; `ivtrace record --resume` goes on, `ivtrace recover` finishes.
pub const STATE_INCOMPLETE: &str = "incomplete";

/// One payload field as the sidecar stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldLayout {
    pub name: String,
    /// `u8`..`s64`, `string`, `bytes`, `chars[N]`.
    #[serde(rename = "type")]
    pub ty: String,
    #[serde(default)]
    pub hex: bool,
    /// `IVT_FF_TID_COMM` (kernel wire classes, for `ivtrace recover`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tid_comm: bool,
}

/// One event class as the sidecar stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLayout {
    pub id: u32,
    pub name: String,
    pub fields: Vec<FieldLayout>,
}

/// One stream class (one CTF trace directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamLayout {
    pub stream_class: u32,
    /// Directory relative to the output root ("user", "kernel").
    pub dir: String,
    pub event_classes: Vec<EventLayout>,
}

/// Events lost on one channel, by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Writer: ring full (discard mode).
    pub full: u64,
    /// Writer: event larger than a packet.
    pub too_big: u64,
    /// Writer: re-entered (signal handler, NMI).
    pub nested: u64,
    /// Host: the writer lapped the reader (overwrite mode).
    pub overwritten: u64,
    /// Host: the copy was overwritten while taken.
    pub torn: u64,
    /// Host: the packet failed validation.
    pub corrupt: u64,
    /// Host: the recording's output size limit was reached.
    #[serde(default)]
    pub over_limit: u64,
    /// Counted by CTF's `events_discarded` but by no reason the host
    /// still knows (a recording finished by `ivtrace recover`).
    #[serde(default)]
    pub unattributed: u64,
}

impl Lost {
    /// Saturating: writer counters are guest-written and may be anything.
    pub fn total(&self) -> u64 {
        [
            self.full,
            self.too_big,
            self.nested,
            self.overwritten,
            self.torn,
            self.corrupt,
            self.over_limit,
            self.unattributed,
        ]
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b))
    }

    /// Saturating, as [`Lost::total`].
    pub fn add(&mut self, o: &Lost) {
        self.full = self.full.saturating_add(o.full);
        self.too_big = self.too_big.saturating_add(o.too_big);
        self.nested = self.nested.saturating_add(o.nested);
        self.overwritten = self.overwritten.saturating_add(o.overwritten);
        self.torn = self.torn.saturating_add(o.torn);
        self.corrupt = self.corrupt.saturating_add(o.corrupt);
        self.over_limit = self.over_limit.saturating_add(o.over_limit);
        self.unattributed = self.unattributed.saturating_add(o.unattributed);
    }
}

/// One channel's results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelSummary {
    pub channel: u32,
    pub stream_class: u32,
    /// Stream file relative to the output root, if anything was written.
    pub file: Option<String>,
    pub events: u64,
    pub packets: u64,
    pub partial_packets: u64,
    /// Bytes written to the stream file.
    pub bytes: u64,
    /// Bytes of events (headers, payloads, alignment).
    pub event_bytes: u64,
    /// Bytes of event headers.
    pub header_bytes: u64,
    pub lost: Lost,
    /// Skipped packets by reason.
    pub skipped_packets: BTreeMap<String, u64>,
    pub utf8_fixed: u64,
    /// Snapshot: events committed before the oldest packet kept.
    pub older_overwritten: u64,
    /// The first and last event's times: in the guest's ticks as the
    /// drain saw them; `ivtrace recover` reads them from the stream files,
    /// whose user times are nanoseconds.
    pub first_ts: Option<u64>,
    pub last_ts: Option<u64>,
    /// User streams: times written as the stream's previous one so it
    /// never goes back across a change of the mapping in force
    /// (docs/ctf.md "Time").
    #[serde(default)]
    pub ts_clamped: u64,
    /// User streams: packets written afresh because a compact header could
    /// not hold its time in nanoseconds.
    #[serde(default)]
    pub retimed_slow: u64,
}

/// The trace's `env` block, as the sidecar keeps it (`ivtrace recover`
/// writes the kernel trace's metadata from it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvRecord {
    pub hostname: String,
    pub trace_name: String,
    pub creation_datetime: String,
    pub tracer_major: i64,
    pub tracer_minor: i64,
    /// Extra keys: strings as JSON strings, integers as numbers.
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl ChannelSummary {
    /// Totals over all channels.
    pub fn totals(channels: &[ChannelSummary]) -> ChannelSummary {
        let mut t = ChannelSummary::default();
        for c in channels {
            t.events += c.events;
            t.packets += c.packets;
            t.partial_packets += c.partial_packets;
            t.bytes += c.bytes;
            t.event_bytes += c.event_bytes;
            t.header_bytes += c.header_bytes;
            t.lost.add(&c.lost);
            t.utf8_fixed += c.utf8_fixed;
            t.ts_clamped = t.ts_clamped.saturating_add(c.ts_clamped);
            t.retimed_slow = t.retimed_slow.saturating_add(c.retimed_slow);
            t.older_overwritten = t.older_overwritten.saturating_add(c.older_overwritten);
            for (k, v) in &c.skipped_packets {
                let n = t.skipped_packets.entry(k.clone()).or_default();
                *n = n.saturating_add(*v);
            }
        }
        t
    }
}

impl From<&TraceEnv> for EnvRecord {
    fn from(e: &TraceEnv) -> EnvRecord {
        EnvRecord {
            hostname: e.hostname.clone(),
            trace_name: e.trace_name.clone(),
            creation_datetime: e.creation_datetime.clone(),
            tracer_major: e.tracer_major,
            tracer_minor: e.tracer_minor,
            extra: e
                .extra
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        EnvValue::Str(s) => serde_json::Value::from(s.clone()),
                        EnvValue::Int(i) => serde_json::Value::from(*i),
                    };
                    (k.clone(), v)
                })
                .collect(),
        }
    }
}

impl EnvRecord {
    pub fn to_env(&self) -> TraceEnv {
        let extra = self
            .extra
            .iter()
            .filter_map(|(k, v)| {
                let v = match v {
                    serde_json::Value::String(s) => EnvValue::Str(s.clone()),
                    v => EnvValue::Int(v.as_i64()?),
                };
                Some((k.clone(), v))
            })
            .collect();
        TraceEnv {
            hostname: self.hostname.clone(),
            trace_name: self.trace_name.clone(),
            creation_datetime: self.creation_datetime.clone(),
            tracer_major: self.tracer_major,
            tracer_minor: self.tracer_minor,
            extra,
        }
    }
}

/// The host trace's losses (`DIR/host/`, host events from tracefs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostLost {
    /// Events the host kernel's ring buffer dropped, by its pages' counts:
    /// the host trace's streams carry them as discarded events.
    pub missed: u64,
    /// Pages that said events were dropped before them without saying how
    /// many (reported; no count a CTF reader could be given).
    pub missed_uncounted_pages: u64,
}

/// Linux tracefs format files as tracefs gave them (`events/header_page`,
/// `events/<system>/<event>/format`): what a trace's events were decoded
/// with, so an export can write the kernel's own record layouts again
/// (`ivtrace export --format trace-cmd`, docs/trace-cmd.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracefsFormats {
    #[serde(default)]
    pub header_page: String,
    /// Format file text by `system/event`.
    #[serde(default)]
    pub events: BTreeMap<String, String>,
}

impl TracefsFormats {
    pub fn is_empty(&self) -> bool {
        self.header_page.is_empty() && self.events.is_empty()
    }
}

/// The format files a recording's tracefs events were decoded with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedFormats {
    /// The host kernel's, of the host events (`DIR/host/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<TracefsFormats>,
    /// The guest's, of the relayed ftrace events that occurred
    /// (`DIR/kernel/`, stream class 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<TracefsFormats>,
}

impl RecordedFormats {
    pub fn is_empty(&self) -> bool {
        self.host.is_none() && self.guest.is_none()
    }
}

/// The whole sidecar.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sidecar {
    pub format: String,
    pub tracer_version: String,
    /// "record", "serve" or "snapshot".
    pub mode: String,
    /// [`STATE_RECORDING`], [`STATE_FINALIZED`] or [`STATE_RECOVERED`]
    /// (older sidecars have none: finalized).
    #[serde(default = "finalized")]
    pub state: String,
    pub trace_uuid: String,
    pub region: BTreeMap<String, serde_json::Value>,
    pub clock: ClockMapping,
    /// How `clock` was measured (the clock exchange's points and their
    /// bounds, KVM's parameters), when it was measured while recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_sync: Option<serde_json::Value>,
    /// The clock mapping checked on cause -> effect pairs of the guest and
    /// host traces (recordings with host events; ivtrace-vmview's
    /// `selfcheck`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_check: Option<serde_json::Value>,
    pub streams: Vec<StreamLayout>,
    pub channels: Vec<ChannelSummary>,
    /// Events dropped because no channel was free (region-wide).
    pub lost_no_channel: u64,
    /// The user trace's stream whose discarded events they are
    /// (`user/user_no_channel`), once it was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_channel_stream: Option<String>,
    pub elapsed_s: f64,
    pub stop_reason: String,
    pub metadata: BTreeMap<String, u64>,
    pub warnings: Vec<String>,
    /// What the host trace (`DIR/host/`) lost, if the recording had host
    /// events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_lost: Option<HostLost>,
    /// The kernel stream's expansion to LTTng's layout, if it had packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_expansion: Option<crate::kernel::KernelExpansion>,
    /// The ftrace relay's pages decoded (docs/ftrace.md), if it had any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ftrace: Option<crate::ftrace::FtraceStats>,
    /// The traces' env block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvRecord>,
    /// Guest-written counters the host had to clamp so that CTF readers
    /// accept the trace (see docs/hardening.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clamped: Vec<Clamped>,
    /// What the recording cost (descriptors, buffers, the size limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<serde_json::Value>,
    /// What went to a relay daemon (`--relayd`): the session, per stream the
    /// packets sent and the events lost on the way (ivtrace-relayd's
    /// `SessionStats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<serde_json::Value>,
    /// A guest that migrated: which part of its trace this is, where it
    /// resumed from and where it handed off (docs/migration.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<serde_json::Value>,
    /// Nested tracing (docs/migration.md): what this recording forwarded
    /// (`forwarded`) and the guests forwarded through it (`guests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested: Option<serde_json::Value>,
    /// The boot analysis' derived streams (ivtrace-boot's `Derived`: the
    /// phases, initcalls and function profile written into the kernel
    /// trace, and their sizes; docs/boot.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<serde_json::Value>,
    /// The tracefs format files of the host events and of the relayed
    /// ftrace events.
    #[serde(default, skip_serializing_if = "RecordedFormats::is_empty")]
    pub tracefs_formats: RecordedFormats,
}

/// The sidecar key of [`Sidecar::tracefs_formats`] (layouts, not a
/// summary: left out of the summary lines `serve --json` prints).
pub const TRACEFS_FORMATS_KEY: &str = "tracefs_formats";

fn finalized() -> String {
    STATE_FINALIZED.into()
}

/// A guest-written counter that was clamped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clamped {
    pub channel: u32,
    /// What was clamped (`events_discarded`).
    pub field: String,
    /// The value the guest's counters gave.
    pub value: u64,
    /// The value written.
    pub written: u64,
}

impl EventLayout {
    pub fn from_class(c: &EventClass) -> EventLayout {
        EventLayout {
            id: c.id,
            name: c.name.clone(),
            fields: c
                .fields
                .iter()
                .map(|f| FieldLayout {
                    name: f.name.clone(),
                    ty: f.ty.name(),
                    hex: f.hex,
                    tid_comm: f.tid_comm,
                })
                .collect(),
        }
    }

    /// Back to an event class; None if a type is unknown.
    pub fn to_class(&self, stream: u32) -> Option<EventClass> {
        let fields = self
            .fields
            .iter()
            .map(|f| {
                let mut field = Field::new(f.name.clone(), FieldType::parse(&f.ty)?, f.hex);
                field.tid_comm = f.tid_comm;
                Some(field)
            })
            .collect::<Option<Vec<_>>>()?;
        Some(EventClass::new(self.id, stream, self.name.clone(), fields))
    }
}

impl StreamLayout {
    pub fn from_classes(stream_class: u32, dir: &str, classes: &StreamClasses) -> StreamLayout {
        StreamLayout {
            stream_class,
            dir: dir.to_string(),
            event_classes: classes.iter().map(EventLayout::from_class).collect(),
        }
    }
}

impl Sidecar {
    /// The event classes the sidecar describes (for walking stream files).
    pub fn event_classes(&self) -> EventClasses {
        let mut all = EventClasses::default();
        for s in &self.streams {
            for e in &s.event_classes {
                if let Some(c) = e.to_class(s.stream_class) {
                    all.stream_mut(s.stream_class).insert(c);
                }
            }
        }
        all
    }
}
