//! `ivtrace boot DIR`: what the boot's derived streams say, in numbers a
//! person reads: per phase and level its start, duration and share of the
//! boot; the longest initcalls per level; with a function profile, the top
//! functions per phase by self and total time; what ran on each vCPU; and,
//! when host events were recorded, where the host preempted the vCPUs.
//!
//! Times go through the kernel trace's clock (its frequency), never an
//! assumed one: milliseconds from the clock's value 0, the vCPU's reset.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use ivtrace_ctf::read::{Clock, Trace};
use ivtrace_vmview::classes::read_interval;
use ivtrace_vmview::model::State;

use crate::model::{Boot, Profile, Stat};

/// One phase (stage, or initcall sub-level).
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRow {
    pub name: String,
    pub level: String,
    pub stage: String,
    pub start_ms: f64,
    pub duration_ms: f64,
    /// Of the boot (clock 0 to its end); phases after the boot: 0.
    pub share_pct: f64,
    pub initcalls: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct InitcallRow {
    pub name: String,
    pub func: String,
    pub level: String,
    pub start_ms: f64,
    /// None: it had not returned when the trace ended.
    pub duration_ms: Option<f64>,
    pub ret: Option<i32>,
    pub cpu: u32,
    pub tid: i32,
}

#[derive(Debug, Clone, Serialize)]
pub struct FuncRow {
    pub name: String,
    pub func: String,
    pub calls: u64,
    pub total_ms: f64,
    pub self_ms: f64,
    pub min_us: f64,
    pub max_us: f64,
}

/// The top functions of one phase (all threads summed).
#[derive(Debug, Clone, Serialize)]
pub struct PhaseFunctions {
    pub phase: String,
    pub by_self: Vec<FuncRow>,
    pub by_total: Vec<FuncRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThreadRow {
    pub tid: i32,
    pub comm: String,
    pub ms: f64,
    pub pct: f64,
}

/// What ran on one vCPU during the boot.
#[derive(Debug, Clone, Serialize)]
pub struct CpuRow {
    pub cpu: u32,
    /// Of the time the trace saw it (its first context switch to the boot's end).
    pub seen_ms: f64,
    pub idle_pct: f64,
    pub threads: Vec<ThreadRow>,
}

/// Where the host held one vCPU off its CPU during the boot (the VM view).
#[derive(Debug, Clone, Serialize)]
pub struct PreemptRow {
    pub vcpu: u32,
    pub intervals: u64,
    pub preempted_ms: f64,
    pub longest_ms: f64,
    /// The phase of the longest, and the host tasks that took the CPU most.
    pub longest_in: String,
    pub by_phase_ms: BTreeMap<String, f64>,
    pub taken_by: Vec<(String, f64)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MarkRow {
    pub ms: f64,
    pub kind: String,
    pub name: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub dir: String,
    pub clock_hz: u64,
    /// From the vCPU's reset to the boot's end, and where the trace begins.
    pub boot_ms: f64,
    pub traced_from_ms: f64,
    pub trace_end_ms: f64,
    pub phases: Vec<PhaseRow>,
    pub stages: Vec<PhaseRow>,
    pub initcalls_by_level: BTreeMap<String, Vec<InitcallRow>>,
    pub functions: Vec<PhaseFunctions>,
    pub profile: Option<crate::model::Pairing>,
    pub cpus: Vec<CpuRow>,
    /// None: no VM view (no host events recorded).
    pub preempted: Option<Vec<PreemptRow>>,
    /// Where the VM view begins (the host's recording starts when the
    /// guest's module formats its region: earlier phases have no host view).
    pub host_view_from_ms: Option<f64>,
    pub marks: Vec<MarkRow>,
    pub notes: Vec<String>,
}

/// Clock value `v` as milliseconds since the vCPU's reset (`boot.reset`).
pub fn since_reset(clock: &Clock, boot: &Boot, v: u64) -> f64 {
    ms(clock, v.saturating_sub(boot.reset))
}

/// Cycles of `clock` as milliseconds.
pub fn ms(clock: &Clock, cycles: u64) -> f64 {
    clock.local_ns(cycles) as f64 / 1e6
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

fn phase_rows(b: &Boot, clock: &Clock) -> (Vec<PhaseRow>, Vec<PhaseRow>) {
    let row = |name: &str, level: &str, stage: &str, start: u64, end: u64, n: u64| PhaseRow {
        name: name.into(),
        level: level.into(),
        stage: stage.into(),
        start_ms: since_reset(clock, b, start),
        duration_ms: ms(clock, end.saturating_sub(start)),
        share_pct: pct(
            end.min(b.end).saturating_sub(start.min(b.end)),
            b.end.saturating_sub(b.reset),
        ),
        initcalls: n,
    };
    let phases = b
        .phases
        .iter()
        .map(|p| {
            let n = b.initcalls.iter().filter(|c| c.level == p.name).count() as u64;
            row(&p.name, &p.level, &p.stage, p.start, p.end, n)
        })
        .collect();
    let mut stages = Vec::new();
    for stage in crate::model::STAGES {
        let mut ps = b.phases.iter().filter(|p| p.stage == stage);
        if let Some(first) = ps.next() {
            let end = ps.next_back().unwrap_or(first).end;
            stages.push(row(stage, "", stage, first.start, end, phases_of(b, stage)));
        }
    }
    (phases, stages)
}

fn phases_of(b: &Boot, stage: &str) -> u64 {
    let names: Vec<&str> = b
        .phases
        .iter()
        .filter(|p| p.stage == stage)
        .map(|p| p.name.as_str())
        .collect();
    b.initcalls
        .iter()
        .filter(|c| names.contains(&c.level.as_str()))
        .count() as u64
}

fn initcalls_by_level(b: &Boot, clock: &Clock, top: usize) -> BTreeMap<String, Vec<InitcallRow>> {
    let mut by: BTreeMap<String, Vec<InitcallRow>> = BTreeMap::new();
    for c in &b.initcalls {
        by.entry(c.level.clone()).or_default().push(InitcallRow {
            name: c.name.clone(),
            func: format!("{:#x}", c.func),
            level: c.level.clone(),
            start_ms: since_reset(clock, b, c.start),
            duration_ms: c.duration().map(|d| ms(clock, d)),
            ret: c.ret,
            cpu: c.cpu,
            tid: c.tid,
        });
    }
    for v in by.values_mut() {
        v.sort_by(|a, b| {
            let (x, y) = (
                a.duration_ms.unwrap_or(f64::MAX),
                b.duration_ms.unwrap_or(f64::MAX),
            );
            y.total_cmp(&x)
        });
        v.truncate(top);
    }
    by
}

fn func_rows(p: &Profile, clock: &Clock, phase: &str) -> Vec<FuncRow> {
    let mut per: BTreeMap<u64, Stat> = BTreeMap::new();
    for (k, s) in p.rows.iter().filter(|(k, _)| k.phase == phase) {
        per.entry(k.func).and_modify(|x| x.add(s)).or_insert(*s);
    }
    per.into_iter()
        .map(|(func, s)| FuncRow {
            name: p
                .names
                .get(&func)
                .cloned()
                .unwrap_or_else(|| format!("{func:#x}")),
            func: format!("{func:#x}"),
            calls: s.count,
            total_ms: ms(clock, s.total),
            self_ms: ms(clock, s.self_),
            min_us: ms(clock, s.min) * 1e3,
            max_us: ms(clock, s.max) * 1e3,
        })
        .collect()
}

fn functions(b: &Boot, p: &Profile, clock: &Clock, top: usize) -> Vec<PhaseFunctions> {
    let mut out = Vec::new();
    for ph in &b.phases {
        let rows = func_rows(p, clock, &ph.name);
        if rows.is_empty() {
            continue;
        }
        let mut by_self = rows.clone();
        by_self.sort_by(|a, b| b.self_ms.total_cmp(&a.self_ms).then(a.name.cmp(&b.name)));
        by_self.truncate(top);
        let mut by_total = rows;
        by_total.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.name.cmp(&b.name)));
        by_total.truncate(top);
        out.push(PhaseFunctions {
            phase: ph.name.clone(),
            by_self,
            by_total,
        });
    }
    out
}

fn cpus(b: &Boot, clock: &Clock, top: usize) -> Vec<CpuRow> {
    let mut by: BTreeMap<u32, Vec<&crate::model::CpuTime>> = BTreeMap::new();
    for t in &b.cpu_time {
        by.entry(t.cpu).or_default().push(t);
    }
    by.into_iter()
        .map(|(cpu, ts)| {
            let seen: u64 = ts.iter().map(|t| t.cycles).sum();
            let idle: u64 = ts.iter().filter(|t| t.tid == 0).map(|t| t.cycles).sum();
            let threads = ts
                .iter()
                .filter(|t| t.tid != 0)
                .take(top)
                .map(|t| ThreadRow {
                    tid: t.tid,
                    comm: t.comm.clone(),
                    ms: ms(clock, t.cycles),
                    pct: pct(t.cycles, seen),
                })
                .collect();
            CpuRow {
                cpu,
                seen_ms: ms(clock, seen),
                idle_pct: pct(idle, seen),
                threads,
            }
        })
        .collect()
}

fn phase_name_at(b: &Boot, ts: u64) -> String {
    let i = b
        .phases
        .partition_point(|p| p.start <= ts)
        .saturating_sub(1);
    b.phases.get(i).map_or(String::new(), |p| p.name.clone())
}

/// One interval the host held a vCPU off its CPU (the VM view's
/// `vcpu_preempted`): when it began (the guest clock's cycles, as the
/// kernel trace's), for how long (ns, as the VM view measures it), and the
/// host task that took the CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preempted {
    pub vcpu: u32,
    pub start: u64,
    pub ns: u64,
    pub taken_by: Option<String>,
}

/// What the VM view saw of the boot: from when (its first event: the
/// host's recording starts once the guest's module formatted its region),
/// and the preempted intervals that began during the boot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostView {
    pub from: u64,
    pub preempted: Vec<Preempted>,
}

