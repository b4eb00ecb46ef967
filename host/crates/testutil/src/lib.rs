//! A byte-for-byte model of the C formatter and writer (format.h,
//! writer.h), for tests, property tests, fuzz seeds and benchmarks that
//! need regions without the C library.
//!
//! Not part of the reader: nothing in the drain path uses it.

use ivtrace_region::abi;
use ivtrace_region::bytes::{le_u32, le_u64, put_u32, put_u64};

/// A field as registered by a writer: name, `IVT_FT_*`, count.
pub type FieldSpec<'a> = (&'a str, u8, u16);
/// A field with its `IVT_FF_*` flags: name, `IVT_FT_*`, count, flags.
pub type FlaggedFieldSpec<'a> = (&'a str, u8, u16, u8);

/// Plans a region like ivt_layout_plan() + ivt_region_format().
#[derive(Debug, Clone)]
pub struct RegionBuilder {
    pub nr_channels: u32,
    pub nr_kernel_channels: u32,
    /// The ftrace relay's channels, right after the kernel ones.
    pub nr_ftrace_channels: u32,
    pub nr_subbufs: u32,
    pub subbuf_size: u32,
    pub meta_size: u32,
    pub mode: u32,
    pub features: u64,
    pub freq_hz: u64,
    pub uuid: [u8; 16],
}

impl RegionBuilder {
    pub fn new(nr_channels: u32, nr_subbufs: u32, subbuf_size: u32) -> Self {
        RegionBuilder {
            nr_channels,
            nr_kernel_channels: 0,
            nr_ftrace_channels: 0,
            nr_subbufs,
            subbuf_size,
            meta_size: 4096,
            mode: abi::IVT_MODE_DISCARD,
            features: 0,
            freq_hz: 1_000_000_000,
            uuid: *b"ivtrace-testuuid",
        }
    }

    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }

    /// The first `nr_kernel_channels` channels are the kernel stream's (one
    /// per CPU), with metadata room for [`KERNEL_EVENTS`].
    pub fn kernel(mut self, nr_kernel_channels: u32) -> Self {
        self.nr_kernel_channels = nr_kernel_channels;
        self.meta_size = 16384;
        self
    }

    /// The `nr_ftrace_channels` channels after the kernel ones carry the
    /// ftrace relay's pages (stream class 2, one per CPU), with metadata
    /// room for the guest's format files ([`TestRegion::publish_ftrace`]).
    pub fn ftrace(mut self, nr_ftrace_channels: u32) -> Self {
        self.nr_ftrace_channels = nr_ftrace_channels;
        self.features |= abi::IVT_FEAT_FTRACE;
        self.meta_size = 65536;
        self
    }

    fn offsets(&self) -> (u64, u64, u64, u64) {
        let align = |v: u64| v.div_ceil(4096) * 4096;
        let channels_off = 4096u64;
        let meta_off = align(channels_off + self.nr_channels as u64 * 256);
        let pool_off = align(meta_off + self.meta_size as u64);
        let need =
            pool_off + self.nr_channels as u64 * self.nr_subbufs as u64 * self.subbuf_size as u64;
        let size = need.next_power_of_two().max(abi::IVT_REGION_MIN);
        (channels_off, meta_off, pool_off, size)
    }

    /// The formatted region's bytes.
    pub fn build(&self) -> Vec<u8> {
        self.build_region().bytes
    }

    /// A formatted region with writers ready to emit events.
    pub fn build_region(&self) -> TestRegion {
        let (channels_off, meta_off, pool_off, size) = self.offsets();
        let mut b = vec![0u8; size as usize];
        put_u64(&mut b, abi::hdr::MAGIC, abi::IVT_MAGIC);
        b[abi::hdr::ABI_MAJOR..abi::hdr::ABI_MAJOR + 2].copy_from_slice(&1u16.to_le_bytes());
        put_u32(&mut b, abi::hdr::HDR_SIZE, 4096);
        put_u64(&mut b, abi::hdr::REGION_SIZE, size);
        put_u64(&mut b, abi::hdr::FEATURES, self.features);
        b[abi::hdr::UUID..abi::hdr::UUID + 16].copy_from_slice(&self.uuid);
        put_u32(&mut b, abi::hdr::DEFAULT_MODE, self.mode);
        let l = abi::hdr::LAYOUT;
        put_u64(&mut b, l + abi::layout::CHANNELS_OFF, channels_off);
        put_u64(&mut b, l + abi::layout::META_OFF, meta_off);
        put_u64(&mut b, l + abi::layout::POOL_OFF, pool_off);
        put_u32(&mut b, l + abi::layout::META_SIZE, self.meta_size);
        put_u32(&mut b, l + abi::layout::NR_CHANNELS, self.nr_channels);
        put_u32(
            &mut b,
            l + abi::layout::NR_KERNEL_CHANNELS,
            self.nr_kernel_channels,
        );
        put_u32(&mut b, l + abi::layout::CHANNEL_SIZE, 256);
        put_u32(
            &mut b,
            abi::hdr::NR_FTRACE_CHANNELS,
            self.nr_ftrace_channels,
        );
        put_u32(&mut b, l + abi::layout::NR_SUBBUFS, self.nr_subbufs);
        put_u32(&mut b, l + abi::layout::SUBBUF_SIZE, self.subbuf_size);
        put_u64(&mut b, abi::hdr::CLOCK + abi::clock::FREQ_HZ, self.freq_hz);
        put_u32(
            &mut b,
            abi::hdr::CLOCK + abi::clock::SOURCE,
            abi::IVT_CLOCK_TSC,
        );
        put_u64(
            &mut b,
            abi::hdr::CLOCK + abi::clock::REF_REALTIME_NS,
            1_700_000_000_000_000_000,
        );
        put_u32(&mut b, abi::hdr::STATE, abi::IVT_STATE_LIVE);
        for c in 0..self.nr_channels {
            let ch = (channels_off + c as u64 * 256) as usize;
            put_u32(&mut b, ch + abi::chan::MODE as usize, self.mode);
        }
        TestRegion {
            bytes: b,
            spec: self.clone(),
            channels_off,
            meta_off,
            pool_off,
            meta_tail: 0,
            writers: vec![TestWriter::default(); self.nr_channels as usize],
        }
    }
}

