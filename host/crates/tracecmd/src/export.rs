//! `ivtrace export --format trace-cmd`: recordings read back from their
//! files (ivtrace-ctf's `read`) into one host file and one file per guest,
//! as trace-cmd's own host-guest recordings are: the host file names each
//! guest and maps its vCPUs to host threads (GUEST), each guest file says
//! how its time maps onto the host's (TIME_SHIFT) and which host file it
//! belongs to (the peer's TRACEID).
//!
//! Time: each file counts nanoseconds from its own clock's zero (the host
//! trace's clock for the host file, the guest's tick clock for a guest:
//! the guest's TSC in nanoseconds, or the epoch's nanoseconds for a
//! recording with a kernel trace alone), every timestamp taken through its
//! trace's clock description, never an assumed frequency. The guest's shift
//! onto the host's time is the difference of the two clocks' offsets from
//! the epoch, which is ivtrace's clock mapping (its bound is in the guest
//! file's VERSION option and in the summary).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use thiserror::Error;

use ivtrace_ctf::outdir::OutDirError;
use ivtrace_ctf::read::{Item, Merge, Record, Recording, Trace, TraceKind};
use ivtrace_ctf::sidecar::SIDECAR_NAME;
use ivtrace_ctf::{OutDir, OutputPolicy};

use crate::dat::opt;
use crate::formats::ident;
use crate::side::{recorded, FileSummary, Side};
use crate::target::{Origin, Target};

/// The host file's name in the output directory.
pub const HOST_FILE: &str = "host.dat";

/// What `export` is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The output directory (created; files in it are replaced only with
    /// `force`).
    pub out: PathBuf,
    pub force: bool,
    /// Who may read the files, and whether a shared directory is accepted.
    pub policy: OutputPolicy,
}

/// One guest's file and how it lines up with the host's.
#[derive(Debug, Clone, Serialize)]
pub struct GuestFile {
    pub name: String,
    pub recording: PathBuf,
    pub file: FileSummary,
    /// Added to the guest file's timestamps to get the host file's.
    pub time_shift_ns: i64,
    /// ivtrace's guest -> host clock mapping: how, and its bound.
    pub clock_method: String,
    pub clock_error_ns: u64,
    /// (vCPU, host thread) pairs the host file's GUEST option carries.
    pub vcpus: Vec<(u32, i32)>,
}

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
pub struct Exported {
    pub host: FileSummary,
    pub guests: Vec<GuestFile>,
    /// Stream files that stopped on a read error (what came before them
    /// is in the files), and other things a user should know.
    pub read_errors: Vec<String>,
    pub warnings: Vec<String>,
}

/// A recording directory: a sidecar, or a trace directory of ivtrace's.
fn is_recording(dir: &Path) -> bool {
    dir.join(SIDECAR_NAME).is_file()
        || ["kernel", "user", "host"]
            .iter()
            .any(|d| dir.join(d).join("metadata").is_file())
}

/// Why an export failed: which input or output file, why, and (where the
/// user can change something) a `hint:` line saying what to do.
#[derive(Debug, Error)]
pub enum ExportError {
    #[error("cannot read {}", .path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error(
        "{} holds no ivtrace recording (no ivtrace.json, no kernel/, user/ or host/ trace)\n\
         hint: give a recording directory (`ivtrace record -o DIR`) or serve's output root",
        .0.display()
    )]
    NoRecording(PathBuf),
    #[error("{}\nhint: {}", .0, .0.hint())]
    OutDir(OutDirError),
    #[error("{} exists\nhint: add --force to replace it, or choose another -o", .0.display())]
    Exists(PathBuf),
    #[error("cannot write into {}", .path.display())]
    WriteInto { path: PathBuf, source: io::Error },
    #[error("cannot write {}", .path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("the guest's clock is more than 292 years off the host's")]
    ClockShift(#[source] std::num::TryFromIntError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

type Result<T, E = ExportError> = std::result::Result<T, E>;

/// The recordings of `inputs`: each one a recording directory, or a
/// directory of them (`ivtrace serve`'s output root).
pub fn recordings(inputs: &[PathBuf]) -> Result<Vec<Recording>> {
    let mut out = Vec::new();
    for input in inputs {
        let dirs = if is_recording(input) {
            vec![input.clone()]
        } else {
            let rd = std::fs::read_dir(input).map_err(|source| ExportError::Read {
                path: input.clone(),
                source,
            })?;
            let mut v: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir() && is_recording(p))
                .collect();
            v.sort();
            v
        };
        if dirs.is_empty() {
            return Err(ExportError::NoRecording(input.clone()));
        }
        for d in dirs {
            match Recording::open(&d) {
                Ok(r) => out.push(r),
                Err(source) => return Err(ExportError::Read { path: d, source }),
            }
        }
    }
    Ok(out)
}

