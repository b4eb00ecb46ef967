//! What can fail in the server, each saying what failed and what to do,
//! the source chain kept: setting up (sockets, signals, threads, the
//! output root), one connection (its region, handshake, recording and
//! sidecar). The control language's mistakes are
//! [`crate::control::CommandError`] and [`crate::ftrace::FtraceError`]:
//! their wording is what a client reads back.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use ivtrace_ctf::dir::DirError;
use ivtrace_ctf::CtfError;
use ivtrace_engine::{EngineError, UserError};
use ivtrace_migration::MigrationError;
use ivtrace_region::reader::HandoffError;

/// The server's results.
pub type Result<T, E = ServeError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum ServeError {
    /// A setting the user can fix (a socket in use, an unknown group): its
    /// hint is [`ServeError::hint`].
    #[error(transparent)]
    User(#[from] UserError),
    /// `--size` below the smallest region.
    #[error(
        "--size {size} is below the smallest region ({min} bytes): give at least {min} \
         (it is rounded up to a power of two)"
    )]
    SizeTooSmall { size: u64, min: u64 },
    /// A file or socket operation; `action` says which and on what path.
    #[error("cannot {action}")]
    Io {
        action: String,
        #[source]
        source: io::Error,
    },
    /// A system call that sets up descriptors (eventfd, epoll, memfd,
    /// poll, socketpair) failed.
    #[error("{call} failed{}", descriptor_advice(*.source))]
    Sys {
        call: &'static str,
        #[source]
        source: nix::Error,
    },
    /// A connection's doorbell waiter could not be set up (`what` says
    /// which step; the engine's error says why).
    #[error("cannot {what}")]
    Waiter {
        what: &'static str,
        #[source]
        source: EngineError,
    },
    /// The ivshmem handshake (protocol version, id, region, eventfds) did
    /// not complete: the peer went away or is not QEMU's ivshmem-doorbell.
    #[error("handshake with the peer failed")]
    Handshake(#[source] Box<ServeError>),
    /// A handshake message could not be sent.
    #[error("sending {what}")]
    Send {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A recording could not resume from the sidecar of its previous part.
    #[error("cannot resume from {}", path.display())]
    Resume {
        path: PathBuf,
        #[source]
        source: HandoffError,
    },
    /// An event of serve's own stream could not be written.
    #[error("cannot write serve's event to the host trace")]
    HostTrace(#[source] CtfError),
    /// The sidecar could not be encoded (a value JSON cannot hold).
    #[error("cannot encode the sidecar")]
    Sidecar(#[from] serde_json::Error),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Ctf(#[from] CtfError),
    #[error(transparent)]
    Migration(#[from] MigrationError),
}

/// `error` and its sources, `: ` between them (as the command line prints
/// errors), for the lines serve logs itself.
pub struct Report<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}

/// What to do when a call failed for want of descriptors.
fn descriptor_advice(errno: nix::Error) -> &'static str {
    match errno {
        nix::Error::EMFILE | nix::Error::ENFILE => {
            " (too many open files: raise the descriptor limit, `ulimit -n`)"
        }
        _ => "",
    }
}

impl ServeError {
    /// `map_err` for an I/O failure of `action` ("listen on PATH").
    pub fn io(action: impl Into<String>) -> impl FnOnce(io::Error) -> ServeError {
        let action = action.into();
        move |source| ServeError::Io { action, source }
    }

    /// `map_err` for a failed system call.
    pub fn sys(call: &'static str) -> impl FnOnce(nix::Error) -> ServeError {
        move |source| ServeError::Sys { call, source }
    }

    /// What the user can do about it, where the error knows (the errors
    /// wrapped transparently are not in the source chain a caller walks).
    pub fn hint(&self) -> Option<String> {
        match self {
            ServeError::User(u) => Some(u.hint.clone()),
            ServeError::Dir(d) => Some(d.hint().to_string()),
            ServeError::Handshake(inner) => inner.hint(),
            _ => None,
        }
    }
}
