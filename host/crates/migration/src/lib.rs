//! A traced guest that migrates: the files and names that join the source
//! host's part of a trace to the destination host's.
//!
//! The source's recorder ends its part with the engine's `StopReason::Handoff`
//! (`ivtrace ctl handoff`, or SIGUSR1 to `ivtrace record`) and writes
//! `DIR/handoff.json` ([`Handoff`]: per channel the first packet it did not
//! write, the event it expected next, the losses it announced). The
//! destination's recorder waits for that file before it reads the region
//! (during the migration the region is half copied), then resumes from it.
//! Each part is a complete trace of its own with its own clock mapping and
//! a trace UUID of its own ([`part_uuid`]), so `babeltrace2 A B` reads
//! both side by side on one timeline. docs/migration.md has the procedure.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use std::path::PathBuf;

use serde_json::{json, Value};
use thiserror::Error;

pub use ivtrace_ctf::dir::HANDOFF_NAME;
pub use ivtrace_region::reader::{part_uuid, Handoff, Resumed};

/// A handoff is a few hundred bytes per channel; refuse anything huge.
const HANDOFF_MAX_BYTES: u64 = 16 << 20;
/// How often a destination looks for the handoff file.
const HANDOFF_POLL: Duration = Duration::from_millis(100);

/// What can fail in writing or reading a handoff, naming the file.
#[derive(Debug, Error)]
pub enum MigrationError {
    #[error("cannot encode the handoff: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is larger than {HANDOFF_MAX_BYTES} bytes: not a handoff", path.display())]
    TooLarge { path: PathBuf },
    #[error("{} is not an ivtrace handoff", path.display())]
    NotAHandoff {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

type Result<T, E = MigrationError> = std::result::Result<T, E>;

/// Writes `DIR/handoff.json` atomically (the destination polls for it).
pub fn write_handoff(dir: &ivtrace_ctf::OutDir, handoff: &Handoff) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(handoff).map_err(MigrationError::Encode)?;
    text.push(b'\n');
    dir.write_atomically(HANDOFF_NAME, &text)
        .map_err(|source| MigrationError::Write {
            path: dir.join(HANDOFF_NAME),
            source,
        })
}

/// Reads a handoff: `path` is the file itself or the directory of the part
/// that wrote it.
pub fn read_handoff(path: &Path) -> Result<Handoff> {
    let file = handoff_path(path);
    let f = ivtrace_ctf::outdir::open_regular(&file).map_err(|source| MigrationError::Open {
        path: file.clone(),
        source,
    })?;
    let mut text = Vec::new();
    if let Err(source) = f.take(HANDOFF_MAX_BYTES + 1).read_to_end(&mut text) {
        return Err(MigrationError::Read { path: file, source });
    }
    if text.len() as u64 > HANDOFF_MAX_BYTES {
        return Err(MigrationError::TooLarge { path: file });
    }
    serde_json::from_slice(&text)
        .map_err(|source| MigrationError::NotAHandoff { path: file, source })
}

fn handoff_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(HANDOFF_NAME)
    } else {
        path.to_path_buf()
    }
}

/// Waits until the handoff at `path` exists, then reads it; `go_on` is
/// asked between polls (false: give up, `Ok(None)`).
pub fn wait_for_handoff(path: &Path, go_on: &mut dyn FnMut() -> bool) -> Result<Option<Handoff>> {
    let file = handoff_path(path);
    let mut said = false;
    while !file.is_file() {
        if !said {
            eprintln!(
                "ivtrace: waiting for {} (the previous host's part ends when the migration is over)",
                file.display()
            );
            said = true;
        }
        if !go_on() {
            return Ok(None);
        }
        std::thread::sleep(HANDOFF_POLL);
    }
    read_handoff(&file).map(Some)
}

/// The sidecar's `migration` section: which part this is, how it began
/// (resumed from a handoff) and how it ended (handed off).
pub fn migration_section(
    part: u32,
    resumed: Option<(&Path, &Resumed)>,
    handed_off: Option<&Path>,
) -> Value {
    json!({
        "part": part,
        "resumed_from": resumed.map(|(p, _)| p.display().to_string()),
        "already_recorded_packets": resumed.map(|(_, r)| r.already_recorded),
        "handoff": handed_off.map(|p| p.display().to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoff_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let h = Handoff {
            region_uuid: "u".into(),
            part: 3,
            subbuf_size: 4096,
            nr_subbufs: 8,
            channels: vec![Default::default()],
            lost_no_channel: 5,
        };
        let out = ivtrace_ctf::OutDir::root(dir.path(), &Default::default()).unwrap();
        write_handoff(&out, &h).unwrap();
        assert_eq!(read_handoff(dir.path()).unwrap(), h);
        std::fs::write(dir.path().join(HANDOFF_NAME), b"{}").unwrap();
        assert!(read_handoff(dir.path()).is_err());
    }
}
