//! Process limits a recording needs: every recording holds a descriptor
//! per stream file and per channel's staging file, so front ends raise the
//! descriptor limit before they start.

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns (before, now).
pub fn raise_nofile_limit() -> (u64, u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return (1024, 1024);
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return (soft, hard);
    }
    (soft, soft)
}
