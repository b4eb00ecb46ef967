//! The directory sink's life around the writing: preparing an output
//! directory, opening an interrupted recording to resume it, and where a
//! recording keeps its stream files while it runs (which `--resume` and
//! `ivtrace recover` walk). The writing itself is [`crate::trace`]'s;
//! everything is reached through descriptors ([`crate::outdir`]).
//!
//! Errors are typed ([`DirError`]) and each carries a hint for the
//! operator; the front ends show both.

use std::io;
use std::path::Path;

use thiserror::Error;

use ivtrace_region::abi;

use crate::ftrace::KALLSYMS_FILE;
use crate::kernel::STAGING_DIR;
use crate::outdir::{read_limited, OutDir, OutDirError, OutputPolicy};
use crate::recover::channel_of;
use crate::sidecar::{Sidecar, SIDECAR_MAX_BYTES, SIDECAR_NAME, STATE_INCOMPLETE, STATE_RECORDING};
use crate::trace::{create_err, stream_dir, stream_file_name, CtfError, RESERVE_NAME};

/// The handoff file a migrated guest's part leaves in its directory
/// (ivtrace-migration writes and reads it).
pub const HANDOFF_NAME: &str = "handoff.json";
/// Where a recording of an L1 guest writes the guests it forwarded
/// (ivtrace-nested).
pub const NESTED_DIR: &str = "nested";

/// Entries of an output directory that the traces own (and --force
/// removes); a front end adds the ones it writes itself.
const OWNED_ENTRIES: &[&str] = &[
    "user",
    "kernel",
    "host",
    SIDECAR_NAME,
    ".ivtrace.json.tmp",
    RESERVE_NAME,
    STAGING_DIR,
    KALLSYMS_FILE,
];

/// Why an output directory is not used.
#[derive(Debug, Error)]
pub enum DirError {
    #[error(transparent)]
    Root(#[from] OutDirError),
    #[error("{path} exists and is not a directory")]
    NotADirectory { path: String },
    #[error("output directory {path} is not empty ({entries} entries)")]
    NotEmpty { path: String, entries: usize },
    #[error("--resume: {0}")]
    NoRecording(CtfError),
    #[error("--resume: the recording in {path} is {state} ({reason}), not interrupted")]
    NotInterrupted {
        path: String,
        state: String,
        reason: String,
    },
    #[error(
        "--resume: {path} holds a recording of region {was}, but the region is now {now} \
         (re-formatted, or another region)"
    )]
    OtherRegion {
        path: String,
        was: String,
        now: String,
    },
    #[error(transparent)]
    Trace(#[from] CtfError),
}

impl DirError {
    /// What the operator can do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            DirError::Root(e) => e.hint(),
            DirError::NotADirectory { .. } => "pass a directory path to -o",
            DirError::NotEmpty { .. } => {
                "choose a new directory, or pass --force to replace an earlier ivtrace output there"
            }
            DirError::NoRecording(_) => {
                "--resume goes on with a recording in DIR; without one, drop --resume"
            }
            DirError::NotInterrupted { .. } => {
                "record into a new directory (or --force to replace this one)"
            }
            DirError::OtherRegion { .. } => "record the new region into a new directory",
            DirError::Trace(_) => "check the path and its permissions",
        }
    }
}

/// Opens (creating it if missing) the output root `path` under `policy`
/// (never through a link; refused if others may write it, unless
/// allowed): see [`OutDir::root`].
pub fn open_root(path: &Path, policy: &OutputPolicy) -> Result<OutDir, DirError> {
    if path.exists() && !path.is_dir() {
        return Err(DirError::NotADirectory {
            path: path.display().to_string(),
        });
    }
    Ok(OutDir::root(path, policy)?)
}

/// Opens the output directory `path` for a new recording: it must be
/// empty unless `force`, in which case only the traces' entries and the
/// front end's `also_owned` are removed.
pub fn prepare(
    path: &Path,
    force: bool,
    policy: &OutputPolicy,
    also_owned: &[&str],
) -> Result<OutDir, DirError> {
    let root = open_root(path, policy)?;
    let io = |what, path: &Path| {
        let path = path.display().to_string();
        move |source| OutDirError::Io { what, path, source }
    };
    let entries = root.entries().map_err(io("list", path))?;
    if entries.is_empty() {
        return Ok(root);
    }
    if !force {
        return Err(DirError::NotEmpty {
            path: path.display().to_string(),
            entries: entries.len(),
        });
    }
    for name in OWNED_ENTRIES.iter().chain(also_owned) {
        root.remove_tree(name)
            .map_err(io("remove", &root.join(name)))?;
    }
    Ok(root)
}

