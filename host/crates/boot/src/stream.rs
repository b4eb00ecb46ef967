//! The boot's derived streams in the kernel trace, written and read back.
//!
//! Two stream classes of `DIR/kernel/`, beside the native (0) and ftrace
//! (2) streams, with the same packets and clock, so babeltrace2 and Trace
//! Compass show them on the kernel's timeline:
//!
//! - class [`STREAM_BOOT`], file `boot`: the timeline. `ivtrace:boot_phase`
//!   at each phase's start (with its duration), `ivtrace:initcall` at each
//!   initcall's (its CPU in the packet), `ivtrace:boot_mark` (exec of
//!   /init, module loads, the workload's start), then at the boot's end what
//!   ran on each vCPU (`ivtrace:boot_cpu_time`), what the analysis could
//!   not see (`ivtrace:boot_note`) and `ivtrace:boot_summary`;
//! - class [`STREAM_PROFILE`], file `profile`: the function profile, the
//!   compact stream that can stand instead of function_graph's raw
//!   events. `ivtrace:func_name` and `ivtrace:profile_thread` first, then
//!   per phase, at its end, one `ivtrace:func_profile` per (function,
//!   thread) called in it, and `ivtrace:profile_pairing`.
//!
//! Durations are in the trace clock's cycles (`_cycles`), like its
//! timestamps: exact sums, whatever the clock's frequency.

use std::collections::BTreeMap;
use std::io;

use ivtrace_ctf::host_trace::Payload;
use ivtrace_ctf::outdir::OutDir;
use ivtrace_ctf::read::{Record, StreamReader, Trace};
use ivtrace_ctf::tsdl;
use ivtrace_region::classes::{EventClass, Field, FieldType, StreamClasses};
use ivtrace_tracefs::ftrace_relay::out::StreamOut;

use crate::model::{Boot, CpuTime, Initcall, Key, Mark, Pairing, Phase, Profile, Stat};

pub const STREAM_BOOT: u32 = 3;
pub const STREAM_PROFILE: u32 = 4;
pub const BOOT_FILE: &str = "boot";
pub const PROFILE_FILE: &str = "profile";

const PHASE: u32 = 0;
const INITCALL: u32 = 1;
const MARK: u32 = 2;
const CPU_TIME: u32 = 3;
const NOTE: u32 = 4;
const SUMMARY: u32 = 5;

const FUNC_PROFILE: u32 = 0;
const FUNC_NAME: u32 = 1;
const THREAD: u32 = 2;
const PAIRING: u32 = 3;

/// Where the derived streams' declarations start in the kernel metadata
/// (what a new derivation replaces).
const METADATA_MARK: &str = "/* ivtrace-boot: the derived streams */\n";

fn f(name: &str, ty: FieldType) -> Field {
    Field::new(name, ty, false)
}

fn hex(name: &str) -> Field {
    Field::new(name, FieldType::U64, true)
}

fn class(stream: u32, id: u32, name: &str, fields: Vec<Field>) -> EventClass {
    EventClass::new(id, stream, name.into(), fields)
}

/// The boot stream's classes.
pub fn boot_classes() -> Vec<EventClass> {
    use FieldType::*;
    let c = |id, name, fields| class(STREAM_BOOT, id, name, fields);
    vec![
        c(
            PHASE,
            "ivtrace:boot_phase",
            vec![
                f("name", String),
                f("level", String),
                f("stage", String),
                f("duration_cycles", U64),
            ],
        ),
        c(
            INITCALL,
            "ivtrace:initcall",
            vec![
                f("tid", S32),
                hex("func"),
                f("name", String),
                f("level", String),
                f("duration_cycles", U64),
                f("ret", S32),
                f("returned", U8),
            ],
        ),
        c(
            MARK,
            "ivtrace:boot_mark",
            vec![f("tid", S32), f("kind", String), f("name", String)],
        ),
        c(
            CPU_TIME,
            "ivtrace:boot_cpu_time",
            vec![
                f("cpu", U32),
                f("tid", S32),
                f("comm", String),
                f("cycles", U64),
            ],
        ),
        c(NOTE, "ivtrace:boot_note", vec![f("text", String)]),
        c(
            SUMMARY,
            "ivtrace:boot_summary",
            vec![
                f("first_cycles", U64),
                f("last_cycles", U64),
                f("end_cycles", U64),
            ],
        ),
    ]
}

