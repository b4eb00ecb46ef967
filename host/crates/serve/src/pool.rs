//! The drain pool: every guest of a server is recorded by a bounded set of
//! worker threads (`--drain-threads`), not a thread per guest.
//!
//! A guest ([`GuestTask`]) takes turns: a look for its region, or a few
//! engine steps of its recording. A turn ends in one of three ways: more to
//! do (the guest goes to the back of the ready queue, so a flooding guest
//! shares the workers with the others and only its own ring overflows),
//! nothing to do (the guest is parked: its waiter's epoll descriptor, which
//! covers its doorbells, QEMU's connection and its wake-up eventfd, joins
//! the poller's epoll set, with a deadline for its clock sync, its safety
//! timeout or its polling backoff), or done. The poller thread moves parked
//! guests back to the ready queue when their descriptor is readable or
//! their deadline passes. A guest whose doorbell woke it for nothing (no
//! completed packet) sleeps a growing pause instead, its descriptor not
//! watched ([`Turn::Sleep`]): a guest ringing in a tight loop costs a
//! turn per pause, not a turn per ring (docs/hardening.md).
//!
//! Memory per guest is its region mapping, its packet buffer (one
//! sub-buffer), its stream files' buffers and its relay queue bound; no
//! thread stack.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::guest::{GuestTask, Turn};
use crate::{Result, ServeError};

/// The poller's own wake-up (a guest parked with an earlier deadline, or
/// the pool stopping).
const TOK_POLLER: u64 = u64::MAX;
/// The longest the poller sleeps without news.
const POLL_MAX: Duration = Duration::from_millis(500);

struct Parked {
    task: Box<GuestTask>,
    deadline: Instant,
    /// Its descriptor is in the poller's epoll set.
    watched: bool,
}

struct Shared {
    ready: Mutex<VecDeque<Box<GuestTask>>>,
    ready_cv: Condvar,
    parked: Mutex<HashMap<u64, Parked>>,
    epoll: Epoll,
    poller_wake: EventFd,
    /// Guests not done yet.
    live: AtomicUsize,
    next_id: Mutex<u64>,
    stopping: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The workers and the poller of a server.
pub struct Pool {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// Starts `workers` drain threads and the poller.
    pub fn start(workers: usize) -> Result<Pool> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(ServeError::sys("epoll_create1"))?;
        let poller_wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(ServeError::sys("eventfd"))?;
        epoll
            .add(
                poller_wake.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, TOK_POLLER),
            )
            .map_err(ServeError::sys("epoll_ctl(poller wake-up)"))?;
        let shared = Arc::new(Shared {
            ready: Mutex::new(VecDeque::new()),
            ready_cv: Condvar::new(),
            parked: Mutex::new(HashMap::new()),
            epoll,
            poller_wake,
            live: AtomicUsize::new(0),
            next_id: Mutex::new(0),
            stopping: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        for i in 0..workers.max(1) {
            let s = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("ivt-drain-{i}"))
                    .spawn(move || work(&s))
                    .map_err(ServeError::io("start a drain thread"))?,
            );
        }
        let s = Arc::clone(&shared);
        threads.push(
            std::thread::Builder::new()
                .name("ivt-poller".into())
                .spawn(move || poll_parked(&s))
                .map_err(ServeError::io("start the poller thread"))?,
        );
        Ok(Pool {
            shared,
            threads: Mutex::new(threads),
        })
    }

    /// Gives a new guest its first turn.
    pub fn submit(&self, task: GuestTask) {
        self.shared.live.fetch_add(1, Ordering::AcqRel);
        ready(&self.shared, Box::new(task));
    }

    /// Guests not done yet.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// Stops the threads (the caller waited for the guests to be done, as
    /// long as it would); a thread still busy with a guest is left behind.
    pub fn finish(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.ready_cv.notify_all();
        let _ = self.shared.poller_wake.write(1);
        if self.live() > 0 {
            return;
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            if t.join().is_err() {
                eprintln!("ivtrace serve: a drain thread panicked");
            }
        }
    }
}

fn ready(s: &Shared, task: Box<GuestTask>) {
    lock(&s.ready).push_back(task);
    s.ready_cv.notify_one();
}

