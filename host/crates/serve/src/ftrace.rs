//! `ivtrace ctl ... ftrace ...` and `ivtrace ctl ... list-events`: the
//! guest's ftrace selected from the host, no shell in the guest
//! (docs/ftrace.md "Selecting from the host").
//!
//! Each command people type becomes one or more ftrace requests (`write
//! PATH VALUE`, `append PATH VALUE`, `read PATH OFFSET`) the guest module
//! checks against its list of tracefs files and the relay performs; they
//! go one at a time, in order, and the first refusal stops the rest.

use ivtrace_region::sanitize::Shown;
use std::time::Duration;

use serde_json::{json, Value};
use thiserror::Error;

use ivtrace_region::FtraceAck;

/// Most bytes `list-events` and `ftrace read` fetch (a few round trips of
/// 2 KiB each for the usual ~40 KB of available_events).
const READ_MAX: usize = 4 << 20;

/// What went wrong with an ftrace command: how it was typed (the wording
/// is what `ivtrace ctl` prints), or the guest's or the link's answer.
#[derive(Debug, Error)]
pub enum FtraceError {
    #[error("`{0}` is not an event (system:event, system, or all)")]
    NotAnEvent(String),
    #[error("`{0}` is not a probe name ([A-Za-z_][A-Za-z0-9_]*)")]
    NotAProbeName(String),
    #[error(
        "`ftrace {0} NAME PROBE [FETCHARGS...]` (e.g. `ftrace kprobe myopen \
         'do_sys_openat2 name=+0(%si):ustring'`)"
    )]
    ProbeUsage(String),
    #[error("`ftrace {kind} {name}` needs the probe point")]
    NoProbePoint { kind: String, name: String },
    #[error("`ftrace {sub}` needs {what}")]
    Missing { sub: String, what: &'static str },
    #[error(
        "unknown ftrace command `{0}` (enable, disable, filter, trigger, tracer, functions, \
         notrace, graph, kprobe, kretprobe, uprobe, probe-remove, pid, on, off, buffer-kb, \
         write, append, read)"
    )]
    Unknown(String),
    #[error("`ftrace` needs a command, e.g. `ftrace enable block:block_rq_issue 'nr_sector > 8'`")]
    NoCommand,
    /// The server answered with an error instead of the guest's answer.
    #[error("{0}")]
    Server(String),
    #[error("the guest refused `read {path}`: {errno}", errno = errno_text(*.status))]
    ReadRefused { path: String, status: i32 },
    #[error(
        "the guest refused `{request}` ({errno}); {unsent} later request(s) not sent",
        errno = errno_text(*.status)
    )]
    Refused {
        request: String,
        status: i32,
        unsent: usize,
    },
    /// The link to the guest (the region, the control socket) failed.
    #[error(transparent)]
    Link(Box<dyn std::error::Error + Send + Sync + 'static>),
    #[error("cannot print the guest's answer")]
    Print(#[from] std::io::Error),
}

type Result<T> = std::result::Result<T, FtraceError>;

/// What one `ivtrace ctl` ftrace command does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FtraceCommand {
    /// Requests to send in order.
    Requests(Vec<String>),
    /// Read a whole file (`read PATH` in chunks); for `list-events`, the
    /// lines matching the glob.
    Read { path: String, glob: Option<String> },
}

/// An event spec `system:event`, `system` / `system:*`, or `all` as its
/// directory under tracefs.
fn event_dir(spec: &str) -> Result<String> {
    let (sys, ev) = spec.split_once(':').unwrap_or((spec, "*"));
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    match (sys, ev) {
        ("all" | "*", "*") => Ok("events".into()),
        (s, "*") if ok(s) => Ok(format!("events/{s}")),
        (s, e) if ok(s) && ok(e) => Ok(format!("events/{s}/{e}")),
        _ => Err(FtraceError::NotAnEvent(spec.to_string())),
    }
}

fn rest(words: &[String]) -> String {
    words.join(" ")
}

