//! The Rust mirror of `abi/include/ivtrace/abi.h`: constants and byte
//! offsets, nothing else.
//!
//! The region is read as bytes at these offsets (never through `#[repr(C)]`
//! structs laid over shared memory), so the mirror is a list of numbers.
//! Every number used by this crate is also listed in [`VECTORS`] under its
//! name in `abi/vectors.json`, and a unit test checks each one against that
//! file, which `abi/tests/abi_vectors.c` generates from abi.h.

pub const IVT_MAGIC: u64 = 0x3145_4341_5254_5649;
pub const IVT_ABI_MAJOR: u16 = 1;
pub const IVT_PAGE_SIZE: u64 = 4096;
pub const IVT_REGION_MIN: u64 = 1 << 16;
pub const IVT_SUBBUF_MIN: u32 = 4096;
pub const IVT_SUBBUF_MAX: u32 = 1 << 24;
pub const IVT_SUBBUFS_MIN: u32 = 2;
pub const IVT_SUBBUFS_MAX: u32 = 1 << 16;
pub const IVT_CHANNELS_MAX: u32 = 4096;
pub const IVT_EVENT_IDS_MAX: u32 = 4096;

pub const IVT_FEAT_KERNEL: u64 = 1 << 0;
pub const IVT_FEAT_LOOPBACK: u64 = 1 << 1;
/// The writer rings the host's doorbell while `host_sleeping` is set.
pub const IVT_FEAT_DOORBELL: u64 = 1 << 2;
/// The writer obeys control commands (`struct ivt_control`).
pub const IVT_FEAT_CONTROL: u64 = 1 << 3;
/// The writer answers clock sync requests (`struct ivt_sync`).
pub const IVT_FEAT_SYNC: u64 = 1 << 4;
/// ftrace relay channels and `IVT_CMD_FTRACE` (ABI 1.2, docs/ftrace.md).
pub const IVT_FEAT_FTRACE: u64 = 1 << 5;
/// The sync answer spins for the host's next request, bounded by
/// `IVT_SYNC_*` (abi.h "Clock sync mailbox").
pub const IVT_FEAT_SYNC_SPIN: u64 = 1 << 6;
/// Answers per entry of a spinning writer into the exchange, at most.
pub const IVT_SYNC_ROUNDS: u32 = 64;
/// How long a spinning writer waits for the next request, at most.
pub const IVT_SYNC_PATIENCE_NS: u64 = 20_000;
/// How long a spinning writer stays, from its first answer, at most.
pub const IVT_SYNC_BUDGET_NS: u64 = 60_000;
/// How often a spinning writer the host cannot kick enters the exchange.
pub const IVT_SYNC_POLL_MS: u32 = 20;

pub const IVT_STATE_FORMATTING: u32 = 0;
pub const IVT_STATE_LIVE: u32 = 1;
pub const IVT_STATE_CLOSED: u32 = 2;

pub const IVT_MODE_DISCARD: u32 = 0;
pub const IVT_MODE_OVERWRITE: u32 = 1;

pub const IVT_STREAM_KERNEL: u32 = 0;
pub const IVT_STREAM_USER: u32 = 1;
pub const IVT_STREAM_COUNT: u32 = 2;
/// The ftrace relay's per-CPU channels: whole ftrace pages (ivtrace/ftrace.h).
pub const IVT_STREAM_FTRACE: u32 = 2;
pub const IVT_STREAM_CLASSES: u32 = 3;

pub const IVT_CLOCK_TSC: u32 = 1;

/// Control commands (`ivt_control.cmd`).
pub const IVT_CMD_FLUSH: u32 = 1;
pub const IVT_CMD_ENABLE: u32 = 2;
pub const IVT_CMD_DISABLE: u32 = 3;
pub const IVT_CMD_SET_MODE: u32 = 4;
pub const IVT_CMD_STATEDUMP: u32 = 6;
/// One tracefs operation for the ftrace relay, its text in `ctl_text.req`.
pub const IVT_CMD_FTRACE: u32 = 7;
pub const IVT_CTL_REQ_MAX: usize = 1024;
pub const IVT_CTL_RESP_MAX: usize = 2048;
pub const IVT_CTL_RESP_MORE: u32 = 1;

