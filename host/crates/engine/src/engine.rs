//! The recording loop every front end runs.
//!
//! ```text
//! loop:
//!   drain every channel once (output gets the packets), commit them (the
//!   output writes them), then hand their sub-buffers back; beat the heartbeat
//!   output failed (a full disk)?      -> undo the uncommitted packets, stop
//!   region shrank under us?                                    -> stop
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
//! the output ([`Output`]: the sinks, [`crate::sinks::Sinks`]) and its
//! [`Hooks`]; it then builds the trace's env and sidecar from what
//! [`Engine::run`] returns.

use std::time::{Duration, Instant};

use ivtrace_ctf::{ClockMapping, CtfError, CtfWriter, TraceEnv};
use ivtrace_region::names::{read_thread_names, NameTable};
use ivtrace_region::reader::Pass;
use ivtrace_region::{EventClasses, PacketSink, Reader};
use ivtrace_time::pingpong::SyncPoint;
use ivtrace_time::ClockSync;

use crate::error::{BoxError, EngineError};
use crate::wait::{Wait, Woken};

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// How often the slow checks (region withdrawn, the front end's) run.
const SLOW_CHECK: Duration = Duration::from_millis(100);
/// How often the guest's thread name table is re-read for the kernel
/// expansion (it names threads no naming event drained so far names).
const NAMES_REFRESH: Duration = Duration::from_secs(1);

/// How long the first drain waits for the clock exchange's first point:
/// user times drained before it would be converted with the region
/// header's mapping, which nothing measured. A polled writer enters the
/// exchange every `IVT_SYNC_POLL_MS` (20 ms) and finding its phase takes a
/// few of them; a kicked one answers at once.
const FIRST_POINT_WAIT: Duration = Duration::from_millis(200);

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
    /// The guest migrated to another host, whose recorder continues the
    /// trace: the last pass takes complete packets only and the reader's
    /// [`Reader::handoff`] says where the next part starts
    /// (docs/migration.md).
    Handoff,
    /// The region was withdrawn for reformatting (its magic is gone).
    Withdrawn,
    /// The region's file shrank under the reader (truncated by another
    /// process): what it still held was recorded.
    Shrunk,
    /// The output could not be written (a full disk): every packet it did
    /// not take is still in the region ([`Recorded::output_error`] says
    /// why).
    OutputFailed,
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

/// Where the packets go: a sink (the CTF directory writer, a relay's
/// live copy; [`crate::sinks::Sinks`] fans out to them). Packets arrive
/// through [`PacketSink`].
/// Its errors are its [`PacketSink::Error`] (the engine carries them as
/// [`EngineError::Output`]).
pub trait Output: PacketSink<Error: std::error::Error + Send + Sync + 'static> {
    /// Undoes every packet handed over since the last commit (a write
    /// failed): the output keeps whole committed packets only.
    fn rollback(&mut self) -> Result<(), Self::Error>;

    /// The recording is idle: make what was handed over visible (log
    /// deliveries). Nothing by default.
    fn idle(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The guest's thread name table, read before the first pass, every
    /// second while recording and before the final flush: it names the
    /// threads whose naming events the output has not seen (yet, or ever:
    /// a flight recorder's rings wrapped past the state dump). Ignored by
    /// default.
    fn thread_names(&mut self, _table: NameTable) {}

    /// A clock exchange refined the mapping in force: an output that
    /// converts times as packets come (a relay's kernel and ftrace
    /// expansions) converts with `clock` from now on. Ignored by default.
    fn clock_refined(&mut self, _clock: &ClockMapping) {}

    /// The recording is over: the final clock and env, the metadata.
    fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), Self::Error>;

    /// The recording stopped because the output failed: make what it holds
    /// readable without writing more than needed (no kernel expansion:
    /// `ivtrace recover` or `record --resume` do it once there is room).
    fn finish_incomplete(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), Self::Error>;
}

impl Output for CtfWriter {
    fn rollback(&mut self) -> Result<(), CtfError> {
        CtfWriter::rollback(self)
    }

    fn thread_names(&mut self, table: NameTable) {
        self.set_thread_name_table(table);
    }

