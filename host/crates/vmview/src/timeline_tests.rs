//! The derivation on hand-made event sequences: every transition, the
//! KVM exit pieces, hypercall aggregation and vmsync, the edge cases of the
//! issue (exit without entry at the end, migration between host CPUs, two
//! guests at once), and a property: preempted time equals the run-queue
//! wait the kernel's scheduler statistics count, for any schedule.

use proptest::prelude::*;

use super::*;
use crate::model::{comm, Hypercall, Interval, State, SyncDir, Task};

const VCPU0: i32 = 100;
const HOG: i32 = 200;

fn task(tid: i32, name: &str) -> Task {
    Task {
        tid,
        comm: comm(name),
    }
}

fn vcpu0() -> Task {
    task(VCPU0, "CPU 0/TCG")
}

fn ev(ts: u64, cpu: u32, tid: i32, kind: HostKind) -> HostEvent {
    HostEvent { ts, cpu, tid, kind }
}

fn switch(ts: u64, cpu: u32, prev: Task, state: i64, next: Task) -> HostEvent {
    ev(
        ts,
        cpu,
        prev.tid,
        HostKind::Switch {
            prev,
            prev_state: state,
            next,
        },
    )
}

fn wakeup(ts: u64, cpu: u32, tid: i32, target: u32) -> HostEvent {
    ev(
        ts,
        cpu,
        1,
        HostKind::Wakeup {
            tid,
            target_cpu: target,
        },
    )
}

fn run(cfg: Config, events: &[HostEvent]) -> (Vec<Output>, Counters) {
    let mut t = Timeline::new(cfg);
    let mut out = Vec::new();
    for e in events {
        t.push(e, &mut out);
    }
    t.finish(None, &mut out);
    (out, t.counters.clone())
}

fn intervals(out: &[Output]) -> Vec<&Interval> {
    out.iter()
        .filter_map(|o| match o {
            Output::Interval(i) => Some(i),
            _ => None,
        })
        .collect()
}

fn hypercalls(out: &[Output]) -> Vec<&Hypercall> {
    out.iter()
        .filter_map(|o| match o {
            Output::Hypercall(h) => Some(h),
            _ => None,
        })
        .collect()
}

#[test]
fn vcpu_threads_are_known_by_name() {
    assert_eq!(vcpu_of_comm(&comm("CPU 3/TCG")), Some(3));
    assert_eq!(vcpu_of_comm(&comm("CPU 12/KVM")), Some(12));
    for no in [
        "CPU x/KVM",
        "CPU 1/",
        "qemu-system-x86",
        "ALL CPUs/TCG",
        "CPU 1",
    ] {
        assert_eq!(vcpu_of_comm(&comm(no)), None, "{no}");
    }
}

#[test]
fn a_preemption_is_an_interval_with_who_took_the_cpu() {
    let hog = task(HOG, "hog");
    let kw = task(7, "kworker/1:0");
    let (out, c) = run(
        Config::default(),
        &[
            switch(1_000, 1, vcpu0(), 0, hog),
            switch(3_000, 1, hog, 0, kw),
            switch(3_500, 1, kw, 1, hog),
            switch(5_000, 1, hog, 0, vcpu0()),
        ],
    );
    let i = intervals(&out);
    assert_eq!(i.len(), 1, "{out:?}");
    assert_eq!(
        (i[0].state, i[0].start, i[0].end),
        (State::Preempted, 1_000, 5_000)
    );
    assert_eq!((i[0].vcpu, i[0].host_tid, i[0].host_cpu), (0, VCPU0, 1));
    assert_eq!(i[0].taken_by, Some(hog));
    assert_eq!(i[0].ran, vec![(hog, 3_500), (kw, 500)]);
    assert_eq!(c.inconsistent, 0);
}

/// The switches between the task that took the CPU and the one that gave
/// it back are not in a vCPU-only host trace: that time is "not traced",
/// not credited to whoever switched back last.
#[test]
fn who_ran_meanwhile_is_only_what_the_trace_shows() {
    let (hog, rcu) = (task(HOG, "hog"), task(15, "rcu_preempt"));
    let (out, _) = run(
        Config::default(),
        &[
            switch(1_000, 1, vcpu0(), 0, hog),
            // hog -> ... -> rcu_preempt: not traced
            switch(9_000, 1, rcu, 1, vcpu0()),
        ],
    );
    let i = intervals(&out);
    assert_eq!(i[0].taken_by, Some(hog));
    assert_eq!(i[0].ran, vec![(NOT_TRACED, 8_000)]);
}

