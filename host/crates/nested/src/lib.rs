//! Nested tracing: a guest (L1) that records its own guest (L2) forwards
//! L2's trace through its own region to the host (L0), which writes it as
//! a trace of its own on L0's timeline (docs/migration.md, "Nested
//! guests").
//!
//! L1's `ivtrace record --forward FIFO` sends every L2 packet, unchanged,
//! with L2's event classes and clock mapping, as messages cut into chunks
//! of at most [`CHUNK_MAX`] bytes; `ivtrace-forward` (libivtrace) writes
//! each chunk into L1's region as one `ivtrace:forward` event and brackets
//! L1's CLOCK_MONOTONIC with `ivtrace:forward_sync` events. L0's recording
//! of L1 ([`Nesting`] around its output) reassembles the messages, checks
//! them as hostile input like any region data, and at the end writes
//! `DIR/nested/<name>/` with the composed clock:
//!
//! ```text
//! L0_ns(t2) = L2->L1mono(t2) + (L0_ns(sync) - L1mono(sync)),
//! bound = e(L2->L1) + e(L1->L0) + half the sync bracket
//! ```
//!
//! The forwarded stream's format and its checked reading (framing,
//! reassembly, sync brackets, forwarded classes) are ivtrace-region's
//! [`forward`](ivtrace_region::forward), with the other hostile input;
//! this crate writes what it carries.

// The forwarded stream is guest input (an L1 guest writes it): every
// arithmetic is checked or saturating, every narrowing cast explicit.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use ivtrace_ctf::streams::Limits;
use ivtrace_ctf::tsdl::{EnvValue, TraceEnv};
use ivtrace_ctf::{CtfWriter, OutDir};
use ivtrace_engine::after_commit::{AfterCommit, Watcher};
use ivtrace_engine::Output;
use ivtrace_region::classes::EventClasses;
use ivtrace_region::forward::{
    classes_from_wire, classes_to_wire, write_message, ClassWire, ForwardEvents, Found,
    PacketMessage, Reassembly, SyncBrackets,
};
use ivtrace_region::reader::walk_own_packet;
use ivtrace_region::sanitize::host_name as sanitize_host_name;
use ivtrace_region::sanitize::Shown;
use ivtrace_region::{abi, PacketSink};
use ivtrace_time::ClockMapping;
use serde::Serialize;

pub mod error;
pub use error::NestedError;

type Result<T, E = NestedError> = std::result::Result<T, E>;

pub use ivtrace_ctf::dir::NESTED_DIR;
pub use ivtrace_region::forward::{
    Hello, SyncBracket, CHUNK_MAX, CLOCK, FORWARD_CLASS, HELLO, META, PACKET, SYNC_CLASS,
};

/// Nested guests one L0 recording keeps apart (the guest chooses names).
const NESTED_MAX: usize = 64;

// ---------------------------------------------------------------- L1 side

/// L1's half: sends L2's packets, classes and clock to `ivtrace-forward`.
pub struct Forwarder {
    out: Option<BufWriter<File>>,
    path: PathBuf,
    sent_generation: Option<u64>,
    packets: u64,
    /// Packets not forwarded because the pipe failed.
    lost_packets: u64,
}

