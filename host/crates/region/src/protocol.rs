//! The host's half of the shared-memory protocol, as typed operations.
//!
//! The writer's half is `abi/include/ivtrace/writer.h` (and the guest
//! module's `ivtk_ctl.c`); this file is its counterpart, and the only
//! place outside [`crate::region`] that touches a control word. Every
//! access says which ordering it uses and what it pairs with on the other
//! side, so the two halves can be checked against each other here:
//!
//! - drain: `commit_pos` (acquire), the torn-copy re-check of `open_seq`
//!   (acquire fence), handing sub-buffers back with `consumed` (release),
//!   the writers' loss counters (relaxed);
//! - metadata: `meta_tail` and each record's `commit` (acquire);
//! - lifecycle: the formatter's magic (acquire), the host heartbeat, the
//!   region's `state` (acquire);
//! - notification: the `host_sleeping` handshake (a full fence on each
//!   side), the doorbell target;
//! - control: a command posted in `struct ivt_control` (release) and its
//!   acknowledgement (acquire), one host controller at a time (flock);
//! - clock sync: one ping-pong exchange through `struct ivt_sync`;
//! - statistics the writers keep in the header (doorbells rung, events
//!   lost for want of a channel).
//!
//! docs/abi.md "Host control, notification and time" describes the
//! protocol; writer.h names the writer-side functions cited below.

use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use thiserror::Error;

use crate::abi;
use crate::reader::WriterLosses;
use crate::region::Region;

/// The host's side of the protocol on one region.
#[derive(Clone, Copy)]
pub struct Protocol<'r> {
    region: &'r Region,
}

impl Region {
    /// The host's half of the protocol on this region.
    pub fn protocol(&self) -> Protocol<'_> {
        Protocol { region: self }
    }
}

fn hdr(off: usize) -> u64 {
    off as u64
}

fn control(off: usize) -> u64 {
    abi::hdr::CONTROL.saturating_add(off) as u64
}

fn sync(off: usize) -> u64 {
    abi::hdr::SYNC.saturating_add(off) as u64
}

/// Drain: the channel words.
impl Protocol<'_> {
    fn chan(&self, c: u32, field: u64) -> u64 {
        // Saturating: an offset past the region fails the access's check.
        self.region.layout().channel_offset(c).saturating_add(field)
    }

    /// How far channel `c`'s writers have committed. Pairs with the
    /// store-release of commit_pos in ivt_writer_commit(),
    /// ivt_writer_close() and ivt_writer_seal_orphan() (writer.h): every
    /// byte below the loaded position is visible after this load.
    pub fn commit_pos(&self, c: u32) -> u64 {
        self.region
            .load_acquire_u64(self.chan(c, abi::chan::COMMIT_POS))
    }

    /// Sub-buffers of channel `c` a host has handed back. Relaxed: only
    /// hosts write `consumed`; no writer data is read on its strength.
    pub fn consumed(&self, c: u32) -> u64 {
        self.region
            .load_relaxed_u64(self.chan(c, abi::chan::CONSUMED))
    }

    /// Hands channel `c`'s sub-buffers below `seq` back to the writer.
    /// Pairs with the load-acquire of `consumed` in ivt_writer_open(), so
    /// the host's copies happen before the writer reuses a sub-buffer
    /// (discard mode). Nothing on a read-only region.
    pub(crate) fn release_subbufs(&self, c: u32, seq: u64) {
        self.region
            .store_release_u64(self.chan(c, abi::chan::CONSUMED), seq);
    }

    /// `open_seq` of channel `c`, read right after a copy out of it (the
    /// seqlock-style torn-copy check): the acquire fence orders the copy
    /// before this load, pairing with the release fence after the store
    /// of open_seq in ivt_writer_open() (writer.h). Relaxed load: ordered
    /// by the fence.
    pub(crate) fn open_seq_after_copy(&self, c: u32) -> u64 {
        self.region.fence_acquire();
        self.region
            .load_relaxed_u64(self.chan(c, abi::chan::OPEN_SEQ))
    }

    /// The writers' drop counters of channel `c`. Relaxed: statistics,
    /// each counter is monotonic and nothing else is read on their
    /// strength.
    pub fn writer_losses(&self, c: u32) -> WriterLosses {
        let load = |f| self.region.load_relaxed_u64(self.chan(c, f));
        WriterLosses {
            full: load(abi::chan::LOST_FULL),
            too_big: load(abi::chan::LOST_TOO_BIG),
            nested: load(abi::chan::LOST_NESTED),
        }
    }

    /// Events channel `c`'s writers closed into packets. Relaxed: read
    /// for the final statistics, once the region is closed or stopped.
    pub fn events_closed(&self, c: u32) -> u64 {
        self.region
            .load_relaxed_u64(self.chan(c, abi::chan::EVENTS_CLOSED))
    }
}

