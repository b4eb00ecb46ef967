//! The boot chart: one self-contained SVG per recording, drawn from the
//! same values as the report. A time axis from the vCPU's reset to the
//! boot's end (a little past it: the workload's start shows); the stages
//! and the initcall levels as bands; per vCPU, its initcalls as bars (the
//! longest labelled) and, with a VM view, the moments the host held it
//! off its CPU (and, shaded, the part before the host's view began); the boot's marks (exec of /init, module loads, the
//! workload) as lines. Every label is guest text escaped for XML.

use std::collections::BTreeSet;
use std::fmt::Write;

use ivtrace_ctf::read::Clock;

use crate::model::Boot;
use crate::report::{ms, HostView};

pub const CHART_SVG: &str = "boot.svg";
pub const CHART_PNG: &str = "boot.png";

pub const WIDTH: u32 = 1600;
const LEFT: f64 = 120.0;
const RIGHT: f64 = 30.0;
const ROW: f64 = 26.0;
const CPU_ROW: f64 = 70.0;
/// Initcalls labelled on the chart, the longest first.
const LABELLED: usize = 14;

/// Fill colors: stages, then the levels (a sub-level a lighter tone).
const STAGE_COLORS: [(&str, &str); 4] = [
    ("untraced", "#bdbdbd"),
    ("kernel", "#3f6fb5"),
    ("userland", "#3c9a5f"),
    ("workload", "#d98b2b"),
];
const LEVEL_COLORS: [&str; 10] = [
    "#17becf", "#9467bd", "#8c564b", "#1f77b4", "#2ca02c", "#bcbd22", "#e377c2", "#ff7f0e",
    "#d62728", "#7f7f7f",
];
pub const PREEMPT_COLOR: &str = "#e41a1c";

/// XML text: `<`, `>`, `&`, quotes escaped, control characters dropped.
pub fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if c.is_control() => {}
            c => o.push(c),
        }
    }
    o
}

fn stage_color(stage: &str) -> &'static str {
    STAGE_COLORS
        .iter()
        .find(|(s, _)| *s == stage)
        .map_or("#999999", |(_, c)| c)
}

fn level_color(level: &str, sync: bool) -> String {
    let i = crate::levels::SUBLEVELS
        .iter()
        .filter(|(s, l)| s == l)
        .position(|(s, _)| *s == level);
    let base = i.map_or("#7f7f7f", |i| LEVEL_COLORS[i % LEVEL_COLORS.len()]);
    if sync {
        format!("{base}99")
    } else {
        base.to_string()
    }
}

/// Where time goes on the page: cycles `start..end` across `width` pixels.
struct Axis {
    clock: Clock,
    /// The vCPU's reset: the labels count from it.
    reset: u64,
    start: u64,
    end: u64,
    width: f64,
}

impl Axis {
    fn x(&self, cycles: u64) -> f64 {
        let span = self.end.saturating_sub(self.start).max(1) as f64;
        let v = cycles.clamp(self.start, self.end) - self.start;
        LEFT + self.width * v as f64 / span
    }

    fn w(&self, from: u64, to: u64) -> f64 {
        (self.x(to) - self.x(from)).max(0.0)
    }

    /// A round tick step in ms: about ten ticks.
    fn step_ms(&self) -> f64 {
        let span = ms(&self.clock, self.end.saturating_sub(self.start)).max(1e-3);
        let raw = span / 10.0;
        let p = 10f64.powf(raw.log10().floor());
        [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * p)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * p)
    }
}

fn text(t: &mut String, x: f64, y: f64, size: u32, anchor: &str, s: &str) {
    let _ = writeln!(
        t,
        r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}">{}</text>"#,
        xml(s)
    );
}

fn rect(t: &mut String, x: f64, y: f64, w: f64, h: f64, fill: &str, title: &str) {
    let _ = writeln!(
        t,
        r#"<rect x="{x:.2}" y="{y:.1}" width="{:.2}" height="{h:.1}" fill="{fill}"><title>{}</title></rect>"#,
        w.max(0.6),
        xml(title)
    );
}