/// The VM view in `vm` (DIR/vm) during the boot.
pub fn host_view(vm: &Path, b: &Boot) -> std::io::Result<HostView> {
    let trace = Trace::open(vm)?;
    let mut out = Vec::new();
    let mut from = u64::MAX;
    for mut s in trace.streams()? {
        while let Some(r) = s.next_record()? {
            from = from.min(r.ts);
            let Some((i, _)) = read_interval(&r, r.cpu(), 0) else {
                continue;
            };
            if i.state == State::Preempted && r.ts <= b.end {
                out.push(Preempted {
                    vcpu: i.vcpu,
                    start: r.ts,
                    ns: i.duration(),
                    taken_by: i.taken_by.as_ref().map(|t| comm_text(&t.comm)),
                });
            }
        }
    }
    out.sort_by_key(|p| (p.start, p.vcpu));
    Ok(HostView {
        from: if from == u64::MAX { b.end } else { from },
        preempted: out,
    })
}

/// Per vCPU: the preempted intervals summed.
fn preemption(intervals: &[Preempted], b: &Boot) -> Vec<PreemptRow> {
    let mut rows: BTreeMap<u32, PreemptRow> = BTreeMap::new();
    let mut taken: BTreeMap<(u32, String), u64> = BTreeMap::new();
    for p in intervals {
        let row = rows.entry(p.vcpu).or_insert_with(|| PreemptRow {
            vcpu: p.vcpu,
            intervals: 0,
            preempted_ms: 0.0,
            longest_ms: 0.0,
            longest_in: String::new(),
            by_phase_ms: BTreeMap::new(),
            taken_by: Vec::new(),
        });
        let (phase, ms) = (phase_name_at(b, p.start), p.ns as f64 / 1e6);
        row.intervals += 1;
        row.preempted_ms += ms;
        *row.by_phase_ms.entry(phase.clone()).or_default() += ms;
        if ms > row.longest_ms {
            row.longest_ms = ms;
            row.longest_in = phase;
        }
        if let Some(c) = &p.taken_by {
            *taken.entry((p.vcpu, c.clone())).or_default() += p.ns;
        }
    }
    for ((vcpu, comm), ns) in taken {
        if let Some(r) = rows.get_mut(&vcpu) {
            r.taken_by.push((comm, ns as f64 / 1e6));
        }
    }
    for r in rows.values_mut() {
        r.taken_by.sort_by(|a, b| b.1.total_cmp(&a.1));
        r.taken_by.truncate(3);
    }
    rows.into_values().collect()
}