impl Forwarder {
    /// Opens `path` (a FIFO `ivtrace-forward --in` reads; blocks until it
    /// does) and introduces the guest.
    pub fn open(path: &Path, hello: &Hello) -> Result<Forwarder> {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|source| NestedError::OpenFifo {
                path: path.to_path_buf(),
                source,
            })?;
        let mut fw = Forwarder {
            out: Some(BufWriter::with_capacity(1 << 16, f)),
            path: path.to_path_buf(),
            sent_generation: None,
            packets: 0,
            lost_packets: 0,
        };
        fw.send(HELLO, &serde_json::to_vec(hello)?);
        Ok(fw)
    }

    /// One message in chunks; on a broken pipe forwarding stops (counted).
    fn send(&mut self, kind: u32, body: &[u8]) -> bool {
        let Some(out) = self.out.as_mut() else {
            return false;
        };
        if let Err(e) = write_message(out, kind, body) {
            eprintln!(
                "ivtrace: warning: forwarding to {} failed ({e}); the local trace goes on, \
                 forwarded packets from now on are counted as lost",
                self.path.display()
            );
            self.out = None;
            return false;
        }
        true
    }

    fn packet(&mut self, chan: u32, stream: u32, bytes: &[u8], classes: &EventClasses) {
        if self.sent_generation != Some(classes.generation()) {
            let wire = classes_to_wire(classes);
            let body = serde_json::to_vec(&wire).unwrap_or_default();
            if self.send(META, &body) {
                self.sent_generation = Some(classes.generation());
            }
        }
        let body = PacketMessage {
            chan,
            stream,
            packet: bytes,
        }
        .to_bytes();
        match self.send(PACKET, &body) {
            true => self.packets = self.packets.saturating_add(1),
            false => self.lost_packets = self.lost_packets.saturating_add(1),
        }
    }

    /// L2's final mapping, moved from the host time base to
    /// CLOCK_MONOTONIC (what `ivtrace-forward` brackets), then closes.
    fn finish(&mut self, clock: &ClockMapping) -> serde_json::Value {
        let base = ivtrace_time::timebase::base();
        let mut mono = clock.clone();
        let ref_mono = i128::from(clock.ref_realtime_ns).saturating_sub(i128::from(base.offset_ns));
        mono.ref_realtime_ns = u64::try_from(ref_mono.max(0)).unwrap_or(u64::MAX);
        mono.error_ns = clock.error_ns.saturating_add(base.error_ns);
        let body = serde_json::to_vec(&mono).unwrap_or_default();
        self.send(CLOCK, &body);
        if let Some(mut out) = self.out.take() {
            let _ = out.flush();
        }
        eprintln!(
            "ivtrace: forwarded {} packets to {} ({} not forwarded)",
            self.packets,
            self.path.display(),
            self.lost_packets
        );
        serde_json::json!({
            "to": self.path.display().to_string(),
            "packets": self.packets,
            "not_forwarded_packets": self.lost_packets,
        })
    }
}

// ---------------------------------------------------------------- L0 side

/// What L0 found of one forwarded guest.
#[derive(Debug, Default, Clone, Serialize)]
pub struct NestedStats {
    pub packets: u64,
    pub events: u64,
    /// Forwarded packets that failed the checks (their events are lost).
    pub corrupt_packets: u64,
    /// Messages with a missing chunk (L1 dropped a forward event).
    pub incomplete_messages: u64,
    pub skipped_classes: u64,
    /// The forwarded guest's own announced losses (last events_discarded
    /// of each of its channels).
    pub guest_discarded: u64,
}

/// One forwarded guest as L0 writes it.
struct NestedGuest {
    hello: Hello,
    dir: OutDir,
    writer: CtfWriter,
    classes: EventClasses,
    clock: Option<ClockMapping>,
    discarded: BTreeMap<(u32, u32), u64>,
    stats: NestedStats,
}

/// L0's half: finds the forward classes in L1's user stream, reassembles,
/// writes each forwarded guest under `DIR/nested/`.
pub struct Expander {
    root: OutDir,
    /// The forward events' ids, for the classes of this generation.
    ids: Option<(u64, Option<ForwardEvents>)>,
    messages: Reassembly,
    brackets: SyncBrackets,
    /// The forwarded guest, by the L1 channel that forwards it.
    guests: BTreeMap<u32, NestedGuest>,
    refused_guests: u64,
}

impl Expander {
    pub fn new(root: &OutDir) -> Expander {
        Expander {
            root: root.clone(),
            ids: None,
            messages: Reassembly::default(),
            brackets: SyncBrackets::default(),
            guests: BTreeMap::new(),
            refused_guests: 0,
        }
    }

    /// Forwarded guests refused (a bad introduction, too many) and
    /// messages refused (unfinished ones past their shared cap).
    pub fn refused(&self) -> (u64, u64) {
        (self.refused_guests, self.messages.over_cap())
    }

    /// Whether L1's user packets carry forwarded data (its classes name
    /// the forward events).
    fn wants(&mut self, classes: &EventClasses) -> bool {
        self.events_for(classes).is_some()
    }

