//! The derivation itself: host events in time order in, the VM view out.
//! A pure state machine (no I/O, no clock): [`Timeline::push`] one event
//! at a time, [`Timeline::finish`] at the end of the trace.
//!
//! Every vCPU thread of the recorded QEMU is, at any instant, in one of
//! four states, and every instant not spent running guest code becomes
//! part of exactly one interval:
//!
//! ```text
//!            sched_switch out (R)                 sched_switch in
//!   on CPU ───────────────────────> runnable ─────────────────────> on CPU
//!     │       (interval: preempted, from the switch-out or the wake-up)
//!     │ sched_switch out (S/D)            sched_wakeup
//!     └──────────────────────> sleeping ─────────────> runnable
//!             (interval: blocked, until the wake-up)
//!   on CPU between kvm_exit and kvm_entry: interval "hypervisor" (KVM)
//! ```
//!
//! Preempted time is what the kernel counts as the thread's run-queue
//! wait (`/proc/PID/task/TID/schedstat`, second field): from a preemption
//! or a wake-up to the next switch-in. An exit that the thread leaves the
//! CPU in (a HLT that sleeps, a preemption inside KVM) is cut into
//! hypervisor, blocked and preempted pieces that all carry the exit, so
//! the pieces of one exit add up to its kvm_exit..kvm_entry time.
//!
//! Which threads: those of the recorded QEMU (`lttng_statedump_process_state`
//! says each thread's process) that are vCPU threads: named `CPU n/TCG` or
//! `CPU n/KVM` (QEMU's `debug-threads=on`), given from outside (the
//! caller's `vcpus` map, e.g. from QMP's `query-cpus-fast`), or seen
//! running a vCPU (`kvm_entry`'s `vcpu_id`).
//!
//! Events lost by tracefs, or context switches the host kernel does not
//! trace, show up as transitions that do not fit the state. A runnable
//! thread seen leaving its CPU again ran in between: its wait ended at an
//! unknown moment, so that stretch becomes an "untraced" interval, an upper
//! bound of the unseen wait. Other misfits are counted and the state is
//! resynchronized; nothing is guessed.

use std::collections::HashMap;

use ivtrace_region::abi::IVT_HC_VMSYNC;
use serde::Serialize;

use crate::model::{
    Comm, ExitRef, HostEvent, HostKind, Hypercall, Interval, Output, State, SyncDir, Task, Vmsync,
    RAN_MAX,
};

/// Who ran on a CPU when the trace does not show it (the host trace keeps
/// only the context switches of the vCPU threads).
pub const NOT_TRACED: Task = Task {
    tid: -3,
    comm: *b"(not traced)\0\0\0\0",
};

/// Outputs held back while a hypercall waits for its kvm_entry (so the
/// aggregated event can take its place in time order) are at most this many;
/// beyond, they are released as they are (counted).
const HELD_MAX: usize = 4096;

/// Which threads to follow.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Only threads of this process (from the state dump); None: any.
    pub qemu_pid: Option<i32>,
    /// Thread id -> vCPU index known from outside.
    pub vcpus: HashMap<i32, u32>,
}

/// What did not add up, and how much there was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub events: u64,
    /// Transitions that do not fit the thread's state (events tracefs lost
    /// or the host kernel did not trace, e.g. a wake-up).
    pub inconsistent: u64,
    /// A runnable thread switched out again without a traced switch-in:
    /// the host kernel did not trace that context switch (seen on this
    /// project's machines, whose kernel does not trace switches away from
    /// the idle task on one CPU, nor from some of its own agent's
    /// threads). Each becomes a `State::Untraced` interval.
    pub untraced_switch_ins: u64,
    pub exits: u64,
    /// A kvm_exit followed by another kvm_exit, or by the end of the trace.
    pub exits_without_entry: u64,
    pub entries_without_exit: u64,
    pub hypercalls: u64,
    pub hypercalls_without_exit: u64,
    /// Outputs released out of order because too many were held.
    pub held_overflow: u64,
}

/// Time of other tasks on the CPU a runnable vCPU thread waits for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Ran {
    list: Vec<(Task, u64)>,
    other: u64,
}

