//! ivtrace-serve: `ivtrace serve`, the ivshmem server (Debian ships none)
//! and the recorder of every guest that connects; the CLI (ivtrace) gives
//! it its [`Settings`].
//!
//! The main thread listens on the server socket (QEMU's
//! `-chardev socket,path=PATH -device ivshmem-doorbell,chardev=..,vectors=N`)
//! and on a control socket (`PATH.ctl`, for `ivtrace ctl`). Each accepted
//! connection gets its own region file in /dev/shm (sized to a power of
//! two; `ivtrace snapshot` can salvage it if the server itself dies), its
//! own eventfds, the protocol handshake (on a short-lived thread of its
//! own, [`connect`], [`proto`]), and then a task ([`guest`]) that the
//! drain pool ([`pool`]: a bounded set of threads for every guest) runs to
//! record it ([`recording`], with what serve observed logged in the host
//! trace: [`hostlog`]; with `--relayd` also streamed to a relay:
//! [`ivtrace_engine::relayd`]) into `OUTROOT/<name>`: the name
//! comes from the peer's QEMU `-name` (pid from SO_PEERCRED, then
//! /proc/PID/cmdline), else `guest<N>`. Guests never share state; one
//! that misbehaves or dies only ends its own recording. SIGINT/SIGTERM
//! stop every guest, each finalizing its trace, then remove the sockets.
//!
//! Both sockets are created mode 0600 (umask while binding): only the
//! owner (normally root, who runs QEMU) may connect, unless a group is
//! given access ([`access`]: `--socket-group`, `--ctl-group`, mode 0660).
//! A path where a server
//! still answers is refused; a stale socket file (nobody listening) is
//! replaced; anything else at the path is refused.

pub mod access;
pub mod admission;
pub mod connect;
pub mod control;
pub mod ctlsock;
pub mod error;
pub mod ftrace;
pub mod guest;
pub mod hostlog;
pub mod migration;
pub mod pool;
pub mod proto;
pub mod recording;

use std::fs;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use error::{Report, Result, ServeError};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::EventFd;

use ivtrace_ctf::Sidecar;

use ivtrace_engine::UserError;

/// What `ivtrace serve` was asked to do (the CLI's `ServeArgs`, its
/// options resolved).
pub struct Settings {
    /// The server socket QEMU connects to.
    pub socket: PathBuf,
    /// Root of the per-guest trace directories: `OUTROOT/<guest name>`.
    pub output: PathBuf,
    /// Who may read the traces, and whether a shared output root is accepted.
    pub policy: ivtrace_ctf::OutputPolicy,
    /// Region size per guest as asked (rounded up to a power of two).
    pub size: u64,
    /// Interrupt vectors per direction.
    pub vectors: u32,
    /// Control socket [default: `default_ctl_path(socket)`].
    pub ctl_socket: Option<PathBuf>,
    /// Group given the server socket (mode 0660), name or gid.
    pub socket_group: Option<String>,
    /// Group given the control socket (mode 0660), name or gid.
    pub ctl_group: Option<String>,
    /// Region files go here (None: sealed memfds).
    pub shm_dir: Option<PathBuf>,
    pub keep_shm: bool,
    /// Seconds between clock sync bursts.
    pub sync_interval: f64,
    pub host_events: bool,
    pub trace_cmd: bool,
    /// Stop after this many seconds.
    pub duration: Option<f64>,
    /// Each guest's summary as a JSON line on stdout, instead of `print_summary`.
    pub json: bool,
    /// Per recording: stream files stop growing at this many bytes.
    pub max_size: Option<u64>,
    /// Longest wait for the guests to finalize after SIGINT/SIGTERM, seconds.
    pub shutdown_timeout: f64,
    /// Drain threads [default: the CPUs available].
    pub drain_threads: Option<u32>,
    /// The relay sender (`--relayd`), started.
    pub relay: Option<ivtrace_relayd::Hub>,
    /// The boot analysis each recording derives when it ends.
    pub boot: ivtrace_boot::derive::Options,
    /// Prints a finished guest's summary as text (the CLI's table).
    pub print_summary: fn(&Sidecar, &Path),
}