    /// A fresh collector of `classes`' forward events (None: none).
    fn events_for(&mut self, classes: &EventClasses) -> Option<ForwardEvents> {
        let generation = classes.generation();
        if self.ids.as_ref().is_none_or(|(g, _)| *g != generation) {
            self.ids = Some((generation, ForwardEvents::for_classes(classes)));
        }
        self.ids.as_ref().and_then(|(_, e)| e.clone())
    }

    /// One of L1's user packets (already checked by the reader).
    fn packet(&mut self, chan: u32, bytes: &[u8], classes: &EventClasses) {
        let Some(mut events) = self.events_for(classes) else {
            return;
        };
        let mut copy = bytes.to_vec();
        if walk_own_packet(&mut copy, classes, &mut events).is_err() {
            return;
        }
        for ev in events.found {
            match ev {
                Found::Chunk(kind, data) => self.chunk(chan, kind, &data),
                Found::Sync(ticks, mono, phase) => self.sync(chan, ticks, mono, phase),
            }
        }
    }

    /// One clock bracket point of L1's channel `chan` (`ivtrace:forward_sync`;
    /// public for the fuzz target, which feeds the stream without a region).
    pub fn sync(&mut self, chan: u32, ticks: u64, mono: u64, phase: u32) {
        self.brackets.push(chan, ticks, mono, phase);
    }

    /// One chunk of a forwarded message on L1's channel `chan`
    /// (`ivtrace:forward`'s kind and data; public for the fuzz target); a
    /// complete message is handled at once, a lost one counted.
    pub fn chunk(&mut self, chan: u32, kind: u32, data: &[u8]) {
        let pushed = self.messages.push(chan, kind, data);
        for _ in 0..pushed.lost() {
            self.incomplete(chan);
        }
        if let Ok(Some(msg)) = pushed.outcome {
            self.message(chan, kind, &msg);
        }
    }

    fn incomplete(&mut self, chan: u32) {
        if let Some(g) = self.guests.get_mut(&chan) {
            g.stats.incomplete_messages = g.stats.incomplete_messages.saturating_add(1);
        }
    }

    fn message(&mut self, chan: u32, kind: u32, msg: &[u8]) {
        if kind == HELLO {
            return self.hello(chan, msg);
        }
        let Some(g) = self.guests.get_mut(&chan) else {
            return;
        };
        match kind {
            META => g.meta(msg),
            PACKET => g.packet(msg),
            CLOCK => g.clock = serde_json::from_slice(msg).ok(),
            _ => g.stats.incomplete_messages = g.stats.incomplete_messages.saturating_add(1),
        }
    }

    fn hello(&mut self, chan: u32, msg: &[u8]) {
        let Ok(hello) = serde_json::from_slice::<Hello>(msg) else {
            self.refused_guests = self.refused_guests.saturating_add(1);
            return;
        };
        if self.guests.contains_key(&chan) || self.guests.len() >= NESTED_MAX {
            self.refused_guests = self.refused_guests.saturating_add(1);
            return;
        }
        match NestedGuest::create(&self.root, hello, self.guests.len()) {
            Ok(g) => {
                self.guests.insert(chan, g);
            }
            Err(e) => {
                eprintln!("ivtrace: warning: a forwarded guest's trace cannot be written: {e:#}");
                self.refused_guests = self.refused_guests.saturating_add(1);
            }
        }
    }

    /// Writes every forwarded guest with its composed clock (`outer`: the
    /// final mapping of L1's writer clock to this host's time).
    pub fn finish(&mut self, outer: &ClockMapping, via: &str) -> Result<Vec<serde_json::Value>> {
        for chan in self.messages.finish() {
            self.incomplete(chan);
        }
        let mut guests = Vec::with_capacity(self.guests.len());
        for g in self.guests.values_mut() {
            guests.push(g.finish(outer, self.brackets.best(), via)?);
        }
        if self.refused_guests > 0 {
            eprintln!(
                "ivtrace: warning: {} forwarded guests refused (bad introduction, or more than \
                 {NESTED_MAX})",
                self.refused_guests
            );
        }
        if self.messages.over_cap() > 0 {
            eprintln!(
                "ivtrace: warning: {} forwarded messages refused: unfinished messages would have \
                 held more than {} MiB at once",
                self.messages.over_cap(),
                ivtrace_region::forward::PARTIAL_TOTAL_MAX >> 20
            );
        }
        Ok(guests)
    }
}

