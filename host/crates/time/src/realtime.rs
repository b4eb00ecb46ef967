//! A bounded lift to real-time priority for the milliseconds the host
//! spins in a clock exchange.
//!
//! A round trip needs the host's thread and the guest's vCPU thread
//! running at the same time on two CPUs. On a loaded host the scheduler
//! takes the spinning thread off its CPU now and then, and an exchange that
//! loses the host for even 20 us loses the writer (its patience,
//! `IVT_SYNC_PATIENCE_NS`). So while it spins (a window of a few
//! milliseconds, or a kicked burst), the thread runs as `SCHED_FIFO`
//! priority 1, the lowest real-time priority, when it may (root or
//! `RLIMIT_RTPRIO`), and goes back to its own policy after. Not permitted,
//! or already real-time (run under `chrt`): nothing changes. Every spin
//! the lift covers is bounded in time by the exchange's own deadlines.

/// The lift, undone when dropped.
pub struct Boost {
    /// The policy and priority to go back to, if this lifted it.
    restore: Option<(libc::c_int, libc::sched_param)>,
}

impl Boost {
    /// Lifts the calling thread to `SCHED_FIFO` 1 if it may.
    pub fn lift() -> Boost {
        // SAFETY: sched_getscheduler/sched_getparam/sched_setscheduler on
        // the calling thread (pid 0) only read or write the scheduling
        // policy; the param struct lives on this stack for the call.
        unsafe {
            let policy = libc::sched_getscheduler(0);
            let mut old = libc::sched_param { sched_priority: 0 };
            if policy < 0 || policy == libc::SCHED_FIFO || policy == libc::SCHED_RR {
                return Boost { restore: None };
            }
            if libc::sched_getparam(0, &mut old) != 0 {
                return Boost { restore: None };
            }
            let rt = libc::sched_param { sched_priority: 1 };
            if libc::sched_setscheduler(0, libc::SCHED_FIFO, &rt) != 0 {
                return Boost { restore: None };
            }
            Boost {
                restore: Some((policy, old)),
            }
        }
    }

    /// True when the thread runs lifted.
    pub fn lifted(&self) -> bool {
        self.restore.is_some()
    }
}

impl Drop for Boost {
    fn drop(&mut self) {
        if let Some((policy, param)) = self.restore.take() {
            // SAFETY: as in lift(): the calling thread's own policy.
            unsafe {
                libc::sched_setscheduler(0, policy, &param);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lift_is_undone() {
        // SAFETY: reads the calling thread's policy.
        let before = unsafe { libc::sched_getscheduler(0) };
        {
            let b = Boost::lift();
            let during = unsafe { libc::sched_getscheduler(0) };
            if b.lifted() {
                assert_eq!(during, libc::SCHED_FIFO);
            } else {
                assert_eq!(during, before, "not permitted: nothing changes");
            }
        }
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, before);
    }
}
