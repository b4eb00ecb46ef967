//! What deriving or reading a VM view can fail on: each error names the
//! trace or file and carries the cause (`source`), so the CLI prints the
//! whole chain.

use std::io;
use std::path::PathBuf;

use ivtrace_ctf::CtfError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum VmViewError {
    #[error("cannot read the host trace {}", .path.display())]
    HostTrace { path: PathBuf, source: io::Error },
    #[error("cannot read the guest trace {}", .path.display())]
    GuestTrace { path: PathBuf, source: io::Error },
    #[error("cannot read {}", .path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("cannot list {}", .path.display())]
    List { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Trace(#[from] CtfError),
}

/// What this crate's fallible steps return.
pub type Result<T, E = VmViewError> = std::result::Result<T, E>;