/// Metadata: the event descriptions the writers register.
impl Protocol<'_> {
    /// Where the next description may be written. Relaxed: only a bound
    /// on where records may be; each record's own commit word
    /// ([`Protocol::meta_record`]) orders its contents.
    pub(crate) fn meta_tail(&self) -> u32 {
        self.region.load_relaxed_u32(hdr(abi::hdr::META_TAIL))
    }

    /// The `commit` and `len` words of the description at byte `off` of
    /// the region. Pairs with the store-release of `commit` in
    /// ivt_event_register() (guest/lib): a committed record's len and
    /// body are complete. `len` is relaxed: written before commit; only
    /// its value matters.
    pub(crate) fn meta_record(&self, off: u64) -> (u32, u32) {
        let commit = self
            .region
            .load_acquire_u32(off.saturating_add(abi::meta::COMMIT as u64));
        let len = self
            .region
            .load_relaxed_u32(off.saturating_add(abi::meta::LEN as u64));
        (commit, len)
    }
}

/// Lifecycle: the formatter's magic, the host's liveness, the writer's
/// state.
impl Protocol<'_> {
    /// The magic, as the formatter published it. Pairs with the
    /// store-release of magic at the end of ivt_region_format()
    /// (abi/include/ivtrace/format.h): once the magic is seen, every
    /// header store before it is visible.
    pub(crate) fn published_magic(&self) -> u64 {
        self.region.load_acquire_u64(hdr(abi::hdr::MAGIC))
    }

    /// Beats the host heartbeat. Relaxed: a liveness counter; writers
    /// only compare its values.
    pub fn heartbeat(&self, beat: u64) {
        self.region
            .store_relaxed_u64(hdr(abi::hdr::HOST_HEARTBEAT), beat);
    }

    /// Whether the writer closed the region. Pairs with the store-release
    /// of `state` in ivt_region_close() (guest/lib) and
    /// ivtk_region_close() (the module): every packet committed before it
    /// is visible to the next drain pass, which is the last.
    pub fn writer_closed(&self) -> bool {
        self.region.load_acquire_u32(hdr(abi::hdr::STATE)) == abi::IVT_STATE_CLOSED
    }

    /// False once the region has been withdrawn for reformatting
    /// (ivt_region_format() stores a zero magic first). Relaxed: only the
    /// value matters, nothing is read on its strength.
    pub fn still_formatted(&self) -> bool {
        self.region.load_relaxed_u64(hdr(abi::hdr::MAGIC)) == abi::IVT_MAGIC
    }
}

