//! What the host trace says about the QEMU's threads besides tracefs
//! events, in lttng-modules' names: one `lttng_statedump_process_state`
//! per thread (its tid, its process's pid, its name: Trace Compass's
//! kernel analysis learns each host thread's pid from these, and the VM
//! view keeps only the threads of the recorded QEMU), and the classes of
//! the vmsync events the VM view adds at the end (`vmsync_gh_host`,
//! `vmsync_hg_host`: cnt, vm_uid, as LTTng's vmsync addon writes them).

use std::fs;

use ivtrace_ctf::host_trace::{Payload, STREAM_KERNEL};
use ivtrace_region::classes::{EventClass, Field, FieldType};

/// Class ids in the host trace's kernel stream class (tracefs events
/// start at [`crate::host_events::FIRST_CLASS_ID`]).
pub const PROCESS_STATE: u32 = 90;
pub const VMSYNC_GH_HOST: u32 = 91;
pub const VMSYNC_HG_HOST: u32 = 92;

/// lttng-modules' enum values the state dump uses.
const LTTNG_USER_THREAD: i32 = 0;
const LTTNG_MODE_UNKNOWN: i32 = 5;
const LTTNG_SUBMODE_UNKNOWN: i32 = 1;
const LTTNG_WAIT_CPU: i32 = 2;
const LTTNG_WAIT: i32 = 5;
const LTTNG_UNNAMED: i32 = 0;

/// The three classes, to declare in the host trace's metadata.
pub fn classes() -> Vec<EventClass> {
    let s32 = |n: &str| Field::new(n, FieldType::S32, false);
    let process = vec![
        s32("tid"),
        s32("vtid"),
        s32("pid"),
        s32("vpid"),
        s32("ppid"),
        s32("vppid"),
        Field::new("name", FieldType::Chars(16), false),
        s32("type"),
        s32("mode"),
        s32("submode"),
        s32("status"),
        s32("ns_level"),
        Field::new("ns_inum", FieldType::U32, false),
        Field::new("cpu", FieldType::U32, false),
    ];
    let vmsync = || {
        vec![
            Field::new("cnt", FieldType::U32, false),
            Field::new("vm_uid", FieldType::U64, false),
        ]
    };
    let c = |id, name: &str, f| EventClass::new(id, STREAM_KERNEL, name.into(), f);
    vec![
        c(PROCESS_STATE, "lttng_statedump_process_state", process),
        c(VMSYNC_GH_HOST, "vmsync_gh_host", vmsync()),
        c(VMSYNC_HG_HOST, "vmsync_hg_host", vmsync()),
    ]
}

/// One thread as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadState {
    pub tid: i32,
    pub pid: i32,
    pub ppid: i32,
    pub name: [u8; 16],
    /// The `stat` state letter.
    pub state: u8,
    pub cpu: u32,
}

/// Parses `/proc/PID/task/TID/stat` (the name may hold spaces and `)`:
/// the fields after it start at the last `)`).
pub fn parse_stat(pid: i32, text: &str) -> Option<ThreadState> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let tid = text[..open].trim().parse().ok()?;
    let mut name = [0u8; 16];
    let comm = text.get(open + 1..close)?.as_bytes();
    let n = comm.len().min(15);
    name[..n].copy_from_slice(&comm[..n]);
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state), so field k is rest[k - 3].
    Some(ThreadState {
        tid,
        pid,
        ppid: rest.get(1)?.parse().ok()?,
        name,
        state: *rest.first()?.as_bytes().first()?,
        cpu: rest.get(36)?.parse().ok()?,
    })
}

/// Every thread of process `pid` now (threads that exit meanwhile are
/// left out).
pub fn threads_of(pid: i32) -> Vec<ThreadState> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in rd.flatten() {
        if let Ok(text) = fs::read_to_string(e.path().join("stat")) {
            out.extend(parse_stat(pid, &text));
        }
    }
    out.sort_by_key(|t| t.tid);
    out
}

/// The pid namespace inode of process `pid` (`pid:[N]`), 0 if unknown.
pub fn pid_ns_inum(pid: i32) -> u32 {
    fs::read_link(format!("/proc/{pid}/ns/pid"))
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
        })
        .unwrap_or(0)
}

/// The `lttng_statedump_process_state` payload of `t` (a thread of the
/// initial pid namespace, as the host's threads are: vtid = tid).
pub fn process_state_payload(t: &ThreadState, ns_inum: u32) -> Vec<u8> {
    let status = match t.state {
        b'R' => LTTNG_WAIT_CPU,
        b'S' | b'D' | b'I' => LTTNG_WAIT,
        _ => LTTNG_UNNAMED,
    };
    let mut p = Payload::default()
        .i32(t.tid)
        .i32(t.tid)
        .i32(t.pid)
        .i32(t.pid)
        .i32(t.ppid)
        .i32(t.ppid)
        .0;
    p.extend_from_slice(&t.name);
    Payload(p)
        .i32(LTTNG_USER_THREAD)
        .i32(LTTNG_MODE_UNKNOWN)
        .i32(LTTNG_SUBMODE_UNKNOWN)
        .i32(status)
        .i32(0)
        .u32(ns_inum)
        .u32(t.cpu)
        .0
}

/// The payload of a vmsync event.
pub fn vmsync_payload(cnt: u32, vm_uid: u64) -> Vec<u8> {
    Payload::default().u32(cnt).u64(vm_uid).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "4242 (CPU 0/KVM) S 1 4200 4200 0 -1 4194624 0 0 0 0 5 6 0 0 20 0 \
                    5 0 100 1000 200 184467 0 0 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";
        let t = parse_stat(4200, line).unwrap();
        assert_eq!(
            (t.tid, t.pid, t.ppid, t.state, t.cpu),
            (4242, 4200, 1, b'S', 3)
        );
        assert_eq!(&t.name[..9], b"CPU 0/KVM");
        let odd = line.replace("CPU 0/KVM", "a) b (c");
        assert_eq!(parse_stat(4200, &odd).unwrap().cpu, 3);
        assert!(parse_stat(1, "garbage").is_none());
    }

    #[test]
    fn this_process_is_dumped_with_lttngs_layout() {
        let me = std::process::id() as i32;
        let threads = threads_of(me);
        let t = threads
            .iter()
            .find(|t| t.tid == me)
            .expect("the main thread");
        let p = process_state_payload(t, pid_ns_inum(me));
        let class = &classes()[0];
        let size: u32 = class
            .fields
            .iter()
            .map(|f| match f.ty {
                FieldType::Chars(n) => n as u32,
                ty => ty.integer().unwrap().0,
            })
            .sum();
        assert_eq!(p.len() as u32, size);
        assert_eq!(ivtrace_region::bytes::i32_at(&p, 8), Some(me));
        assert!(pid_ns_inum(me) > 0);
    }
}
