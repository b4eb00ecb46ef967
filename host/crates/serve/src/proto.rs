//! The ivshmem server protocol (docs/ivshmem.md "The server protocol", QEMU 7.2), the
//! peer's identity, and the region file each connection gets.
//!
//! On accept the server sends, one 8-byte little-endian int64 per
//! `sendmsg` with at most one descriptor each:
//!
//! ```text
//! 0                      protocol version
//! GUEST_ID               the client's own id (its IVPosition)
//! -1    + shm fd         the shared memory
//! HOST_ID + eventfd k    k = 0..vectors-1: the client rings us (doorbells)
//! GUEST_ID + eventfd k   k = 0..vectors-1: we interrupt the client (MSI-X k)
//! ```
//!
//! QEMU reads the first three synchronously in device realize (it hangs
//! without them) and crashes if its own-id descriptors come before the
//! shm message, so the order is fixed. Each connection is its own ivshmem
//! "world" (its own region and descriptors), so every guest is id 0 (the
//! only id `master=on` migration accepts) and the host is id 1.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::{Result, ServeError};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{self, sockopt, ControlMessage, MsgFlags};

/// `IVSHMEM_PROTOCOL_VERSION`.
pub const PROTOCOL_VERSION: i64 = 0;
/// The guest's peer id (IVPosition) on its own connection.
pub const GUEST_ID: i64 = 0;
/// The host's peer id: the guest rings `(HOST_ID << 16) | vector`.
pub const HOST_ID: i64 = 1;
/// The shared-memory message.
pub const SHM_MSG: i64 = -1;

/// Sends one protocol message (`value`, optionally one descriptor).
pub fn send_msg(sock: &UnixStream, value: i64, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let bytes = value.to_le_bytes();
    let iov = [IoSlice::new(&bytes)];
    let raw = fd.map(|f| [f.as_raw_fd()]);
    let cmsgs: Vec<ControlMessage> = raw
        .as_ref()
        .map(|r| vec![ControlMessage::ScmRights(r)])
        .unwrap_or_default();
    let n = socket::sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if n != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write of a protocol message ({n} of 8 bytes)"),
        ));
    }
    Ok(())
}

/// The descriptors of one connection.
pub struct Eventfds {
    /// Guest -> host doorbells, vector k (non-blocking, we read them).
    pub host_rx: Vec<EventFd>,
    /// Host -> guest interrupts, MSI-X vector k (we write them).
    pub guest_rx: Vec<EventFd>,
}

fn eventfd() -> Result<EventFd> {
    EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        .map_err(ServeError::sys("eventfd"))
}

/// Runs the server side of the handshake on `sock`.
pub fn handshake(sock: &UnixStream, shm: &File, vectors: u32) -> Result<Eventfds> {
    let host_rx = (0..vectors)
        .map(|_| eventfd())
        .collect::<Result<Vec<_>>>()?;
    let guest_rx = (0..vectors)
        .map(|_| eventfd())
        .collect::<Result<Vec<_>>>()?;
    let step = |what: &'static str, v: i64, fd: Option<BorrowedFd<'_>>| {
        send_msg(sock, v, fd).map_err(|source| ServeError::Send { what, source })
    };
    step("the protocol version", PROTOCOL_VERSION, None)?;
    step("the client id", GUEST_ID, None)?;
    step("the shared memory", SHM_MSG, Some(shm.as_fd()))?;
    for fd in &host_rx {
        step("a host doorbell eventfd", HOST_ID, Some(fd.as_fd()))?;
    }
    for fd in &guest_rx {
        step("a guest interrupt eventfd", GUEST_ID, Some(fd.as_fd()))?;
    }
    Ok(Eventfds { host_rx, guest_rx })
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    pub pid: Option<i32>,
    pub uid: Option<u32>,
    /// From QEMU's `-name`, sanitized; None if it has none.
    pub qemu_name: Option<String>,
    /// The process's executable name (`comm`), for the log.
    pub comm: String,
    /// QEMU was started with `-incoming`: the guest arrives by migration,
    /// and its region holds nothing readable until the migration is over
    /// (docs/migration.md).
    pub incoming: bool,
}

