//! `ivtrace export`: recordings written as another tool's files
//! (ivtrace-tracecmd: trace-cmd's host and guest files).

use std::path::PathBuf;

use anyhow::Result;

use ivtrace_tracecmd::{Exported, Options};

pub const EXPORT_HELP: &str = "\
Reads what a recording wrote (its CTF traces and ivtrace.json) and writes, into
DIR, trace-cmd's files of a host-guest session: host.dat (the host's events of
the guests' QEMUs, each guest named with its vCPUs' host threads) and
guest-NAME.dat per recording (its kernel's events in the kernel's own formats,
the relayed ftrace events as the guest's kernel wrote them, user events under
the ivtrace_user system, the VM view under ivtrace_vm), each carrying how its
time maps onto the host's (ivtrace's clock mapping; its bound is printed and in
the file's VERSION option). Lost events are the pages' missed events.
docs/trace-cmd.md says what carries over and what does not.

Examples:
  ivtrace export --format trace-cmd /var/tmp/traces/web1 -o /tmp/web1-tc
  ivtrace export --format trace-cmd /var/tmp/traces -o /tmp/fleet-tc   # serve's root: every guest
  trace-cmd report -i /tmp/web1-tc/host.dat -i /tmp/web1-tc/guest-web1.dat
  kernelshark /tmp/web1-tc/host.dat -a /tmp/web1-tc/guest-web1.dat

Exit status: 0 files written with events, 1 no event at all, 2 error.";

/// The formats `ivtrace export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// trace-cmd's trace.dat (version 7): host.dat and guest-NAME.dat.
    TraceCmd,
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Recording directories (`ivtrace record -o DIR`, serve's OUTROOT/NAME),
    /// or serve's output root (every recording in it).
    #[arg(value_name = "DIR", required = true)]
    pub dirs: Vec<PathBuf>,
    /// What to write.
    #[arg(long, value_enum)]
    pub format: ExportFormat,
    /// Output directory (created if missing).
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: PathBuf,
    /// Replace files an earlier export wrote there.
    #[arg(long)]
    pub force: bool,
    /// Print what was written as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub access: crate::cli::OutputAccessArgs,
}

/// One line per file, then the commands that open them.
fn print(e: &Exported) {
    let f = &e.host;
    eprintln!(
        "ivtrace: {}: {} events on {} CPUs, {} lost",
        f.path.display(),
        f.events.values().sum::<u64>(),
        f.cpus.len(),
        f.lost
    );
    for g in &e.guests {
        let vcpus: Vec<String> = g.vcpus.iter().map(|(v, t)| format!("{v}->{t}")).collect();
        eprintln!(
            "ivtrace: {}: {} events on {} CPUs, {} lost; guest {} on the host's time by {:+} ns \
             ({}, error <= {} ns); vCPU threads {}",
            g.file.path.display(),
            g.file.events.values().sum::<u64>(),
            g.file.cpus.len(),
            g.file.lost,
            g.name,
            g.time_shift_ns,
            g.clock_method,
            g.clock_error_ns,
            if vcpus.is_empty() {
                "unknown".into()
            } else {
                vcpus.join(" ")
            }
        );
    }
    for w in e.warnings.iter().chain(&e.read_errors) {
        eprintln!("ivtrace: warning: {w}");
    }
    let inputs: Vec<String> = std::iter::once(&e.host.path)
        .chain(e.guests.iter().map(|g| &g.file.path))
        .map(|p| p.display().to_string())
        .collect();
    eprintln!("open: trace-cmd report -i {}", inputs.join(" -i "));
    eprintln!(
        "      kernelshark {} -a {}",
        inputs[0],
        inputs[1..].join(" -a ")
    );
}

/// Runs `ivtrace export`; the events written.
pub fn run(a: &ExportArgs) -> Result<u64> {
    let ExportFormat::TraceCmd = a.format;
    let o = Options {
        out: a.output.clone(),
        force: a.force,
        policy: a.access.policy()?,
    };
    let e = ivtrace_tracecmd::export(&a.dirs, &o)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&e)?);
    }
    print(&e);
    let events = e.host.events.values().sum::<u64>()
        + e.guests
            .iter()
            .map(|g| g.file.events.values().sum::<u64>())
            .sum::<u64>();
    Ok(events)
}
