//! A recording's relay output: a relay session (ivtrace-relayd) that the
//! writers hand their finished packets and metadata texts to, as a
//! [`TraceSink`] beside their directories ([`RelayTap::sink`]): the live
//! copy of the guest traces ([`LiveOut`]) and the host trace.
//!
//! The relay's metadata stream is append-only: the first text of a trace
//! goes whole; later texts go as the part that extends what was sent, or,
//! when the text changed above its events (the final clock mapping, the
//! final env), as the declarations of the event classes not sent yet. The
//! relay's copy keeps the clock mapping known when its metadata was first
//! sent; the local copy gets the final one.
//!
//! Beacons: a trace's streams may not move for a while (an idle CPU);
//! live viewers wait for every stream. Each trace's floor is the latest
//! packet end of any of its streams minus [`LIVE_LAG`]: the guest module
//! closes a packet that stayed open for its flush interval (100 ms), so
//! no event older than that is still on its way.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ivtrace_ctf::live::LiveOut;
use ivtrace_ctf::tsdl::Timebase;
use ivtrace_ctf::{tsdl, ClockMapping, CtfError, TraceEnv, TraceSink};
use ivtrace_region::abi;
use ivtrace_region::bytes::le_u64;
use ivtrace_region::classes::{EventClasses, StreamClasses};
use ivtrace_region::names::NameTable;
use ivtrace_region::sanitize;
use ivtrace_relayd::{Hub, Session, SessionStats, TraceId};

use crate::engine::Output;
use crate::sinks::Sinks;

/// How far behind the newest packet of a trace its idle streams' beacons
/// stay (see the module's documentation).
pub const LIVE_LAG: Duration = Duration::from_millis(500);

struct TapTrace {
    id: TraceId,
    sent: String,
    ids: HashSet<u32>,
    newest_end: u64,
    lag: u64,
}

/// A relay session fed by a recording's writers.
pub struct RelayTap {
    session: Session,
    guest_freq_hz: u64,
    traces: Mutex<HashMap<&'static str, TapTrace>>,
}

impl RelayTap {
    /// `guest_freq_hz`: the user trace's clock frequency (the host trace
    /// and the guest's kernel trace count nanoseconds; the user trace too
    /// unless the drain keeps its ticks).
    pub fn new(session: Session, guest_freq_hz: u64) -> RelayTap {
        RelayTap {
            session,
            guest_freq_hz,
            traces: Mutex::new(HashMap::new()),
        }
    }

    /// Closes the session (sends what is queued, closes the streams) and
    /// returns its statistics.
    pub fn close(&self) -> SessionStats {
        self.session.close()
    }

    /// Starts closing the session without waiting ([`Session::begin_close`]).
    pub fn begin_close(&self) {
        self.session.begin_close();
    }

    /// Whether [`RelayTap::close`] would return at once.
    pub fn close_settled(&self) -> bool {
        self.session.close_settled()
    }

    pub fn stats(&self) -> SessionStats {
        self.session.stats()
    }

    /// A sink that sends to this session, for a writer to put beside its
    /// directory (the session is shared: the guest traces' live copy and
    /// the host trace each get one).
    pub fn sink(self: &Arc<Self>) -> Box<dyn TraceSink> {
        Box::new(RelaySink(Arc::clone(self)))
    }

    fn with_trace<R>(
        &self,
        trace: &'static str,
        f: impl FnOnce(&Session, &mut TapTrace) -> R,
    ) -> R {
        let mut traces = self.traces.lock().unwrap_or_else(|p| p.into_inner());
        let t = traces.entry(trace).or_insert_with(|| {
            let kernel = ivtrace_ctf::trace::stream_dir(abi::IVT_STREAM_KERNEL);
            let (hdr, freq) = match trace {
                "host" => (ivtrace_ctf::host_trace::PACKET_HDR, 1_000_000_000),
                _ if trace == kernel => (abi::PACKET_HDR_SIZE, 1_000_000_000),
                _ => (abi::PACKET_HDR_SIZE, self.guest_freq_hz),
            };
            TapTrace {
                id: self.session.trace(trace, hdr),
                sent: String::new(),
                ids: HashSet::new(),
                newest_end: 0,
                lag: (freq as f64 * LIVE_LAG.as_secs_f64()) as u64,
            }
        });
        f(&self.session, t)
    }
}

/// What to append to a trace's relay metadata for `text` and `classes`.
fn addition(t: &mut TapTrace, text: &str, classes: Option<&StreamClasses>) -> String {
    let ids = || classes.into_iter().flat_map(|c| c.iter().map(|e| e.id));
    if t.sent.is_empty() {
        t.sent = text.to_string();
        t.ids.extend(ids());
        return text.to_string();
    }
    if let Some(rest) = text.strip_prefix(t.sent.as_str()) {
        t.sent.push_str(rest);
        t.ids.extend(ids());
        return rest.to_string();
    }
    let mut more = String::new();
    for c in classes.into_iter().flat_map(|c| c.iter()) {
        if t.ids.insert(c.id) {
            tsdl::write_event(&mut more, c);
        }
    }
    more
}

/// One writer's handle on a [`RelayTap`]. The relay never fails a write:
/// what it cannot send it drops and counts in its session's statistics,
/// which [`close`] reports.
struct RelaySink(Arc<RelayTap>);

impl TraceSink for RelaySink {
    fn metadata(
        &mut self,
        trace: &'static str,
        text: &str,
        classes: Option<&StreamClasses>,
    ) -> Result<(), CtfError> {
        self.0.metadata(trace, text, classes);
        Ok(())
    }

