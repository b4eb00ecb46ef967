//! `ivtrace ctl`: host -> guest control. Either through a running
//! `ivtrace serve` (its control socket; the guest is kicked on MSI-X vector
//! 0 and answers at once) or directly on a region file (`--shm`, e.g. an
//! `ivshmem-plain` guest: the module reads commands every `flush_ms`).

use ivtrace_region::sanitize::Shown;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use ivtrace_region::{Access, Command, Region};

use ivtrace_engine::UserError;
use ivtrace_serve::control::{self, parse_command};
use ivtrace_serve::ftrace;

/// `ivtrace ctl --help`, after the options.
pub const CTL_HELP: &str = "\
Through a server (--socket, the path `ivtrace serve --socket` listens on): the
guest's thread posts the command in its region and kicks the guest's MSI-X
vector 0; the module acts and acknowledges within milliseconds. Directly on a
region (--shm, e.g. an ivshmem-plain guest or a region no server owns): the
module reads commands every flush_ms (default 100 ms). The reply shows the
guest's status (0 or -errno) and the event groups now enabled. One controller
at a time per region (an exclusive flock on the region file).

The guest's ftrace (ivtrace.ko ftrace=1, docs/ftrace.md): tracepoints with
filters, function tracing, kprobes, pid filters, without a shell in the guest:
  ftrace enable SYSTEM:EVENT|SYSTEM|all [FILTER]   ftrace disable EVENT
  ftrace filter EVENT EXPR      ftrace trigger EVENT EXPR
  ftrace tracer function|function_graph|nop [FUNCTION-GLOB...]
  ftrace functions GLOB...      ftrace notrace GLOB...     ftrace graph GLOB...
  ftrace kprobe|kretprobe|uprobe NAME PROBE [FETCHARGS...]   ftrace probe-remove NAME
  ftrace pid PID...             ftrace on|off              ftrace buffer-kb N
  ftrace write|append PATH VALUE     ftrace read PATH       list-events [GLOB]

Examples:
  ivtrace ctl --socket /run/ivtrace.sock list
  ivtrace ctl --socket /run/ivtrace.sock --guest web1 flush
  ivtrace ctl --socket /run/ivtrace.sock --guest web1 enable syscall,kmem
  ivtrace ctl --socket /run/ivtrace.sock --guest web1 disable all
  ivtrace ctl --socket /run/ivtrace.sock --guest web1 mode overwrite
  ivtrace ctl --shm /dev/shm/guest0 statedump
  ivtrace ctl --socket /run/ivtrace.sock --guest web1 list-events 'block:*'
  ivtrace ctl --shm /dev/shm/guest0 ftrace enable block:block_rq_issue 'nr_sector > 8'
  ivtrace ctl --shm /dev/shm/guest0 ftrace kprobe myopen do_sys_openat2 'name=+0(%si):ustring'
  ivtrace ctl --shm /dev/shm/guest0 ftrace tracer function_graph 'vfs_*'

A guest that migrates (docs/migration.md): once the migration is over, on the
source's server `handoff` ends the guest's trace there (DIR/handoff.json), and
on the destination's server `resume FILE` starts recording the guest that
arrived (QEMU -incoming) from that handoff:
  ivtrace ctl --socket /run/a.sock --guest web1 handoff
  ivtrace ctl --socket /run/b.sock --guest web1 resume /traces-a/web1/handoff.json";

/// What `ivtrace ctl` takes (cli.rs embeds it).
// Doc comments here are the CLI's --help text (clap): `<name>` and `[GLOB]` are its syntax,
// not HTML or intra-doc links.
#[allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["socket", "ctl_socket", "shm"]))]
pub struct CtlArgs {
    /// The `ivtrace serve` socket (its control socket is PATH.ctl).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The control socket itself, if serve was given --ctl-socket.
    #[arg(long, value_name = "PATH")]
    pub ctl_socket: Option<PathBuf>,
    /// Talk to the region file directly (no server; ivshmem-plain guests).
    #[arg(long, value_name = "PATH")]
    pub shm: Option<PathBuf>,
    /// The guest, as `ivtrace ctl --socket PATH list` names it (optional
    /// when exactly one guest is connected).
    #[arg(long, value_name = "NAME")]
    pub guest: Option<String>,
    /// Print the reply as JSON.
    #[arg(long)]
    pub json: bool,
    /// flush | enable GROUPS | disable GROUPS | mode discard|overwrite |
    /// statedump | list | status | handoff | resume [HANDOFF] |
    /// list-events [GLOB] | ftrace ... (below). GROUPS:
    /// sched,irq,timer,kmem,syscall,printk or all.
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., allow_hyphen_values = true)]
    pub command: Vec<String>,
}