    /// The streaming expansions convert with the writer's mapping; the
    /// final one replaces it again at the end.
    fn clock_refined(&mut self, clock: &ClockMapping) {
        self.set_clock(clock.clone());
    }

    fn finish(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        CtfWriter::finish(self, clock, env, classes)
    }

    fn finish_incomplete(
        &mut self,
        clock: &ClockMapping,
        env: TraceEnv,
        classes: &EventClasses,
    ) -> Result<(), CtfError> {
        CtfWriter::finish_incomplete(self, clock, env, classes)
    }
}

/// What the front end adds to the loop. Every method but
/// [`Hooks::stop_requested`] has a do-nothing default. An error a method
/// returns ends the recording with [`EngineError::Front`].
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
    fn between_passes(&mut self, _reader: &Reader) -> Result<(), BoxError> {
        Ok(())
    }

    /// A clock exchange kept `point`.
    fn synced(&mut self, _point: &SyncPoint) -> Result<(), BoxError> {
        Ok(())
    }

    /// A wait ended (doorbells received).
    fn woken(&mut self, _woken: &Woken) -> Result<(), BoxError> {
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
    /// Why the output failed ([`StopReason::OutputFailed`]), or a failure
    /// while finalizing (the kernel expansion on a full disk): the trace
    /// holds whole packets up to it.
    pub output_error: Option<String>,
}

/// The front end's parts of a recording, borrowed for a step or a whole
/// run.
pub struct Parts<'a> {
    pub clock: &'a mut dyn ClockSync,
    pub wait: &'a mut dyn Wait,
    pub hooks: &'a mut dyn Hooks,
}

/// What one [`Core::step`] left to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The pass found packets (or a last pass is due): step again.
    Again,
    /// Nothing to do: wait for the front end's waiter (its doorbells, its
    /// descriptors) for at most this long, then call [`Core::woke`] with
    /// what the wait returned. With doorbells the sleep is announced
    /// already.
    Block(Duration),
    /// The recording is over: [`Core::finalize`].
    Ended(StopReason),
}

/// The state of one recording, stepped by a front end: [`Engine::run`]
/// steps it on its own thread; `ivtrace serve` steps many of them on a
/// bounded pool of threads, parking each between its steps
/// ([`Step::Block`]) where its waiter's descriptors are watched.
pub struct Core<O: Output> {
    reader: Reader,
    output: O,
    started: Instant,
    heartbeat: u64,
    bytes: u64,
    handshake: HandshakeStats,
    output_error: Option<String>,
    names_read: Instant,
    last_slow: Instant,
    /// The writer's side went: one more pass, then stop.
    ending: Option<StopReason>,
    /// The sleep is announced (`host_sleeping` set) until the next wake.
    doorbell_sleep: bool,
    /// The first step has not run yet.
    fresh: bool,
}

/// One recording run on the calling thread: a [`Core`] and the front
/// end's parts.
pub struct Engine<'a, O: Output> {
    core: Core<O>,
    parts: Parts<'a>,
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
            core: Core::new(reader, output),
            parts: Parts { clock, wait, hooks },
        }
    }

    /// Drains until something ends the recording, then flushes what was
    /// committed and takes the final clock mapping.
    pub fn run(mut self) -> Result<Recorded<O>> {
        loop {
            match self.core.step(&mut self.parts)? {
                Step::Again => {}
                Step::Block(limit) => {
                    let woken = self.parts.wait.block(limit);
                    self.core.woke(&mut self.parts, woken)?;
                }
                Step::Ended(reason) => return self.core.finalize(&mut self.parts, reason),
            }
        }
    }
}

impl<O: Output> Core<O> {
    pub fn new(reader: Reader, output: O) -> Core<O> {
        Core {
            reader,
            output,
            started: Instant::now(),
            heartbeat: 0,
            bytes: 0,
            handshake: HandshakeStats::default(),
            output_error: None,
            names_read: Instant::now(),
            last_slow: Instant::now(),
            ending: None,
            doorbell_sleep: false,
            fresh: true,
        }
    }

    pub fn reader(&self) -> &Reader {
        &self.reader
    }