/// Settings every guest thread shares.
pub struct ServeConfig {
    /// The output root, held by descriptor.
    pub outroot: ivtrace_ctf::OutDir,
    /// Region files go here (None: sealed memfds).
    pub shm_dir: Option<PathBuf>,
    pub size: u64,
    pub vectors: u32,
    pub keep_shm: bool,
    pub sync_interval: Duration,
    pub host_events: bool,
    /// Write each finished recording's trace-cmd files too.
    pub trace_cmd: bool,
    pub json: bool,
    /// Longest sleep without a doorbell (catches a region closed while
    /// the host slept, and anything else that does not ring).
    pub safety_timeout: Duration,
    /// What one recording's output may use.
    pub limits: ivtrace_ctf::streams::Limits,
    /// The relay sender (`--relayd`): every guest's recording streams to it.
    pub relay: Option<ivtrace_relayd::Hub>,
    /// The boot analysis each recording derives when it ends.
    pub boot: ivtrace_boot::derive::Options,
    print_summary: fn(&Sidecar, &Path),
    print: Mutex<()>,
}

impl ServeConfig {
    /// Prints a finished guest's summary (serialized between guests).
    pub fn report(&self, sidecar: &Sidecar, doc: &serde_json::Value, out: &Path) {
        let _g = self.print.lock();
        if self.json {
            let mut doc = doc.clone();
            if let Some(o) = doc.as_object_mut() {
                o.remove(ivtrace_ctf::sidecar::TRACEFS_FORMATS_KEY);
            }
            if let Ok(line) = serde_json::to_string(&doc) {
                let mut o = io::stdout().lock();
                let _ = writeln!(o, "{line}");
                let _ = o.flush();
            }
        } else {
            (self.print_summary)(sidecar, out);
        }
    }
}

/// One live guest as the registry knows it.
pub struct GuestEntry {
    pub id: u64,
    pub name: String,
    pub requests: mpsc::Sender<guest::Request>,
    pub wake: Arc<EventFd>,
    pub status: Arc<Mutex<guest::GuestStatus>>,
    /// Its place in the descriptor budget.
    pub seat: Arc<admission::Seat>,
}

impl GuestEntry {
    fn wake(&self) {
        let _ = self.wake.write(1);
    }
}

/// Finished guests `ctl list` still shows (their last status only: no
/// descriptor, no thread).
const FINISHED_KEPT: usize = 256;

/// Every guest of this server: the live ones, and the last finished ones.
#[derive(Default)]
pub struct Registry {
    pub guests: Mutex<Vec<GuestEntry>>,
    pub finished: Mutex<std::collections::VecDeque<guest::GuestStatus>>,
}

impl Registry {
    /// Live guests that have left the descriptor budget: their QEMU hung
    /// up while they waited (they end without a recording when the drain
    /// pool gets to them). Marks the ones that hung up since last asked.
    pub fn leaving(&self) -> usize {
        let guests = self.guests.lock().expect("lock");
        guests.iter().filter(|g| g.seat.leave_if_hung_up()).count()
    }

    /// Removes guest `id` (its thread is ending): its descriptors go with
    /// the entry; its last status joins the bounded history.
    pub fn retire(&self, id: u64) {
        let entry = {
            let mut guests = self.guests.lock().expect("lock");
            let i = guests.iter().position(|g| g.id == id);
            i.map(|i| guests.swap_remove(i))
        };
        let Some(entry) = entry else {
            return;
        };
        let status = entry.status.lock().map(|s| s.clone()).unwrap_or_default();
        let mut finished = self.finished.lock().expect("lock");
        if finished.len() == FINISHED_KEPT {
            finished.pop_front();
        }
        finished.push_back(status);
    }
}