/// Hypercall numbers (docs/kvm.md "The hypercall channel"): far above
/// KVM's own, so KVM only traces them.
pub const IVT_HC_BASE: u64 = 0x4956_0000;
/// The vmsync hypercall: a0 = cnt, a1 = vm_uid.
pub const IVT_HC_VMSYNC: u64 = IVT_HC_BASE;
/// Guest events by hypercall: nr in FIRST..=LAST.
pub const IVT_HC_EVENT_FIRST: u64 = IVT_HC_BASE + 0x100;
pub const IVT_HC_EVENT_LAST: u64 = IVT_HC_BASE + 0xffff;

pub const IVT_CTF_MAGIC: u32 = 0xC1FC_1FC1;
pub const IVT_EVENT_COUNT_UNKNOWN: u32 = 0xFFFF_FFFF;

pub const IVT_EV_ID_BITS: u32 = 5;
pub const IVT_EV_ID_EXTENDED: u32 = 31;
pub const IVT_EV_COMPACT_MAX_ID: u32 = 30;
pub const IVT_EV_TS_BITS: u32 = 27;
pub const IVT_EV_TS_MASK: u64 = (1 << IVT_EV_TS_BITS) - 1;
pub const IVT_EV_ALIGN: usize = 4;
pub const IVT_EV_COMPACT_SIZE: usize = 4;
pub const IVT_EV_EXT_SIZE: usize = 16;

pub const IVT_META_COMMIT: u32 = 0x434F_4D54;
pub const IVT_META_EVENT: u16 = 1;
/// A guest tracefs description file (`struct ivt_ftrace_rec`).
pub const IVT_META_FTRACE: u16 = 3;
pub const IVT_FTRACE_HEADER_PAGE: u16 = 1;
pub const IVT_FTRACE_FORMAT: u16 = 2;
pub const IVT_FTRACE_TEXT_MAX: usize = 16384;
pub const IVT_FTRACE_SYSTEM_MAX: usize = 32;
/// `sizeof(struct ivt_ftrace_rec)` without its text.
pub const FTRACE_REC_SIZE: usize = 48;
/// The ftrace stream's fixed event ids (ivtrace/ftrace.h).
pub const IVT_FTRACE_EV_PAGE: u32 = 0;
pub const IVT_FTRACE_EV_STATS: u32 = 1;
pub const IVT_FTRACE_EV_SYMBOLS: u32 = 2;
pub const IVT_FTRACE_STAT_COUNT: usize = 8;
pub const IVT_FTRACE_PAGE_MAX: usize = 4096;
pub const IVT_NAME_MAX: usize = 64;
pub const IVT_FIELD_NAME_MAX: usize = 32;
pub const IVT_FIELDS_MAX: u16 = 32;

pub const IVT_FT_U8: u8 = 1;
pub const IVT_FT_U16: u8 = 2;
pub const IVT_FT_U32: u8 = 3;
pub const IVT_FT_U64: u8 = 4;
pub const IVT_FT_S8: u8 = 5;
pub const IVT_FT_S16: u8 = 6;
pub const IVT_FT_S32: u8 = 7;
pub const IVT_FT_S64: u8 = 8;
pub const IVT_FT_STRING: u8 = 9;
pub const IVT_FT_BYTES: u8 = 10;
pub const IVT_FT_CHARS: u8 = 11;
pub const IVT_FF_HEX: u8 = 1 << 0;
/// A u32 thread id the host expands with the thread's name (docs/abi.md, "Kernel stream").
pub const IVT_FF_TID_COMM: u8 = 1 << 1;

/// `sizeof(struct ivt_region_hdr)`: the header page.
pub const HDR_SIZE: usize = 4096;
/// `sizeof(struct ivt_channel)`.
pub const CHANNEL_SIZE: u64 = 256;
/// `sizeof(struct ivt_packet_hdr)`: CTF packet header + packet context.
pub const PACKET_HDR_SIZE: usize = 88;
/// The header alone as a CTF size (bits): an empty packet's content and
/// packet size.
pub const PACKET_HDR_BITS: u64 = PACKET_HDR_SIZE as u64 * 8;
/// `sizeof(struct ivt_meta_rec)` without its fields.
pub const META_REC_SIZE: usize = 88;
/// `sizeof(struct ivt_meta_field)`.
pub const META_FIELD_SIZE: usize = 40;

