//! The recording loop every front end runs.
//!
//! ```text
//! loop:
//!   drain every channel once (output gets the packets), beat the heartbeat
//!   stop requested (signal, deadline, server stopping)?        -> stop
//!   writer closed the region?                 -> one more pass, stop
//!   every 100 ms: region withdrawn?                            -> stop
//!                 front end's slow checks (owner gone: one more pass)
//!   front end's requests (control commands, status)
//!   clock exchange due? run it
//!   found packets? go again
//!   idle: output makes what it has visible; wait (sleep handshake
//!   around a doorbell wait; the waiter may report the peer gone)
//! finally: flush the committed prefixes of open packets, final loss
//! accounting, the final clock mapping
//! ```
//!
//! A front end chooses how to wait ([`Wait`]), the clock ([`ClockSync`]),
//! the output ([`Output`]: today the CTF directory writer) and its
//! [`Hooks`]; it then builds the trace's env and sidecar from what
//! [`Engine::run`] returns.

use std::time::{Duration, Instant};

use anyhow::Result;

use ivtrace_ctf::{ClockMapping, CtfWriter, TraceEnv};
use ivtrace_region::names::{read_thread_names, NameTable};
use ivtrace_region::reader::Pass;
use ivtrace_region::{EventClasses, PacketSink, Reader};
use ivtrace_time::pingpong::SyncPoint;
use ivtrace_time::ClockSync;

use crate::wait::{Wait, Woken};

/// How often the slow checks (region withdrawn, the front end's) run.
const SLOW_CHECK: Duration = Duration::from_millis(100);
/// How often the guest's thread name table is re-read for the kernel
/// expansion (it names threads no naming event drained so far names).
const NAMES_REFRESH: Duration = Duration::from_secs(1);

/// Why a recording ended (front ends word it for their users: the
/// sidecar's `stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The user or the server stopped the recording (signal, server
    /// stopping).
    Interrupted,
    /// The recording's duration is over.
    DurationReached,
    /// The writer closed the region (its `state` says CLOSED).
    Closed,
    /// The region's owner process is gone without closing it.
    OwnerGone,
    /// The peer (QEMU) disconnected.
    Disconnected,
    /// The peer violated the protocol and was disconnected.
    Misbehaved,
    /// The region was withdrawn for reformatting (its magic is gone).
    Withdrawn,
}

impl StopReason {
    /// Whether the writer may still answer a last clock exchange.
    pub fn writer_may_answer(self) -> bool {
        matches!(
            self,
            StopReason::Interrupted | StopReason::DurationReached | StopReason::Closed
        )
    }
}

/// Where the packets go: the CTF directory writer today, a relay
/// connection later. Packets arrive through [`PacketSink`].
pub trait Output: PacketSink<Error: std::error::Error + Send + Sync + 'static> {
    /// The recording is idle: make what was handed over visible (flush
    /// files, log deliveries). Nothing by default.
    fn idle(&mut self) -> Result<()> {
        Ok(())
    }

    /// The guest's thread name table, read before the first pass, every
    /// second while recording and once the drain is over: it names the
    /// threads whose naming events the output has not seen (yet, or ever:
    /// a flight recorder's rings wrapped past the state dump). Ignored by
    /// default.
    fn thread_names(&mut self, _table: NameTable) {}

    /// The recording is over: the final clock and env, the metadata.
    fn finish(&mut self, clock: &ClockMapping, env: TraceEnv, classes: &EventClasses)
        -> Result<()>;
}

impl Output for CtfWriter {
    fn thread_names(&mut self, table: NameTable) {
        self.set_thread_name_table(table);
    }

    fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<()> {
        self.set_clock(clock.clone());
        self.set_env(env);
        CtfWriter::finish(self, classes)?;
        Ok(())
    }
}

/// What the front end adds to the loop. Every method but
/// [`Hooks::stop_requested`] has a do-nothing default.
pub trait Hooks {
    /// Checked after every pass: stop now (signal, deadline, server
    /// stopping)?
    fn stop_requested(&mut self) -> Option<StopReason>;

    /// Every 100 ms: is the writer's side gone (then the engine drains
    /// once more and stops)? Also the place for progress displays.
    fn slow_check(&mut self, _reader: &Reader, _bytes: u64) -> Option<StopReason> {
        None
    }

    /// After every pass: answer requests (control commands, status).
    fn between_passes(&mut self, _reader: &Reader) -> Result<()> {
        Ok(())
    }

    /// A clock exchange kept `point`.
    fn synced(&mut self, _point: &SyncPoint) -> Result<()> {
        Ok(())
    }

    /// A wait ended (doorbells received).
    fn woken(&mut self, _woken: &Woken) -> Result<()> {
        Ok(())
    }

    /// The longest wait without news (a safety net for anything that does
    /// not wake the waiter, e.g. a region closed while the host slept).
    fn max_wait(&self) -> Duration {
        Duration::MAX
    }
}

/// The host's side of the sleep handshake, counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeStats {
    /// Times the host announced a sleep and re-checked.
    pub sleep_attempts: u64,
    /// Re-checks that found a packet (no sleep).
    pub recheck_hits: u64,
}

/// A finished recording: what the front end needs for the trace's env,
/// its sidecar and its summary.
pub struct Recorded<O> {
    pub reason: StopReason,
    pub reader: Reader,
    pub output: O,
    /// The final clock mapping.
    pub clock: ClockMapping,
    /// From the start of the loop to the end of the final flush.
    pub elapsed: Duration,
    /// Bytes handed to the output by the loop's passes.
    pub bytes: u64,
    pub handshake: HandshakeStats,
}