/// Binds `path` mode 0600, refusing a live server and non-sockets,
/// replacing a stale socket.
pub fn bind_socket(path: &Path) -> Result<UnixListener> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(UserError {
                    message: format!("{} is in use: a server is listening there", path.display()),
                    hint: "stop that server first, or choose another --socket path".into(),
                }
                .into())
            }
            Err(_) => {
                fs::remove_file(path).map_err(ServeError::io(format!(
                    "remove stale socket {}",
                    path.display()
                )))?;
                eprintln!("ivtrace serve: replaced stale socket {}", path.display());
            }
        },
        Ok(_) => {
            return Err(UserError {
                message: format!("{} exists and is not a socket", path.display()),
                hint: "choose another --socket path (serve never deletes other files)".into(),
            }
            .into())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(ServeError::io(format!("inspect {}", path.display()))(e)),
    }
    // The socket file takes the umask's permissions at bind time: set
    // 0177 around bind so it is born 0600 (no window where others may
    // connect). Single-threaded here: nothing else creates files now.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let res = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    res.map_err(ServeError::io(format!("listen on {}", path.display())))
}

/// The default control socket of a server socket.
pub fn default_ctl_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".ctl");
    PathBuf::from(s)
}

/// The region size for `--size`: a power of two (QEMU requires one).
fn region_size(args: &Settings) -> Result<u64> {
    if args.size < ivtrace_region::abi::IVT_REGION_MIN {
        return Err(ServeError::SizeTooSmall {
            size: args.size,
            min: ivtrace_region::abi::IVT_REGION_MIN,
        });
    }
    let size = args.size.next_power_of_two();
    if size != args.size {
        eprintln!(
            "ivtrace serve: --size {} is not a power of two (QEMU requires one): using {size}",
            args.size
        );
    }
    Ok(size)
}

/// The server socket and the control socket, listening (non-blocking).
struct Sockets {
    listener: UnixListener,
    ctl_listener: UnixListener,
    ctl_path: PathBuf,
}

impl Sockets {
    fn bind(args: &Settings) -> Result<Sockets> {
        let ctl_path = args
            .ctl_socket
            .clone()
            .unwrap_or_else(|| default_ctl_path(&args.socket));
        let qemu_group = access::resolve_group("--socket-group", args.socket_group.as_deref())?;
        let ctl_group = access::resolve_group("--ctl-group", args.ctl_group.as_deref())?;
        let listener = bind_socket(&args.socket)?;
        let ctl_listener = match bind_socket(&ctl_path) {
            Ok(l) => l,
            Err(e) => {
                let _ = fs::remove_file(&args.socket);
                return Err(e);
            }
        };
        // Both paths are ours now: on failure remove both.
        let granted = access::grant(&args.socket, qemu_group)
            .and_then(|()| access::grant(&ctl_path, ctl_group));
        if let Err(e) = granted {
            let _ = fs::remove_file(&args.socket);
            let _ = fs::remove_file(&ctl_path);
            return Err(e);
        }
        listener
            .set_nonblocking(true)
            .and_then(|()| ctl_listener.set_nonblocking(true))
            .map_err(ServeError::io("make the listening sockets non-blocking"))?;
        Ok(Sockets {
            listener,
            ctl_listener,
            ctl_path,
        })
    }
}

/// Stream files a served recording keeps open at once.
const SERVE_OPEN_FILES: usize = 32;

fn serve_config(args: &mut Settings, size: u64, outroot: ivtrace_ctf::OutDir) -> ServeConfig {
    ServeConfig {
        outroot,
        shm_dir: args.shm_dir.clone(),
        size,
        vectors: args.vectors,
        keep_shm: args.keep_shm,
        sync_interval: Duration::from_secs_f64(args.sync_interval.clamp(0.1, 3600.0)),
        host_events: args.host_events,
        trace_cmd: args.trace_cmd,
        json: args.json,
        safety_timeout: Duration::from_secs(1),
        limits: ivtrace_ctf::streams::Limits {
            open_files: SERVE_OPEN_FILES,
            buffer_total: 8 << 20,
            max_bytes: args.max_size,
            ..Default::default()
        },
        relay: args.relay.take(),
        boot: args.boot.clone(),
        print_summary: args.print_summary,
        print: Mutex::new(()),
    }
}

