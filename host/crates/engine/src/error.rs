//! What can fail in the engine's own parts around the loop, each saying
//! what failed and what to do. The loop itself ([`crate::Engine::run`]) and
//! the [`crate::Output`] and [`crate::Hooks`] a front end gives it still
//! carry `anyhow::Error` (any output's error through one type); these
//! convert into it at that boundary.

use thiserror::Error;

use ivtrace_ctf::CtfError;
use ivtrace_tracefs::host_events::HostEventsError;
use ivtrace_vmview::error::VmViewError;

#[derive(Debug, Error)]
pub enum EngineError {
    /// The doorbell waiter's epoll failed.
    #[error(
        "{op} failed: {source} (the doorbell waiter cannot run; the descriptor limit, \
         `ulimit -n`, may be too low, or the eventfd was closed)"
    )]
    Epoll {
        op: &'static str,
        #[source]
        source: nix::errno::Errno,
    },
    /// A second start of the host events of one recording (a front end's
    /// bug).
    #[error("host events are already being recorded for this recording (started twice)")]
    HostEventsRunning,
    /// The VM view was asked for while the host events still run (a
    /// front end's bug: stop them first).
    #[error("the VM view needs the host events stopped first")]
    HostEventsNotStopped,
    #[error(transparent)]
    HostEvents(#[from] HostEventsError),
    #[error(transparent)]
    VmView(#[from] VmViewError),
    #[error(transparent)]
    Ctf(#[from] CtfError),
}
