//! The drain engine: copies packets out of every channel, validates the
//! copies, rewrites the fields the host owns and hands them to a sink.
//!
//! Positions follow abi/include/ivtrace/writer.h: packet `seq` is complete
//! once `commit_pos >= (seq + 1) * S`, open with a committed prefix while
//! `seq * S < commit_pos`. Discard-mode writers reuse a sub-buffer only
//! after the host store-releases `consumed` past it; overwrite-mode writers
//! reuse it at will, so every copy is followed by an acquire fence and a
//! re-read of `open_seq` (torn if `open_seq >= seq + nr_subbufs`).
//!
//! Losses are counted per channel and reason. Events the host could not
//! keep (overwritten, torn, corrupt packets) are measured from the gap in
//! `first_event_seq` at the next good packet (or from `events_closed` at
//! the end), bounded by what the skipped packets could have held.

use std::collections::BTreeMap;

mod handoff;
mod no_channel;

pub use handoff::{part_uuid, ChannelHandoff, Handoff, HandoffError, Resumed};

use crate::abi;
use crate::classes::EventClasses;
use crate::meta::{MetaParser, ScanMode};
use crate::ns::NsScale;
use crate::packet::{
    self, EventVisitor, Expected, Extent, PacketFault, PacketHeader, TickRange, WalkFault,
    WalkFrom, WalkSummary,
};
use crate::region::{Layout, Region};
use crate::retime::{retime_tail, Retimer};

/// The largest `events_discarded` the host writes. CTF declares it a
/// 64-bit count, but babeltrace2 2.0 takes 2^64-1 for "unknown" and
/// aborts on it (an assertion in its message iterator), and Trace Compass
/// reads the field as a signed long: a running loss count the guest's
/// counters push past this is clamped here (and reported).
pub const CTF_DISCARDED_MAX: u64 = i64::MAX as u64;

/// Within a drain pass, the sink commits and the reader hands sub-buffers
/// back every this many bytes, so a long pass never holds a ring's worth
/// back from the writer (and write(2) sizes stay what buffered writes
/// gave before).
pub const COMMIT_BYTES: u64 = 1 << 20;

/// How much earlier than the earlier run's last user time (in ns) a
/// resumed channel's next packet may begin: the sidecar that gives back
/// that run's mapping is written after the drain takes a refinement, so
/// the two can differ by a refinement's step (tens of ns measured).
const RESUME_SLACK_NS: u64 = 1_000;

/// Receives validated packets, ready to be written as they are.
pub trait PacketSink {
    type Error;

    /// Whether the sink takes a packet of `len` bytes for channel `chan`
    /// (an output size limit may refuse it: the reader then counts its
    /// events as lost, [`HostLoss::OverLimit`]).
    fn accepts(&mut self, _chan: u32, _len: usize) -> bool {
        true
    }

    /// Makes every packet handed over so far durable enough to hand its
    /// sub-buffer back to the writer (a file sink: write(2) returned).
    /// The reader calls it every [`COMMIT_BYTES`] of a pass and then
    /// releases the sub-buffers; the caller commits the rest of a pass
    /// and calls [`Reader::commit_written`]. Nothing by default (a sink
    /// that keeps nothing back).
    fn commit(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// One packet of channel `chan` of stream class `stream`; `classes`
    /// describes every event id it contains.
    fn packet(
        &mut self,
        chan: u32,
        stream: u32,
        bytes: &[u8],
        classes: &EventClasses,
    ) -> Result<(), Self::Error>;
}

/// Why the host lost events (as opposed to the writer dropping them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HostLoss {
    /// The writer lapped the reader (overwrite mode).
    Overwritten,
    /// The copy was overwritten while it was taken.
    Torn,
    /// The packet failed validation.
    Corrupt,
    /// The output's size limit refused it.
    OverLimit,
}

/// Writer-side drop counters of a channel (`ivt_channel.lost_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterLosses {
    pub full: u64,
    pub too_big: u64,
    pub nested: u64,
}

impl WriterLosses {
    /// The drops after `base` (an earlier part's counts), per reason.
    pub fn since(&self, base: &WriterLosses) -> WriterLosses {
        WriterLosses {
            full: self.full.saturating_sub(base.full),
            too_big: self.too_big.saturating_sub(base.too_big),
            nested: self.nested.saturating_sub(base.nested),
        }
    }

    pub fn total(&self) -> u64 {
        self.full
            .saturating_add(self.too_big)
            .saturating_add(self.nested)
    }
}

/// Host-side losses of a channel, in events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostLosses {
    pub overwritten: u64,
    pub torn: u64,
    pub corrupt: u64,
    pub over_limit: u64,
    /// Declared by the packets of an earlier run of a resumed recording
    /// (their reasons died with that recorder).
    pub earlier_run: u64,
}

impl HostLosses {
    pub fn total(&self) -> u64 {
        self.overwritten
            .saturating_add(self.torn)
            .saturating_add(self.corrupt)
            .saturating_add(self.over_limit)
            .saturating_add(self.earlier_run)
    }

    fn add(&mut self, reason: HostLoss, n: u64) {
        let slot = match reason {
            HostLoss::Overwritten => &mut self.overwritten,
            HostLoss::Torn => &mut self.torn,
            HostLoss::Corrupt => &mut self.corrupt,
            HostLoss::OverLimit => &mut self.over_limit,
        };
        *slot = slot.saturating_add(n);
    }
}

/// What one channel produced and lost.
#[derive(Debug, Clone, Default)]
pub struct ChannelStats {
    pub events: u64,
    pub packets: u64,
    /// Packets that were the committed prefix of an open packet.
    pub partial_packets: u64,
    /// Bytes handed to the sink (headers and padding included).
    pub bytes_out: u64,
    /// Bytes of events (headers, payloads, alignment).
    pub event_bytes: u64,
    /// Bytes of event headers.
    pub header_bytes: u64,
    pub extended_headers: u64,
    pub utf8_fixed: u64,
    pub first_ts: Option<u64>,
    pub last_ts: u64,
    pub writer_lost: WriterLosses,
    pub host_lost: HostLosses,
    /// Skipped packets by fault reason (`PacketFault::reason`).
    pub skipped: BTreeMap<&'static str, u64>,
    /// Snapshot: events committed before the oldest packet kept.
    pub older_overwritten: u64,
    /// The largest running loss count the guest's counters gave, when it
    /// was past [`CTF_DISCARDED_MAX`] (then the packets say that instead).
    pub discarded_clamped: Option<u64>,
    /// Times written as the stream's previous one, so that it never goes
    /// back when the mapping in force changes ([`Reader::set_user_clock`]).
    pub ts_clamped: u64,
    /// Packets whose compact headers could not hold their times in
    /// nanoseconds, written afresh ([`crate::retime::retime_tail`]).
    pub retimed_slow: u64,
}

