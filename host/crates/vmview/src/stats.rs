//! What `ivtrace report` says about a guest's vCPUs: per vCPU the time
//! preempted (count, longest), blocked and in the hypervisor; the guest
//! threads that lost the most time to the host; the host tasks that ran
//! on the vCPU threads' CPUs meanwhile; KVM exits by reason with their
//! cost; hypercalls. Fed with the derivation's outputs or with the VM
//! view's events read back: the same numbers either way.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::model::{comm_str, GuestThread, Hypercall, Interval, State, Task};

/// How many guest threads and host tasks a summary lists.
pub const TOP: usize = 10;
/// Distinct guest threads and host tasks an aggregator keeps apart (the
/// guest names its threads, and a hostile one could name millions); past
/// that, their time goes to one "(others)" entry.
pub const KEYS_MAX: usize = 1 << 16;
/// Distinct hypercall numbers counted apart (the guest chooses them).
pub const NRS_MAX: usize = 256;
const OTHERS: i32 = crate::classes::OTHER_TASKS;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VcpuStats {
    pub vcpu: u32,
    /// The vCPU's host thread(s).
    pub host_tids: Vec<i32>,
    pub preempted_ns: u64,
    pub preempted_count: u64,
    pub preempted_longest_ns: u64,
    pub blocked_ns: u64,
    pub blocked_count: u64,
    pub hypervisor_ns: u64,
    /// Waits whose end the host trace does not show: at most this much
    /// more preempted time (see `State::Untraced`).
    pub untraced_count: u64,
    pub untraced_max_ns: u64,
    /// KVM exits (their first piece), and the time of all their pieces.
    pub exits: u64,
    pub exit_ns: u64,
    /// Intervals the end of the trace cut short.
    pub truncated: u64,
}