/// Notification: the host sleeps on the doorbell instead of polling.
///
/// ```text
/// host                                        writer (ivt_writer_close)
/// store host_sleeping = 1                     store-release commit_pos
/// full fence            <-- pairs with -->    full fence
/// load every commit_pos (a drain pass)        load host_sleeping
/// nothing new? block on the doorbell          set? ring the doorbell
/// store host_sleeping = 0
/// ```
///
/// At least one side sees the other's store, so a packet completed just
/// as the host decides to sleep is either drained by the re-check or
/// rings the doorbell; no wake-up is lost.
impl Protocol<'_> {
    /// Announces the sleep; the caller then re-checks every channel (a
    /// drain pass) and blocks only if that found nothing, then calls
    /// [`Protocol::awake`]. Relaxed store, then the full fence: the fence
    /// orders it before the re-check's loads of commit_pos. Pairs with
    /// the writer's full fence between its commit_pos store and its
    /// host_sleeping load (ivt_writer_close() in writer.h).
    pub fn announce_sleep(&self) {
        self.region
            .store_relaxed_u32(hdr(abi::hdr::HOST_SLEEPING), 1);
        self.region.fence_full();
    }

    /// The host is awake (or calls its sleep off): writers stop ringing.
    /// Relaxed: a stale 1 only costs a spurious doorbell, a stale 0
    /// cannot happen before this store.
    pub fn awake(&self) {
        self.region
            .store_relaxed_u32(hdr(abi::hdr::HOST_SLEEPING), 0);
    }

    /// Where writers ring (`host_peer_id`, `host_vector`): one u32 store
    /// of the two adjacent u16 words. Relaxed: the writer reads them with
    /// READ_ONCE when it rings, after it has seen `host_sleeping` set, and
    /// this store precedes the host's first store of `host_sleeping` (and
    /// its full fence) in program order.
    pub fn set_doorbell_target(&self, peer: u16, vector: u16) {
        self.region.store_relaxed_u32(
            hdr(abi::hdr::HOST_PEER_ID),
            peer as u32 | (vector as u32) << 16,
        );
    }
}

/// A control command (abi.h `IVT_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Close every open packet now.
    Flush,
    /// Enable these event groups (mask).
    Enable(u32),
    /// Disable these event groups (mask).
    Disable(u32),
    /// Set every channel's mode (`IVT_MODE_*`), taken at the next packet.
    SetMode(u32),
    /// Re-emit thread and interrupt names.
    Statedump,
}

impl Command {
    pub fn code(self) -> u32 {
        match self {
            Command::Flush => abi::IVT_CMD_FLUSH,
            Command::Enable(_) => abi::IVT_CMD_ENABLE,
            Command::Disable(_) => abi::IVT_CMD_DISABLE,
            Command::SetMode(_) => abi::IVT_CMD_SET_MODE,
            Command::Statedump => abi::IVT_CMD_STATEDUMP,
        }
    }

    pub fn arg(self) -> u64 {
        match self {
            Command::Enable(m) | Command::Disable(m) => m as u64,
            Command::SetMode(m) => m as u64,
            _ => 0,
        }
    }
}

/// The writer's answer to one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub seq: u64,
    /// 0 or -errno (e.g. -22 for an unknown command or group).
    pub status: i32,
    pub groups_enabled: u32,
    /// From posting the command to seeing the acknowledgement.
    pub latency: Duration,
}

/// Why a control command got no acknowledgement.
#[derive(Debug, Error)]
pub enum ControlError {
    #[error(
        "this region's writer does not obey control commands (no IVT_FEAT_CONTROL: \
         libivtrace regions have none; the guest module has)"
    )]
    Unsupported,
    #[error("cannot duplicate the region file: {0}")]
    Duplicate(std::io::Error),
    #[error("cannot lock the region file for a control command: {0}")]
    Lock(nix::Error),
    #[error(
        "the region file stayed locked for {secs:.1} s: another controller (ivtrace ctl --shm, \
         or any process holding flock on it) is in the way; command not sent"
    )]
    Locked { secs: f64 },
    #[error(
        "no acknowledgement of command #{seq} within {secs:.1} s (is ivtrace.ko loaded and \
         bound to this device? an ivshmem-plain guest reads commands every flush_ms)"
    )]
    NoAck { seq: u64, secs: f64 },
}

