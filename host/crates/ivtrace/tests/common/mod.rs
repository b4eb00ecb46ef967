//! What the CLI tests share: running `ivtrace` and reading its report.

use std::path::Path;
use std::process::{Command, Output};

/// The `ivtrace` built with these tests, or `IVTRACE_BIN` (another build,
/// e.g. an older one, to see a test fail against it).
pub fn ivtrace() -> Command {
    match std::env::var_os("IVTRACE_BIN") {
        Some(bin) => Command::new(bin),
        None => Command::new(env!("CARGO_BIN_EXE_ivtrace")),
    }
}

/// `ivtrace ARGS --shm SHM -o OUT` (record, snapshot).
pub fn ivtrace_shm(args: &[&str], shm: &Path, out: &Path) -> Command {
    let mut cmd = ivtrace();
    cmd.args(args).arg("--shm").arg(shm).arg("-o").arg(out);
    cmd
}

/// Runs `cmd` and logs the command, its status and output.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("command runs");
    eprintln!(
        "{cmd:?}\nstatus {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `ivtrace report DIR --json`, which must succeed.
pub fn report_json(dir: &Path) -> serde_json::Value {
    let out = run(ivtrace().arg("report").arg(dir).arg("--json"));
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}