/// Per-channel reading position and loss bookkeeping.
#[derive(Debug, Clone)]
struct ChannelState {
    stream: u32,
    next_seq: u64,
    /// Complete packets below this are done with (written or skipped):
    /// what the next commit hands back to the writer.
    complete_upto: u64,
    /// first_event_seq the next packet should carry, if known.
    expected_first_event: Option<u64>,
    /// Skipped packets whose events are not accounted yet, per reason.
    pending: BTreeMap<HostLoss, u64>,
    /// Writer drops as last written (clamped, monotonic).
    writer_discarded: u64,
    last_written: Option<LastWritten>,
    saw_first_packet: bool,
    /// A packet of this channel was handed to the sink.
    emitted_any: bool,
    /// The timestamp_end, in nanoseconds, of the last packet written of a
    /// user stream converted to nanoseconds ([`Reader::set_user_clock`]).
    last_ns: u64,
    /// Writer drops an earlier host already announced (a guest that
    /// migrated here: [`handoff`]); this part's packets announce the rest.
    writer_base: WriterLosses,
    stats: ChannelStats,
}

#[derive(Debug, Clone, Copy)]
struct LastWritten {
    seq: u64,
    ts_end: u64,
    discarded: u64,
    cpu_id: u32,
    owner_pid: u32,
    owner_tid: u32,
}

impl ChannelState {
    fn new(stream: u32, start_seq: u64) -> ChannelState {
        ChannelState {
            stream,
            next_seq: start_seq,
            complete_upto: start_seq,
            expected_first_event: (start_seq == 0).then_some(0),
            pending: BTreeMap::new(),
            writer_discarded: 0,
            last_written: None,
            saw_first_packet: false,
            emitted_any: false,
            last_ns: 0,
            writer_base: WriterLosses::default(),
            stats: ChannelStats::default(),
        }
    }

    fn skip(&mut self, loss: HostLoss, reason: &'static str, packets: u64) {
        let n = self.stats.skipped.entry(reason).or_default();
        *n = n.saturating_add(packets);
        let p = self.pending.entry(loss).or_default();
        *p = p.saturating_add(packets);
    }

    /// The running loss count a packet carries: the writer's drops since
    /// the part began (all of them without a handoff) plus the host's
    /// losses, clamped to what CTF readers accept.
    fn discarded(&mut self) -> u64 {
        // A migrated guest's later part announces only the drops after the
        // handoff's ([`Reader::resume`]); writer_base is zero otherwise.
        let total = self
            .writer_discarded
            .saturating_sub(self.writer_base.total())
            .saturating_add(self.stats.host_lost.total());
        if total > CTF_DISCARDED_MAX {
            let seen = self.stats.discarded_clamped.unwrap_or(0).max(total);
            self.stats.discarded_clamped = Some(seen);
        }
        total.min(CTF_DISCARDED_MAX)
    }

    /// Attributes the events between the expected and the actual
    /// first_event_seq to the pending skip reasons, each bounded by what
    /// its packets could hold.
    fn account_gap(&mut self, first_event_seq: u64, max_per_packet: u64) {
        let gap = match self.expected_first_event {
            Some(e) => first_event_seq.saturating_sub(e),
            None => 0,
        };
        let mut left = gap;
        for (&reason, &packets) in &self.pending {
            let n = left.min(packets.saturating_mul(max_per_packet));
            self.stats.host_lost.add(reason, n);
            left = left.saturating_sub(n); // n <= left
        }
        self.pending.clear();
    }
}

/// A packet header copied ahead of its turn ([`Reader::successor_begin`]).
#[derive(Debug, Clone, Copy)]
struct Peeked {
    chan: u32,
    seq: u64,
    header: [u8; abi::PACKET_HDR_SIZE],
}

/// A user packet's times in nanoseconds, from its walk.
#[derive(Debug, Clone, Copy)]
struct Times {
    begin_ns: u64,
    end_ns: u64,
    clamped: u64,
    /// Written afresh (its length changed): [`Retimer::tail`].
    slow: bool,
}

/// A copied packet that passed every check, ready to finalize.
#[derive(Debug, Clone, Copy)]
struct Checked {
    header: PacketHeader,
    /// Bytes of content in the scratch buffer.
    content: usize,
    summary: WalkSummary,
    times: Option<Times>,
}

/// Counters for one drain pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    pub packets: u64,
    pub bytes: u64,
}

/// The reader of one region.
pub struct Reader {
    region: Region,
    layout: Layout,
    classes: EventClasses,
    meta: MetaParser,
    channels: Vec<ChannelState>,
    /// Each channel's state at the last commit, if packets were handed to
    /// the sink since ([`Reader::commit_written`], [`Reader::rollback_unwritten`]).
    uncommitted: Vec<Option<ChannelState>>,
    /// Bytes handed to the sink since the last commit.
    since_commit: u64,
    /// `lost_no_channel` as a stream of its own ([`no_channel`]).
    no_channel: no_channel::NoChannelStream,
    /// `lost_no_channel` an earlier host already announced ([`handoff`]).
    no_channel_base: u64,
    /// The no-channel stream at the last commit, if it wrote since.
    no_channel_uncommitted: Option<no_channel::NoChannelStream>,
    /// The timestamps the trace's clock can express: a packet with one
    /// outside is skipped ([`PacketFault::TimeUnexpressible`]).
    ticks: TickRange,
    /// The header of a complete packet copied while its predecessor's
    /// neighbours were checked.
    peeked: Option<Peeked>,
    /// The mapping in force for the user streams' times, which the drain
    /// rewrites in nanoseconds; None: they stay in ticks.
    user_ns: Option<NsScale>,
    scratch: Vec<u8>,
    /// Where a packet is written afresh when its times cannot be
    /// rewritten in place ([`retime_tail`]).
    spare: Vec<u8>,
}