/// A probe name: `[A-Za-z_][A-Za-z0-9_]*`.
fn probe_name(n: &str) -> Result<&str> {
    let ok = n
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !ok {
        return Err(FtraceError::NotAProbeName(n.to_string()));
    }
    Ok(n)
}

/// `kprobe|kretprobe|uprobe NAME SPEC...`: define the probe, enable it.
fn probe(kind: &str, args: &[String]) -> Result<Vec<String>> {
    let [name, spec @ ..] = args else {
        return Err(FtraceError::ProbeUsage(kind.to_string()));
    };
    let name = probe_name(name)?;
    if spec.is_empty() {
        return Err(FtraceError::NoProbePoint {
            kind: kind.to_string(),
            name: name.to_string(),
        });
    }
    let (file, group, letter) = match kind {
        "kprobe" => ("kprobe_events", "kprobes", "p"),
        "kretprobe" => ("kprobe_events", "kprobes", "r"),
        _ => ("uprobe_events", "uprobes", "p"),
    };
    Ok(vec![
        format!("append {file} {letter}:{group}/{name} {}", rest(spec)),
        format!("write events/{group}/{name}/enable 1"),
    ])
}

/// The requests of `ftrace SUB ARGS...`.
fn ftrace_requests(sub: &str, a: &[String]) -> Result<Vec<String>> {
    let one = |what: &'static str| -> Result<&String> {
        a.first().ok_or_else(|| FtraceError::Missing {
            sub: sub.to_string(),
            what,
        })
    };
    Ok(match sub {
        "enable" => {
            let dir = event_dir(one("an event (system:event, system or all)")?)?;
            let mut r = Vec::new();
            if a.len() > 1 {
                r.push(format!("write {dir}/filter {}", rest(&a[1..])));
            }
            r.push(format!("write {dir}/enable 1"));
            r
        }
        "disable" => vec![format!("write {}/enable 0", event_dir(one("an event")?)?)],
        "filter" => vec![format!(
            "write {}/filter {}",
            event_dir(one("an event")?)?,
            rest(&a[1..])
        )],
        "trigger" => vec![format!(
            "write {}/trigger {}",
            event_dir(one("an event")?)?,
            rest(&a[1..])
        )],
        "tracer" => {
            let mut r = Vec::new();
            if a.len() > 1 {
                r.push(format!("write set_ftrace_filter {}", rest(&a[1..])));
            }
            r.push(format!(
                "write current_tracer {}",
                one("a tracer (function, function_graph, nop)")?
            ));
            r
        }
        "functions" => vec![format!("write set_ftrace_filter {}", rest(a))],
        "notrace" => vec![format!("write set_ftrace_notrace {}", rest(a))],
        "graph" => vec![format!("write set_graph_function {}", rest(a))],
        "kprobe" | "kretprobe" | "uprobe" => probe(sub, a)?,
        "probe-remove" => {
            let n = probe_name(one("a probe name")?)?;
            vec![
                format!("write events/kprobes/{n}/enable 0"),
                format!("append kprobe_events -:kprobes/{n}"),
            ]
        }
        "pid" => vec![
            format!("write set_event_pid {}", rest(a)),
            format!("write set_ftrace_pid {}", rest(a)),
        ],
        "on" => vec!["write tracing_on 1".into()],
        "off" => vec!["write tracing_on 0".into()],
        "buffer-kb" => vec![format!("write buffer_size_kb {}", one("KiB per CPU")?)],
        "write" | "append" => vec![format!(
            "{sub} {} {}",
            one("a tracefs path")?,
            rest(&a[1..])
        )],
        s => return Err(FtraceError::Unknown(s.to_string())),
    })
}

/// Parses `list-events [GLOB]` and `ftrace SUB ARGS...`.
pub fn parse(words: &[String]) -> Result<FtraceCommand> {
    match words {
        [v, glob @ ..] if v == "list-events" => Ok(FtraceCommand::Read {
            path: "available_events".into(),
            glob: glob.first().cloned(),
        }),
        [v, sub, path] if v == "ftrace" && sub == "read" => Ok(FtraceCommand::Read {
            path: path.clone(),
            glob: None,
        }),
        [v, sub, args @ ..] if v == "ftrace" => {
            Ok(FtraceCommand::Requests(ftrace_requests(sub, args)?))
        }
        _ => Err(FtraceError::NoCommand),
    }
}

