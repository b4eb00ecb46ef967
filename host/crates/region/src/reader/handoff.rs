//! A guest that migrates while it is traced: where one host's part of the
//! trace ends and the next host's begins.
//!
//! The region's memory travels with the guest (QEMU migrates it as guest
//! RAM), but only what the *guest* wrote is exact on the destination:
//! migration copies the pages the guest dirtied, and the host's own stores
//! into the region (`consumed`, the heartbeat, `host_sleeping`) are not
//! tracked, so the destination may hold an older `consumed` than the
//! source host reached. Positions from the region alone would make the next
//! host read packets again that the first already wrote. So the first host
//! ends its part with a [`Handoff`]: per channel, the first packet it did
//! *not* write (it writes complete packets only and leaves the open one to
//! the next host, whose guest goes on filling it), the event it expected
//! next, and the losses its trace already announced. The next host resumes
//! from it ([`Reader::resume`]): it skips the packets the first part holds,
//! counts them, and announces only the losses that happen in its own part,
//! so the two traces together hold every event once and every loss once.
//! docs/migration.md describes the whole procedure.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{PacketSink, Pass, Reader, WriterLosses};
use crate::meta::ScanMode;

/// The trace UUID of part `part` of a region's trace: the region's, with
/// the part number mixed into its last four bytes (part 0 keeps the
/// region's), so the parts are distinct traces to CTF readers.
pub fn part_uuid(uuid: [u8; 16], part: u32) -> [u8; 16] {
    let mut out = uuid;
    for (b, p) in out[12..].iter_mut().zip(part.to_le_bytes()) {
        *b ^= p;
    }
    out
}

/// Where one channel's part ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelHandoff {
    pub channel: u32,
    /// The first packet this part did not write.
    pub next_seq: u64,
    /// `first_event_seq` the next packet should carry, if known.
    pub expected_first_event: Option<u64>,
    /// The writer's drop counters this part (and the ones before it) announced.
    pub writer_full: u64,
    pub writer_too_big: u64,
    pub writer_nested: u64,
}

/// What a part that ended by handing the guest over leaves the next part.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    /// The region's uuid (the next host checks it is the same region).
    pub region_uuid: String,
    /// This part's number (the first recording of a region is part 0).
    pub part: u32,
    pub subbuf_size: u32,
    pub nr_subbufs: u32,
    pub channels: Vec<ChannelHandoff>,
    /// `lost_no_channel` as far as this part announced it.
    pub lost_no_channel: u64,
}

/// A handoff that does not belong to this region.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HandoffError {
    #[error("the handoff is for region {theirs}, this region is {ours} (another guest, or the guest re-formatted its region)")]
    OtherRegion { ours: String, theirs: String },
    #[error("the handoff's geometry ({theirs}) differs from this region's ({ours})")]
    Geometry { ours: String, theirs: String },
}

/// What resuming found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Resumed {
    /// This part's number.
    pub part: u32,
    /// Packets the region still offered that the previous part had
    /// already written (its `consumed` arrived older than where that host
    /// stopped): skipped, not lost.
    pub already_recorded: u64,
}

fn geometry(subbuf_size: u32, nr_subbufs: u32, channels: usize) -> String {
    format!("{channels} channels of {nr_subbufs} x {subbuf_size} bytes")
}

impl Reader {
    /// The last pass of a part that hands the guest over: every complete
    /// packet, and not the committed prefixes of open packets (the guest
    /// goes on filling them on the next host, which writes them whole).
    pub fn drain_for_handoff<S: PacketSink>(&mut self, sink: &mut S) -> Result<Pass, S::Error> {
        self.scan_metadata(ScanMode::Final);
        self.drain_available(sink)
    }

    /// Where this part ends (after [`Reader::finish`], whose counts the
    /// traces announce).
    pub fn handoff(&self, part: u32) -> Handoff {
        let channels = (0u32..)
            .zip(&self.channels)
            .map(|(c, ch)| {
                let announced = announced_writer_losses(ch.stats.writer_lost, ch.writer_base);
                ChannelHandoff {
                    channel: c,
                    next_seq: ch.next_seq,
                    expected_first_event: ch.expected_first_event,
                    writer_full: announced.full,
                    writer_too_big: announced.too_big,
                    writer_nested: announced.nested,
                }
            })
            .collect();
        Handoff {
            region_uuid: self.region.header().uuid_string(),
            part,
            subbuf_size: self.layout.subbuf_size,
            nr_subbufs: self.layout.nr_subbufs,
            channels,
            lost_no_channel: self.no_channel_base.saturating_add(self.lost_no_channel()),
        }
    }

    /// Continues the trace `from` ended: each channel starts at the
    /// handoff's packet (or later, if the region's `consumed` is further),
    /// gives the skipped sub-buffers back to the writer at once, and counts
    /// only the losses after the handoff's. Checks the handoff is this
    /// region's.
    pub fn resume(&mut self, from: &Handoff) -> Result<Resumed, HandoffError> {
        self.check_handoff(from)?;
        let mut already = 0u64;
        for h in &from.channels {
            let Some(ch) = self.channels.get_mut(h.channel as usize) else {
                continue;
            };
            if let Some(skipped) = h.next_seq.checked_sub(ch.next_seq).filter(|&n| n > 0) {
                already = already.saturating_add(skipped);
                ch.next_seq = h.next_seq;
            }
            ch.expected_first_event = h.expected_first_event;
            ch.writer_base = WriterLosses {
                full: h.writer_full,
                too_big: h.writer_too_big,
                nested: h.writer_nested,
            };
            ch.writer_discarded = ch.writer_base.total();
            // The writer may reuse these sub-buffers now: the previous host
            // copied them (the store-release pairs with ivt_writer_open()'s
            // load-acquire of consumed, as in the drain).
            self.region
                .protocol()
                .release_subbufs(h.channel, ch.next_seq);
        }
        self.no_channel_base = from.lost_no_channel;
        Ok(Resumed {
            part: from.part.saturating_add(1),
            already_recorded: already,
        })
    }

    fn check_handoff(&self, from: &Handoff) -> Result<(), HandoffError> {
        let ours = self.region.header().uuid_string();
        if from.region_uuid != ours {
            return Err(HandoffError::OtherRegion {
                ours,
                theirs: from.region_uuid.clone(),
            });
        }
        let l = &self.layout;
        if from.subbuf_size != l.subbuf_size
            || from.nr_subbufs != l.nr_subbufs
            || from.channels.len() != l.nr_channels as usize
        {
            return Err(HandoffError::Geometry {
                ours: geometry(l.subbuf_size, l.nr_subbufs, l.nr_channels as usize),
                theirs: geometry(from.subbuf_size, from.nr_subbufs, from.channels.len()),
            });
        }
        Ok(())
    }
}

/// The cumulative writer counts a part's traces have announced: its own
/// (`since` its base) plus the base.
fn announced_writer_losses(own: WriterLosses, base: WriterLosses) -> WriterLosses {
    WriterLosses {
        full: own.full.saturating_add(base.full),
        too_big: own.too_big.saturating_add(base.too_big),
        nested: own.nested.saturating_add(base.nested),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_zero_keeps_the_region_uuid_and_parts_differ() {
        let u = [7u8; 16];
        assert_eq!(part_uuid(u, 0), u);
        assert_ne!(part_uuid(u, 1), u);
        assert_ne!(part_uuid(u, 1), part_uuid(u, 2));
    }
}
