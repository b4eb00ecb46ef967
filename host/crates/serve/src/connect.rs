//! One accepted connection, in its own thread: who the peer is, its
//! region, the protocol handshake, its registry entry; then the guest's
//! recording ([`crate::guest`]) is handed to the drain pool, which
//! gives the entry back when it ends. Nothing here runs on the accept loop: a client that stalls the
//! handshake, or whose /proc entries are slow to read, stalls only itself.

use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::error::Report;
use crate::{Result, ServeError};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::admission::Seat;
use crate::pool::Pool;
use crate::{guest, proto, GuestEntry, Registry, ServeConfig};

/// What a connection's thread shares with the server.
pub struct Context {
    pub cfg: Arc<ServeConfig>,
    pub stop: Arc<AtomicBool>,
    pub registry: Arc<Registry>,
    pub pool: Arc<Pool>,
}

/// The thread body of connection `n`: once connected, the guest's
/// recording goes to the drain pool (its entry is given back when it is
/// done) and this thread ends.
pub fn serve_connection(ctx: Context, conn: UnixStream, n: u64) {
    let conn = Arc::new(conn);
    let guest = match connect(&ctx, &conn, n) {
        Ok(guest) => guest,
        Err(e) => {
            eprintln!("ivtrace serve: connection #{n} refused: {}", Report(&e));
            return;
        }
    };
    let id = guest.id;
    let registry = Arc::clone(&ctx.registry);
    let retire = Box::new(move || registry.retire(id));
    match guest::GuestTask::new(guest, conn, retire) {
        Ok(task) => ctx.pool.submit(task),
        Err(e) => {
            eprintln!("ivtrace serve: connection #{n}: {}", Report(&e));
            ctx.registry.retire(id);
        }
    }
}

/// Claims `base` (or `base-2`, `base-3`...) among the live guests and
/// registers the entry under that name, in one critical section.
fn register(registry: &Registry, base: &str, make: impl FnOnce(String) -> GuestEntry) -> String {
    let mut guests = registry.guests.lock().expect("lock");
    let taken = |s: &str| guests.iter().any(|g| g.name == s);
    let mut name = base.to_string();
    let mut k = 2;
    while taken(&name) {
        name = format!("{base}-{k}");
        k += 1;
    }
    guests.push(make(name.clone()));
    name
}

/// Identifies the peer, registers it, creates its region and descriptors
/// and runs the handshake.
fn connect(ctx: &Context, conn: &Arc<UnixStream>, n: u64) -> Result<guest::Guest> {
    conn.set_nonblocking(false)
        .and_then(|()| conn.set_write_timeout(Some(Duration::from_secs(2))))
        .map_err(ServeError::io(
            "set up the connection's socket (blocking, 2 s write timeout)",
        ))?;
    let peer = proto::peer_info(conn);
    let base = peer
        .qemu_name
        .clone()
        .unwrap_or_else(|| format!("guest{n}"));
    let wake = Arc::new(
        EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(ServeError::sys("eventfd"))?,
    );
    let (tx, rx) = mpsc::channel();
    let status = Arc::new(Mutex::new(guest::GuestStatus {
        qemu_pid: peer.pid,
        state: "connecting".into(),
        ..Default::default()
    }));
    let seat = Arc::new(Seat::new(Arc::clone(conn)));
    let name = register(&ctx.registry, &base, |name| GuestEntry {
        id: n,
        name,
        requests: tx,
        wake: Arc::clone(&wake),
        status: Arc::clone(&status),
        seat: Arc::clone(&seat),
    });
    let made = handshake(ctx, conn, &name, n);
    let (shm, fds) = match made {
        Ok(v) => v,
        Err(e) => {
            ctx.registry.retire(n);
            return Err(e);
        }
    };
    if let Ok(mut s) = status.lock() {
        s.name = name.clone();
        s.state = "connected".into();
        s.shm = shm.path.display().to_string();
    }
    log_connected(ctx, &name, &peer, &shm);
    Ok(guest::Guest {
        id: n,
        name,
        peer,
        shm,
        doorbells: fds.host_rx,
        interrupts: fds.guest_rx.into_iter().map(Arc::new).collect(),
        wake,
        requests: rx,
        status,
        seat,
        cfg: Arc::clone(&ctx.cfg),
        stop: Arc::clone(&ctx.stop),
    })
}

/// The region and the protocol handshake; the region is gone again if
/// the handshake fails.
fn handshake(
    ctx: &Context,
    conn: &UnixStream,
    name: &str,
    n: u64,
) -> Result<(proto::Shm, proto::Eventfds)> {
    let cfg = &ctx.cfg;
    let shm = proto::Shm::create(cfg.shm_dir.as_deref(), &format!("{n}-{name}"), cfg.size)?;
    match proto::handshake(conn, &shm.file, cfg.vectors) {
        Ok(fds) => Ok((shm, fds)),
        Err(e) => {
            shm.remove();
            Err(ServeError::Handshake(Box::new(e)))
        }
    }
}

fn log_connected(ctx: &Context, name: &str, peer: &proto::PeerInfo, shm: &proto::Shm) {
    eprintln!(
        "ivtrace serve: [{name}] connected: pid {} ({}), region {} ({} MiB), {} vectors",
        peer.pid.map_or_else(|| "?".into(), |p| p.to_string()),
        if peer.comm.is_empty() {
            "?"
        } else {
            &peer.comm
        },
        shm.path.display(),
        ctx.cfg.size >> 20,
        ctx.cfg.vectors
    );
}
