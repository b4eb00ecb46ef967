//! Command-line arguments (clap derive) and the help text that teaches.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

const AFTER_HELP: &str = "\
Examples:
  # a writer on this host (libivtrace, loadgen) fills /dev/shm/demo; record it
  ivtrace-loadgen --shm /dev/shm/demo --events 1000000 --size 16 --threads 4 &
  ivtrace record --shm /dev/shm/demo -o /tmp/trace
  babeltrace2 /tmp/trace                 # read it with any CTF 1.8 reader
  ivtrace report /tmp/trace              # counts, losses, rates, no babeltrace2 needed

  # a flight-recorder (overwrite mode) region whose writer crashed
  ivtrace snapshot --shm /dev/shm/demo -o /tmp/salvage

  # a guest and its host in trace-cmd and KernelShark (docs/trace-cmd.md)
  ivtrace export --format trace-cmd /var/tmp/traces/web1 -o /tmp/web1-tc
  trace-cmd report -i /tmp/web1-tc/host.dat -i /tmp/web1-tc/guest-web1.dat

Output layout:
  DIR/user/metadata, DIR/user/user_chanN    CTF trace of user-space channels
  DIR/kernel/metadata, DIR/kernel/...       CTF trace of guest kernel channels
  DIR/ivtrace.json                          summary and event layouts (sidecar)
  DIR/host/, DIR/vm/                        with --host-events: the host's events of the QEMU,
                                            and the VM view (vCPUs preempted/blocked/in KVM,
                                            hypercalls) on the guest's clock

Exit status:
  0  success: events were recorded (or reported)
  1  nothing to show: the run saw no event at all, neither recorded nor lost
     (e.g. the writer wrote nothing, or it stopped before the region appeared)
  2  error: bad arguments, unusable region, output directory problems, I/O";

/// Guest->host tracing over shared memory: drain ivtrace regions into CTF.
#[derive(Debug, Parser)]
#[command(name = "ivtrace", version, about, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Doc comments here are the CLI's --help text (clap): `<name>` and `[GLOB]` are its syntax,
// not HTML or intra-doc links.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Drain a live region into a CTF trace until it closes or you stop it.
    #[command(after_help = "\
Waits for PATH to exist and be formatted, then copies every complete packet
out of every channel, validates the copy, and writes it to DIR. Stops on
Ctrl-C/SIGTERM, after --duration, when the region is marked closed and fully
drained, or when a loopback region's owner process is gone. In every case
the committed part of open packets is flushed, then a summary is printed.

Examples:
  ivtrace record --shm /dev/shm/demo -o /tmp/trace
  ivtrace record --shm /dev/shm/guest0 -o /tmp/trace --duration 30 --force")]
    Record(RecordArgs),
    /// Count events, losses, time span and rates of a recorded trace.
    #[command(after_help = "\
Walks DIR's stream files with the layouts stored in DIR/ivtrace.json.

Examples:
  ivtrace report /tmp/trace
  ivtrace report /tmp/trace --json | jq .totals")]
    Report(ReportArgs),
    /// Salvage a flight-recorder region (read-only) into a CTF trace.
    #[command(after_help = "\
Never writes to the region. Per channel takes the newest complete packets
the ring still holds plus the committed prefix of the open one, skips copies
the writer tore while they were taken, and reports how many older events
were already overwritten.

Example:
  ivtrace snapshot --shm /dev/shm/demo -o /tmp/salvage")]
    Snapshot(SnapshotArgs),
    /// Be the ivshmem server for QEMU guests and record each into OUTROOT/<name>.
    #[command(after_help = crate::serve::SERVE_HELP)]
    Serve(crate::serve::ServeArgs),
    /// Send a command to a guest (flush, enable/disable groups, mode, statedump) or list guests.
    #[command(after_help = crate::ctl::CTL_HELP)]
    Ctl(crate::ctl::CtlArgs),
    /// Make a recording whose recorder died (SIGKILL, crash, full disk) whole and readable.
    #[command(after_help = "\
Cuts every stream file back to its last whole packet (babeltrace2 refuses a
trace with one incomplete packet), expands the kernel stream staged in
DIR/.kernel-wire/ into DIR/kernel/, and rewrites DIR/ivtrace.json with what
the files hold (state: recovered, and why). Works on `record` and `serve`
trace directories. To go on recording the same region into DIR instead, run
`ivtrace record --resume` with the original --shm and -o.

Example:
  ivtrace recover /var/tmp/traces/web1")]
    Recover(RecoverArgs),
    /// The boot of a recorded guest: phases, initcall levels, initcalls, function profile, chart.
    #[command(after_help = crate::boot::BOOT_HELP)]
    Boot(BootArgs),
    /// Write recordings as another tool's files: trace-cmd's (a host file, one per guest).
    #[command(after_help = crate::export::EXPORT_HELP)]
    Export(crate::export::ExportArgs),
}

