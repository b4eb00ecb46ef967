//! `ivtrace serve`'s options and help; the server itself is ivtrace-serve.

use std::path::PathBuf;

use anyhow::Result;

/// `ivtrace serve --help`, after the options.
pub const SERVE_HELP: &str = "\
Speaks the ivshmem server protocol (Debian ships no ivshmem-server) and records
every QEMU that connects. Each connection gets its own region file in --shm-dir
(sized to a power of two), its own eventfds (guest id 0, host id 1) and its own
trace directory OUTROOT/<name>, named after QEMU's -name (else guest<N>; a
taken name gets -2, -3...). The guest loads ivtrace.ko, which formats the
region; serve then drains it, sleeping on the guest's doorbell when idle (zero
doorbells per event: the guest rings only when it completes a packet while the
host sleeps), keeps the guest clock mapped to host time (KVM debugfs, else a
ping-pong through the region) and writes DIR/host/ (what serve saw: doorbells
received, packets delivered, clock sync points; --host-events adds host
kernel events). A guest that exits, is killed or misbehaves only ends its own
trace, which is finalized. Ctrl-C/SIGTERM finalize every trace and exit.
Every guest is drained by one bounded pool of threads (--drain-threads): a guest
that floods only overflows its own rings. With --relayd every guest's traces also
stream to an LTTng relay daemon, live (docs/relay.md).
Sockets are created mode 0600 (0660 for the group given with --socket-group or
--ctl-group); a live socket path is refused, a stale one replaced.

Examples:
  ivtrace serve --socket /run/ivtrace.sock -o /var/tmp/traces &
  qemu-system-x86_64 -name web1,debug-threads=on ... \\
      -chardev socket,id=ivt,path=/run/ivtrace.sock \\
      -device ivshmem-doorbell,chardev=ivt,vectors=2
  # in the guest: insmod ivtrace.ko
  ivtrace ctl --socket /run/ivtrace.sock list
  ivtrace ctl --socket /run/ivtrace.sock --guest web1 enable syscall
  babeltrace2 /var/tmp/traces/web1          # guest and host on one timeline
  ivtrace serve --socket /run/ivtrace.sock -o /var/tmp/traces --relayd net://relay.example
  babeltrace2 --input-format=lttng-live net://relay.example/host/$(hostname)/web1

Output per guest:
  OUTROOT/<name>/kernel, user    CTF traces of the guest (clock mapped to host time)
  OUTROOT/<name>/host            CTF trace of host events, same time base
  OUTROOT/<name>/ivtrace.json    summary: notification (doorbells vs packets),
                                 clock_sync (method, error bound), delivery latency
  OUTROOT/<name>/trace-cmd/      with --trace-cmd: host.dat and guest-<name>.dat for
                                 trace-cmd report -i ... -i ... and KernelShark";

/// What `ivtrace serve` takes (cli.rs embeds it).
// Doc comments here are the CLI's --help text (clap): `<name>` and `[GLOB]` are its syntax,
// not HTML or intra-doc links.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The server socket QEMU connects to (`-chardev socket,path=PATH`).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// Root of the per-guest trace directories: OUTROOT/<guest name>.
    #[arg(short = 'o', long = "output", value_name = "OUTROOT")]
    pub output: PathBuf,
    /// Region size per guest (a power of two; other sizes are rounded up), e.g. 16M, 1G.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = crate::cli::parse_bytes)]
    pub size: u64,
    /// Interrupt vectors per direction; match QEMU's `ivshmem-doorbell,vectors=N`.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub vectors: u32,
    /// Control socket for `ivtrace ctl` [default: PATH.ctl].
    #[arg(long, value_name = "PATH")]
    pub ctl_socket: Option<PathBuf>,
    /// Let this group connect to the server socket (mode 0660): the group QEMU
    /// runs as, e.g. libvirt-qemu. Name or gid; empty: owner only (0600).
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Let this group use the control socket (`ivtrace ctl`, mode 0660), e.g.
    /// ivtrace. Name or gid; empty: owner only (0600).
    #[arg(long, value_name = "GROUP")]
    pub ctl_group: Option<String>,
    /// Put each guest's region in a file in DIR (tmpfs) instead of a sealed
    /// memfd: `ivtrace snapshot` can then salvage it by path if serve dies, but
    /// a client may shrink the file (serve survives it, the guest's trace ends).
    #[arg(long, value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    /// Keep each guest's region file (--shm-dir) after its trace is finalized.
    #[arg(long, requires = "shm_dir")]
    pub keep_shm: bool,
    /// Seconds between clock sync bursts (ping-pong through the region).
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    pub sync_interval: f64,
    /// Also record host events into OUTROOT/<name>/host: sched_switch of the
    /// guest's vCPU threads, kvm_exit/kvm_entry/kvm_hypercall (needs tracefs, root).
    #[arg(long)]
    pub host_events: bool,
    /// When a guest's recording ends, also write its trace-cmd files into
    /// OUTROOT/<name>/trace-cmd/ (host.dat, guest-<name>.dat: what
    /// `ivtrace export --format trace-cmd` writes; docs/trace-cmd.md).
    #[arg(long)]
    pub trace_cmd: bool,
    /// Stop after this many seconds (fractions allowed).
    #[arg(long, value_name = "S")]
    pub duration: Option<f64>,
    /// Print each guest's summary as one JSON object per line on stdout.
    #[arg(long)]
    pub json: bool,
    /// Per guest recording: stop writing once its stream files reach SIZE
    /// (e.g. 1G); later packets are dropped and counted as lost (`over_limit`).
    #[arg(long, value_name = "SIZE", value_parser = crate::cli::parse_bytes)]
    pub max_size: Option<u64>,
    /// Longest wait for the guests to finalize their traces after SIGINT/SIGTERM;
    /// a guest still busy then is left for `ivtrace recover`.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    #[command(flatten)]
    pub access: crate::cli::OutputAccessArgs,
    /// Threads that drain the guests (every guest is recorded by this pool, not
    /// a thread of its own) [default: the CPUs available].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub drain_threads: Option<u32>,
    #[command(flatten)]
    pub relay: crate::relayd::RelayArgs,
    #[command(flatten)]
    pub boot: crate::cli::BootDeriveArgs,
}

impl ServeArgs {
    /// The server's settings: the output policy and the boot options
    /// resolved, the relay sender started.
    fn settings(&self) -> Result<ivtrace_serve::Settings> {
        Ok(ivtrace_serve::Settings {
            socket: self.socket.clone(),
            output: self.output.clone(),
            policy: self.access.policy()?,
            size: self.size,
            vectors: self.vectors,
            ctl_socket: self.ctl_socket.clone(),
            socket_group: self.socket_group.clone(),
            ctl_group: self.ctl_group.clone(),
            shm_dir: self.shm_dir.clone(),
            keep_shm: self.keep_shm,
            sync_interval: self.sync_interval,
            host_events: self.host_events,
            trace_cmd: self.trace_cmd,
            duration: self.duration,
            json: self.json,
            max_size: self.max_size,
            shutdown_timeout: self.shutdown_timeout,
            drain_threads: self.drain_threads,
            relay: self.relay.start()?,
            boot: self.boot.options(),
            print_summary: |sidecar, out| {
                let _ = crate::summary::print(sidecar, out, false);
            },
        })
    }
}

/// Runs `ivtrace serve`. Returns the number of guests served.
pub fn run(args: &ServeArgs) -> Result<u64> {
    Ok(ivtrace_serve::run(args.settings()?)?)
}
