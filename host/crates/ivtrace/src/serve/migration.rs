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

use ivtrace_engine::migration::{read_handoff, Handoff};

use crate::serve::guest::{AwaitFormat, Request};

/// Where a destination's recording starts: the handoff file and its
/// contents.
pub type Resume = (PathBuf, Handoff);

/// Waits for `resume` (other requests are refused, status answered).
/// `None`: the peer left or the server stops; `Some(None)`: resume without
/// a handoff (from the region's positions alone).
pub(crate) fn await_resume(w: &mut AwaitFormat) -> Option<Option<Resume>> {
    let why = "incoming migration: waiting for `ivtrace ctl resume HANDOFF` (after the migration is over)";
    w.guest.set_state(why);
    w.guest.log(&format!("QEMU runs with -incoming; {why}"));
    loop {
        while let Ok(req) = w.guest.requests.try_recv() {
            let Request::Resume { from, reply } = req else {
                w.guest.refuse_without_region(req, why);
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
                    w.guest.log(&msg);
                    let _ = reply.send(Ok(msg));
                    return Some(resume);
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        if !w.idle_wait() {
            return None;
        }
    }
}

fn load(from: Option<PathBuf>) -> Result<Option<Resume>, String> {
    let Some(path) = from else {
        return Ok(None);
    };
    read_handoff(&path)
        .map(|h| Some((path, h)))
        .map_err(|e| format!("{e:#}"))
}