#[derive(Debug, Clone, Default)]
struct TestWriter {
    open: bool,
    seq: u64,
    off: u64,
    cur_end: u64,
    last_ts: u64,
    count: u32,
    first_event_seq: u64,
}

/// A formatted region plus the private state of one writer per channel.
#[derive(Debug, Clone)]
pub struct TestRegion {
    pub bytes: Vec<u8>,
    spec: RegionBuilder,
    channels_off: u64,
    meta_off: u64,
    pool_off: u64,
    meta_tail: u32,
    writers: Vec<TestWriter>,
}

impl TestRegion {
    fn chan(&self, c: u32) -> usize {
        (self.channels_off + c as u64 * 256) as usize
    }

    fn subbuf(&self, c: u32, seq: u64) -> usize {
        let s = &self.spec;
        let idx = c as u64 * s.nr_subbufs as u64 + (seq & (s.nr_subbufs as u64 - 1));
        (self.pool_off + idx * s.subbuf_size as u64) as usize
    }

    fn chan_u64(&self, c: u32, off: u64) -> u64 {
        let at = self.chan(c) + off as usize;
        le_u64(&self.bytes, at)
    }

    pub fn set_chan_u64(&mut self, c: u32, off: u64, v: u64) {
        let at = self.chan(c) + off as usize;
        put_u64(&mut self.bytes, at, v);
    }

    /// Appends a committed event description (ivt_event_register()).
    pub fn register(&mut self, stream: u32, id: u32, name: &str, fields: &[FieldSpec]) {
        let flagged: Vec<FlaggedFieldSpec> = fields.iter().map(|&(n, t, c)| (n, t, c, 0)).collect();
        self.register_flagged(stream, id, name, &flagged);
    }

    /// [`TestRegion::register`] with `IVT_FF_*` flags per field.
    pub fn register_flagged(
        &mut self,
        stream: u32,
        id: u32,
        name: &str,
        fields: &[FlaggedFieldSpec],
    ) {
        let len = (abi::META_REC_SIZE + fields.len() * abi::META_FIELD_SIZE).div_ceil(8) * 8;
        let at = (self.meta_off + self.meta_tail as u64) as usize;
        self.meta_tail += len as u32;
        put_u32(&mut self.bytes, abi::hdr::META_TAIL, self.meta_tail);
        let r = &mut self.bytes[at..at + len];
        put_u32(r, abi::meta::LEN, len as u32);
        r[abi::meta::KIND..abi::meta::KIND + 2].copy_from_slice(&1u16.to_le_bytes());
        r[abi::meta::NR_FIELDS..abi::meta::NR_FIELDS + 2]
            .copy_from_slice(&(fields.len() as u16).to_le_bytes());
        put_u32(r, abi::meta::EVENT_ID, id);
        put_u32(r, abi::meta::STREAM, stream);
        let n = name.len().min(63);
        r[abi::meta::NAME..abi::meta::NAME + n].copy_from_slice(&name.as_bytes()[..n]);
        for (i, (fname, ty, count, flags)) in fields.iter().enumerate() {
            let f = abi::meta::FIELDS + i * abi::META_FIELD_SIZE;
            let n = fname.len().min(31);
            r[f..f + n].copy_from_slice(&fname.as_bytes()[..n]);
            r[f + abi::meta::FIELD_TYPE] = *ty;
            r[f + abi::meta::FIELD_FLAGS] = *flags;
            r[f + abi::meta::FIELD_COUNT..f + abi::meta::FIELD_COUNT + 2]
                .copy_from_slice(&count.to_le_bytes());
        }
        put_u32(r, abi::meta::COMMIT, abi::IVT_META_COMMIT);
    }

