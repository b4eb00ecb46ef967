//! The relay daemon's network protocol, as LTTng 2.13's consumer speaks it
//! to `lttng-relayd` (our own description of it, from lttng-tools'
//! `sessiond-comm/relayd.h`; docs/relay.md has the sequence).
//!
//! Every integer travels big-endian. A command on the control connection
//! is a 24-byte header (`circuit_id` u64 = 0, `data_size` u64, `cmd` u32,
//! `cmd_version` u32 = 0) and `data_size` bytes; most commands get a reply
//! whose first u32 is a status (`LTTNG_OK` = 10). A packet on the data
//! connection is a 32-byte header (`circuit_id`, `stream_id`,
//! `net_seq_num` u64, `data_size`, `padding_size` u32) and the bytes.
//!
//! ivtrace speaks protocol 2.10, the last one before trace chunks (2.11):
//! a 2.13 relay still accepts it, keeps the stream paths the producer
//! gives (`HOST/SESSION-DATE/kernel`), writes packet indexes (2.8 form,
//! with stream instance and packet sequence numbers) and serves the
//! session live when its live timer is not zero.

/// Protocol version ivtrace announces (the relay answers with the lower
/// of its own and ours).
pub const VERSION_MAJOR: u32 = 2;
pub const VERSION_MINOR: u32 = 10;
/// Oldest minor whose index carries stream instance ids and packet
/// sequence numbers (what babeltrace2's live reader needs).
pub const MIN_MINOR: u32 = 8;

/// `LTTNG_OK` in replies.
pub const LTTNG_OK: u32 = 10;

/// `enum lttcomm_relayd_command` values used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Command {
    AddStream = 1,
    CreateSession = 2,
    Version = 5,
    SendMetadata = 6,
    CloseStream = 7,
    DataPending = 8,
    SendIndex = 13,
    StreamsSent = 16,
}

/// Sizes of the fixed strings of the 2.4 / 2.2 command forms.
pub const SESSION_NAME_MAX: usize = 255;
pub const HOST_NAME_MAX: usize = 64;
pub const CHANNEL_NAME_MAX: usize = 264;
pub const PATH_MAX: usize = 4096;

pub const CMD_HEADER_LEN: usize = 24;
pub const DATA_HEADER_LEN: usize = 32;
/// `struct lttcomm_relayd_index` up to `packet_seq_num` (index 1.1).
pub const INDEX_LEN: usize = 80;
/// `struct lttcomm_relayd_metadata_payload` before the metadata bytes.
pub const METADATA_HEADER_LEN: usize = 12;

fn be32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn be64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

/// A NUL-padded fixed-size string; `s` is cut to leave room for the NUL
/// (callers pass host-chosen, sanitized names).
fn fixed(out: &mut Vec<u8>, s: &str, size: usize) {
    let b = s.as_bytes();
    let n = b.len().min(size - 1);
    out.extend_from_slice(&b[..n]);
    out.resize(out.len() + (size - n), 0);
}

/// A control command: header and payload in one buffer.
pub fn command(cmd: Command, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CMD_HEADER_LEN + payload.len());
    be64(&mut out, 0);
    be64(&mut out, payload.len() as u64);
    be32(&mut out, cmd as u32);
    be32(&mut out, 0);
    out.extend_from_slice(payload);
    out
}

pub fn version() -> Vec<u8> {
    let mut p = Vec::with_capacity(8);
    be32(&mut p, VERSION_MAJOR);
    be32(&mut p, VERSION_MINOR);
    command(Command::Version, &p)
}

/// `RELAYD_CREATE_SESSION`, 2.4 form. `live_timer_us` > 0 makes the
/// session live (the viewer may attach).
pub fn create_session(name: &str, hostname: &str, live_timer_us: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(SESSION_NAME_MAX + HOST_NAME_MAX + 8);
    fixed(&mut p, name, SESSION_NAME_MAX);
    fixed(&mut p, hostname, HOST_NAME_MAX);
    be32(&mut p, live_timer_us);
    be32(&mut p, 0); // not a snapshot session
    command(Command::CreateSession, &p)
}

