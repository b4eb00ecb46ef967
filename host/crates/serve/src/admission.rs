//! Descriptors: how many serve has, and how many guests it takes.
//!
//! Every guest costs descriptors for as long as it is recorded (its
//! connection, its region, 2 x vectors eventfds, an epoll, a wake-up
//! eventfd, at most `SERVE_OPEN_FILES` stream files, its host
//! trace, the host events' per-CPU readers, and at the end the kernel
//! expansion's files). A server that accepts guests until `accept` or
//! `open` fails takes that failure out on a guest that is already
//! recording (a stream file it cannot create, a region it cannot reopen).
//! So serve:
//!
//! - raises its soft RLIMIT_NOFILE to the hard limit at start (the soft
//!   limit is 1024 on most systems; the hard one is usually much higher);
//! - reserves a budget per guest and refuses a new connection (logged,
//!   the socket closed at once) when the guests already admitted would
//!   leave less than a guest's budget, or when the descriptors actually
//!   open say so;
//! - gives every descriptor of a guest back when it goes (the registry
//!   keeps only a finished guest's last status);
//! - does not count a guest whose QEMU hung up before its region was
//!   recorded ([`Seat`]): the drain pool ends such a guest when a worker
//!   next gets to it, which under load can be many connections later, and
//!   it will never open another descriptor (it only closes the few it has).
//!   Counting it refused a new QEMU while serve was within its limits
//!   (VMs started in a row: 10 hung-up guests awaiting their turn filled a
//!   1024-descriptor budget). The descriptors it still has are counted by
//!   the check of the descriptors actually open.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Descriptors serve keeps for itself: sockets, the signal pipe, control
/// connections, the host time base, standard streams, headroom.
const BASE: u64 = 64 + super::MAX_CONTROLS as u64;
/// Per guest, besides its eventfds, stream files and host events:
/// connection, region (twice: ours and the reopened one), epoll, wake-up
/// eventfd, host trace files, metadata rewrites, the control lock.
const PER_GUEST_FIXED: u64 = 16;
/// Headroom per guest for the kernel expansion at the end of a recording
/// (it reads the staged files of several CPUs at once).
const EXPANSION: u64 = 32;

/// The descriptor budget of one server.
#[derive(Debug, Clone)]
pub struct Budget {
    /// The soft limit after raising it.
    pub limit: u64,
    /// The soft limit before.
    pub was: u64,
    pub per_guest: u64,
}

use ivtrace_engine::limits::raise_nofile_limit;

/// Descriptors this process has open (None if /proc says nothing).
pub fn open_descriptors() -> Option<u64> {
    let rd = std::fs::read_dir(Path::new("/proc/self/fd")).ok()?;
    // Minus the one read_dir itself holds.
    Some(rd.count().saturating_sub(1) as u64)
}

impl Budget {
    /// Raises the limit and sizes the per-guest budget for `vectors`
    /// interrupt vectors and `open_files` stream files per recording.
    pub fn new(vectors: u32, open_files: usize) -> Budget {
        let (was, limit) = raise_nofile_limit();
        let cpus = std::thread::available_parallelism().map_or(64, |n| n.get() as u64);
        let per_guest =
            PER_GUEST_FIXED + 2 * vectors as u64 + open_files as u64 + 2 * cpus + EXPANSION;
        Budget {
            limit,
            was,
            per_guest,
        }
    }

    /// Guests the limit allows at once.
    pub fn max_guests(&self) -> u64 {
        self.limit.saturating_sub(BASE) / self.per_guest.max(1)
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        let raised = if self.limit > self.was {
            format!("raised from {}", self.was)
        } else {
            "the hard limit".into()
        };
        format!(
            "descriptor limit {} ({raised}): up to {} guests at once ({} descriptors each)",
            self.limit,
            self.max_guests(),
            self.per_guest
        )
    }