    /// Hands the guest's current thread name table to the output.
    fn refresh_names(&mut self) {
        self.names_read = Instant::now();
        if let Some(table) = read_thread_names(self.reader.region()) {
            self.output.thread_names(table);
        }
    }

    /// One turn of the loop: a drain pass and the checks after it; when it
    /// found nothing, the sleep handshake up to the wait, which the caller
    /// does (and reports to [`Core::woke`]). A failed output ends the
    /// recording ([`StopReason::OutputFailed`]).
    pub fn step(&mut self, p: &mut Parts) -> Result<Step> {
        match self.step_inner(p) {
            Ok(step) => Ok(step),
            Err(e) => Ok(Step::Ended(self.output_failed(e)?)),
        }
    }

    fn step_inner(&mut self, p: &mut Parts) -> Result<Step> {
        if std::mem::take(&mut self.fresh) {
            self.refresh_names();
            self.await_first_point(p)?;
        }
        let pass = self.pass()?;
        if self.reader.region().shrunk() {
            return Ok(Step::Ended(StopReason::Shrunk));
        }
        self.heartbeat += 1;
        self.reader.region().protocol().heartbeat(self.heartbeat);
        if let Some(reason) = self.ending {
            return Ok(Step::Ended(reason));
        }
        match self.check(p) {
            Next::Stop(reason) => return Ok(Step::Ended(reason)),
            Next::Ending(reason) => {
                self.ending = Some(reason);
                return Ok(Step::Again);
            }
            Next::Go => {}
        }
        p.hooks
            .between_passes(&self.reader)
            .map_err(EngineError::Front)?;
        self.sync_if_due(p)?;
        if pass.packets > 0 {
            p.wait.busy();
            return Ok(Step::Again);
        }
        self.output.idle().map_err(output_error)?;
        self.prepare_wait(p)
    }

    /// A pass or a commit failed: undo what the output did not take (it
    /// stays in the region), remember why, stop.
    fn output_failed(&mut self, e: EngineError) -> Result<StopReason> {
        if std::mem::take(&mut self.doorbell_sleep) {
            self.reader.region().protocol().awake();
        }
        let EngineError::Output(e) = e else {
            return Err(e);
        };
        self.reader.rollback_unwritten();
        let undo = self.output.rollback();
        // The output's own message (CtfError names the file and the cause).
        let mut why = e.to_string();
        if let Err(u) = undo {
            why = format!("{why}; then {u}");
        }
        self.output_error = Some(why);
        Ok(StopReason::OutputFailed)
    }

    /// One drain pass over every channel; what it found is committed
    /// (written), then handed back to the writer.
    fn pass(&mut self) -> Result<Pass> {
        let pass = self
            .reader
            .drain_available(&mut self.output)
            .map_err(output_error)?;
        if pass.packets > 0 {
            self.output.commit().map_err(output_error)?;
            self.reader.commit_written();
        }
        self.bytes += pass.bytes;
        Ok(pass)
    }

    /// The stop conditions, in order: the front end's request, the
    /// writer's close, then every [`SLOW_CHECK`] the region's magic and
    /// the front end's slow checks.
    fn check(&mut self, p: &mut Parts) -> Next {
        if let Some(reason) = p.hooks.stop_requested() {
            return Next::Stop(reason);
        }
        let protocol = self.reader.region().protocol();
        if protocol.writer_closed() {
            return Next::Ending(StopReason::Closed);
        }
        if self.last_slow.elapsed() < SLOW_CHECK {
            return Next::Go;
        }
        self.last_slow = Instant::now();
        if !protocol.still_formatted() {
            return Next::Stop(StopReason::Withdrawn);
        }
        if self.names_read.elapsed() >= NAMES_REFRESH {
            self.refresh_names();
        }
        match p.hooks.slow_check(&self.reader, self.bytes) {
            Some(reason) => Next::Ending(reason),
            None => Next::Go,
        }
    }

    /// Before the first drain: runs the exchange until it keeps a point
    /// (or [`FIRST_POINT_WAIT`] passed), so the user streams' first times
    /// are converted with a measured mapping. A clock that never exchanges,
    /// or user streams kept in ticks, do not wait.
    fn await_first_point(&mut self, p: &mut Parts) -> Result<()> {
        if !self.reader.user_in_ns() {
            return Ok(());
        }
        let give_up = Instant::now() + FIRST_POINT_WAIT;
        while let Some(due) = p.clock.until_due() {
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(due.min(left));
            if self.sync_if_due(p)? {
                break;
            }
        }
        Ok(())
    }