/// The profile stream's classes.
pub fn profile_classes() -> Vec<EventClass> {
    use FieldType::*;
    let c = |id, name, fields| class(STREAM_PROFILE, id, name, fields);
    let counts = [
        "calls",
        "entries",
        "exits",
        "unmatched_exits",
        "unclosed",
        "refused",
    ];
    vec![
        c(
            FUNC_PROFILE,
            "ivtrace:func_profile",
            vec![
                f("phase", String),
                f("tid", S32),
                hex("func"),
                f("count", U64),
                f("total_cycles", U64),
                f("self_cycles", U64),
                f("min_cycles", U64),
                f("max_cycles", U64),
            ],
        ),
        c(
            FUNC_NAME,
            "ivtrace:func_name",
            vec![hex("func"), f("name", String)],
        ),
        c(
            THREAD,
            "ivtrace:profile_thread",
            vec![f("tid", S32), f("comm", String)],
        ),
        c(
            PAIRING,
            "ivtrace:profile_pairing",
            counts.iter().map(|n| f(n, U64)).collect(),
        ),
    ]
}

/// One event to write: (time, CPU, class, payload).
type Out = (u64, u32, u32, Vec<u8>);

fn boot_events(b: &Boot) -> Vec<Out> {
    let mut v: Vec<Out> = Vec::new();
    for p in &b.phases {
        let pl = Payload(Vec::new())
            .str(&p.name)
            .str(&p.level)
            .str(&p.stage)
            .u64(p.duration());
        v.push((p.start, 0, PHASE, pl.0));
    }
    for c in &b.initcalls {
        let pl = Payload(Vec::new())
            .i32(c.tid)
            .u64(c.func)
            .str(&c.name)
            .str(&c.level)
            .u64(c.duration().unwrap_or(0))
            .i32(c.ret.unwrap_or(0))
            .u8(c.end.is_some() as u8);
        v.push((c.start, c.cpu, INITCALL, pl.0));
    }
    for m in &b.marks {
        let pl = Payload(Vec::new()).i32(m.tid).str(&m.kind).str(&m.name);
        v.push((m.ts, m.cpu, MARK, pl.0));
    }
    for t in &b.cpu_time {
        let pl = Payload(Vec::new())
            .u32(t.cpu)
            .i32(t.tid)
            .str(&t.comm)
            .u64(t.cycles);
        v.push((b.end, t.cpu, CPU_TIME, pl.0));
    }
    for n in &b.notes {
        v.push((b.end, 0, NOTE, Payload(Vec::new()).str(n).0));
    }
    let s = Payload(Vec::new()).u64(b.first).u64(b.last).u64(b.end);
    v.push((b.last.max(b.end), 0, SUMMARY, s.0));
    v
}

fn profile_events(p: &Profile, phases: &[Phase], first: u64) -> Vec<Out> {
    let mut v: Vec<Out> = Vec::new();
    for (func, name) in &p.names {
        v.push((
            first,
            0,
            FUNC_NAME,
            Payload(Vec::new()).u64(*func).str(name).0,
        ));
    }
    for (tid, comm) in &p.threads {
        v.push((first, 0, THREAD, Payload(Vec::new()).i32(*tid).str(comm).0));
    }
    let end_of: BTreeMap<&str, u64> = phases.iter().map(|ph| (ph.name.as_str(), ph.end)).collect();
    let mut last = first;
    for (k, s) in &p.rows {
        let ts = end_of.get(k.phase.as_str()).copied().unwrap_or(first);
        last = last.max(ts);
        let pl = Payload(Vec::new())
            .str(&k.phase)
            .i32(k.tid)
            .u64(k.func)
            .u64(s.count)
            .u64(s.total)
            .u64(s.self_)
            .u64(s.min)
            .u64(s.max);
        v.push((ts, 0, FUNC_PROFILE, pl.0));
    }
    let c = &p.pairing;
    let pl = [
        c.calls,
        c.entries,
        c.exits,
        c.unmatched_exits,
        c.unclosed,
        c.refused,
    ]
    .iter()
    .fold(Payload(Vec::new()), |pl, &n| pl.u64(n));
    v.push((last, 0, PAIRING, pl.0));
    v
}