/// Control: one command at a time, posted and acknowledged.
///
/// The host writes `cmd` and `arg`, store-releases `cmd_seq = previous +
/// 1` and kicks the writer (MSI-X vector 0 of an ivshmem-doorbell device;
/// an ivshmem-plain guest polls every `flush_interval_ms`). The writer
/// acts, writes `ack_status` and `groups_enabled`, store-releases
/// `ack_seq`. One host controller at a time: the host holds an exclusive
/// `flock` on the region file while it posts and waits, so `ivtrace serve`
/// and `ivtrace ctl --shm` never interleave their commands.
impl Protocol<'_> {
    /// Posts `cmd` under an exclusive lock of the region file, calls
    /// `kick` (wake the writer; may do nothing), and waits up to
    /// `timeout` for the acknowledgement.
    pub fn send_command(
        &self,
        cmd: Command,
        kick: &dyn Fn(),
        timeout: Duration,
    ) -> Result<Ack, ControlError> {
        if self.region.header().features & abi::IVT_FEAT_CONTROL == 0 {
            return Err(ControlError::Unsupported);
        }
        let _lock = self.lock_controller(timeout)?;
        self.post_and_wait(cmd.code(), cmd.arg(), kick, timeout)
    }

    /// Posts (`code`, `arg`), kicks, waits for the acknowledgement. The
    /// caller holds the lock (and wrote what the command refers to).
    fn post_and_wait(
        &self,
        code: u32,
        arg: u64,
        kick: &dyn Fn(),
        timeout: Duration,
    ) -> Result<Ack, ControlError> {
        let t0 = Instant::now();
        let seq = self.post(code, arg);
        kick();
        let mut sleep = Duration::from_micros(20);
        loop {
            if let Some((status, groups_enabled)) = self.ack(seq) {
                let latency = t0.elapsed();
                return Ok(Ack {
                    seq,
                    status,
                    groups_enabled,
                    latency,
                });
            }
            if t0.elapsed() >= timeout {
                let secs = timeout.as_secs_f64();
                return Err(ControlError::NoAck { seq, secs });
            }
            std::thread::sleep(sleep);
            sleep = sleep.saturating_mul(2).min(Duration::from_millis(5));
        }
    }

    /// The exclusive lock of the region file (none for an in-memory
    /// region: nobody else can reach it), waited for at most `timeout`:
    /// anyone who can open the region file can hold its lock forever, and
    /// a blocking flock would hang the caller (a served guest's thread)
    /// with it.
    fn lock_controller(
        &self,
        timeout: Duration,
    ) -> Result<Option<Flock<std::fs::File>>, ControlError> {
        let Some(file) = self.region.file() else {
            return Ok(None);
        };
        let mut dup = file.try_clone().map_err(ControlError::Duplicate)?;
        let t0 = Instant::now();
        let mut sleep = Duration::from_micros(100);
        loop {
            match Flock::lock(dup, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(Some(lock)),
                Err((f, nix::errno::Errno::EWOULDBLOCK)) if t0.elapsed() < timeout => {
                    dup = f;
                    std::thread::sleep(sleep);
                    sleep = sleep.saturating_mul(2).min(Duration::from_millis(20));
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    let secs = timeout.as_secs_f64();
                    return Err(ControlError::Locked { secs });
                }
                Err((f, nix::errno::Errno::EINTR)) => dup = f,
                Err((_, e)) => return Err(ControlError::Lock(e)),
            }
        }
    }

    /// Posts a command; returns its sequence number. The caller holds the lock.
    fn post(&self, code: u32, arg: u64) -> u64 {
        // Relaxed: cmd_seq is host-owned; we are the only host writing it
        // (flock), so its last value is ours or an earlier controller's.
        // ack_seq too: in a migrated region cmd_seq can be older than the
        // guest's last acknowledgement (see `last_sync_request`), and a
        // number equal to that ack would be taken as answered at once.
        let last = self
            .region
            .load_relaxed_u64(control(abi::control::CMD_SEQ))
            .max(self.region.load_relaxed_u64(control(abi::control::ACK_SEQ)));
        let seq = last.wrapping_add(1).max(1);
        self.region
            .store_relaxed_u32(control(abi::control::CMD), code);
        self.region
            .store_relaxed_u64(control(abi::control::ARG), arg);
        // Publishes cmd and arg: pairs with the writer's load-acquire of
        // cmd_seq in ivtk_ctl_poll() (guest/kmod/ivtk_ctl.c).
        self.region
            .store_release_u64(control(abi::control::CMD_SEQ), seq);
        seq
    }

    /// The acknowledgement of `seq` (status, groups enabled), if given.
    fn ack(&self, seq: u64) -> Option<(i32, u32)> {
        // Pairs with the writer's store-release of ack_seq, after which its
        // ack_status and groups_enabled stores are visible.
        if self.region.load_acquire_u64(control(abi::control::ACK_SEQ)) != seq {
            return None;
        }
        // Relaxed: ordered after the acquire above.
        let status = self
            .region
            .load_relaxed_u32(control(abi::control::ACK_STATUS)) as i32;
        let groups = self
            .region
            .load_relaxed_u32(control(abi::control::GROUPS_ENABLED));
        Some((status, groups))
    }

    /// How long to wait for an acknowledgement: a kicked writer answers in
    /// microseconds to milliseconds; a polling one within its flush interval.
    pub fn ack_timeout(&self, kicked: bool) -> Duration {
        let flush_ms = self.flush_interval_ms().min(60_000) as u64;
        let poll = Duration::from_millis(if flush_ms == 0 { 100 } else { flush_ms });
        if kicked {
            Duration::from_secs(2).max(poll.saturating_mul(3))
        } else {
            Duration::from_secs(1).saturating_add(poll.saturating_mul(3))
        }
    }
}

