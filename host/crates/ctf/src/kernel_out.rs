//! The kernel trace's output (stream class 0): made on the stream's first
//! packet (or adopted by `record --resume`, or made by the ftrace
//! expansion when no native kernel packet came), and in one state at a
//! time, each holding what that state needs:
//!
//! - [`KernelState::Staged`]: packets kept in their wire form in the
//!   staging directory, expanded when the recording ends
//!   ([`crate::kernel`] says why);
//! - [`KernelState::Online`]: packets expanded as they arrive (a writer
//!   whose packets also go to a relay, which needs them final at once);
//! - [`KernelState::Expanded`]: the expansion at the end ran (or the trace
//!   holds the ftrace streams alone); no more packets are taken.
//!
//! Which of Staged and Online a new trace starts in is the writer's
//! choice ([`KernelStart`]); a resumed recording's kernel stays Staged:
//! its adopted files hold wire packets, which must not be mixed with
//! expanded ones.

use std::borrow::Cow;
use std::collections::BTreeMap;

use ivtrace_region::abi;
use ivtrace_region::classes::{EventClasses, StreamClasses};
use ivtrace_region::names::NameTable;

use crate::kernel::online::OnlineKernel;
use crate::kernel::{self, Expanded, KernelExpansion, WIRE_METADATA};
use crate::outdir::OutDir;
use ivtrace_time::ClockMapping;

/// How a kernel trace made by a packet starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelStart {
    Staged,
    Online,
}

/// The kernel trace: its directory, the generation of event classes its
/// metadata was last written for, and its state.
pub(crate) struct KernelTrace {
    pub dir: OutDir,
    pub generation: u64,
    pub state: KernelState,
}

/// See the module documentation (the states' data boxed: they differ in
/// size).
pub(crate) enum KernelState {
    /// `dir` is the staging directory.
    Staged,
    /// `dir` is `DIR/kernel/`.
    Online(Box<Online>),
    /// `dir` is `DIR/kernel/`.
    Expanded(Box<Expanded>),
}

/// The online kernel expansion.
pub(crate) struct Online {
    kernel: OnlineKernel,
    /// Events of kernel packets that did not walk, per channel (in every
    /// later packet's `events_discarded`).
    lost: BTreeMap<u32, u64>,
    /// Each channel's output time so far.
    times: BTreeMap<u32, kernel::rewrite::Timeline>,
    /// The mapping the latest packet was converted with: the clock block's
    /// precision and description say its bound, not the final mapping's.
    converted_with: Option<ClockMapping>,
}

impl KernelTrace {
    /// A new trace in `dir`, starting as `start` says; `table`: the guest's
    /// thread name table if one was read already.
    pub fn new(dir: OutDir, start: KernelStart, table: Option<&NameTable>) -> KernelTrace {
        let state = match start {
            KernelStart::Staged => KernelState::Staged,
            KernelStart::Online => {
                let mut kernel = OnlineKernel::default();
                if let Some(t) = table {
                    kernel.set_table(t);
                }
                KernelState::Online(Box::new(Online {
                    kernel,
                    lost: BTreeMap::new(),
                    times: BTreeMap::new(),
                    converted_with: None,
                }))
            }
        };
        KernelTrace {
            dir,
            generation: 0,
            state,
        }
    }

    /// A trace that holds the ftrace streams alone (stream class 0
    /// declared, without events), in `dir`.
    pub fn ftrace_only(dir: OutDir, generation: u64) -> KernelTrace {
        KernelTrace {
            dir,
            generation,
            state: KernelState::Expanded(Box::new(Expanded {
                classes: StreamClasses::default(),
                stats: KernelExpansion::default(),
            })),
        }
    }

    pub fn is_staged(&self) -> bool {
        matches!(self.state, KernelState::Staged)
    }

    pub fn is_expanded(&self) -> bool {
        matches!(self.state, KernelState::Expanded(_))
    }

    /// The event classes the trace's files declare: `wire`'s while staged.
    pub fn classes<'a>(&'a self, wire: &'a StreamClasses) -> &'a StreamClasses {
        match &self.state {
            KernelState::Staged => wire,
            KernelState::Online(o) => o.kernel.classes(),
            KernelState::Expanded(e) => &e.classes,
        }
    }

    /// What the expansion did: so far when online, once it ran at the end.
    pub fn expansion(&self) -> Option<&KernelExpansion> {
        match &self.state {
            KernelState::Staged => None,
            KernelState::Online(o) => Some(&o.kernel.stats),
            KernelState::Expanded(e) => Some(&e.stats),
        }
    }

    /// The generation the metadata follows: the online expansion's output
    /// classes grow on their own.
    pub fn generation_of(&self, classes: &EventClasses) -> u64 {
        match &self.state {
            KernelState::Online(o) => o.kernel.generation(),
            _ => classes.generation(),
        }
    }

    /// The metadata's file name: staged wire packets get theirs under
    /// another name, so CTF readers do not take the staging directory for
    /// a trace.
    pub fn metadata_name(&self) -> &'static str {
        match self.is_staged() {
            true => WIRE_METADATA,
            false => "metadata",
        }
    }

    pub fn set_table(&mut self, table: &NameTable) {
        if let KernelState::Online(o) = &mut self.state {
            o.kernel.set_table(table);
        }
    }

    /// The packet as its file gets it: expanded when online (times
    /// converted with `clock`, the mapping in force), else as is.
    pub fn packet<'a>(
        &mut self,
        chan: u32,
        bytes: &'a [u8],
        classes: &EventClasses,
        clock: &ClockMapping,
    ) -> Cow<'a, [u8]> {
        match &mut self.state {
            KernelState::Online(o) => Cow::Owned(o.packet(chan, bytes, classes, clock)),
            _ => Cow::Borrowed(bytes),
        }
    }

    /// The mapping the latest online packet was converted with (what the
    /// clock block must say while recording), if any.
    pub fn converted_with(&self) -> Option<&ClockMapping> {
        match &self.state {
            KernelState::Online(o) => o.converted_with.as_ref(),
            _ => None,
        }
    }

    /// The expansion at the end ran: its result, and the directory it
    /// wrote.
    pub fn set_expanded(&mut self, expanded: Expanded, dir: OutDir) {
        self.dir = dir;
        self.state = KernelState::Expanded(Box::new(expanded));
    }
}

impl Online {
    /// A kernel packet, expanded; one that does not walk becomes an empty
    /// packet with its header (the stream's sequence has no gap) and its
    /// events are counted as lost, in every later packet's
    /// `events_discarded` too. Times are converted with `clock`, the
    /// mapping in force.
    fn packet(
        &mut self,
        chan: u32,
        bytes: &[u8],
        classes: &EventClasses,
        clock: &ClockMapping,
    ) -> Vec<u8> {
        let wire = classes.stream(abi::IVT_STREAM_KERNEL);
        if self.converted_with.as_ref() != Some(clock) {
            self.converted_with = Some(clock.clone());
        }
        let time = self.times.entry(chan).or_default();
        let mut out = match self
            .kernel
            .packet((wire, classes.generation()), bytes, (clock, time))
        {
            Some(p) => p.to_vec(),
            None => {
                let mut out = Vec::new();
                let at = (clock, time);
                let n = kernel::rewrite::skipped(&mut self.kernel.stats, chan, bytes, at, &mut out);
                let lost = self.lost.entry(chan).or_default();
                *lost = lost.saturating_add(n);
                out
            }
        };
        let lost = self.lost.get(&chan).copied().unwrap_or(0);
        kernel::rewrite::add_discarded(&mut out, lost);
        out
    }
}
