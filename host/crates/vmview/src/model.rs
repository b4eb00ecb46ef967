//! What the derivation reads and what it produces, as plain values: host
//! events decoded from the host trace, guest context switches decoded from
//! the guest kernel trace (already on host time), and the VM view's
//! intervals, hypercalls and vmsync events.

/// A thread name as the kernel keeps it (`TASK_COMM_LEN`), NUL-padded.
pub type Comm = [u8; 16];

/// `comm` from text (cut to 15 bytes, NUL-padded).
pub fn comm(s: &str) -> Comm {
    let mut c = [0u8; 16];
    let n = s.len().min(15);
    c[..n].copy_from_slice(&s.as_bytes()[..n]);
    c
}

/// `comm` as text, up to its first NUL.
pub fn comm_str(c: &Comm) -> String {
    let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
    String::from_utf8_lossy(&c[..end]).into_owned()
}

/// A host thread: its id and name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Task {
    pub tid: i32,
    pub comm: Comm,
}

/// One host event, as the derivation needs it (the host trace's
/// LTTng-named events, fields by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// `sched_switch`; `prev_state` 0 means still runnable (preempted).
    Switch {
        prev: Task,
        prev_state: i64,
        next: Task,
    },
    /// `sched_wakeup`: `tid` is runnable from now on, queued on `target_cpu`.
    Wakeup { tid: i32, target_cpu: u32 },
    /// `sched_migrate_task`: `tid` moves to `dest_cpu`'s run queue.
    Migrate { tid: i32, dest_cpu: u32 },
    /// `kvm_x86_exit`.
    Exit {
        vcpu_id: u32,
        reason: u32,
        isa: u32,
        guest_rip: u64,
    },
    /// `kvm_x86_entry`.
    Entry { vcpu_id: u32 },
    /// `kvm_x86_hypercall`: RAX and RBX, RCX, RDX, RSI of the guest.
    Hypercall { nr: u64, args: [u64; 4] },
    /// `lttng_statedump_process_state`: thread `tid` belongs to process `pid`.
    Process { tid: i32, pid: i32, name: Comm },
}

/// One host event at host time `ts` (ns) on host CPU `cpu`, written by
/// thread `tid` (the tracefs `common_pid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostEvent {
    pub ts: u64,
    pub cpu: u32,
    pub tid: i32,
    pub kind: HostKind,
}

/// A context switch of the guest, its time mapped to host time (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestSwitch {
    pub ts: u64,
    pub cpu: u32,
    pub prev_tid: i32,
    pub prev_comm: Comm,
    pub next_tid: i32,
    pub next_comm: Comm,
}

/// Why a vCPU was not running guest code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Its thread was runnable but waited for a host CPU (what the
    /// kernel counts as run-queue wait: after a preemption or a wake-up).
    Preempted = 1,
    /// Its thread slept (the guest halted, or it waited inside QEMU/KVM).
    Blocked = 2,
    /// Its thread ran in the hypervisor (a KVM exit being handled).
    Hypervisor = 3,
    /// Its thread was runnable, then ran again, but the host trace does
    /// not show when it got its CPU back (a context switch the host kernel
    /// did not trace): somewhere in this interval it stopped waiting. The
    /// interval is an upper bound of unseen preempted time.
    Untraced = 4,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Preempted => "preempted",
            State::Blocked => "blocked",
            State::Hypervisor => "hypervisor",
            State::Untraced => "untraced",
        }
    }

    pub fn from_u8(v: u8) -> Option<State> {
        match v {
            1 => Some(State::Preempted),
            2 => Some(State::Blocked),
            3 => Some(State::Hypervisor),
            4 => Some(State::Untraced),
            _ => None,
        }
    }
}

/// The KVM exit an interval belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitRef {
    /// `KVM_ISA_VMX` (1) or `KVM_ISA_SVM` (2): what `reason` numbers mean.
    pub isa: u32,
    pub reason: u32,
    pub guest_rip: u64,
    /// The exit's first interval (one exit may be cut into several by a
    /// preemption or a sleep in the hypervisor).
    pub first: bool,
}

/// At most this many host tasks are listed per interval; the rest's time
/// goes to [`Interval::ran_other_ns`].
pub const RAN_MAX: usize = 4;

/// A stretch of time when vCPU `vcpu` did not run guest code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    pub vcpu: u32,
    pub state: State,
    /// Host time, ns.
    pub start: u64,
    pub end: u64,
    /// The vCPU thread.
    pub host_tid: i32,
    /// The host CPU it waited for (preempted), slept on, or ran on.
    pub host_cpu: u32,
    pub exit: Option<ExitRef>,
    /// Preempted: the task that took the CPU from the vCPU thread (None
    /// after a wake-up: nothing took it, it was not running).
    pub taken_by: Option<Task>,
    /// Preempted: who ran on `host_cpu` meanwhile, as far as the host
    /// trace saw its switches, and for how long.
    pub ran: Vec<(Task, u64)>,
    pub ran_other_ns: u64,
    /// The trace ended before the interval did.
    pub truncated: bool,
}

impl Interval {
    /// A stretch of vCPU thread `host_tid` on host CPU 0 with nothing else
    /// known (no exit, no taker, nothing ran): the tests' building block.
    #[cfg(test)]
    pub fn bare(vcpu: u32, state: State, (start, end): (u64, u64), host_tid: i32) -> Interval {
        Interval {
            vcpu,
            state,
            start,
            end,
            host_tid,
            host_cpu: 0,
            exit: None,
            taken_by: None,
            ran: Vec::new(),
            ran_other_ns: 0,
            truncated: false,
        }
    }

    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// One hypercall, kvm_exit + kvm_hypercall + kvm_entry aggregated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hypercall {
    pub vcpu: u32,
    pub host_tid: i32,
    /// The kvm_hypercall's host time.
    pub ts: u64,
    pub exit_ts: u64,
    pub nr: u64,
    pub args: [u64; 4],
    pub guest_rip: u64,
    /// kvm_exit to kvm_entry, None when the trace ended before the entry.
    pub exit_ns: Option<u64>,
    pub exit_cpu: u32,
    pub entry_cpu: Option<u32>,
}

/// Which half of a vmsync exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncDir {
    /// `vmsync_gh_host`: the guest's message arrived (at kvm_hypercall).
    GuestToHost,
    /// `vmsync_hg_host`: the host's answer, at the vCPU's next kvm_entry.
    HostToGuest,
}

/// A vmsync event for the host trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vmsync {
    pub dir: SyncDir,
    pub ts: u64,
    pub cpu: u32,
    pub tid: i32,
    pub cnt: u32,
    pub vm_uid: u64,
}

/// What the derivation emits, in host time order per vCPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Interval(Interval),
    Hypercall(Hypercall),
    Vmsync(Vmsync),
}

/// The guest thread an output is attributed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GuestThread {
    /// -1 when the guest trace says nothing about that CPU.
    pub tid: i32,
    pub comm: Comm,
}

impl GuestThread {
    pub const UNKNOWN: GuestThread = GuestThread {
        tid: -1,
        comm: [0; 16],
    };
}
