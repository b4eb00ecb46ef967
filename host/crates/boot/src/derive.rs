//! The boot analysis of a finished recording: reads the kernel trace's
//! ftrace streams back (ivtrace-ctf's reader, every stream merged in time
//! order), finds the boot's timeline (pass 1, [`crate::scan`]), pairs
//! function_graph's entries and exits into the profile (pass 2,
//! [`crate::profile`]), and writes both as derived streams of the kernel
//! trace ([`crate::stream`]). With [`ProfileMode::Instead`] pass 2 also
//! rewrites each ftrace stream without the graph's raw events (everything
//! else, losses included, as it was): the profile stands in for them.
//!
//! It runs when a recording ends (record and serve), after the guest traces
//! are written, and again from `ivtrace boot --derive`. Memory stays
//! bounded by what the boot holds (phases, initcalls, open calls, profile
//! rows), never by the number of events.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use ivtrace_ctf::ftrace::KALLSYMS_FILE;
use ivtrace_ctf::outdir::OutDir;
use ivtrace_ctf::read::{stream_class_of, stream_files, Item, Merge, StreamReader, Trace};
use ivtrace_region::abi::IVT_STREAM_FTRACE;
use ivtrace_region::kallsyms::Symbols;
use ivtrace_tracefs::ftrace_relay::out::StreamOut;

use crate::events::{Classifier, GRAPH_ENTRY, GRAPH_EXIT, INITCALL_LEVEL, INITCALL_START};
use crate::model::{Boot, Pairing, Profile};
use crate::profile::Profiler;
use crate::scan::Scan;
use crate::stream::{self, Written};

/// What becomes of function_graph's raw events once profiled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProfileMode {
    /// The profile beside the raw events.
    #[default]
    Beside,
    /// The profile instead of them: the raw events leave the trace.
    Instead,
    /// No profile.
    Off,
}

/// How to derive.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub profile: ProfileMode,
    /// The program whose exec starts the workload (basename), besides a
    /// trace_marker line starting with `ivtrace-boot`.
    pub workload: Option<String>,
}

/// What the derivation did (the sidecar's `boot`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Derived {
    pub phases: u64,
    pub initcalls: u64,
    pub marks: u64,
    pub profile_mode: ProfileMode,
    pub profile_rows: u64,
    pub pairing: Pairing,
    /// Kernel symbols used (`DIR/kallsyms`).
    pub symbols: u64,
    /// Events of the ftrace streams read, function_graph's among them.
    pub ftrace_events: u64,
    pub graph_events: u64,
    /// Bytes of the ftrace streams before, and after the raw graph events
    /// left them (instead mode; else the same).
    pub ftrace_bytes: u64,
    pub ftrace_bytes_after: u64,
    pub written: Written,
    pub notes: Vec<String>,
    /// Streams that could not be read to their end, and why.
    pub read_errors: Vec<String>,
    pub seconds: f64,
}

/// The kallsyms file at most this long (the relay's text is bounded the same).
const KALLSYMS_MAX: u64 = 64 << 20;

/// The kernel symbols kept with the recording (`DIR/kallsyms`), if any.
pub fn recorded_symbols(root: &Path) -> io::Result<Symbols> {
    let f = match std::fs::File::open(root.join(KALLSYMS_FILE)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Symbols::default()),
        Err(e) => return Err(e),
    };
    let mut text = Vec::new();
    f.take(KALLSYMS_MAX + 1).read_to_end(&mut text)?;
    if text.len() as u64 > KALLSYMS_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: more than {KALLSYMS_MAX} bytes",
                root.join(KALLSYMS_FILE).display()
            ),
        ));
    }
    Ok(Symbols::parse(&text))
}

/// The ftrace streams of the kernel trace.
fn ftrace_streams(trace: &Trace) -> io::Result<Vec<StreamReader>> {
    let mut v = Vec::new();
    for s in trace.streams()? {
        if stream_class_of(s.path())? == Some(IVT_STREAM_FTRACE) {
            v.push(s);
        }
    }
    Ok(v)
}

