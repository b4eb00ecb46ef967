//! `ivtrace recover DIR`: makes a recording whose recorder died whole and
//! readable (ivtrace-ctf's `recover` does the work).

use anyhow::Result;
use ivtrace_region::sanitize::Shown;

use ivtrace_ctf::recover;
use ivtrace_engine::{session, UserError};

use crate::cli::RecoverArgs;
use crate::summary;

/// Runs `ivtrace recover`. Returns the events the trace holds plus the
/// losses it declares.
pub fn run(args: &RecoverArgs) -> Result<u64> {
    let root = session::open_root(&args.dir, &args.access.policy()?)?;
    let before = ivtrace_ctf::dir::read_sidecar(&root).map_err(|e| UserError {
        message: format!("{} is not an ivtrace recording: {e}", args.dir.display()),
        hint: "pass the directory that `ivtrace record -o` or `ivtrace serve` wrote".into(),
    })?;
    use ivtrace_ctf::sidecar::{STATE_INCOMPLETE, STATE_RECORDING};
    if before.state != STATE_RECORDING && before.state != STATE_INCOMPLETE {
        eprintln!(
            "ivtrace: {} is already {} ({}); checking its files anyway",
            args.dir.display(),
            Shown(&before.state),
            Shown(&before.stop_reason)
        );
    }
    let done = recover::recover(&root, "recovered by `ivtrace recover`")?;
    for (file, packets, cut) in &done.files {
        if *cut > 0 {
            eprintln!(
                "ivtrace: {}: {packets} whole packets kept, {cut} bytes of an incomplete packet cut",
                Shown(file)
            );
        }
    }
    if done.kernel_expanded {
        eprintln!("ivtrace: kernel stream expanded from .kernel-wire/ into kernel/");
    }
    if done.ftrace_kept > 0 {
        eprintln!(
            "ivtrace: warning: {} channels of ftrace pages stay undecoded in .kernel-wire/: \
             their format files are in the guest's region (`ivtrace record --resume` from the \
             same region decodes them)",
            done.ftrace_kept
        );
    }
    summary::print(&done.sidecar, &args.dir, args.json)?;
    Ok(session::events_seen(&done.sidecar))
}