/// The guest file's zero, from the epoch: the zero of the guest's tick
/// clock (the user and VM view traces count its ticks), else the kernel
/// trace's (nanoseconds since the epoch: its zero is the epoch).
fn guest_origin(r: &Recording) -> i128 {
    [TraceKind::User, TraceKind::Vm, TraceKind::Kernel]
        .iter()
        .find_map(|&k| r.trace(k))
        .map_or(0, |t| t.clock().origin_ns())
}

fn origin_of(kind: TraceKind) -> Option<Origin> {
    Some(match kind {
        TraceKind::Kernel => Origin::Kernel,
        TraceKind::User => Origin::User,
        TraceKind::Vm => Origin::Vm,
        TraceKind::Host => Origin::Host,
    })
}

/// A stream source of the merge: its recording, origin and trace.
struct Source {
    rec: usize,
    origin: Origin,
}

/// Every trace of every recording in one merge.
fn merge_all(recs: &[Recording]) -> io::Result<(Merge, Vec<Source>)> {
    let mut m = Merge::default();
    let mut sources = Vec::new();
    for (ri, r) in recs.iter().enumerate() {
        for t in &r.traces {
            let Some(origin) = origin_of(t.kind) else {
                continue;
            };
            m.add_trace(t, sources.len())?;
            sources.push(Source { rec: ri, origin });
        }
    }
    Ok((m, sources))
}

/// The thread each guest CPU ran before its first context switch (what
/// that switch says it switched out).
fn seed_current(side: &mut Side, kernel: &Trace) -> io::Result<()> {
    for mut s in kernel.streams()? {
        for _ in 0..1_000_000 {
            let Ok(Some(r)) = s.next_record() else { break };
            if r.class.stream == 0 && r.class.name == "sched_switch" {
                if let Some(prev) = r.int_named("prev_tid") {
                    side.set_current(r.cpu(), prev as i32);
                }
                break;
            }
        }
    }
    Ok(())
}

/// vCPU -> host thread pairs of a recording, as its VM view's env says them
/// (`ivtrace_vcpu_threads = "vcpu:tid ..."`).
fn vcpus_of_env(r: &Recording) -> BTreeMap<u32, i32> {
    let Some(text) = r
        .trace(TraceKind::Vm)
        .and_then(|t| t.meta.env_str("ivtrace_vcpu_threads"))
    else {
        return BTreeMap::new();
    };
    text.split_whitespace()
        .filter_map(|p| {
            let (v, t) = p.split_once(':')?;
            Some((v.parse().ok()?, t.parse().ok()?))
        })
        .collect()
}

/// A QEMU thread named `CPU n/...` is vCPU n.
fn vcpu_of_name(name: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(name).ok()?.strip_prefix("CPU ")?;
    s.split_once('/')?.0.parse().ok()
}

/// The per-recording state of the pass.
struct GuestState {
    side: Side,
    vcpus: BTreeMap<u32, i32>,
    qemu_pid: Option<i64>,
}