impl Ran {
    fn add(&mut self, t: Task, ns: u64) {
        if let Some(e) = self.list.iter_mut().find(|(x, _)| x.tid == t.tid) {
            e.1 += ns;
        } else if self.list.len() < RAN_MAX {
            self.list.push((t, ns));
        } else {
            self.other += ns;
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Run {
    Unknown,
    OnCpu {
        cpu: u32,
        since: u64,
    },
    Runnable {
        cpu: u32,
        since: u64,
        taken_by: Option<Task>,
        ran: Ran,
    },
    Sleeping {
        cpu: u32,
        since: u64,
    },
}

/// A kvm_exit waiting for its kvm_entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingExit {
    ts: u64,
    cpu: u32,
    reason: u32,
    isa: u32,
    rip: u64,
    /// A piece of it was already emitted.
    cut: bool,
    /// (ts, nr, args) of its kvm_hypercall.
    hypercall: Option<(u64, u64, [u64; 4])>,
}

impl PendingExit {
    fn exit_ref(&self, first: bool) -> ExitRef {
        ExitRef {
            isa: self.isa,
            reason: self.reason,
            guest_rip: self.rip,
            first,
        }
    }
}

#[derive(Debug, Clone)]
struct Thread {
    tid: i32,
    vcpu: u32,
    run: Run,
    exit: Option<PendingExit>,
    /// The vmsync answer owed at the next kvm_entry: (cnt, vm_uid).
    sync_reply: Option<(u32, u64)>,
    /// Outputs held until the pending hypercall's kvm_entry.
    held: Option<Vec<Output>>,
}

/// `CPU <n>/<accel>`: QEMU's name of a vCPU thread.
pub fn vcpu_of_comm(c: &Comm) -> Option<u32> {
    let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
    let s = std::str::from_utf8(&c[..end]).ok()?;
    let (n, accel) = s.strip_prefix("CPU ")?.split_once('/')?;
    (!accel.is_empty()).then_some(())?;
    n.parse().ok()
}

fn start_of(o: &Output) -> u64 {
    match o {
        Output::Interval(i) => i.start,
        Output::Hypercall(h) => h.ts,
        Output::Vmsync(v) => v.ts,
    }
}

impl Thread {
    fn new(tid: i32, vcpu: u32) -> Thread {
        Thread {
            tid,
            vcpu,
            run: Run::Unknown,
            exit: None,
            sync_reply: None,
            held: None,
        }
    }

    fn interval(&self, state: State, start: u64, end: u64, cpu: u32) -> Interval {
        Interval {
            vcpu: self.vcpu,
            state,
            start,
            end,
            host_tid: self.tid,
            host_cpu: cpu,
            exit: self.exit.map(|e| e.exit_ref(false)),
            taken_by: None,
            ran: Vec::new(),
            ran_other_ns: 0,
            truncated: false,
        }
    }

    /// Emits `o`, or holds it while a hypercall waits for its entry.
    fn emit(&mut self, o: Output, out: &mut Vec<Output>, c: &mut Counters) {
        match &mut self.held {
            Some(h) if h.len() < HELD_MAX => h.push(o),
            Some(_) => {
                c.held_overflow += 1;
                out.extend(self.held.take().into_iter().flatten());
                out.push(o);
            }
            None => out.push(o),
        }
    }

    /// Releases what was held, in time order.
    fn release(&mut self, out: &mut Vec<Output>) {
        if let Some(mut h) = self.held.take() {
            h.sort_by_key(start_of);
            out.extend(h);
        }
    }

    /// The on-CPU piece of a pending exit, from `since` (or the exit) to `ts`.
    fn close_hypervisor(
        &mut self,
        cpu: u32,
        since: u64,
        ts: u64,
        truncated: bool,
        out: &mut Vec<Output>,
        c: &mut Counters,
    ) {
        let Some(e) = self.exit.as_mut() else { return };
        let first = !e.cut;
        e.cut = true;
        let start = since.max(e.ts).min(ts);
        let mut i = self.interval(State::Hypervisor, start, ts, cpu);
        i.exit = self.exit.map(|e| e.exit_ref(first));
        i.truncated = truncated;
        self.emit(Output::Interval(i), out, c);
    }

    fn switch_out(
        &mut self,
        ts: u64,
        cpu: u32,
        state: i64,
        next: Task,
        out: &mut Vec<Output>,
        c: &mut Counters,
    ) {
        match self.run {
            Run::OnCpu { cpu: on, since } => self.close_hypervisor(on, since, ts, false, out, c),
            Run::Unknown => {}
            Run::Runnable { since, .. } => {
                // It ran again in between: its switch-in was not traced.
                c.untraced_switch_ins += 1;
                let i = self.interval(State::Untraced, since, ts, cpu);
                self.emit(Output::Interval(i), out, c);
            }
            Run::Sleeping { .. } => c.inconsistent += 1,
        }
        self.run = if state == 0 {
            Run::Runnable {
                cpu,
                since: ts,
                taken_by: Some(next),
                ran: Ran::default(),
            }
        } else {
            Run::Sleeping { cpu, since: ts }
        };
    }

    fn switch_in(&mut self, ts: u64, cpu: u32, out: &mut Vec<Output>, c: &mut Counters) {
        match std::mem::replace(&mut self.run, Run::OnCpu { cpu, since: ts }) {
            Run::Runnable {
                since,
                taken_by,
                ran,
                ..
            } => {
                let mut i = self.interval(State::Preempted, since, ts, cpu);
                i.taken_by = taken_by;
                i.ran = ran.list;
                i.ran_other_ns = ran.other;
                self.emit(Output::Interval(i), out, c);
            }
            Run::Sleeping { since, cpu: on } => {
                // The wake-up was lost: all of it counts as blocked.
                c.inconsistent += 1;
                let i = self.interval(State::Blocked, since, ts, on);
                self.emit(Output::Interval(i), out, c);
            }
            Run::OnCpu { .. } => c.inconsistent += 1,
            Run::Unknown => {}
        }
    }

    fn wakeup(&mut self, ts: u64, target: u32, out: &mut Vec<Output>, c: &mut Counters) {
        let runnable = Run::Runnable {
            cpu: target,
            since: ts,
            taken_by: None,
            ran: Ran::default(),
        };
        match self.run {
            Run::Sleeping { since, cpu } => {
                let i = self.interval(State::Blocked, since, ts, cpu);
                self.emit(Output::Interval(i), out, c);
                self.run = runnable;
            }
            Run::Unknown => self.run = runnable,
            // Waking a thread that runs or waits already changes nothing.
            Run::OnCpu { .. } | Run::Runnable { .. } => {}
        }
    }

    fn migrate(&mut self, dest: u32) {
        if let Run::Runnable { cpu, .. } | Run::Sleeping { cpu, .. } = &mut self.run {
            *cpu = dest;
        }
    }
}

impl Thread {
    fn kvm_exit(
        &mut self,
        ev: &HostEvent,
        reason: u32,
        isa: u32,
        rip: u64,
        out: &mut Vec<Output>,
        c: &mut Counters,
    ) {
        c.exits += 1;
        if self.exit.is_some() {
            // Its entry was lost: what it had is not an exit's whole cost.
            c.exits_without_entry += 1;
            self.abandon_exit(None, out, c);
        }
        if !matches!(self.run, Run::OnCpu { .. }) {
            if self.run != Run::Unknown {
                c.inconsistent += 1;
            }
            self.run = Run::OnCpu {
                cpu: ev.cpu,
                since: ev.ts,
            };
        }
        self.exit = Some(PendingExit {
            ts: ev.ts,
            cpu: ev.cpu,
            reason,
            isa,
            rip,
            cut: false,
            hypercall: None,
        });
    }

    /// Ends the pending exit without an entry: at `end` (the trace's end)
    /// with its last piece, or silently (a lost entry).
    fn abandon_exit(&mut self, end: Option<u64>, out: &mut Vec<Output>, c: &mut Counters) {
        if let (Some(end), Run::OnCpu { cpu, since }) = (end, &self.run) {
            let (cpu, since) = (*cpu, *since);
            self.close_hypervisor(cpu, since, end, true, out, c);
        }
        if let Some(e) = self.exit.take() {
            if let Some((ts, nr, args)) = e.hypercall {
                let h = self.hypercall_of(&e, ts, nr, args, None, None);
                self.emit(Output::Hypercall(h), out, c);
            }
        }
        self.release(out);
    }

    fn hypercall_of(
        &self,
        e: &PendingExit,
        ts: u64,
        nr: u64,
        args: [u64; 4],
        exit_ns: Option<u64>,
        entry_cpu: Option<u32>,
    ) -> Hypercall {
        Hypercall {
            vcpu: self.vcpu,
            host_tid: self.tid,
            ts,
            exit_ts: e.ts,
            nr,
            args,
            guest_rip: e.rip,
            exit_ns,
            exit_cpu: e.cpu,
            entry_cpu,
        }
    }

    fn hypercall(
        &mut self,
        ev: &HostEvent,
        nr: u64,
        args: [u64; 4],
        out: &mut Vec<Output>,
        c: &mut Counters,
    ) {
        c.hypercalls += 1;
        if nr == IVT_HC_VMSYNC {
            let cnt = args[0] as u32;
            out.push(Output::Vmsync(Vmsync {
                dir: SyncDir::GuestToHost,
                ts: ev.ts,
                cpu: ev.cpu,
                tid: self.tid,
                cnt,
                vm_uid: args[1],
            }));
            self.sync_reply = Some((cnt.wrapping_add(1), args[1]));
        }
        match self.exit.as_mut() {
            Some(e) if e.hypercall.is_none() => {
                e.hypercall = Some((ev.ts, nr, args));
                self.held.get_or_insert_with(Vec::new);
            }
            _ => c.hypercalls_without_exit += 1,
        }
    }

    fn kvm_entry(&mut self, ev: &HostEvent, out: &mut Vec<Output>, c: &mut Counters) {
        if let Some((cnt, vm_uid)) = self.sync_reply.take() {
            out.push(Output::Vmsync(Vmsync {
                dir: SyncDir::HostToGuest,
                ts: ev.ts,
                cpu: ev.cpu,
                tid: self.tid,
                cnt,
                vm_uid,
            }));
        }
        let Some(e) = self.exit else {
            c.entries_without_exit += 1;
            if self.run == Run::Unknown {
                self.run = Run::OnCpu {
                    cpu: ev.cpu,
                    since: ev.ts,
                };
            }
            return;
        };
        match self.run {
            Run::OnCpu { cpu, since } => self.close_hypervisor(cpu, since, ev.ts, false, out, c),
            _ => {
                c.inconsistent += 1;
                self.run = Run::OnCpu {
                    cpu: ev.cpu,
                    since: ev.ts,
                };
            }
        }
        if let Some((ts, nr, args)) = e.hypercall {
            let exit_ns = ev.ts.saturating_sub(e.ts);
            let h = self.hypercall_of(&e, ts, nr, args, Some(exit_ns), Some(ev.cpu));
            self.emit(Output::Hypercall(h), out, c);
        }
        self.exit = None;
        self.release(out);
    }

    /// The end of the trace: whatever is open is cut there.
    fn finish(&mut self, end: u64, out: &mut Vec<Output>, c: &mut Counters) {
        if self.exit.is_some() {
            c.exits_without_entry += 1;
        }
        match std::mem::replace(&mut self.run, Run::Unknown) {
            Run::Runnable {
                since,
                cpu,
                taken_by,
                ran,
            } => {
                let mut i = self.interval(State::Preempted, since, end.max(since), cpu);
                i.taken_by = taken_by;
                i.ran = ran.list;
                i.ran_other_ns = ran.other;
                i.truncated = true;
                self.emit(Output::Interval(i), out, c);
            }
            Run::Sleeping { since, cpu } => {
                let mut i = self.interval(State::Blocked, since, end.max(since), cpu);
                i.truncated = true;
                self.emit(Output::Interval(i), out, c);
            }
            run @ Run::OnCpu { .. } => self.run = run,
            Run::Unknown => {}
        }
        self.abandon_exit(Some(end), out, c);
    }
}

/// The derivation over one recording's host events.
#[derive(Debug, Default)]
pub struct Timeline {
    cfg: Config,
    /// Thread -> process, from the state dump.
    process_of: HashMap<i32, i32>,
    threads: HashMap<i32, Thread>,
    /// Per host CPU, the time of its last context switch.
    /// Per host CPU, the time of the last context switch the trace shows
    /// there and the task it switched in.
    last_switch: HashMap<u32, (u64, i32)>,
    last_ts: u64,
    pub counters: Counters,
}

impl Timeline {
    pub fn new(cfg: Config) -> Timeline {
        Timeline {
            cfg,
            ..Timeline::default()
        }
    }

    /// The vCPU threads found so far: (tid, vcpu), by vCPU.
    pub fn vcpu_threads(&self) -> Vec<(i32, u32)> {
        let mut v: Vec<(i32, u32)> = self.threads.values().map(|t| (t.tid, t.vcpu)).collect();
        v.sort_by_key(|&(tid, vcpu)| (vcpu, tid));
        v
    }

    /// The vCPU thread `tid`, made known if what is known about it says so:
    /// the caller's map, else (a thread of the recorded QEMU, or any when
    /// no process is given) its name, else the vCPU it was seen entering.
    fn thread(
        &mut self,
        tid: i32,
        name: Option<&Comm>,
        vcpu_id: Option<u32>,
    ) -> Option<&mut Thread> {
        if !self.threads.contains_key(&tid) {
            let vcpu = self.cfg.vcpus.get(&tid).copied().or_else(|| {
                let ours = match self.cfg.qemu_pid {
                    Some(pid) => self.process_of.get(&tid) == Some(&pid),
                    None => tid > 0,
                };
                ours.then(|| name.and_then(vcpu_of_comm).or(vcpu_id))
                    .flatten()
            })?;
            self.threads.insert(tid, Thread::new(tid, vcpu));
        }
        self.threads.get_mut(&tid)
    }

    /// One host event (events must come in time order).
    pub fn push(&mut self, ev: &HostEvent, out: &mut Vec<Output>) {
        self.counters.events += 1;
        self.last_ts = self.last_ts.max(ev.ts);
        let mut c = std::mem::take(&mut self.counters);
        match ev.kind {
            HostKind::Process { tid, pid, name } => {
                self.process_of.insert(tid, pid);
                let _ = self.thread(tid, Some(&name), None);
            }
            HostKind::Switch {
                prev,
                prev_state,
                next,
            } => self.switch(ev, prev, prev_state, next, out, &mut c),
            HostKind::Wakeup { tid, target_cpu } => {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.wakeup(ev.ts, target_cpu, out, &mut c);
                }
            }
            HostKind::Migrate { tid, dest_cpu } => {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.migrate(dest_cpu);
                }
            }
            HostKind::Exit {
                vcpu_id,
                reason,
                isa,
                guest_rip,
            } => {
                if let Some(t) = self.thread(ev.tid, None, Some(vcpu_id)) {
                    t.kvm_exit(ev, reason, isa, guest_rip, out, &mut c);
                }
            }
            HostKind::Entry { vcpu_id } => {
                if let Some(t) = self.thread(ev.tid, None, Some(vcpu_id)) {
                    t.kvm_entry(ev, out, &mut c);
                }
            }
            HostKind::Hypercall { nr, args } => {
                if let Some(t) = self.threads.get_mut(&ev.tid) {
                    t.hypercall(ev, nr, args, out, &mut c);
                }
            }
        }
        self.counters = c;
    }

