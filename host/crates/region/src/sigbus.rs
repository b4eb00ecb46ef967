//! Surviving a region file that shrinks under its mapping.
//!
//! A process that can write the region file (the loopback writer of
//! `ivtrace record --shm`, or anyone with a descriptor of it) can
//! `ftruncate` it while the host has it mapped. The host's next access to
//! a page past the new end raises SIGBUS, whose default action kills the
//! recorder, and with `ivtrace serve` every guest's trace. The host only
//! touches the mapping for its control words (packets are copied with
//! pread(2), which returns short instead of faulting), so the fix is
//! small, and the one Wayland compositors use for client shm pools:
//!
//! - a SIGBUS handler, installed once per process, that looks the fault
//!   address up in a table of registered region mappings; for one of
//!   ours it maps a private anonymous zero page over the faulting page
//!   (`MAP_FIXED`), marks that region as shrunk and returns, so the
//!   faulting load reads 0 (a store goes to the private page) and the
//!   thread goes on;
//! - the reader checks the mark after each pass ([`Guard::hit`]) and stops
//!   that recording with a clear reason; the trace is finalized with what
//!   was read before (zeros read meanwhile look like a channel with
//!   nothing new, never like data);
//! - a fault anywhere else goes to the handler that was there before (the
//!   Rust runtime's guard-page check), or to the default action.
//!
//! `ivtrace serve` does not depend on this: its regions are memfds sealed
//! against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW) before any
//! client sees them, so a client's ftruncate fails with EPERM.
//!
//! Everything the handler does is async-signal-safe: atomic loads and
//! stores on a static table, and mmap(2) (a plain system call).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Mappings that can be registered at once (serve: one per guest and a
/// few per control command; more are simply not protected).
const SLOTS: usize = 4096;

struct Slot {
    /// 1 while a registration owns the slot.
    claimed: AtomicBool,
    /// Start of the mapping (0: none), published after `len`.
    start: AtomicUsize,
    len: AtomicUsize,
    /// The handler replaced a page of this mapping.
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    hit: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The SIGBUS action before ours (written once, before ours is installed).
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

/// A registered mapping; unregisters on drop (before the mapping goes).
#[derive(Debug)]
pub struct Guard {
    slot: Option<usize>,
}

impl Guard {
    /// Whether a page of the mapping was replaced: the file shrank.
    pub fn hit(&self) -> bool {
        self.slot
            .is_some_and(|i| TABLE[i].hit.load(Ordering::Relaxed))
    }

    /// Whether the mapping is protected (a slot was free and the handler
    /// is installed).
    pub fn protected(&self) -> bool {
        self.slot.is_some() && INSTALLED.load(Ordering::Relaxed)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let s = &TABLE[i];
            // Release: a handler that still sees the old start sees the
            // old len too; the mapping outlives this store.
            s.start.store(0, Ordering::Release);
            s.len.store(0, Ordering::Relaxed);
            s.hit.store(false, Ordering::Relaxed);
            s.claimed.store(false, Ordering::Release);
        }
    }
}

/// Protects the mapping `[start, start + len)` against a shrinking file.
pub fn register(start: *mut u8, len: usize) -> Guard {
    INSTALL.call_once(install);
    for (i, s) in TABLE.iter().enumerate() {
        if s.claimed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            s.hit.store(false, Ordering::Relaxed);
            s.len.store(len, Ordering::Relaxed);
            // Release: pairs with the handler's acquire load of start, so
            // it sees len once it sees start.
            s.start.store(start as usize, Ordering::Release);
            return Guard { slot: Some(i) };
        }
    }
    Guard { slot: None }
}

fn install() {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if let Ok(page @ 1..) = usize::try_from(page) {
        PAGE.store(page, Ordering::Relaxed);
    }
    // SAFETY: a zeroed sigaction is a valid value; PREVIOUS is written
    // here only, before our handler (its only reader) is installed, and
    // Once runs this exactly once.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sigbus;
        act.sa_sigaction = handler as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, &act, &mut old) == 0 {
            (*std::ptr::addr_of_mut!(PREVIOUS)).write(old);
            INSTALLED.store(true, Ordering::Release);
        }
    }
}

/// The registered mapping containing `addr`, if any.
fn slot_of(addr: usize) -> Option<&'static Slot> {
    TABLE.iter().find(|s| {
        // Acquire: pairs with register's release store of start.
        let start = s.start.load(Ordering::Acquire);
        start != 0
            && addr
                .checked_sub(start)
                .is_some_and(|at| at < s.len.load(Ordering::Relaxed))
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    if let Some(slot) = slot_of(addr) {
        let page = PAGE.load(Ordering::Relaxed);
        // PAGE is a power of two, at least 1 (install()).
        let base = addr & !page.wrapping_sub(1);
        // SAFETY: replaces one page inside a mapping this process owns
        // (registered above, unregistered before it is unmapped) with
        // private zeros; nothing else in the process refers to it but
        // the region's atomics, which then read zeros.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            slot.hit.store(true, Ordering::Relaxed);
            return;
        }
    }
    // SAFETY: PREVIOUS was written before this handler was installed.
    unsafe { chain(sig, info, ctx) }
}

/// Hands a fault that is not ours to the previous action.
///
/// # Safety
/// Called from the SIGBUS handler only, after `install` wrote PREVIOUS.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = (*std::ptr::addr_of!(PREVIOUS)).assume_init_ref();
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // Back to the default action: the faulting access repeats and
        // the process dies as it would have without us.
        libc::signal(sig, libc::SIG_DFL);
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            std::mem::transmute(h);
        f(sig, info, ctx);
    } else {
        let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
        f(sig);
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_truncated_mapping_reads_zeros_and_is_marked() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(4 * 4096).unwrap();
        // SAFETY: a fresh shared mapping of our own temporary file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4 * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        let guard = register(p, 4 * 4096);
        assert!(guard.protected());
        // SAFETY: inside the mapping; the file has 4 pages.
        unsafe { p.add(3 * 4096).write_volatile(7) };
        f.set_len(4096).unwrap();
        // SAFETY: inside the mapping; the page is past the end of the
        // file now, which is what the handler is for.
        let v = unsafe { p.add(3 * 4096).read_volatile() };
        assert_eq!(v, 0);
        assert!(guard.hit());
        // SAFETY: still the first page, inside the file.
        unsafe { p.write_volatile(1) };
        assert!(guard.hit());
        drop(guard);
        // SAFETY: our mapping, not used after this.
        unsafe { libc::munmap(p as *mut libc::c_void, 4 * 4096) };
    }
}
