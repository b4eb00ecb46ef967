//! One CPU's decoded ftrace events as packets of stream class 2 (or of
//! another stream class of the guest packet layout: the derived streams of
//! the kernel trace, ivtrace-boot): the packet header and context every
//! ivtrace stream has, the compact event
//! header where the id (<= 30) and the time since the previous event
//! (< 2^27 units of the clock) allow it, else the extended one, payloads byte-packed,
//! events 4-byte aligned. Timestamps are kept monotonic (a record older
//! than the previous one, which a hostile page can claim, is clamped and
//! counted); `events_discarded` is the CPU's running loss count.

use std::fs::File;
use std::io::{self, BufWriter, Write};

use ivtrace_ctf::outdir::OutDir;

use ivtrace_region::abi;
use ivtrace_region::packet::{put_event_header, PacketHeader};
use ivtrace_region::reader::CTF_DISCARDED_MAX;

/// A packet is written once its content would pass this size.
const PACKET_TARGET: usize = 64 << 10;

pub struct StreamOut {
    file: BufWriter<File>,
    stream_id: u32,
    chan: u32,
    cpu: u32,
    /// The packet being built, its header's room first.
    buf: Vec<u8>,
    seq: u64,
    /// Events in the packets written so far.
    before: u64,
    count: u32,
    ts_begin: u64,
    /// The previous event's time (the stream's, for monotonic order).
    last_ts: u64,
    discarded: u64,
    written_discarded: u64,
    clamped: u64,
}

impl StreamOut {
    /// `dir/name` must not exist (created with O_EXCL | O_NOFOLLOW
    /// through the directory's descriptor, never through an existing entry).
    pub fn create(dir: &OutDir, name: &str, chan: u32) -> io::Result<StreamOut> {
        StreamOut::create_class(dir, name, abi::IVT_STREAM_FTRACE, chan)
    }

    /// A stream of class `stream_id`, instance `chan`, in `dir/name`
    /// (which must not exist).
    pub fn create_class(
        dir: &OutDir,
        name: &str,
        stream_id: u32,
        chan: u32,
    ) -> io::Result<StreamOut> {
        let f = dir.create_file(name)?;
        Ok(StreamOut {
            file: BufWriter::with_capacity(1 << 20, f),
            stream_id,
            chan,
            cpu: 0,
            buf: Vec::with_capacity(PACKET_TARGET + 8),
            seq: 0,
            before: 0,
            count: 0,
            ts_begin: 0,
            last_ts: 0,
            discarded: 0,
            written_discarded: 0,
            clamped: 0,
        })
    }

    /// Events lost so far (the running count; never goes down). Clamped
    /// to what CTF readers accept (docs/hardening.md, "Guest-written
    /// counters"): the guest's counters may say anything.
    pub fn set_discarded(&mut self, n: u64) {
        self.discarded = self.discarded.max(n.min(CTF_DISCARDED_MAX));
    }

    pub fn clamped(&self) -> u64 {
        self.clamped
    }

    fn begin(&mut self, cpu: u32, ts: u64) {
        self.buf.clear();
        self.buf.resize(abi::PACKET_HDR_SIZE, 0);
        self.cpu = cpu;
        self.ts_begin = ts;
    }

    /// Appends event `id` at `ts` with `payload`.
    pub fn event(&mut self, cpu: u32, id: u32, ts: u64, payload: &[u8]) -> io::Result<()> {
        let ts = if ts < self.last_ts {
            self.clamped = self.clamped.saturating_add(1);
            self.last_ts
        } else {
            ts
        };
        let need = align4(self.buf.len())
            .saturating_add(abi::IVT_EV_EXT_SIZE)
            .saturating_add(payload.len());
        if self.count > 0 && (need > PACKET_TARGET || cpu != self.cpu) {
            self.flush()?;
        }
        if self.count == 0 {
            self.begin(cpu, ts);
        }
        let prev = if self.count == 0 {
            self.ts_begin
        } else {
            self.last_ts
        };
        self.buf.resize(align4(self.buf.len()), 0);
        // ts >= prev: times were clamped monotonic above.
        put_event_header(&mut self.buf, id, ts, prev);
        self.buf.extend_from_slice(payload);
        self.count = self.count.saturating_add(1);
        self.last_ts = ts;
        Ok(())
    }

    /// Writes the packet being built (header, content, padding to 8 bytes).
    /// Losses before the stream's first packet get an empty packet of their
    /// own first: CTF readers count discarded events between two packets
    /// (babeltrace2 gives no count for a first packet's).
    fn flush(&mut self) -> io::Result<()> {
        if self.seq == 0 && self.discarded > 0 {
            let (events, discarded) = (std::mem::take(&mut self.buf), self.discarded);
            let count = std::mem::take(&mut self.count);
            self.discarded = 0;
            let ts = self.ts_begin;
            self.begin(self.cpu, ts);
            self.write_packet()?;
            (self.buf, self.count, self.discarded) = (events, count, discarded);
        }
        self.write_packet()
    }

    fn write_packet(&mut self) -> io::Result<()> {
        let content = self.buf.len();
        let size = content.next_multiple_of(8);
        self.buf.resize(size, 0);
        PacketHeader {
            magic: abi::IVT_CTF_MAGIC,
            stream_id: self.stream_id,
            stream_instance_id: self.chan as u64,
            timestamp_begin: self.ts_begin,
            timestamp_end: if self.count == 0 {
                self.ts_begin
            } else {
                self.last_ts.max(self.ts_begin)
            },
            content_size: (content as u64).saturating_mul(8),
            packet_size: (size as u64).saturating_mul(8),
            packet_seq_num: self.seq,
            events_discarded: self.discarded,
            first_event_seq: self.before,
            event_count: self.count,
            cpu_id: self.cpu,
            owner_pid: 0,
            owner_tid: 0,
        }
        .write(&mut self.buf);
        self.file.write_all(&self.buf)?;
        self.seq = self.seq.saturating_add(1);
        self.before = self.before.saturating_add(u64::from(self.count));
        self.count = 0;
        self.written_discarded = self.discarded;
        Ok(())
    }

    /// Writes what is left; a last empty packet carries losses counted
    /// after the last event (CTF readers report them from there).
    pub fn finish(mut self, cpu: u32, lost: u64) -> io::Result<()> {
        self.set_discarded(lost);
        if self.count > 0 {
            self.flush()?;
        }
        if self.discarded > self.written_discarded {
            let ts = self.last_ts;
            self.begin(cpu, ts);
            self.flush()?;
        }
        self.file.flush()
    }
}

fn align4(n: usize) -> usize {
    n.next_multiple_of(abi::IVT_EV_ALIGN)
}