/// The composed mapping: L2's mapping (onto L1's CLOCK_MONOTONIC) shifted
/// by where L1's CLOCK_MONOTONIC lies on L0's timeline; the bounds add.
pub fn compose(inner: &ClockMapping, outer: &ClockMapping, sync: &SyncBracket) -> ClockMapping {
    let half = sync.mono_after.saturating_sub(sync.mono_before) / 2;
    let mid = sync.mono_before.saturating_add(half);
    let shift = i128::from(sync.at_ns).saturating_sub(i128::from(mid));
    let ref_ns = i128::from(inner.ref_realtime_ns).saturating_add(shift);
    let ref_ns = u64::try_from(ref_ns.max(0)).unwrap_or(u64::MAX);
    ClockMapping {
        freq_hz: inner.freq_hz,
        ref_ticks: inner.ref_ticks,
        ref_realtime_ns: ref_ns,
        error_ns: inner
            .error_ns
            .saturating_add(outer.error_ns)
            .saturating_add(half.saturating_add(1)),
        method: format!("nested({} then {})", inner.method, outer.method),
        coarse: inner.coarse || outer.coarse,
        samples: inner.samples.min(outer.samples),
    }
}

impl NestedGuest {
    fn create(root: &OutDir, hello: Hello, index: usize) -> Result<NestedGuest> {
        let mut name = sanitize_host_name(&hello.name);
        if name.is_empty() {
            name = format!("guest{index}");
        }
        let nested = match index {
            0 => root.create_dir(NESTED_DIR),
            _ => root.open_dir(NESTED_DIR),
        }
        .map_err(|source| NestedError::Create {
            path: root.join(NESTED_DIR),
            source,
        })?;
        let leaf = format!("{name}-{index}");
        let dir = nested
            .create_dir(&leaf)
            .map_err(|source| NestedError::Create {
                path: nested.join(&leaf),
                source,
            })?;
        let nr = hello.nr_channels.clamp(1, abi::IVT_CHANNELS_MAX);
        let placeholder = ClockMapping {
            freq_hz: 1_000_000_000,
            ref_ticks: 0,
            ref_realtime_ns: 0,
            error_ns: u64::MAX,
            method: "none".into(),
            coarse: true,
            samples: 0,
        };
        // No reserve: the outer recording's own covers a full disk.
        let limits = Limits {
            reserve_bytes: 0,
            ..Limits::default()
        };
        let mut writer = CtfWriter::new(
            dir.clone(),
            hello.uuid,
            placeholder,
            env(&name, "", None),
            nr,
            limits,
        );
        // L1 forwards L2's packets as L2 wrote them, in ticks.
        writer.keep_user_ticks();
        Ok(NestedGuest {
            hello: Hello {
                name,
                nr_channels: nr,
                ..hello
            },
            dir,
            writer,
            classes: EventClasses::default(),
            clock: None,
            discarded: BTreeMap::new(),
            stats: NestedStats::default(),
        })
    }

    fn meta(&mut self, msg: &[u8]) {
        let Ok(wire) = serde_json::from_slice::<Vec<ClassWire>>(msg) else {
            self.stats.incomplete_messages = self.stats.incomplete_messages.saturating_add(1);
            return;
        };
        let (mut classes, skipped) = classes_from_wire(&wire);
        // Generations only grow, so the writer rewrites its metadata.
        while classes.generation() <= self.classes.generation() {
            classes.bump_generation();
        }
        self.classes = classes;
        self.stats.skipped_classes = skipped;
    }