/// The hidden name a stream is written under before it is declared.
fn staged(name: &str) -> String {
    format!(".{name}.tmp")
}

/// Writes `events` (sorted by time here, stable) into `dir`'s staged
/// `name`; its size.
fn write_stream(dir: &OutDir, name: &str, stream: u32, mut events: Vec<Out>) -> io::Result<u64> {
    events.sort_by_key(|e| e.0);
    remove(dir, &staged(name))?;
    let mut out = StreamOut::create_class(dir, &staged(name), stream, 0)?;
    for (ts, cpu, id, payload) in &events {
        out.event(*cpu, *id, *ts, payload)?;
    }
    out.finish(events.last().map_or(0, |e| e.1), 0)?;
    Ok(std::fs::metadata(dir.join(&staged(name)))?.len())
}

fn remove(dir: &OutDir, name: &str) -> io::Result<()> {
    match dir.remove_file(name) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The kernel trace's metadata with the derived streams declared (an
/// earlier derivation's declarations replaced).
fn declare(dir: &OutDir, boot: bool, profile: bool) -> io::Result<()> {
    let text = std::fs::read_to_string(dir.join("metadata"))?;
    let mut text = match text.find(METADATA_MARK) {
        Some(at) => text[..at].to_string(),
        None => text,
    };
    text.push_str(METADATA_MARK);
    let mut append = |stream, classes: Vec<EventClass>| {
        let mut sc = StreamClasses::default();
        classes.into_iter().for_each(|c| {
            sc.insert(c);
        });
        tsdl::append_stream(&mut text, stream, &sc);
    };
    if boot {
        append(STREAM_BOOT, boot_classes());
    }
    if profile {
        append(STREAM_PROFILE, profile_classes());
    }
    dir.write_atomically("metadata", text.as_bytes())
}

/// Bytes of the derived stream files written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Written {
    pub boot_bytes: u64,
    pub profile_bytes: u64,
}

/// Writes the boot stream and, when there is one, the profile stream into
/// the kernel trace directory `dir`. The trace stays readable throughout:
/// the files are written under hidden names (which readers skip), then
/// declared in the metadata, then put in place (a stream a metadata
/// declares may have no file; a file it does not declare breaks readers).
pub fn write(dir: &OutDir, boot: &Boot, profile: Option<&Profile>) -> io::Result<Written> {
    let boot_bytes = write_stream(dir, BOOT_FILE, STREAM_BOOT, boot_events(boot))?;
    let profile_bytes = match profile {
        Some(p) => write_stream(
            dir,
            PROFILE_FILE,
            STREAM_PROFILE,
            profile_events(p, &boot.phases, boot.first),
        )?,
        None => 0,
    };
    declare(dir, true, profile.is_some())?;
    dir.rename(&staged(BOOT_FILE), BOOT_FILE)?;
    match profile {
        Some(_) => dir.rename(&staged(PROFILE_FILE), PROFILE_FILE)?,
        None => remove(dir, PROFILE_FILE)?,
    }
    Ok(Written {
        boot_bytes,
        profile_bytes,
    })
}