/// The guest's answer to one `IVT_CMD_FTRACE` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FtraceAck {
    pub ack: Ack,
    /// What a `read` request read (at most `IVT_CTL_RESP_MAX` bytes).
    pub text: Vec<u8>,
    /// A `read`: the file goes on past `text`.
    pub more: bool,
}

/// Why an ftrace request could not be posted or got no answer.
#[derive(Debug, Error)]
pub enum FtraceError {
    #[error("this region has no ftrace relay (no IVT_FEAT_FTRACE: load ivtrace.ko with ftrace=1)")]
    NoRelay,
    #[error("the request is {0} bytes; at most {max} fit", max = abi::IVT_CTL_REQ_MAX)]
    TooLong(usize),
    #[error("cannot write the request into the region (read-only?)")]
    Write,
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// ftrace requests: one tracefs operation per command (docs/ftrace.md).
///
/// The host writes the request's text into `ctl_text.req` with plain
/// stores, then posts `IVT_CMD_FTRACE` with its length as `arg`; the
/// store-release of `cmd_seq` publishes the text too (the module's
/// load-acquire of cmd_seq pairs with it, then it copies the text out
/// before checking it). The module answers with `ctl_text.resp_len`,
/// `resp_flags` and `resp` before its store-release of `ack_seq`, so
/// after our load-acquire of `ack_seq` the answer is whole; we copy it
/// out and bound its length by the array.
impl Protocol<'_> {
    pub fn send_ftrace(
        &self,
        request: &[u8],
        kick: &dyn Fn(),
        timeout: Duration,
    ) -> Result<FtraceAck, FtraceError> {
        let h = self.region.header();
        if h.features & abi::IVT_FEAT_FTRACE == 0 || h.features & abi::IVT_FEAT_CONTROL == 0 {
            return Err(FtraceError::NoRelay);
        }
        if request.is_empty() || request.len() > abi::IVT_CTL_REQ_MAX {
            return Err(FtraceError::TooLong(request.len()));
        }
        let _lock = self.lock_controller(timeout)?;
        if !self.region.copy_in(ctl_text(abi::ctl_text::REQ), request) {
            return Err(FtraceError::Write);
        }
        let ack = self.post_and_wait(abi::IVT_CMD_FTRACE, request.len() as u64, kick, timeout)?;
        // Relaxed: ordered after post_and_wait's load-acquire of ack_seq.
        let len = self
            .region
            .load_relaxed_u32(ctl_text(abi::ctl_text::RESP_LEN)) as usize;
        let flags = self
            .region
            .load_relaxed_u32(ctl_text(abi::ctl_text::RESP_FLAGS));
        let mut text = vec![0u8; len.min(abi::IVT_CTL_RESP_MAX)];
        if !self
            .region
            .copy_out(ctl_text(abi::ctl_text::RESP), &mut text)
        {
            text.clear();
        }
        Ok(FtraceAck {
            ack,
            text,
            more: flags & abi::IVT_CTL_RESP_MORE != 0,
        })
    }