/// Who may read a trace and where it may be written (record and serve).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OutputAccessArgs {
    /// Group of every trace directory (mode 0750) and file (0640) created
    /// [default: this process's group]. A name or a number.
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Accept an output root that another user owns or that others may write
    /// (refused by default: they could swap a trace directory for a link).
    /// Files are still created only through directories ivtrace holds open.
    #[arg(long)]
    pub allow_shared_output: bool,
}

impl RecordArgs {
    /// `--sync-interval`, within 0.1 s .. 1 h.
    pub fn sync_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.sync_interval.clamp(0.1, 3600.0))
    }
}

impl OutputAccessArgs {
    /// The policy these options give (the group looked up).
    pub fn policy(&self) -> anyhow::Result<ivtrace_ctf::OutputPolicy> {
        let group = match &self.group {
            Some(g) => Some(
                ivtrace_ctf::outdir::resolve_group(g)
                    .map_err(|e| anyhow::anyhow!("--group {g}: {e}"))?,
            ),
            None => None,
        };
        Ok(ivtrace_ctf::OutputPolicy {
            group,
            allow_shared: self.allow_shared_output,
        })
    }
}

/// `64M`, `1G`, `65536` (as `--size`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 0),
        Some((i, _)) => {
            let unit = s[i..]
                .trim_end_matches(['B', 'b', 'i'])
                .to_ascii_uppercase();
            let shift = match unit.as_str() {
                "" => 0,
                "K" => 10,
                "M" => 20,
                "G" => 30,
                _ => return Err(format!("unknown size unit in `{s}` (use K, M or G)")),
            };
            (&s[..i], shift)
        }
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size `{s}`"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// The region: a /dev/shm file (loopback) or the host side of a guest's ivshmem memory.
    #[arg(long, value_name = "PATH")]
    pub shm: PathBuf,
    /// Output directory (created if missing; must be empty unless --force).
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: PathBuf,
    /// Stop after this many seconds (fractions allowed).
    #[arg(long, value_name = "S")]
    pub duration: Option<f64>,
    /// Replace an earlier ivtrace output in DIR (only its user/, kernel/ and ivtrace.json).
    #[arg(long)]
    pub force: bool,
    /// The guest's name in the traces (`hostname`); default: the region file's name
    /// (this host's name for a loopback region). Sanitized to [A-Za-z0-9._-].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Also record host events into DIR/host (same time base, so `babeltrace2 DIR`
    /// merges them): sched_switch of the QEMU's vCPU threads, and
    /// kvm_exit/kvm_entry/kvm_hypercall where KVM runs the guest. Needs tracefs (root).
    /// At the end the VM view is derived from them into DIR/vm.
    #[arg(long)]
    pub host_events: bool,
    /// The QEMU process for --host-events [default: the process that maps --shm].
    #[arg(long, value_name = "PID", requires = "host_events")]
    pub qemu_pid: Option<i32>,
    /// QEMU's QMP socket (`-qmp unix:PATH,server=on,wait=off`): the vCPU threads come
    /// from `query-cpus-fast` for the VM view when QEMU does not name them
    /// (`-name NAME,debug-threads=on` does).
    #[arg(long, value_name = "PATH", requires = "host_events")]
    pub qmp: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Go on with the recording in DIR of the same region, whose recorder died
    /// (killed, crashed, out of disk): its stream files are cut back to whole
    /// packets, and every packet the region still holds is appended once.
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
    /// Stop writing once the trace's stream files reach SIZE (e.g. 512M, 2G):
    /// later packets are dropped and counted as lost (`over_limit`).
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub max_size: Option<u64>,
    /// Continue a migrated guest's trace: wait until FILE (the previous host's
    /// DIR/handoff.json, or DIR) exists, then record from where that part ended,
    /// as the next part. SIGUSR1 ends a recording with such a handoff
    /// (docs/migration.md).
    #[arg(long, value_name = "FILE", conflicts_with = "resume")]
    pub resume_from: Option<PathBuf>,
    /// Map guest time by the clock exchange through the region's sync mailbox
    /// even with a writer that does not spin in it (an older module answers
    /// once per control poll, every flush_ms: its bound is milliseconds). The
    /// guest module spins in it (IVT_FEAT_SYNC_SPIN), and then the exchange is
    /// the default: met at its control poll, bound well under a microsecond
    /// under TCG (docs/kvm.md).
    #[arg(long)]
    pub clock_sync: bool,
    /// Seconds between clock exchange bursts (after those at 0, 0.5 and 1 s).
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    pub sync_interval: f64,
    /// Nested tracing, inside a guest that is itself traced: also send
    /// every packet, the event classes and the final clock mapping to
    /// FIFO, which `ivtrace-forward --in FIFO --shm /dev/ivtrace` writes
    /// into this guest's own region for the outer host
    /// (docs/migration.md, "Nested guests").
    #[arg(long, value_name = "FIFO")]
    pub forward: Option<PathBuf>,
    #[command(flatten)]
    pub access: OutputAccessArgs,
    #[command(flatten)]
    pub relay: crate::relayd::RelayArgs,
    #[command(flatten)]
    pub boot: BootDeriveArgs,
}