/// Is this a command of this module?
pub fn is_ftrace(words: &[String]) -> bool {
    matches!(
        words.first().map(String::as_str),
        Some("ftrace" | "list-events")
    )
}

/// `*` and `?` globbing.
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    match (pat.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob_match(&pat[1..], s) || (!s.is_empty() && glob_match(pat, &s[1..])),
        (Some(b'?'), Some(_)) => glob_match(&pat[1..], &s[1..]),
        (Some(p), Some(c)) if p == c => glob_match(&pat[1..], &s[1..]),
        _ => false,
    }
}

/// `-errno` as its name and text.
pub fn errno_text(status: i32) -> String {
    if status == 0 {
        return "ok".into();
    }
    let e = nix::errno::Errno::from_raw(-status);
    format!("{e:?} ({})", e.desc())
}

/// The control socket's reply to one request.
pub fn reply_json(guest: &str, request: &str, a: &FtraceAck) -> Value {
    json!({
        "ok": a.ack.status == 0,
        "guest": guest,
        "request": request,
        "seq": a.ack.seq,
        "ack_status": a.ack.status,
        "ack_status_name": errno_text(a.ack.status),
        "latency_us": a.ack.latency.as_secs_f64() * 1e6,
        "text": String::from_utf8_lossy(&a.text),
        "more": a.more,
        "error": (a.ack.status != 0).then(|| format!(
            "the guest refused `{request}`: {}", errno_text(a.ack.status))),
    })
}

/// How a command reaches the guest: one request in, its answer out.
pub trait FtraceLink {
    fn send(&self, request: &str) -> Result<Reply>;
}

/// One answered request.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub status: i32,
    pub text: String,
    pub more: bool,
    pub latency: Duration,
}

impl Reply {
    pub fn from_json(v: &Value) -> Result<Reply> {
        if v.get("ack_status").is_none() {
            let err = v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("the server refused the request");
            return Err(FtraceError::Server(err.to_string()));
        }
        Ok(Reply {
            status: v["ack_status"].as_i64().unwrap_or(-5) as i32,
            text: v["text"].as_str().unwrap_or("").to_string(),
            more: v["more"].as_bool().unwrap_or(false),
            latency: Duration::from_secs_f64(v["latency_us"].as_f64().unwrap_or(0.0) / 1e6),
        })
    }
}

/// Reads `path` whole, chunk by chunk.
fn read_all(to: &dyn FtraceLink, path: &str) -> Result<String> {
    let mut text = String::new();
    loop {
        let r = to.send(&format!("read {path} {}", text.len()))?;
        if r.status != 0 {
            return Err(FtraceError::ReadRefused {
                path: path.to_string(),
                status: r.status,
            });
        }
        text.push_str(&r.text);
        if !r.more || r.text.is_empty() || text.len() >= READ_MAX {
            return Ok(text);
        }
    }
}

/// Runs `cmd`; prints what it did on stdout. Returns the requests done.
pub fn run(to: &dyn FtraceLink, cmd: &FtraceCommand, guest: &str) -> Result<u64> {
    run_to(to, cmd, guest, &mut std::io::stdout().lock())
}