    fn packet(
        &mut self,
        trace: &'static str,
        file: &str,
        bytes: &[u8],
        events: u64,
    ) -> Result<(), CtfError> {
        self.0.packet(trace, file, bytes, events);
        Ok(())
    }
}

impl RelayTap {
    /// Appends what `text` adds to the trace's relay metadata.
    fn metadata(&self, trace: &'static str, text: &str, classes: Option<&StreamClasses>) {
        self.with_trace(trace, |s, t| {
            let more = addition(t, text, classes);
            s.metadata(t.id, more.as_bytes());
        });
    }

    /// Sends one packet and moves the trace's beacon floor up to it.
    fn packet(&self, trace: &'static str, file: &str, bytes: &[u8], events: u64) {
        self.with_trace(trace, |s, t| {
            s.packet(t.id, file, bytes, events);
            if bytes.len() >= 32 {
                let end = le_u64(bytes, abi::pkt::TIMESTAMP_END);
                if end > t.newest_end {
                    t.newest_end = end;
                    s.beacon_floor(t.id, end.saturating_sub(t.lag));
                }
            }
        });
    }
}

/// `NAME-YYYYmmdd-HHMMSS`, as lttng names a session's directory.
fn dated(name: &str) -> String {
    let iso = ivtrace_ctf::tsdl::creation_datetime(SystemTime::now());
    let digits: String = iso.chars().filter(char::is_ascii_digit).collect();
    format!("{name}-{}-{}", &digits[..8], &digits[8..14])
}

/// A relay session for the recording of `name` (sanitized), fed by a live
/// sink beside `sinks`' directory; the caller also puts a
/// [`RelayTap::sink`] beside the host trace's.
pub fn attach(hub: &Hub, name: &str, guest_freq_hz: u64, sinks: &mut Sinks) -> Arc<RelayTap> {
    let name = sanitize::host_name_or(name, "guest");
    let path = format!("{}/{}", hub.options().hostname, dated(&name));
    // The user trace counts nanoseconds unless the drain keeps ticks.
    let user_freq_hz = match sinks.dir.timebase(abi::IVT_STREAM_USER) {
        Timebase::Nanoseconds => 1_000_000_000,
        Timebase::Ticks => guest_freq_hz,
    };
    let tap = Arc::new(RelayTap::new(hub.session(&name, &path), user_freq_hz));
    sinks.add(Box::new(LiveOut::beside(&sinks.dir, tap.sink())));
    tap
}

/// The live sink as a recording's output beside the directory.
impl Output for LiveOut {
    /// What reached the relay stays there: the recording stops on the
    /// failed write that rolls back, so nothing is sent twice.
    fn rollback(&mut self) -> Result<(), CtfError> {
        Ok(())
    }

    fn thread_names(&mut self, table: NameTable) {
        self.set_thread_name_table(table);
    }

    /// The online kernel expansion converts with the refined mapping
    /// from the next packet on (each stream kept monotonic).
    fn clock_refined(&mut self, clock: &ClockMapping) {
        self.set_clock(clock.clone());
    }

    fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        LiveOut::finish(self, clock, env, classes)
    }

    fn finish_incomplete(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        Output::finish(self, clock, env, classes)
    }
}

/// Closes the relay session and says what reached the relay.
pub fn close(tap: &RelayTap, log: impl Fn(&str)) -> serde_json::Value {
    let stats = tap.close();
    let lost: u64 = stats.streams.iter().map(|s| s.events_lost()).sum();
    let sent: u64 = stats.streams.iter().map(|s| s.packets_sent).sum();
    log(&format!(
        "relay {} session {}/{}: {sent} packets sent, {lost} events lost on the way{}",
        stats.url,
        stats.hostname,
        stats.session,
        if stats.completed {
            ""
        } else {
            " (the relay did not take everything in time)"
        }
    ));
    serde_json::to_value(&stats).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_region::classes::{EventClass, Field, FieldType};

    fn classes(ids: &[u32]) -> StreamClasses {
        let mut c = StreamClasses::default();
        for &id in ids {
            let f = vec![Field::new("x", FieldType::U32, false)];
            c.insert(EventClass::new(id, 0, format!("e{id}"), f));
        }
        c
    }

    fn trace() -> TapTrace {
        TapTrace {
            id: 0,
            sent: String::new(),
            ids: HashSet::new(),
            newest_end: 0,
            lag: 0,
        }
    }

    /// The relay's metadata only grows: whole first, then extensions, then
    /// (when the text changed above the events) the new declarations only.
    #[test]
    fn metadata_is_sent_append_only() {
        let mut t = trace();
        assert_eq!(addition(&mut t, "head\nA", Some(&classes(&[1]))), "head\nA");
        assert_eq!(addition(&mut t, "head\nA", Some(&classes(&[1]))), "");
        assert_eq!(addition(&mut t, "head\nAB", Some(&classes(&[1, 2]))), "B");
        let more = addition(
            &mut t,
            "HEAD (final clock)\nABC",
            Some(&classes(&[1, 2, 3])),
        );
        assert!(
            more.contains("name = \"e3\"") && !more.contains("e2"),
            "{more}"
        );
        assert_eq!(
            addition(
                &mut t,
                "HEAD (final clock)\nABC",
                Some(&classes(&[1, 2, 3]))
            ),
            ""
        );
    }
}