    /// A forwarded packet: checked like a packet the host wrote itself
    /// (magic, sizes, every event walked with the forwarded classes).
    fn packet(&mut self, msg: &[u8]) {
        let Ok(PacketMessage {
            chan,
            stream,
            packet,
        }) = PacketMessage::parse(msg)
        else {
            self.stats.corrupt_packets = self.stats.corrupt_packets.saturating_add(1);
            return;
        };
        let mut copy = packet.to_vec();
        let walked = match walk_own_packet(&mut copy, &self.classes, &mut ()) {
            Ok((h, s)) if h.stream_id == stream && h.stream_instance_id == chan as u64 => {
                Some((h, s))
            }
            _ => None,
        };
        let known = chan < self.hello.nr_channels && stream <= abi::IVT_STREAM_USER;
        let Some((h, s)) = walked.filter(|_| known) else {
            self.stats.corrupt_packets = self.stats.corrupt_packets.saturating_add(1);
            return;
        };
        let written = self
            .writer
            .packet(chan, stream, &copy, &self.classes)
            .and_then(|()| self.writer.commit());
        if written.is_err() {
            self.stats.corrupt_packets = self.stats.corrupt_packets.saturating_add(1);
            return;
        }
        self.stats.packets = self.stats.packets.saturating_add(1);
        self.stats.events = self.stats.events.saturating_add(s.events);
        let d = self.discarded.entry((stream, chan)).or_default();
        *d = (*d).max(h.events_discarded);
    }

    /// Writes the trace and `nested.json`; returns the sidecar's entry.
    fn finish(
        &mut self,
        outer: &ClockMapping,
        sync: Option<SyncBracket>,
        via: &str,
    ) -> Result<serde_json::Value> {
        let clock = match (&self.clock, sync) {
            (Some(inner), Some(sync)) => Some(compose(inner, outer, &sync)),
            _ => None,
        };
        self.stats.guest_discarded = self.discarded.values().sum();
        let shown = clock.clone().unwrap_or_else(|| ClockMapping {
            method: "none: no clock or sync point was forwarded".into(),
            ..outer.clone()
        });
        if clock.is_none() {
            eprintln!(
                "ivtrace: warning: nested guest {}: no clock mapping or sync point arrived; its \
                 times are not on this timeline",
                self.hello.name
            );
        }
        let trace_env = env(&self.hello.name, via, Some(&shown));
        Output::finish(&mut self.writer, &shown, trace_env, &self.classes)?;
        let summary = serde_json::json!({
            "name": self.hello.name,
            "via": via,
            "clock": shown,
            "inner_clock": self.clock,
            "outer_clock": outer,
            "sync": sync,
            "stats": self.stats,
        });
        self.dir
            .write_atomically(NESTED_SIDECAR, &serde_json::to_vec_pretty(&summary)?)
            .map_err(|source| NestedError::Write {
                path: self.dir.join(NESTED_SIDECAR),
                source,
            })?;
        eprintln!(
            "ivtrace: nested guest {} (via {}): {} events in {} packets, {} corrupt packets, \
             {} incomplete messages, its own discarded {}; clock {} ±{} ns -> {}",
            Shown(&self.hello.name),
            Shown(via),
            self.stats.events,
            self.stats.packets,
            self.stats.corrupt_packets,
            self.stats.incomplete_messages,
            self.stats.guest_discarded,
            Shown(&shown.method),
            shown.error_ns,
            self.dir.path().display()
        );
        Ok(serde_json::json!({
            "dir": self.dir.path().display().to_string(),
            "name": self.hello.name,
            "clock_method": shown.method,
            "clock_error_ns": shown.error_ns,
            "stats": self.stats,
        }))
    }
}

/// The nested trace's summary file (next to its `user/`, `kernel/`).
pub const NESTED_SIDECAR: &str = "nested.json";

fn env(name: &str, via: &str, clock: Option<&ClockMapping>) -> TraceEnv {
    let mut extra = vec![("ivtrace_nested_via".into(), EnvValue::Str(via.into()))];
    if let Some(c) = clock {
        extra.push((
            "ivtrace_clock_method".into(),
            EnvValue::Str(c.method.clone()),
        ));
        extra.push((
            "ivtrace_clock_error_ns".into(),
            EnvValue::Int(c.error_ns.min(i64::MAX as u64) as i64),
        ));
    }
    TraceEnv {
        hostname: name.into(),
        trace_name: name.into(),
        creation_datetime: ivtrace_ctf::tsdl::creation_datetime(std::time::SystemTime::now()),
        tracer_major: 0,
        tracer_minor: 1,
        extra,
    }
}

// ---------------------------------------------------------------- the wrapper

/// An output with nested tracing around it: forwards what it writes (L1)
/// and expands what it reads (L0), each packet once the output committed
/// it (the engine's [`AfterCommit`]).
pub type Nesting<O> = AfterCommit<O, Nest>;

