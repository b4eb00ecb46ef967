//! ivtrace-engine: one recording engine for every front end.
//!
//! A recording drains a region (ivtrace-region) into its sinks
//! ([`sinks::Sinks`]: the CTF directory writer of ivtrace-ctf, and a relay's
//! live copy beside it), maps the writer's clock to host
//! time (ivtrace-time) and may record host events beside it
//! (ivtrace-tracefs). [`engine::Engine`] is the one loop that does it for
//! `ivtrace record`, `ivtrace serve` and any later front end, which only
//! choose:
//!
//! - how to wait when nothing is there ([`wait::Wait`]: [`wait::Backoff`]
//!   polling, or a doorbell waiter built on [`notify::Notifier`]);
//! - the clock ([`ivtrace_time::ClockSync`]: exchanges while recording,
//!   the final mapping);
//! - the output ([`engine::Output`]);
//! - their [`engine::Hooks`]: stop requests, slow checks, control
//!   requests between passes, what to do with sync points and doorbells.
//!
//! Around the loop: [`region_wait`] waits for a region to appear,
//! [`host_side`] sets up `DIR/host/` (host trace and host events),
//! [`relayd`] hands a recording's packets to an lttng-relayd session
//! (ivtrace-relayd) through a live sink, and [`session`] prepares the output directory and
//! turns a finished recording into its traces' `env` and its sidecar.

pub mod after_commit;
pub mod engine;
pub mod error;
pub mod host_side;
pub mod limits;
pub mod notify;
pub mod region_wait;
pub mod relayd;
pub mod session;
pub mod sinks;
pub mod wait;

pub use engine::{Core, Engine, HandshakeStats, Hooks, Output, Parts, Recorded, Step, StopReason};
pub use error::{BoxError, EngineError};
pub use region_wait::{wait_for_region, RegionWait};
pub use session::UserError;
pub use sinks::Sinks;
pub use wait::{Backoff, Wait, Woken};