/// Byte offsets in `struct ivt_region_hdr`.
pub mod hdr {
    pub const MAGIC: usize = 0;
    pub const ABI_MAJOR: usize = 8;
    pub const ABI_MINOR: usize = 10;
    pub const HDR_SIZE: usize = 12;
    pub const REGION_SIZE: usize = 16;
    pub const FEATURES: usize = 24;
    pub const UUID: usize = 32;
    pub const DEFAULT_MODE: usize = 48;
    pub const OWNER_PID: usize = 52;
    pub const LAYOUT: usize = 64;
    pub const CLOCK: usize = 128;
    pub const STATE: usize = 192;
    pub const META_TAIL: usize = 196;
    pub const LOST_NO_CHANNEL: usize = 208;
    pub const DOORBELLS: usize = 216;
    pub const HOST_SLEEPING: usize = 256;
    pub const HOST_PEER_ID: usize = 260;
    pub const HOST_VECTOR: usize = 262;
    pub const HOST_HEARTBEAT: usize = 264;
    pub const FLUSH_INTERVAL_MS: usize = 272;
    pub const CONTROL: usize = 320;
    pub const SYNC: usize = 448;
    pub const NR_FTRACE_CHANNELS: usize = 112;
    pub const CTL_TEXT: usize = 576;
}

/// Byte offsets in `struct ivt_ctl_text` (relative to it).
pub mod ctl_text {
    pub const REQ: usize = 0;
    pub const RESP_LEN: usize = 1024;
    pub const RESP_FLAGS: usize = 1028;
    pub const RESP: usize = 1088;
}

/// Byte offsets in `struct ivt_ftrace_rec`.
pub mod ftrace_rec {
    pub const WHAT: usize = 10;
    pub const TEXT_LEN: usize = 12;
    pub const SYSTEM: usize = 16;
    pub const TEXT: usize = 48;
}

/// Byte offsets in `struct ivt_control` (relative to it).
pub mod control {
    pub const CMD_SEQ: usize = 0;
    pub const CMD: usize = 8;
    pub const ARG: usize = 16;
    pub const ACK_SEQ: usize = 64;
    pub const ACK_STATUS: usize = 72;
    pub const GROUPS_ENABLED: usize = 76;
}

/// Byte offsets in `struct ivt_sync` (relative to it).
pub mod sync {
    pub const REQ_SEQ: usize = 0;
    pub const HOST_T1: usize = 8;
    pub const RESP_SEQ: usize = 64;
    pub const RESP_T2: usize = 72;
    pub const RESP_T3: usize = 80;
    pub const RESP_SPUN: usize = 88;
}

/// Byte offsets in `struct ivt_layout` (relative to the layout).
pub mod layout {
    pub const CHANNELS_OFF: usize = 0;
    pub const META_OFF: usize = 8;
    pub const POOL_OFF: usize = 16;
    pub const META_SIZE: usize = 24;
    pub const NR_CHANNELS: usize = 28;
    pub const NR_KERNEL_CHANNELS: usize = 32;
    pub const CHANNEL_SIZE: usize = 36;
    pub const NR_SUBBUFS: usize = 40;
    pub const SUBBUF_SIZE: usize = 44;
}

/// Byte offsets in `struct ivt_clock` (relative to the clock).
pub mod clock {
    pub const FREQ_HZ: usize = 0;
    pub const SOURCE: usize = 8;
    pub const REF_TICKS: usize = 16;
    pub const REF_REALTIME_NS: usize = 24;
}

/// Byte offsets in `struct ivt_channel`.
pub mod chan {
    pub const COMMIT_POS: u64 = 0;
    pub const OPEN_SEQ: u64 = 8;
    pub const LOST_FULL: u64 = 16;
    pub const LOST_TOO_BIG: u64 = 24;
    pub const LOST_NESTED: u64 = 32;
    pub const MODE: u64 = 40;
    pub const EVENTS_CLOSED: u64 = 56;
    pub const CONSUMED: u64 = 128;
}