/// Everything the pass over the merged events builds.
struct Pass<'a> {
    recs: &'a [Recording],
    sources: Vec<Source>,
    guests: Vec<GuestState>,
    host: Side,
    targets: HashMap<(usize, u32, u32), Arc<Target>>,
}

impl Pass<'_> {
    fn target(&mut self, src: usize, r: &Record) -> Arc<Target> {
        let key = (src, r.class.stream, r.class.id);
        if let Some(t) = self.targets.get(&key) {
            return Arc::clone(t);
        }
        let s = &self.sources[src];
        let rec = &self.recs[s.rec];
        let formats = rec.sidecar.as_ref().map(|c| &c.tracefs_formats);
        let none = Default::default();
        let formats = recorded(s.origin, formats.unwrap_or(&none));
        let side = match s.origin {
            Origin::Host => &mut self.host,
            _ => &mut self.guests[s.rec].side,
        };
        let t = side.catalog.target(s.origin, &r.class, formats);
        side.summary.classes.insert(
            format!("{}:{}", s.origin.label(), r.class.name),
            t.key.clone(),
        );
        self.targets.insert(key, Arc::clone(&t));
        t
    }

    /// A host state dump names a vCPU thread of a recording's QEMU.
    fn note_vcpu(&mut self, src: usize, r: &Record) {
        if !r.class.name.ends_with("statedump_process_state") {
            return;
        }
        let g = &mut self.guests[self.sources[src].rec];
        let pid = r.int_named("pid");
        if g.qemu_pid.is_some() && pid != g.qemu_pid {
            return;
        }
        if let (Some(v), Some(tid)) = (
            r.text_named("name").and_then(vcpu_of_name),
            r.int_named("tid"),
        ) {
            g.vcpus.entry(v).or_insert(tid as i32);
        }
    }

    fn item(&mut self, src: usize, ns: i128, item: Item) -> io::Result<()> {
        let origin = self.sources[src].origin;
        match item {
            Item::Event(r) => {
                if origin == Origin::Host {
                    self.note_vcpu(src, &r);
                }
                let t = self.target(src, &r);
                let side = match origin {
                    Origin::Host => &mut self.host,
                    _ => &mut self.guests[self.sources[src].rec].side,
                };
                side.event(ns, &r, &t)
            }
            Item::Discarded(d) => {
                let side = match origin {
                    Origin::Host => &mut self.host,
                    _ => &mut self.guests[self.sources[src].rec].side,
                };
                side.lost(d.packet.cpu, d.count)
            }
        }
    }
}

/// A stable, non-zero 64-bit id from `text` (FNV-1a).
fn trace_id(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v: Vec<u8> = s.bytes().filter(|&b| b != 0).collect();
    v.push(0);
    v
}

/// TIME_SHIFT: guest time + `offset` is the peer's (one sample per CPU,
/// no scaling: both files count nanoseconds).
fn time_shift(peer: u64, cpus: u32, offset: i64) -> Vec<u8> {
    let mut d = peer.to_le_bytes().to_vec();
    d.extend_from_slice(&0u32.to_le_bytes());
    d.extend_from_slice(&cpus.to_le_bytes());
    for _ in 0..cpus {
        d.extend_from_slice(&1u32.to_le_bytes());
        d.extend_from_slice(&0u64.to_le_bytes()); // time
        d.extend_from_slice(&offset.to_le_bytes()); // offset
        d.extend_from_slice(&1u64.to_le_bytes()); // scaling
    }
    for _ in 0..cpus {
        d.extend_from_slice(&0u64.to_le_bytes()); // fraction bits
    }
    d
}

/// GUEST: the guest's name, trace id and each vCPU's host thread.
fn guest_option(name: &str, id: u64, cpus: u32, vcpus: &BTreeMap<u32, i32>) -> Vec<u8> {
    let mut d = cstr(name);
    d.extend_from_slice(&id.to_le_bytes());
    let count = vcpus.keys().map(|v| v + 1).max().unwrap_or(0).max(cpus);
    d.extend_from_slice(&count.to_le_bytes());
    for (v, tid) in vcpus {
        d.extend_from_slice(&v.to_le_bytes());
        d.extend_from_slice(&tid.to_le_bytes());
    }
    d
}