    /// Appends a committed metadata record of any kind (its bytes as given:
    /// len, commit, kind and body), e.g. a thread name table.
    pub fn append_meta(&mut self, rec: &[u8]) {
        let at = (self.meta_off + self.meta_tail as u64) as usize;
        self.bytes[at..at + rec.len()].copy_from_slice(rec);
        self.meta_tail += rec.len() as u32;
        put_u32(&mut self.bytes, abi::hdr::META_TAIL, self.meta_tail);
    }

    /// The ftrace relay's two wire events of stream class 2, as the guest
    /// module registers them: `ftrace_page { page bytes }` and
    /// `ftrace_stats { entries .. pages: u64 }`.
    pub fn register_ftrace_wire(&mut self) {
        let page = [("page", abi::IVT_FT_BYTES, 0)];
        self.register(
            abi::IVT_STREAM_FTRACE,
            abi::IVT_FTRACE_EV_PAGE,
            "ftrace_page",
            &page,
        );
        let names = [
            "entries",
            "overrun",
            "commit_overrun",
            "dropped",
            "read",
            "bytes",
            "clock_reset",
            "pages",
        ];
        let stats: Vec<FieldSpec> = names.iter().map(|&n| (n, abi::IVT_FT_U64, 0)).collect();
        self.register(
            abi::IVT_STREAM_FTRACE,
            abi::IVT_FTRACE_EV_STATS,
            "ftrace_stats",
            &stats,
        );
    }

    /// Publishes one of the guest's tracefs files (`struct ivt_ftrace_rec`):
    /// `what` is `IVT_FTRACE_HEADER_PAGE` or `IVT_FTRACE_FORMAT`.
    pub fn publish_ftrace(&mut self, what: u16, system: &str, text: &[u8]) {
        let len = (abi::FTRACE_REC_SIZE + text.len()).div_ceil(8) * 8;
        let mut r = vec![0u8; len];
        put_u32(&mut r, abi::meta::LEN, len as u32);
        put_u32(&mut r, abi::meta::COMMIT, abi::IVT_META_COMMIT);
        r[abi::meta::KIND..abi::meta::KIND + 2]
            .copy_from_slice(&abi::IVT_META_FTRACE.to_le_bytes());
        r[abi::ftrace_rec::WHAT..abi::ftrace_rec::WHAT + 2].copy_from_slice(&what.to_le_bytes());
        put_u32(&mut r, abi::ftrace_rec::TEXT_LEN, text.len() as u32);
        r[abi::ftrace_rec::SYSTEM..abi::ftrace_rec::SYSTEM + system.len()]
            .copy_from_slice(system.as_bytes());
        r[abi::ftrace_rec::TEXT..abi::ftrace_rec::TEXT + text.len()].copy_from_slice(text);
        self.append_meta(&r);
    }

    /// One ftrace page as the relay writes it: an `ftrace_page` event.
    pub fn emit_ftrace_page(&mut self, c: u32, ts: u64, page: &[u8]) -> bool {
        let mut p = (page.len() as u32).to_le_bytes().to_vec();
        p.extend_from_slice(page);
        self.emit(c, ts, abi::IVT_FTRACE_EV_PAGE, &p)
    }

    /// The loadgen event: `loadgen:payload { thread u16, seq u64, data bytes }`.
    pub fn register_loadgen(&mut self, id: u32) {
        let fields = [
            ("thread", abi::IVT_FT_U16, 0),
            ("seq", abi::IVT_FT_U64, 0),
            ("data", abi::IVT_FT_BYTES, 0),
        ];
        self.register(abi::IVT_STREAM_USER, id, "loadgen:payload", &fields);
    }

    /// Payload of one loadgen event.
    pub fn loadgen_payload(thread: u16, seq: u64, data: &[u8]) -> Vec<u8> {
        let mut p = Vec::with_capacity(14 + data.len());
        p.extend_from_slice(&thread.to_le_bytes());
        p.extend_from_slice(&seq.to_le_bytes());
        p.extend_from_slice(&(data.len() as u32).to_le_bytes());
        p.extend_from_slice(data);
        p
    }