impl Reader {
    /// Starts reading each channel where a previous host left it
    /// (`consumed`), or at packet 0. `ticks`: what the trace's clock can
    /// express (ivtrace-time's `ClockMapping::expressible`); packets with
    /// timestamps outside are skipped and counted.
    pub fn new(region: Region, ticks: TickRange) -> Reader {
        let layout = *region.layout();
        let channels: Vec<ChannelState> = (0..layout.nr_channels)
            .map(|c| ChannelState::new(layout.stream_of(c), region.protocol().consumed(c)))
            .collect();
        Reader {
            region,
            layout,
            classes: EventClasses::default(),
            meta: MetaParser::new(),
            uncommitted: vec![None; channels.len()],
            since_commit: 0,
            channels,
            no_channel: Default::default(),
            no_channel_base: 0,
            no_channel_uncommitted: None,
            ticks,
            peeked: None,
            user_ns: None,
            scratch: vec![0u8; (layout.subbuf_size as usize).saturating_add(8)],
            spare: Vec::new(),
        }
    }

    /// Writes the user streams' times in nanoseconds since the epoch from
    /// now on, with `scale` (the mapping in force), and takes `ticks`, the
    /// tick values it can place (ivtrace-time's `ClockMapping::expressible`
    /// of the same mapping). Call it before the first drain and after each
    /// refined mapping; each stream's times still never go back (counted,
    /// [`ChannelStats::ts_clamped`]). Call it before
    /// [`Reader::resume_channel`], which reads the earlier run's user
    /// times back to ticks only if they are in nanoseconds.
    pub fn set_user_clock(&mut self, scale: NsScale, ticks: TickRange) {
        self.user_ns = Some(scale);
        self.ticks = ticks;
    }

    /// Whether user streams are written in nanoseconds.
    pub fn user_in_ns(&self) -> bool {
        self.user_ns.is_some()
    }

    /// Remembers channel `c`'s state before the first change since the
    /// last commit.
    fn save(&mut self, c: u32) {
        let slot = &mut self.uncommitted[c as usize];
        if slot.is_none() {
            *slot = Some(self.channels[c as usize].clone());
        }
    }

    /// The sink has written every packet handed to it (write(2) returned):
    /// hands their sub-buffers back to the writer. Until this, a writer in
    /// discard mode cannot reuse them, so a recorder killed before writing
    /// loses nothing the next one cannot read (docs/hardening.md).
    pub fn commit_written(&mut self) {
        self.since_commit = 0;
        self.no_channel_uncommitted = None;
        for c in 0..self.layout.nr_channels {
            let Some(before) = self.uncommitted[c as usize].take() else {
                continue;
            };
            let upto = self.channels[c as usize].complete_upto;
            if upto > before.complete_upto {
                self.region.protocol().release_subbufs(c, upto);
            }
        }
    }

    /// The sink could not write what it was handed (a full disk): forget
    /// every packet since the last commit. They stay in the region,
    /// unreleased, and the statistics count only what was written.
    pub fn rollback_unwritten(&mut self) {
        self.since_commit = 0;
        if let Some(before) = self.no_channel_uncommitted.take() {
            self.no_channel = before;
        }
        for (ch, saved) in self.channels.iter_mut().zip(self.uncommitted.iter_mut()) {
            if let Some(before) = saved.take() {
                *ch = before;
            }
        }
    }

