//! `ivtrace boot DIR`: the boot of a recorded guest (ivtrace-boot): the
//! report as text or JSON, the chart as SVG and, with `--png`, as a PNG
//! rendered by a headless Chromium. Also the derivation every recording
//! runs when it ends ([`ivtrace_boot::derive::at_end`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use ivtrace_boot::chart::{self, CHART_PNG, CHART_SVG};
use ivtrace_boot::derive::derive;
use ivtrace_boot::model::Boot;
use ivtrace_boot::report::{self, host_view, HostView, Report};
use ivtrace_boot::stream;
use ivtrace_ctf::read::Trace;
use ivtrace_engine::session::open_root;
use ivtrace_engine::UserError;

use crate::cli::BootArgs;
use ivtrace_boot::report::printable;

pub const BOOT_HELP: &str = "\
Reads the boot's derived streams of DIR/kernel (written when the recording
ended: DIR/kernel/boot, and DIR/kernel/profile with function_graph), or
derives them from the relayed ftrace events first. What the guest needs on
its kernel command line (docs/boot.md):

  trace_clock=x86-tsc trace_event=initcall,module,sched trace_buf_size=64M
  ftrace=function_graph ftrace_filter=<functions>      (for the profile)

with ivtrace.ko loaded from the initramfs with ftrace=1. The boot ends at the
first trace_marker line starting with `ivtrace-boot` (or --boot-workload's exec).

Examples:
  ivtrace boot /tmp/trace                       # report; chart in /tmp/trace/boot.svg
  ivtrace boot /tmp/trace --png                 # and /tmp/trace/boot.png (headless Chromium)
  ivtrace boot /tmp/trace --json | jq '.phases[] | [.name, .duration_ms]'
  ivtrace boot /tmp/trace --derive --ftrace-profile instead   # keep only the profile

Exit status: 0 a boot was reported; 2 error (no kernel trace, no boot events, I/O).";

/// The guest needs to trace its boot: what to tell a user whose recording
/// has none.
const NO_BOOT_HINT: &str = "trace the boot: trace_event=initcall (and ftrace=function_graph for \
     the profile) on the guest's kernel command line, ivtrace.ko ftrace=1 from the initramfs \
     (docs/boot.md)";

fn kernel_trace(dir: &Path) -> Result<Trace> {
    let kernel = dir.join("kernel");
    if !kernel.join("metadata").is_file() {
        return Err(UserError {
            message: format!(
                "{} has no kernel trace ({}/metadata)",
                dir.display(),
                kernel.display()
            ),
            hint: NO_BOOT_HINT.into(),
        }
        .into());
    }
    Trace::open(&kernel).with_context(|| format!("cannot read {}", kernel.display()))
}

/// The boot (derived now if asked, or if the recording has none yet).
fn load(args: &BootArgs) -> Result<(Trace, Boot, Option<ivtrace_boot::model::Profile>)> {
    let trace = kernel_trace(&args.dir)?;
    let (boot, profile) = stream::read(&trace).context("cannot read the boot streams")?;
    if let (Some(b), false) = (boot, args.derive) {
        return Ok((trace, b, profile));
    }
    let root = open_root(&args.dir, &args.access.policy()?)?;
    let Some(d) = derive(&root, &args.boot.options())
        .with_context(|| format!("deriving the boot of {} failed", args.dir.display()))?
    else {
        return Err(UserError {
            message: format!(
                "{}/kernel holds no initcall level, initcall or function_graph event",
                args.dir.display()
            ),
            hint: NO_BOOT_HINT.into(),
        }
        .into());
    };
    eprintln!("ivtrace: {}", ivtrace_boot::derive::describe(&d));
    let trace = kernel_trace(&args.dir)?;
    let (boot, profile) = stream::read(&trace).context("cannot read the boot streams")?;
    Ok((
        trace,
        boot.context("the derived boot stream is missing")?,
        profile,
    ))
}

#[derive(Serialize)]
struct Output<'a> {
    #[serde(flatten)]
    report: &'a Report,
    chart: Option<String>,
    png: Option<String>,
}

