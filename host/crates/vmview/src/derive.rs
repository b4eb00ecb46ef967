//! The VM view of a finished recording: reads the host trace and the guest
//! kernel trace back, runs the [`Timeline`] over the host events in time
//! order, attributes each output to the guest thread on its vCPU, and
//! writes `DIR/vm/` (intervals and hypercalls, guest clock) and the vmsync
//! events into the host trace (`host_vmsync_cpuN`), which must still be
//! open. Memory stays bounded: every input is streamed, the outputs are
//! written as they come.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Serialize;

use ivtrace_ctf::host_trace::{HostTrace, STREAM_KERNEL};
use ivtrace_ctf::vm::{vm_metadata, VmTraceDesc};
use ivtrace_ctf::{EnvValue, OutDir};
use ivtrace_region::classes::StreamClasses;
use ivtrace_time::ClockMapping;
use ivtrace_tracefs::statedump::{vmsync_payload, VMSYNC_GH_HOST, VMSYNC_HG_HOST};

use crate::attribute::Attributor;
use crate::classes::{self, class_of};
use crate::error::{Result, VmViewError};
use crate::input::{guest_switches, Errors, GuestSwitches, HostMerge};
use crate::model::{GuestThread, Hypercall, Interval, Output, State, SyncDir, Vmsync};
use crate::selfcheck::{Checker, SelfCheck};
use crate::stats::{Aggregator, Summary};
use crate::timeline::{Config, Counters, Timeline};

/// The guest traces of the recording, as their writer knows them.
pub struct GuestTraces<'a> {
    /// The output directory (`DIR`: `DIR/kernel/` is read, `DIR/vm/` written
    /// through its descriptor, as every trace directory: docs/hardening.md).
    pub root: &'a OutDir,
    /// The expanded kernel trace's event classes.
    pub kernel_classes: &'a StreamClasses,
    /// The guest clock's final mapping and its CTF clock UUID.
    pub clock: &'a ClockMapping,
    pub clock_uuid: &'a str,
    /// The guest's name (`hostname` of its traces).
    pub hostname: &'a str,
}

/// Which threads are the guest's vCPUs.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The recorded QEMU.
    pub qemu_pid: Option<i32>,
    /// Thread id -> vCPU, when known from outside (QMP).
    pub vcpus: HashMap<i32, u32>,
    /// How the vCPU threads are known, for the trace's env and the summary.
    pub vcpu_source: String,
}

/// What the derivation did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Derived {
    /// `DIR/vm`, if anything was written.
    pub dir: Option<PathBuf>,
    /// (host tid, vCPU) of every vCPU thread found.
    pub vcpu_threads: Vec<(i32, u32)>,
    pub vcpu_source: String,
    pub host_records: u64,
    pub guest_cpus: Vec<u32>,
    pub intervals: u64,
    pub hypercalls: u64,
    pub vmsync: u64,
    /// vmsync events the host trace has no class for.
    pub vmsync_dropped: u64,
    pub counters: Counters,
    /// Streams that could not be read to their end, and why.
    pub read_errors: Vec<String>,
    pub summary: Summary,
    /// The clock mapping checked on cause -> effect pairs of the traces.
    pub self_check: Option<SelfCheck>,
    /// KVM's changes of the vCPUs' TSC offsets the host trace shows
    /// (`kvm_write_tsc_offset`), for the versioned clock mapping.
    pub tsc_writes: Vec<ivtrace_time::versioned::TscWrite>,
}

/// An interval's end event waiting to be written: (host ns, guest tid,
/// payload).
type PendingEnd = (u64, i32, Vec<u8>);

/// `DIR/vm/` being written: one stream per vCPU, each interval's end
/// event kept until an output at or after it comes (a hypercall lies
/// inside the hypervisor interval that precedes it).
struct VmWriter {
    trace: HostTrace,
    streams: HashMap<u32, usize>,
    /// Per vCPU: (host ns, guest tid, payload) of the pending end event.
    pending_end: HashMap<u32, PendingEnd>,
}