    fn drops(&self, c: u32) -> u64 {
        self.chan_u64(c, abi::chan::LOST_FULL)
            + self.chan_u64(c, abi::chan::LOST_TOO_BIG)
            + self.chan_u64(c, abi::chan::LOST_NESTED)
    }

    fn count_drop(&mut self, c: u32, counter: u64) {
        let v = self.chan_u64(c, counter) + 1;
        self.set_chan_u64(c, counter, v);
    }

    fn open(&mut self, c: u32, ts: u64) -> bool {
        let seq = self.writers[c as usize].seq;
        let mode = le_u32(&self.bytes, self.chan(c) + abi::chan::MODE as usize);
        let consumed = self.chan_u64(c, abi::chan::CONSUMED);
        if mode == abi::IVT_MODE_DISCARD && seq - consumed >= self.spec.nr_subbufs as u64 {
            return false;
        }
        self.set_chan_u64(c, abi::chan::OPEN_SEQ, seq);
        let p = self.subbuf(c, seq);
        let drops = self.drops(c);
        let w = &self.writers[c as usize];
        let first = w.first_event_seq;
        let stream = self.spec_stream(c);
        let h = &mut self.bytes[p..p + abi::PACKET_HDR_SIZE];
        h.fill(0);
        put_u32(h, abi::pkt::MAGIC, abi::IVT_CTF_MAGIC);
        put_u32(h, abi::pkt::STREAM_ID, stream);
        put_u64(h, abi::pkt::STREAM_INSTANCE_ID, c as u64);
        put_u64(h, abi::pkt::TIMESTAMP_BEGIN, ts);
        put_u64(h, abi::pkt::TIMESTAMP_END, ts);
        put_u64(h, abi::pkt::PACKET_SIZE, self.spec.subbuf_size as u64 * 8);
        put_u64(h, abi::pkt::PACKET_SEQ_NUM, seq);
        put_u64(h, abi::pkt::EVENTS_DISCARDED, drops);
        put_u64(h, abi::pkt::FIRST_EVENT_SEQ, first);
        put_u32(h, abi::pkt::OWNER_PID, 1);
        if stream == abi::IVT_STREAM_KERNEL {
            put_u32(h, abi::pkt::CPU_ID, c); // kernel channel c is CPU c
        } else if stream == abi::IVT_STREAM_FTRACE {
            put_u32(h, abi::pkt::CPU_ID, c - self.spec.nr_kernel_channels);
        }
        let w = &mut self.writers[c as usize];
        w.open = true;
        w.off = abi::PACKET_HDR_SIZE as u64;
        w.cur_end = w.off;
        w.count = 0;
        w.last_ts = ts;
        true
    }

    fn spec_stream(&self, c: u32) -> u32 {
        if c < self.spec.nr_kernel_channels {
            abi::IVT_STREAM_KERNEL
        } else if c - self.spec.nr_kernel_channels < self.spec.nr_ftrace_channels {
            abi::IVT_STREAM_FTRACE
        } else {
            abi::IVT_STREAM_USER
        }
    }

    /// Closes channel `c`'s open packet (ivt_writer_close()).
    pub fn close(&mut self, c: u32) {
        if !self.writers[c as usize].open {
            return;
        }
        let drops = self.drops(c);
        let w = self.writers[c as usize].clone();
        let p = self.subbuf(c, w.seq);
        let h = &mut self.bytes[p..p + abi::PACKET_HDR_SIZE];
        put_u64(h, abi::pkt::TIMESTAMP_END, w.last_ts);
        put_u64(h, abi::pkt::CONTENT_SIZE, w.cur_end * 8);
        put_u32(h, abi::pkt::EVENT_COUNT, w.count);
        put_u64(h, abi::pkt::EVENTS_DISCARDED, drops);
        self.set_chan_u64(
            c,
            abi::chan::EVENTS_CLOSED,
            w.first_event_seq + w.count as u64,
        );
        let size = self.spec.subbuf_size as u64;
        self.set_chan_u64(c, abi::chan::COMMIT_POS, (w.seq + 1) * size);
        let w = &mut self.writers[c as usize];
        w.first_event_seq += w.count as u64;
        w.seq += 1;
        w.open = false;
    }