/// A worker: takes the next ready guest, gives it a turn, puts it back.
fn work(s: &Shared) {
    loop {
        let mut q = lock(&s.ready);
        let task = loop {
            if let Some(t) = q.pop_front() {
                break Some(t);
            }
            if s.stopping.load(Ordering::Acquire) {
                break None;
            }
            q = s
                .ready_cv
                .wait_timeout(q, POLL_MAX)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        };
        drop(q);
        let Some(mut task) = task else { return };
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.turn()));
        match turn {
            Ok(Turn::Again) => ready(s, task),
            Ok(Turn::Park(deadline)) => park(s, task, deadline, Watch::Descriptor),
            Ok(Turn::Sleep(deadline)) => park(s, task, deadline, Watch::DeadlineOnly),
            Ok(Turn::Done) => {
                s.live.fetch_sub(1, Ordering::AcqRel);
            }
            Err(_) => {
                eprintln!(
                    "ivtrace serve: [{}] the recording panicked; the guest is dropped",
                    task.name()
                );
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.panicked()));
                s.live.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// What wakes a parked guest besides its deadline.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// Its descriptor becoming readable.
    Descriptor,
    /// Nothing: a guest that rings without producing sleeps its pause out.
    DeadlineOnly,
}

/// Parks `task` until `deadline` or, with [`Watch::Descriptor`], until its
/// descriptor is readable.
fn park(s: &Shared, task: Box<GuestTask>, deadline: Instant, watch: Watch) {
    let id = {
        let mut n = lock(&s.next_id);
        *n += 1;
        *n
    };
    let mut parked = lock(&s.parked);
    // Level-triggered: a descriptor already readable reports at once.
    let added = match watch {
        Watch::Descriptor => s
            .epoll
            .add(task.watch_fd(), EpollEvent::new(EpollFlags::EPOLLIN, id)),
        Watch::DeadlineOnly => Ok(()),
    };
    if let Err(e) = added {
        drop(parked);
        eprintln!(
            "ivtrace serve: [{}] cannot watch the guest ({e}); polling it",
            task.name()
        );
        std::thread::sleep(Duration::from_millis(1));
        ready(s, task);
        return;
    }
    parked.insert(
        id,
        Parked {
            task,
            deadline,
            watched: watch == Watch::Descriptor,
        },
    );
    drop(parked);
    // The poller may be sleeping past this deadline.
    let _ = s.poller_wake.write(1);
}

/// Moves parked guest `id` back to the ready queue.
fn unpark(s: &Shared, parked: &mut HashMap<u64, Parked>, id: u64) {
    if let Some(p) = parked.remove(&id) {
        if p.watched {
            let _ = s.epoll.delete(p.task.watch_fd());
        }
        ready(s, p.task);
    }
}

/// The poller: wakes parked guests whose descriptor is readable or whose
/// deadline passed.
fn poll_parked(s: &Shared) {
    let mut events = vec![EpollEvent::empty(); 64];
    while !s.stopping.load(Ordering::Acquire) {
        let timeout = next_timeout(s);
        let ms = timeout.as_millis().min(u16::MAX as u128) as u16;
        let n = match s.epoll.wait(&mut events, EpollTimeout::from(ms)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => {
                eprintln!("ivtrace serve: the drain poller failed ({e}); retrying");
                std::thread::sleep(Duration::from_millis(10));
                0
            }
        };
        let mut parked = lock(&s.parked);
        for ev in &events[..n] {
            match ev.data() {
                TOK_POLLER => {
                    let _ = s.poller_wake.read();
                }
                id => unpark(s, &mut parked, id),
            }
        }
        let now = Instant::now();
        let due: Vec<u64> = parked
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            unpark(s, &mut parked, id);
        }
    }
}

/// Until the earliest parked deadline (at most [`POLL_MAX`]), rounded up to
/// whole milliseconds so a deadline is never polled early in a loop.
fn next_timeout(s: &Shared) -> Duration {
    let parked = lock(&s.parked);
    let now = Instant::now();
    let earliest = parked.values().map(|p| p.deadline).min();
    match earliest {
        Some(d) => d
            .saturating_duration_since(now)
            .min(POLL_MAX)
            .as_micros()
            .div_ceil(1000)
            .try_into()
            .map(Duration::from_millis)
            .unwrap_or(POLL_MAX),
        None => POLL_MAX,
    }
}
