//! Adaptive notification: the host sleeps on the guest's doorbell instead
//! of polling, and the guest rings only when it completes a packet while
//! the host sleeps (docs/abi.md "Host control, notification and time").
//!
//! The host's half of the handshake (announce the sleep, re-check every
//! channel, block, awake) is ivtrace-region's `protocol` (the
//! `host_sleeping` word and its fences), which the engine runs around the
//! wait ([`crate::engine`]); this is the blocking part: an epoll over the
//! doorbell eventfds. Partly filled packets never ring: the
//! writer's flush timer closes them (`flush_ms`, default 100 ms), which is
//! the staleness bound. The eventfd counter adds up the doorbells QEMU
//! delivered since the last read; [`Notifier`] sums them.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use crate::error::EngineError;

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// The epoll call `op` failed.
fn epoll_err(op: &'static str) -> impl FnOnce(Errno) -> EngineError {
    move |source| EngineError::Epoll { op, source }
}
use nix::errno::Errno;
use nix::poll::PollTimeout;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::EventFd;

use ivtrace_time::timebase::host_now_ns;

/// Token of the doorbell eventfds in the epoll set (vector k: DOORBELL + k).
const DOORBELL: u64 = 1 << 32;

/// What woke a blocking wait.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Wake {
    /// Doorbells read from the eventfds (their counters' sum).
    pub doorbells: u64,
    /// Host time right after the wait returned (the "received" instant).
    pub at_ns: u64,
    /// Tokens of other ready descriptors (added with [`Notifier::watch`]).
    pub tokens: Vec<u64>,
    /// The wait timed out with nothing ready.
    pub timed_out: bool,
}

/// Counters the summary reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct NotifyStats {
    /// Doorbells received (sum of the eventfd counters).
    pub doorbells: u64,
    /// Times the host set host_sleeping and re-checked (the engine counts
    /// them: [`crate::engine::HandshakeStats`]).
    pub sleep_attempts: u64,
    /// Re-checks that found a packet (no sleep).
    pub recheck_hits: u64,
    /// Waits that blocked.
    pub blocked: u64,
    /// Waits ended by a doorbell.
    pub woken_by_doorbell: u64,
    /// Waits ended by the safety timeout.
    pub timeouts: u64,
}

/// Epoll over the doorbell eventfds (guest -> host, one per vector) and
/// any other descriptor the caller watches (QEMU's socket, a wake-up fd).
pub struct Notifier {
    epoll: Epoll,
    doorbells: Vec<EventFd>,
    pub stats: NotifyStats,
}

impl Notifier {
    /// `doorbells`: non-blocking eventfds QEMU signals when the guest
    /// rings vector k of the host's peer id.
    pub fn new(doorbells: Vec<EventFd>) -> Result<Notifier> {
        let epoll =
            Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(epoll_err("epoll_create1"))?;
        for (k, fd) in doorbells.iter().enumerate() {
            epoll
                .add(
                    fd,
                    EpollEvent::new(EpollFlags::EPOLLIN, DOORBELL + k as u64),
                )
                .map_err(epoll_err("epoll_ctl(doorbell)"))?;
        }
        Ok(Notifier {
            epoll,
            doorbells,
            stats: NotifyStats::default(),
        })
    }

    /// Also wake on `fd` (readable, hang-up or error), reported as `token`
    /// (below 2^32).
    pub fn watch(&self, fd: BorrowedFd<'_>, token: u64) -> Result<()> {
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP;
        self.epoll
            .add(fd, EpollEvent::new(flags, token))
            .map_err(epoll_err("epoll_ctl(watch)"))
    }

    /// Stops watching `fd` (e.g. a socket that hung up for good).
    pub fn unwatch(&self, fd: BorrowedFd<'_>) {
        let _ = self.epoll.delete(fd);
    }

    pub fn has_doorbell(&self) -> bool {
        !self.doorbells.is_empty()
    }

    /// Blocks until a doorbell, a watched descriptor or `timeout`.
    pub fn block(&mut self, timeout: Duration) -> Result<Wake> {
        self.stats.blocked += 1;
        let mut events = [EpollEvent::empty(); 16];
        // Round up: a sub-millisecond timeout must not become a busy poll.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let t = PollTimeout::try_from(ms).unwrap_or(PollTimeout::NONE);
        let n = loop {
            match self.epoll.wait(&mut events, t) {
                Ok(n) => break n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(epoll_err("epoll_wait")(e)),
            }
        };
        let mut wake = Wake {
            timed_out: n == 0,
            ..Wake::default()
        };
        for ev in &events[..n] {
            if ev.data() < DOORBELL {
                wake.tokens.push(ev.data());
            }
        }
        wake.doorbells = self.read_doorbells();
        // After the read: every doorbell it counted was rung before this
        // instant (a ring between an earlier timestamp and the read, with
        // the thread preempted in between, would seem received before it
        // was rung).
        wake.at_ns = host_now_ns();
        if wake.doorbells > 0 {
            self.stats.woken_by_doorbell += 1;
        } else if wake.timed_out {
            self.stats.timeouts += 1;
        }
        Ok(wake)
    }

    /// Reads (and clears) every doorbell eventfd; returns the sum.
    pub fn read_doorbells(&mut self) -> u64 {
        let mut sum = 0u64;
        for fd in &self.doorbells {
            // Non-blocking: EAGAIN means zero since the last read.
            if let Ok(v) = fd.read() {
                sum = sum.saturating_add(v);
            }
        }
        self.stats.doorbells = self.stats.doorbells.saturating_add(sum);
        sum
    }

    /// The epoll descriptor (to nest it in another poll set).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::eventfd::EfdFlags;
    use std::time::Instant;

    fn efd() -> EventFd {
        EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).unwrap()
    }

    #[test]
    fn doorbells_are_summed_and_wake_the_wait() {
        let a = efd();
        let a2 = a.as_fd().try_clone_to_owned().unwrap();
        let mut n = Notifier::new(vec![a, efd()]).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            nix::unistd::write(&a2, &3u64.to_ne_bytes()).unwrap();
            nix::unistd::write(&a2, &2u64.to_ne_bytes()).unwrap();
        });
        let t0 = Instant::now();
        let wake = n.block(Duration::from_secs(5)).unwrap();
        t.join().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(4));
        // Both writes may or may not have landed before the read.
        let total = wake.doorbells + n.read_doorbells();
        assert_eq!(total, 5);
        assert_eq!(n.stats.doorbells, 5);
        assert_eq!(n.stats.woken_by_doorbell, 1);
    }

    #[test]
    fn timeout_is_reported_and_never_busy() {
        let mut n = Notifier::new(vec![efd()]).unwrap();
        let t0 = Instant::now();
        let wake = n.block(Duration::from_micros(300)).unwrap();
        assert!(wake.timed_out && wake.doorbells == 0);
        assert!(t0.elapsed() >= Duration::from_micros(300));
        assert_eq!(n.stats.timeouts, 1);
    }

    #[test]
    fn watched_descriptors_report_their_token() {
        let mut n = Notifier::new(vec![]).unwrap();
        let other = efd();
        n.watch(other.as_fd(), 7).unwrap();
        other.write(1).unwrap();
        let wake = n.block(Duration::from_secs(1)).unwrap();
        assert_eq!(wake.tokens, vec![7]);
    }
}
