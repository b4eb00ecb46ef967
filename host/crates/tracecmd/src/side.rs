//! One trace-cmd file being written (the host's, or one guest's): its
//! events' formats, each CPU's pages, the threads it knows (for the
//! writing thread of each record and the file's command lines), and what
//! it carried and lost.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::io;
use std::path::PathBuf;

use ivtrace_ctf::read::Record;
use ivtrace_ctf::sidecar::TracefsFormats;
use ivtrace_ctf::OutDir;
use serde::Serialize;

use crate::dat::{self, CpuData, Meta};
use crate::formats::builtin;
use crate::pages::{CpuPages, CpuStats};
use crate::target::{Catalog, Origin, Pid, Target};

/// A thread name as the kernel keeps it.
pub type Comm = [u8; 16];

fn comm(text: &[u8]) -> Comm {
    let mut c = [0u8; 16];
    let n = text.len().min(15);
    c[..n].copy_from_slice(&text[..n]);
    c
}

/// What one file holds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FileSummary {
    pub path: PathBuf,
    pub trace_id: u64,
    /// Events written, by `system:event`.
    pub events: BTreeMap<String, u64>,
    pub cpus: Vec<CpuStats>,
    /// Events lost, in all (as the pages' missed events).
    pub lost: u64,
    /// Events in the kernel's own format, and in generated ones.
    pub kernel_formats: usize,
    pub generated_formats: usize,
    /// Timestamps before the file's time 0 (written at 0).
    pub before_origin: u64,
    /// Records the host traces of two guests both had (written once).
    pub duplicates: u64,
    /// What each event class of the recording became: `trace:class` ->
    /// `system:event` (trace: kernel, user, vm, host).
    pub classes: BTreeMap<String, String>,
}

/// One file being written.
pub struct Side {
    dir: OutDir,
    pub catalog: Catalog,
    cpus: BTreeMap<u32, CpuPages>,
    names: HashMap<i32, Comm>,
    /// The thread running on each CPU, and the CPU each runs on.
    current: HashMap<u32, i32>,
    running: HashMap<i32, u32>,
    /// Nanoseconds from the epoch of the file's time 0.
    pub origin_ns: i128,
    /// Leave out records written already at the same time on the same CPU
    /// (the host file: every guest's host trace has the switches between
    /// vCPU threads of two guests).
    dedupe: Option<HashMap<u32, (u64, HashSet<u64>)>>,
    pub summary: FileSummary,
}

impl Side {
    /// A file whose time 0 is `origin_ns`; its pages are kept in `dir`.
    pub fn new(dir: &OutDir, origin_ns: i128, dedupe: bool) -> Side {
        Side {
            dir: dir.clone(),
            catalog: Catalog::default(),
            cpus: BTreeMap::new(),
            names: HashMap::new(),
            current: HashMap::new(),
            running: HashMap::new(),
            origin_ns,
            dedupe: dedupe.then(HashMap::new),
            summary: FileSummary::default(),
        }
    }

    fn cpu(&mut self, cpu: u32) -> io::Result<&mut CpuPages> {
        if !self.cpus.contains_key(&cpu) {
            self.cpus.insert(cpu, CpuPages::new(&self.dir, cpu)?);
        }
        Ok(self.cpus.get_mut(&cpu).expect("just inserted"))
    }

    /// Thread `tid` runs on `cpu` (what the first context switch of a CPU
    /// says ran before it).
    pub fn set_current(&mut self, cpu: u32, tid: i32) {
        if let Some(old) = self.current.insert(cpu, tid) {
            if self.running.get(&old) == Some(&cpu) {
                self.running.remove(&old);
            }
        }
        self.running.insert(tid, cpu);
    }

    /// A thread named `name` (what a state dump says).
    pub fn name(&mut self, tid: i32, name: &[u8]) {
        self.names.insert(tid, comm(name));
    }

    /// Where a record goes and who wrote it: (CPU, pid).
    fn placement(&self, r: &Record, t: &Target) -> (u32, i32) {
        let cpu = r.cpu();
        match t.pid {
            Pid::Current => (cpu, self.current.get(&cpu).copied().unwrap_or(0)),
            Pid::Field(i) => (cpu, r.int(i).unwrap_or(0) as i32),
            Pid::Context => (cpu, r.tid.unwrap_or(0)),
            Pid::Owner => {
                let tid = match r.packet.owner_tid {
                    0 => r.packet.owner_pid,
                    t => t,
                } as i32;
                // The thread writes the event: it runs on some CPU now.
                (self.running.get(&tid).copied().unwrap_or(cpu), tid)
            }
            Pid::Zero => (cpu, 0),
        }
    }

