//! ivtrace-relayd: streaming recordings to LTTng's relay daemon.
//!
//! `lttng-relayd` (Debian's lttng-tools) collects trace streams from many
//! hosts, stores them per host and session and serves them live to
//! babeltrace2 (`--input-format=lttng-live`) and Trace Compass. ivtrace
//! speaks to it as LTTng's consumer daemon does: [`proto`] the messages,
//! [`client`] one session's control and data connections, [`hub`] the
//! sender thread with bounded queues that a recording hands packets to
//! without ever waiting for the network.

pub mod client;
pub mod hub;
pub mod proto;
pub mod url;

pub use hub::{Hub, RelayOptions, Session, SessionStats, StreamStats, TraceId};
pub use url::RelayUrl;