    /// Runs the exchange when it is due; whether it kept a point.
    fn sync_if_due(&mut self, p: &mut Parts) -> Result<bool> {
        if p.clock.until_due() != Some(Duration::ZERO) {
            return Ok(false);
        }
        let Some(point) = p.clock.exchange(self.reader.region()) else {
            return Ok(false);
        };
        // The user streams' nanoseconds and the streaming expansions
        // follow the refined mapping from the next packet on (each stream
        // kept monotonic by its converter).
        let m = p.clock.current_mapping();
        if self.reader.user_in_ns() {
            self.reader.set_user_clock(m.ns_scale(), m.expressible());
        }
        self.output.clock_refined(&m);
        p.hooks.synced(&point).map_err(EngineError::Front)?;
        Ok(true)
    }

    /// Before a wait: with doorbells, the host half of the sleep handshake
    /// (announce, re-check every channel; a hit means no wait).
    fn prepare_wait(&mut self, p: &mut Parts) -> Result<Step> {
        let limit = p
            .clock
            .until_due()
            .unwrap_or(Duration::MAX)
            .min(p.hooks.max_wait());
        if p.wait.doorbell() {
            self.handshake.sleep_attempts += 1;
            self.reader.region().protocol().announce_sleep();
            self.doorbell_sleep = true;
            if self.pass()?.packets > 0 {
                self.handshake.recheck_hits += 1;
                self.doorbell_sleep = false;
                self.reader.region().protocol().awake();
                return Ok(Step::Again);
            }
        }
        Ok(Step::Block(limit))
    }

    /// The wait of a [`Step::Block`] ended with `woken`.
    pub fn woke(&mut self, p: &mut Parts, woken: Result<Woken>) -> Result<()> {
        if std::mem::take(&mut self.doorbell_sleep) {
            self.reader.region().protocol().awake();
        }
        let woken = woken?;
        p.hooks.woken(&woken).map_err(EngineError::Front)?;
        if woken.ending.is_some() {
            self.ending = woken.ending;
        }
        Ok(())
    }

    /// The committed prefixes of open packets and the final losses, each
    /// committed; on a failed output only the accounting (nothing more is
    /// written).
    fn flush_final(&mut self, reason: StopReason) -> Result<()> {
        if reason == StopReason::OutputFailed {
            self.reader.account_final();
            return Ok(());
        }
        let last_pass = match reason {
            // The open packets go on filling on the next host.
            StopReason::Handoff => self.reader.drain_for_handoff(&mut self.output),
            _ => self.reader.flush_partial(&mut self.output),
        };
        let flushed = last_pass
            .and_then(|_| self.output.commit())
            .and_then(|()| self.reader.finish(&mut self.output))
            .and_then(|()| self.output.commit());
        match flushed {
            Ok(()) => {
                self.reader.commit_written();
                self.output.idle().map_err(output_error)
            }
            Err(e) => {
                self.output_failed(output_error(e))?;
                self.reader.account_final();
                Ok(())
            }
        }
    }

    /// Flushes what was committed, the final losses, and takes the final
    /// clock mapping.
    pub fn finalize(mut self, p: &mut Parts, mut reason: StopReason) -> Result<Recorded<O>> {
        if std::mem::take(&mut self.doorbell_sleep) {
            self.reader.region().protocol().awake();
        }
        // The latest names before the last packets (a streaming expansion
        // uses them now; the staged one when the output finishes).
        self.refresh_names();
        self.flush_final(reason)?;
        if self.output_error.is_some() {
            reason = StopReason::OutputFailed;
        }
        let elapsed = self.started.elapsed();
        let clock = p
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
            output_error: self.output_error,
        })
    }
}

/// An error of the output (as opposed to the engine or the front end):
/// the recording stops and finalizes what was written.
fn output_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> EngineError {
    EngineError::Output(Box::new(e))
}