/// Every ftrace stream merged in time order, each tagged with its index
/// in the paths returned.
fn merged(trace: &Trace) -> io::Result<(Merge, Vec<PathBuf>)> {
    let clock = Arc::new(trace.clock().clone());
    let mut merge = Merge::default();
    let mut paths = Vec::new();
    for (i, s) in ftrace_streams(trace)?.into_iter().enumerate() {
        paths.push(s.path().to_path_buf());
        merge.add(s, Arc::clone(&clock), i);
    }
    Ok((merge, paths))
}

/// Pass 1.
fn scan(trace: &Trace, symbols: &Symbols, opts: &Options, d: &mut Derived) -> io::Result<Boot> {
    let classify = Classifier::new(&trace.meta.classes, IVT_STREAM_FTRACE);
    let (mut merge, _) = merged(trace)?;
    let reset = crate::model::reset_value(&trace.meta);
    let mut scan = Scan::new(symbols, opts.workload.clone(), reset);
    for m in &mut merge {
        if let Item::Event(r) = &m.item {
            d.ftrace_events += 1;
            if let Some(e) = classify.event(r) {
                scan.event(&e);
            }
        }
    }
    d.read_errors.append(&mut merge.errors);
    Ok(scan.finish())
}

/// One ftrace stream being rewritten without the graph's raw events.
struct Rewrite {
    out: StreamOut,
    name: String,
    cpu: u32,
    lost: u64,
}

impl Rewrite {
    fn create(dir: &OutDir, path: &Path) -> io::Result<Rewrite> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let chan = name
            .strip_prefix("ftrace_chan")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Ok(Rewrite {
            out: StreamOut::create(dir, &format!(".{name}.boot"), chan)?,
            name,
            cpu: 0,
            lost: 0,
        })
    }

    fn item(&mut self, item: &Item, graph: &[u32]) -> io::Result<()> {
        match item {
            Item::Event(r) if graph.contains(&r.class.id) => Ok(()),
            Item::Event(r) => {
                self.cpu = r.cpu();
                self.out.event(r.cpu(), r.class.id, r.ts, &r.payload)
            }
            Item::Discarded(d) => {
                self.lost = self.lost.saturating_add(d.count);
                self.out.set_discarded(self.lost);
                Ok(())
            }
        }
    }

    fn finish(self, dir: &OutDir) -> io::Result<()> {
        self.out.finish(self.cpu, self.lost)?;
        dir.rename(&format!(".{}.boot", self.name), &self.name)
    }
}