    fn switch(
        &mut self,
        ev: &HostEvent,
        prev: Task,
        state: i64,
        next: Task,
        out: &mut Vec<Output>,
        c: &mut Counters,
    ) {
        // The vCPU threads queued on this CPU waited while the task now
        // leaving it ran: since the last switch the trace shows here, if
        // that switch brought this very task in. Otherwise switches in
        // between were not traced (the host trace keeps only those of the
        // vCPU threads), and who ran then is not known.
        let last = self.last_switch.insert(ev.cpu, (ev.ts, next.tid));
        let who = match last {
            Some((_, tid)) if tid == prev.tid => prev,
            _ => NOT_TRACED,
        };
        for t in self.threads.values_mut() {
            if let Run::Runnable {
                cpu, since, ran, ..
            } = &mut t.run
            {
                if *cpu == ev.cpu {
                    let from = last.map_or(*since, |l| l.0.max(*since));
                    ran.add(who, ev.ts.saturating_sub(from));
                }
            }
        }
        if let Some(t) = self.thread(prev.tid, Some(&prev.comm), None) {
            t.switch_out(ev.ts, ev.cpu, state, next, out, c);
        }
        if let Some(t) = self.thread(next.tid, Some(&next.comm), None) {
            t.switch_in(ev.ts, ev.cpu, out, c);
        }
    }

    /// The end of the trace (at its last event, or `end` if later): open
    /// intervals and exits are cut there and marked truncated.
    pub fn finish(&mut self, end: Option<u64>, out: &mut Vec<Output>) {
        let end = end.unwrap_or(0).max(self.last_ts);
        let mut tids: Vec<i32> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        let mut c = std::mem::take(&mut self.counters);
        for tid in tids {
            if let Some(t) = self.threads.get_mut(&tid) {
                t.finish(end, out, &mut c);
            }
        }
        self.counters = c;
    }
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
