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
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

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
    fn help_documents_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        assert!(
            help.contains("Exit status:")
                && help.contains("1  nothing to show: the run saw no event")
        );
    }
}