fn print_reply(v: &Value, json_out: bool) -> Result<u64> {
    if json_out {
        crate::json_out::write_line(&mut std::io::stdout().lock(), v)?;
    }
    if v.get("ok").and_then(Value::as_bool) != Some(true) {
        let err = v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the server refused the request");
        bail!("{err}");
    }
    if json_out {
        return Ok(1);
    }
    if let Some(gs) = v.get("guests").and_then(Value::as_array) {
        if gs.is_empty() {
            println!("no guest has connected");
        }
        // The server's text, which quotes guests: shown escaped.
        let text = |v: &Value, or: &str| Shown(v.as_str().unwrap_or(or)).to_string();
        for g in gs {
            let last_trace = g["traces"].as_array().and_then(|t| t.last());
            println!(
                "{:<16} pid {:<8} {:<10} events {:<10} packets {:<8} doorbells {:<8} clock {} (<= {} ns)  {}",
                text(&g["name"], "?"),
                g["qemu_pid"].as_i64().map_or_else(|| "?".into(), |p| p.to_string()),
                text(&g["state"], "?").split(' ').next().unwrap_or("?"),
                g["events"],
                g["packets"],
                g["doorbells"],
                text(&g["clock_method"], "-"),
                g["clock_error_ns"],
                last_trace.map_or_else(String::new, |t| text(t, ""))
            );
        }
        return Ok(gs.len().max(1) as u64);
    }
    if let Some(what) = v.get("result").and_then(Value::as_str) {
        println!(
            "guest {}: {}: {}",
            Shown(v["guest"].as_str().unwrap_or("?")),
            Shown(v["op"].as_str().unwrap_or("?")),
            Shown(what)
        );
        return Ok(1);
    }
    if let Some(g) = v.get("guest").filter(|g| g.is_object()) {
        crate::json_out::write_pretty(&mut std::io::stdout().lock(), g)?;
        return Ok(1);
    }
    println!(
        "guest {}: `{}` acknowledged (#{}, status {} = {}) in {:.0} us; groups enabled: {}",
        Shown(v["guest"].as_str().unwrap_or("?")),
        Shown(v["command"].as_str().unwrap_or("?")),
        v["seq"],
        v["ack_status"],
        Shown(v["ack_status_name"].as_str().unwrap_or("?")),
        v["latency_us"].as_f64().unwrap_or(0.0),
        v["groups_enabled_names"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","))
            .unwrap_or_default()
    );
    Ok(1)
}

fn via_socket(path: &PathBuf, req: Value) -> Result<Value> {
    let conn = UnixStream::connect(path).map_err(|e| UserError {
        message: format!("cannot connect to {}: {e}", path.display()),
        hint: "is `ivtrace serve` running? its control socket is the --socket path plus .ctl"
            .into(),
    })?;
    // An ftrace request runs in the guest: a tracer switch takes seconds.
    conn.set_read_timeout(Some(Duration::from_secs(90)))?;
    let mut w = &conn;
    writeln!(w, "{req}")?;
    let mut line = String::new();
    BufReader::new(&conn)
        .read_line(&mut line)
        .context("no reply from the server")?;
    serde_json::from_str(&line).context("the server's reply is not JSON")
}

fn direct(shm: &Path, cmd: Command, words: &[String]) -> Result<Value> {
    let region = Region::open(shm, Access::ReadWrite)
        .with_context(|| format!("cannot use region {}", shm.display()))?;
    let host = region.protocol();
    let a = host.send_command(cmd, &|| {}, host.ack_timeout(false))?;
    Ok(json!({
        "ok": a.status == 0,
        "guest": shm.display().to_string(),
        "command": words.join(" "),
        "seq": a.seq,
        "ack_status": a.status,
        "ack_status_name": if a.status == 0 { "ok" } else if a.status == -22 { "EINVAL" } else { "error" },
        "groups_enabled": a.groups_enabled,
        "groups_enabled_names": control::group_names(a.groups_enabled),
        "latency_us": a.latency.as_secs_f64() * 1e6,
        "error": (a.status != 0).then(|| format!("the guest refused the command: {}", a.status)),
    }))
}