/// Byte offsets in `struct ivt_packet_hdr`.
pub mod pkt {
    pub const MAGIC: usize = 0;
    pub const STREAM_ID: usize = 4;
    pub const STREAM_INSTANCE_ID: usize = 8;
    pub const TIMESTAMP_BEGIN: usize = 16;
    pub const TIMESTAMP_END: usize = 24;
    pub const CONTENT_SIZE: usize = 32;
    pub const PACKET_SIZE: usize = 40;
    pub const PACKET_SEQ_NUM: usize = 48;
    pub const EVENTS_DISCARDED: usize = 56;
    pub const FIRST_EVENT_SEQ: usize = 64;
    pub const EVENT_COUNT: usize = 72;
    pub const CPU_ID: usize = 76;
    pub const OWNER_PID: usize = 80;
    pub const OWNER_TID: usize = 84;
}

/// Byte offsets in `struct ivt_meta_rec` and `struct ivt_meta_field`.
pub mod meta {
    pub const LEN: usize = 0;
    pub const COMMIT: usize = 4;
    pub const KIND: usize = 8;
    pub const NR_FIELDS: usize = 10;
    pub const EVENT_ID: usize = 12;
    pub const STREAM: usize = 16;
    pub const GROUP: usize = 20;
    pub const NAME: usize = 24;
    pub const FIELDS: usize = 88;
    pub const FIELD_NAME: usize = 0;
    pub const FIELD_TYPE: usize = 32;
    pub const FIELD_FLAGS: usize = 33;
    pub const FIELD_COUNT: usize = 34;
}

