//! The plain values of a boot: its phases, initcalls, marks, what ran on
//! each vCPU, and the function profile. Times are the kernel trace's clock
//! values (its cycles: `freq` of its clock says how many per second), as
//! the events carry them; nothing here assumes a frequency.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use ivtrace_ctf::read::{Clock, Metadata};
use ivtrace_ctf::tsdl::EnvValue;

/// The stages of a boot, in order.
pub const STAGES: [&str; 4] = ["untraced", "kernel", "userland", "workload"];

/// One contiguous part of the boot's timeline: a stage's part outside the
/// initcall levels (`untraced`, `start_kernel`, `post_initcalls`,
/// `userland`, `workload`), or one initcall sub-level (`core`,
/// `core_sync`, `rootfs`...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    /// The initcall level a sub-level is part of; empty for the others.
    pub level: String,
    /// One of [`STAGES`].
    pub stage: String,
    pub start: u64,
    pub end: u64,
}

impl Phase {
    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// One initcall (`do_one_initcall`, or console_init's for `console`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Initcall {
    pub func: u64,
    /// Its symbol, when the trace's kernel symbols name it.
    pub name: String,
    /// The sub-level it ran in.
    pub level: String,
    pub start: u64,
    /// None: it had not returned when the trace ended.
    pub end: Option<u64>,
    pub ret: Option<i32>,
    pub cpu: u32,
    pub tid: i32,
}

impl Initcall {
    pub fn duration(&self) -> Option<u64> {
        Some(self.end?.saturating_sub(self.start))
    }
}

/// A moment of the boot: `exec` (a program pid 1 ran: /init, then what it
/// exec'd), `module` (a module loaded), `marker` (a trace_marker line
/// starting with `ivtrace-boot`), `workload` (the exec that starts the
/// workload, when the user names it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub ts: u64,
    pub kind: String,
    pub name: String,
    pub cpu: u32,
    pub tid: i32,
}

/// How long thread `tid` ran on vCPU `cpu` during the boot (from the
/// trace's context switches; tid 0: idle).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuTime {
    pub cpu: u32,
    pub tid: i32,
    pub comm: String,
    pub cycles: u64,
}

/// The kernel trace's clock value at the vCPU's reset (guest tick 0): 0
/// when its values are the guest's ticks (a trace written before the
/// kernel trace counted nanoseconds: the date in the clock's offset);
/// for values in nanoseconds since the epoch (offset 0), the time the
/// mapping gives tick 0, from the env keys that describe it
/// (`ivtrace_clock_freq_hz`, `_offset_s`, `_offset_cycles`; docs/ctf.md
/// "Time"). Guest text: any value missing or out of range gives 0.
pub fn reset_value(meta: &Metadata) -> u64 {
    let c = &meta.clock;
    if c.freq != 1_000_000_000 || c.offset != 0 || c.offset_s != 0 {
        return 0;
    }
    let int = |k: &str| match meta.env.get(k) {
        Some(EnvValue::Int(v)) => Some(*v),
        _ => None,
    };
    let (Some(freq), Some(offset_s), Some(offset)) = (
        int("ivtrace_clock_freq_hz").filter(|&f| f > 0),
        int("ivtrace_clock_offset_s"),
        int("ivtrace_clock_offset_cycles"),
    ) else {
        return 0;
    };
    // The guest's tick clock those keys describe; its value 0 is tick 0.
    let ticks = Clock {
        freq: u64::try_from(freq).unwrap_or(0),
        offset_s,
        offset: u64::try_from(offset).unwrap_or(0),
        ..c.clone()
    };
    u64::try_from(ticks.origin_ns()).unwrap_or(0)
}

/// The boot, as the trace shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Boot {
    /// The timeline, in order, each phase ending where the next starts.
    pub phases: Vec<Phase>,
    pub initcalls: Vec<Initcall>,
    pub marks: Vec<Mark>,
    pub cpu_time: Vec<CpuTime>,
    /// The first and last event of the trace's ftrace streams.
    pub first: u64,
    pub last: u64,
    /// Where the boot ends: the workload's start, or the trace's end.
    pub end: u64,
    /// The clock value of the vCPU's reset, where the report's times
    /// count from ([`reset_value`]).
    #[serde(default)]
    pub reset: u64,
    /// What the analysis could not see or had to assume.
    pub notes: Vec<String>,
}

/// One row of the function profile: the calls of `func` by thread `tid`
/// entered during phase `phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub count: u64,
    /// Cycles from entry to exit, summed; the same less the callees'
    /// (self); the shortest and longest call.
    pub total: u64,
    pub self_: u64,
    pub min: u64,
    pub max: u64,
}

impl Stat {
    pub fn one(total: u64, self_: u64) -> Stat {
        Stat {
            count: 1,
            total,
            self_,
            min: total,
            max: total,
        }
    }

    pub fn add(&mut self, o: &Stat) {
        self.count = self.count.saturating_add(o.count);
        self.total = self.total.saturating_add(o.total);
        self.self_ = self.self_.saturating_add(o.self_);
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
}

/// A profile row's key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    pub phase: String,
    pub func: u64,
    pub tid: i32,
}

/// How the graph's entries and exits paired up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pairing {
    pub entries: u64,
    pub exits: u64,
    /// Calls measured (an entry and its exit).
    pub calls: u64,
    /// Exits with no entry open on their thread at their depth (the call
    /// began before the tracer, or its entry was lost).
    pub unmatched_exits: u64,
    /// Entries whose exit never came: a later event of the thread at a
    /// lower depth closed them (their exit was lost), or the trace ended.
    pub unclosed: u64,
    /// Events the bounds refused (depth past [`crate::profile::DEPTH_MAX`],
    /// threads past the cap, rows past the cap).
    pub refused: u64,
}

/// The function profile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub rows: BTreeMap<Key, Stat>,
    /// Function names, where the trace's symbols have them.
    pub names: BTreeMap<u64, String>,
    /// Thread names seen in the trace.
    pub threads: BTreeMap<i32, String>,
    pub pairing: Pairing,
}
