//! Output directories held by descriptor: every file and directory of a
//! trace is created relative to a directory descriptor the recorder holds,
//! never through a path someone else could swap.
//!
//! The danger this closes: `ivtrace serve -o /tmp/traces` run by root,
//! where `/tmp/traces` belongs to another user. That user may rename a
//! guest's directory away and put a symbolic link in its place; a recorder
//! that writes `/tmp/traces/web1/user/user_chan0` by path then writes
//! wherever the link points, as root. Here:
//!
//! - the output root is opened once (`O_DIRECTORY | O_NOFOLLOW`) and
//!   checked on the descriptor: it must belong to us and be writable by
//!   nobody else (no group or other write bit), unless the operator says
//!   it may be shared ([`OutputPolicy::allow_shared`]);
//! - every directory below is made with `mkdirat` and opened with `openat`
//!   (`O_NOFOLLOW`) relative to its parent's descriptor, and checked to be
//!   ours; every file is created with `O_CREAT | O_EXCL | O_NOFOLLOW`
//!   relative to its directory's descriptor. A swapped path then changes
//!   nothing: the descriptors still name the directories we made;
//! - directories are 0750 and files 0640 (set with fchmod, whatever the
//!   umask), in the group the operator names ([`OutputPolicy::group`]),
//!   so that a group can read traces and nobody else can.
//!
//! Names handed to an [`OutDir`] are the host's own (`user_chan3`,
//! `metadata`, a sanitized guest name): a name with `/`, or `.`/`..`, is
//! refused, so no name can leave the directory either.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, FileStat, Mode, SFlag};
use nix::unistd::{self, Gid, Uid, UnlinkatFlags};
use thiserror::Error;

/// Mode of every directory ivtrace creates in an output.
pub const DIR_MODE: u32 = 0o750;
/// Mode of every file ivtrace creates in an output.
pub const FILE_MODE: u32 = 0o640;

/// How an output root may be used and what its files look like.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputPolicy {
    /// Group of every directory and file created (None: the process's).
    pub group: Option<Gid>,
    /// Accept a root that another user owns or others may write. The
    /// files are still created through descriptors, so nothing lands
    /// outside; but others can move the traces away or read the names.
    pub allow_shared: bool,
}

/// Why an output root is not used.
#[derive(Debug, Error)]
pub enum OutDirError {
    #[error("output root {path} {why}")]
    Shared { path: String, why: String },
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: io::Error,
    },
}

impl OutDirError {
    /// What the operator can do about it.
    pub fn hint(&self) -> &'static str {
        match self {
            OutDirError::Shared { .. } => {
                "use a directory only you can write (e.g. mkdir -m 0750 DIR), or pass \
                 --allow-shared-output if every user who can write there is trusted"
            }
            OutDirError::Io { .. } => "check the path and its permissions",
        }
    }
}

/// Resolves `--group NAME|GID` and checks that this process may give files
/// to it (root, or a member).
pub fn resolve_group(spec: &str) -> Result<Gid, String> {
    let gid = match spec.parse::<u32>() {
        Ok(n) => Gid::from_raw(n),
        Err(_) => match unistd::Group::from_name(spec) {
            Ok(Some(g)) => g.gid,
            Ok(None) => return Err(format!("no group named `{spec}`")),
            Err(e) => return Err(format!("cannot look up group `{spec}`: {e}")),
        },
    };
    let member =
        unistd::getegid() == gid || unistd::getgroups().is_ok_and(|groups| groups.contains(&gid));
    if !Uid::effective().is_root() && !member {
        return Err(format!(
            "this process is not root and not in group `{spec}`, so it cannot give files to it"
        ));
    }
    Ok(gid)
}

/// A directory of an output, held by descriptor (cheap to clone: the
/// descriptor is shared).
#[derive(Debug, Clone)]
pub struct OutDir {
    fd: Arc<OwnedFd>,
    /// For messages only; never opened.
    path: PathBuf,
    group: Option<Gid>,
}