fn axis(t: &mut String, a: &Axis, y: f64, bottom: f64) {
    let step = a.step_ms();
    let since_reset = |v: u64| ms(&a.clock, v.saturating_sub(a.reset));
    let (from, to) = (since_reset(a.start), since_reset(a.end));
    let mut v = (from / step).ceil() * step;
    while v <= to + 1e-9 {
        let x = LEFT + a.width * (v - from) / (to - from).max(1e-9);
        let _ = writeln!(
            t,
            r##"<line x1="{x:.1}" y1="{y:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#dddddd"/>"##
        );
        let label = if step >= 1000.0 {
            format!("{:.0} s", v / 1000.0)
        } else if step >= 1.0 {
            format!("{v:.0} ms")
        } else {
            format!("{v:.3} ms")
        };
        text(t, x, y - 4.0, 11, "middle", &label);
        v += step;
    }
}

/// The whole boot at a glance (the stages from the vCPU's reset), and the
/// part the main panel shows.
fn overview(t: &mut String, b: &Boot, main: &Axis, y: f64) {
    let a = Axis {
        clock: main.clock.clone(),
        reset: main.reset,
        start: main.reset,
        end: main.end,
        width: main.width,
    };
    text(t, 8.0, y + 11.0, 11, "start", "whole boot");
    for p in &b.phases {
        let title = format!(
            "{} ({}): {:.3} ms",
            p.name,
            p.stage,
            ms(&a.clock, p.duration())
        );
        rect(
            t,
            a.x(p.start),
            y,
            a.w(p.start, p.end),
            14.0,
            stage_color(&p.stage),
            &title,
        );
    }
    let (x0, x1) = (a.x(main.start), a.x(main.end));
    let _ = writeln!(
        t,
        r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="18" fill="none" stroke="#000000" stroke-width="1.5"/>"##,
        y - 2.0,
        (x1 - x0).max(1.0)
    );
    let label = format!(
        "{:.0} ms",
        ms(&a.clock, main.end.saturating_sub(main.reset))
    );
    match x0 > LEFT + 6.0 * label.len() as f64 {
        true => text(
            t,
            x0 - 4.0,
            y + 11.0,
            10,
            "end",
            &format!("traced part, to {label}"),
        ),
        false => text(t, x1 + 4.0, y + 11.0, 10, "start", &label),
    }
}

fn bands(t: &mut String, a: &Axis, b: &Boot, y: f64) {
    text(t, 8.0, y + 17.0, 12, "start", "stage");
    text(t, 8.0, y + ROW + 17.0, 12, "start", "level");
    for p in &b.phases {
        let (x, w) = (a.x(p.start), a.w(p.start, p.end));
        let title = format!(
            "{} ({}): {:.3} ms",
            p.name,
            p.stage,
            ms(&a.clock, p.duration())
        );
        rect(t, x, y, w, ROW - 3.0, stage_color(&p.stage), &title);
        if !p.level.is_empty() {
            let fill = level_color(&p.level, p.name != p.level);
            rect(t, x, y + ROW, w, ROW - 3.0, &fill, &title);
            if w > 7.0 * p.name.len() as f64 {
                text(t, x + w / 2.0, y + ROW + 16.0, 11, "middle", &p.name);
            }
        }
    }
    // Stage names once each, on their first phase.
    let mut seen = BTreeSet::new();
    for p in &b.phases {
        let w = a.w(p.start, p.end);
        if w > 7.0 * p.stage.len() as f64 && seen.insert(p.stage.clone()) {
            text(t, a.x(p.start) + 4.0, y + 16.0, 12, "start", &p.stage);
        }
    }
}

/// Label lanes above a vCPU's bars: a label goes in the first lane with
/// room at its place, or is left out.
struct Lanes(Vec<f64>);