pub fn run(args: &BootArgs) -> Result<u64> {
    let (trace, boot, profile) = load(args)?;
    let vm = args.dir.join("vm");
    let mut host: Option<HostView> = None;
    let mut notes = Vec::new();
    if vm.join("metadata").is_file() {
        match host_view(&vm, &boot) {
            Ok(h) => host = Some(h),
            Err(e) => notes.push(format!("the VM view ({}) did not read: {e}", vm.display())),
        }
    }
    let mut r = report::build(
        &args.dir,
        trace.clock(),
        &boot,
        profile.as_ref(),
        host.as_ref(),
        args.top,
    );
    r.notes.extend(notes);
    let (chart, png) = match args.no_chart {
        true => (None, None),
        false => write_chart(args, &trace, &boot, host.as_ref())?,
    };
    if args.json {
        let out = Output {
            report: &r,
            chart: chart.as_ref().map(|p| p.display().to_string()),
            png: png.as_ref().map(|p| p.display().to_string()),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", report::text(&r));
        for p in chart.iter().chain(png.iter()) {
            println!("chart: {}", printable(&p.display().to_string()));
        }
    }
    Ok((boot.phases.len() + boot.initcalls.len()).max(1) as u64)
}

/// Writes the SVG (and the PNG); their paths.
fn write_chart(
    args: &BootArgs,
    trace: &Trace,
    boot: &Boot,
    host: Option<&HostView>,
) -> Result<(Option<PathBuf>, Option<PathBuf>)> {
    let name = args
        .dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "guest".into());
    let title = format!(
        "Boot of {name}: {:.1} ms from the vCPU's reset to the {}",
        report::since_reset(trace.clock(), boot, boot.end),
        if boot.end < boot.last {
            "workload"
        } else {
            "trace's end"
        }
    );
    let c = chart::svg(boot, trace.clock(), host, &title);
    let svg = match &args.chart {
        Some(p) => {
            std::fs::write(p, &c.svg).with_context(|| format!("cannot write {}", p.display()))?;
            p.clone()
        }
        None => {
            let root = open_root(&args.dir, &args.access.policy()?)?;
            root.write_atomically(CHART_SVG, c.svg.as_bytes())
                .with_context(|| format!("cannot write {}", args.dir.join(CHART_SVG).display()))?;
            args.dir.join(CHART_SVG)
        }
    };
    if !args.png {
        return Ok((Some(svg), None));
    }
    let png = match &args.chart {
        Some(p) => p.with_extension("png"),
        None => args.dir.join(CHART_PNG),
    };
    render_png(&svg, &png, c.width, c.height)?;
    Ok((Some(svg), Some(png)))
}

/// The first of the usual Chromium commands on PATH.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

/// `svg` rendered by a headless Chromium into `png` (`width` x `height`).
pub fn render_png(svg: &Path, png: &Path, width: u32, height: u32) -> Result<()> {
    let Some(bin) = chromium() else {
        return Err(UserError {
            message: "no Chromium to render the PNG (chromium, chromium-browser or google-chrome on PATH)".into(),
            hint: "apt-get install chromium, or open the SVG in any browser".into(),
        }
        .into());
    };
    let profile =
        std::env::temp_dir().join(format!("ivtrace-boot-chromium-{}", std::process::id()));
    std::fs::create_dir_all(&profile)?;
    let svg = svg.canonicalize()?;
    let _ = std::fs::remove_file(png);
    let mut cmd = Command::new(&bin);
    cmd.args([
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
    ])
    .args([
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("--window-size={width},{height}"))
    .arg(format!("--screenshot={}", png.display()))
    .arg(format!("file://{}", svg.display()))
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    // Chromium refuses to run as root with its sandbox.
    if nix::unistd::geteuid().is_root() {
        cmd.arg("--no-sandbox");
    }
    let result = run_bounded(cmd, Duration::from_secs(90));
    let _ = std::fs::remove_dir_all(&profile);
    let stderr = result.with_context(|| format!("{} failed", bin.display()))?;
    match std::fs::metadata(png) {
        Ok(m) if m.len() > 0 => Ok(()),
        _ => bail!(
            "{} wrote no {}: {}",
            bin.display(),
            png.display(),
            printable(stderr.lines().last().unwrap_or(""))
        ),
    }
}

/// Runs `cmd` for at most `limit`; its stderr.
fn run_bounded(mut cmd: Command, limit: Duration) -> Result<String> {
    use std::io::Read;
    let mut child = cmd.spawn()?;
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            let stderr = reader.join().unwrap_or_default();
            if !st.success() {
                bail!(
                    "exit {st}: {}",
                    printable(stderr.lines().last().unwrap_or(""))
                );
            }
            return Ok(stderr);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("no answer within {} s (killed)", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