fn io_err(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// A host-chosen name: one path component, not `.` or `..`.
fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{name}` is not a plain file name (a bug: names are host-chosen)"),
        ));
    }
    Ok(())
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

fn is_regular(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG
}

/// What is wrong with a root we may not share, if anything.
fn shared_because(st: &FileStat) -> Option<String> {
    let me = Uid::effective().as_raw();
    if st.st_uid != me {
        return Some(format!(
            "belongs to uid {}, not to this process (uid {me}): its owner could replace a \
             trace directory with a link to anywhere",
            st.st_uid
        ));
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Some(format!(
            "is writable by its group or by everyone (mode {mode:04o}): they could replace \
             a trace directory with a link to anywhere"
        ));
    }
    None
}

impl OutDir {
    /// Opens the output root `path`, creating it (mode 0750) if missing.
    /// A root that is a symbolic link is refused; one that another user
    /// owns or others may write is refused unless the policy allows it.
    pub fn root(path: &Path, policy: &OutputPolicy) -> Result<OutDir, OutDirError> {
        let shown = path.display().to_string();
        let io = |what: &'static str| {
            let shown = shown.clone();
            move |source: io::Error| OutDirError::Io {
                what,
                path: shown,
                source,
            }
        };
        let created = match std::fs::symlink_metadata(path) {
            Ok(_) => false,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path).map_err(io("create"))?;
                true
            }
            Err(e) => return Err(io("inspect")(e)),
        };
        let fd = open_dir_at(None, path.as_os_str()).map_err(io("open"))?;
        let dir = OutDir {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
            group: policy.group,
        };
        let st = dir.stat().map_err(io("inspect"))?;
        if created && st.st_uid == Uid::effective().as_raw() {
            dir.set_owner_and_mode(DIR_MODE)
                .map_err(io("set the mode of"))?;
        } else if let Some(why) = shared_because(&st) {
            if !policy.allow_shared {
                return Err(OutDirError::Shared { path: shown, why });
            }
            eprintln!(
                "ivtrace: warning: output root {shown} {why} (allowed by --allow-shared-output)"
            );
        }
        Ok(dir)
    }

    /// The directory's path when it was opened (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path()/name`, for messages.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn stat(&self) -> io::Result<FileStat> {
        stat::fstat(self.raw()).map_err(io_err)
    }

    fn set_owner_and_mode(&self, mode: u32) -> io::Result<()> {
        set_owner_and_mode(self.raw(), self.group, mode)
    }

    /// Creates directory `name` (0750, our group) and opens it. It must
    /// not exist (`AlreadyExists` otherwise: callers pick another name).
    pub fn create_dir(&self, name: &str) -> io::Result<OutDir> {
        check_name(name)?;
        // 0700 until the group and mode are set: no window for others.
        stat::mkdirat(Some(self.raw()), name, Mode::from_bits_truncate(0o700)).map_err(io_err)?;
        let dir = self.open_dir(name)?;
        dir.set_owner_and_mode(DIR_MODE)?;
        Ok(dir)
    }

    /// Opens the existing directory `name` (never through a link); it must
    /// be ours.
    pub fn open_dir(&self, name: &str) -> io::Result<OutDir> {
        check_name(name)?;
        let fd = open_dir_at(Some(self.raw()), OsStr::new(name))?;
        let st = stat::fstat(fd.as_raw_fd()).map_err(io_err)?;
        if st.st_uid != Uid::effective().as_raw() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} belongs to uid {}, not to us",
                    self.join(name).display(),
                    st.st_uid
                ),
            ));
        }
        Ok(OutDir {
            fd: Arc::new(fd),
            path: self.join(name),
            group: self.group,
        })
    }

    /// Creates file `name` (0640, our group) for writing; it must not exist.
    pub fn create_file(&self, name: &str) -> io::Result<File> {
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        let f = self.open_file(name, flags, 0o600)?;
        set_owner_and_mode(f.as_raw_fd(), self.group, FILE_MODE)?;
        Ok(f)
    }

    /// An unnamed file in this directory (`O_TMPFILE`; where the file
    /// system has none, a hidden file removed at once): scratch space that
    /// disappears when closed, even if the process dies.
    pub fn create_unnamed(&self) -> io::Result<File> {
        let flags = OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC;
        match fcntl::openat(
            Some(self.raw()),
            ".",
            flags,
            Mode::from_bits_truncate(0o600),
        ) {
            // SAFETY: openat returned a new descriptor that nothing else owns.
            Ok(fd) => return Ok(unsafe { File::from_raw_fd(fd) }),
            Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL) => {}
            Err(e) => return Err(io_err(e)),
        }
        for n in 0..1000u32 {
            let name = format!(".scratch-{}-{n}", std::process::id());
            let flags = OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL;
            match self.open_file(&name, flags, 0o600) {
                Ok(f) => {
                    self.remove_file(&name)?;
                    return Ok(f);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("no free scratch file name in {}", self.path.display()),
        ))
    }

    /// Opens the existing regular file `name` for appending.
    pub fn open_append(&self, name: &str) -> io::Result<File> {
        self.open_existing(name, OFlag::O_WRONLY | OFlag::O_APPEND)
    }

    /// Opens the existing regular file `name` for reading.
    pub fn open_read(&self, name: &str) -> io::Result<File> {
        self.open_existing(name, OFlag::O_RDONLY)
    }

    /// Opens the existing regular file `name` for reading and writing.
    pub fn open_rw(&self, name: &str) -> io::Result<File> {
        self.open_existing(name, OFlag::O_RDWR)
    }

    fn open_existing(&self, name: &str, flags: OFlag) -> io::Result<File> {
        let f = self.open_file(name, flags, 0)?;
        let st = stat::fstat(f.as_raw_fd()).map_err(io_err)?;
        if !is_regular(&st) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", self.join(name).display()),
            ));
        }
        Ok(f)
    }

    fn open_file(&self, name: &str, flags: OFlag, mode: u32) -> io::Result<File> {
        check_name(name)?;
        let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
        let fd = fcntl::openat(
            Some(self.raw()),
            name,
            flags,
            Mode::from_bits_truncate(mode),
        )
        .map_err(io_err)?;
        // SAFETY: openat returned a new descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Replaces `name` with `bytes` through a hidden temporary file
    /// (`.name.tmp`) and a rename, so readers see the old or the new file,
    /// never a part.
    pub fn write_atomically(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = format!(".{name}.tmp");
        match self.remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = self.create_file(&tmp)?;
        let written = f.write_all(bytes).and_then(|()| f.sync_data());
        if let Err(e) = written {
            let _ = self.remove_file(&tmp);
            return Err(e);
        }
        self.rename(&tmp, name)
    }

    /// Renames `from` to `to` inside this directory.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        check_name(from)?;
        check_name(to)?;
        fcntl::renameat(Some(self.raw()), from, Some(self.raw()), to).map_err(io_err)
    }

    /// Removes file (or link) `name`.
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        unistd::unlinkat(Some(self.raw()), name, UnlinkatFlags::NoRemoveDir).map_err(io_err)
    }

    /// What `name` is, without following a link: None if it does not exist.
    pub fn kind(&self, name: &str) -> io::Result<Option<EntryKind>> {
        check_name(name)?;
        match stat::fstatat(Some(self.raw()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if is_dir(&st) => Ok(Some(EntryKind::Dir)),
            Ok(st) if is_regular(&st) => Ok(Some(EntryKind::File)),
            Ok(_) => Ok(Some(EntryKind::Other)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(io_err(e)),
        }
    }

    /// The names in this directory (not `.` and `..`), unsorted.
    pub fn entries(&self) -> io::Result<Vec<String>> {
        let fd = fcntl::openat(
            Some(self.raw()),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err)?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(io_err)?;
        let mut names = Vec::new();
        for e in dir.iter() {
            let e = e.map_err(io_err)?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(String::from_utf8_lossy(n).into_owned());
            }
        }
        Ok(names)
    }

    /// Removes `name` and, if it is a directory, everything in it; never
    /// follows a link (a link is removed, not its target).
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        match self.kind(name)? {
            None => Ok(()),
            Some(EntryKind::Dir) => {
                let sub = self.open_dir(name)?;
                for entry in sub.entries()? {
                    sub.remove_tree(&entry)?;
                }
                unistd::unlinkat(Some(self.raw()), name, UnlinkatFlags::RemoveDir).map_err(io_err)
            }
            Some(_) => self.remove_file(name),
        }
    }
}

