//! `DIR/host/` of one recording: the host trace (ivtrace-ctf's
//! `HostTrace`, on the host time base) and, when asked, the host's own
//! kernel events of the guest's QEMU in it (ivtrace-tracefs). `ivtrace
//! record --host-events` and `ivtrace serve` set it up the same way; serve
//! adds its own stream of what it observed. With host events, the end of
//! the recording derives the VM view from them and the guest kernel
//! trace (ivtrace-vmview: `DIR/vm/`, vmsync events in `DIR/host/`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ivtrace_ctf::outdir::OutDir;
use std::sync::{Arc, Mutex};

use crate::error::EngineError;

type Result<T, E = EngineError> = std::result::Result<T, E>;

use ivtrace_ctf::host_trace::{HostTrace, HostTraceDesc};
use ivtrace_ctf::sidecar::HostLost;
use ivtrace_ctf::{ClockMapping, CtfError, CtfWriter, EnvValue, TraceSink};
use ivtrace_region::classes::StreamClasses;
use ivtrace_region::{abi, EventClass, EventClasses};
use ivtrace_tracefs::host_events::{HostEventStats, HostEvents, Running};
use ivtrace_vmview::derive::{derive, Derived, GuestTraces, Request};

use crate::session::this_host;

/// The host trace of a recording, shared with the host events' reader.
pub struct HostSide {
    trace: Arc<Mutex<HostTrace>>,
    events: Option<Running>,
    dir: PathBuf,
    /// The QEMU whose host events were started.
    qemu_pid: Option<i32>,
}

/// What the VM view needs to know of a finished recording's guest traces.
pub struct GuestOutput {
    pub root: OutDir,
    /// The expanded kernel trace's classes.
    pub kernel_classes: StreamClasses,
    pub clock: ClockMapping,
    pub clock_uuid: String,
    pub hostname: String,
}

impl GuestOutput {
    /// From the guest traces' writer once it finished (kernel expanded).
    pub fn of(writer: &CtfWriter, classes: &EventClasses, clock: &ClockMapping) -> GuestOutput {
        GuestOutput {
            root: writer.root().clone(),
            kernel_classes: writer
                .output_classes(abi::IVT_STREAM_KERNEL, classes)
                .clone(),
            clock: clock.clone(),
            clock_uuid: writer.clock_uuid().to_string(),
            hostname: writer.host_name().to_string(),
        }
    }
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
            qemu_pid: None,
        })
    }

    /// The trace, for the front end's own streams.
    pub fn trace(&self) -> &Arc<Mutex<HostTrace>> {
        &self.trace
    }

    /// Puts `sink` beside the trace's directory ([`HostTrace::add_sink`]).
    pub fn add_sink(&self, sink: Box<dyn TraceSink>) -> Result<(), CtfError> {
        let mut trace = self.trace.lock().unwrap_or_else(|p| p.into_inner());
        trace.add_sink(sink)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts reading the prepared host events into the trace.
    pub fn start_events(&mut self, prepared: HostEvents) -> Result<()> {
        if self.events.is_some() {
            return Err(EngineError::HostEventsRunning);
        }
        self.qemu_pid = Some(prepared.pid());
        self.events = Some(prepared.start(Arc::clone(&self.trace))?);
        Ok(())
    }

    /// Stops the host events (reading what is left); their statistics,
    /// None if none were started.
    pub fn stop_events(&mut self) -> Option<Result<HostEventStats>> {
        self.events.take().map(|r| Ok(r.stop()?))
    }

    /// The VM view of the recording, if host events were recorded: call it
    /// once the guest traces are finished (the kernel trace expanded) and
    /// the host events stopped, before [`HostSide::finish`]. `vcpus` maps
    /// vCPU thread ids to vCPU indexes when they are known from outside
    /// (QMP); else the threads' names (`debug-threads=on`) or KVM's
    /// `vcpu_id` tell. `source` says which, for the trace and the summary.
    pub fn vm_view(
        &mut self,
        guest: &GuestOutput,
        vcpus: HashMap<i32, u32>,
        source: &str,
    ) -> Option<Result<Derived>> {
        let pid = self.qemu_pid?;
        if self.events.is_some() {
            return Some(Err(EngineError::HostEventsNotStopped));
        }
        let traces = GuestTraces {
            root: &guest.root,
            kernel_classes: &guest.kernel_classes,
            clock: &guest.clock,
            clock_uuid: &guest.clock_uuid,
            hostname: &guest.hostname,
        };
        let req = Request {
            qemu_pid: Some(pid),
            vcpus,
            vcpu_source: source.to_string(),
        };
        let mut trace = self.trace.lock().expect("not poisoned");
        Some(derive(&traces, &mut trace, &req).map_err(EngineError::from))
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

/// The sidecar's account of what the host trace lost.
pub fn host_lost(stats: &HostEventStats) -> HostLost {
    HostLost {
        missed: stats.missed,
        missed_uncounted_pages: stats.missed_uncounted_pages,
    }
}

/// How the VM view knows the vCPU threads.
pub fn vcpu_source(qmp: bool, named: bool) -> &'static str {
    match (qmp, named) {
        (true, _) => "qmp query-cpus-fast",
        (false, true) => "thread names (CPU n/...)",
        (false, false) => "kvm_entry vcpu_id only (no CPU n/... thread names)",
    }
}