impl Lanes {
    fn place(&mut self, x: f64, chars: usize) -> Option<usize> {
        let lane = self.0.iter().position(|end| x >= *end + 4.0)?;
        self.0[lane] = x + 6.0 * chars as f64;
        Some(lane)
    }
}

fn cpu_rows(t: &mut String, a: &Axis, b: &Boot, cpus: &[u32], y0: f64) {
    let mut longest: Vec<&crate::model::Initcall> = b.initcalls.iter().collect();
    longest.sort_by_key(|c| std::cmp::Reverse(c.duration().unwrap_or(0)));
    longest.truncate(LABELLED);
    for (row, cpu) in cpus.iter().enumerate() {
        let y = y0 + row as f64 * CPU_ROW;
        text(t, 8.0, y + 36.0, 12, "start", &format!("vCPU {cpu}"));
        rect(
            t,
            LEFT,
            y + 22.0,
            a.width,
            20.0,
            "#f4f4f4",
            &format!("vCPU {cpu}"),
        );
        for c in b.initcalls.iter().filter(|c| c.cpu == *cpu) {
            let end = c.end.unwrap_or(b.last);
            let level = crate::levels::level_of(&c.level).unwrap_or(&c.level);
            let title = format!(
                "{} ({}) {:.3} ms",
                c.name,
                c.level,
                ms(&a.clock, end.saturating_sub(c.start))
            );
            let fill = level_color(level, false);
            rect(
                t,
                a.x(c.start),
                y + 22.0,
                a.w(c.start, end),
                20.0,
                &fill,
                &title,
            );
        }
        let mut lanes = Lanes(vec![f64::MIN; 2]);
        let mut mine: Vec<_> = longest.iter().filter(|c| c.cpu == *cpu).collect();
        mine.sort_by_key(|c| c.start);
        for c in mine {
            let label = format!(
                "{} {:.1} ms",
                c.name,
                ms(&a.clock, c.duration().unwrap_or(0))
            );
            if let Some(lane) = lanes.place(a.x(c.start), label.len()) {
                text(
                    t,
                    a.x(c.start),
                    y + 18.0 - lane as f64 * 10.0,
                    10,
                    "start",
                    &label,
                );
            }
        }
    }
}

fn preempt_rows(t: &mut String, a: &Axis, host: &HostView, cpus: &[u32], y0: f64) {
    for row in 0..cpus.len() {
        // Before the host's recording began there is no host view.
        let y = y0 + row as f64 * CPU_ROW + 46.0;
        let title = "no host view yet (the host's recording starts with the guest's region)";
        rect(
            t,
            a.x(a.start),
            y,
            a.w(a.start, host.from),
            8.0,
            "#e8e8e8",
            title,
        );
    }
    for p in &host.preempted {
        let Some(row) = cpus.iter().position(|c| *c == p.vcpu) else {
            continue;
        };
        let y = y0 + row as f64 * CPU_ROW + 46.0;
        let cycles = (p.ns as u128 * a.clock.freq as u128 / 1_000_000_000) as u64;
        let title = format!(
            "vCPU {} preempted {:.3} ms{}",
            p.vcpu,
            p.ns as f64 / 1e6,
            p.taken_by
                .as_deref()
                .map(|c| format!(" by {c}"))
                .unwrap_or_default()
        );
        rect(
            t,
            a.x(p.start),
            y,
            a.w(p.start, p.start.saturating_add(cycles)),
            8.0,
            PREEMPT_COLOR,
            &title,
        );
    }
}

