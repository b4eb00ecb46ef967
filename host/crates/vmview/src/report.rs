//! The VM view read back for `ivtrace report`: `DIR/vm/`'s events
//! (the classes of [`crate::classes`]) summed into the same [`Summary`]
//! the derivation printed at the end of the recording.

use std::path::Path;

use serde::Serialize;

use ivtrace_ctf::read::Trace;

use crate::classes::{read_host_ran, read_hypercall, read_interval};
use crate::error::{Result, VmViewError};
use crate::stats::{Aggregator, Summary};

/// What `DIR/vm/` holds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VmReport {
    pub dir: String,
    pub events: u64,
    pub summary: Summary,
    /// Streams that did not read to their end, and why.
    pub errors: Vec<String>,
}

/// Reads every stream of the VM view in `dir`.
pub fn summarize(dir: &Path) -> Result<VmReport> {
    let mut agg = Aggregator::default();
    let mut r = VmReport {
        dir: dir.display().to_string(),
        ..VmReport::default()
    };
    let trace = Trace::open(dir).map_err(|source| VmViewError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let streams = trace.streams().map_err(|source| VmViewError::List {
        path: dir.to_path_buf(),
        source,
    })?;
    for mut s in streams {
        loop {
            let rec = match s.next_record() {
                Ok(Some(rec)) => rec,
                Ok(None) => break,
                Err(e) => {
                    r.errors.push(e.to_string());
                    break;
                }
            };
            r.events += 1;
            // Durations are in the payloads; times (in the stream's ticks, a
            // monotonic image of serve's ns) only order a task's names.
            if let Some((i, g)) = read_interval(&rec, rec.cpu(), rec.ts) {
                agg.interval(&i, &g);
            } else if let Some((t, ns)) = read_host_ran(&rec) {
                agg.host_ran(&t, rec.ts, ns);
            } else if let Some((h, _)) = read_hypercall(&rec, 0) {
                agg.hypercall(&h);
            }
        }
    }
    r.summary = agg.summary();
    Ok(r)
}