/// A fixed 16-byte comm as text.
pub fn comm_text(c: &[u8; 16]) -> String {
    let end = c.iter().position(|&b| b == 0).unwrap_or(16);
    String::from_utf8_lossy(&c[..end]).into_owned()
}

/// The report of the recording in `root`, whose kernel trace (clock
/// `clock`) gave `boot` and `profile`; `host`: the VM view, None without
/// one; `top` rows per list.
pub fn build(
    root: &Path,
    clock: &Clock,
    boot: &Boot,
    profile: Option<&Profile>,
    host: Option<&HostView>,
    top: usize,
) -> Report {
    let (phases, stages) = phase_rows(boot, clock);
    Report {
        dir: root.display().to_string(),
        clock_hz: clock.freq,
        boot_ms: since_reset(clock, boot, boot.end),
        traced_from_ms: since_reset(clock, boot, boot.first),
        trace_end_ms: since_reset(clock, boot, boot.last),
        phases,
        stages,
        initcalls_by_level: initcalls_by_level(boot, clock, top),
        functions: profile.map_or_else(Vec::new, |p| functions(boot, p, clock, top)),
        profile: profile.map(|p| p.pairing),
        cpus: cpus(boot, clock, top),
        preempted: host.map(|h| preemption(&h.preempted, boot)),
        host_view_from_ms: host.map(|h| since_reset(clock, boot, h.from)),
        marks: boot
            .marks
            .iter()
            .map(|m| MarkRow {
                ms: since_reset(clock, boot, m.ts),
                kind: m.kind.clone(),
                name: m.name.clone(),
            })
            .collect(),
        notes: boot.notes.clone(),
    }
}

