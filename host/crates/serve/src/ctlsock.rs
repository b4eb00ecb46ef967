//! The server side of the control socket (`PATH.ctl`, mode 0600): one JSON
//! request line, one JSON reply line, then the connection closes.
//!
//! ```text
//! {"op":"list"}
//! {"op":"status","guest":"web1"}
//! {"op":"control","guest":"web1","command":["enable","sched,irq"]}
//! {"op":"ftrace","guest":"web1","request":"write events/block/enable 1"}
//! {"op":"handoff","guest":"web1"}                       (the guest migrated away)
//! {"op":"resume","guest":"web1","from":"/path/handoff.json"}  (it arrived)
//! -> {"ok":true,...}  |  {"ok":false,"error":"..."}
//! ```
//!
//! `guest` may be left out when exactly one guest is recording. The guest's
//! own thread posts the command in its region and kicks the guest, so
//! commands never race with its other uses of the region.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;
use serde_json::{json, Value};

use crate::control::{self, parse_command};
use crate::error::Report;
use crate::guest::Request;
use crate::Registry;

/// Longest wait for the whole request line (one deadline: see [`handle`]).
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Longest wait for the reply to be taken by the client.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
const REPLY_TIMEOUT: Duration = Duration::from_secs(15);
/// An ftrace request runs in the guest (a tracer switch: seconds).
const FTRACE_REPLY_TIMEOUT: Duration = Duration::from_secs(60);

fn errno_name(e: i32) -> &'static str {
    match -e {
        0 => "ok",
        1 => "EPERM",
        12 => "ENOMEM",
        16 => "EBUSY",
        19 => "ENODEV",
        22 => "EINVAL",
        28 => "ENOSPC",
        95 => "EOPNOTSUPP",
        _ => "error",
    }
}

/// Handles one control connection (its own short-lived thread). Reading
/// the request has one deadline (`REQUEST_DEADLINE`, 5 s) for the whole
/// line, not a timeout per read: a client that trickles a byte at a time
/// holds its control slot no longer than one that sends nothing.
pub fn handle(conn: UnixStream, registry: &Registry) {
    let _ = conn.set_write_timeout(Some(IO_TIMEOUT));
    let reply = match read_request(&conn, Instant::now() + REQUEST_DEADLINE) {
        Ok(line) => match serde_json::from_slice::<Value>(&line) {
            Ok(req) => answer(&req, registry),
            Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
        },
        Err(e) => json!({"ok": false, "error": format!("no request: {e}")}),
    };
    let mut w = &conn;
    let _ = writeln!(w, "{reply}");
}

/// Longest request line (a request is a few hundred bytes).
const REQUEST_MAX: usize = 64 << 10;

/// The request line of `conn` (without its newline), read before
/// `deadline`: each read waits only for what is left of it.
fn read_request(mut conn: &UnixStream, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no whole request line within {} s",
                    REQUEST_DEADLINE.as_secs()
                ),
            ));
        }
        conn.set_read_timeout(Some(left))?;
        let n = match conn.read(&mut chunk) {
            Ok(0) => return Ok(line),
            Ok(n) => n,
            // A timed-out read (WouldBlock on a socket): the deadline
            // check above says so.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        let got = chunk.get(..n).unwrap_or_default();
        if let Some(end) = got.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(got.get(..end).unwrap_or_default());
            return Ok(line);
        }
        line.extend_from_slice(got);
        if line.len() > REQUEST_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a request line longer than {REQUEST_MAX} bytes"),
            ));
        }
    }
}

