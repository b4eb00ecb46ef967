//! Pass 2: function_graph's entries and exits paired into calls, and the
//! calls aggregated per (phase, function, thread): count, total, self, min,
//! max, in the trace clock's cycles.
//!
//! Pairing follows the graph tracer's own bookkeeping: each task has one
//! stack of traced calls (an interrupt nests on the task it interrupts, as
//! in ftrace's ret_stack), and an entry's `depth` is the number of calls
//! open below it. So, per thread (the idle tasks, all pid 0, per CPU):
//!
//! - an entry at depth d closes (as lost) the calls open at d and above,
//!   then opens its own at d (below it, depths whose entry the trace does
//!   not have stay unknown);
//! - an exit of `func` at depth d closes the call open at d if it is
//!   `func` (the calls above it, whose exits were lost, are dropped);
//!   else it has no entry (the call began before the tracer did, or its
//!   entry was lost) and is counted, not measured;
//! - a call lasts from its entry's timestamp to its exit's; its self time
//!   is that less its direct callees' calls; it counts in the phase it was
//!   entered in.
//!
//! On a trace without losses every exit closes the innermost entry: the
//! profile's counts and times are then exactly what the raw events give
//! (tests/boot computes both). Bounded: depths past [`DEPTH_MAX`], threads
//! past [`THREADS_MAX`] and rows past [`ROWS_MAX`] are refused and counted.

use std::collections::{BTreeMap, HashMap};

use ivtrace_region::kallsyms::Symbols;

use crate::events::{Event, What};
use crate::model::{Key, Pairing, Phase, Profile, Stat};
use crate::scan::func_name;

/// ftrace's own limit is FTRACE_RETFUNC_DEPTH, 50 (100 since 6.8).
pub const DEPTH_MAX: i32 = 1024;
pub const THREADS_MAX: usize = 1 << 20;
pub const ROWS_MAX: usize = 1 << 22;

struct Frame {
    func: u64,
    entry: u64,
    /// Cycles of its direct callees' calls.
    callees: u64,
}

/// The calls open in `frames` (known entries).
fn open_calls(frames: &[Option<Frame>]) -> u64 {
    frames.iter().filter(|f| f.is_some()).count() as u64
}

/// A thread's stack: pid, and the CPU for pid 0 (one idle task per CPU).
type TaskKey = (i32, u32);

/// The pass-2 state.
pub struct Profiler<'a> {
    phases: &'a [Phase],
    /// Phase names as row keys, once each.
    /// Per thread, the open calls by depth (None: a depth whose entry is
    /// not in the trace).
    stacks: HashMap<TaskKey, Vec<Option<Frame>>>,
    rows: HashMap<(usize, u64, i32), Stat>,
    pairing: Pairing,
}