/// Every number above under its `abi/vectors.json` name (checked by a test).
pub const VECTORS: &[(&str, u64)] = &[
    ("IVT_MAGIC", IVT_MAGIC),
    ("IVT_ABI_MAJOR", IVT_ABI_MAJOR as u64),
    ("IVT_PAGE_SIZE", IVT_PAGE_SIZE),
    ("IVT_REGION_MIN", IVT_REGION_MIN),
    ("IVT_SUBBUF_MIN", IVT_SUBBUF_MIN as u64),
    ("IVT_SUBBUF_MAX", IVT_SUBBUF_MAX as u64),
    ("IVT_SUBBUFS_MIN", IVT_SUBBUFS_MIN as u64),
    ("IVT_SUBBUFS_MAX", IVT_SUBBUFS_MAX as u64),
    ("IVT_CHANNELS_MAX", IVT_CHANNELS_MAX as u64),
    ("IVT_EVENT_IDS_MAX", IVT_EVENT_IDS_MAX as u64),
    ("IVT_FEAT_KERNEL", IVT_FEAT_KERNEL),
    ("IVT_FEAT_LOOPBACK", IVT_FEAT_LOOPBACK),
    ("IVT_FEAT_DOORBELL", IVT_FEAT_DOORBELL),
    ("IVT_FEAT_CONTROL", IVT_FEAT_CONTROL),
    ("IVT_FEAT_SYNC", IVT_FEAT_SYNC),
    ("IVT_FEAT_FTRACE", IVT_FEAT_FTRACE),
    ("IVT_FEAT_SYNC_SPIN", IVT_FEAT_SYNC_SPIN),
    ("IVT_SYNC_ROUNDS", IVT_SYNC_ROUNDS as u64),
    ("IVT_SYNC_PATIENCE_NS", IVT_SYNC_PATIENCE_NS),
    ("IVT_SYNC_BUDGET_NS", IVT_SYNC_BUDGET_NS),
    ("IVT_SYNC_POLL_MS", IVT_SYNC_POLL_MS as u64),
    ("IVT_CMD_FTRACE", IVT_CMD_FTRACE as u64),
    ("IVT_CTL_REQ_MAX", IVT_CTL_REQ_MAX as u64),
    ("IVT_CTL_RESP_MAX", IVT_CTL_RESP_MAX as u64),
    ("IVT_CTL_RESP_MORE", IVT_CTL_RESP_MORE as u64),
    ("IVT_STREAM_FTRACE", IVT_STREAM_FTRACE as u64),
    ("IVT_STREAM_CLASSES", IVT_STREAM_CLASSES as u64),
    ("IVT_META_FTRACE", IVT_META_FTRACE as u64),
    ("IVT_FTRACE_HEADER_PAGE", IVT_FTRACE_HEADER_PAGE as u64),
    ("IVT_FTRACE_FORMAT", IVT_FTRACE_FORMAT as u64),
    ("IVT_FTRACE_TEXT_MAX", IVT_FTRACE_TEXT_MAX as u64),
    ("IVT_FTRACE_SYSTEM_MAX", IVT_FTRACE_SYSTEM_MAX as u64),
    ("IVT_FTRACE_EV_PAGE", IVT_FTRACE_EV_PAGE as u64),
    ("IVT_FTRACE_EV_STATS", IVT_FTRACE_EV_STATS as u64),
    ("IVT_FTRACE_EV_SYMBOLS", IVT_FTRACE_EV_SYMBOLS as u64),
    ("IVT_FTRACE_STAT_COUNT", IVT_FTRACE_STAT_COUNT as u64),
    ("IVT_FTRACE_PAGE_MAX", IVT_FTRACE_PAGE_MAX as u64),
    ("sizeof.ivt_ftrace_rec", FTRACE_REC_SIZE as u64),
    (
        "offsetof.ivt_region_hdr.nr_ftrace_channels",
        hdr::NR_FTRACE_CHANNELS as u64,
    ),
    ("offsetof.ivt_region_hdr.ctl_text", hdr::CTL_TEXT as u64),
    ("offsetof.ivt_ctl_text.req", ctl_text::REQ as u64),
    ("offsetof.ivt_ctl_text.resp_len", ctl_text::RESP_LEN as u64),
    (
        "offsetof.ivt_ctl_text.resp_flags",
        ctl_text::RESP_FLAGS as u64,
    ),
    ("offsetof.ivt_ctl_text.resp", ctl_text::RESP as u64),
    ("offsetof.ivt_ftrace_rec.what", ftrace_rec::WHAT as u64),
    (
        "offsetof.ivt_ftrace_rec.text_len",
        ftrace_rec::TEXT_LEN as u64,
    ),
    ("offsetof.ivt_ftrace_rec.system", ftrace_rec::SYSTEM as u64),
    ("offsetof.ivt_ftrace_rec.text", ftrace_rec::TEXT as u64),
    ("IVT_CMD_FLUSH", IVT_CMD_FLUSH as u64),
    ("IVT_CMD_ENABLE", IVT_CMD_ENABLE as u64),
    ("IVT_CMD_DISABLE", IVT_CMD_DISABLE as u64),
    ("IVT_CMD_SET_MODE", IVT_CMD_SET_MODE as u64),
    ("IVT_CMD_STATEDUMP", IVT_CMD_STATEDUMP as u64),
    ("IVT_STATE_FORMATTING", IVT_STATE_FORMATTING as u64),
    ("IVT_STATE_LIVE", IVT_STATE_LIVE as u64),
    ("IVT_STATE_CLOSED", IVT_STATE_CLOSED as u64),
    ("IVT_MODE_DISCARD", IVT_MODE_DISCARD as u64),
    ("IVT_MODE_OVERWRITE", IVT_MODE_OVERWRITE as u64),
    ("IVT_STREAM_KERNEL", IVT_STREAM_KERNEL as u64),
    ("IVT_STREAM_USER", IVT_STREAM_USER as u64),
    ("IVT_STREAM_COUNT", IVT_STREAM_COUNT as u64),
    ("IVT_CLOCK_TSC", IVT_CLOCK_TSC as u64),
    ("IVT_HC_BASE", IVT_HC_BASE),
    ("IVT_HC_VMSYNC", IVT_HC_VMSYNC),
    ("IVT_HC_EVENT_FIRST", IVT_HC_EVENT_FIRST),
    ("IVT_HC_EVENT_LAST", IVT_HC_EVENT_LAST),
    ("IVT_CTF_MAGIC", IVT_CTF_MAGIC as u64),
    ("IVT_EVENT_COUNT_UNKNOWN", IVT_EVENT_COUNT_UNKNOWN as u64),
    ("IVT_EV_ID_BITS", IVT_EV_ID_BITS as u64),
    ("IVT_EV_ID_EXTENDED", IVT_EV_ID_EXTENDED as u64),
    ("IVT_EV_COMPACT_MAX_ID", IVT_EV_COMPACT_MAX_ID as u64),
    ("IVT_EV_TS_BITS", IVT_EV_TS_BITS as u64),
    ("IVT_EV_ALIGN", IVT_EV_ALIGN as u64),
    ("IVT_EV_COMPACT_SIZE", IVT_EV_COMPACT_SIZE as u64),
    ("IVT_EV_EXT_SIZE", IVT_EV_EXT_SIZE as u64),
    ("IVT_META_COMMIT", IVT_META_COMMIT as u64),
    ("IVT_META_EVENT", IVT_META_EVENT as u64),
    ("IVT_NAME_MAX", IVT_NAME_MAX as u64),
    ("IVT_FIELD_NAME_MAX", IVT_FIELD_NAME_MAX as u64),
    ("IVT_FIELDS_MAX", IVT_FIELDS_MAX as u64),
    ("IVT_FT_U8", IVT_FT_U8 as u64),
    ("IVT_FT_U16", IVT_FT_U16 as u64),
    ("IVT_FT_U32", IVT_FT_U32 as u64),
    ("IVT_FT_U64", IVT_FT_U64 as u64),
    ("IVT_FT_S8", IVT_FT_S8 as u64),
    ("IVT_FT_S16", IVT_FT_S16 as u64),
    ("IVT_FT_S32", IVT_FT_S32 as u64),
    ("IVT_FT_S64", IVT_FT_S64 as u64),
    ("IVT_FT_STRING", IVT_FT_STRING as u64),
    ("IVT_FT_BYTES", IVT_FT_BYTES as u64),
    ("IVT_FT_CHARS", IVT_FT_CHARS as u64),
    ("IVT_FF_HEX", IVT_FF_HEX as u64),
    ("IVT_FF_TID_COMM", IVT_FF_TID_COMM as u64),
    ("sizeof.ivt_region_hdr", HDR_SIZE as u64),
    ("sizeof.ivt_channel", CHANNEL_SIZE),
    ("sizeof.ivt_packet_hdr", PACKET_HDR_SIZE as u64),
    ("sizeof.ivt_meta_rec", META_REC_SIZE as u64),
    ("sizeof.ivt_meta_field", META_FIELD_SIZE as u64),
    ("sizeof.ivt_event_ext", IVT_EV_EXT_SIZE as u64),
    ("offsetof.ivt_region_hdr.magic", hdr::MAGIC as u64),
    ("offsetof.ivt_region_hdr.abi_major", hdr::ABI_MAJOR as u64),
    ("offsetof.ivt_region_hdr.abi_minor", hdr::ABI_MINOR as u64),
    ("offsetof.ivt_region_hdr.hdr_size", hdr::HDR_SIZE as u64),
    (
        "offsetof.ivt_region_hdr.region_size",
        hdr::REGION_SIZE as u64,
    ),
    ("offsetof.ivt_region_hdr.features", hdr::FEATURES as u64),
    ("offsetof.ivt_region_hdr.uuid", hdr::UUID as u64),
    (
        "offsetof.ivt_region_hdr.default_mode",
        hdr::DEFAULT_MODE as u64,
    ),
    ("offsetof.ivt_region_hdr.owner_pid", hdr::OWNER_PID as u64),
    ("offsetof.ivt_region_hdr.layout", hdr::LAYOUT as u64),
    ("offsetof.ivt_region_hdr.clock", hdr::CLOCK as u64),
    ("offsetof.ivt_region_hdr.state", hdr::STATE as u64),
    ("offsetof.ivt_region_hdr.meta_tail", hdr::META_TAIL as u64),
    (
        "offsetof.ivt_region_hdr.lost_no_channel",
        hdr::LOST_NO_CHANNEL as u64,
    ),
    ("offsetof.ivt_region_hdr.doorbells", hdr::DOORBELLS as u64),
    (
        "offsetof.ivt_region_hdr.host_sleeping",
        hdr::HOST_SLEEPING as u64,
    ),
    (
        "offsetof.ivt_region_hdr.host_peer_id",
        hdr::HOST_PEER_ID as u64,
    ),
    (
        "offsetof.ivt_region_hdr.host_vector",
        hdr::HOST_VECTOR as u64,
    ),
    (
        "offsetof.ivt_region_hdr.host_heartbeat",
        hdr::HOST_HEARTBEAT as u64,
    ),
    (
        "offsetof.ivt_region_hdr.flush_interval_ms",
        hdr::FLUSH_INTERVAL_MS as u64,
    ),
    ("offsetof.ivt_region_hdr.control", hdr::CONTROL as u64),
    ("offsetof.ivt_region_hdr.sync", hdr::SYNC as u64),
    ("offsetof.ivt_control.cmd_seq", control::CMD_SEQ as u64),
    ("offsetof.ivt_control.cmd", control::CMD as u64),
    ("offsetof.ivt_control.arg", control::ARG as u64),
    ("offsetof.ivt_control.ack_seq", control::ACK_SEQ as u64),
    (
        "offsetof.ivt_control.ack_status",
        control::ACK_STATUS as u64,
    ),
    (
        "offsetof.ivt_control.groups_enabled",
        control::GROUPS_ENABLED as u64,
    ),
    ("offsetof.ivt_sync.req_seq", sync::REQ_SEQ as u64),
    ("offsetof.ivt_sync.host_t1", sync::HOST_T1 as u64),
    ("offsetof.ivt_sync.resp_seq", sync::RESP_SEQ as u64),
    ("offsetof.ivt_sync.resp_t2", sync::RESP_T2 as u64),
    ("offsetof.ivt_sync.resp_t3", sync::RESP_T3 as u64),
    ("offsetof.ivt_sync.resp_spun", sync::RESP_SPUN as u64),
    (
        "offsetof.ivt_layout.channels_off",
        layout::CHANNELS_OFF as u64,
    ),
    ("offsetof.ivt_layout.meta_off", layout::META_OFF as u64),
    ("offsetof.ivt_layout.pool_off", layout::POOL_OFF as u64),
    ("offsetof.ivt_layout.meta_size", layout::META_SIZE as u64),
    (
        "offsetof.ivt_layout.nr_channels",
        layout::NR_CHANNELS as u64,
    ),
    (
        "offsetof.ivt_layout.nr_kernel_channels",
        layout::NR_KERNEL_CHANNELS as u64,
    ),
    (
        "offsetof.ivt_layout.channel_size",
        layout::CHANNEL_SIZE as u64,
    ),
    ("offsetof.ivt_layout.nr_subbufs", layout::NR_SUBBUFS as u64),
    (
        "offsetof.ivt_layout.subbuf_size",
        layout::SUBBUF_SIZE as u64,
    ),
    ("offsetof.ivt_clock.freq_hz", clock::FREQ_HZ as u64),
    ("offsetof.ivt_clock.source", clock::SOURCE as u64),
    ("offsetof.ivt_clock.ref_ticks", clock::REF_TICKS as u64),
    (
        "offsetof.ivt_clock.ref_realtime_ns",
        clock::REF_REALTIME_NS as u64,
    ),
    ("offsetof.ivt_channel.commit_pos", chan::COMMIT_POS),
    ("offsetof.ivt_channel.open_seq", chan::OPEN_SEQ),
    ("offsetof.ivt_channel.lost_full", chan::LOST_FULL),
    ("offsetof.ivt_channel.lost_too_big", chan::LOST_TOO_BIG),
    ("offsetof.ivt_channel.lost_nested", chan::LOST_NESTED),
    ("offsetof.ivt_channel.mode", chan::MODE),
    ("offsetof.ivt_channel.events_closed", chan::EVENTS_CLOSED),
    ("offsetof.ivt_channel.consumed", chan::CONSUMED),
    ("offsetof.ivt_packet_hdr.magic", pkt::MAGIC as u64),
    ("offsetof.ivt_packet_hdr.stream_id", pkt::STREAM_ID as u64),
    (
        "offsetof.ivt_packet_hdr.stream_instance_id",
        pkt::STREAM_INSTANCE_ID as u64,
    ),
    (
        "offsetof.ivt_packet_hdr.timestamp_begin",
        pkt::TIMESTAMP_BEGIN as u64,
    ),
    (
        "offsetof.ivt_packet_hdr.timestamp_end",
        pkt::TIMESTAMP_END as u64,
    ),
    (
        "offsetof.ivt_packet_hdr.content_size",
        pkt::CONTENT_SIZE as u64,
    ),
    (
        "offsetof.ivt_packet_hdr.packet_size",
        pkt::PACKET_SIZE as u64,
    ),
    (
        "offsetof.ivt_packet_hdr.packet_seq_num",
        pkt::PACKET_SEQ_NUM as u64,
    ),
    (
        "offsetof.ivt_packet_hdr.events_discarded",
        pkt::EVENTS_DISCARDED as u64,
    ),
    (
        "offsetof.ivt_packet_hdr.first_event_seq",
        pkt::FIRST_EVENT_SEQ as u64,
    ),
    (
        "offsetof.ivt_packet_hdr.event_count",
        pkt::EVENT_COUNT as u64,
    ),
    ("offsetof.ivt_packet_hdr.cpu_id", pkt::CPU_ID as u64),
    ("offsetof.ivt_packet_hdr.owner_pid", pkt::OWNER_PID as u64),
    ("offsetof.ivt_packet_hdr.owner_tid", pkt::OWNER_TID as u64),
    ("offsetof.ivt_meta_rec.len", meta::LEN as u64),
    ("offsetof.ivt_meta_rec.commit", meta::COMMIT as u64),
    ("offsetof.ivt_meta_rec.kind", meta::KIND as u64),
    ("offsetof.ivt_meta_rec.nr_fields", meta::NR_FIELDS as u64),
    ("offsetof.ivt_meta_rec.event_id", meta::EVENT_ID as u64),
    ("offsetof.ivt_meta_rec.stream", meta::STREAM as u64),
    ("offsetof.ivt_meta_rec.group", meta::GROUP as u64),
    ("offsetof.ivt_meta_rec.name", meta::NAME as u64),
    ("offsetof.ivt_meta_rec.fields", meta::FIELDS as u64),
    ("offsetof.ivt_meta_field.name", meta::FIELD_NAME as u64),
    ("offsetof.ivt_meta_field.type", meta::FIELD_TYPE as u64),
    ("offsetof.ivt_meta_field.flags", meta::FIELD_FLAGS as u64),
    ("offsetof.ivt_meta_field.count", meta::FIELD_COUNT as u64),
];

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::VECTORS;

    fn vectors() -> serde_json::Map<String, serde_json::Value> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../abi/vectors.json");
        let text = std::fs::read_to_string(path).expect("abi/vectors.json is readable");
        serde_json::from_str(&text).expect("abi/vectors.json is a JSON object")
    }

    #[test]
    fn every_mirrored_number_matches_abi_vectors() {
        let vectors = vectors();
        let mut wrong = Vec::new();
        for (name, ours) in VECTORS {
            match vectors.get(*name).and_then(|v| v.as_u64()) {
                Some(theirs) if theirs == *ours => {}
                other => wrong.push(format!("{name}: ours {ours}, abi {other:?}")),
            }
        }
        assert!(
            wrong.is_empty(),
            "mirror differs from abi.h:\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn mirror_covers_every_packet_header_and_layout_offset() {
        let vectors = vectors();
        let ours: std::collections::HashSet<&str> = VECTORS.iter().map(|(n, _)| *n).collect();
        let missing: Vec<&String> = vectors
            .keys()
            .filter(|k| {
                k.starts_with("offsetof.ivt_packet_hdr.")
                    || k.starts_with("offsetof.ivt_layout.")
                    || k.starts_with("offsetof.ivt_meta_")
            })
            .filter(|k| !ours.contains(k.as_str()))
            .collect();
        assert!(missing.is_empty(), "not mirrored: {missing:?}");
    }
}
