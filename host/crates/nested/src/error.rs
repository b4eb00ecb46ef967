//! What can fail in forwarding and expanding nested guests, each saying
//! what failed and what to do.

use std::path::PathBuf;

use thiserror::Error;

use ivtrace_ctf::CtfError;

#[derive(Debug, Error)]
pub enum NestedError {
    /// The forwarding FIFO could not be opened.
    #[error(
        "cannot open {} for forwarding (hint: mkfifo it and start ivtrace-forward --in {} first)",
        path.display(),
        path.display()
    )]
    OpenFifo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A nested guest's directory could not be created.
    #[error("cannot create {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A nested guest's sidecar could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A guest's introduction or sidecar could not be encoded.
    #[error("cannot encode a nested guest's JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Ctf(#[from] CtfError),
}
