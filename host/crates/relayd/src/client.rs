//! One session's two connections to a relay daemon (control and data),
//! blocking with timeouts: only the sender thread ([`crate::hub`]) uses
//! them, so a stalled relay stalls that thread, never a recording.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use thiserror::Error;

use crate::proto::{self, PacketIndex};
use crate::url::RelayUrl;

/// How long a connect, a send or a reply may take before the connection
/// is declared broken (and retried later).
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Error)]
pub enum RelayError {
    #[error("cannot connect to {what} port of {url}: {source}")]
    Connect {
        what: &'static str,
        url: String,
        source: io::Error,
    },
    #[error("relay connection failed during {during}: {source}")]
    Io {
        during: &'static str,
        source: io::Error,
    },
    #[error("the relay refused {during} (status {status})")]
    Refused { during: &'static str, status: u32 },
    #[error(
        "the relay speaks protocol {major}.{minor}; ivtrace needs 2.{}+",
        proto::MIN_MINOR
    )]
    Version { major: u32, minor: u32 },
}

fn io_err(during: &'static str) -> impl FnOnce(io::Error) -> RelayError {
    move |source| RelayError::Io { during, source }
}

fn connect(url: &RelayUrl, port: u16, what: &'static str) -> Result<TcpStream, RelayError> {
    let err = |source| RelayError::Connect {
        what,
        url: url.to_string(),
        source,
    };
    let addrs = (url.host.as_str(), port).to_socket_addrs().map_err(err)?;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, IO_TIMEOUT) {
            Ok(s) => {
                s.set_write_timeout(Some(IO_TIMEOUT)).map_err(err)?;
                s.set_read_timeout(Some(IO_TIMEOUT)).map_err(err)?;
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(err(last))
}

/// A session on a relay daemon.
pub struct Connection {
    control: TcpStream,
    data: TcpStream,
    pub session_id: u64,
    pub minor: u32,
}

impl Connection {
    /// Connects both ports, checks the version and creates the session
    /// `name` of `hostname` (live when `live_timer_us` > 0).
    pub fn open(
        url: &RelayUrl,
        name: &str,
        hostname: &str,
        live_timer_us: u32,
    ) -> Result<Connection, RelayError> {
        let control = connect(url, url.control_port, "control")?;
        let data = connect(url, url.data_port, "data")?;
        let mut c = Connection {
            control,
            data,
            session_id: 0,
            minor: 0,
        };
        c.version()?;
        c.create_session(name, hostname, live_timer_us)?;
        Ok(c)
    }

    fn send(&mut self, bytes: &[u8], during: &'static str) -> Result<(), RelayError> {
        self.control.write_all(bytes).map_err(io_err(during))
    }

    fn reply<const N: usize>(&mut self, during: &'static str) -> Result<[u8; N], RelayError> {
        let mut b = [0u8; N];
        self.control.read_exact(&mut b).map_err(io_err(during))?;
        Ok(b)
    }

    /// A command whose reply is a status word only.
    fn generic(&mut self, bytes: &[u8], during: &'static str) -> Result<u32, RelayError> {
        self.send(bytes, during)?;
        Ok(proto::get_be32(&self.reply::<4>(during)?, 0))
    }

    /// A command whose reply is a status word that must be LTTNG_OK.
    fn command(&mut self, bytes: &[u8], during: &'static str) -> Result<(), RelayError> {
        accepted(self.generic(bytes, during)?, during)
    }

    /// A command whose reply is a 64-bit id (session, stream handle), then
    /// a status word that must be LTTNG_OK; returns the id.
    fn command_with_id(&mut self, bytes: &[u8], during: &'static str) -> Result<u64, RelayError> {
        self.send(bytes, during)?;
        let r = self.reply::<12>(during)?;
        accepted(proto::get_be32(&r, 8), during)?;
        Ok(proto::get_be64(&r, 0))
    }

    fn version(&mut self) -> Result<(), RelayError> {
        self.send(&proto::version(), "version check")?;
        let r = self.reply::<8>("version check")?;
        let (major, minor) = (proto::get_be32(&r, 0), proto::get_be32(&r, 4));
        if major != proto::VERSION_MAJOR || minor < proto::MIN_MINOR {
            return Err(RelayError::Version { major, minor });
        }
        self.minor = minor.min(proto::VERSION_MINOR);
        Ok(())
    }

    fn create_session(&mut self, name: &str, host: &str, live_us: u32) -> Result<(), RelayError> {
        let msg = proto::create_session(name, host, live_us);
        self.session_id = self.command_with_id(&msg, "create session")?;
        Ok(())
    }

    /// Adds stream file `channel` under `path`; returns its handle.
    pub fn add_stream(&mut self, channel: &str, path: &str) -> Result<u64, RelayError> {
        self.command_with_id(&proto::add_stream(channel, path), "add stream")
    }

    /// Publishes the streams added so far to live viewers.
    pub fn streams_sent(&mut self) -> Result<(), RelayError> {
        self.command(&proto::streams_sent(), "streams sent")
    }

    /// Appends `text` to metadata stream `handle` (no reply).
    pub fn metadata(&mut self, handle: u64, text: &[u8]) -> Result<(), RelayError> {
        self.send(&proto::send_metadata(handle, text), "send metadata")
    }

    /// Packet `net_seq` of `handle` on the data connection, then its index
    /// on the control connection.
    pub fn packet(
        &mut self,
        handle: u64,
        net_seq: u64,
        bytes: &[u8],
        ix: &PacketIndex,
    ) -> Result<(), RelayError> {
        let len = u32::try_from(bytes.len()).map_err(|_| RelayError::Io {
            during: "send packet",
            source: io::Error::new(io::ErrorKind::InvalidInput, "packet over 4 GiB"),
        })?;
        let hdr = proto::data_header(handle, net_seq, len);
        self.data.write_all(&hdr).map_err(io_err("send packet"))?;
        self.data.write_all(bytes).map_err(io_err("send packet"))?;
        self.index(handle, net_seq, ix)
    }

    /// An index entry; with `packet_size` 0, a live beacon.
    pub fn index(&mut self, handle: u64, net_seq: u64, ix: &PacketIndex) -> Result<(), RelayError> {
        self.command(&proto::send_index(handle, net_seq, ix), "send index")
    }

    /// Whether the relay has written every packet of `handle` up to
    /// `last_net_seq` with its index.
    pub fn written_up_to(&mut self, handle: u64, last_net_seq: u64) -> Result<bool, RelayError> {
        Ok(self.generic(&proto::data_pending(handle, last_net_seq), "data pending")? == 0)
    }

    pub fn close_stream(&mut self, handle: u64, last_net_seq: u64) -> Result<(), RelayError> {
        self.command(&proto::close_stream(handle, last_net_seq), "close stream")
    }
}

/// `status` as a result: LTTNG_OK, or the relay's refusal during `during`.
fn accepted(status: u32, during: &'static str) -> Result<(), RelayError> {
    match status {
        proto::LTTNG_OK => Ok(()),
        status => Err(RelayError::Refused { during, status }),
    }
}