    /// Starts channel `c` after the packets an earlier run of this
    /// recording wrote (`ivtrace record --resume`): `last` is the header
    /// of the last packet in its stream file, `events` the events and
    /// `bytes` the bytes of that file. `earlier`: the mapping that run
    /// converted its user times with (its sidecar's), which reads them
    /// back: this run's own measurement may place that run's last time
    /// after this run's first and refuse the packet that follows it.
    pub fn resume_channel(
        &mut self,
        c: u32,
        last: &PacketHeader,
        (events, packets, bytes): (u64, u64, u64),
        earlier: NsScale,
    ) {
        let writer_now = self.region.protocol().writer_losses(c).total();
        let scale = self.user_ns.map(|_| earlier);
        let ch = &mut self.channels[c as usize];
        // A user stream in nanoseconds: its checks go on in ticks, the
        // earlier run's end read back with its own mapping, less a slack
        // for a refinement its sidecar had not caught up with yet (the
        // times written stay monotonic in nanoseconds: `last_ns`).
        let ts_end = match scale.filter(|_| ch.stream == abi::IVT_STREAM_USER) {
            Some(scale) => {
                ch.last_ns = last.timestamp_end;
                scale.ticks_at(last.timestamp_end.saturating_sub(RESUME_SLACK_NS))
            }
            None => last.timestamp_end,
        };
        ch.next_seq = last.packet_seq_num.saturating_add(1).max(ch.next_seq);
        ch.complete_upto = ch.next_seq;
        let first = last.first_event_seq.saturating_add(last.event_count as u64);
        ch.expected_first_event = Some(first);
        // The running loss count goes on from the last packet: what the
        // writer's counters account for stays the writer's, any excess
        // was the earlier recorder's own losses.
        ch.writer_discarded = last.events_discarded.min(writer_now);
        ch.stats.host_lost.earlier_run = last.events_discarded.saturating_sub(ch.writer_discarded);
        ch.saw_first_packet = true;
        ch.emitted_any = true;
        ch.last_written = Some(LastWritten {
            seq: last.packet_seq_num,
            ts_end,
            discarded: last.events_discarded,
            cpu_id: last.cpu_id,
            owner_pid: last.owner_pid,
            owner_tid: last.owner_tid,
        });
        ch.stats.events = events;
        ch.stats.packets = packets;
        ch.stats.bytes_out = bytes;
        ch.stats.last_ts = ts_end;
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    pub fn classes(&self) -> &EventClasses {
        &self.classes
    }

    pub fn meta(&self) -> &MetaParser {
        &self.meta
    }

    /// Statistics of channel `c`.
    pub fn channel_stats(&self, c: u32) -> &ChannelStats {
        &self.channels[c as usize].stats
    }

    pub fn nr_channels(&self) -> u32 {
        self.layout.nr_channels
    }

    /// Parses newly committed event descriptions.
    pub fn scan_metadata(&mut self, mode: ScanMode) -> usize {
        self.meta.scan(&self.region, &mut self.classes, mode)
    }

    fn max_events_per_packet(&self) -> u64 {
        u64::from(self.layout.subbuf_size)
            .saturating_sub(abi::PACKET_HDR_SIZE as u64)
            .checked_div(abi::IVT_EV_COMPACT_SIZE as u64)
            .unwrap_or(0)
    }

    fn load_commit_pos(&self, c: u32) -> u64 {
        self.region.protocol().commit_pos(c)
    }

    /// The writer's drop counters of channel `c`.
    pub fn writer_losses(&self, c: u32) -> WriterLosses {
        self.region.protocol().writer_losses(c)
    }

    /// Drains every complete packet of every channel once.
    pub fn drain_available<S: PacketSink>(&mut self, sink: &mut S) -> Result<Pass, S::Error> {
        self.scan_metadata(ScanMode::Live);
        let mut pass = Pass::default();
        for c in 0..self.layout.nr_channels {
            let p = self.drain_channel(c, sink)?;
            pass.packets = pass.packets.saturating_add(p.packets);
            pass.bytes = pass.bytes.saturating_add(p.bytes);
        }
        self.account_no_channel(sink, false)?;
        Ok(pass)
    }

    /// Drains channel `c`'s complete packets (at most one ring's worth).
    fn drain_channel<S: PacketSink>(&mut self, c: u32, sink: &mut S) -> Result<Pass, S::Error> {
        let complete = self.load_commit_pos(c) >> self.layout.subbuf_size.trailing_zeros();
        let mut pass = Pass::default();
        let next = self.channels[c as usize].next_seq;
        if complete <= next {
            return Ok(pass);
        }
        self.save(c);
        self.skip_lapped(c, complete);
        while self.channels[c as usize].next_seq < complete {
            let seq = self.channels[c as usize].next_seq;
            let bytes = self.process(c, seq, Extent::Complete, sink)?;
            pass.bytes = pass.bytes.saturating_add(bytes as u64);
            pass.packets = pass.packets.saturating_add(1);
            let ch = &mut self.channels[c as usize];
            // seq < complete: seq + 1 cannot overflow.
            ch.next_seq = seq.saturating_add(1);
            // Handed back to the writer only once written
            // (commit_written): the copy above happens before the
            // writer reuses the sub-buffer, and so does the write.
            ch.complete_upto = ch.next_seq;
            if self.since_commit >= COMMIT_BYTES {
                sink.commit()?;
                self.commit_written();
                self.save(c);
            }
        }
        Ok(pass)
    }

    /// Packets older than one ring behind `complete` are gone.
    fn skip_lapped(&mut self, c: u32, complete: u64) {
        let ring = self.layout.nr_subbufs as u64;
        let ch = &mut self.channels[c as usize];
        // complete > next_seq (the caller checked).
        let oldest = complete.saturating_sub(ring);
        if oldest > ch.next_seq {
            let lost = oldest.saturating_sub(ch.next_seq);
            ch.skip(HostLoss::Overwritten, "overwritten", lost);
            ch.next_seq = oldest;
        }
    }

    /// Copies, checks and emits packet `seq` of channel `c`. Returns the
    /// bytes emitted (0 if the packet was skipped).
    fn process<S: PacketSink>(
        &mut self,
        c: u32,
        seq: u64,
        extent: Extent,
        sink: &mut S,
    ) -> Result<usize, S::Error> {
        let exp = Expected {
            stream: self.channels[c as usize].stream,
            channel: c,
            seq,
            subbuf_size: self.layout.subbuf_size,
            ticks: self.ticks,
        };
        let mut checked = self.take(c, &exp, extent);
        // An unknown event id: its registration may have committed after
        // our last scan. The first walk may have rewritten times in the
        // copy, so the retry copies the packet again.
        if matches!(checked, Err(PacketFault::Walk(WalkFault::UnknownId { .. })))
            && self.scan_metadata(ScanMode::Live) > 0
        {
            checked = self.take(c, &exp, extent);
        }
        let p = match checked {
            Ok(p) => p,
            Err(fault) => return Ok(self.skip_faulty(c, fault)),
        };
        if !sink.accepts(c, p.content.next_multiple_of(8)) {
            self.refused(c, &p.header, &p.summary);
            return Ok(0);
        }
        let bytes = self.finalize(c, &p, extent);
        let emitted = PacketHeader::parse(&self.scratch[..abi::PACKET_HDR_SIZE]);
        self.lead_packet(c, &emitted, sink)?;
        sink.packet(c, exp.stream, &self.scratch[..bytes], &self.classes)?;
        self.since_commit = self.since_commit.saturating_add(bytes as u64);
        Ok(bytes)
    }

    /// babeltrace2 reports losses announced by a stream's *first* packet
    /// without a count. So when the first packet of a channel already
    /// carries events_discarded > 0, an empty packet with 0 goes first,
    /// just before it in time and sequence, and every loss is countable.
    fn lead_packet<S: PacketSink>(
        &mut self,
        c: u32,
        first: &PacketHeader,
        sink: &mut S,
    ) -> Result<(), S::Error> {
        let ch = &mut self.channels[c as usize];
        if std::mem::replace(&mut ch.emitted_any, true) || first.events_discarded == 0 {
            return Ok(());
        }
        let lead = PacketHeader {
            timestamp_end: first.timestamp_begin,
            content_size: abi::PACKET_HDR_BITS,
            packet_size: abi::PACKET_HDR_BITS,
            packet_seq_num: first.packet_seq_num.saturating_sub(1),
            events_discarded: 0,
            event_count: 0,
            ..*first
        };
        let mut bytes = [0u8; abi::PACKET_HDR_SIZE];
        lead.write(&mut bytes);
        ch.stats.bytes_out = ch.stats.bytes_out.saturating_add(bytes.len() as u64);
        sink.packet(c, ch.stream, &bytes, &self.classes)
    }

    /// A valid packet the sink refused (its size limit): its events are
    /// lost, counted exactly.
    fn refused(&mut self, c: u32, h: &PacketHeader, s: &WalkSummary) {
        let max_per_packet = self.max_events_per_packet();
        let ch = &mut self.channels[c as usize];
        ch.account_gap(h.first_event_seq, max_per_packet);
        ch.expected_first_event = Some(h.first_event_seq.saturating_add(s.events));
        ch.stats.host_lost.add(HostLoss::OverLimit, s.events);
        let n = ch.stats.skipped.entry("over_limit").or_default();
        *n = n.saturating_add(1);
    }

    fn skip_faulty(&mut self, c: u32, fault: PacketFault) -> usize {
        let loss = if fault == PacketFault::Torn {
            HostLoss::Torn
        } else {
            HostLoss::Corrupt
        };
        self.channels[c as usize].skip(loss, fault.reason(), 1);
        0
    }

    /// Copies the header, checks it, copies the content, then checks that
    /// the writer did not reuse the sub-buffer meanwhile.
    fn copy_packet(
        &mut self,
        c: u32,
        exp: &Expected,
        extent: Extent,
    ) -> Result<(PacketHeader, usize), PacketFault> {
        let off = self.layout.subbuf_offset(c, exp.seq);
        let hdr = abi::PACKET_HDR_SIZE;
        // Plain copies (pread): ordered after the commit_pos load-acquire in
        // drain_channel/flush_prefix; tearing is checked right after (which
        // covers a header peeked while its predecessor was checked).
        match self.peeked.take() {
            Some(p) if (p.chan, p.seq, extent) == (c, exp.seq, Extent::Complete) => {
                self.scratch[..hdr].copy_from_slice(&p.header);
            }
            _ => {
                if !self.region.copy_out(off, &mut self.scratch[..hdr]) {
                    return Err(PacketFault::Unreadable);
                }
            }
        }
        let header = PacketHeader::parse(&self.scratch[..hdr]);
        let checked = packet::check_header(&header, exp, extent);
        if let Ok(content) = checked {
            if !self.region.copy_out(
                off.saturating_add(hdr as u64),
                &mut self.scratch[hdr..content],
            ) {
                return Err(PacketFault::Unreadable);
            }
        }
        if self.torn(c, exp.seq) {
            return Err(PacketFault::Torn);
        }
        checked.map(|content| (header, content))
    }

    /// Seqlock check after a copy: did the writer reopen the sub-buffer
    /// (a whole ring later) while we copied it?
    fn torn(&self, c: u32, seq: u64) -> bool {
        let open_seq = self.region.protocol().open_seq_after_copy(c);
        open_seq >= seq.saturating_add(self.layout.nr_subbufs as u64)
    }

    /// Copies packet `exp.seq` of channel `c` and checks it.
    fn take(&mut self, c: u32, exp: &Expected, extent: Extent) -> Result<Checked, PacketFault> {
        let (header, content) = self.copy_packet(c, exp, extent)?;
        self.walk_copy(c, &header, content, extent)
    }

    /// Walks the copy, rewriting a user packet's times in nanoseconds on
    /// the way when [`Reader::set_user_clock`] says so, then checks the
    /// packet's place among its channel's neighbours.
    fn walk_copy(
        &mut self,
        c: u32,
        h: &PacketHeader,
        content: usize,
        extent: Extent,
    ) -> Result<Checked, PacketFault> {
        let stream = self.channels[c as usize].stream;
        // Events may not pass the packet's end, nor (end unknown: an open
        // packet's prefix, a sealed orphan) what the clock can express.
        let known_end = extent == Extent::Complete && !h.end_unknown();
        let end = if known_end {
            h.timestamp_end
        } else {
            self.ticks.max
        };
        let mut retimer = self.retimer(c, h)?;
        let (bytes, classes) = (&mut self.scratch[..content], self.classes.stream(stream));
        let from = WalkFrom {
            off: abi::PACKET_HDR_SIZE,
            last_ts: h.timestamp_begin,
        };
        let result = match retimer.as_mut() {
            Some(r) => packet::walk_from(bytes, classes, from, Some(end), &mut (), r),
            None => packet::walk_from(bytes, classes, from, Some(end), &mut (), &mut ()),
        };
        let summary = match result {
            Err(WalkFault::TimeAfterEnd { ts, .. }) if !known_end => {
                return Err(PacketFault::TimeUnexpressible {
                    ts,
                    min: self.ticks.min,
                    max: self.ticks.max,
                })
            }
            r => r?,
        };
        let claimed = h.event_count;
        if extent == Extent::Complete
            && claimed != abi::IVT_EVENT_COUNT_UNKNOWN
            && u64::from(claimed) != summary.events
        {
            return Err(WalkFault::EventCount {
                claimed,
                found: summary.events,
            }
            .into());
        }
        let last = if known_end { end } else { summary.last_ts };
        self.check_neighbours(c, h, last)?;
        let (content, times) = match retimer {
            Some(r) => self.finish_times(stream, content, end, last, r)?,
            None => (content, None),
        };
        Ok(Checked {
            header: *h,
            content,
            summary,
            times,
        })
    }

    /// The retimer of a packet of channel `c` when its times are to be
    /// written in nanoseconds.
    fn retimer(&self, c: u32, h: &PacketHeader) -> Result<Option<Retimer>, PacketFault> {
        let ch = &self.channels[c as usize];
        let Some(scale) = self.user_ns.filter(|_| ch.stream == abi::IVT_STREAM_USER) else {
            return Ok(None);
        };
        let anchor = scale
            .anchor(h.timestamp_begin)
            .ok_or(PacketFault::TimeUnexpressible {
                ts: h.timestamp_begin,
                min: self.ticks.min,
                max: self.ticks.max,
            })?;
        Ok(Some(Retimer::new(anchor, ch.last_ns)))
    }

    /// Completes a walked packet's conversion: the events the walk could
    /// not rewrite in place (the packet is then written afresh, and the
    /// scratch buffer holds the new one), and the end time (`last`, in
    /// ticks). Returns the packet's content length and its times.
    fn finish_times(
        &mut self,
        stream: u32,
        content: usize,
        end: u64,
        last: u64,
        mut r: Retimer,
    ) -> Result<(usize, Option<Times>), PacketFault> {
        if let Some(fault) = r.fault() {
            return Err(fault.into());
        }
        let mut len = content;
        if let Some(tail) = r.tail() {
            let classes = self.classes.stream(stream);
            let bytes = &mut self.scratch[..content];
            retime_tail(bytes, classes, tail, Some(end), &mut r, &mut self.spare)?;
            len = self.spare.len();
            // finalize pads the content to 8 bytes in place.
            let room = len.saturating_add(8).max(self.scratch.len());
            self.spare.resize(room, 0);
            std::mem::swap(&mut self.scratch, &mut self.spare);
        }
        let end_ns = r.end_ns(last).ok_or(WalkFault::TimeUnmapped { ts: last })?;
        let times = Times {
            begin_ns: r.begin_ns(),
            end_ns,
            clamped: r.clamped(),
            slow: r.tail().is_some(),
        };
        Ok((len, Some(times)))
    }

    /// A packet must lie between its channel's neighbours: begin no
    /// earlier than the previous packet (as written) ended, and end no
    /// later than the next one began, when the writer has already opened
    /// it. Tolerance 0: one writer owns a channel and stamps a packet's
    /// begin at or after the previous one's end (writer.h keeps each
    /// stream monotonic, clamping a clock that steps back), so any overlap
    /// is corruption, not jitter. When a packet overlaps its successor and
    /// the successor fits after the predecessor, this packet is the one
    /// out of line: skipped, so one wild timestamp cannot push every later
    /// packet of its channel out of order (docs/hardening.md).
    fn check_neighbours(&mut self, c: u32, h: &PacketHeader, end: u64) -> Result<(), PacketFault> {
        let prev_end = self.channels[c as usize].last_written.map(|l| l.ts_end);
        if let Some(prev) = prev_end.filter(|&prev| h.timestamp_begin < prev) {
            return Err(PacketFault::TimeBeforePrevious {
                begin: h.timestamp_begin,
                end: prev,
            });
        }
        match self.successor_begin(c, h.packet_seq_num) {
            Some(next) if end > next && prev_end.is_none_or(|prev| next >= prev) => {
                Err(PacketFault::TimeAfterNext { end, next })
            }
            _ => Ok(()),
        }
    }

    /// When the writer has already opened packet `seq + 1` of channel `c`
    /// (commit_pos past its start, so its header is published), the time
    /// it began, from a private copy of its header; None otherwise, or
    /// when the copy is not that packet's header (overwritten, torn). A
    /// complete successor's copy is kept for its own turn, next
    /// ([`Reader::copy_packet`]): the check costs no extra copy.
    fn successor_begin(&mut self, c: u32, seq: u64) -> Option<u64> {
        let next = seq.checked_add(1)?;
        let size = u64::from(self.layout.subbuf_size);
        let start = next.checked_mul(size)?;
        // Acquire (in commit_pos): pairs with the writer's store-release
        // after it wrote the successor's header (writer.h, commit).
        let commit = self.load_commit_pos(c);
        if commit <= start {
            return None;
        }
        let mut bytes = [0u8; abi::PACKET_HDR_SIZE];
        // A plain copy (pread), ordered after the acquire above.
        if !self
            .region
            .copy_out(self.layout.subbuf_offset(c, next), &mut bytes)
        {
            return None;
        }
        let h = PacketHeader::parse(&bytes);
        let ours = h.magic == abi::IVT_CTF_MAGIC
            && h.packet_seq_num == next
            && h.stream_instance_id == u64::from(c);
        if commit >= start.saturating_add(size) {
            self.peeked = Some(Peeked {
                chan: c,
                seq: next,
                header: bytes,
            });
        }
        (ours && !self.torn(c, next)).then_some(h.timestamp_begin)
    }

    /// Rewrites the host-owned header fields and pads the content to a
    /// multiple of 8 bytes with zeros. Returns the packet's new size.
    fn finalize(&mut self, c: u32, p: &Checked, extent: Extent) -> usize {
        let (mut h, content, s) = (p.header, p.content, &p.summary);
        let max_per_packet = self.max_events_per_packet();
        let writer_now = self.writer_losses(c).total();
        let ch = &mut self.channels[c as usize];
        ch.account_gap(h.first_event_seq, max_per_packet);
        if !ch.saw_first_packet {
            ch.saw_first_packet = true;
            ch.stats.older_overwritten = h.first_event_seq;
        }
        ch.expected_first_event = Some(h.first_event_seq.saturating_add(s.events));
        ch.writer_discarded = h.events_discarded.min(writer_now).max(ch.writer_discarded);
        let padded = content.next_multiple_of(8);
        h.stream_id = ch.stream;
        h.stream_instance_id = c as u64;
        // Both are at most the sub-buffer size (a u32): in bits they fit.
        h.content_size = (content as u64).saturating_mul(8);
        h.packet_size = (padded as u64).saturating_mul(8);
        h.events_discarded = ch.discarded();
        if extent != Extent::Complete || h.end_unknown() {
            h.timestamp_end = s.last_ts;
        }
        if extent != Extent::Complete || h.event_count == abi::IVT_EVENT_COUNT_UNKNOWN {
            // At most (subbuf_size - 88) / 4 events fit in a packet.
            h.event_count = u32::try_from(s.events).unwrap_or(u32::MAX);
        }
        // The channel's bookkeeping stays in ticks; a user packet's bytes
        // say nanoseconds.
        let mut out = h;
        if let Some(t) = p.times {
            (out.timestamp_begin, out.timestamp_end) = (t.begin_ns, t.end_ns);
            ch.last_ns = t.end_ns;
            ch.stats.ts_clamped = ch.stats.ts_clamped.saturating_add(t.clamped);
            ch.stats.retimed_slow = ch.stats.retimed_slow.saturating_add(u64::from(t.slow));
        }
        out.write(&mut self.scratch);
        self.scratch[content..padded].fill(0);
        record_packet(ch, &h, content, padded, extent, s);
        padded
    }

    /// Emits the committed prefix of every channel's open packet (after
    /// draining what is complete). Used when recording stops.
    pub fn flush_partial<S: PacketSink>(&mut self, sink: &mut S) -> Result<Pass, S::Error> {
        self.scan_metadata(ScanMode::Final);
        let mut pass = Pass::default();
        for c in 0..self.layout.nr_channels {
            let p = self.drain_channel(c, sink)?;
            pass.packets = pass.packets.saturating_add(p.packets);
            pass.bytes = pass.bytes.saturating_add(p.bytes);
            pass.bytes = pass
                .bytes
                .saturating_add(self.flush_prefix(c, sink)? as u64);
        }
        Ok(pass)
    }

    fn flush_prefix<S: PacketSink>(&mut self, c: u32, sink: &mut S) -> Result<usize, S::Error> {
        let commit = self.load_commit_pos(c);
        let shift = self.layout.subbuf_size.trailing_zeros();
        let mask = u64::from(self.layout.subbuf_size).saturating_sub(1);
        // Below subbuf_size, a u32.
        let within = u32::try_from(commit & mask).unwrap_or(u32::MAX);
        let seq = commit >> shift;
        if within == 0 || seq != self.channels[c as usize].next_seq {
            return Ok(0);
        }
        self.save(c);
        if (within as usize) < abi::PACKET_HDR_SIZE {
            return Ok(self.skip_faulty(
                c,
                PacketFault::ContentSize {
                    bits: u64::from(within).saturating_mul(8),
                    max: self.layout.subbuf_size as u64,
                },
            ));
        }
        let bytes = self.process(c, seq, Extent::Prefix(within), sink)?;
        // The prefix was taken: later passes start after this packet.
        self.channels[c as usize].next_seq = seq.saturating_add(1);
        Ok(bytes)
    }

    /// The final accounting of [`Reader::finish`] without writing
    /// anything (the output failed): the losses are counted, no packet
    /// carries them.
    pub fn account_final(&mut self) {
        let max_per_packet = self.max_events_per_packet();
        for c in 0..self.layout.nr_channels {
            let losses = self.writer_losses(c);
            let closed = self.region.protocol().events_closed(c);
            let ch = &mut self.channels[c as usize];
            ch.stats.writer_lost = losses;
            let end = closed.max(ch.expected_first_event.unwrap_or(0));
            ch.account_gap(end, max_per_packet);
        }
    }

    /// Final accounting: reads the writers' drop counters, attributes
    /// losses still pending, and emits an empty packet on each channel
    /// whose discarded count grew after its last packet (so CTF readers
    /// see every loss).
    pub fn finish<S: PacketSink>(&mut self, sink: &mut S) -> Result<(), S::Error> {
        let max_per_packet = self.max_events_per_packet();
        for c in 0..self.layout.nr_channels {
            self.save(c);
            let losses = self.writer_losses(c);
            let closed = self.region.protocol().events_closed(c);
            let ch = &mut self.channels[c as usize];
            ch.stats.writer_lost = losses.since(&ch.writer_base);
            let end = closed.max(ch.expected_first_event.unwrap_or(0));
            ch.account_gap(end, max_per_packet);
            ch.writer_discarded = ch.writer_discarded.max(losses.total());
            self.emit_trailing_drops(c, sink)?;
        }
        self.account_no_channel(sink, true)
    }

    /// Continues the no-channel stream after the last packet an earlier
    /// run of this recording wrote (`ivtrace record --resume`).
    pub fn resume_no_channel(&mut self, last: &PacketHeader) {
        self.no_channel = no_channel::NoChannelStream::resumed(last);
        self.no_channel_uncommitted = None;
    }

    /// The CTF stream index of the no-channel stream (`no_channel`): one
    /// past the last channel. [`PacketSink::packet`] gets it as `chan`.
    pub fn no_channel_stream(&self) -> u32 {
        self.layout.nr_channels
    }

    /// Events no channel could take: what the no-channel stream carries
    /// once it has a packet (after [`Reader::finish`], the count CTF
    /// readers see), else the region's counter.
    pub fn lost_no_channel(&self) -> u64 {
        match self.no_channel.carried() {
            0 => self.lost_no_channel_now(),
            n => n,
        }
    }

    /// The region's `lost_no_channel` since this part began.
    fn lost_no_channel_now(&self) -> u64 {
        // Relaxed: a statistic the writers bump with relaxed fetch-adds.
        let count = self.region.protocol().lost_no_channel();
        count.saturating_sub(self.no_channel_base)
    }

    /// Writes the no-channel stream's packets when `lost_no_channel` grew
    /// (while recording at most one per 0.1 s of writer time; `last`: the
    /// final accounting, always).
    fn account_no_channel<S: PacketSink>(
        &mut self,
        sink: &mut S,
        last: bool,
    ) -> Result<(), S::Error> {
        let count = self.lost_no_channel_now();
        if count <= self.no_channel.carried() {
            return Ok(()); // the common case: one load per pass
        }
        // The stream counts what the user streams count.
        let (ts, per_s) = match self.user_ns {
            Some(scale) => (scale.ns_saturating(self.latest_ts()), 1_000_000_000),
            None => (self.latest_ts(), self.region.header().clock.freq_hz),
        };
        let rate_limit = (!last).then_some(per_s / 10);
        if !self.no_channel.due(count, ts, rate_limit) {
            return Ok(());
        }
        let instance = self.no_channel_stream();
        if self.no_channel_uncommitted.is_none() {
            self.no_channel_uncommitted = Some(self.no_channel.clone());
        }
        for p in self.no_channel.packets(count, ts, instance) {
            sink.packet(instance, abi::IVT_STREAM_USER, &p, &self.classes)?;
        }
        Ok(())
    }

    /// The latest writer time the trace has reached: the newest event or
    /// packet end of any channel, else the region's format time.
    fn latest_ts(&self) -> u64 {
        let seen = self
            .channels
            .iter()
            .map(|ch| {
                ch.stats
                    .last_ts
                    .max(ch.last_written.map_or(0, |l| l.ts_end))
            })
            .max()
            .unwrap_or(0);
        let ts = if seen > 0 {
            seen
        } else {
            self.region.header().clock.ref_ticks
        };
        // The header's reference is guest-written: kept where the clock
        // can place it.
        ts.clamp(self.ticks.min, self.ticks.max.max(self.ticks.min))
    }

    fn emit_trailing_drops<S: PacketSink>(&mut self, c: u32, sink: &mut S) -> Result<(), S::Error> {
        let ch = &mut self.channels[c as usize];
        let total = ch.discarded();
        let written = ch.last_written.map_or(0, |l| l.discarded);
        if total <= written {
            return Ok(());
        }
        let last = ch.last_written;
        let ts = last.map_or(ch.stats.last_ts, |l| l.ts_end);
        let h = PacketHeader {
            magic: abi::IVT_CTF_MAGIC,
            stream_id: ch.stream,
            stream_instance_id: c as u64,
            timestamp_begin: ts,
            timestamp_end: ts,
            content_size: abi::PACKET_HDR_BITS,
            packet_size: abi::PACKET_HDR_BITS,
            packet_seq_num: last.map_or(ch.next_seq, |l| l.seq.saturating_add(1)),
            events_discarded: total,
            first_event_seq: ch.expected_first_event.unwrap_or(0),
            event_count: 0,
            cpu_id: last.map_or(0, |l| l.cpu_id),
            owner_pid: last.map_or(0, |l| l.owner_pid),
            owner_tid: last.map_or(0, |l| l.owner_tid),
        };
        let mut out = h;
        if let Some(scale) = self.user_ns.filter(|_| ch.stream == abi::IVT_STREAM_USER) {
            // After the last packet as written, or the clock's value of
            // the tick time when none was.
            let ns = match last {
                Some(_) => ch.last_ns,
                None => scale.ns_saturating(ts),
            };
            (out.timestamp_begin, out.timestamp_end) = (ns, ns);
            ch.last_ns = ns;
        }
        let mut bytes = [0u8; abi::PACKET_HDR_SIZE];
        out.write(&mut bytes);
        record_packet(
            ch,
            &h,
            abi::PACKET_HDR_SIZE,
            abi::PACKET_HDR_SIZE,
            Extent::Complete,
            &WalkSummary {
                last_ts: ts,
                ..Default::default()
            },
        );
        // A bookkeeping packet, not data (record_packet counted it).
        ch.stats.packets = ch.stats.packets.saturating_sub(1);
        let stream = ch.stream;
        self.lead_packet(c, &out, sink)?;
        sink.packet(c, stream, &bytes, &self.classes)
    }

    /// Flight-recorder salvage: per channel, the newest complete packets
    /// the ring can still hold plus the committed prefix of the open one.
    /// Never writes to the region.
    pub fn snapshot<S: PacketSink>(&mut self, sink: &mut S) -> Result<Pass, S::Error> {
        self.scan_metadata(ScanMode::Final);
        let ring = self.layout.nr_subbufs as u64;
        let mask = u64::from(self.layout.subbuf_size).saturating_sub(1);
        for c in 0..self.layout.nr_channels {
            let commit = self.load_commit_pos(c);
            let complete = commit >> self.layout.subbuf_size.trailing_zeros();
            // ring >= IVT_SUBBUFS_MIN >= 1.
            let slots = if commit & mask != 0 {
                ring.saturating_sub(1)
            } else {
                ring
            };
            let ch = &mut self.channels[c as usize];
            ch.next_seq = complete.saturating_sub(slots);
            ch.expected_first_event = None;
        }
        let pass = self.flush_partial(sink)?;
        self.finish(sink)?;
        Ok(pass)
    }
}

/// Counts an emitted packet in its channel's statistics.
fn record_packet(
    ch: &mut ChannelState,
    h: &PacketHeader,
    content: usize,
    padded: usize,
    extent: Extent,
    s: &WalkSummary,
) {
    let st = &mut ch.stats;
    st.events = st.events.saturating_add(s.events);
    st.packets = st.packets.saturating_add(1);
    st.partial_packets = st
        .partial_packets
        .saturating_add(u64::from(extent != Extent::Complete));
    st.bytes_out = st.bytes_out.saturating_add(padded as u64);
    let events_len = content.saturating_sub(abi::PACKET_HDR_SIZE);
    st.event_bytes = st.event_bytes.saturating_add(events_len as u64);
    st.header_bytes = st.header_bytes.saturating_add(s.header_bytes());
    st.extended_headers = st.extended_headers.saturating_add(s.extended);
    st.utf8_fixed = st.utf8_fixed.saturating_add(s.utf8_fixed);
    if s.events > 0 {
        st.first_ts.get_or_insert(h.timestamp_begin);
        st.last_ts = st.last_ts.max(s.last_ts);
    }
    ch.last_written = Some(LastWritten {
        seq: h.packet_seq_num,
        ts_end: h.timestamp_end,
        discarded: h.events_discarded,
        cpu_id: h.cpu_id,
        owner_pid: h.owner_pid,
        owner_tid: h.owner_tid,
    });
}

/// Walks a packet the host wrote itself (report): checks the header
/// against the host's own rules and returns the walk summary.
pub fn walk_own_packet<V: EventVisitor>(
    bytes: &mut [u8],
    classes: &EventClasses,
    visitor: &mut V,
) -> Result<(PacketHeader, WalkSummary), PacketFault> {
    if bytes.len() < abi::PACKET_HDR_SIZE {
        return Err(PacketFault::ContentSize {
            bits: (bytes.len() as u64).saturating_mul(8),
            max: 0,
        });
    }
    let h = PacketHeader::parse(bytes);
    if h.magic != abi::IVT_CTF_MAGIC {
        return Err(PacketFault::Magic(h.magic));
    }
    let content = (h.content_size / 8) as usize;
    if !h.content_size.is_multiple_of(8) || content < abi::PACKET_HDR_SIZE || content > bytes.len()
    {
        return Err(PacketFault::ContentSize {
            bits: h.content_size,
            max: bytes.len() as u64,
        });
    }
    let s = packet::walk(
        &mut bytes[..content],
        classes.stream(h.stream_id),
        h.timestamp_begin,
        Some(h.timestamp_end),
        visitor,
    )?;
    Ok((h, s))
}