    /// Whether one more guest fits beside `live` ones; else why not.
    pub fn admit(&self, live: usize) -> Result<(), String> {
        let live = live as u64;
        if live + 1 > self.max_guests() {
            return Err(format!(
                "{live} guests are being served and the descriptor limit {} leaves room for {} \
                 ({} descriptors each); raise the limit (ulimit -n, or LimitNOFILE= in the \
                 service unit) to serve more at once",
                self.limit,
                self.max_guests(),
                self.per_guest
            ));
        }
        match open_descriptors() {
            Some(open) if open + self.per_guest + BASE / 2 > self.limit => Err(format!(
                "{open} descriptors are open of the limit {}: no room for another guest \
                 ({} each) without putting the recording guests at risk",
                self.limit, self.per_guest
            )),
            _ => Ok(()),
        }
    }
}

/// A guest's place in the budget: waiting (for its region to be formatted,
/// again after a recording, or for a migration to end), recording, or
/// gone (its QEMU hung up while it waited: it will never record).
///
/// The accept loop moves a waiting guest whose connection hung up to gone
/// and stops counting it; the guest's task moves waiting to recording
/// before it starts a recording. Both are one compare-and-swap on the same
/// state, so a guest that is no longer counted can never start recording.
pub struct Seat {
    state: AtomicU8,
    /// QEMU's connection (shared with the guest's waiter; no descriptor of
    /// its own).
    conn: Arc<UnixStream>,
}

const WAITING: u8 = 0;
const RECORDING: u8 = 1;
const GONE: u8 = 2;

impl Seat {
    pub fn new(conn: Arc<UnixStream>) -> Seat {
        Seat {
            state: AtomicU8::new(WAITING),
            conn,
        }
    }

    /// The guest's task, before it records: false if the guest is gone.
    pub fn start_recording(&self) -> bool {
        // AcqRel/Acquire: pairs with the accept loop's swap to GONE in
        // `leave_if_hung_up`; exactly one of the two swaps succeeds.
        self.state
            .compare_exchange(WAITING, RECORDING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The guest's task, after a recording, when the guest may format its
    /// region again (waiting again: it leaves once it hangs up).
    pub fn stop_recording(&self) {
        // AcqRel: pairs with the Acquire load in `leave_if_hung_up`.
        let _ =
            self.state
                .compare_exchange(RECORDING, WAITING, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The accept loop: a waiting guest whose connection is readable (QEMU
    /// hung up; QEMU never sends data, so bytes end the guest too) leaves
    /// the budget. Returns whether the guest is gone.
    pub fn leave_if_hung_up(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        // Acquire: pairs with the task's swaps (a recording guest stays).
        match self.state.load(Ordering::Acquire) {
            GONE => return true,
            RECORDING => return false,
            _ => {}
        }
        let mut fds = [PollFd::new(self.conn.as_fd(), PollFlags::POLLIN)];
        let hung_up = matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0);
        hung_up
            && self
                .state
                .compare_exchange(WAITING, GONE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guests_are_refused_before_the_limit_is_reached() {
        let b = Budget {
            limit: 1024,
            was: 1024,
            per_guest: 100,
        };
        assert_eq!(b.max_guests(), (1024 - BASE) / 100);
        assert!(b.admit(0).is_ok());
        let err = b.admit(b.max_guests() as usize).unwrap_err();
        assert!(err.contains("raise the limit"), "{err}");
        assert!(open_descriptors().is_some_and(|n| n > 2));
    }

    #[test]
    fn a_guest_that_hung_up_while_waiting_leaves_and_never_records() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let seat = Seat::new(Arc::new(ours));
        assert!(!seat.leave_if_hung_up(), "the peer is still there");
        drop(theirs);
        assert!(seat.leave_if_hung_up());
        assert!(seat.leave_if_hung_up(), "and stays gone");
        assert!(
            !seat.start_recording(),
            "a guest no longer counted must not record"
        );
    }

    #[test]
    fn a_recording_guest_stays_counted_after_its_peer_hangs_up() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let seat = Seat::new(Arc::new(ours));
        assert!(seat.start_recording());
        drop(theirs);
        // It still finalizes its trace (the kernel expansion needs its budget).
        assert!(!seat.leave_if_hung_up());
        seat.stop_recording();
        assert!(
            seat.leave_if_hung_up(),
            "waiting again, and hung up: it leaves"
        );
    }
}