    /// How long an ftrace request may take: the relay performs it in the
    /// guest (switching the tracer patches every traced function, seconds
    /// under TCG).
    pub fn ftrace_timeout(&self, kicked: bool) -> Duration {
        self.ack_timeout(kicked)
            .saturating_add(Duration::from_secs(30))
    }
}

fn ctl_text(off: usize) -> u64 {
    abi::hdr::CTL_TEXT.saturating_add(off) as u64
}

/// Clock sync: one round trip through `struct ivt_sync`.
///
/// ```text
/// host:  t1 = now; store host_t1; store-release req_seq = n; kick vector 0
/// guest: (MSI-X handler, poll timer) load-acquire req_seq; t2 = rdtsc;
///        t3 = rdtsc; store resp_t2, resp_t3; store-release resp_seq = n;
///        with IVT_FEAT_SYNC_SPIN, load-acquire req_seq again and again
///        for the next request (bounded: abi.h IVT_SYNC_*)
/// host:  load-acquire resp_seq == n; t4 = now; the next request at once
/// ```
impl Protocol<'_> {
    /// The number a new host's requests continue after: the larger of the
    /// last request posted and the last one answered. Relaxed: both are
    /// only compared, and the writer answers any value it has not seen.
    /// The answered one counts too because a migrated region can hold a
    /// `req_seq` older than the source host's last request (migration
    /// copies what the guest wrote, not the host's stores): continuing
    /// after the stale `req_seq` could post exactly the number of the
    /// guest's last answer, and its stale t2/t3 would pass for a fresh one.
    pub fn last_sync_request(&self) -> u64 {
        let req = self.region.load_relaxed_u64(sync(abi::sync::REQ_SEQ));
        let resp = self.region.load_relaxed_u64(sync(abi::sync::RESP_SEQ));
        req.max(resp)
    }

    /// Posts request `seq` sent at host time `host_t1`.
    pub fn request_sync(&self, seq: u64, host_t1: u64) {
        // Relaxed: published by the release below.
        self.region
            .store_relaxed_u64(sync(abi::sync::HOST_T1), host_t1);
        // Pairs with the writer's load-acquire of req_seq in
        // ivtk_sync_exchange() and ivtk_sync_next() (guest/kmod/ivtk_sync.c),
        // which read host_t1's line no further: t1 stays the host's own.
        self.region.store_release_u64(sync(abi::sync::REQ_SEQ), seq);
    }

    /// The writer's answer to request `seq`: its TSC right after it saw
    /// the request (t2) and right before it answered (t3).
    pub fn sync_answer(&self, seq: u64) -> Option<(u64, u64)> {
        // Pairs with the writer's store-release of resp_seq in
        // ivtk_sync_answer() (guest/kmod/ivtk_sync.c): its resp_t2/resp_t3
        // stores are visible after this load.
        if self.region.load_acquire_u64(sync(abi::sync::RESP_SEQ)) != seq {
            return None;
        }
        // Relaxed: ordered after the acquire of resp_seq.
        let t2 = self.region.load_relaxed_u64(sync(abi::sync::RESP_T2));
        let t3 = self.region.load_relaxed_u64(sync(abi::sync::RESP_T3));
        Some((t2, t3))
    }

    /// Writer clock ticks the writer spent in the exchange, in all (its
    /// cost). Relaxed: a statistic, written with WRITE_ONCE by the writer
    /// inside the exchange; nothing is read on its strength.
    pub fn sync_writer_spun(&self) -> u64 {
        self.region.load_relaxed_u64(sync(abi::sync::RESP_SPUN))
    }
}

