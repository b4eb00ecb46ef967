//! Waiting for a region to become readable: the file may not exist yet,
//! may not be formatted yet, or may be in the middle of a reformat.

use std::path::Path;
use std::time::{Duration, Instant};

use ivtrace_region::{Access, Region, RegionError};

use crate::error::EngineError;

/// A formatted header whose size disagrees with the file may be a region
/// being re-created (truncated, then reformatted); past this it is not.
const SIZE_MISMATCH_GRACE: Duration = Duration::from_secs(2);

/// What a front end does while there is no region to read.
pub trait RegionWait {
    /// Opening failed with `err`. `transient`: the file may still appear
    /// or be formatted (missing, too small, not formatted, a size mismatch
    /// younger than two seconds). Tell the user, if the front end does;
    /// return the error to give up ([`EngineError::Region`] then names the
    /// region).
    fn not_yet(&mut self, err: RegionError, transient: bool) -> Result<(), RegionError>;

    /// Waits before the next attempt (answering whatever the front end
    /// answers meanwhile). False: stop waiting.
    fn pause(&mut self) -> bool;
}

/// Opens the region at `path` read-write once it is formatted (and its
/// uuid is not `skip`: the region a previous recording of this file read).
/// None if the front end stopped waiting.
pub fn wait_for_region(
    path: &Path,
    skip: Option<[u8; 16]>,
    front: &mut dyn RegionWait,
) -> Result<Option<Region>, EngineError> {
    let mut mismatch_since: Option<Instant> = None;
    loop {
        match Region::open(path, Access::ReadWrite) {
            Ok(r) if Some(r.header().uuid) != skip => return Ok(Some(r)),
            Ok(_) => {}
            Err(e) => {
                let transient = is_transient(&e, &mut mismatch_since);
                front
                    .not_yet(e, transient)
                    .map_err(|source| EngineError::Region {
                        path: path.to_path_buf(),
                        source,
                    })?;
            }
        }
        if !front.pause() {
            return Ok(None);
        }
    }
}

/// Errors that mean "not yet": the file may still be created or formatted.
fn is_transient(e: &RegionError, mismatch_since: &mut Option<Instant>) -> bool {
    match e {
        RegionError::Missing { .. } | RegionError::TooSmall { .. } | RegionError::NotFormatted => {
            true
        }
        RegionError::SizeMismatch { .. } => {
            mismatch_since.get_or_insert_with(Instant::now).elapsed() < SIZE_MISMATCH_GRACE
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_testutil::RegionBuilder;

    /// Records what the waiter saw; stops after `patience` pauses.
    struct Patient {
        seen: Vec<(String, bool)>,
        patience: u32,
    }

    impl RegionWait for Patient {
        fn not_yet(&mut self, err: RegionError, transient: bool) -> Result<(), RegionError> {
            self.seen.push((format!("{err:?}"), transient));
            Ok(())
        }
        fn pause(&mut self) -> bool {
            self.patience = self.patience.saturating_sub(1);
            self.patience > 0
        }
    }

    #[test]
    fn missing_and_unformatted_regions_are_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let mut w = Patient {
            seen: Vec::new(),
            patience: 2,
        };
        assert!(wait_for_region(&path, None, &mut w).unwrap().is_none());
        std::fs::write(&path, vec![0u8; 1 << 16]).unwrap();
        w.patience = 2;
        assert!(wait_for_region(&path, None, &mut w).unwrap().is_none());
        assert!(w.seen[0].0.starts_with("Missing") && w.seen[0].1);
        assert!(w.seen.last().unwrap().0.starts_with("NotFormatted"));
        let bytes = RegionBuilder::new(1, 2, 4096).build();
        std::fs::write(&path, &bytes).unwrap();
        let r = wait_for_region(&path, None, &mut w).unwrap().unwrap();
        let uuid = r.header().uuid;
        w.patience = 2;
        let again = wait_for_region(&path, Some(uuid), &mut w).unwrap();
        assert!(again.is_none(), "the region already read is skipped");
    }

    #[test]
    fn broken_headers_are_not_transient() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let mut bytes = RegionBuilder::new(1, 2, 4096).build();
        bytes[0] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let mut w = Patient {
            seen: Vec::new(),
            patience: 1,
        };
        assert!(wait_for_region(&path, None, &mut w).unwrap().is_none());
        assert_eq!(w.seen.len(), 1);
        assert!(w.seen[0].0.starts_with("BadMagic") && !w.seen[0].1);
    }
}
