//! What can fail in the engine, each saying what failed and what to do:
//! the loop ([`crate::Engine::run`]), the parts around it, and what the
//! front end's parts report through it (an [`crate::Output`]'s error, a
//! [`crate::Hooks`] method's), their source chains kept.

use std::path::PathBuf;

use thiserror::Error;

use ivtrace_ctf::dir::DirError;
use ivtrace_ctf::CtfError;
use ivtrace_region::RegionError;
use ivtrace_tracefs::host_events::HostEventsError;
use ivtrace_vmview::error::VmViewError;

/// Any error of a front end's part (its hooks, its waiter, its output),
/// as the engine carries it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, Error)]
pub enum EngineError {
    /// The output could not take or write packets (a full disk): the
    /// recording stops, every packet the output did not take stays in the
    /// region. The output's own message names the file and the cause.
    #[error(transparent)]
    Output(BoxError),
    /// A front end's hook or waiter failed (its message says what).
    #[error(transparent)]
    Front(BoxError),
    /// The region a recording waited for cannot be used (not a transient
    /// state: the front end gave up on it).
    #[error("cannot use region {}", path.display())]
    Region {
        path: PathBuf,
        #[source]
        source: RegionError,
    },
    /// Region bytes handed to the engine are not a region.
    #[error(transparent)]
    RegionBytes(RegionError),
    /// An output directory could not be created.
    #[error("cannot create {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Dir(#[from] DirError),
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