/// What a directory entry is (links are `Other`: never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Other,
}

fn open_dir_at(dir: Option<RawFd>, name: &OsStr) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = fcntl::openat(dir, name.as_bytes(), flags, Mode::empty()).map_err(|e| {
        if e == Errno::ELOOP {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "it is a symbolic link (refused: it could point anywhere)",
            )
        } else {
            io_err(e)
        }
    })?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Gives `fd` to `group` (if any), then sets `mode` exactly (after the
/// chown, which may clear set-id bits).
fn set_owner_and_mode(fd: RawFd, group: Option<Gid>, mode: u32) -> io::Result<()> {
    if let Some(gid) = group {
        unistd::fchown(fd, None, Some(gid)).map_err(io_err)?;
    }
    stat::fchmod(fd, Mode::from_bits_truncate(mode)).map_err(io_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn created_entries_have_the_trace_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let root = OutDir::root(&tmp.path().join("out"), &OutputPolicy::default()).unwrap();
        assert_eq!(mode(&tmp.path().join("out")), DIR_MODE);
        let d = root.create_dir("web1").unwrap();
        let mut f = d.create_file("user_chan0").unwrap();
        f.write_all(b"x").unwrap();
        d.write_atomically("metadata", b"/* CTF 1.8 */").unwrap();
        assert_eq!(mode(&tmp.path().join("out/web1")), DIR_MODE);
        assert_eq!(mode(&tmp.path().join("out/web1/user_chan0")), FILE_MODE);
        assert_eq!(mode(&tmp.path().join("out/web1/metadata")), FILE_MODE);
        assert!(d.create_file("user_chan0").is_err(), "never reuses a file");
        assert!(root.create_dir("web1").is_err());
        assert!(d.create_file("../escape").is_err() && d.create_dir("..").is_err());
    }

    #[test]
    fn a_swapped_directory_does_not_redirect_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let root = OutDir::root(&tmp.path().join("out"), &OutputPolicy::default()).unwrap();
        let d = root.create_dir("web1").unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        // Someone moves web1 away and links the name to another directory.
        std::fs::rename(tmp.path().join("out/web1"), tmp.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join("out/web1")).unwrap();
        d.create_file("user_chan0").unwrap();
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        assert!(tmp.path().join("moved/user_chan0").exists());
        assert!(root.open_dir("web1").is_err(), "links are never followed");
        root.remove_tree("web1").unwrap();
        assert!(
            elsewhere.exists(),
            "removing a link leaves its target alone"
        );
    }

    #[test]
    fn a_root_that_is_a_link_or_open_to_others_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o750)).unwrap();
        std::os::unix::fs::symlink(&real, tmp.path().join("link")).unwrap();
        let policy = OutputPolicy::default();
        assert!(OutDir::root(&tmp.path().join("link"), &policy).is_err());
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = OutDir::root(&real, &policy).unwrap_err();
        assert!(matches!(err, OutDirError::Shared { .. }), "{err}");
        let shared = OutputPolicy {
            allow_shared: true,
            ..OutputPolicy::default()
        };
        OutDir::root(&real, &shared).unwrap();
        if Uid::effective().is_root() {
            std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755)).unwrap();
            unistd::chown(&real, Some(Uid::from_raw(65534)), None).unwrap();
            assert_eq!(std::fs::metadata(&real).unwrap().uid(), 65534);
            let err = OutDir::root(&real, &policy).unwrap_err();
            assert!(err.to_string().contains("belongs to uid 65534"), "{err}");
        }
    }

    #[test]
    fn remove_tree_never_follows_links() {
        let tmp = tempfile::tempdir().unwrap();
        let root = OutDir::root(&tmp.path().join("out"), &OutputPolicy::default()).unwrap();
        let keep = tmp.path().join("keep");
        std::fs::create_dir(&keep).unwrap();
        std::fs::write(keep.join("precious"), b"x").unwrap();
        let d = root.create_dir("user").unwrap();
        d.create_file("user_chan0").unwrap();
        std::os::unix::fs::symlink(&keep, tmp.path().join("out/user/link")).unwrap();
        root.remove_tree("user").unwrap();
        assert!(keep.join("precious").exists());
        assert_eq!(root.kind("user").unwrap(), None);
    }
}