/// SIGINT/SIGTERM write to a socket pair the accept loop polls.
fn signal_pipe() -> Result<UnixStream> {
    let install = || -> io::Result<UnixStream> {
        let (sig_read, sig_write) = UnixStream::pair()?;
        sig_read.set_nonblocking(true)?;
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::low_level::pipe::register(sig, sig_write.try_clone()?)?;
        }
        Ok(sig_read)
    };
    let sig_read = install().map_err(ServeError::io("install the signal handlers"))?;
    Ok(sig_read)
}

fn announce(args: &Settings, ctl_path: &Path, size: u64, budget: &admission::Budget) {
    let regions = match &args.shm_dir {
        Some(d) => format!("files in {}", d.display()),
        None => "sealed memfds".into(),
    };
    eprintln!(
        "ivtrace serve: listening on {} (control: {}), {} vectors, {} MiB regions ({regions}), traces in {}",
        args.socket.display(),
        ctl_path.display(),
        args.vectors,
        size >> 20,
        args.output.display()
    );
    eprintln!("ivtrace serve: {}", budget.describe());
    eprintln!(
        "ivtrace serve: start QEMU with -chardev socket,id=ivt,path={} -device ivshmem-doorbell,chardev=ivt,vectors={}",
        args.socket.display(),
        args.vectors
    );
}

/// Runs `ivtrace serve`. Returns the number of guests served.
pub fn run(mut args: Settings) -> Result<u64> {
    let args = &mut args;
    let size = region_size(args)?;
    let outroot = ivtrace_engine::session::open_root(&args.output, &args.policy)?;
    let budget = admission::Budget::new(args.vectors, SERVE_OPEN_FILES);
    let sockets = Sockets::bind(args)?;
    ivtrace_time::timebase::base(); // measure the host time base now
    let workers = args.drain_threads.map_or_else(
        || std::thread::available_parallelism().map_or(2, |n| n.get()),
        |n| n as usize,
    );
    let mut server = Server {
        pool: Arc::new(pool::Pool::start(workers)?),
        cfg: Arc::new(serve_config(args, size, outroot)),
        stop: Arc::new(AtomicBool::new(false)),
        registry: Arc::new(Registry::default()),
        threads: Vec::new(),
        budget,
        controls: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    };
    let sig_read = signal_pipe()?;
    let deadline = args
        .duration
        .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    announce(args, &sockets.ctl_path, size, &server.budget);
    let mut served = 0u64;
    let result = server.accept_until_stopped(&sockets, &sig_read, deadline, &mut served);
    let grace = Duration::from_secs_f64(args.shutdown_timeout.clamp(0.0, 86400.0));
    server.stop_every_guest(grace);
    let _ = fs::remove_file(&args.socket);
    let _ = fs::remove_file(&sockets.ctl_path);
    drop(sig_read);
    result?;
    Ok(served.max(1))
}

/// What the accept loop shares with every guest thread.
struct Server {
    cfg: Arc<ServeConfig>,
    stop: Arc<AtomicBool>,
    registry: Arc<Registry>,
    /// Connection threads, identifying the peer and running the handshake
    /// (joined when finished); the guest's recording then joins the pool.
    threads: Vec<JoinHandle<()>>,
    /// The drain pool that records every connected guest.
    pool: Arc<pool::Pool>,
    budget: admission::Budget,
    /// Control connections being answered.
    controls: Arc<std::sync::atomic::AtomicUsize>,
}

/// Control connections answered at once; more are closed.
const MAX_CONTROLS: usize = 8;