fn marks(t: &mut String, a: &Axis, b: &Boot, top: f64, bottom: f64) {
    let mut lanes = Lanes(vec![f64::MIN; 2]);
    for m in &b.marks {
        let x = a.x(m.ts);
        let (color, dash) = match m.kind.as_str() {
            "module" => ("#555555", "2,3"),
            _ => ("#000000", "6,3"),
        };
        let _ = writeln!(
            t,
            r#"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="{color}" stroke-dasharray="{dash}"><title>{}</title></line>"#,
            xml(&format!("{} {}", m.kind, m.name))
        );
        let name = m.name.rsplit('/').next().unwrap_or(&m.name);
        // What fits between the line and the page's edge.
        let room = ((WIDTH as f64 - x - 4.0) / 6.0).max(0.0) as usize;
        let label: String = name.chars().take(room).collect();
        if let Some(lane) = lanes.place(x + 2.0, label.len()) {
            text(
                t,
                x + 2.0,
                bottom + 12.0 + lane as f64 * 11.0,
                10,
                "start",
                &label,
            );
        }
    }
}

fn legend(t: &mut String, y: f64, preempted: bool) {
    let mut x = LEFT;
    let mut item = |t: &mut String, color: &str, label: &str| {
        rect(t, x, y, 12.0, 12.0, color, label);
        text(t, x + 16.0, y + 10.0, 11, "start", label);
        x += 30.0 + 7.0 * label.len() as f64;
    };
    for (s, c) in STAGE_COLORS {
        item(t, c, s);
    }
    if preempted {
        item(t, PREEMPT_COLOR, "preempted by the host");
    }
    item(t, "#000000", "exec / workload (dashed)");
}

/// A chart: its SVG text and size in pixels.
pub struct Chart {
    pub svg: String,
    pub width: u32,
    pub height: u32,
}

/// The chart of `boot` (clock `clock`); `preempted`: the VM view's
/// intervals, if any; `title`: what it shows.
pub fn svg(boot: &Boot, clock: &Clock, host: Option<&HostView>, title: &str) -> Chart {
    let reset = boot.reset.min(boot.end);
    let span = boot.end.saturating_sub(reset).max(1);
    let end = reset.saturating_add(span).saturating_add(span / 40);
    // The untraced time before the first event (firmware, the kernel's
    // start) can dwarf the rest: then the main panel starts at the trace.
    let start = if boot.first.saturating_sub(reset) > (end - reset) / 5 {
        boot.first
            .saturating_sub(end.saturating_sub(boot.first) / 40)
    } else {
        reset
    };
    let a = Axis {
        clock: clock.clone(),
        reset,
        start,
        end,
        width: WIDTH as f64 - LEFT - RIGHT,
    };
    let cpus: Vec<u32> = boot
        .initcalls
        .iter()
        .map(|c| c.cpu)
        .chain(boot.cpu_time.iter().map(|c| c.cpu))
        .chain(host.iter().flat_map(|h| h.preempted.iter().map(|p| p.vcpu)))
        .collect::<BTreeSet<u32>>()
        .into_iter()
        .collect();
    let bands_y = 100.0;
    let cpus_y = bands_y + 2.0 * ROW + 10.0;
    let marks_bottom = cpus_y + cpus.len() as f64 * CPU_ROW;
    let height = marks_bottom + 60.0;
    let mut t = String::with_capacity(64 << 10);
    let _ = writeln!(
        t,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" font-family="DejaVu Sans, Liberation Sans, Arial, sans-serif">"#
    );
    let _ = writeln!(t, r#"<rect width="100%" height="100%" fill="white"/>"#);
    text(&mut t, 8.0, 22.0, 16, "start", title);
    overview(&mut t, boot, &a, 40.0);
    axis(&mut t, &a, bands_y - 6.0, marks_bottom);
    bands(&mut t, &a, boot, bands_y);
    cpu_rows(&mut t, &a, boot, &cpus, cpus_y);
    if let Some(h) = host {
        preempt_rows(&mut t, &a, h, &cpus, cpus_y);
    }
    marks(&mut t, &a, boot, bands_y, marks_bottom);
    legend(&mut t, marks_bottom + 30.0, host.is_some());
    t.push_str("</svg>\n");
    Chart {
        svg: t,
        width: WIDTH,
        height: height as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_text_is_escaped() {
        assert_eq!(xml("a<b>&\"c'\u{1b}[2J"), "a&lt;b&gt;&amp;&quot;c&apos;[2J");
    }
}
