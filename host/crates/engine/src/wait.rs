//! How a recording waits when a drain pass found nothing: a front end
//! picks a [`Wait`]. [`Backoff`] sleeps, doubling the sleep while nothing
//! comes (a region without doorbells: `ivtrace record`); a waiter on the
//! doorbell eventfds ([`crate::notify::Notifier`]) sleeps until a writer
//! rings, and the engine runs the sleep handshake around it (ivtrace-
//! region's `Protocol::announce_sleep`), so no packet completed meanwhile
//! is missed.

use std::time::Duration;

use crate::engine::StopReason;
use crate::error::EngineError;

/// What ended a wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Woken {
    /// Doorbells rung since the last wait (their eventfd counters' sum).
    pub doorbells: u64,
    /// Host time right after the wait returned (the "received" instant).
    pub at_ns: u64,
    /// The writer's side went away while waiting (the peer hung up):
    /// drain once more, then stop.
    pub ending: Option<StopReason>,
}

/// How the engine waits for more packets.
pub trait Wait {
    /// True when writers ring a doorbell while the host sleeps: the engine
    /// then announces the sleep, re-checks every channel, and only blocks
    /// if that found nothing.
    fn doorbell(&self) -> bool {
        false
    }

    /// Blocks until something may have changed, for at most `limit`. A
    /// front end's own failure is [`EngineError::Front`].
    fn block(&mut self, limit: Duration) -> Result<Woken, EngineError>;

    /// A pass found packets: start any backoff over.
    fn busy(&mut self) {}
}

/// Sleeps between passes, from `min` doubling up to `max` while nothing
/// comes: latency stays low under load, idle costs stay small.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The next sleep, at most `limit`; doubles the one after.
    pub fn step(&mut self, limit: Duration) -> Duration {
        let now = self.next.min(limit);
        self.next = (self.next * 2).min(self.max);
        now
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

impl Wait for Backoff {
    fn block(&mut self, limit: Duration) -> Result<Woken, EngineError> {
        std::thread::sleep(self.step(limit));
        Ok(Woken::default())
    }

    fn busy(&mut self) {
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_max_and_restarts() {
        let us = Duration::from_micros;
        let mut b = Backoff::new(us(20), us(100));
        let steps: Vec<_> = (0..5).map(|_| b.step(Duration::MAX)).collect();
        assert_eq!(steps, [us(20), us(40), us(80), us(100), us(100)]);
        assert_eq!(b.step(us(30)), us(30), "never past the limit");
        b.reset();
        assert_eq!(b.step(Duration::MAX), us(20));
    }
}