/// [`run`] printing to `out`. What the guest answers is its own text:
/// shown with control characters escaped (docs/hardening.md).
fn run_to(
    to: &dyn FtraceLink,
    cmd: &FtraceCommand,
    guest: &str,
    out: &mut impl std::io::Write,
) -> Result<u64> {
    match cmd {
        FtraceCommand::Read { path, glob } => {
            let text = read_all(to, path)?;
            for line in text.lines() {
                if glob
                    .as_ref()
                    .is_none_or(|g| glob_match(g.as_bytes(), line.as_bytes()))
                {
                    writeln!(out, "{}", Shown(line))?;
                }
            }
            Ok(1)
        }
        FtraceCommand::Requests(reqs) => {
            for (i, r) in reqs.iter().enumerate() {
                let a = to.send(r)?;
                writeln!(
                    out,
                    "guest {}: {} -> {} in {:.0} ms",
                    Shown(guest),
                    Shown(r),
                    errno_text(a.status),
                    a.latency.as_secs_f64() * 1e3
                )?;
                if a.status != 0 {
                    return Err(FtraceError::Refused {
                        request: r.clone(),
                        status: a.status,
                        unsent: reqs.len().saturating_sub(i).saturating_sub(1),
                    });
                }
            }
            Ok(reqs.len() as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    fn reqs(s: &str) -> Vec<String> {
        match parse(&w(s)).unwrap() {
            FtraceCommand::Requests(r) => r,
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn commands_become_requests() {
        assert_eq!(
            reqs("ftrace enable block:block_rq_issue nr_sector > 8"),
            [
                "write events/block/block_rq_issue/filter nr_sector > 8",
                "write events/block/block_rq_issue/enable 1"
            ]
        );
        assert_eq!(reqs("ftrace enable sched"), ["write events/sched/enable 1"]);
        assert_eq!(reqs("ftrace disable all"), ["write events/enable 0"]);
        assert_eq!(
            reqs("ftrace tracer function_graph vfs_read vfs_write"),
            [
                "write set_ftrace_filter vfs_read vfs_write",
                "write current_tracer function_graph"
            ]
        );
        assert_eq!(
            reqs("ftrace kprobe myopen do_sys_openat2 name=+0(%si):ustring"),
            [
                "append kprobe_events p:kprobes/myopen do_sys_openat2 name=+0(%si):ustring",
                "write events/kprobes/myopen/enable 1"
            ]
        );
        assert_eq!(
            reqs("ftrace pid 12 13"),
            ["write set_event_pid 12 13", "write set_ftrace_pid 12 13"]
        );
        assert_eq!(
            parse(&w("list-events block:*")).unwrap(),
            FtraceCommand::Read {
                path: "available_events".into(),
                glob: Some("block:*".into())
            }
        );
        for bad in [
            "ftrace enable ../x",
            "ftrace kprobe 9x foo",
            "ftrace kprobe x",
            "ftrace bogus",
            "ftrace",
        ] {
            assert!(parse(&w(bad)).is_err(), "{bad}");
        }
    }

    /// A guest that answers `list-events` (or any `ftrace read`) with
    /// escape sequences: they were printed as the guest wrote them (issue
    /// 23, case 6); through `--shm` and through serve the text reaches the
    /// same printer.
    #[test]
    fn what_the_guest_answers_is_shown_escaped() {
        struct Hostile;
        impl FtraceLink for Hostile {
            fn send(&self, _request: &str) -> Result<Reply> {
                Ok(Reply {
                    status: 0,
                    text: "block:a\u{1b}]0;owned\u{7}\nblock:b\u{1b}[2J\u{9b}1m\r\n".into(),
                    more: false,
                    latency: Duration::ZERO,
                })
            }
        }
        let mut out = Vec::new();
        let cmd = parse(&w("list-events block:*")).unwrap();
        run_to(&Hostile, &cmd, "g\u{1b}[1m", &mut out).unwrap();
        let shown = String::from_utf8(out).unwrap();
        assert_eq!(
            shown,
            // (str::lines() takes a \r\n as one line end)
            "block:a\\x1b]0;owned\\x07\nblock:b\\x1b[2J\\u{9b}1m\n"
        );
        let mut out = Vec::new();
        run_to(
            &Hostile,
            &parse(&w("ftrace on")).unwrap(),
            "g\u{1b}[1m",
            &mut out,
        )
        .unwrap();
        assert!(!out.contains(&0x1b), "{}", String::from_utf8_lossy(&out));
    }

    #[test]
    fn globs_match() {
        assert!(glob_match(b"block:*", b"block:block_rq_issue"));
        assert!(glob_match(b"*rq_?ssue", b"block:block_rq_issue"));
        assert!(!glob_match(b"sched:*", b"block:block_rq_issue"));
        assert_eq!(errno_text(-1), "EPERM (Operation not permitted)");
    }
}