/// Pass 2: the profile; with `rewrite`, the ftrace streams without the
/// graph's raw events.
fn profile(
    trace: &Trace,
    boot: &Boot,
    symbols: &Symbols,
    rewrite: Option<&OutDir>,
    d: &mut Derived,
) -> io::Result<Profile> {
    let classify = Classifier::new(&trace.meta.classes, IVT_STREAM_FTRACE);
    let graph: Vec<u32> = trace
        .meta
        .classes
        .iter()
        .filter(|c| {
            c.stream == IVT_STREAM_FTRACE && (c.name == GRAPH_ENTRY || c.name == GRAPH_EXIT)
        })
        .map(|c| c.id)
        .collect();
    let (mut merge, paths) = merged(trace)?;
    let mut outs = match rewrite {
        Some(dir) => paths
            .iter()
            .map(|p| Rewrite::create(dir, p))
            .collect::<io::Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    let mut p = Profiler::new(&boot.phases);
    for m in &mut merge {
        if let Some(out) = outs.get_mut(m.source) {
            out.item(&m.item, &graph)?;
        }
        if let Item::Event(r) = &m.item {
            if let Some(e) = classify.event(r).filter(|e| e.is_graph()) {
                d.graph_events += 1;
                p.event(&e);
            }
        }
    }
    d.read_errors.append(&mut merge.errors);
    if let Some(dir) = rewrite {
        for o in outs {
            o.finish(dir)?;
        }
    }
    let threads = boot
        .cpu_time
        .iter()
        .map(|t| (t.tid, t.comm.clone()))
        .collect();
    Ok(p.finish(symbols, &threads))
}

/// Bytes of the ftrace stream files in `dir`.
fn ftrace_bytes(dir: &Path) -> io::Result<u64> {
    let mut n = 0u64;
    for p in stream_files(dir)? {
        if stream_class_of(&p)? == Some(IVT_STREAM_FTRACE) {
            n = n.saturating_add(std::fs::metadata(&p)?.len());
        }
    }
    Ok(n)
}

/// Derives the boot's streams of the recording in `root` (its kernel trace
/// must be finished); None when its ftrace streams hold neither initcall
/// levels, initcalls nor function_graph events.
pub fn derive(root: &OutDir, opts: &Options) -> io::Result<Option<Derived>> {
    let started = Instant::now();
    let kernel_path = root.join("kernel");
    if !kernel_path.join("metadata").is_file() {
        return Ok(None);
    }
    let trace = Trace::open(&kernel_path)?;
    let has_boot = Classifier::knows(&trace.meta.classes, &[INITCALL_LEVEL, INITCALL_START]);
    let has_graph = Classifier::knows(&trace.meta.classes, &[GRAPH_ENTRY, GRAPH_EXIT]);
    if !has_boot && !has_graph {
        return Ok(None);
    }
    let kernel = root.open_dir("kernel")?;
    let symbols = recorded_symbols(root.path())?;
    let mut d = Derived {
        profile_mode: opts.profile,
        symbols: symbols.len() as u64,
        ftrace_bytes: ftrace_bytes(&kernel_path)?,
        ..Derived::default()
    };
    let mut boot = scan(&trace, &symbols, opts, &mut d)?;
    if symbols.is_empty() {
        boot.notes.push(format!(
            "no kernel symbols ({KALLSYMS_FILE}): functions and initcalls are named by address"
        ));
    }
    let profile = match (has_graph, opts.profile) {
        (false, _) | (_, ProfileMode::Off) => None,
        (true, mode) => {
            let rewrite = (mode == ProfileMode::Instead).then_some(&kernel);
            Some(profile(&trace, &boot, &symbols, rewrite, &mut d)?)
        }
    };
    d.written = stream::write(&kernel, &boot, profile.as_ref())?;
    d.ftrace_bytes_after = ftrace_bytes(&kernel_path)?;
    d.phases = boot.phases.len() as u64;
    d.initcalls = boot.initcalls.len() as u64;
    d.marks = boot.marks.len() as u64;
    d.notes = boot.notes.clone();
    if let Some(p) = &profile {
        d.profile_rows = p.rows.len() as u64;
        d.pairing = p.pairing;
    }
    d.seconds = started.elapsed().as_secs_f64();
    Ok(Some(d))
}

/// Derives the boot's streams of a finished recording in `root`: the
/// sidecar's `boot` section, None when its kernel trace holds no boot. A
/// failure is reported and the recording stands without them.
pub fn at_end(root: &OutDir, opts: &Options, log: impl Fn(&str)) -> Option<serde_json::Value> {
    match derive(root, opts) {
        Ok(Some(d)) => {
            log(&describe(&d));
            serde_json::to_value(&d).ok()
        }
        Ok(None) => None,
        Err(e) => {
            log(&format!(
                "the boot analysis failed: {e} (the trace is complete; `ivtrace boot --derive DIR` \
                 tries again)"
            ));
            None
        }
    }
}

/// One line about a derivation.
pub fn describe(d: &Derived) -> String {
    let mut s = format!(
        "boot: {} phases, {} initcalls derived into kernel/boot ({} bytes)",
        d.phases, d.initcalls, d.written.boot_bytes
    );
    if d.graph_events > 0 {
        s.push_str(&format!(
            "; function profile: {} graph events -> {} rows, {} bytes (ftrace streams {} bytes{})",
            d.graph_events,
            d.profile_rows,
            d.written.profile_bytes,
            d.ftrace_bytes,
            if d.ftrace_bytes_after != d.ftrace_bytes {
                format!(", {} without the raw graph events", d.ftrace_bytes_after)
            } else {
                String::new()
            }
        ));
    }
    s
}