#[test]
fn a_sleep_is_blocked_until_the_wakeup_then_preempted_until_it_runs() {
    let (out, _) = run(
        Config::default(),
        &[
            switch(10_000, 0, vcpu0(), 1, task(0, "swapper/0")),
            wakeup(12_000, 1, VCPU0, 0),
            switch(12_500, 0, task(0, "swapper/0"), 0, vcpu0()),
        ],
    );
    let i = intervals(&out);
    assert_eq!(i.len(), 2);
    assert_eq!(
        (i[0].state, i[0].start, i[0].end),
        (State::Blocked, 10_000, 12_000)
    );
    assert_eq!(
        (i[1].state, i[1].start, i[1].end),
        (State::Preempted, 12_000, 12_500)
    );
    assert_eq!(
        i[1].taken_by, None,
        "nothing took the CPU from a sleeping thread"
    );
}

#[test]
fn open_intervals_are_cut_at_the_end_and_marked() {
    let mut t = Timeline::new(Config::default());
    let mut out = Vec::new();
    t.push(&switch(1_000, 0, vcpu0(), 0, task(HOG, "hog")), &mut out);
    t.finish(Some(9_000), &mut out);
    let i = intervals(&out);
    assert_eq!((i[0].end, i[0].truncated), (9_000, true));
}

#[test]
fn lost_events_are_counted_and_the_state_resynchronized() {
    let (out, c) = run(
        Config::default(),
        &[
            switch(1_000, 0, task(1, "a"), 0, vcpu0()),
            switch(2_000, 0, task(1, "a"), 0, vcpu0()), // its switch-out was lost
            switch(3_000, 0, vcpu0(), 1, task(1, "a")),
            switch(4_000, 0, task(1, "a"), 0, vcpu0()), // its wake-up was lost
        ],
    );
    assert_eq!((c.inconsistent, c.untraced_switch_ins), (2, 0));
    let i = intervals(&out);
    assert_eq!(
        (i[0].state, i[0].start, i[0].end),
        (State::Blocked, 3_000, 4_000)
    );
}

/// A kernel that does not trace some switches (away from the idle task):
/// the thread is seen waiting, then leaving its CPU again. When it got the
/// CPU back is unknown: the whole stretch is an "untraced" interval, an
/// upper bound of the preempted time the trace cannot show.
#[test]
fn an_untraced_switch_in_bounds_the_unseen_wait() {
    let idle = task(0, "swapper/1");
    let (out, c) = run(
        Config::default(),
        &[
            switch(1_000, 1, vcpu0(), 0, task(HOG, "agent")),
            // agent -> vCPU 0 not traced
            switch(5_000, 1, vcpu0(), 1, idle),
            wakeup(6_000, 1, VCPU0, 1),
            // idle -> vCPU 0 not traced
            switch(9_000, 1, vcpu0(), 0, task(HOG, "agent")),
        ],
    );
    let i: Vec<_> = intervals(&out)
        .iter()
        .map(|i| (i.state, i.start, i.end))
        .collect();
    assert_eq!(
        i,
        [
            (State::Untraced, 1_000, 5_000),
            (State::Blocked, 5_000, 6_000),
            (State::Untraced, 6_000, 9_000),
            (State::Preempted, 9_000, 9_000)
        ]
    );
    assert_eq!((c.untraced_switch_ins, c.inconsistent), (2, 0));
}

fn kvm(ts: u64, cpu: u32, kind: HostKind) -> HostEvent {
    ev(ts, cpu, VCPU0, kind)
}

fn exit(reason: u32) -> HostKind {
    HostKind::Exit {
        vcpu_id: 0,
        reason,
        isa: 1,
        guest_rip: 0xffff_ffff_8100_0000,
    }
}

fn hcall(nr: u64, a0: u64, a1: u64) -> HostKind {
    HostKind::Hypercall {
        nr,
        args: [a0, a1, 3, 4],
    }
}

const ENTRY: HostKind = HostKind::Entry { vcpu_id: 0 };

