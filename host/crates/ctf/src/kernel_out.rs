//! The kernel trace's outputs (stream class 0).
//!
//! The directory's ([`KernelTrace`]): made on the stream's first packet
//! (or adopted by `record --resume`, or made by the ftrace expansion when
//! no native kernel packet came), in one state at a time, each holding
//! what that state needs:
//!
//! - [`KernelState::Staged`]: packets kept in their wire form in the
//!   staging directory, expanded when the recording ends
//!   ([`crate::kernel`] says why);
//! - [`KernelState::Expanded`]: the expansion at the end ran (or the trace
//!   holds the ftrace streams alone); no more packets are taken.
//!
//! A live sink's ([`Online`], [`crate::live`]): packets expanded as they
//! arrive, since a relay needs them final at once.

use std::collections::BTreeMap;

use ivtrace_region::abi;
use ivtrace_region::classes::{EventClasses, StreamClasses};
use ivtrace_region::names::NameTable;

use crate::kernel::online::OnlineKernel;
use crate::kernel::{self, Expanded, KernelExpansion, WIRE_METADATA};
use crate::outdir::OutDir;
use ivtrace_time::ClockMapping;

/// The kernel trace: its directory, the generation of event classes its
/// metadata was last written for, and its state.
pub(crate) struct KernelTrace {
    pub dir: OutDir,
    pub generation: u64,
    pub state: KernelState,
}

/// See the module documentation (the expanded state's data boxed: the
/// staged one has none).
pub(crate) enum KernelState {
    /// `dir` is the staging directory.
    Staged,
    /// `dir` is `DIR/kernel/`.
    Expanded(Box<Expanded>),
}

/// The online kernel expansion: each packet expanded as it arrives.
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
    /// A new trace whose packets are staged in `dir` (the staging
    /// directory).
    pub fn staged(dir: OutDir) -> KernelTrace {
        KernelTrace {
            dir,
            generation: 0,
            state: KernelState::Staged,
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
            KernelState::Expanded(e) => &e.classes,
        }
    }

    /// What the expansion at the end did, once it ran.
    pub fn expansion(&self) -> Option<&KernelExpansion> {
        match &self.state {
            KernelState::Staged => None,
            KernelState::Expanded(e) => Some(&e.stats),
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

    /// The expansion at the end ran: its result, and the directory it
    /// wrote.
    pub fn set_expanded(&mut self, expanded: Expanded, dir: OutDir) {
        self.dir = dir;
        self.state = KernelState::Expanded(Box::new(expanded));
    }
}

impl Online {
    /// A new expansion; `table`: the guest's thread name table as read
    /// so far (empty if none was).
    pub fn new(table: &NameTable) -> Online {
        let mut kernel = OnlineKernel::default();
        kernel.set_table(table);
        Online {
            kernel,
            lost: BTreeMap::new(),
            times: BTreeMap::new(),
            converted_with: None,
        }
    }

    pub fn set_table(&mut self, table: &NameTable) {
        self.kernel.set_table(table);
    }

    /// The event classes the expanded packets declare so far.
    pub fn classes(&self) -> &StreamClasses {
        self.kernel.classes()
    }

    /// The generation of those classes (they grow as packets need them).
    pub fn generation(&self) -> u64 {
        self.kernel.generation()
    }

    /// What the expansion did so far.
    pub fn stats(&self) -> &KernelExpansion {
        &self.kernel.stats
    }

    /// The mapping the latest packet was converted with (what the clock
    /// block must say while recording), if any.
    pub fn converted_with(&self) -> Option<&ClockMapping> {
        self.converted_with.as_ref()
    }

    /// A kernel packet, expanded; one that does not walk becomes an empty
    /// packet with its header (the stream's sequence has no gap) and its
    /// events are counted as lost, in every later packet's
    /// `events_discarded` too. Times are converted with `clock`, the
    /// mapping in force.
    pub fn packet(
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