/// Statistics and parameters the writers keep in the header. Relaxed:
/// values only, nothing is read on their strength.
impl Protocol<'_> {
    /// Doorbells the writers rang (their fetch-add counter).
    pub fn doorbells_rung(&self) -> u64 {
        self.region.load_relaxed_u64(hdr(abi::hdr::DOORBELLS))
    }

    /// Events lost because no channel was free for their writer.
    pub fn lost_no_channel(&self) -> u64 {
        self.region.load_relaxed_u64(hdr(abi::hdr::LOST_NO_CHANNEL))
    }

    /// The formatter's flush interval (a hint: a polling writer reads
    /// commands this often).
    pub fn flush_interval_ms(&self) -> u32 {
        self.region
            .load_relaxed_u32(hdr(abi::hdr::FLUSH_INTERVAL_MS))
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::region::Access;
    use ivtrace_testutil::RegionBuilder;

    #[test]
    fn host_words_round_trip_and_read_only_regions_stay_untouched() {
        let bytes = RegionBuilder::new(1, 2, 4096).build();
        let rw = Region::from_bytes(&bytes, Access::ReadWrite).unwrap();
        let p = rw.protocol();
        p.set_doorbell_target(1, 3);
        p.request_sync(7, 1234);
        p.release_subbufs(0, 5);
        assert_eq!(
            rw.load_relaxed_u32(hdr(abi::hdr::HOST_PEER_ID)),
            1 | 3 << 16
        );
        assert_eq!(p.last_sync_request(), 7);
        assert_eq!(p.consumed(0), 5);
        assert_eq!(p.sync_answer(7), None);
        assert!(p.still_formatted() && !p.writer_closed());
        let ro = Region::from_bytes(&bytes, Access::ReadOnly).unwrap();
        ro.protocol().release_subbufs(0, 5);
        ro.protocol().announce_sleep();
        assert_eq!(ro.protocol().consumed(0), 0);
        assert_eq!(ro.load_relaxed_u32(hdr(abi::hdr::HOST_SLEEPING)), 0);
    }

    #[test]
    fn commands_need_a_writer_that_obeys_them() {
        let bytes = RegionBuilder::new(1, 2, 4096).build();
        let r = Region::from_bytes(&bytes, Access::ReadWrite).unwrap();
        let err = r
            .protocol()
            .send_command(Command::Flush, &|| {}, Duration::ZERO)
            .unwrap_err();
        assert!(matches!(err, ControlError::Unsupported), "{err}");
    }

    /// The writer's half, played by the kick: it takes the command the
    /// way ivtk_ctl_poll() does and acknowledges it.
    fn acknowledge(r: &Region) {
        let seq = r.load_acquire_u64(control(abi::control::CMD_SEQ));
        let cmd = r.load_relaxed_u32(control(abi::control::CMD));
        let arg = r.load_relaxed_u64(control(abi::control::ARG));
        let status = if cmd == abi::IVT_CMD_ENABLE { 0 } else { -22 };
        r.store_relaxed_u32(control(abi::control::ACK_STATUS), status as u32);
        r.store_relaxed_u32(control(abi::control::GROUPS_ENABLED), arg as u32);
        r.store_release_u64(control(abi::control::ACK_SEQ), seq);
    }

    #[test]
    fn a_command_is_posted_and_its_acknowledgement_read() {
        let mut b = RegionBuilder::new(1, 2, 4096);
        b.features |= abi::IVT_FEAT_CONTROL;
        let r = Region::from_bytes(&b.build(), Access::ReadWrite).unwrap();
        let p = r.protocol();
        let a = p
            .send_command(
                Command::Enable(0b11),
                &|| acknowledge(&r),
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!((a.seq, a.status, a.groups_enabled), (1, 0, 0b11));
        let a = p
            .send_command(Command::Flush, &|| acknowledge(&r), Duration::from_secs(5))
            .unwrap();
        assert_eq!((a.seq, a.status), (2, -22));
        let silent = p.send_command(Command::Flush, &|| {}, Duration::from_millis(1));
        assert!(matches!(silent, Err(ControlError::NoAck { seq: 3, .. })));
    }

    /// The module and relay's half of an ftrace request, played by the kick:
    /// the request text read after the acquire of cmd_seq, a read's answer
    /// written before the release of ack_seq.
    fn answer_ftrace(r: &Region) {
        let seq = r.load_acquire_u64(control(abi::control::CMD_SEQ));
        let len = r.load_relaxed_u64(control(abi::control::ARG)) as usize;
        let mut req = vec![0u8; len];
        assert!(r.copy_out(ctl_text(abi::ctl_text::REQ), &mut req));
        assert_eq!(req, b"read available_events 0");
        assert!(r.copy_in(ctl_text(abi::ctl_text::RESP), b"block:block_rq_issue\n"));
        r.store_relaxed_u32(ctl_text(abi::ctl_text::RESP_LEN), 21);
        r.store_relaxed_u32(ctl_text(abi::ctl_text::RESP_FLAGS), abi::IVT_CTL_RESP_MORE);
        r.store_relaxed_u32(control(abi::control::ACK_STATUS), 0);
        r.store_release_u64(control(abi::control::ACK_SEQ), seq);
    }

    #[test]
    fn an_ftrace_request_carries_its_text_both_ways() {
        let mut b = RegionBuilder::new(1, 2, 4096);
        b.features |= abi::IVT_FEAT_CONTROL;
        let r = Region::from_bytes(&b.build(), Access::ReadWrite).unwrap();
        let p = r.protocol();
        let req = b"read available_events 0";
        let err = p.send_ftrace(req, &|| {}, Duration::ZERO).unwrap_err();
        assert!(matches!(err, FtraceError::NoRelay), "{err}");
        b.features |= abi::IVT_FEAT_FTRACE;
        let r = Region::from_bytes(&b.build(), Access::ReadWrite).unwrap();
        let p = r.protocol();
        let a = p
            .send_ftrace(req, &|| answer_ftrace(&r), Duration::from_secs(5))
            .unwrap();
        assert_eq!(
            (a.ack.status, a.text.as_slice(), a.more),
            (0, &b"block:block_rq_issue\n"[..], true)
        );
        let long = vec![b'x'; abi::IVT_CTL_REQ_MAX + 1];
        let err = p.send_ftrace(&long, &|| {}, Duration::ZERO).unwrap_err();
        assert!(matches!(err, FtraceError::TooLong(_)), "{err}");
        let ro = Region::from_bytes(&b.build(), Access::ReadOnly).unwrap();
        let err = ro
            .protocol()
            .send_ftrace(req, &|| {}, Duration::ZERO)
            .unwrap_err();
        assert!(matches!(err, FtraceError::Write), "{err}");
    }

    #[test]
    fn a_lock_held_by_someone_else_times_out() {
        let mut b = RegionBuilder::new(1, 2, 4096);
        b.features |= abi::IVT_FEAT_CONTROL;
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), b.build()).unwrap();
        let r = Region::open(f.path(), Access::ReadWrite).unwrap();
        let holder = std::fs::File::open(f.path()).unwrap();
        let held = Flock::lock(holder, FlockArg::LockExclusive).unwrap();
        let t0 = Instant::now();
        let err = r
            .protocol()
            .send_command(Command::Flush, &|| {}, Duration::from_millis(200))
            .unwrap_err();
        assert!(matches!(err, ControlError::Locked { .. }), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        drop(held);
    }

    #[test]
    fn command_codes_match_the_abi() {
        for (cmd, code) in [
            (Command::Flush, 1),
            (Command::Enable(1), 2),
            (Command::Disable(1), 3),
            (Command::SetMode(0), 4),
            (Command::Statedump, 6),
        ] {
            assert_eq!(cmd.code(), code);
        }
        assert_eq!(Command::Enable(0b101).arg(), 5);
    }
}