/// `inner` with nested tracing around it; `forward` and `expand` are both
/// optional.
pub fn nesting<O: Output>(
    inner: O,
    forward: Option<Forwarder>,
    expand: Option<Expander>,
) -> Nesting<O> {
    let nest = Nest {
        forward,
        expand,
        classes: EventClasses::default(),
        classes_generation: None,
    };
    AfterCommit::new(inner, nest)
}

/// The forwarder and the expander, fed the committed packets.
pub struct Nest {
    forward: Option<Forwarder>,
    expand: Option<Expander>,
    /// The latest event classes (classes are only ever added).
    classes: EventClasses,
    classes_generation: Option<u64>,
}

impl Nest {
    /// Ends the forwarding and writes the expanded guests; call after the
    /// recording's own finish with the same final clock. Returns the
    /// sidecar's `nested` section (None: nothing forwarded either way).
    pub fn finish(&mut self, clock: &ClockMapping, via: &str) -> Result<Option<serde_json::Value>> {
        let forwarded = self.forward.as_mut().map(|f| f.finish(clock));
        let (guests, refused) = match self.expand.as_mut() {
            Some(x) => (x.finish(clock, via)?, x.refused()),
            None => (Vec::new(), (0, 0)),
        };
        if forwarded.is_none() && guests.is_empty() && refused == (0, 0) {
            return Ok(None);
        }
        Ok(Some(serde_json::json!({
            "forwarded": forwarded,
            "guests": guests,
            "refused_guests": refused.0,
            "refused_messages": refused.1,
        })))
    }

    fn wants(&mut self, stream: u32, classes: &EventClasses) -> bool {
        let expands = stream == abi::IVT_STREAM_USER
            && self.expand.as_mut().is_some_and(|x| x.wants(classes));
        self.forward.is_some() || expands
    }
}

impl Watcher for Nest {
    /// (channel, stream, bytes); at most the reader's commit interval of
    /// them plus a packet wait for their commit.
    type Note = (u32, u32, Vec<u8>);
    /// Never returned (forwarding and expansion count their losses); the
    /// CTF writer's, so that the writer's outputs take it.
    type Error = ivtrace_ctf::CtfError;