fn answer(req: &Value, registry: &Registry) -> Value {
    let op = req.get("op").and_then(Value::as_str).unwrap_or("");
    if op == "list" {
        return list(registry);
    }
    let guest = match find_guest(req.get("guest").and_then(Value::as_str), registry) {
        Ok(g) => g,
        Err(reply) => return reply,
    };
    match op {
        "status" => status(&guest),
        "control" => control(req, &guest),
        "ftrace" => ftrace(req, &guest),
        "handoff" => migration(&guest, "handoff", |reply| Request::Handoff { reply }),
        "resume" => {
            let from = req.get("from").and_then(Value::as_str).map(PathBuf::from);
            migration(&guest, "resume", |reply| Request::Resume { from, reply })
        }
        _ => json!({"ok": false, "error": format!(
            "unknown op `{op}` (list, status, control, ftrace, handoff, resume)")}),
    }
}

/// A live guest's name and the way to ask its thread.
struct Live {
    name: String,
    requests: mpsc::Sender<Request>,
    wake: Arc<EventFd>,
}

impl Live {
    /// Sends `req` and wakes the thread; false if it has finished.
    fn ask(&self, req: Request) -> bool {
        if self.requests.send(req).is_err() {
            return false;
        }
        let _ = self.wake.write(1);
        true
    }
}

/// The live guest named `want`, or the only live one; else the reply
/// that says why not.
fn find_guest(want: Option<&str>, registry: &Registry) -> Result<Live, Value> {
    let guests = registry.guests.lock().expect("lock");
    let live: Vec<_> = guests.iter().collect();
    let found = match want {
        Some(n) => live.iter().find(|g| g.name == n).copied(),
        None if live.len() == 1 => Some(live[0]),
        None => None,
    };
    let Some(g) = found else {
        let names: Vec<&str> = live.iter().map(|g| g.name.as_str()).collect();
        return Err(json!({"ok": false, "error": match want {
            Some(n) => format!("no live guest named `{n}` (live: {})", names.join(", ")),
            None if names.is_empty() => "no live guest (`ivtrace ctl list` shows who connected)".to_string(),
            None => format!("{} live guests: name one with --guest ({})", names.len(), names.join(", ")),
        }}));
    };
    let _ = g.wake.write(1);
    Ok(Live {
        name: g.name.clone(),
        requests: g.requests.clone(),
        wake: Arc::clone(&g.wake),
    })
}

/// `handoff` and `resume`: asks the guest's thread, relays its answer.
fn migration(
    guest: &Live,
    op: &str,
    make: impl FnOnce(mpsc::Sender<Result<String, String>>) -> Request,
) -> Value {
    let name = &guest.name;
    let (rtx, rrx) = mpsc::channel();
    if !guest.ask(make(rtx)) {
        return json!({"ok": false, "error": format!("guest `{name}` has finished")});
    }
    match rrx.recv_timeout(REPLY_TIMEOUT) {
        Ok(Ok(what)) => json!({"ok": true, "guest": name, "op": op, "result": what}),
        Ok(Err(e)) => json!({"ok": false, "guest": name, "error": e}),
        Err(_) => {
            json!({"ok": false, "guest": name, "error": "the guest thread did not answer in time"})
        }
    }
}

fn status(guest: &Live) -> Value {
    let name = &guest.name;
    let (rtx, rrx) = mpsc::channel();
    if !guest.ask(Request::Status { reply: rtx }) {
        return json!({"ok": false, "error": format!("guest `{name}` has finished")});
    }
    match rrx.recv_timeout(REPLY_TIMEOUT) {
        Ok(s) => json!({"ok": true, "guest": s}),
        Err(_) => json!({"ok": false, "error": format!("guest `{name}` did not answer")}),
    }
}

