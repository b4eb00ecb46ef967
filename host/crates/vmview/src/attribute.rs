//! Which guest thread was running on a vCPU at a host time: the guest's
//! own context switches on that CPU (its kernel trace's `sched_switch`,
//! mapped to host time), walked forward as the VM view's outputs come in
//! time order per vCPU. Before the first switch the CPU shows, the thread
//! is the one that switch switches out.

use std::collections::HashMap;
use std::iter::Peekable;

use crate::model::{GuestSwitch, GuestThread};

/// The guest thread on one CPU, walking forward in time.
pub struct CpuCursor<I: Iterator<Item = GuestSwitch>> {
    switches: Peekable<I>,
    current: Option<GuestThread>,
}

impl<I: Iterator<Item = GuestSwitch>> CpuCursor<I> {
    pub fn new(switches: I) -> Self {
        CpuCursor {
            switches: switches.peekable(),
            current: None,
        }
    }

    /// The thread running at `ts` (queries must not go back in time; one
    /// that does gets the latest answer).
    pub fn thread_at(&mut self, ts: u64) -> GuestThread {
        while let Some(s) = self.switches.next_if(|s| s.ts <= ts) {
            self.current = Some(GuestThread {
                tid: s.next_tid,
                comm: s.next_comm,
            });
        }
        self.current.unwrap_or_else(|| match self.switches.peek() {
            Some(s) => GuestThread {
                tid: s.prev_tid,
                comm: s.prev_comm,
            },
            None => GuestThread::UNKNOWN,
        })
    }
}

/// A cursor per guest CPU.
pub struct Attributor<I: Iterator<Item = GuestSwitch>> {
    cpus: HashMap<u32, CpuCursor<I>>,
}

impl<I: Iterator<Item = GuestSwitch>> Attributor<I> {
    /// `cpus`: each guest CPU's switches, in time order.
    pub fn new(cpus: impl IntoIterator<Item = (u32, I)>) -> Self {
        Attributor {
            cpus: cpus
                .into_iter()
                .map(|(cpu, it)| (cpu, CpuCursor::new(it)))
                .collect(),
        }
    }

    /// The guest thread on `vcpu` at `ts`; unknown for a CPU the guest
    /// trace does not show.
    pub fn thread_at(&mut self, vcpu: u32, ts: u64) -> GuestThread {
        self.cpus
            .get_mut(&vcpu)
            .map_or(GuestThread::UNKNOWN, |c| c.thread_at(ts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::comm;

    fn sw(ts: u64, prev: (i32, &str), next: (i32, &str)) -> GuestSwitch {
        GuestSwitch {
            ts,
            cpu: 0,
            prev_tid: prev.0,
            prev_comm: comm(prev.1),
            next_tid: next.0,
            next_comm: comm(next.1),
        }
    }

    #[test]
    fn the_thread_at_a_time_is_the_last_switched_in() {
        let s = vec![
            sw(100, (0, "swapper/0"), (7, "spin")),
            sw(200, (7, "spin"), (8, "sh")),
        ];
        let mut a = Attributor::new([(0u32, s.into_iter())]);
        assert_eq!(
            a.thread_at(0, 50).tid,
            0,
            "before the first switch: its prev"
        );
        assert_eq!(a.thread_at(0, 100).tid, 7);
        assert_eq!(a.thread_at(0, 199).comm, comm("spin"));
        assert_eq!(a.thread_at(0, 500).tid, 8);
        assert_eq!(a.thread_at(0, 10).tid, 8, "never back in time");
        assert_eq!(a.thread_at(3, 10), GuestThread::UNKNOWN);
    }
}