/// Guest text for a terminal: control characters become `?`.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn write_phases(t: &mut String, r: &Report) {
    let _ = writeln!(
        t,
        "  {:<22} {:>10} {:>11} {:>7} {:>9}",
        "phase", "start ms", "duration ms", "boot %", "initcalls"
    );
    for stage in &r.stages {
        let _ = writeln!(
            t,
            "  {:<22} {:>10.3} {:>11.3} {:>6.1}% {:>9}",
            stage.name, stage.start_ms, stage.duration_ms, stage.share_pct, stage.initcalls
        );
        for p in r
            .phases
            .iter()
            .filter(|p| p.stage == stage.name && p.name != p.stage)
        {
            let _ = writeln!(
                t,
                "    {:<20} {:>10.3} {:>11.3} {:>6.1}% {:>9}",
                p.name, p.start_ms, p.duration_ms, p.share_pct, p.initcalls
            );
        }
    }
}

fn write_initcalls(t: &mut String, r: &Report) {
    let _ = writeln!(t, "\nlongest initcalls per level (ms):");
    for p in &r.phases {
        let Some(v) = r.initcalls_by_level.get(&p.name) else {
            continue;
        };
        let list: Vec<String> = v
            .iter()
            .map(|c| match c.duration_ms {
                Some(d) => format!("{} {d:.3}", printable(&c.name)),
                None => format!("{} (did not return)", printable(&c.name)),
            })
            .collect();
        let _ = writeln!(t, "  {:<14} {}", p.name, list.join(", "));
    }
}

