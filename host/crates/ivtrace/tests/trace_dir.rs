//! A trace directory is input too (issue 23, case 7): whoever can write
//! it can put a FIFO where the sidecar was, or a sidecar of any size.
//! `report` and `recover` open only regular files, read a sidecar up to
//! a limit, and print a bounded number of its warnings.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{ivtrace, ivtrace_shm, run};
use ivtrace_testutil::{RegionBuilder, TestRegion};

/// A finalized recording of 20 events in `dir`/t.
fn recording(dir: &Path) -> PathBuf {
    let mut r = RegionBuilder::new(1, 8, 4096).build_region();
    r.register_loadgen(0);
    for i in 0..20 {
        let payload = TestRegion::loadgen_payload(0, i, b"honest");
        assert!(r.emit(0, 1_000 + i * 100, 0, &payload));
    }
    r.close(0);
    r.close_region();
    let shm = dir.join("region.shm");
    std::fs::write(&shm, &r.bytes).unwrap();
    let out = dir.join("t");
    assert!(run(&mut ivtrace_shm(&["record"], &shm, &out))
        .status
        .success());
    out
}

/// Runs `cmd`, killing it after 30 s (on main, a FIFO blocked it forever):
/// its output, and whether it had to be killed. A watchdog thread kills
/// it; this one reads its output meanwhile (a full pipe must not stall it).
fn run_bounded(cmd: &mut Command) -> (Output, bool) {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let (done, ended) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let timed_out = ended.recv_timeout(Duration::from_secs(30)).is_err();
        if timed_out {
            Command::new("kill").args(["-KILL", &pid]).status().unwrap();
        }
        timed_out
    });
    let out = child.wait_with_output().unwrap();
    let _ = done.send(());
    let killed = watchdog.join().unwrap();
    eprintln!(
        "{cmd:?}: {:?}, killed {killed}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (out, killed)
}

/// A FIFO named `ivtrace.json`: `report` and `recover` blocked forever in
/// its open on main. Now both refuse it at once, saying what it is.
#[test]
fn a_fifo_in_place_of_the_sidecar_is_refused_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let out = recording(tmp.path());
    let sidecar = out.join("ivtrace.json");
    std::fs::remove_file(&sidecar).unwrap();
    nix::unistd::mkfifo(&sidecar, nix::sys::stat::Mode::S_IRWXU).unwrap();
    for cmd in ["report", "recover"] {
        let (o, killed) = run_bounded(ivtrace().arg(cmd).arg(&out));
        assert!(!killed, "`ivtrace {cmd}` blocked on a FIFO");
        assert_eq!(o.status.code(), Some(ivtrace::EXIT_ERROR));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains("not a regular file"), "{stderr}");
    }
}

/// A FIFO in place of a stream file: `report` walks the channel files,
/// and refuses this one at once.
#[test]
fn a_fifo_in_place_of_a_stream_file_is_refused_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let out = recording(tmp.path());
    let stream = out.join("user/user_chan0");
    std::fs::remove_file(&stream).unwrap();
    nix::unistd::mkfifo(&stream, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let (o, killed) = run_bounded(ivtrace().arg("report").arg(&out));
    assert!(!killed, "`ivtrace report` blocked on a FIFO");
    assert_eq!(o.status.code(), Some(ivtrace::EXIT_ERROR));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a regular file"));
}

/// A 300 MB sidecar (sparse: no disk spent): main read it whole. Now it
/// is refused past the limit, with a clear error, without reading it all.
#[test]
fn a_sidecar_past_the_limit_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = recording(tmp.path());
    let sidecar = out.join("ivtrace.json");
    std::fs::File::options()
        .write(true)
        .open(&sidecar)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    for cmd in ["report", "recover"] {
        let (o, killed) = run_bounded(ivtrace().arg(cmd).arg(&out));
        assert!(!killed);
        assert_eq!(o.status.code(), Some(ivtrace::EXIT_ERROR));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains("is larger than 67108864 bytes"), "{stderr}");
    }
}

/// A sidecar with 10,000 warnings (main printed every one): `recover`
/// prints a bounded number and says how many more the sidecar holds.
#[test]
fn a_sidecar_full_of_warnings_prints_a_bounded_number() {
    let tmp = tempfile::tempdir().unwrap();
    let out = recording(tmp.path());
    let path = out.join("ivtrace.json");
    let mut s: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let warnings: Vec<String> = (0..10_000).map(|i| format!("planted {i}")).collect();
    s["warnings"] = serde_json::json!(warnings);
    s["state"] = "recording".into();
    std::fs::write(&path, serde_json::to_vec(&s).unwrap()).unwrap();
    let (o, killed) = run_bounded(ivtrace().arg("recover").arg(&out));
    assert!(!killed);
    assert!(o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    let shown = stderr.lines().filter(|l| l.contains("planted")).count();
    assert!(shown <= 16, "{shown} warnings printed");
    assert!(stderr.contains("9984 more warnings"), "{stderr}");
    assert_eq!(
        common::report_json(&out)["events"],
        20,
        "the trace is whole"
    );
}