impl VmWriter {
    fn create(g: &GuestTraces, env: Vec<(String, EnvValue)>) -> Result<VmWriter> {
        let text = vm_metadata(&vm_desc(g, env), &classes::classes());
        let trace = HostTrace::create_with_metadata(g.root, "vm", "vm", text, classes::classes())?;
        Ok(VmWriter {
            trace,
            streams: HashMap::new(),
            pending_end: HashMap::new(),
        })
    }

    fn write(&mut self, vcpu: u32, ns: u64, class: u32, tid: i32, payload: &[u8]) -> Result<()> {
        if let Some(end) = self.pending_end.get(&vcpu) {
            if end.0 <= ns {
                let (at, t, p) = self.pending_end.remove(&vcpu).expect("just seen");
                self.write(vcpu, at, classes::INTERVAL_END, t, &p)?;
            }
        }
        let stream = match self.streams.get(&vcpu) {
            Some(&s) => s,
            None => {
                let s = self
                    .trace
                    .add_stream(STREAM_KERNEL, vcpu, &format!("vm_vcpu{vcpu}"))?;
                self.streams.insert(vcpu, s);
                s
            }
        };
        // The guest kernel trace's time base: nanoseconds since the epoch
        // on the host's time base, what `ns` is.
        Ok(self.trace.event(stream, class, ns, tid, payload)?)
    }

    fn interval(&mut self, i: &Interval, g: &GuestThread) -> Result<()> {
        let class = class_of(i.state);
        self.write(
            i.vcpu,
            i.start,
            class,
            g.tid,
            &classes::interval_payload(i, g),
        )?;
        for (task, ns) in &i.ran {
            self.write(
                i.vcpu,
                i.start,
                classes::HOST_RAN,
                g.tid,
                &classes::host_ran_payload(task, *ns),
            )?;
        }
        if i.ran_other_ns > 0 {
            let others = crate::model::Task {
                tid: classes::OTHER_TASKS,
                comm: crate::model::comm("(others)"),
            };
            let p = classes::host_ran_payload(&others, i.ran_other_ns);
            self.write(i.vcpu, i.start, classes::HOST_RAN, g.tid, &p)?;
        }
        let end = (i.end, g.tid, classes::interval_end_payload(i));
        if let Some((at, t, p)) = self.pending_end.insert(i.vcpu, end) {
            // Two intervals of a vCPU never overlap; an earlier end is due.
            self.write(i.vcpu, at, classes::INTERVAL_END, t, &p)?;
        }
        Ok(())
    }

    fn hypercall(&mut self, h: &Hypercall, g: &GuestThread) -> Result<()> {
        self.write(
            h.vcpu,
            h.ts,
            classes::HYPERCALL,
            g.tid,
            &classes::hypercall_payload(h, g),
        )
    }

    /// Writes what is pending and the final metadata (with `env`).
    fn finish(mut self, g: &GuestTraces, env: Vec<(String, EnvValue)>) -> Result<PathBuf> {
        let mut ends: Vec<(u32, PendingEnd)> = self.pending_end.drain().collect();
        ends.sort_by_key(|e| e.0);
        for (vcpu, (at, t, p)) in ends {
            self.write(vcpu, at, classes::INTERVAL_END, t, &p)?;
        }
        let text = vm_metadata(&vm_desc(g, env), &classes::classes());
        self.trace.set_metadata(text)?;
        let dir = self.trace.dir().to_path_buf();
        self.trace.finish()?;
        Ok(dir)
    }
}

fn vm_desc<'a>(g: &'a GuestTraces, env: Vec<(String, EnvValue)>) -> VmTraceDesc<'a> {
    VmTraceDesc {
        hostname: g.hostname,
        trace_name: "vm",
        clock: g.clock,
        clock_uuid: g.clock_uuid,
        env,
    }
}

/// Where each output goes.
struct Sink<'a> {
    guest: &'a GuestTraces<'a>,
    env: Vec<(String, EnvValue)>,
    attr: Attributor<GuestSwitches>,
    vm: Option<VmWriter>,
    host: &'a mut HostTrace,
    vmsync_streams: HashMap<u32, usize>,
    agg: Aggregator,
    checker: Checker,
    done: Derived,
}