/// SO_PEERCRED, then `/proc/<pid>/cmdline` and `comm`.
pub fn peer_info(sock: &UnixStream) -> PeerInfo {
    let cred = socket::getsockopt(sock, sockopt::PeerCredentials).ok();
    let pid = cred.map(|c| c.pid()).filter(|&p| p > 0);
    let cmdline = pid.and_then(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok());
    let comm = pid
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    PeerInfo {
        pid,
        uid: cred.map(|c| c.uid()),
        qemu_name: cmdline.as_deref().and_then(qemu_name),
        comm,
        incoming: cmdline.as_deref().is_some_and(is_incoming),
    }
}

/// Whether a QEMU command line (NUL-separated) has `-incoming URI`.
pub fn is_incoming(cmdline: &[u8]) -> bool {
    cmdline
        .split(|&b| b == 0)
        .any(|a| a == b"-incoming" || a == b"--incoming")
}

/// The guest name in a QEMU command line (NUL-separated arguments):
/// `-name NAME[,...]`, `-name guest=NAME,...` or `--name ...`, sanitized.
pub fn qemu_name(cmdline: &[u8]) -> Option<String> {
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let value = args
        .windows(2)
        .find_map(|w| (w[0] == b"-name" || w[0] == b"--name").then_some(w[1]))?;
    let value = String::from_utf8_lossy(value);
    // QemuOpts: ',' separates options, ',,' is a literal comma.
    let mut opts = Vec::new();
    let mut cur = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                cur.push(',');
            } else {
                opts.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    opts.push(cur);
    let name = opts
        .iter()
        .enumerate()
        .find_map(|(i, o)| match o.split_once('=') {
            Some(("guest", v)) => Some(v.to_string()),
            None if i == 0 => Some(o.clone()),
            _ => None,
        })?;
    sanitize_name(&name)
}

/// A name safe as a directory and file name component: the one host-name
/// sanitizer's `[A-Za-z0-9._-]` (others become `_`, at most 64), not
/// starting with `.` or `-`; None when nothing but `_` is left.
pub fn sanitize_name(s: &str) -> Option<String> {
    let cleaned = ivtrace_region::sanitize::host_name(s);
    let trimmed = cleaned.trim_start_matches(['.', '-']);
    if trimmed.is_empty() || trimmed.chars().all(|c| c == '_') {
        None
    } else {
        Some(trimmed.to_string())
    }
}

/// A guest's shared memory: a sealed memfd, or a file in `--shm-dir`.
pub struct Shm {
    pub file: File,
    /// Where the region can be opened by path: the file, or the memfd as
    /// `/proc/<serve pid>/fd/<n>` (for `ivtrace ctl --shm` and the reader).
    pub path: PathBuf,
    /// A file in `--shm-dir` (removed when the guest goes, unless kept).
    pub named: bool,
}

impl Shm {
    /// `size` bytes named after `tag`: in `dir` if given, else a memfd
    /// sealed against shrinking and growing.
    pub fn create(dir: Option<&Path>, tag: &str, size: u64) -> Result<Shm> {
        match dir {
            Some(d) => {
                let path = d.join(format!("ivtrace-{}-{tag}", std::process::id()));
                let file = create_shm(&path, size)?;
                Ok(Shm {
                    file,
                    path,
                    named: true,
                })
            }
            None => {
                let file = create_sealed_memfd(tag, size)?;
                let path = PathBuf::from(format!(
                    "/proc/{}/fd/{}",
                    std::process::id(),
                    file.as_raw_fd()
                ));
                Ok(Shm {
                    file,
                    path,
                    named: false,
                })
            }
        }
    }