fn control(req: &Value, guest: &Live) -> Value {
    let name = &guest.name;
    let words: Vec<String> = req
        .get("command")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let cmd = match parse_command(&words) {
        Ok(c) => c,
        Err(e) => return json!({"ok": false, "error": format!("{}", Report(&e))}),
    };
    let (rtx, rrx) = mpsc::channel();
    if !guest.ask(Request::Control { cmd, reply: rtx }) {
        return json!({"ok": false, "error": format!("guest `{name}` has finished")});
    }
    match rrx.recv_timeout(REPLY_TIMEOUT) {
        Ok(Ok(a)) => json!({
            "ok": a.status == 0,
            "guest": name,
            "command": words.join(" "),
            "seq": a.seq,
            "ack_status": a.status,
            "ack_status_name": errno_name(a.status),
            "groups_enabled": a.groups_enabled,
            "groups_enabled_names": control::group_names(a.groups_enabled),
            "latency_us": a.latency.as_secs_f64() * 1e6,
            "error": (a.status != 0).then(|| format!(
                "the guest refused the command: {} ({})", a.status, errno_name(a.status))),
        }),
        Ok(Err(e)) => json!({"ok": false, "guest": name, "error": e}),
        Err(_) => {
            json!({"ok": false, "guest": name, "error": "the guest thread did not answer in time"})
        }
    }
}

/// One ftrace request: the guest's status and, for a read, the text.
fn ftrace(req: &Value, guest: &Live) -> Value {
    let name = &guest.name;
    let Some(text) = req.get("request").and_then(Value::as_str) else {
        return json!({"ok": false, "error": "an ftrace request needs `request`"});
    };
    let (rtx, rrx) = mpsc::channel();
    let ask = Request::Ftrace {
        text: text.to_string(),
        reply: rtx,
    };
    if !guest.ask(ask) {
        return json!({"ok": false, "error": format!("guest `{name}` has finished")});
    }
    match rrx.recv_timeout(FTRACE_REPLY_TIMEOUT) {
        Ok(Ok(a)) => crate::ftrace::reply_json(name, text, &a),
        Ok(Err(e)) => json!({"ok": false, "guest": name, "error": e}),
        Err(_) => {
            json!({"ok": false, "guest": name, "error": "the guest thread did not answer in time"})
        }
    }
}

fn list(registry: &Registry) -> Value {
    // The last finished guests (oldest first), then fresh numbers from
    // the live ones.
    let mut out: Vec<Value> = registry
        .finished
        .lock()
        .expect("lock")
        .iter()
        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
        .collect();
    let entries: Vec<_> = {
        let mut guests: Vec<_> = registry
            .guests
            .lock()
            .expect("lock")
            .iter()
            .map(|g| {
                (
                    g.id,
                    g.requests.clone(),
                    Arc::clone(&g.wake),
                    Arc::clone(&g.status),
                )
            })
            .collect();
        guests.sort_by_key(|g| g.0);
        guests
    };
    for (_, requests, wake, status) in entries {
        let mut s = status.lock().map(|s| s.clone()).unwrap_or_default();
        let (rtx, rrx) = mpsc::channel();
        if requests.send(Request::Status { reply: rtx }).is_ok() {
            let _ = wake.write(1);
            if let Ok(fresh) = rrx.recv_timeout(REPLY_TIMEOUT) {
                s = fresh;
            }
        }
        out.push(serde_json::to_value(s).unwrap_or(Value::Null));
    }
    json!({"ok": true, "guests": out})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that sends its request a byte at a time, each within the
    /// old per-read timeout, took a control slot for as long as it liked
    /// (issue 23, case 8): the deadline is for the whole line.
    #[test]
    fn a_trickled_request_meets_one_deadline() {
        let (server, client) = UnixStream::pair().unwrap();
        let trickler = std::thread::spawn(move || {
            let mut c = &client;
            for b in b"{\"op\":\"list\"}\n" {
                if c.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let deadline = Instant::now() + Duration::from_millis(300);
        let err = read_request(&server, deadline).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        drop(server);
        trickler.join().unwrap();
        let (server, client) = UnixStream::pair().unwrap();
        (&client).write_all(b"{\"op\":\"list\"}\nrest").unwrap();
        let line = read_request(&server, Instant::now() + REQUEST_DEADLINE).unwrap();
        assert_eq!(line, b"{\"op\":\"list\"}");
    }
}