impl Sink<'_> {
    fn vm(&mut self) -> Result<&mut VmWriter> {
        if self.vm.is_none() {
            self.vm = Some(VmWriter::create(self.guest, self.env.clone())?);
        }
        Ok(self.vm.as_mut().expect("just created"))
    }

    fn take(&mut self, o: Output) -> Result<()> {
        match o {
            Output::Interval(i) => {
                self.checker.interval(&i);
                let g = self.attr.thread_at(i.vcpu, i.start);
                self.agg.interval(&i, &g);
                self.done.intervals += 1;
                self.vm()?.interval(&i, &g)
            }
            Output::Hypercall(h) => {
                let g = self.attr.thread_at(h.vcpu, h.ts);
                self.agg.hypercall(&h);
                self.done.hypercalls += 1;
                self.vm()?.hypercall(&h, &g)
            }
            Output::Vmsync(v) => self.vmsync(&v),
        }
    }

    fn vmsync(&mut self, v: &Vmsync) -> Result<()> {
        let class = match v.dir {
            SyncDir::GuestToHost => VMSYNC_GH_HOST,
            SyncDir::HostToGuest => VMSYNC_HG_HOST,
        };
        if self.host.class(class).is_none() {
            self.done.vmsync_dropped += 1;
            return Ok(());
        }
        let stream = match self.vmsync_streams.get(&v.cpu) {
            Some(&s) => s,
            None => {
                let name = format!("host_vmsync_cpu{}", v.cpu);
                let s = self.host.add_stream(STREAM_KERNEL, v.cpu, &name)?;
                self.vmsync_streams.insert(v.cpu, s);
                s
            }
        };
        self.done.vmsync += 1;
        let p = vmsync_payload(v.cnt, v.vm_uid);
        Ok(self.host.event(stream, class, v.ts, v.tid, &p)?)
    }
}

fn base_env(req: &Request) -> Vec<(String, EnvValue)> {
    vec![
        (
            "ivtrace_qemu_pid".into(),
            EnvValue::Int(req.qemu_pid.unwrap_or(0) as i64),
        ),
        (
            "ivtrace_vcpu_source".into(),
            EnvValue::Str(req.vcpu_source.clone()),
        ),
    ]
}

/// `tid:vcpu` pairs as the trace's env says them.
fn threads_env(threads: &[(i32, u32)]) -> String {
    let v: Vec<String> = threads.iter().map(|(t, c)| format!("{c}:{t}")).collect();
    v.join(" ")
}

/// Derives the VM view of the recording in `guest.root` from the open
/// host trace `host` (flushed first; vmsync streams are added to it).
pub fn derive(guest: &GuestTraces, host: &mut HostTrace, req: &Request) -> Result<Derived> {
    host.flush()?;
    let host_dir = host.dir().to_path_buf();
    let classes = host.classes().to_vec();
    let mut merge =
        HostMerge::open(&host_dir, &classes).map_err(|source| VmViewError::HostTrace {
            path: host_dir.clone(),
            source,
        })?;
    let errors = Errors::default();
    let kernel_dir = guest.root.path().join("kernel");
    let switches = if kernel_dir.is_dir() {
        guest_switches(&kernel_dir, guest.kernel_classes, &errors).map_err(|source| {
            VmViewError::GuestTrace {
                path: kernel_dir.clone(),
                source,
            }
        })?
    } else {
        Vec::new()
    };
    let mut sink = Sink {
        guest,
        env: base_env(req),
        done: Derived {
            guest_cpus: switches.iter().map(|s| s.0).collect(),
            vcpu_source: req.vcpu_source.clone(),
            ..Derived::default()
        },
        attr: Attributor::new(switches),
        vm: None,
        host,
        vmsync_streams: HashMap::new(),
        agg: Aggregator::default(),
        checker: Checker::default(),
    };
    let mut timeline = Timeline::new(Config {
        qemu_pid: req.qemu_pid,
        vcpus: req.vcpus.clone(),
    });
    let mut out = Vec::new();
    while let Some(ev) = merge.next_event() {
        timeline.push(&ev, &mut out);
        for o in out.drain(..) {
            sink.take(o)?;
        }
    }
    timeline.finish(None, &mut out);
    for o in out.drain(..) {
        sink.take(o)?;
    }
    finish(sink, &timeline, merge, &errors)
}