/// The sidecar of `root`, which must be a recording.
pub fn read_sidecar(root: &OutDir) -> Result<Sidecar, CtfError> {
    let file = root.join(SIDECAR_NAME);
    let path = file.display().to_string();
    let text = root
        .open_read(SIDECAR_NAME)
        .and_then(|f| read_limited(f, SIDECAR_MAX_BYTES, &file))
        .map_err(create_err(&path))?;
    serde_json::from_slice(&text).map_err(|e| CtfError::Write {
        path,
        source: io::Error::new(io::ErrorKind::InvalidData, e),
    })
}

/// The sidecar of the recording in `root`, which must not be finalized
/// (its recorder died) or be incomplete (its output failed).
fn interrupted(root: &OutDir) -> Result<Sidecar, DirError> {
    let sidecar = read_sidecar(root).map_err(DirError::NoRecording)?;
    if sidecar.state != STATE_RECORDING && sidecar.state != STATE_INCOMPLETE {
        return Err(DirError::NotInterrupted {
            path: root.path().display().to_string(),
            state: sidecar.state,
            reason: sidecar.stop_reason,
        });
    }
    Ok(sidecar)
}

/// Opens `path` to resume the interrupted recording it holds
/// (`ivtrace record --resume`).
pub fn open_interrupted(path: &Path, policy: &OutputPolicy) -> Result<OutDir, DirError> {
    let root = open_root(path, policy)?;
    interrupted(&root)?;
    Ok(root)
}

/// The sidecar of the interrupted recording in `root` of the region whose
/// uuid is `uuid`, made ready to go on: a kernel expansion the recorder
/// did not finish is removed (redone at the end).
pub fn resume(root: &OutDir, uuid: &str) -> Result<Sidecar, DirError> {
    let before = interrupted(root)?;
    if before.trace_uuid != uuid {
        return Err(DirError::OtherRegion {
            path: root.path().display().to_string(),
            was: before.trace_uuid,
            now: uuid.into(),
        });
    }
    if root.kind(STAGING_DIR).ok().flatten().is_some() {
        let kernel = stream_dir(abi::IVT_STREAM_KERNEL);
        root.remove_tree(kernel)
            .map_err(create_err(root.join(kernel).display()))?;
    }
    Ok(before)
}

/// The directory that holds stream class `stream`'s files while a
/// recording runs: the staging directory for the kernel stream (expanded
/// at the end) and the ftrace relay's pages, else the trace's own.
pub fn recording_dir(stream: u32) -> &'static str {
    match stream {
        abi::IVT_STREAM_KERNEL | abi::IVT_STREAM_FTRACE => STAGING_DIR,
        _ => stream_dir(stream),
    }
}

/// One channel's stream file of an interrupted recording.
#[derive(Debug, Clone)]
pub struct StreamFile {
    pub dir: OutDir,
    pub name: String,
    pub chan: u32,
    pub stream: u32,
}

/// The channel stream files an interrupted recording left in `root`:
/// those of a channel below `nr_channels` whose name is the one its
/// stream class (`stream_of(chan)`, the region's layout) gives it.
pub fn stream_files(
    root: &OutDir,
    nr_channels: u32,
    stream_of: impl Fn(u32) -> u32,
) -> Result<Vec<StreamFile>, CtfError> {
    let mut out = Vec::new();
    for stream in [
        abi::IVT_STREAM_USER,
        abi::IVT_STREAM_KERNEL,
        abi::IVT_STREAM_FTRACE,
    ] {
        let Ok(dir) = root.open_dir(recording_dir(stream)) else {
            continue;
        };
        let names = dir.entries().map_err(create_err(dir.path().display()))?;
        for name in names {
            let Some(chan) = channel_of(&name).filter(|&c| c < nr_channels) else {
                continue;
            };
            if name == stream_file_name(stream, chan) && stream_of(chan) == stream {
                let dir = dir.clone();
                out.push(StreamFile {
                    dir,
                    name,
                    chan,
                    stream,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn non_empty_output_is_refused_without_force() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("keep.txt"), b"x").unwrap();
        fs::create_dir(dir.path().join("user")).unwrap();
        fs::create_dir(dir.path().join("mine")).unwrap();
        let policy = OutputPolicy::default();
        let err = prepare(dir.path(), false, &policy, &["mine"]).unwrap_err();
        assert!(
            matches!(err, DirError::NotEmpty { entries: 3, .. }),
            "{err}"
        );
        prepare(dir.path(), true, &policy, &["mine"]).unwrap();
        assert!(
            dir.path().join("keep.txt").exists(),
            "--force leaves foreign files alone"
        );
        assert!(!dir.path().join("user").exists());
        assert!(!dir.path().join("mine").exists());
    }

    #[test]
    fn a_file_is_not_an_output_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        let err = open_root(&file, &OutputPolicy::default()).unwrap_err();
        assert!(matches!(err, DirError::NotADirectory { .. }), "{err}");
    }
}