/// Time a guest thread lost while its vCPU was preempted or in the
/// hypervisor (blocked time is not lost: the guest had nothing to run, or
/// chose to wait).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ThreadLoss {
    pub tid: i32,
    pub comm: String,
    pub preempted_ns: u64,
    pub preempted_count: u64,
    pub hypervisor_ns: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostTaskTime {
    pub tid: i32,
    pub comm: String,
    /// Time it ran on the CPU a vCPU thread waited for.
    pub ns: u64,
    /// Preemptions of a vCPU thread it started (took the CPU).
    pub took_cpu: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExitStats {
    pub isa: u32,
    pub reason: u32,
    pub name: String,
    pub count: u64,
    /// kvm_exit to kvm_entry, summed over its pieces.
    pub total_ns: u64,
    pub mean_ns: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HypercallStats {
    pub count: u64,
    /// Without a kvm_entry before the trace ended.
    pub incomplete: u64,
    pub exit_overhead_total_ns: u64,
    pub exit_overhead_max_ns: u64,
    /// By hypercall number (hex).
    pub by_nr: BTreeMap<String, u64>,
}

/// The whole summary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub vcpus: Vec<VcpuStats>,
    pub guest_threads: Vec<ThreadLoss>,
    pub host_tasks: Vec<HostTaskTime>,
    pub exits: Vec<ExitStats>,
    pub hypercalls: HypercallStats,
}

/// Accumulates a summary.
#[derive(Debug, Default)]
pub struct Aggregator {
    vcpus: BTreeMap<u32, VcpuStats>,
    threads: HashMap<(i32, [u8; 16]), ThreadLoss>,
    tasks: HashMap<i32, HostTaskTime>,
    /// When each task's name was last seen (its interval's start).
    task_named_at: HashMap<i32, u64>,
    exits: BTreeMap<(u32, u32), ExitStats>,
    hypercalls: HypercallStats,
}

impl Aggregator {
    pub fn interval(&mut self, i: &Interval, g: &GuestThread) {
        let v = self.vcpus.entry(i.vcpu).or_insert_with(|| VcpuStats {
            vcpu: i.vcpu,
            ..Default::default()
        });
        if !v.host_tids.contains(&i.host_tid) {
            v.host_tids.push(i.host_tid);
        }
        let d = i.duration();
        v.truncated += i.truncated as u64;
        let mut key = (g.tid, g.comm);
        if self.threads.len() >= KEYS_MAX && !self.threads.contains_key(&key) {
            key = (OTHERS, crate::model::comm("(others)"));
        }
        let t = self.threads.entry(key).or_insert_with(|| ThreadLoss {
            tid: key.0,
            comm: comm_str(&key.1),
            ..Default::default()
        });
        match i.state {
            State::Preempted => {
                v.preempted_ns += d;
                v.preempted_count += 1;
                v.preempted_longest_ns = v.preempted_longest_ns.max(d);
                t.preempted_ns += d;
                t.preempted_count += 1;
            }
            State::Blocked => {
                v.blocked_ns += d;
                v.blocked_count += 1;
            }
            State::Hypervisor => {
                v.hypervisor_ns += d;
                t.hypervisor_ns += d;
            }
            State::Untraced => {
                v.untraced_count += 1;
                v.untraced_max_ns += d;
            }
        }
        if let Some(e) = i.exit {
            v.exit_ns += d;
            v.exits += e.first as u64;
            let x = self
                .exits
                .entry((e.isa, e.reason))
                .or_insert_with(|| ExitStats {
                    isa: e.isa,
                    reason: e.reason,
                    name: exit_name(e.isa, e.reason),
                    ..Default::default()
                });
            x.count += e.first as u64;
            x.total_ns += d;
        }
        if let Some(by) = i.taken_by {
            self.task(&by, i.start).took_cpu += 1;
        }
        for (task, ns) in &i.ran {
            self.host_ran(task, i.start, *ns);
        }
        if i.ran_other_ns > 0 {
            let others = Task {
                tid: crate::classes::OTHER_TASKS,
                comm: crate::model::comm("(others)"),
            };
            self.host_ran(&others, i.start, i.ran_other_ns);
        }
    }

    /// A host task by thread id, under the latest name it was seen with
    /// (a thread's name changes at exec and prctl). Latest in time, `at`,
    /// not in call order: serve sees intervals in time order, `report`
    /// reads the VM stream one vCPU at a time, and both must agree.
    fn task(&mut self, t: &Task, at: u64) -> &mut HostTaskTime {
        let mut t = *t;
        if self.tasks.len() >= KEYS_MAX && !self.tasks.contains_key(&t.tid) {
            t = Task {
                tid: OTHERS,
                comm: crate::model::comm("(others)"),
            };
        }
        let e = self.tasks.entry(t.tid).or_default();
        e.tid = t.tid;
        let name = comm_str(&t.comm);
        let named_at = self.task_named_at.entry(t.tid).or_insert(0);
        // Equal times: the greater name, so that the order of calls never matters.
        let later = at > *named_at || (at == *named_at && name > e.comm);
        if !name.is_empty() && (e.comm.is_empty() || later) {
            e.comm = name;
            *named_at = at;
        }
        e
    }

    /// A host task's time on a waited-for CPU (`vcpu_host_ran`, written at
    /// the start `at` of the interval it belongs to).
    pub fn host_ran(&mut self, t: &Task, at: u64, ns: u64) {
        self.task(t, at).ns += ns;
    }

    pub fn hypercall(&mut self, h: &Hypercall) {
        let s = &mut self.hypercalls;
        s.count += 1;
        match h.exit_ns {
            Some(ns) => {
                s.exit_overhead_total_ns += ns;
                s.exit_overhead_max_ns = s.exit_overhead_max_ns.max(ns);
            }
            None => s.incomplete += 1,
        }
        let mut nr = format!("{:#x}", h.nr);
        if s.by_nr.len() >= NRS_MAX && !s.by_nr.contains_key(&nr) {
            nr = "other".into();
        }
        *s.by_nr.entry(nr).or_default() += 1;
    }

    pub fn summary(&self) -> Summary {
        let mut threads: Vec<ThreadLoss> = self
            .threads
            .values()
            .filter(|t| t.preempted_ns + t.hypervisor_ns > 0)
            .cloned()
            .collect();
        threads.sort_by_key(|t| (std::cmp::Reverse(t.preempted_ns + t.hypervisor_ns), t.tid));
        threads.truncate(TOP);
        let mut tasks: Vec<HostTaskTime> = self.tasks.values().cloned().collect();
        tasks.sort_by_key(|t| (std::cmp::Reverse(t.ns), t.tid));
        tasks.truncate(TOP);
        let exits = self
            .exits
            .values()
            .map(|e| ExitStats {
                mean_ns: e.total_ns.checked_div(e.count).unwrap_or(0),
                ..e.clone()
            })
            .collect();
        Summary {
            vcpus: self.vcpus.values().cloned().collect(),
            guest_threads: threads,
            host_tasks: tasks,
            exits,
            hypercalls: self.hypercalls.clone(),
        }
    }
}

/// VMX exit reasons (KVM's `kvm_exit` print format, isa 1) and SVM's most
/// common ones (isa 2); others by number.
pub fn exit_name(isa: u32, reason: u32) -> String {
    const VMX: &[(u32, &str)] = &[
        (0, "EXCEPTION_NMI"),
        (1, "EXTERNAL_INTERRUPT"),
        (7, "INTERRUPT_WINDOW"),
        (10, "CPUID"),
        (12, "HLT"),
        (18, "VMCALL"),
        (28, "CR_ACCESS"),
        (30, "IO_INSTRUCTION"),
        (31, "MSR_READ"),
        (32, "MSR_WRITE"),
        (40, "PAUSE_INSTRUCTION"),
        (44, "APIC_ACCESS"),
        (45, "EOI_INDUCED"),
        (48, "EPT_VIOLATION"),
        (49, "EPT_MISCONFIG"),
        (52, "PREEMPTION_TIMER"),
        (56, "APIC_WRITE"),
    ];
    const SVM: &[(u32, &str)] = &[
        (0x60, "interrupt"),
        (0x72, "cpuid"),
        (0x78, "hlt"),
        (0x7b, "io"),
        (0x7c, "msr"),
        (0x81, "hypercall"),
        (0x400, "npf"),
    ];
    let table = match isa {
        1 => VMX,
        2 => SVM,
        _ => &[],
    };
    table
        .iter()
        .find(|(r, _)| *r == reason & 0xffff || (isa == 2 && *r == reason))
        .map_or_else(|| format!("reason {reason}"), |(_, n)| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{comm, Hypercall, Interval, State, Task};

    fn preempted(vcpu: u32, ns: u64) -> Interval {
        Interval::bare(vcpu, State::Preempted, (0, ns), 7)
    }

    /// A task renamed by prctl (python3, then "hog") keeps its latest name
    /// in time whatever order its intervals arrive in: serve meets them in
    /// time order, `report` one vCPU stream after another.
    #[test]
    fn a_task_is_named_by_its_latest_name_in_time() {
        let python = Task {
            tid: 9,
            comm: comm("python3"),
        };
        let hog = Task {
            tid: 9,
            comm: comm("hog"),
        };
        for order in [[(100, python), (200, hog)], [(200, hog), (100, python)]] {
            let mut a = Aggregator::default();
            for (at, t) in order {
                a.host_ran(&t, at, 5);
            }
            let s = a.summary();
            assert_eq!(
                (s.host_tasks[0].comm.as_str(), s.host_tasks[0].ns),
                ("hog", 10)
            );
        }
    }

    /// A guest that names millions of threads, or makes hypercalls with
    /// millions of numbers, cannot make the summary grow without bound.
    #[test]
    fn guest_chosen_keys_are_capped() {
        let mut a = Aggregator::default();
        for tid in 0..(KEYS_MAX as i32 + 10) {
            let g = GuestThread {
                tid,
                comm: comm("t"),
            };
            a.interval(&preempted(0, 1), &g);
        }
        assert_eq!(a.threads.len(), KEYS_MAX + 1);
        assert_eq!(a.threads[&(OTHERS, comm("(others)"))].preempted_ns, 10);
        for nr in 0..(NRS_MAX as u64 + 5) {
            let h = Hypercall {
                vcpu: 0,
                host_tid: 7,
                ts: 0,
                exit_ts: 0,
                nr,
                args: [0; 4],
                guest_rip: 0,
                exit_ns: Some(1),
                exit_cpu: 0,
                entry_cpu: Some(0),
            };
            a.hypercall(&h);
        }
        let s = a.summary();
        assert_eq!(s.hypercalls.by_nr.len(), NRS_MAX + 1);
        assert_eq!(s.hypercalls.by_nr["other"], 5);
        assert_eq!(s.vcpus[0].preempted_ns, KEYS_MAX as u64 + 10);
    }
}
