//! Who may connect to serve's sockets besides their owner: one group per
//! socket (`--socket-group` for QEMU, `--ctl-group` for `ivtrace ctl`),
//! given read-write access (mode 0660). Without a group a socket stays
//! 0600, as [`super::bind_socket`] creates it.
//!
//! Connecting to a Unix socket needs write permission on its file, so the
//! group and mode bits are the whole access control; the directory that
//! holds the sockets must also be searchable by that group (the systemd
//! unit's /run/ivtrace is 0755).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::unistd::{chown, Gid, Group};

use ivtrace_engine::UserError;

use crate::{Result, ServeError};

/// A group resolved before any socket exists, so a wrong name fails the
/// start instead of leaving sockets nobody may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketGroup {
    pub gid: Gid,
}

/// `name` (or a numeric gid) as a group; `None` for an absent or empty
/// option (the unit passes an empty value to mean "owner only").
pub fn resolve_group(option: &str, name: Option<&str>) -> Result<Option<SocketGroup>> {
    let Some(name) = name.map(str::trim).filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(Some(SocketGroup {
            gid: Gid::from_raw(gid),
        }));
    }
    let found = Group::from_name(name)
        .map_err(|e| ServeError::io(format!("look up group {name}"))(e.into()))?;
    match found {
        Some(g) => Ok(Some(SocketGroup { gid: g.gid })),
        None => Err(UserError {
            message: format!("{option} {name}: no such group"),
            hint: "create the group, or name another one (the systemd unit takes it from \
                   /etc/default/ivtrace; an empty value keeps the socket owner-only). \
                   libvirt's QEMU runs as group libvirt-qemu once libvirt-daemon-system is installed"
                .into(),
        }
        .into()),
    }
}

/// Gives `group` read-write access to the socket at `path` (group owner,
/// mode 0660). The socket was born 0600, so nobody else could connect
/// before this: access only ever widens to what was asked.
pub fn grant(path: &Path, group: Option<SocketGroup>) -> Result<()> {
    let Some(group) = group else {
        return Ok(());
    };
    chown(path, None, Some(group.gid)).map_err(|e| {
        ServeError::io(format!(
            "give {} to group {} (needs CAP_CHOWN or membership of the group)",
            path.display(),
            group.gid
        ))(e.into())
    })?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o660))
        .map_err(ServeError::io(format!("make {} mode 0660", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn empty_and_absent_groups_mean_owner_only() {
        assert_eq!(resolve_group("--socket-group", None).unwrap(), None);
        assert_eq!(resolve_group("--socket-group", Some(" ")).unwrap(), None);
    }

    #[test]
    fn unknown_groups_are_refused_with_a_hint() {
        let err = resolve_group("--socket-group", Some("no-such-group-ivt")).unwrap_err();
        let ServeError::User(user) = &err else {
            panic!("not a UserError: {err:?}")
        };
        assert!(
            user.message.contains("no-such-group-ivt"),
            "{}",
            user.message
        );
        assert!(err.hint().is_some_and(|h| h.contains("libvirt-qemu")));
    }

    #[test]
    fn granting_sets_group_and_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("s.sock");
        let _l = super::super::bind_socket(&p).unwrap();
        // Our own primary group: allowed without privileges.
        let gid = nix::unistd::getegid();
        let group = resolve_group("--ctl-group", Some(&gid.as_raw().to_string())).unwrap();
        grant(&p, group).unwrap();
        let m = fs::metadata(&p).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o777), (gid.as_raw(), 0o660));
    }
}