    /// Removes the region file (nothing for a memfd: it goes with its
    /// last descriptor and mapping).
    pub fn remove(&self) {
        if self.named {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A memfd of `size` bytes whose size nobody can change any more: the
/// seals F_SEAL_SHRINK | F_SEAL_GROW stop a client that was handed it
/// from truncating it under our mapping (which would fault, SIGBUS), and
/// F_SEAL_SEAL stops anyone from adding seals (F_SEAL_WRITE would make
/// our writes fail). QEMU's ivshmem only maps the descriptor it gets.
pub fn create_sealed_memfd(tag: &str, size: u64) -> Result<File> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    // `tag` is the sanitized guest name: no NUL (an `Io` error if it had one).
    let name = std::ffi::CString::new(format!("ivtrace-{tag}"))
        .map_err(|e| ServeError::io("name the region memfd")(e.into()))?;
    let fd = memfd_create(
        &name,
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(ServeError::sys("memfd_create"))?;
    let file = File::from(fd);
    file.set_len(size).map_err(ServeError::io(format!(
        "size the region memfd to {size} bytes"
    )))?;
    let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
    fcntl(file.as_raw_fd(), FcntlArg::F_ADD_SEALS(seals))
        .map_err(ServeError::sys("sealing the region memfd (F_ADD_SEALS)"))?;
    Ok(file)
}

/// Creates the region file (must not exist), mode 0600, `size` bytes
/// (sparse: pages are allocated as the guest writes them).
pub fn create_shm(path: &Path, size: u64) -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(ServeError::io(format!("create {}", path.display())))?;
    f.set_len(size).map_err(ServeError::io(format!(
        "size {} to {size} bytes",
        path.display()
    )))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for a in args {
            v.extend_from_slice(a.as_bytes());
            v.push(0);
        }
        v
    }

    #[test]
    fn names_come_from_qemu_name_sanitized() {
        let q = |a: &[&str]| qemu_name(&cmd(a));
        assert_eq!(
            q(&["qemu", "-name", "web1", "-m", "1G"]),
            Some("web1".into())
        );
        assert_eq!(
            q(&["qemu", "-name", "web1,debug-threads=on"]),
            Some("web1".into())
        );
        assert_eq!(
            q(&["qemu", "-name", "process=x,guest=db"]),
            Some("db".into())
        );
        assert_eq!(q(&["qemu", "--name", "a,,b"]), Some("a_b".into()));
        assert_eq!(q(&["qemu", "-name", "../../etc"]), Some("_.._etc".into()));
        assert_eq!(q(&["qemu", "-name", "/"]), None);
        assert_eq!(q(&["qemu", "-m", "1G"]), None);
        assert_eq!(q(&["qemu", "-name"]), None);
        assert_eq!(sanitize_name("..."), None);
        assert_eq!(sanitize_name(&"x".repeat(200)).unwrap().len(), 64);
    }

    #[test]
    fn a_sealed_region_cannot_change_size() {
        let shm = Shm::create(None, "test", 1 << 16).unwrap();
        assert!(shm.path.starts_with("/proc"));
        let again = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&shm.path)
            .unwrap();
        assert_eq!(again.metadata().unwrap().len(), 1 << 16);
        let shrink = again.set_len(4096).unwrap_err();
        assert_eq!(shrink.raw_os_error(), Some(libc_eperm()));
        assert!(again.set_len(1 << 20).is_err());
        assert!(again.set_len(1 << 16).is_ok(), "the same size is no change");
    }

    fn libc_eperm() -> i32 {
        nix::errno::Errno::EPERM as i32
    }

    #[test]
    fn handshake_sends_the_exact_message_order() {
        use std::io::IoSliceMut;
        let (a, b) = UnixStream::pair().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let shm = create_shm(&tmp.path().join("r"), 1 << 16).unwrap();
        let fds = handshake(&a, &shm, 2).unwrap();
        assert_eq!((fds.host_rx.len(), fds.guest_rx.len()), (2, 2));
        let mut got = Vec::new();
        for _ in 0..7 {
            let mut buf = [0u8; 8];
            let mut iov = [IoSliceMut::new(&mut buf)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let msg =
                socket::recvmsg::<()>(b.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty())
                    .unwrap();
            assert_eq!(msg.bytes, 8);
            let nfds: usize = msg
                .cmsgs()
                .unwrap()
                .map(|c| match c {
                    socket::ControlMessageOwned::ScmRights(v) => {
                        for fd in &v {
                            nix::unistd::close(*fd).unwrap();
                        }
                        v.len()
                    }
                    _ => 0,
                })
                .sum();
            got.push((i64::from_le_bytes(buf), nfds));
        }
        assert_eq!(
            got,
            vec![(0, 0), (0, 0), (-1, 1), (1, 1), (1, 1), (0, 1), (0, 1)]
        );
    }
}