/// Existing export files in `out` are replaced only with `force`.
fn check_out(out: &OutDir, force: bool, names: &[String]) -> Result<()> {
    if force {
        return Ok(());
    }
    for n in names {
        if out.kind(n)?.is_some() {
            return Err(ExportError::Exists(out.join(n)));
        }
    }
    Ok(())
}

/// The guest file's name for recording `r` (its directory's name).
fn guest_file(r: &Recording) -> String {
    let dir = r
        .root
        .file_name()
        .map_or("guest".into(), |n| n.to_string_lossy().into_owned());
    let safe: String = dir
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("guest-{}.dat", safe.trim_start_matches('.'))
}

/// Exports `inputs` (recording directories, or directories of them) into
/// `o.out`: `host.dat` and `guest-NAME.dat` per recording.
pub fn export(inputs: &[PathBuf], o: &Options) -> Result<Exported> {
    let out = OutDir::root(&o.out, &o.policy).map_err(ExportError::OutDir)?;
    export_into(inputs, &out, o.force)
}

/// [`export`] into a directory already held (serve's, for a recording
/// that just ended).
pub fn export_into(inputs: &[PathBuf], out: &OutDir, force: bool) -> Result<Exported> {
    let recs = recordings(inputs)?;
    let mut names: Vec<String> = recs.iter().map(guest_file).collect();
    let mut seen = std::collections::HashSet::new();
    for n in &mut names {
        while !seen.insert(n.clone()) {
            *n = format!("{}-2.dat", n.trim_end_matches(".dat"));
        }
    }
    check_out(out, force, &[&names[..], &[HOST_FILE.to_string()]].concat())?;
    let host_origin = recs
        .iter()
        .find_map(|r| r.trace(TraceKind::Host))
        .map_or(0, |t| t.clock().origin_ns());
    let mut guests = Vec::new();
    for r in &recs {
        let mut side = Side::new(out, guest_origin(r), false);
        if let Some(k) = r.trace(TraceKind::Kernel) {
            seed_current(&mut side, k)?;
        }
        let qemu_pid = r
            .trace(TraceKind::Host)
            .and_then(|t| t.meta.env_int("ivtrace_qemu_pid"))
            .filter(|&p| p > 0);
        guests.push(GuestState {
            side,
            vcpus: vcpus_of_env(r),
            qemu_pid,
        });
    }
    let (mut merge, sources) = merge_all(&recs)?;
    let mut pass = Pass {
        recs: &recs,
        sources,
        guests,
        host: Side::new(out, host_origin, true),
        targets: HashMap::new(),
    };
    for m in merge.by_ref() {
        pass.item(m.source, m.ns, m.item)
            .map_err(|source| ExportError::WriteInto {
                path: out.path().to_path_buf(),
                source,
            })?;
    }
    let read_errors = merge.errors.clone();
    finish(pass, &names, out, read_errors)
}

