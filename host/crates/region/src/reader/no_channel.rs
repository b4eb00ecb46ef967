//! Events no channel could take, as a CTF stream of their own.
//!
//! A user-space writer that finds every user channel taken drops its event
//! and counts it in the header's `lost_no_channel` (region-wide: the event
//! never had a channel, so no channel's counters can say it). So that a
//! CTF reader sees these losses too, the host writes them as the discarded
//! events of one more stream of the user trace, the *no-channel stream*:
//! stream class 1, `stream_instance_id` = the number of channels (one past
//! the last channel, so no real channel shares it), file
//! `user/user_no_channel`. Its packets hold no event; their
//! `events_discarded` is the running `lost_no_channel` count, and the first
//! one says 0 (babeltrace2 gives no count for losses that a stream's first
//! packet announces). docs/abi.md, "Lost events", says why this stream and
//! not a user channel's.

use crate::abi;
use crate::packet::PacketHeader;

/// The largest count a packet carries: babeltrace2 takes 2^64-1 for
/// "unknown" and Trace Compass reads the field as a signed long.
const COUNT_MAX: u64 = i64::MAX as u64;

/// What the no-channel stream has written so far.
#[derive(Debug, Clone, Default)]
pub(super) struct NoChannelStream {
    /// The count the last packet carried (what CTF readers have seen).
    carried: u64,
    /// Packets written (the next `packet_seq_num`).
    packets: u64,
    /// Writer-clock time of the last packet (the stream stays monotonic).
    last_ts: u64,
}

impl NoChannelStream {
    /// The stream as an earlier run of the recording left it: `last` is
    /// the last packet of its file (`ivtrace record --resume`), so the
    /// next packet continues its sequence and count.
    pub(super) fn resumed(last: &PacketHeader) -> NoChannelStream {
        NoChannelStream {
            carried: last.events_discarded.min(COUNT_MAX),
            packets: last.packet_seq_num.saturating_add(1),
            last_ts: last.timestamp_end,
        }
    }

    /// The count CTF readers have seen (what the sidecar reports).
    pub(super) fn carried(&self) -> u64 {
        self.carried
    }

    /// Whether a packet is due: the region's counter grew past what the
    /// stream carries and, while recording (`rate_limit` ticks given), the
    /// writer clock moved on by at least that much since the last packet,
    /// so a steady stream of drops costs one packet per interval, not one
    /// per drain pass.
    pub(super) fn due(&self, count: u64, ts: u64, rate_limit: Option<u64>) -> bool {
        let grew = count.min(COUNT_MAX) > self.carried;
        match rate_limit {
            _ if !grew => false,
            Some(_) if self.packets == 0 => true,
            Some(ticks) => ts >= self.last_ts.saturating_add(ticks),
            None => true,
        }
    }

    /// The packets that announce `count` losses at writer time `ts`: a
    /// leading one with 0 the first time, then one with the count. Empty
    /// packets (header only), so `content_size = packet_size = 88 bytes`.
    pub(super) fn packets(&mut self, count: u64, ts: u64, instance: u32) -> Vec<[u8; 88]> {
        let ts = ts.max(self.last_ts);
        let mut out = Vec::with_capacity(2);
        if self.packets == 0 {
            out.push(self.packet(0, ts, instance));
        }
        let count = count.min(COUNT_MAX).max(self.carried);
        out.push(self.packet(count, ts, instance));
        self.carried = count;
        self.last_ts = ts;
        out
    }

    fn packet(&mut self, discarded: u64, ts: u64, instance: u32) -> [u8; 88] {
        let bits = abi::PACKET_HDR_BITS;
        let h = PacketHeader {
            magic: abi::IVT_CTF_MAGIC,
            stream_id: abi::IVT_STREAM_USER,
            stream_instance_id: instance as u64,
            timestamp_begin: ts,
            timestamp_end: ts,
            content_size: bits,
            packet_size: bits,
            packet_seq_num: self.packets,
            events_discarded: discarded,
            first_event_seq: 0,
            event_count: 0,
            cpu_id: 0,
            owner_pid: 0,
            owner_tid: 0,
        };
        let mut bytes = [0u8; abi::PACKET_HDR_SIZE];
        h.write(&mut bytes);
        self.packets = self.packets.saturating_add(1);
        bytes
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn parse(b: &[u8; 88]) -> PacketHeader {
        PacketHeader::parse(b)
    }

    #[test]
    fn the_first_packet_says_zero_then_the_running_count() {
        let mut s = NoChannelStream::default();
        assert!(!s.due(0, 5, None));
        assert!(s.due(3, 5, Some(100)));
        let p = s.packets(3, 5, 9);
        assert_eq!(p.len(), 2);
        let (a, b) = (parse(&p[0]), parse(&p[1]));
        assert_eq!((a.events_discarded, b.events_discarded), (0, 3));
        assert_eq!((a.packet_seq_num, b.packet_seq_num), (0, 1));
        assert_eq!(
            (b.stream_id, b.stream_instance_id),
            (abi::IVT_STREAM_USER, 9)
        );
        assert_eq!((b.event_count, b.content_size), (0, 88 * 8));
        assert_eq!(s.carried(), 3);
        let p = s.packets(7, 4, 9);
        assert_eq!(p.len(), 1);
        let c = parse(&p[0]);
        assert_eq!((c.events_discarded, c.packet_seq_num), (7, 2));
        assert_eq!(c.timestamp_begin, 5, "the stream's time never goes back");
    }

    #[test]
    fn recording_rate_limits_and_the_count_never_shrinks_or_overflows() {
        let mut s = NoChannelStream::default();
        s.packets(10, 1_000, 1);
        assert!(!s.due(11, 1_050, Some(100)), "within the interval");
        assert!(s.due(11, 1_100, Some(100)));
        assert!(
            s.due(11, 1_050, None),
            "the final packet is never held back"
        );
        assert!(
            !s.due(9, 5_000, None),
            "a counter that went back is not news"
        );
        let p = s.packets(9, 5_000, 1);
        assert_eq!(parse(&p[0]).events_discarded, 10);
        let p = s.packets(u64::MAX, 6_000, 1);
        assert_eq!(parse(&p[0]).events_discarded, COUNT_MAX);
        assert!(!s.due(u64::MAX, 9_000, None));
    }
}
