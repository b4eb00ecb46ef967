//! `--relayd net://HOST[:CTRL[:DATA]]` of `record` and `serve`: each
//! recording also streams its traces to an LTTng relay daemon, as session
//! `<guest name>` of host `<--relay-hostname>`, under
//! `<relay output>/<hostname>/<guest>-<YYYYmmdd-HHMMSS>/{kernel,user,host}`,
//! live (`babeltrace2 --input-format=lttng-live
//! net://RELAY/host/<hostname>/<guest>`). The local copy (`-o`) is written
//! as without it.

use std::time::Duration;

use anyhow::{Context, Result};

use ivtrace_engine::session;
use ivtrace_region::sanitize;
use ivtrace_relayd::{Hub, RelayOptions, RelayUrl};

/// The relay options both front ends take.
// Doc comments here are the CLI's --help text (clap): `<name>` and `[GLOB]` are its syntax,
// not HTML or intra-doc links.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Debug, Clone, clap::Args)]
pub struct RelayArgs {
    /// Also stream every trace to this LTTng relay daemon (lttng-relayd), live:
    /// net://HOST[:CONTROL_PORT[:DATA_PORT]] (default ports 5342, 5343).
    #[arg(long, value_name = "URL", value_parser = ivtrace_relayd::url::parse)]
    pub relayd: Option<RelayUrl>,
    /// The host name the relay files the sessions under [default: this host's name].
    #[arg(long, value_name = "NAME", requires = "relayd")]
    pub relay_hostname: Option<String>,
    /// Bytes of packets each recording may queue for the relay (a relay that is
    /// away or slow); beyond it packets are dropped and counted per stream.
    #[arg(long, value_name = "BYTES", default_value = "16M",
          value_parser = crate::cli::parse_bytes, requires = "relayd")]
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
