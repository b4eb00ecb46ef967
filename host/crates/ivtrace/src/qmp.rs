//! The vCPU threads of a QEMU from its QMP socket, for the VM view when
//! QEMU does not name its threads (`-name NAME,debug-threads=on` names
//! them `CPU n/TCG` / `CPU n/KVM`): `query-cpus-fast` answers each vCPU's
//! `cpu-index` and host `thread-id`.
//!
//! QMP speaks one JSON object per line: a greeting, then an answer
//! (`{"return": ...}` or `{"error": ...}`) per command, with asynchronous
//! `{"event": ...}` lines anywhere in between (skipped).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// At most this many lines are read while waiting for one answer.
const LINES_MAX: usize = 1000;
/// An answer line longer than this is refused (a QMP answer for a few
/// hundred vCPUs is far shorter).
const LINE_MAX: u64 = 1 << 20;

fn read_line<R: BufRead>(r: &mut R) -> Result<Value> {
    let mut line = String::new();
    let n = std::io::Read::take(&mut *r, LINE_MAX).read_line(&mut line)?;
    if n == 0 {
        bail!("QMP closed the connection");
    }
    serde_json::from_str(&line).with_context(|| format!("not a QMP message: {}", line.trim()))
}

/// Sends `command`, returns its `return` value.
fn execute(w: &mut impl Write, r: &mut impl BufRead, command: &str) -> Result<Value> {
    writeln!(w, "{{\"execute\": \"{command}\"}}")?;
    for _ in 0..LINES_MAX {
        let v = read_line(r)?;
        if let Some(ret) = v.get("return") {
            return Ok(ret.clone());
        }
        if let Some(err) = v.get("error") {
            bail!("QMP refused {command}: {err}");
        }
    }
    bail!("QMP sent no answer to {command}")
}

/// `query-cpus-fast`'s answer as thread id -> vCPU index.
pub fn parse_cpus(ret: &Value) -> Result<HashMap<i32, u32>> {
    let cpus = ret
        .as_array()
        .context("query-cpus-fast did not return a list")?;
    let mut out = HashMap::new();
    for c in cpus {
        let index = c.get("cpu-index").and_then(Value::as_u64);
        let tid = c.get("thread-id").and_then(Value::as_i64);
        match (index, tid) {
            (Some(i), Some(t)) if t > 0 => {
                out.insert(t as i32, u32::try_from(i).context("cpu-index too large")?);
            }
            _ => bail!("query-cpus-fast entry without cpu-index/thread-id: {c}"),
        }
    }
    Ok(out)
}

/// The vCPU threads (thread id -> vCPU index) of the QEMU whose QMP
/// socket is `path`.
pub fn vcpu_threads(path: &Path) -> Result<HashMap<i32, u32>> {
    let what = || format!("QMP socket {}", path.display());
    let s = UnixStream::connect(path).with_context(what)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .with_context(what)?;
    let mut r = BufReader::new(s.try_clone().with_context(what)?);
    let mut w = s;
    let greeting = read_line(&mut r).with_context(what)?;
    if greeting.get("QMP").is_none() {
        bail!("{} did not greet as QMP: {greeting}", path.display());
    }
    execute(&mut w, &mut r, "qmp_capabilities").with_context(what)?;
    let ret = execute(&mut w, &mut r, "query-cpus-fast").with_context(what)?;
    parse_cpus(&ret).with_context(what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn answers_become_a_thread_map() {
        let v: Value = serde_json::from_str(
            r#"[{"cpu-index": 0, "thread-id": 4242, "target": "x86_64"},
                {"cpu-index": 1, "thread-id": 4243}]"#,
        )
        .unwrap();
        let m = parse_cpus(&v).unwrap();
        assert_eq!(m, [(4242, 0), (4243, 1)].into_iter().collect());
        assert!(parse_cpus(&serde_json::json!([{"cpu-index": 0}])).is_err());
        assert!(parse_cpus(&serde_json::json!({"x": 1})).is_err());
    }

    /// The exchange as QEMU 7.2 performs it (greeting, capabilities, an
    /// asynchronous event in between, the answer).
    #[test]
    fn the_conversation_follows_qmp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let l = UnixListener::bind(&path).unwrap();
        let peer = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            writeln!(
                w,
                r#"{{"QMP": {{"version": {{}}, "capabilities": ["oob"]}}}}"#
            )
            .unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("qmp_capabilities"));
            writeln!(w, r#"{{"return": {{}}}}"#).unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("query-cpus-fast"));
            writeln!(w, r#"{{"event": "RESUME", "timestamp": {{}}}}"#).unwrap();
            writeln!(w, r#"{{"return": [{{"cpu-index": 0, "thread-id": 77}}]}}"#).unwrap();
        });
        assert_eq!(
            vcpu_threads(&path).unwrap(),
            [(77, 0)].into_iter().collect()
        );
        peer.join().unwrap();
        assert!(vcpu_threads(&dir.path().join("none")).is_err());
    }
}
