//! `--relayd net://HOST[:CTRL[:DATA]]` of `record` and `serve`: each
//! recording also streams its traces to an LTTng relay daemon, as session
//! `<guest name>` of host `<--relay-hostname>`, under
//! `<relay output>/<hostname>/<guest>-<YYYYmmdd-HHMMSS>/{kernel,user,host}`,
//! live (`babeltrace2 --input-format=lttng-live
//! net://RELAY/host/<hostname>/<guest>`). The local copy (`-o`) is written
//! as without it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use ivtrace_ctf::CtfWriter;
use ivtrace_engine::relay::RelayTap;
use ivtrace_engine::session;
use ivtrace_region::sanitize;
use ivtrace_relay::{Hub, RelayOptions, RelayUrl};

/// The relay options both front ends take.
// Doc comments here are the CLI's --help text (clap): `<name>` and `[GLOB]` are its syntax,
// not HTML or intra-doc links.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Debug, Clone, clap::Args)]
pub struct RelayArgs {
    /// Also stream every trace to this LTTng relay daemon (lttng-relayd), live:
    /// net://HOST[:CONTROL_PORT[:DATA_PORT]] (default ports 5342, 5343).
    #[arg(long, value_name = "URL", value_parser = ivtrace_relay::url::parse)]
    pub relayd: Option<RelayUrl>,
    /// The host name the relay files the sessions under [default: this host's name].
    #[arg(long, value_name = "NAME", requires = "relayd")]
    pub relay_hostname: Option<String>,
    /// Bytes of packets each recording may queue for the relay (a relay that is
    /// away or slow); beyond it packets are dropped and counted per stream.
    #[arg(long, value_name = "BYTES", default_value = "16M",
          value_parser = crate::serve::parse_size, requires = "relayd")]
    pub relay_buffer: u64,
    /// Seconds between live beacons of idle streams (the session's live timer).
    #[arg(long, value_name = "S", default_value_t = 0.2, requires = "relayd")]
    pub live_interval: f64,
}

impl RelayArgs {
    /// The sender thread, if `--relayd` was given.
    pub fn start(&self) -> Result<Option<Hub>> {
        let Some(url) = self.relayd.clone() else {
            return Ok(None);
        };
        let host = self
            .relay_hostname
            .clone()
            .unwrap_or_else(session::this_host);
        let hostname = sanitize::host_name_or(&host, "localhost");
        let opts = RelayOptions {
            url,
            hostname,
            queue_bytes: self.relay_buffer.min(usize::MAX as u64) as usize,
            live_interval: Duration::from_secs_f64(self.live_interval.clamp(0.01, 10.0)),
        };
        let hub = Hub::start(opts).context("cannot start the relay sender thread")?;
        Ok(Some(hub))
    }
}

/// `NAME-YYYYmmdd-HHMMSS`, as lttng names a session's directory.
fn dated(name: &str) -> String {
    let iso = ivtrace_ctf::tsdl::creation_datetime(SystemTime::now());
    let digits: String = iso.chars().filter(char::is_ascii_digit).collect();
    format!("{name}-{}-{}", &digits[..8], &digits[8..14])
}

/// A relay session for the recording of `name` (sanitized), fed by
/// `writer`; the caller also hands it to the host trace.
pub fn attach(hub: &Hub, name: &str, guest_freq_hz: u64, writer: &mut CtfWriter) -> Arc<RelayTap> {
    let name = sanitize::host_name_or(name, "guest");
    let path = format!("{}/{}", hub.options().hostname, dated(&name));
    let tap = Arc::new(RelayTap::new(hub.session(&name, &path), guest_freq_hz));
    writer.set_tap(tap.clone());
    tap
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