#[derive(Debug, clap::Args)]
pub struct RecoverArgs {
    /// A trace directory whose recording was not finalized.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Print the resulting summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub access: OutputAccessArgs,
}

/// What becomes of function_graph's raw events once profiled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileModeArg {
    /// The profile beside the raw events.
    #[default]
    Beside,
    /// The profile instead of them (the raw events leave the trace).
    Instead,
    /// No profile.
    Off,
}

impl From<ProfileModeArg> for ivtrace_boot::derive::ProfileMode {
    fn from(m: ProfileModeArg) -> Self {
        use ivtrace_boot::derive::ProfileMode as P;
        match m {
            ProfileModeArg::Beside => P::Beside,
            ProfileModeArg::Instead => P::Instead,
            ProfileModeArg::Off => P::Off,
        }
    }
}

/// The boot analysis a recording derives when it ends (record, serve,
/// `ivtrace boot --derive`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BootDeriveArgs {
    /// function_graph's raw events, once aggregated into the function
    /// profile (DIR/kernel/profile): kept beside it, replaced by it
    /// (`instead`: the compact stream alone), or no profile (`off`).
    #[arg(long, value_enum, default_value = "beside", value_name = "MODE")]
    pub ftrace_profile: ProfileModeArg,
    /// The program (file name) whose exec starts the workload: the boot ends
    /// there. A trace_marker line starting with `ivtrace-boot` does too.
    #[arg(long, value_name = "NAME")]
    pub boot_workload: Option<String>,
}

impl BootDeriveArgs {
    pub fn options(&self) -> ivtrace_boot::derive::Options {
        ivtrace_boot::derive::Options {
            profile: self.ftrace_profile.into(),
            workload: self.boot_workload.clone(),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct BootArgs {
    /// A recording directory (`ivtrace record -o DIR`, or `ivtrace serve`'s `OUTROOT/<guest>`).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Rows per list: initcalls per level, functions per phase, threads per vCPU.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub top: usize,
    /// Derive the boot's streams again from the raw events (a recording derives
    /// them when it ends; this is for older recordings or other options).
    #[arg(long)]
    pub derive: bool,
    #[command(flatten)]
    pub boot: BootDeriveArgs,
    /// Where to write the chart (SVG) [default: DIR/boot.svg].
    #[arg(long, value_name = "FILE", conflicts_with = "no_chart")]
    pub chart: Option<PathBuf>,
    /// Write no chart.
    #[arg(long)]
    pub no_chart: bool,
    /// Also render the chart as a PNG beside it (same name, .png), with a
    /// headless Chromium (`chromium`, `chromium-browser` or `google-chrome` on PATH).
    #[arg(long, conflicts_with = "no_chart")]
    pub png: bool,
    #[command(flatten)]
    pub access: OutputAccessArgs,
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// A directory written by `ivtrace record` or `ivtrace snapshot`.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// The region to salvage (opened read-only).
    #[arg(long, value_name = "PATH")]
    pub shm: PathBuf,
    /// Output directory (created if missing; must be empty unless --force).
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: PathBuf,
    /// Replace an earlier ivtrace output in DIR.
    #[arg(long)]
    pub force: bool,
    /// The guest's name in the traces (`hostname`); default: the region file's name.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub access: OutputAccessArgs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("64M").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("65536").unwrap(), 65536);
        assert_eq!(parse_bytes("16MiB").unwrap(), 16 << 20);
        assert!(parse_bytes("12Q").is_err());
        assert!(parse_bytes("99999999999G").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn record_takes_shm_output_and_duration() {
        let cli = Cli::try_parse_from([
            "ivtrace",
            "record",
            "--shm",
            "/dev/shm/x",
            "-o",
            "out",
            "--duration",
            "1.5",
        ])
        .unwrap();
        let Command::Record(a) = cli.command else {
            panic!("not record")
        };
        assert_eq!(a.duration, Some(1.5));
        assert!(!a.force);
    }

    #[test]
    fn output_access_options_parse() {
        let cli = Cli::try_parse_from([
            "ivtrace",
            "record",
            "--shm",
            "/dev/shm/x",
            "-o",
            "out",
            "--group",
            "0",
            "--allow-shared-output",
            "--max-size",
            "2G",
        ])
        .unwrap();
        let Command::Record(a) = cli.command else {
            panic!("not record")
        };
        assert_eq!(a.access.group.as_deref(), Some("0"));
        assert!(a.access.allow_shared_output);
        assert_eq!(a.max_size, Some(2 << 30));
        let policy = a.access.policy().unwrap();
        assert_eq!(policy.group.map(|g| g.as_raw()), Some(0));
    }

    #[test]
    fn help_documents_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        assert!(
            help.contains("Exit status:")
                && help.contains("1  nothing to show: the run saw no event")
        );
    }
}