fn s(r: &Record, name: &str) -> String {
    r.text_named(name)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

fn u(r: &Record, name: &str) -> u64 {
    r.int_named(name).unwrap_or(0) as u64
}

fn i(r: &Record, name: &str) -> i32 {
    r.int_named(name).unwrap_or(0) as i32
}

fn read_boot_event(b: &mut Boot, r: &Record) {
    match r.class.id {
        PHASE => b.phases.push(Phase {
            name: s(r, "name"),
            level: s(r, "level"),
            stage: s(r, "stage"),
            start: r.ts,
            end: r.ts.saturating_add(u(r, "duration_cycles")),
        }),
        INITCALL => b.initcalls.push(Initcall {
            func: u(r, "func"),
            name: s(r, "name"),
            level: s(r, "level"),
            start: r.ts,
            end: (u(r, "returned") != 0).then(|| r.ts.saturating_add(u(r, "duration_cycles"))),
            ret: (u(r, "returned") != 0).then(|| i(r, "ret")),
            cpu: r.cpu(),
            tid: i(r, "tid"),
        }),
        MARK => b.marks.push(Mark {
            ts: r.ts,
            kind: s(r, "kind"),
            name: s(r, "name"),
            cpu: r.cpu(),
            tid: i(r, "tid"),
        }),
        CPU_TIME => b.cpu_time.push(CpuTime {
            cpu: u(r, "cpu") as u32,
            tid: i(r, "tid"),
            comm: s(r, "comm"),
            cycles: u(r, "cycles"),
        }),
        NOTE => b.notes.push(s(r, "text")),
        SUMMARY => {
            (b.first, b.last, b.end) = (
                u(r, "first_cycles"),
                u(r, "last_cycles"),
                u(r, "end_cycles"),
            )
        }
        _ => {}
    }
}

fn read_profile_event(p: &mut Profile, r: &Record) {
    match r.class.id {
        FUNC_PROFILE => {
            let key = Key {
                phase: s(r, "phase"),
                func: u(r, "func"),
                tid: i(r, "tid"),
            };
            let st = Stat {
                count: u(r, "count"),
                total: u(r, "total_cycles"),
                self_: u(r, "self_cycles"),
                min: u(r, "min_cycles"),
                max: u(r, "max_cycles"),
            };
            p.rows.entry(key).and_modify(|x| x.add(&st)).or_insert(st);
        }
        FUNC_NAME => {
            p.names.insert(u(r, "func"), s(r, "name"));
        }
        THREAD => {
            p.threads.insert(i(r, "tid"), s(r, "comm"));
        }
        PAIRING => {
            p.pairing = Pairing {
                calls: u(r, "calls"),
                entries: u(r, "entries"),
                exits: u(r, "exits"),
                unmatched_exits: u(r, "unmatched_exits"),
                unclosed: u(r, "unclosed"),
                refused: u(r, "refused"),
            }
        }
        _ => {}
    }
}

/// Calls `each` for every event of stream class `stream`'s files in `trace`.
fn each_record(trace: &Trace, stream: u32, mut each: impl FnMut(&Record)) -> io::Result<bool> {
    let mut found = false;
    for mut sr in trace.streams()? {
        if !is_class(&sr, stream)? {
            continue;
        }
        found = true;
        while let Some(r) = sr.next_record()? {
            each(&r);
        }
    }
    Ok(found)
}

fn is_class(sr: &StreamReader, stream: u32) -> io::Result<bool> {
    Ok(ivtrace_ctf::read::stream_class_of(sr.path())? == Some(stream))
}

/// The boot and profile streams of a kernel trace read back, if it has them.
pub fn read(trace: &Trace) -> io::Result<(Option<Boot>, Option<Profile>)> {
    let mut boot = Boot {
        reset: crate::model::reset_value(&trace.meta),
        ..Boot::default()
    };
    let has_boot = each_record(trace, STREAM_BOOT, |r| read_boot_event(&mut boot, r))?;
    let mut profile = Profile::default();
    let has_profile = each_record(trace, STREAM_PROFILE, |r| {
        read_profile_event(&mut profile, r)
    })?;
    Ok((has_boot.then_some(boot), has_profile.then_some(profile)))
}