/// `RELAYD_ADD_STREAM`, 2.2 form: a stream file `channel` in the
/// directory `path` (relative to the relay's output directory), one file
/// of unlimited size.
pub fn add_stream(channel: &str, path: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(CHANNEL_NAME_MAX + PATH_MAX + 16);
    fixed(&mut p, channel, CHANNEL_NAME_MAX);
    fixed(&mut p, path, PATH_MAX);
    be64(&mut p, 0);
    be64(&mut p, 0);
    command(Command::AddStream, &p)
}

pub fn streams_sent() -> Vec<u8> {
    command(Command::StreamsSent, &[])
}

/// `RELAYD_SEND_METADATA`: appends `text` to the metadata stream `handle`
/// (no reply).
pub fn send_metadata(handle: u64, text: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(METADATA_HEADER_LEN + text.len());
    be64(&mut p, handle);
    be32(&mut p, 0);
    p.extend_from_slice(text);
    command(Command::SendMetadata, &p)
}

/// The data connection's header of one packet of `len` bytes.
pub fn data_header(handle: u64, net_seq: u64, len: u32) -> [u8; DATA_HEADER_LEN] {
    let mut out = [0u8; DATA_HEADER_LEN];
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out[16..24].copy_from_slice(&net_seq.to_be_bytes());
    out[24..28].copy_from_slice(&len.to_be_bytes());
    out
}

/// What an index entry says about a packet (CTF packet context fields;
/// sizes in bits, as in the packet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketIndex {
    pub packet_size: u64,
    pub content_size: u64,
    pub timestamp_begin: u64,
    pub timestamp_end: u64,
    pub events_discarded: u64,
    pub stream_id: u64,
    pub stream_instance_id: u64,
    pub packet_seq_num: u64,
}

/// `RELAYD_SEND_INDEX` for packet `net_seq` of stream `handle`. A
/// `packet_size` of 0 is a live beacon: "nothing on this stream before
/// `timestamp_end`".
pub fn send_index(handle: u64, net_seq: u64, ix: &PacketIndex) -> Vec<u8> {
    let mut p = Vec::with_capacity(INDEX_LEN);
    for v in [
        handle,
        net_seq,
        ix.packet_size,
        ix.content_size,
        ix.timestamp_begin,
        ix.timestamp_end,
        ix.events_discarded,
        ix.stream_id,
        ix.stream_instance_id,
        ix.packet_seq_num,
    ] {
        be64(&mut p, v);
    }
    command(Command::SendIndex, &p)
}

/// `RELAYD_CLOSE_STREAM`: `last_net_seq` is the last packet sent (the relay
/// closes the stream once it has it), `u64::MAX` if none was.
pub fn close_stream(handle: u64, last_net_seq: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(16);
    be64(&mut p, handle);
    be64(&mut p, last_net_seq);
    command(Command::CloseStream, &p)
}

/// `RELAYD_DATA_PENDING`: is any packet up to `last_net_seq` of `handle`
/// not yet written with its index? (reply 0: all written).
pub fn data_pending(handle: u64, last_net_seq: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(16);
    be64(&mut p, handle);
    be64(&mut p, last_net_seq);
    command(Command::DataPending, &p)
}

/// Reads a big-endian u32 at `at`.
pub fn get_be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Reads a big-endian u64 at `at`.
pub fn get_be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_have_lttngs_sizes() {
        assert_eq!(version().len(), CMD_HEADER_LEN + 8);
        // struct lttcomm_relayd_create_session_2_4: 255 + 64 + 4 + 4.
        assert_eq!(create_session("s", "h", 1).len(), CMD_HEADER_LEN + 327);
        // struct lttcomm_relayd_add_stream_2_2: 264 + 4096 + 8 + 8.
        assert_eq!(add_stream("c", "p").len(), CMD_HEADER_LEN + 4376);
        assert_eq!(
            send_index(1, 2, &PacketIndex::default()).len(),
            CMD_HEADER_LEN + INDEX_LEN
        );
        let c = create_session(&"x".repeat(999), "h", 7);
        assert_eq!(c[CMD_HEADER_LEN + 254], 0, "names keep their NUL");
        assert_eq!(get_be64(&c, 8), 327);
        assert_eq!(get_be32(&c, 16), Command::CreateSession as u32);
        let h = data_header(3, 4, 5);
        assert_eq!(
            (get_be64(&h, 8), get_be64(&h, 16), get_be32(&h, 24)),
            (3, 4, 5)
        );
    }
}