fn write_functions(t: &mut String, r: &Report) {
    let Some(pairing) = &r.profile else { return };
    let _ = writeln!(
        t,
        "\nfunction profile: {} calls ({} exits without entry, {} calls not closed)",
        pairing.calls, pairing.unmatched_exits, pairing.unclosed
    );
    for f in &r.functions {
        let fmt = |v: &[FuncRow], self_: bool| -> String {
            v.iter()
                .map(|x| {
                    let ms = if self_ { x.self_ms } else { x.total_ms };
                    format!("{} {ms:.3} ({}x)", printable(&x.name), x.calls)
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(t, "  {}:", f.phase);
        let _ = writeln!(t, "    by self ms:  {}", fmt(&f.by_self, true));
        let _ = writeln!(t, "    by total ms: {}", fmt(&f.by_total, false));
    }
}

fn write_cpus(t: &mut String, r: &Report) {
    if r.cpus.is_empty() {
        return;
    }
    let _ = writeln!(
        t,
        "\nwhat ran on each vCPU during the boot (from its first context switch):"
    );
    for c in &r.cpus {
        let threads: Vec<String> = c
            .threads
            .iter()
            .map(|x| format!("{}/{} {:.1}%", printable(&x.comm), x.tid, x.pct))
            .collect();
        let _ = writeln!(
            t,
            "  cpu{}: {:.3} ms seen, idle {:.1}%; {}",
            c.cpu,
            c.seen_ms,
            c.idle_pct,
            threads.join(", ")
        );
    }
}

fn write_preempted(t: &mut String, r: &Report) {
    match &r.preempted {
        None => {
            let _ = writeln!(
                t,
                "\nhost preemption: no VM view (record with --host-events to see it)"
            );
        }
        Some(rows) if rows.is_empty() => {
            let _ = writeln!(
                t,
                "\nhost preemption during the boot: none seen (host view from {:.3} ms)",
                r.host_view_from_ms.unwrap_or(0.0)
            );
        }
        Some(rows) => {
            let _ = writeln!(
                t,
                "\nhost preemption during the boot (VM view, from {:.3} ms: the host's recording \
                 starts when the guest's module formats its region):",
                r.host_view_from_ms.unwrap_or(0.0)
            );
            for p in rows {
                let by: Vec<String> = p
                    .taken_by
                    .iter()
                    .map(|(c, ms)| format!("{} {ms:.3} ms", printable(c)))
                    .collect();
                let _ = writeln!(
                    t,
                    "  vcpu{}: {:.3} ms in {} intervals, longest {:.3} ms (in {}); taken by {}",
                    p.vcpu,
                    p.preempted_ms,
                    p.intervals,
                    p.longest_ms,
                    p.longest_in,
                    if by.is_empty() {
                        "-".into()
                    } else {
                        by.join(", ")
                    }
                );
            }
        }
    }
}

/// The report as text.
pub fn text(r: &Report) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "boot of {} (clock {} Hz): {:.3} ms from the vCPU's reset to the boot's end; \
         traced from {:.3} ms",
        printable(&r.dir),
        r.clock_hz,
        r.boot_ms,
        r.traced_from_ms
    );
    write_phases(&mut t, r);
    let marks: Vec<String> = r
        .marks
        .iter()
        .map(|m| format!("{} {} @{:.3}", m.kind, printable(&m.name), m.ms))
        .collect();
    if !marks.is_empty() {
        let _ = writeln!(t, "\nmarks: {}", marks.join("; "));
    }
    write_initcalls(&mut t, r);
    write_functions(&mut t, r);
    write_cpus(&mut t, r);
    write_preempted(&mut t, r);
    for n in &r.notes {
        let _ = writeln!(t, "note: {}", printable(n));
    }
    t
}