/// A link's error, whole (its hint too), inside `FtraceError::Link`.
#[derive(Debug)]
pub struct LinkError(pub anyhow::Error);

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for LinkError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl LinkError {
    fn wrap(e: impl Into<anyhow::Error>) -> ftrace::FtraceError {
        ftrace::FtraceError::Link(Box::new(LinkError(e.into())))
    }
}

/// ftrace requests straight into a region (`--shm`).
struct DirectLink(Region);

impl ftrace::FtraceLink for DirectLink {
    fn send(&self, request: &str) -> Result<ftrace::Reply, ftrace::FtraceError> {
        let p = self.0.protocol();
        let a = p
            .send_ftrace(request.as_bytes(), &|| {}, p.ftrace_timeout(false))
            .map_err(LinkError::wrap)?;
        Ok(ftrace::Reply {
            status: a.ack.status,
            text: String::from_utf8_lossy(&a.text).into_owned(),
            more: a.more,
            latency: a.ack.latency,
        })
    }
}

/// ftrace requests through a server's control socket.
struct SocketLink {
    path: PathBuf,
    guest: Option<String>,
}

impl ftrace::FtraceLink for SocketLink {
    fn send(&self, request: &str) -> Result<ftrace::Reply, ftrace::FtraceError> {
        let req = json!({"op": "ftrace", "guest": self.guest, "request": request});
        let answer = via_socket(&self.path, req).map_err(LinkError::wrap)?;
        ftrace::Reply::from_json(&answer)
    }
}

/// `list-events` and `ftrace ...`, directly or through a server.
fn run_ftrace(args: &CtlArgs, path: Option<PathBuf>) -> Result<u64> {
    let cmd = ftrace::parse(&args.command)?;
    match (&args.shm, path) {
        (Some(shm), _) => {
            let region = Region::open(shm, Access::ReadWrite)
                .with_context(|| format!("cannot use region {}", shm.display()))?;
            Ok(ftrace::run(
                &DirectLink(region),
                &cmd,
                &shm.display().to_string(),
            )?)
        }
        (None, Some(path)) => {
            let link = SocketLink {
                path,
                guest: args.guest.clone(),
            };
            Ok(ftrace::run(
                &link,
                &cmd,
                args.guest.as_deref().unwrap_or("(the only one)"),
            )?)
        }
        (None, None) => bail!("no target: --socket or --shm"),
    }
}

/// Runs `ivtrace ctl`. Returns 1 (something was done) or an error.
pub fn run(args: &CtlArgs) -> Result<u64> {
    let words = &args.command;
    let verb = words.first().map(String::as_str).unwrap_or("");
    if ftrace::is_ftrace(words) {
        let path = args.ctl_socket.clone().or_else(|| {
            args.socket
                .as_ref()
                .map(|s| ivtrace_serve::default_ctl_path(s))
        });
        return run_ftrace(args, path);
    }
    if words.len() > 2 {
        bail!("`{verb}` takes at most one argument");
    }
    if let Some(shm) = &args.shm {
        if matches!(verb, "list" | "status" | "handoff" | "resume") {
            bail!("`{verb}` needs a server (--socket); with --shm, send a command");
        }
        let cmd = parse_command(words)?;
        return print_reply(&direct(shm, cmd, words)?, args.json);
    }
    let path = args
        .ctl_socket
        .clone()
        .or_else(|| {
            args.socket
                .as_ref()
                .map(|s| ivtrace_serve::default_ctl_path(s))
        })
        .expect("clap requires a target");
    let req = match verb {
        "list" => json!({"op": "list"}),
        "status" => json!({"op": "status", "guest": args.guest}),
        "handoff" => json!({"op": "handoff", "guest": args.guest}),
        "resume" => json!({"op": "resume", "guest": args.guest, "from": words.get(1)}),
        _ => {
            parse_command(words)?; // say what is wrong before asking
            json!({"op": "control", "guest": args.guest, "command": words})
        }
    };
    print_reply(&via_socket(&path, req)?, args.json)
}
