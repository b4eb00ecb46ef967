//! `DIR/host/` of one recording: the host trace (ivtrace-ctf's
//! `HostTrace`, on the host time base) and, when asked, the host's own
//! kernel events of the guest's QEMU in it (ivtrace-tracefs). `ivtrace
//! record --host-events` and `ivtrace serve` set it up the same way; serve
//! adds its own stream of what it observed.

use std::path::{Path, PathBuf};

use ivtrace_ctf::outdir::OutDir;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};

use ivtrace_ctf::host::{HostTrace, HostTraceDesc};
use ivtrace_ctf::{CtfError, EnvValue};
use ivtrace_region::EventClass;
use ivtrace_tracefs::host::{HostEventStats, HostEvents, Running};

use crate::session::this_host;

/// The host trace of a recording, shared with the host events' reader.
pub struct HostSide {
    trace: Arc<Mutex<HostTrace>>,
    events: Option<Running>,
    dir: PathBuf,
}

impl HostSide {
    /// Creates `out/host` for guest `guest` (its trace is `<guest>-host`)
    /// with `classes`, which must include those of the host events to be
    /// started (`HostEvents::prepare` adds them).
    pub fn create(
        out: &OutDir,
        guest: &str,
        env: Vec<(String, EnvValue)>,
        classes: Vec<EventClass>,
    ) -> Result<HostSide, CtfError> {
        let desc = HostTraceDesc {
            hostname: &this_host(),
            trace_name: &format!("{guest}-host"),
            error_ns: ivtrace_time::timebase::base().error_ns,
            env,
        };
        // "host", or "host-2"... when a resumed recording has one already.
        let mut k = 1;
        let (trace, dir) = loop {
            let name = if k == 1 {
                "host".to_string()
            } else {
                format!("host-{k}")
            };
            match HostTrace::create(out, &name, &desc, classes.clone()) {
                Err(CtfError::Create { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists && k < 100 =>
                {
                    k += 1
                }
                r => break (r?, out.join(&name)),
            }
        };
        Ok(HostSide {
            trace: Arc::new(Mutex::new(trace)),
            events: None,
            dir,
        })
    }

    /// The trace, for the front end's own streams.
    pub fn trace(&self) -> &Arc<Mutex<HostTrace>> {
        &self.trace
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts reading the prepared host events into the trace.
    pub fn start_events(&mut self, prepared: HostEvents) -> Result<()> {
        if self.events.is_some() {
            bail!("host events are already being recorded");
        }
        self.events = Some(prepared.start(Arc::clone(&self.trace))?);
        Ok(())
    }

    /// Stops the host events (reading what is left); their statistics,
    /// None if none were started.
    pub fn stop_events(&mut self) -> Option<Result<HostEventStats>> {
        self.events.take().map(Running::stop)
    }

    /// Stops the host events if still running, writes every open packet
    /// and closes the trace; the events written per stream.
    pub fn finish(mut self) -> Result<Vec<u64>> {
        if let Some(Err(e)) = self.stop_events() {
            return Err(e);
        }
        match Arc::try_unwrap(self.trace) {
            Ok(m) => Ok(m.into_inner().expect("not poisoned").finish()?),
            Err(shared) => {
                shared.lock().expect("not poisoned").flush()?;
                Ok(Vec::new())
            }
        }
    }
}