#[test]
fn a_hypercall_is_one_event_with_its_exit_overhead() {
    let (out, c) = run(
        Config::default(),
        &[
            kvm(100, 0, exit(18)),
            kvm(150, 0, hcall(0x4956_0100, 1, 2)),
            kvm(400, 0, ENTRY),
        ],
    );
    let i = intervals(&out);
    assert_eq!(i.len(), 1);
    assert_eq!(
        (i[0].state, i[0].start, i[0].end),
        (State::Hypervisor, 100, 400)
    );
    assert!(i[0].exit.unwrap().first);
    let h = hypercalls(&out);
    assert_eq!(h.len(), 1);
    assert_eq!(
        (h[0].ts, h[0].exit_ns, h[0].nr, h[0].args),
        (150, Some(300), 0x4956_0100, [1, 2, 3, 4])
    );
    assert_eq!(
        (h[0].guest_rip, h[0].vcpu, h[0].exit_cpu, h[0].entry_cpu),
        (0xffff_ffff_8100_0000, 0, 0, Some(0))
    );
    assert!(
        matches!(out[0], Output::Interval(_)),
        "in time order: {out:?}"
    );
    assert_eq!((c.exits, c.hypercalls, c.exits_without_entry), (1, 1, 0));
}

#[test]
fn an_exit_cut_by_a_preemption_and_a_migration_adds_up() {
    let hog = task(HOG, "hog");
    let (out, c) = run(
        Config::default(),
        &[
            kvm(100, 0, exit(18)),
            kvm(120, 0, hcall(0x4956_0100, 1, 2)),
            switch(200, 0, task(VCPU0, "CPU 0/KVM"), 0, hog),
            ev(
                300,
                0,
                1,
                HostKind::Migrate {
                    tid: VCPU0,
                    dest_cpu: 1,
                },
            ),
            switch(700, 1, task(1, "x"), 0, task(VCPU0, "CPU 0/KVM")),
            kvm(800, 1, ENTRY),
        ],
    );
    let i = intervals(&out);
    let pieces: Vec<_> = i
        .iter()
        .map(|x| (x.state, x.start, x.end, x.host_cpu))
        .collect();
    assert_eq!(
        pieces,
        [
            (State::Hypervisor, 100, 200, 0),
            (State::Preempted, 200, 700, 1),
            (State::Hypervisor, 700, 800, 1)
        ]
    );
    assert!(i.iter().all(|x| x.exit.is_some_and(|e| e.reason == 18)));
    assert_eq!(i.iter().filter(|x| x.exit.unwrap().first).count(), 1);
    assert_eq!(
        i.iter().map(|x| x.duration()).sum::<u64>(),
        700,
        "the pieces are the exit"
    );
    let h = hypercalls(&out)[0];
    assert_eq!(
        (h.exit_ns, h.exit_cpu, h.entry_cpu),
        (Some(700), 0, Some(1))
    );
    let order: Vec<u64> = out
        .iter()
        .map(|o| match o {
            Output::Interval(i) => i.start,
            Output::Hypercall(h) => h.ts,
            Output::Vmsync(v) => v.ts,
        })
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] <= w[1]),
        "held back into time order: {order:?}"
    );
    assert_eq!(c.inconsistent, 0);
}

#[test]
fn an_exit_without_entry_at_the_end_is_cut_and_its_hypercall_incomplete() {
    let (out, c) = run(
        Config::default(),
        &[
            kvm(100, 0, exit(18)),
            kvm(150, 0, hcall(7, 0, 0)),
            kvm(
                160,
                0,
                HostKind::Migrate {
                    tid: 9,
                    dest_cpu: 0,
                },
            ),
        ],
    );
    let i = intervals(&out);
    assert_eq!((i[0].start, i[0].end, i[0].truncated), (100, 160, true));
    let h = hypercalls(&out);
    assert_eq!((h.len(), h[0].exit_ns, h[0].entry_cpu), (1, None, None));
    assert_eq!(c.exits_without_entry, 1);
}

#[test]
fn vmsync_answers_at_the_next_entry() {
    let (out, _) = run(
        Config::default(),
        &[
            kvm(100, 0, exit(18)),
            kvm(150, 0, hcall(ivtrace_region::abi::IVT_HC_VMSYNC, 7, 0xabc)),
            kvm(400, 1, ENTRY),
        ],
    );
    let syncs: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            Output::Vmsync(v) => Some((v.dir, v.ts, v.cpu, v.cnt, v.vm_uid, v.tid)),
            _ => None,
        })
        .collect();
    assert_eq!(
        syncs,
        [
            (SyncDir::GuestToHost, 150, 0, 7, 0xabc, VCPU0),
            (SyncDir::HostToGuest, 400, 1, 8, 0xabc, VCPU0)
        ]
    );
}