    /// Writes one event (ivt_writer_reserve() + commit). Returns false if
    /// it was dropped (and counted).
    pub fn emit(&mut self, c: u32, ts: u64, id: u32, payload: &[u8]) -> bool {
        let size = self.spec.subbuf_size as u64;
        let len = payload.len() as u64;
        // An event never ends on a packet's last byte (writer.h: that
        // commit position would mean "complete").
        if len + 16 + abi::PACKET_HDR_SIZE as u64 >= size {
            self.count_drop(c, abi::chan::LOST_TOO_BIG);
            return false;
        }
        let w = &self.writers[c as usize];
        let ts = ts.max(w.last_ts);
        let compact = |w: &TestWriter| id <= 30 && ts - w.last_ts <= abi::IVT_EV_TS_MASK;
        let mut hlen = if w.open && compact(w) { 4 } else { 16 };
        // An event never ends on a packet's last byte: commit_pos ==
        // (seq + 1) * S means "closed, end fields written" (writer.h).
        if !w.open || w.off + hlen + len >= size {
            self.close(c);
            if !self.open(c, ts) {
                self.count_drop(c, abi::chan::LOST_FULL);
                return false;
            }
            hlen = if id <= 30 { 4 } else { 16 };
        }
        let w = self.writers[c as usize].clone();
        let at = self.subbuf(c, w.seq) + w.off as usize;
        if hlen == 4 {
            put_u32(&mut self.bytes, at, id | ((ts << 5) as u32));
        } else {
            put_u32(&mut self.bytes, at, 31);
            put_u32(&mut self.bytes, at + 4, id);
            put_u64(&mut self.bytes, at + 8, ts);
        }
        let body = at + hlen as usize;
        self.bytes[body..body + payload.len()].copy_from_slice(payload);
        let end = w.off + hlen + len;
        let pos = w.seq * size + end;
        let w = &mut self.writers[c as usize];
        w.cur_end = end;
        w.last_ts = ts;
        w.count += 1;
        w.off = end.div_ceil(4) * 4;
        self.set_chan_u64(c, abi::chan::COMMIT_POS, pos);
        true
    }

    /// Marks the region closed (ivt_region_close()).
    pub fn close_region(&mut self) {
        put_u32(&mut self.bytes, abi::hdr::STATE, abi::IVT_STATE_CLOSED);
    }

    /// Offset of channel `c`'s open or next sub-buffer (for corrupting it).
    pub fn subbuf_offset(&self, c: u32, seq: u64) -> usize {
        self.subbuf(c, seq)
    }
}

/// Largest region image the fuzz helpers build.
pub const FUZZ_REGION_MAX: usize = 1 << 20;

/// A fuzz input as a whole region file: zero-extended to a power of two
/// of at least 64 KiB (so seeds can be trimmed of trailing zeros), and
/// capped at [`FUZZ_REGION_MAX`].
pub fn region_image(input: &[u8]) -> Vec<u8> {
    let input = &input[..input.len().min(FUZZ_REGION_MAX)];
    let size = input
        .len()
        .next_power_of_two()
        .max(abi::IVT_REGION_MIN as usize);
    let mut b = vec![0u8; size];
    b[..input.len()].copy_from_slice(input);
    b
}

/// The fixed event classes the packet fuzzer runs against: the loadgen
/// event (id 0), text (id 1: string, `chars[8]`), integers (id 2) and an
/// extended-id event (id 40) on user channel 0 of a 2 x 4 KiB ring.
pub fn packet_template() -> TestRegion {
    let mut r = RegionBuilder::new(1, 2, 4096).build_region();
    r.register_loadgen(0);
    r.register(
        1,
        1,
        "text",
        &[("s", abi::IVT_FT_STRING, 0), ("c", abi::IVT_FT_CHARS, 8)],
    );
    r.register(
        1,
        2,
        "ints",
        &[
            ("a", abi::IVT_FT_U8, 0),
            ("b", abi::IVT_FT_S32, 0),
            ("c", abi::IVT_FT_U64, 0),
        ],
    );
    r.register(1, 40, "ext", &[("x", abi::IVT_FT_U16, 0)]);
    r
}

/// A region whose channel 0 holds `packet` (at most 4 KiB) in sub-buffer
/// 0: complete if `complete`, else the committed prefix of an open packet.
pub fn region_with_packet(packet: &[u8], complete: bool) -> Vec<u8> {
    let mut r = packet_template();
    let packet = &packet[..packet.len().min(4096)];
    let at = r.subbuf_offset(0, 0);
    r.bytes[at..at + packet.len()].copy_from_slice(packet);
    let commit = if complete { 4096 } else { packet.len() as u64 };
    r.set_chan_u64(0, abi::chan::COMMIT_POS, commit);
    r.close_region();
    r.bytes
}