    fn note(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Option<Self::Note> {
        if self.classes_generation != Some(classes.generation()) {
            self.classes = classes.clone();
            self.classes_generation = Some(classes.generation());
        }
        self.wants(stream, classes)
            .then(|| (chan, stream, bytes.to_vec()))
    }

    /// The committed packets go on to the forwarder and the expander.
    fn committed(&mut self, notes: Vec<Self::Note>) -> Result<(), Self::Error> {
        for (chan, stream, bytes) in notes {
            if let Some(f) = self.forward.as_mut() {
                f.packet(chan, stream, &bytes, &self.classes);
            }
            if let Some(x) = self
                .expand
                .as_mut()
                .filter(|_| stream == abi::IVT_STREAM_USER)
            {
                x.packet(chan, &bytes, &self.classes);
            }
        }
        Ok(())
    }

    fn idle(&mut self) -> Result<(), ivtrace_ctf::CtfError> {
        if let Some(out) = self.forward.as_mut().and_then(|f| f.out.as_mut()) {
            let _ = out.flush();
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn mapping(ref_ns: u64, error_ns: u64) -> ClockMapping {
        ClockMapping {
            freq_hz: 1_000_000_000,
            ref_ticks: 1_000,
            ref_realtime_ns: ref_ns,
            error_ns,
            method: "test".into(),
            coarse: false,
            samples: 8,
        }
    }

    fn out_dir(dir: &tempfile::TempDir) -> OutDir {
        OutDir::root(dir.path(), &Default::default()).unwrap()
    }

    /// The frames `write_message` puts on the pipe, as ivtrace-forward
    /// turns them into events: (kind, data).
    fn frames(kind: u32, body: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut wire = Vec::new();
        write_message(&mut wire, kind, body).unwrap();
        let frames = ivtrace_region::forward::split_frames(&wire);
        frames.into_iter().map(|(k, d)| (k, d.to_vec())).collect()
    }

    fn hello(x: &mut Expander, chan: u32, nr_channels: u32) {
        let h = Hello {
            name: "../l2 guest".into(),
            uuid: [7; 16],
            nr_channels,
        };
        for (k, d) in frames(HELLO, &serde_json::to_vec(&h).unwrap()) {
            x.chunk(chan, k, &d);
        }
    }

    #[test]
    fn a_guest_is_introduced_once_under_a_sanitized_name() {
        let dir = tempfile::tempdir().unwrap();
        let mut x = Expander::new(&out_dir(&dir));
        hello(&mut x, 3, 4);
        hello(&mut x, 3, 4);
        assert_eq!(x.guests.len(), 1);
        assert_eq!(x.refused_guests, 1);
        let g = &x.guests[&3];
        assert!(
            g.dir.path().starts_with(dir.path().join(NESTED_DIR)),
            "{:?}",
            g.dir
        );
        assert!(!g.hello.name.contains('/'));
    }

    /// A lost chunk costs its guest one incomplete message; the message
    /// that follows it arrives whole.
    #[test]
    fn a_lost_chunk_is_counted_for_its_guest() {
        let dir = tempfile::tempdir().unwrap();
        let mut x = Expander::new(&out_dir(&dir));
        hello(&mut x, 0, 4);
        let wire = vec![ClassWire {
            stream: abi::IVT_STREAM_USER,
            id: 0,
            name: "a".repeat(5000),
            fields: vec![("x".into(), "u64".into(), false, false)],
        }];
        let f = frames(META, &serde_json::to_vec(&wire).unwrap());
        assert!(f.len() >= 2);
        x.chunk(0, f[0].0, &f[0].1);
        assert!(x.guests[&0].classes.stream(abi::IVT_STREAM_USER).is_empty());
        for (k, d) in &f {
            x.chunk(0, *k, d);
        }
        assert_eq!(x.guests[&0].stats.incomplete_messages, 1);
        assert_eq!(x.guests[&0].classes.stream(abi::IVT_STREAM_USER).len(), 1);
        // One left unfinished at the end counts too.
        x.chunk(0, f[0].0, &f[0].1);
        x.finish(&mapping(0, 1), "l1").unwrap();
        assert_eq!(x.guests[&0].stats.incomplete_messages, 2);
    }

    #[test]
    fn packets_of_unknown_channels_or_garbage_are_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let mut x = Expander::new(&out_dir(&dir));
        hello(&mut x, 0, 2);
        let mut body = Vec::new();
        body.extend_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&[0xab; 200]);
        for (k, d) in frames(PACKET, &body) {
            x.chunk(0, k, &d);
        }
        for (k, d) in frames(PACKET, &[1, 2, 3]) {
            x.chunk(0, k, &d);
        }
        assert_eq!(x.guests[&0].stats.corrupt_packets, 2);
        assert_eq!(x.guests[&0].stats.packets, 0);
    }

    #[test]
    fn composition_shifts_by_the_sync_point_and_adds_the_bounds() {
        // L1's monotonic clock reads 5_000 while L0's trace has the sync
        // event at 1_000_000_000_000 + 5_100 ns: L0 = L1mono + 1e12 + 100.
        let inner = mapping(2_000, 300);
        let outer = mapping(1_000_000_000_000, 40);
        let sync = SyncBracket {
            at_ns: 1_000_000_000_000 + 5_100,
            mono_before: 4_990,
            mono_after: 5_010,
        };
        let c = compose(&inner, &outer, &sync);
        assert_eq!(c.ref_realtime_ns, 2_000 + 1_000_000_000_000 + 100);
        assert_eq!(c.error_ns, 300 + 40 + 10 + 1);
        assert_eq!(c.freq_hz, inner.freq_hz);
        assert_eq!(c.ref_ticks, inner.ref_ticks);
    }

    #[test]
    fn the_best_sync_bracket_reaches_the_composition() {
        let dir = tempfile::tempdir().unwrap();
        let mut x = Expander::new(&out_dir(&dir));
        x.sync(0, 30, 400, 0);
        x.sync(0, 0, 420, 1);
        let b = x.brackets.best().unwrap();
        assert_eq!((b.at_ns, b.mono_before, b.mono_after), (30, 400, 420));
    }
}
