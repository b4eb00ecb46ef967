//! A served guest that migrates (docs/migration.md).
//!
//! Source: `ivtrace ctl --guest NAME handoff` once the migration is over
//! ends the recording with a handoff: complete packets only (the guest
//! fills its open packets on the destination), `DIR/handoff.json`.
//!
//! Destination: a QEMU started with `-incoming` connects before the
//! migration copies the guest over, so its region fills with pages from
//! the source while the migration runs and holds nothing consistent until
//! it is over. Its recording therefore waits for `ivtrace ctl --guest NAME
//! resume FILE` (FILE: the source's handoff), sent once the migration is
//! over, and then continues the trace from the handoff.

use std::path::PathBuf;

use ivtrace_migration::{read_handoff, Handoff};

use crate::error::Report;
use crate::guest::{Guest, Request};

/// Where a destination's recording starts: the handoff file and its
/// contents.
pub type Resume = (PathBuf, Handoff);

/// Why an incoming guest is not recorded yet.
const WAITING: &str =
    "incoming migration: waiting for `ivtrace ctl resume HANDOFF` (after the migration is over)";

/// Says that the guest waits for `resume` (its state and the log).
pub(crate) fn announce_wait(g: &Guest) {
    g.set_state(WAITING);
    g.log(&format!("QEMU runs with -incoming; {WAITING}"));
}

/// One look at the guest's requests (the drain pool parks the guest
/// between looks): other requests are refused, status answered.
/// `None`: no `resume` yet; `Some(None)`: resume without a handoff (from
/// the region's positions alone).
pub(crate) fn take_resume(g: &Guest) -> Option<Option<Resume>> {
    while let Ok(req) = g.requests.try_recv() {
        let Request::Resume { from, reply } = req else {
            g.refuse_without_region(req, WAITING);
            continue;
        };
        match load(from) {
            Ok(resume) => {
                let msg = match &resume {
                    Some((p, h)) => {
                        format!("resuming as part {} from {}", h.part + 1, p.display())
                    }
                    None => "resuming from the region's positions, without a handoff: packets \
                             the previous host wrote may be written again"
                        .to_string(),
                };
                g.log(&msg);
                let _ = reply.send(Ok(msg));
                return Some(resume);
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }
    None
}

fn load(from: Option<PathBuf>) -> Result<Option<Resume>, String> {
    let Some(path) = from else {
        return Ok(None);
    };
    read_handoff(&path)
        .map(|h| Some((path, h)))
        .map_err(|e| format!("{}", Report(&e)))
}