    /// True if the same record was written at `ts` on `cpu` already.
    fn duplicate(&mut self, cpu: u32, ts: u64, rec: &[u8]) -> bool {
        let Some(seen) = self.dedupe.as_mut() else {
            return false;
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        rec.hash(&mut h);
        let at = seen.entry(cpu).or_insert((ts, HashSet::new()));
        if at.0 != ts {
            *at = (ts, HashSet::new());
        }
        !at.1.insert(h.finish())
    }

    /// Writes event `r` (at `ns` from the epoch) as `t`.
    pub fn event(&mut self, ns: i128, r: &Record, t: &Target) -> io::Result<()> {
        let (cpu, pid) = self.placement(r, t);
        let names = &self.names;
        let rec = t.encode(r, pid, &|tid| names.get(&tid).copied());
        for &(c, tid) in &t.names {
            if let (Some(text), Some(tid)) = (r.text(c), r.int(tid)) {
                self.names.insert(tid as i32, comm(text));
            }
        }
        if let Some(next) = t.switch_in.and_then(|i| r.int(i)) {
            self.set_current(cpu, next as i32);
        }
        let rel = ns - self.origin_ns;
        if rel < 0 {
            self.summary.before_origin += 1;
        }
        let ts = rel.clamp(0, u64::MAX as i128) as u64;
        if self.duplicate(cpu, ts, &rec) {
            self.summary.duplicates += 1;
            return Ok(());
        }
        self.cpu(cpu)?.record(ts, &rec)?;
        match self.summary.events.get_mut(&t.key) {
            Some(n) => *n += 1,
            None => {
                self.summary.events.insert(t.key.clone(), 1);
            }
        }
        Ok(())
    }

    /// `n` events lost on `cpu` here.
    pub fn lost(&mut self, cpu: u32, n: u64) -> io::Result<()> {
        self.cpu(cpu)?.lost(n);
        Ok(())
    }

    /// CPUs with a buffer so far.
    pub fn cpu_ids(&self) -> Vec<u32> {
        self.cpus.keys().copied().collect()
    }

    /// `saved_cmdlines`: every thread's last name.
    fn cmdlines(&self) -> String {
        let mut tids: Vec<&i32> = self.names.keys().filter(|&&t| t > 0).collect();
        tids.sort();
        let mut s = String::new();
        for tid in tids {
            let c = &self.names[tid];
            let n = c.iter().position(|&b| b == 0).unwrap_or(16);
            let name: String = String::from_utf8_lossy(&c[..n])
                .chars()
                .map(|ch| if ch.is_control() { '_' } else { ch })
                .collect();
            let _ = writeln!(s, "{tid} {name}");
        }
        s
    }

    /// Writes the file `name` of the output directory (through a hidden
    /// temporary name, renamed at the end) with `options` after the ones
    /// every file has.
    pub fn write(
        mut self,
        name: &str,
        clock: &str,
        mut options: Vec<(u16, Vec<u8>)>,
    ) -> io::Result<FileSummary> {
        let mut cpus: Vec<CpuData> = Vec::new();
        let mut stats = Vec::new();
        for (_, c) in std::mem::take(&mut self.cpus) {
            let (data, s) = c.finish()?;
            cpus.push(data);
            stats.push(s);
        }
        let ncpu = stats.iter().map(|s| s.cpu + 1).max().unwrap_or(1);
        options.push((dat::opt::CPUCOUNT, ncpu.to_le_bytes().to_vec()));
        for s in &stats {
            options.push((dat::opt::CPUSTAT, cpustat(s).into_bytes()));
        }
        let (ftrace_formats, systems) = self.catalog.formats();
        (self.summary.kernel_formats, self.summary.generated_formats) = self.catalog.counts();
        let meta = Meta {
            header_page: builtin().get("header_page").unwrap_or_default().to_string(),
            header_event: builtin()
                .get("header_event")
                .unwrap_or_default()
                .to_string(),
            ftrace_formats,
            systems,
            cmdlines: self.cmdlines(),
            clock: clock.to_string(),
            options,
        };
        let tmp = format!(".{name}.tmp");
        if self.dir.kind(&tmp)?.is_some() {
            self.dir.remove_file(&tmp)?;
        }
        let mut file = self.dir.create_file(&tmp)?;
        let written = dat::write(&mut file, &meta, &mut cpus).and_then(|()| file.sync_data());
        if let Err(e) = written {
            let _ = self.dir.remove_file(&tmp);
            return Err(e);
        }
        self.dir.rename(&tmp, name)?;
        self.summary.path = self.dir.join(name);
        self.summary.lost = stats.iter().fold(0u64, |a, s| a.saturating_add(s.lost));
        self.summary.cpus = stats;
        Ok(self.summary)
    }
}

/// A CPU's `per_cpu/cpuN/stats`, as trace-cmd keeps it (CPUSTAT): what
/// the buffer held and lost.
fn cpustat(s: &CpuStats) -> String {
    let secs = |ns: u64| format!("{}.{:06}", ns / 1_000_000_000, ns % 1_000_000_000 / 1000);
    format!(
        "CPU: {}\nentries: 0\noverrun: 0\ncommit overrun: 0\nbytes: {}\noldest event ts: {}\n\
         now ts: {}\ndropped events: {}\nread events: {}\n",
        s.cpu,
        s.pages * dat::PAGE_SIZE as u64,
        secs(s.first_ts.unwrap_or(0)),
        secs(s.last_ts),
        s.lost,
        s.events
    )
}

/// The recorded formats a trace of `origin` was decoded with.
pub fn recorded(
    origin: Origin,
    formats: &ivtrace_ctf::sidecar::RecordedFormats,
) -> &TracefsFormats {
    static NONE: std::sync::OnceLock<TracefsFormats> = std::sync::OnceLock::new();
    let f = match origin {
        Origin::Host => formats.host.as_ref(),
        Origin::Kernel => formats.guest.as_ref(),
        _ => None,
    };
    f.unwrap_or_else(|| NONE.get_or_init(TracefsFormats::default))
}