#[test]
fn two_guests_at_once_each_keeps_its_own_threads() {
    let other = task(300, "CPU 0/KVM");
    let events = [
        ev(
            1,
            0,
            0,
            HostKind::Process {
                tid: VCPU0,
                pid: 10,
                name: comm("CPU 0/KVM"),
            },
        ),
        ev(
            1,
            0,
            0,
            HostKind::Process {
                tid: 300,
                pid: 30,
                name: comm("CPU 0/KVM"),
            },
        ),
        kvm(100, 0, exit(12)),
        ev(110, 1, 300, exit(30)),
        switch(150, 0, task(VCPU0, "CPU 0/KVM"), 0, other),
        ev(160, 0, 300, ENTRY),
        switch(400, 0, other, 0, task(VCPU0, "CPU 0/KVM")),
        kvm(450, 0, ENTRY),
    ];
    for (pid, tid) in [(10, VCPU0), (30, 300)] {
        let (out, _) = run(
            Config {
                qemu_pid: Some(pid),
                ..Config::default()
            },
            &events,
        );
        let i = intervals(&out);
        assert!(!i.is_empty());
        assert!(
            i.iter().all(|x| x.host_tid == tid && x.vcpu == 0),
            "{pid}: {i:?}"
        );
    }
    let (out, _) = run(
        Config {
            qemu_pid: Some(10),
            ..Config::default()
        },
        &events,
    );
    let states: Vec<_> = intervals(&out)
        .iter()
        .map(|x| (x.state, x.start, x.end))
        .collect();
    assert_eq!(
        states,
        [
            (State::Hypervisor, 100, 150),
            (State::Preempted, 150, 400),
            (State::Hypervisor, 400, 450)
        ]
    );
}

#[test]
fn the_callers_vcpu_map_names_threads_without_names() {
    let q = task(VCPU0, "qemu-system-x86");
    let events = [
        switch(100, 0, q, 0, task(1, "x")),
        switch(300, 0, task(1, "x"), 0, q),
    ];
    let (out, _) = run(Config::default(), &events);
    assert!(out.is_empty(), "unnamed threads are not guessed at");
    let cfg = Config {
        vcpus: [(VCPU0, 2)].into_iter().collect(),
        ..Config::default()
    };
    let (out, _) = run(cfg, &events);
    assert_eq!(intervals(&out)[0].vcpu, 2);
}

/// A scheduler's view of one thread: what happens next.
#[derive(Debug, Clone, Copy)]
enum Step {
    Preempt,
    Sleep,
    Wake,
    Run,
}

/// The kernel's run-queue wait (`sched_info`): from becoming queued
/// (preempted while runnable, or woken) to running.
fn expected_wait(steps: &[(Step, u64)]) -> u64 {
    let (mut queued_at, mut wait) = (None, 0);
    for &(s, ts) in steps {
        match s {
            Step::Preempt | Step::Wake => queued_at = Some(ts),
            Step::Run => wait += queued_at.take().map_or(0, |q| ts - q),
            Step::Sleep => queued_at = None,
        }
    }
    wait
}

/// Valid schedules: a thread that runs may be preempted or sleep, one
/// that sleeps is woken, one that is queued runs.
fn schedule() -> impl Strategy<Value = Vec<(Step, u64)>> {
    prop::collection::vec((any::<bool>(), 1u64..10_000), 1..60).prop_map(|choices| {
        let (mut ts, mut on_cpu, mut asleep, mut out) = (0u64, true, false, Vec::new());
        for (pick, gap) in choices {
            ts += gap;
            let step = match (on_cpu, asleep) {
                (true, _) if pick => Step::Preempt,
                (true, _) => Step::Sleep,
                (false, true) => Step::Wake,
                (false, false) => Step::Run,
            };
            (on_cpu, asleep) = match step {
                Step::Preempt | Step::Wake => (false, false),
                Step::Sleep => (false, true),
                Step::Run => (true, false),
            };
            out.push((step, ts));
        }
        out
    })
}

proptest! {
    #[test]
    fn preempted_time_is_the_run_queue_wait(steps in schedule()) {
        let other = task(1, "other");
        let mut events = vec![switch(0, 0, other, 0, vcpu0())];
        for &(s, ts) in &steps {
            events.push(match s {
                Step::Preempt => switch(ts, 0, vcpu0(), 0, other),
                Step::Sleep => switch(ts, 0, vcpu0(), 1, other),
                Step::Wake => wakeup(ts, 1, VCPU0, 0),
                Step::Run => switch(ts, 0, other, 0, vcpu0()),
            });
        }
        let (out, c) = run(Config::default(), &events);
        let done: u64 = intervals(&out)
            .iter()
            .filter(|i| i.state == State::Preempted && !i.truncated)
            .map(|i| i.duration())
            .sum();
        prop_assert_eq!(done, expected_wait(&steps));
        prop_assert_eq!(c.inconsistent, 0);
    }
}