impl Server {
    /// Accepts guests and control connections until a signal or the
    /// deadline; `served` counts the guests.
    fn accept_until_stopped(
        &mut self,
        sockets: &Sockets,
        sig_read: &UnixStream,
        deadline: Option<Instant>,
        served: &mut u64,
    ) -> Result<()> {
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                eprintln!("ivtrace serve: duration reached, stopping");
                return Ok(());
            }
            let mut fds = [
                PollFd::new(sockets.listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(sockets.ctl_listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(sig_read.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::from(500u16)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(ServeError::sys("poll")(e)),
            }
            let ready = |i: usize| fds[i].revents().is_some_and(|r| !r.is_empty());
            let (new_guest, new_ctl, signalled) = (ready(0), ready(1), ready(2));
            if signalled {
                eprintln!("ivtrace serve: stopping (signal)");
                return Ok(());
            }
            self.reap();
            if new_guest {
                self.accept_guests(&sockets.listener, served);
            }
            if new_ctl {
                self.accept_control(&sockets.ctl_listener);
            }
        }
    }

    /// Accepts every waiting connection; each gets its own thread (the
    /// handshake included: a client that stalls never stalls this loop),
    /// unless the descriptor budget is spent.
    fn accept_guests(&mut self, listener: &UnixListener, served: &mut u64) {
        loop {
            let conn = match listener.accept() {
                Ok((conn, _)) => conn,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: the connection stays queued; the
                    // next poll retries once descriptors are free again.
                    eprintln!("ivtrace serve: cannot accept a connection: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    return;
                }
            };
            *served += 1;
            let n = *served;
            if let Err(why) = self.admit() {
                eprintln!("ivtrace serve: connection #{n} refused: {why}");
                drop(conn);
                continue;
            }
            if let Err(e) = self.start_connection(conn, n) {
                eprintln!("ivtrace serve: connection #{n} refused: {}", Report(&e));
            }
        }
    }

    /// Whether the budget has room for one more guest. The guests counted
    /// are the connection threads and the pool's, less those whose QEMU
    /// hung up while waiting (the pool has not got to them yet: under load
    /// that can take many back-to-back connections).
    fn admit(&mut self) -> Result<(), String> {
        self.reap();
        let counted = self.threads.len() + self.pool.live();
        self.budget
            .admit(counted.saturating_sub(self.registry.leaving()))
    }

    fn start_connection(&mut self, conn: UnixStream, n: u64) -> Result<()> {
        let ctx = connect::Context {
            cfg: Arc::clone(&self.cfg),
            stop: Arc::clone(&self.stop),
            registry: Arc::clone(&self.registry),
            pool: Arc::clone(&self.pool),
        };
        let thread = std::thread::Builder::new()
            .name(format!("ivt-conn{n}"))
            .spawn(move || connect::serve_connection(ctx, conn, n))
            .map_err(ServeError::io("start the guest thread"))?;
        self.threads.push(thread);
        Ok(())
    }

    fn accept_control(&self, ctl_listener: &UnixListener) {
        use std::sync::atomic::Ordering as O;
        while let Ok((conn, _)) = ctl_listener.accept() {
            if self.controls.fetch_add(1, O::AcqRel) >= MAX_CONTROLS {
                self.controls.fetch_sub(1, O::AcqRel);
                eprintln!("ivtrace serve: control connection refused: {MAX_CONTROLS} already being answered");
                continue;
            }
            let reg = Arc::clone(&self.registry);
            let busy = Arc::clone(&self.controls);
            let spawned = std::thread::Builder::new()
                .name("ivtrace-ctl".into())
                .spawn(move || {
                    ctlsock::handle(conn, &reg);
                    busy.fetch_sub(1, O::AcqRel);
                });
            if spawned.is_err() {
                self.controls.fetch_sub(1, O::AcqRel);
            }
        }
    }

    /// Joins the guest threads that finished.
    fn reap(&mut self) {
        let (done, live): (Vec<_>, Vec<_>) = std::mem::take(&mut self.threads)
            .into_iter()
            .partition(|t| t.is_finished());
        self.threads = live;
        for t in done {
            if t.join().is_err() {
                eprintln!("ivtrace serve: a guest thread panicked");
            }
        }
    }

    /// Stops every guest; each finalizes its trace. Waits at most `grace`:
    /// a guest thread still busy then (stuck in the kernel on a hung file
    /// system, say) is named and left; its trace is for `ivtrace recover`.
    fn stop_every_guest(&mut self, grace: Duration) {
        self.stop.store(true, Ordering::Relaxed);
        for g in self.registry.guests.lock().expect("lock").iter() {
            g.wake();
        }
        let until = Instant::now() + grace;
        while (!self.threads.is_empty() || self.pool.live() > 0) && Instant::now() < until {
            self.reap();
            std::thread::sleep(Duration::from_millis(20));
        }
        self.reap();
        let unfinished = self.threads.len() + self.pool.live();
        self.pool.finish();
        if unfinished > 0 {
            let names: Vec<String> = self
                .registry
                .guests
                .lock()
                .expect("lock")
                .iter()
                .map(|g| g.name.clone())
                .collect();
            eprintln!(
                "ivtrace serve: {} guest(s) did not finalize within {:.0} s ({}): exiting anyway; \
                 `ivtrace recover OUTROOT/<name>` finishes their traces",
                unfinished,
                grace.as_secs_f64(),
                names.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, conn: UnixStream) -> GuestEntry {
        GuestEntry {
            id,
            name: format!("guest{id}"),
            requests: mpsc::channel().0,
            wake: Arc::new(EventFd::new().unwrap()),
            status: Arc::default(),
            seat: Arc::new(admission::Seat::new(Arc::new(conn))),
        }
    }

    /// VMs started in a row under a 1024-descriptor limit (room for 10):
    /// ten whose QEMU hung up while they waited for their region, and that
    /// the drain pool has not ended yet, must not refuse the eleventh.
    #[test]
    fn guests_that_hung_up_while_waiting_do_not_fill_the_budget() {
        let budget = admission::Budget {
            limit: 1024,
            was: 1024,
            per_guest: 88,
        };
        assert_eq!(budget.max_guests(), 10);
        let registry = Registry::default();
        let mut peers = Vec::new();
        for id in 1..=10 {
            let (ours, theirs) = UnixStream::pair().unwrap();
            registry.guests.lock().unwrap().push(entry(id, ours));
            peers.push(theirs);
        }
        let counted = 10;
        assert_eq!(registry.leaving(), 0);
        let err = budget.admit(counted - registry.leaving()).unwrap_err();
        assert!(err.contains("10 guests are being served"), "{err}");
        // One guest starts recording: it stays counted when its QEMU goes
        // (its trace still has to be finalized).
        assert!(registry.guests.lock().unwrap()[0].seat.start_recording());
        peers.clear();
        assert_eq!(registry.leaving(), 9);
        assert!(budget.admit(counted - registry.leaving()).is_ok());
    }

    #[test]
    fn live_sockets_are_refused_stale_ones_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("s.sock");
        let l = bind_socket(&p).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let err = bind_socket(&p).unwrap_err();
        assert!(matches!(err, ServeError::User(_)), "{err:?}");
        assert!(
            err.hint().is_some_and(|h| h.contains("stop that server")),
            "{err:?}"
        );
        drop(l); // the file stays: stale
        assert!(p.exists());
        let _l2 = bind_socket(&p).unwrap();
        let f = tmp.path().join("plain");
        fs::write(&f, b"x").unwrap();
        assert!(bind_socket(&f).is_err());
        assert!(f.exists());
        assert_eq!(default_ctl_path(&p), tmp.path().join("s.sock.ctl"));
    }
}