fn finish(
    mut sink: Sink,
    timeline: &Timeline,
    merge: HostMerge,
    errors: &Errors,
) -> Result<Derived> {
    let mut done = std::mem::take(&mut sink.done);
    let checker = std::mem::take(&mut sink.checker);
    done.self_check = Some(self_check(checker, sink.guest, sink.host, errors));
    let (dir, classes) = (sink.host.dir(), sink.host.classes());
    done.tsc_writes = crate::input::tsc_writes(dir, classes).unwrap_or_else(|e| {
        errors.borrow_mut().push(format!("{}: {e}", dir.display()));
        Vec::new()
    });
    done.vcpu_threads = timeline.vcpu_threads();
    done.counters = timeline.counters.clone();
    done.host_records = merge.records;
    done.read_errors = merge.errors();
    done.read_errors.extend(errors.borrow().iter().cloned());
    done.summary = sink.agg.summary();
    if let Some(vm) = sink.vm.take() {
        let mut env = sink.env.clone();
        env.push((
            "ivtrace_vcpu_threads".into(),
            EnvValue::Str(threads_env(&done.vcpu_threads)),
        ));
        done.dir = Some(vm.finish(sink.guest, env)?);
    }
    Ok(done)
}

/// The self-check ([`crate::selfcheck`]): the guest kernel trace read once
/// more, every event of each CPU against its vCPU's off-CPU stretches, and
/// the doorbells rung against those serve received.
fn self_check(mut c: Checker, g: &GuestTraces, host: &HostTrace, errors: &Errors) -> SelfCheck {
    let bound = g.clock.error_ns;
    let kernel_dir = g.root.path().join("kernel");
    let doorbell = g
        .kernel_classes
        .iter()
        .find(|k| k.name == "ivtrace_doorbell")
        .map(|k| k.id);
    let mut rang = Vec::new();
    let walks = match kernel_dir.is_dir() {
        true => guest_switches(&kernel_dir, g.kernel_classes, errors).unwrap_or_else(|e| {
            errors
                .borrow_mut()
                .push(format!("{}: {e}", kernel_dir.display()));
            Vec::new()
        }),
        false => Vec::new(),
    };
    for (cpu, mut walk) in walks {
        let events = std::iter::from_fn(|| walk.next_event()).map(|e| {
            if Some(e.class) == doorbell {
                rang.push(e.ts);
            }
            e.ts
        });
        c.guest_cpu(cpu, events, bound);
    }
    let received = crate::input::doorbells_received(host.dir(), host.classes()).unwrap_or_default();
    c.doorbells(rang, &received, bound);
    c.finish(bound)
}

/// One line per vCPU of what the VM view found (the recorders' summary).
pub fn describe(d: &Derived) -> Vec<String> {
    let ms = |ns: u64| ns as f64 / 1e6;
    let mut lines: Vec<String> = d
        .summary
        .vcpus
        .iter()
        .map(|v| {
            let untraced = match v.untraced_count {
                0 => String::new(),
                n => format!(
                    " (+ at most {:.3} ms in {n} waits whose end the host kernel did not trace)",
                    ms(v.untraced_max_ns)
                ),
            };
            format!(
                "vCPU {} (host thread {:?}): preempted {:.3} ms in {} intervals (longest {:.3} ms){untraced}, \
                 blocked {:.3} ms, in the hypervisor {:.3} ms ({} exits)",
                v.vcpu,
                v.host_tids,
                ms(v.preempted_ns),
                v.preempted_count,
                ms(v.preempted_longest_ns),
                ms(v.blocked_ns),
                ms(v.hypervisor_ns),
                v.exits
            )
        })
        .collect();
    if let Some(t) = d.summary.guest_threads.first() {
        lines.push(format!(
            "guest thread that lost the most: {} (tid {}) {:.3} ms preempted",
            t.comm,
            t.tid,
            ms(t.preempted_ns)
        ));
    }
    if d.vcpu_threads.is_empty() {
        lines.push(format!(
            "no vCPU thread found ({}): name QEMU's threads with -name NAME,debug-threads=on",
            d.vcpu_source
        ));
    }
    lines
}

/// State names for the summary and reports.
pub fn state_name(s: State) -> &'static str {
    s.name()
}