/// One recording: a reader, an output and the front end's parts.
pub struct Engine<'a, O: Output> {
    reader: Reader,
    output: O,
    clock: &'a mut dyn ClockSync,
    wait: &'a mut dyn Wait,
    hooks: &'a mut dyn Hooks,
    started: Instant,
    heartbeat: u64,
    bytes: u64,
    handshake: HandshakeStats,
    names_read: Instant,
}

/// What the checks after a pass decided.
enum Next {
    Go,
    /// Drain once more (the last pass), then stop.
    Ending(StopReason),
    Stop(StopReason),
}

impl<'a, O: Output> Engine<'a, O> {
    pub fn new(
        reader: Reader,
        output: O,
        clock: &'a mut dyn ClockSync,
        wait: &'a mut dyn Wait,
        hooks: &'a mut dyn Hooks,
    ) -> Engine<'a, O> {
        Engine {
            reader,
            output,
            clock,
            wait,
            hooks,
            started: Instant::now(),
            heartbeat: 0,
            bytes: 0,
            handshake: HandshakeStats::default(),
            names_read: Instant::now(),
        }
    }

    /// Hands the guest's current thread name table to the output.
    fn refresh_names(&mut self) {
        self.names_read = Instant::now();
        if let Some(table) = read_thread_names(self.reader.region()) {
            self.output.thread_names(table);
        }
    }

    /// Drains until something ends the recording, then flushes what was
    /// committed and takes the final clock mapping.
    pub fn run(mut self) -> Result<Recorded<O>> {
        self.refresh_names();
        let reason = self.drain_until_stopped()?;
        self.finalize(reason)
    }

    fn drain_until_stopped(&mut self) -> Result<StopReason> {
        let mut ending: Option<StopReason> = None;
        let mut last_slow = Instant::now();
        loop {
            let pass = self.pass()?;
            self.heartbeat += 1;
            self.reader.region().protocol().heartbeat(self.heartbeat);
            if let Some(reason) = ending {
                return Ok(reason);
            }
            match self.check(&mut last_slow) {
                Next::Stop(reason) => return Ok(reason),
                Next::Ending(reason) => {
                    ending = Some(reason);
                    continue;
                }
                Next::Go => {}
            }
            self.hooks.between_passes(&self.reader)?;
            self.sync_if_due()?;
            if pass.packets > 0 {
                self.wait.busy();
                continue;
            }
            self.output.idle()?;
            ending = self.wait()?;
        }
    }

    /// One drain pass over every channel.
    fn pass(&mut self) -> Result<Pass> {
        let pass = self.reader.drain_available(&mut self.output)?;
        self.bytes += pass.bytes;
        Ok(pass)
    }

    /// The stop conditions, in order: the front end's request, the
    /// writer's close, then every [`SLOW_CHECK`] the region's magic and
    /// the front end's slow checks.
    fn check(&mut self, last_slow: &mut Instant) -> Next {
        if let Some(reason) = self.hooks.stop_requested() {
            return Next::Stop(reason);
        }
        let protocol = self.reader.region().protocol();
        if protocol.writer_closed() {
            return Next::Ending(StopReason::Closed);
        }
        if last_slow.elapsed() < SLOW_CHECK {
            return Next::Go;
        }
        *last_slow = Instant::now();
        if !protocol.still_formatted() {
            return Next::Stop(StopReason::Withdrawn);
        }
        if self.names_read.elapsed() >= NAMES_REFRESH {
            self.refresh_names();
        }
        match self.hooks.slow_check(&self.reader, self.bytes) {
            Some(reason) => Next::Ending(reason),
            None => Next::Go,
        }
    }

    fn sync_if_due(&mut self) -> Result<()> {
        if self.clock.until_due() != Some(Duration::ZERO) {
            return Ok(());
        }
        match self.clock.exchange(self.reader.region()) {
            Some(point) => self.hooks.synced(&point),
            None => Ok(()),
        }
    }

    /// Waits for more; with doorbells, the host half of the sleep
    /// handshake around the wait. Returns why to end, if the waiter saw
    /// the writer's side go.
    fn wait(&mut self) -> Result<Option<StopReason>> {
        let limit = self
            .clock
            .until_due()
            .unwrap_or(Duration::MAX)
            .min(self.hooks.max_wait());
        let doorbell = self.wait.doorbell();
        if doorbell {
            self.handshake.sleep_attempts += 1;
            self.reader.region().protocol().announce_sleep();
            if self.pass()?.packets > 0 {
                self.handshake.recheck_hits += 1;
                self.reader.region().protocol().awake();
                return Ok(None);
            }
        }
        let woken = self.wait.block(limit);
        if doorbell {
            self.reader.region().protocol().awake();
        }
        let woken = woken?;
        self.hooks.woken(&woken)?;
        Ok(woken.ending)
    }

    fn finalize(mut self, reason: StopReason) -> Result<Recorded<O>> {
        self.refresh_names();
        self.reader.flush_partial(&mut self.output)?;
        self.reader.finish(&mut self.output)?;
        self.output.idle()?;
        let elapsed = self.started.elapsed();
        let clock = self
            .clock
            .final_mapping(self.reader.region(), reason.writer_may_answer());
        Ok(Recorded {
            reason,
            reader: self.reader,
            output: self.output,
            clock,
            elapsed,
            bytes: self.bytes,
            handshake: self.handshake,
        })
    }
}