impl<'a> Profiler<'a> {
    /// Calls are counted in the phase of `phases` they were entered in.
    pub fn new(phases: &'a [Phase]) -> Profiler<'a> {
        Profiler {
            phases,
            stacks: HashMap::new(),
            rows: HashMap::new(),
            pairing: Pairing::default(),
        }
    }

    fn phase_at(&self, ts: u64) -> usize {
        self.phases
            .partition_point(|p| p.start <= ts)
            .saturating_sub(1)
    }

    /// The next event; only graph entries and exits count.
    pub fn event(&mut self, e: &Event) {
        match e.what {
            What::Entry { func, depth } => self.entry(e, func, depth),
            What::Exit { func, depth } => self.exit(e, func, depth),
            _ => {}
        }
    }

    fn stack(&mut self, e: &Event) -> Option<&mut Vec<Option<Frame>>> {
        let key = (e.tid, if e.tid == 0 { e.cpu } else { 0 });
        if self.stacks.len() >= THREADS_MAX && !self.stacks.contains_key(&key) {
            self.pairing.refused += 1;
            return None;
        }
        Some(self.stacks.entry(key).or_default())
    }

    fn entry(&mut self, e: &Event, func: u64, depth: i32) {
        self.pairing.entries += 1;
        let Some(d) = usize::try_from(depth).ok().filter(|_| depth < DEPTH_MAX) else {
            self.pairing.refused += 1;
            return;
        };
        let Some(stack) = self.stack(e) else { return };
        let lost = open_calls(stack.get(d..).unwrap_or(&[]));
        stack.resize_with(d, || None);
        stack.push(Some(Frame {
            func,
            entry: e.ts,
            callees: 0,
        }));
        self.pairing.unclosed += lost;
    }

    fn exit(&mut self, e: &Event, func: u64, depth: i32) {
        self.pairing.exits += 1;
        let Some(d) = usize::try_from(depth).ok().filter(|_| depth < DEPTH_MAX) else {
            self.pairing.refused += 1;
            return;
        };
        let Some(stack) = self.stack(e) else { return };
        let lost = open_calls(stack.get(d + 1..).unwrap_or(&[]));
        let open = stack.get_mut(d).and_then(Option::take);
        stack.truncate(d);
        // A different call open at this depth lost its exit.
        let lost = lost + open.as_ref().is_some_and(|f| f.func != func) as u64;
        let f = open.filter(|f| f.func == func);
        let total = f.as_ref().map_or(0, |f| e.ts.saturating_sub(f.entry));
        if let (Some(_), Some(Some(parent))) = (&f, stack.last_mut()) {
            parent.callees = parent.callees.saturating_add(total);
        }
        self.pairing.unclosed += lost;
        let Some(f) = f else {
            self.pairing.unmatched_exits += 1;
            return;
        };
        self.pairing.calls += 1;
        let key = (self.phase_at(f.entry), func, e.tid);
        self.add(key, Stat::one(total, total.saturating_sub(f.callees)));
    }

    fn add(&mut self, key: (usize, u64, i32), s: Stat) {
        if let Some(row) = self.rows.get_mut(&key) {
            row.add(&s);
        } else if self.rows.len() < ROWS_MAX {
            self.rows.insert(key, s);
        } else {
            self.pairing.refused += 1;
        }
    }

    /// The profile: the calls still open count as unclosed; functions
    /// named with `symbols`, threads with `threads`.
    pub fn finish(mut self, symbols: &Symbols, threads: &BTreeMap<i32, String>) -> Profile {
        self.pairing.unclosed += self.stacks.values().map(|s| open_calls(s)).sum::<u64>();
        let mut rows = BTreeMap::new();
        let mut names = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for ((phase, func, tid), s) in self.rows {
            let name = self.phases.get(phase).map_or("", |p| p.name.as_str());
            rows.insert(
                Key {
                    phase: name.to_string(),
                    func,
                    tid,
                },
                s,
            );
            names
                .entry(func)
                .or_insert_with(|| func_name(symbols, func));
            if let Some(c) = threads.get(&tid) {
                seen.insert(tid, c.clone());
            }
        }
        Profile {
            rows,
            names,
            threads: seen,
            pairing: self.pairing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phases() -> Vec<Phase> {
        let p = |name: &str, start, end| Phase {
            name: name.into(),
            level: String::new(),
            stage: "kernel".into(),
            start,
            end,
        };
        vec![p("core", 0, 100), p("device", 100, 1000)]
    }

    fn ev(ts: u64, cpu: u32, tid: i32, what: What) -> Event {
        Event { ts, cpu, tid, what }
    }

    fn entry(ts: u64, tid: i32, func: u64, depth: i32) -> Event {
        ev(ts, 0, tid, What::Entry { func, depth })
    }

    fn exit(ts: u64, tid: i32, func: u64, depth: i32) -> Event {
        ev(ts, 0, tid, What::Exit { func, depth })
    }

    fn run(events: &[Event]) -> Profile {
        let ph = phases();
        let mut p = Profiler::new(&ph);
        events.iter().for_each(|e| p.event(e));
        p.finish(&Symbols::default(), &BTreeMap::new())
    }

    fn row(p: &Profile, phase: &str, func: u64, tid: i32) -> Stat {
        p.rows[&Key {
            phase: phase.into(),
            func,
            tid,
        }]
    }

    #[test]
    fn nested_calls_give_total_and_self() {
        // 1 calls 2 twice; the calls entered before 100 count in core.
        let p = run(&[
            entry(10, 7, 1, 0),
            entry(20, 7, 2, 1),
            exit(30, 7, 2, 1),
            entry(90, 7, 2, 1),
            exit(150, 7, 2, 1),
            exit(200, 7, 1, 0),
        ]);
        assert_eq!(
            row(&p, "core", 1, 7),
            Stat {
                count: 1,
                total: 190,
                self_: 120,
                min: 190,
                max: 190
            }
        );
        assert_eq!(
            row(&p, "core", 2, 7),
            Stat {
                count: 2,
                total: 70,
                self_: 70,
                min: 10,
                max: 60
            }
        );
        assert_eq!(p.pairing.calls, 3);
        assert_eq!((p.pairing.unmatched_exits, p.pairing.unclosed), (0, 0));
    }

    #[test]
    fn threads_and_idle_tasks_have_their_own_stacks() {
        let p = run(&[
            ev(110, 0, 0, What::Entry { func: 5, depth: 0 }),
            ev(111, 1, 0, What::Entry { func: 5, depth: 0 }),
            entry(112, 9, 5, 0),
            ev(120, 1, 0, What::Exit { func: 5, depth: 0 }),
            ev(130, 0, 0, What::Exit { func: 5, depth: 0 }),
            exit(140, 9, 5, 0),
        ]);
        assert_eq!(row(&p, "device", 5, 0).count, 2);
        assert_eq!(row(&p, "device", 5, 0).total, 20 + 9);
        assert_eq!(row(&p, "device", 5, 9).total, 28);
    }

    #[test]
    fn lost_events_are_counted_not_measured() {
        let p = run(&[
            exit(5, 7, 3, 0), // began before the tracer
            entry(10, 7, 1, 0),
            entry(20, 7, 2, 1), // its exit is lost ...
            exit(40, 7, 1, 0),  // ... its caller's comes
            entry(50, 7, 4, 2), // entries below are not in the trace
            exit(60, 7, 4, 2),
            entry(70, 7, 6, 0), // never returns
        ]);
        assert_eq!(row(&p, "core", 1, 7).total, 30);
        assert_eq!(row(&p, "core", 4, 7).total, 10);
        assert_eq!(p.pairing.unmatched_exits, 1);
        assert_eq!(p.pairing.unclosed, 2);
        assert_eq!(p.pairing.calls, 2);
    }

    #[test]
    fn hostile_depths_are_refused() {
        let p = run(&[
            entry(1, 1, 1, -1),
            entry(2, 1, 1, DEPTH_MAX),
            exit(3, 1, 1, i32::MAX),
        ]);
        assert_eq!(p.pairing.refused, 3);
        assert!(p.rows.is_empty());
    }
}