/// Writes one guest's file; what the host file's GUEST option says of it.
fn write_guest(
    r: &Recording,
    g: GuestState,
    (out, file): (&OutDir, &str),
    host_id: u64,
    host_origin: i128,
) -> Result<(GuestFile, Vec<u8>)> {
    let name = r.guest_name();
    let uuid = r
        .sidecar
        .as_ref()
        .map_or(String::new(), |s| s.trace_uuid.clone());
    let id = trace_id(&format!("{name} {uuid} {}", r.root.display()));
    let cpus = g.side.cpu_ids().iter().map(|c| c + 1).max().unwrap_or(1);
    let shift = i64::try_from(g.side.origin_ns - host_origin).map_err(ExportError::ClockShift)?;
    let (method, bound) = r.sidecar.as_ref().map_or(("unknown".to_string(), 0), |s| {
        (s.clock.method.clone(), s.clock.error_ns)
    });
    let clocks = "local global counter uptime perf mono mono_raw boot x86-tsc [tsc2nsec]";
    let version = format!(
        "ivtrace {} export: guest->host clock {method}, error <= {bound} ns",
        env!("CARGO_PKG_VERSION")
    );
    let options = vec![
        (opt::TRACECLOCK, cstr(clocks)),
        (opt::UNAME, cstr(&format!("Linux {name} unknown x86_64"))),
        (opt::VERSION, cstr(&version)),
        (opt::TRACEID, id.to_le_bytes().to_vec()),
        (opt::TIME_SHIFT, time_shift(host_id, cpus, shift)),
    ];
    let guest = guest_option(&name, id, cpus, &g.vcpus);
    let vcpus = g.vcpus.iter().map(|(v, t)| (*v, *t)).collect();
    let mut file =
        g.side
            .write(file, "tsc2nsec", options)
            .map_err(|source| ExportError::Write {
                path: out.join(file),
                source,
            })?;
    file.trace_id = id;
    let g = GuestFile {
        name,
        recording: r.root.clone(),
        file,
        time_shift_ns: shift,
        clock_method: method,
        clock_error_ns: bound,
        vcpus,
    };
    Ok((g, guest))
}

/// Writes every file: the guests' first (their ids go into the host's
/// GUEST options), then the host's.
fn finish(
    pass: Pass,
    names: &[String],
    out: &OutDir,
    read_errors: Vec<String>,
) -> Result<Exported> {
    let Pass {
        recs, guests, host, ..
    } = pass;
    let roots: Vec<String> = recs.iter().map(|r| r.root.display().to_string()).collect();
    let host_id = trace_id(&format!("host {}", roots.join(" ")));
    let version = format!("ivtrace {} export", env!("CARGO_PKG_VERSION"));
    let mut host_options = vec![
        (
            opt::TRACECLOCK,
            cstr("local global counter uptime perf [mono] mono_raw boot"),
        ),
        (
            opt::UNAME,
            cstr(&format!("Linux {} unknown x86_64", host_name(recs))),
        ),
        (opt::VERSION, cstr(&version)),
        (opt::TRACEID, host_id.to_le_bytes().to_vec()),
    ];
    let mut files = Vec::new();
    let mut warnings = Vec::new();
    for ((r, g), file) in recs.iter().zip(guests).zip(names) {
        let (f, option) = write_guest(r, g, (out, file), host_id, host_origin_of(recs))?;
        host_options.push((opt::GUEST, option));
        if f.vcpus.is_empty() {
            warnings.push(format!(
                "{}: no vCPU thread known (no VM view, no `CPU n/...` host threads): the host \
                 file maps none of its vCPUs (record with serve --host-events and QEMU's \
                 -name NAME,debug-threads=on)",
                f.name
            ));
        }
        files.push(f);
    }
    if recs.iter().all(|r| r.trace(TraceKind::Host).is_none()) {
        warnings.push(
            "no host trace in the recordings: host.dat names the guests but holds no host event \
             (record with `ivtrace serve --host-events` or `ivtrace record --host-events`)"
                .into(),
        );
    }
    let mut host_summary = host
        .write(HOST_FILE, "mono", host_options)
        .map_err(|source| ExportError::Write {
            path: out.join(HOST_FILE),
            source,
        })?;
    host_summary.trace_id = host_id;
    Ok(Exported {
        host: host_summary,
        guests: files,
        read_errors,
        warnings,
    })
}

fn host_origin_of(recs: &[Recording]) -> i128 {
    recs.iter()
        .find_map(|r| r.trace(TraceKind::Host))
        .map_or(0, |t| t.clock().origin_ns())
}

fn host_name(recs: &[Recording]) -> String {
    let name = recs
        .iter()
        .find_map(|r| r.trace(TraceKind::Host))
        .and_then(|t| t.meta.env_str("hostname"))
        .unwrap_or("host");
    ident(name)
}