/// The guest kernel module's events, ids 0.. in this order: a model of
/// their one definition, `IVT_KERNEL_EVENTS` in
/// abi/include/ivtrace/kernel_events.h (docs/abi.md "Kernel stream"). A
/// unit test of ivtrace-ctf (`kernel_events_match_the_abi_table`) compares
/// it with abi/kernel_events.json, printed from that header.
pub const KERNEL_EVENTS: &[(&str, &[FlaggedFieldSpec<'static>])] = {
    use abi::{
        IVT_FF_HEX as H, IVT_FF_TID_COMM as C, IVT_FT_BYTES as BY, IVT_FT_CHARS as CH,
        IVT_FT_S32 as S32, IVT_FT_S64 as S64, IVT_FT_S8 as S8, IVT_FT_STRING as STR,
        IVT_FT_U16 as U16, IVT_FT_U32 as U32, IVT_FT_U64 as U64, IVT_FT_U8 as U8,
    };
    &[
        (
            "sched_switch",
            &[
                ("prev_tid", S32, 0, C),
                ("prev_prio", S8, 0, 0),
                ("prev_state", U16, 0, 0),
                ("next_tid", S32, 0, C),
                ("next_prio", S8, 0, 0),
            ],
        ),
        (
            "sched_wakeup",
            &[
                ("tid", S32, 0, C),
                ("prio", S8, 0, 0),
                ("target_cpu", U16, 0, 0),
            ],
        ),
        ("irq_handler_entry", &[("irq", S32, 0, 0)]),
        (
            "irq_handler_exit",
            &[("irq", S32, 0, 0), ("ret", S32, 0, 0)],
        ),
        ("irq_softirq_entry", &[("vec", U8, 0, 0)]),
        ("irq_softirq_exit", &[("vec", U8, 0, 0)]),
        (
            "timer_hrtimer_expire_entry",
            &[
                ("hrtimer", U64, 0, H),
                ("now", S64, 0, 0),
                ("function", U64, 0, H),
            ],
        ),
        ("timer_hrtimer_expire_exit", &[("hrtimer", U64, 0, H)]),
        (
            "kmem_kmalloc",
            &[
                ("call_site", U64, 0, H),
                ("ptr", U64, 0, H),
                ("bytes_req", U32, 0, 0),
                ("bytes_alloc", U32, 0, 0),
                ("gfp_flags", U32, 0, 0),
            ],
        ),
        (
            "kmem_kfree",
            &[("call_site", U64, 0, H), ("ptr", U64, 0, H)],
        ),
        (
            "kmem_mm_page_alloc",
            &[
                ("page", U64, 0, H),
                ("pfn", U64, 0, 0),
                ("order", U32, 0, 0),
                ("gfp_flags", U32, 0, 0),
                ("migratetype", S32, 0, 0),
            ],
        ),
        (
            "kmem_mm_page_free",
            &[
                ("page", U64, 0, H),
                ("pfn", U64, 0, 0),
                ("order", U32, 0, 0),
            ],
        ),
        (
            "syscall_entry",
            &[("id", U16, 0, 0), ("args", BY, 0, 0), ("strings", BY, 0, 0)],
        ),
        (
            "syscall_exit",
            &[
                ("id", U16, 0, 0),
                ("ret", S64, 0, 0),
                ("args", BY, 0, 0),
                ("data", BY, 0, 0),
            ],
        ),
        ("printk_console", &[("msg", STR, 0, 0)]),
        (
            "sched_wakeup_new",
            &[
                ("tid", S32, 0, C),
                ("prio", S8, 0, 0),
                ("target_cpu", U16, 0, 0),
            ],
        ),
        (
            "sched_process_fork",
            &[
                ("parent_tid", S32, 0, C),
                ("parent_pid", S32, 0, 0),
                ("parent_ns_inum", U32, 0, 0),
                ("child_comm", CH, 16, 0),
                ("child_tid", S32, 0, 0),
                ("vtids", BY, 0, 0),
                ("child_pid", S32, 0, 0),
                ("child_ns_inum", U32, 0, 0),
            ],
        ),
        (
            "sched_process_exec",
            &[
                ("filename", STR, 0, 0),
                ("tid", S32, 0, 0),
                ("old_tid", S32, 0, 0),
                ("comm", CH, 16, 0),
            ],
        ),
        (
            "sched_process_exit",
            &[("tid", S32, 0, C), ("prio", S8, 0, 0)],
        ),
        (
            "sched_process_free",
            &[("tid", S32, 0, C), ("prio", S8, 0, 0)],
        ),
        ("task_rename", &[("tid", S32, 0, 0), ("newcomm", CH, 16, 0)]),
        ("lttng_statedump_start", &[]),
        ("lttng_statedump_end", &[]),
        (
            "lttng_statedump_process_state",
            &[
                ("tid", S32, 0, 0),
                ("vtid", S32, 0, 0),
                ("pid", S32, 0, 0),
                ("vpid", S32, 0, 0),
                ("ppid", S32, 0, 0),
                ("vppid", S32, 0, 0),
                ("name", CH, 16, 0),
                ("type", S32, 0, 0),
                ("mode", S32, 0, 0),
                ("submode", S32, 0, 0),
                ("status", S32, 0, 0),
                ("ns_level", S32, 0, 0),
                ("ns_inum", U32, 0, 0),
                ("cpu", U32, 0, 0),
            ],
        ),
        (
            "lttng_statedump_interrupt",
            &[
                ("irq", U32, 0, 0),
                ("name", STR, 0, 0),
                ("action", STR, 0, 0),
            ],
        ),
        (
            "ivtrace_doorbell",
            &[("seq", U64, 0, 0), ("vector", U16, 0, 0)],
        ),
        (
            "lttng_statedump_file_descriptor",
            &[
                ("pid", S32, 0, 0),
                ("fd", S32, 0, 0),
                ("flags", U32, 0, 0),
                ("fmode", U32, 0, H),
                ("filename", STR, 0, 0),
            ],
        ),
        (
            "lttng_statedump_block_device",
            &[("dev", U32, 0, 0), ("diskname", STR, 0, 0)],
        ),
        ("x86_irq_vectors_local_timer_entry", VECTOR),
        ("x86_irq_vectors_local_timer_exit", VECTOR),
        ("x86_irq_vectors_reschedule_entry", VECTOR),
        ("x86_irq_vectors_reschedule_exit", VECTOR),
        ("x86_irq_vectors_call_function_single_entry", VECTOR),
        ("x86_irq_vectors_call_function_single_exit", VECTOR),
        ("x86_irq_vectors_call_function_entry", VECTOR),
        ("x86_irq_vectors_call_function_exit", VECTOR),
        ("x86_irq_vectors_irq_work_entry", VECTOR),
        ("x86_irq_vectors_irq_work_exit", VECTOR),
        ("x86_irq_vectors_ipi_entry", VECTOR),
        ("x86_irq_vectors_ipi_exit", VECTOR),
        ("x86_irq_vectors_spurious_apic_entry", VECTOR),
        ("x86_irq_vectors_spurious_apic_exit", VECTOR),
        ("x86_irq_vectors_error_apic_entry", VECTOR),
        ("x86_irq_vectors_error_apic_exit", VECTOR),
        ("x86_irq_vectors_threshold_apic_entry", VECTOR),
        ("x86_irq_vectors_threshold_apic_exit", VECTOR),
        ("x86_irq_vectors_deferred_error_apic_entry", VECTOR),
        ("x86_irq_vectors_deferred_error_apic_exit", VECTOR),
        ("x86_irq_vectors_thermal_apic_entry", VECTOR),
        ("x86_irq_vectors_thermal_apic_exit", VECTOR),
        (
            "vmsync_gh_guest",
            &[("cnt", U32, 0, 0), ("vm_uid", U64, 0, 0)],
        ),
        (
            "vmsync_hg_guest",
            &[("cnt", U32, 0, 0), ("vm_uid", U64, 0, 0)],
        ),
    ]
};

/// The one field of every x86 interrupt vector event.
const VECTOR: &[FlaggedFieldSpec<'static>] = &[("vector", abi::IVT_FT_S32, 0, 0)];

/// lttng-modules' `sched_switch` payload fields, in order: what both the
/// guest's expanded kernel trace and the host trace present.
pub const LTTNG_SCHED_SWITCH_FIELDS: [&str; 7] = [
    "prev_comm",
    "prev_tid",
    "prev_prio",
    "prev_state",
    "next_comm",
    "next_tid",
    "next_prio",
];

impl TestRegion {
    /// Registers [`KERNEL_EVENTS`] on the kernel stream, ids 0.. in order.
    pub fn register_kernel_events(&mut self) {
        for (id, (name, fields)) in KERNEL_EVENTS.iter().enumerate() {
            self.register_flagged(abi::IVT_STREAM_KERNEL, id as u32, name, fields);
        }
    }
}

/// The wire payload of [`KERNEL_EVENTS`]' `sched_switch` (id 0): `prev`
/// switched out runnable, `next` in, both at priority 120 (LTTng's 20).
pub fn sched_switch_payload(prev: u32, next: u32) -> Vec<u8> {
    let mut p = prev.to_le_bytes().to_vec();
    p.extend_from_slice(&[20, 0, 0]);
    p.extend_from_slice(&next.to_le_bytes());
    p.push(20);
    p
}

/// The wire payload of [`KERNEL_EVENTS`]' `task_rename` (id 20): thread
/// `tid` is now `name` (at most 16 bytes).
pub fn task_rename_payload(tid: u32, name: &str) -> Vec<u8> {
    let mut p = tid.to_le_bytes().to_vec();
    let mut n = [0u8; 16];
    n[..name.len()].copy_from_slice(name.as_bytes());
    p.extend_from_slice(&n);
    p
}

/// Whether `tool --version` runs and succeeds (tests that need an external
/// reader such as babeltrace2 skip without it).
pub fn have_tool(tool: &str) -> bool {
    std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The lines `babeltrace2 ARGS... DIR` prints; babeltrace2 must exit 0
/// (a trace it refuses fails the test, with its own message).
pub fn babeltrace2_lines(args: &[&str], dir: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("babeltrace2")
        .args(args)
        .arg(dir)
        .output()
        .expect("babeltrace2 runs (check have_tool first)");
    assert!(
        out.status.success(),
        "babeltrace2 {args:?} {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// A fuzz input as a stream of the guest module's kernel events, so that
/// every input reaches the kernel stream's expansion (whole regions of
/// arbitrary bytes almost never hold a valid kernel packet). Format:
///
/// ```text
/// byte 0        CPUs: 1 + b % 4 (kernel channels; one user channel follows)
/// then events:  cpu (b % CPUs), id (b % (N + 1): 0..N-1 the module's N
///               events of [`KERNEL_EVENTS`], N an id nobody registered),
///               dt (ticks since the previous event, << (b >> 6) * 9), then
///               the fields in class order: integers little-endian in their
///               width, chars[N] N bytes, strings and byte fields a length
///               byte L (at most 63) and L bytes
/// ```
///
/// A short input ends the last event with zeros. Channels are closed at
/// the end, except those whose last event byte is odd (left open: a
/// committed prefix), and the region is closed.
pub fn kernel_fuzz_region(input: &[u8]) -> Vec<u8> {
    let mut inp = input.iter().copied();
    let cpus = 1 + inp.next().unwrap_or(0) as u32 % 4;
    let mut r = RegionBuilder::new(cpus + 1, 4, 4096)
        .kernel(cpus)
        .build_region();
    r.register_kernel_events();
    let mut ts = 1000u64;
    let mut last = 0u8;
    while let Some(cpu) = inp.next() {
        let id = inp.next().unwrap_or(0) as u32 % (KERNEL_EVENTS.len() as u32 + 1);
        let dt = inp.next().unwrap_or(0);
        ts = ts.saturating_add((dt as u64 & 0x3f) << ((dt >> 6) * 9));
        let fields = KERNEL_EVENTS.get(id as usize).map_or(&[][..], |(_, f)| *f);
        let payload = kernel_payload(fields, &mut inp);
        last = payload.last().copied().unwrap_or(cpu);
        r.emit(cpu as u32 % cpus, ts, id, &payload);
    }
    for c in 0..cpus {
        if (last as u32 + c).is_multiple_of(2) {
            r.close(c);
        }
    }
    r.close_region();
    r.bytes
}

/// One payload of `fields`, its values taken from `inp` (see
/// [`kernel_fuzz_region`]).
fn kernel_payload(fields: &[FlaggedFieldSpec], inp: &mut impl Iterator<Item = u8>) -> Vec<u8> {
    let mut p = Vec::new();
    for &(_, ty, count, _) in fields {
        let n = match ty {
            abi::IVT_FT_U8 | abi::IVT_FT_S8 => 1,
            abi::IVT_FT_U16 | abi::IVT_FT_S16 => 2,
            abi::IVT_FT_U32 | abi::IVT_FT_S32 => 4,
            abi::IVT_FT_U64 | abi::IVT_FT_S64 => 8,
            abi::IVT_FT_CHARS => count as usize,
            abi::IVT_FT_BYTES => {
                let len = inp.next().unwrap_or(0) as usize % 64;
                let bytes: Vec<u8> = inp.by_ref().take(len).collect();
                p.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                p.extend_from_slice(&bytes);
                continue;
            }
            _ => {
                let len = inp.next().unwrap_or(0) as usize % 64;
                p.extend(inp.by_ref().take(len).map(|b| b.max(1)));
                p.push(0);
                continue;
            }
        };
        p.extend((0..n).map(|_| inp.next().unwrap_or(0)));
    }
    p
}

/// Encodes events for [`kernel_fuzz_region`] (seeds): `(cpu, id, dt,
/// field bytes)`, the field bytes already in the input's form.
pub fn kernel_fuzz_input(cpus: u8, events: &[(u8, u8, u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![cpus.saturating_sub(1)];
    for (cpu, id, dt, fields) in events {
        out.extend_from_slice(&[*cpu, *id, *dt]);
        out.extend_from_slice(fields);
    }
    out
}
