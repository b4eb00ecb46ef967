//! The `ivtrace` command on top of the recording engine (ivtrace-engine)
//! and the server (ivtrace-serve): `main.rs` only parses arguments and maps
//! outcomes to exit codes; the subcommands live in [`record`],
//! [`snapshot`], [`report`], [`serve`] (its options; the ivshmem server and
//! daemon is ivtrace-serve), [`ctl`] (the client of serve's control socket,
//! in the control language of `ivtrace_serve::control` and
//! `ivtrace_serve::ftrace`) and [`boot`]; [`summary`] prints a recording's
//! summary.

pub mod boot;
pub mod cli;
pub mod ctl;
pub mod export;
pub mod json_out;
pub mod qmp;
pub mod record;
pub mod recover;
pub mod relayd;
pub mod report;
pub mod serve;
pub mod snapshot;
pub mod summary;

/// Exit status: success, events were recorded or reported.
pub const EXIT_OK: i32 = 0;
/// Exit status: the run saw no event at all (none recorded, none lost).
pub const EXIT_NOTHING: i32 = 1;
/// Exit status: an error (arguments, region, output, I/O).
pub const EXIT_ERROR: i32 = 2;

/// A hint for the errors users can do something about.
pub fn hint_for(err: &anyhow::Error) -> Option<String> {
    use ivtrace_region::RegionError as E;
    // An ftrace link's own error sits inside FtraceError::Link (out of
    // the chain): its hint is that error's.
    let link = err.chain().find_map(|e| match e.downcast_ref() {
        Some(ivtrace_serve::ftrace::FtraceError::Link(b)) => b.downcast_ref::<ctl::LinkError>(),
        _ => None,
    });
    if let Some(link) = link {
        return hint_for(&link.0);
    }
    if let Some(u) = err
        .chain()
        .find_map(|e| e.downcast_ref::<ivtrace_engine::UserError>())
    {
        return Some(u.hint.clone());
    }
    // serve's errors hold a UserError or DirError transparently (not in
    // the chain): they give its hint themselves.
    if let Some(hint) = err
        .chain()
        .find_map(|e| e.downcast_ref::<ivtrace_serve::ServeError>())
        .and_then(ivtrace_serve::ServeError::hint)
    {
        return Some(hint);
    }
    if let Some(d) = err
        .chain()
        .find_map(|e| e.downcast_ref::<ivtrace_ctf::dir::DirError>())
    {
        return Some(d.hint().to_string());
    }
    let region = err.chain().find_map(|e| e.downcast_ref::<E>())?;
    Some(
        match region {
            E::Missing { .. } => "start the writer first, or check the path (e.g. /dev/shm/NAME)",
            E::Open { .. } | E::Map { .. } => "check the file's permissions (record needs read-write, snapshot read-only)",
            E::BadMagic { .. } | E::NotFormatted => "is this an ivtrace region? writers format it with ivt_region_create() or the guest module",
            E::AbiMajor { .. } => "the writer and this ivtrace were built from incompatible ABI versions; rebuild both",
            E::SizeMismatch { .. } | E::NotPowerOfTwo(_) | E::TooSmall { .. } => "the file's size does not match its header; was it truncated or reformatted?",
            _ => "the region header is inconsistent: the writer is buggy or hostile; nothing was read",
        }
        .to_string(),
    )
}
