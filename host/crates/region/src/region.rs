//! Mapping a region and validating its header.
//!
//! [`Region`] owns the mapping (or, for tests and fuzzing, an owned buffer
//! standing in for one) and is the only place that touches shared memory.
//! It offers three kinds of access, nothing else:
//!
//! - atomic loads and stores of naturally aligned control words, at offsets
//!   computed from the *validated* layout, private to this crate: the
//!   host's half of the protocol ([`crate::protocol`]) is their only user
//!   and names, for each, its ordering and what it pairs with;
//! - bounded byte copies out of the region ([`Region::copy_out`]), after
//!   which only the private copy is parsed;
//! - nothing that hands out a reference into the region's bytes.
//!
//! [`Header`] is parsed from a private copy of the header page and checked
//! field by field into typed [`RegionError`]s before any offset in it is
//! used.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use thiserror::Error;

use crate::abi;
use crate::bytes::usize_from;
use crate::bytes::{le_u16, le_u32, le_u64};
use crate::sigbus;

/// Why a region cannot be read (yet, or at all).
#[derive(Debug, Error)]
pub enum RegionError {
    #[error("{path} does not exist")]
    Missing { path: String },
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot map {path}: {source}")]
    Map {
        path: String,
        source: std::io::Error,
    },
    #[error("region is {size} bytes, smaller than the minimum {min}")]
    TooSmall { size: u64, min: u64 },
    #[error("region is not formatted yet (magic is 0)")]
    NotFormatted,
    #[error("bad magic {found:#018x} (expected {expected:#018x}): not an ivtrace region")]
    BadMagic { found: u64, expected: u64 },
    #[error("ABI major version {found}, this reader speaks {expected}")]
    AbiMajor { found: u16, expected: u16 },
    #[error("header size {found}, expected {expected}")]
    HeaderSize { found: u32, expected: usize },
    #[error("header says region_size {header} bytes but the mapping has {actual}")]
    SizeMismatch { header: u64, actual: u64 },
    #[error("region size {0} is not a power of two")]
    NotPowerOfTwo(u64),
    #[error("channel_size {found}, expected {expected}")]
    ChannelSize { found: u32, expected: u64 },
    #[error("{found} channels (allowed 1..={max})")]
    ChannelCount { found: u32, max: u32 },
    #[error("{kernel} kernel and {ftrace} ftrace channels but only {total} channels")]
    KernelChannels {
        kernel: u32,
        ftrace: u32,
        total: u32,
    },
    #[error("{what} {value} is not a power of two in [{min}, {max}]")]
    Geometry {
        what: &'static str,
        value: u32,
        min: u32,
        max: u32,
    },
    #[error("{what} offset {off:#x} is not page aligned")]
    Misaligned { what: &'static str, off: u64 },
    #[error("{what} [{off:#x}, +{len:#x}) lies outside the {region:#x}-byte region")]
    OutOfBounds {
        what: &'static str,
        off: u64,
        len: u64,
        region: u64,
    },
    #[error("{a} and {b} overlap")]
    Overlap { a: &'static str, b: &'static str },
}

/// Whether the host may write its control words (`consumed`, heartbeat).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `record`: the host releases sub-buffers and beats its heartbeat.
    ReadWrite,
    /// `snapshot`: the region is never written.
    ReadOnly,
}

/// The parts of the region, as validated byte ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub channels_off: u64,
    pub meta_off: u64,
    pub pool_off: u64,
    pub meta_size: u32,
    pub nr_channels: u32,
    pub nr_kernel_channels: u32,
    /// The ftrace relay's channels, right after the kernel ones (ABI 1.2;
    /// `nr_ftrace_channels` of the header, outside `struct ivt_layout`).
    pub nr_ftrace_channels: u32,
    pub nr_subbufs: u32,
    pub subbuf_size: u32,
}

impl Layout {
    /// Byte offset of sub-buffer `seq % nr_subbufs` of channel `chan`
    /// (`ivt_subbuf_offset()` in abi.h). In bounds for a validated layout.
    pub fn subbuf_offset(&self, chan: u32, seq: u64) -> u64 {
        // check_areas() proved pool_off + nr_channels * nr_subbufs *
        // subbuf_size fits in the region: for chan < nr_channels nothing
        // saturates; past it, the offset fails every access check.
        let slot = seq & u64::from(self.nr_subbufs).wrapping_sub(1);
        let idx = u64::from(chan)
            .saturating_mul(u64::from(self.nr_subbufs))
            .saturating_add(slot);
        self.pool_off
            .saturating_add(idx.saturating_mul(u64::from(self.subbuf_size)))
    }

    /// Byte offset of channel `chan`'s `struct ivt_channel`.
    pub fn channel_offset(&self, chan: u32) -> u64 {
        // In the channel table for chan < nr_channels (check_areas()).
        self.channels_off
            .saturating_add(u64::from(chan).saturating_mul(abi::CHANNEL_SIZE))
    }

    /// Stream class of channel `chan`, from the layout alone (the host's
    /// own knowledge, not the guest-writable `ivt_channel.stream`).
    pub fn stream_of(&self, chan: u32) -> u32 {
        if chan < self.nr_kernel_channels {
            abi::IVT_STREAM_KERNEL
        } else if chan.saturating_sub(self.nr_kernel_channels) < self.nr_ftrace_channels {
            abi::IVT_STREAM_FTRACE
        } else {
            abi::IVT_STREAM_USER
        }
    }
}

/// The writers' clock as the formatter described it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockRef {
    pub freq_hz: u64,
    pub source: u32,
    pub ref_ticks: u64,
    pub ref_realtime_ns: u64,
}

/// The immutable part of the header, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub abi_major: u16,
    pub abi_minor: u16,
    pub region_size: u64,
    pub features: u64,
    pub uuid: [u8; 16],
    pub default_mode: u32,
    pub owner_pid: u32,
    pub layout: Layout,
    pub clock: ClockRef,
}

impl Header {
    pub fn is_loopback(&self) -> bool {
        self.features & abi::IVT_FEAT_LOOPBACK != 0
    }

    /// The uuid in its canonical 8-4-4-4-12 text form.
    pub fn uuid_string(&self) -> String {
        format_uuid(&self.uuid)
    }
}

/// Formats 16 bytes as a canonical uuid string.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

enum Backing {
    /// The mapping (control words) and the file (copies, with pread). The
    /// guard comes first: it unregisters before the mapping goes.
    Mapped(sigbus::Guard, MmapRaw, File),
    /// u64 words so that the stand-in is as aligned as a mapping.
    Owned(Box<[u64]>),
}

/// A validated region: the mapping plus its header.
pub struct Region {
    backing: Backing,
    len: usize,
    access: Access,
    header: Header,
    /// A copy came back short: the file is smaller than the mapping.
    short_read: AtomicBool,
}

// SAFETY: the region's bytes are only reached through atomics and through
// copies that tolerate concurrent modification (see copy_out); the raw
// pointer inside MmapRaw is not handed out.
unsafe impl Send for Region {}

impl Region {
    /// Maps `path` and validates it. A file that does not exist, is too
    /// small or is not formatted yet gives an error the caller may retry.
    pub fn open(path: &Path, access: Access) -> Result<Region, RegionError> {
        let file = open_file(path, access)?;
        Self::open_file(file, &path.display().to_string(), access)
    }

    /// Maps the already open region `file` (`shown` names it in errors)
    /// and validates it.
    pub fn open_file(file: File, shown: &str, access: Access) -> Result<Region, RegionError> {
        let shown = shown.to_string();
        let size = file
            .metadata()
            .map_err(|source| RegionError::Open {
                path: shown.clone(),
                source,
            })?
            .len();
        check_min_size(size)?;
        let map = match access {
            Access::ReadWrite => MmapOptions::new().map_raw(&file),
            Access::ReadOnly => MmapOptions::new().map_raw_read_only(&file),
        }
        .map_err(|source| RegionError::Map {
            path: shown,
            source,
        })?;
        let len = map.len();
        // Control words are the only accesses to the mapping: a SIGBUS
        // there (the file shrank) is caught, see crate::sigbus.
        let guard = sigbus::register(map.as_mut_ptr(), len);
        Self::validate(Backing::Mapped(guard, map, file), len, access)
    }

    /// Validates a private copy of region bytes (tests, fuzzing, files that
    /// are not shared). The copy is owned; writes go to the copy.
    pub fn from_bytes(bytes: &[u8], access: Access) -> Result<Region, RegionError> {
        check_min_size(bytes.len() as u64)?;
        let mut words = vec![0u64; bytes.len().div_ceil(8)].into_boxed_slice();
        for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_ne_bytes(b);
        }
        Self::validate(Backing::Owned(words), bytes.len(), access)
    }

    fn validate(backing: Backing, len: usize, access: Access) -> Result<Region, RegionError> {
        let mut region = Region {
            backing,
            len,
            access,
            header: placeholder_header(),
            short_read: AtomicBool::new(false),
        };
        check_magic(region.protocol().published_magic())?;
        let mut page = vec![0u8; abi::HDR_SIZE];
        // Plain copy, ordered after the magic's load-acquire: the formatter
        // wrote the whole header page before publishing the magic.
        region.copy_out(0, &mut page);
        region.header = parse_header(&page, len as u64)?;
        Ok(region)
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn layout(&self) -> &Layout {
        &self.header.layout
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn access(&self) -> Access {
        self.access
    }

    /// Whether the region's file shrank under the mapping (a copy came
    /// back short, or the SIGBUS handler replaced a page). The reader
    /// should stop: what is past the new end is gone.
    pub fn shrunk(&self) -> bool {
        self.short_read.load(Ordering::Relaxed)
            || matches!(&self.backing, Backing::Mapped(g, _, _) if g.hit())
    }

    fn base(&self) -> *mut u8 {
        match &self.backing {
            Backing::Mapped(_, m, _) => m.as_mut_ptr(),
            Backing::Owned(words) => words.as_ptr() as *mut u8,
        }
    }

    fn assert_word(&self, off: u64, size: u64) -> usize {
        assert!(
            off.is_multiple_of(size) && off.saturating_add(size) <= self.len as u64,
            "control word at {off:#x} is misaligned or out of bounds (layout bug)"
        );
        usize_from(off)
    }

    fn atomic_u64(&self, off: u64) -> &AtomicU64 {
        let off = self.assert_word(off, 8);
        // SAFETY: `off` is 8-aligned and in bounds (checked above) of a
        // mapping (or owned buffer) that lives as long as `self`; an
        // AtomicU64 has the size and alignment of a u64, and every access
        // to this word from this process goes through atomics. Other
        // processes use C11 atomics on the same word (barrier.h).
        unsafe { &*(self.base().add(off) as *const AtomicU64) }
    }

    fn atomic_u32(&self, off: u64) -> &AtomicU32 {
        let off = self.assert_word(off, 4);
        // SAFETY: as in atomic_u64, for a 4-aligned in-bounds u32.
        unsafe { &*(self.base().add(off) as *const AtomicU32) }
    }

    // The raw accessors below are private to this crate: every use names
    // its ordering and what it pairs with in protocol.rs, the host's half
    // of the protocol (the only caller outside this file).

    /// Acquire load of a u64 control word.
    pub(crate) fn load_acquire_u64(&self, off: u64) -> u64 {
        self.atomic_u64(off).load(Ordering::Acquire)
    }

    /// Relaxed (untorn, unordered) load of a u64 word.
    pub(crate) fn load_relaxed_u64(&self, off: u64) -> u64 {
        self.atomic_u64(off).load(Ordering::Relaxed)
    }

    pub(crate) fn load_acquire_u32(&self, off: u64) -> u32 {
        self.atomic_u32(off).load(Ordering::Acquire)
    }

    pub(crate) fn load_relaxed_u32(&self, off: u64) -> u32 {
        self.atomic_u32(off).load(Ordering::Relaxed)
    }

    /// Release store of a host-owned u64 word. Does nothing on a read-only
    /// region (snapshot never writes).
    pub(crate) fn store_release_u64(&self, off: u64, v: u64) {
        if self.access == Access::ReadWrite {
            self.atomic_u64(off).store(v, Ordering::Release);
        }
    }

    /// Relaxed store of a host-owned u64 word. Nothing on a read-only region.
    pub(crate) fn store_relaxed_u64(&self, off: u64, v: u64) {
        if self.access == Access::ReadWrite {
            self.atomic_u64(off).store(v, Ordering::Relaxed);
        }
    }

    /// Relaxed store of a host-owned u32 word. Nothing on a read-only region.
    pub(crate) fn store_relaxed_u32(&self, off: u64, v: u32) {
        if self.access == Access::ReadWrite {
            self.atomic_u32(off).store(v, Ordering::Relaxed);
        }
    }

    /// Full (sequentially consistent) fence.
    pub(crate) fn fence_full(&self) {
        fence(Ordering::SeqCst);
    }

    /// Acquire fence.
    pub(crate) fn fence_acquire(&self) {
        fence(Ordering::Acquire);
    }

    /// The region file (None for an in-memory region), for the control
    /// lock.
    pub(crate) fn file(&self) -> Option<&File> {
        match &self.backing {
            Backing::Mapped(_, _, file) => Some(file),
            Backing::Owned(_) => None,
        }
    }

    /// Copies `dst.len()` bytes at `off` out of the region. Returns false
    /// (and copies nothing) if the range is not inside the region.
    ///
    /// The bytes may be changing under us (a live or hostile writer): the
    /// copy is only ever parsed after the fact, and overwrite-mode callers
    /// check for tearing afterwards.
    pub fn copy_out(&self, off: u64, dst: &mut [u8]) -> bool {
        let end = off.checked_add(dst.len() as u64);
        if end.is_none_or(|e| e > self.len as u64) {
            return false;
        }
        if let Backing::Mapped(_, _, file) = &self.backing {
            // pread(2): no page faults in our mapping, and a file that
            // shrank under us gives a short read instead of SIGBUS.
            let ok = file.read_exact_at(dst, off).is_ok();
            if !ok && file.metadata().is_ok_and(|m| m.len() < self.len as u64) {
                self.short_read.store(true, Ordering::Relaxed);
            }
            return ok;
        }
        // SAFETY: [off, off + len) is inside the mapping (checked above),
        // which outlives this call, and `dst` is private memory that cannot
        // overlap it. Concurrent writes by other processes can make the
        // copied bytes inconsistent but not unsafe to hold as plain bytes:
        // nothing here relies on their value.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base().add(usize_from(off)),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        true
    }
}

impl Region {
    /// Copies `src` into the region at `off` (a host-owned area, e.g. the
    /// text of a control command). Returns false (and writes nothing) on a
    /// read-only region or a range not inside it. Plain stores: the caller
    /// publishes them with a later store-release.
    pub(crate) fn copy_in(&self, off: u64, src: &[u8]) -> bool {
        let end = off.checked_add(src.len() as u64);
        if self.access != Access::ReadWrite || end.is_none_or(|e| e > self.len as u64) {
            return false;
        }
        if let Backing::Mapped(_, _, file) = &self.backing {
            // pwrite(2) into the same pages the guest maps (a shared file).
            return file.write_all_at(src, off).is_ok();
        }
        // SAFETY: in range (checked above), a private copy the caller owns
        // (Backing::Owned), `src` cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.as_ptr(),
                self.base().add(usize_from(off)),
                src.len(),
            );
        }
        true
    }
}

fn open_file(path: &Path, access: Access) -> Result<File, RegionError> {
    let shown = path.display().to_string();
    let res = std::fs::OpenOptions::new()
        .read(true)
        .write(access == Access::ReadWrite)
        .open(path);
    res.map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            RegionError::Missing { path: shown }
        } else {
            RegionError::Open {
                path: shown,
                source,
            }
        }
    })
}

fn check_min_size(size: u64) -> Result<(), RegionError> {
    if size < abi::IVT_REGION_MIN {
        return Err(RegionError::TooSmall {
            size,
            min: abi::IVT_REGION_MIN,
        });
    }
    Ok(())
}

fn check_magic(magic: u64) -> Result<(), RegionError> {
    match magic {
        0 => Err(RegionError::NotFormatted),
        abi::IVT_MAGIC => Ok(()),
        found => Err(RegionError::BadMagic {
            found,
            expected: abi::IVT_MAGIC,
        }),
    }
}

fn placeholder_header() -> Header {
    Header {
        abi_major: 0,
        abi_minor: 0,
        region_size: 0,
        features: 0,
        uuid: [0; 16],
        default_mode: 0,
        owner_pid: 0,
        layout: Layout {
            channels_off: 0,
            meta_off: 0,
            pool_off: 0,
            meta_size: 0,
            nr_channels: 0,
            nr_kernel_channels: 0,
            nr_ftrace_channels: 0,
            nr_subbufs: 0,
            subbuf_size: 0,
        },
        clock: ClockRef::default(),
    }
}

/// Parses and validates the header page copy of a region of `actual` bytes.
pub fn parse_header(page: &[u8], actual: u64) -> Result<Header, RegionError> {
    use abi::hdr;
    check_magic(le_u64(page, hdr::MAGIC))?;
    let abi_major = le_u16(page, hdr::ABI_MAJOR);
    if abi_major != abi::IVT_ABI_MAJOR {
        return Err(RegionError::AbiMajor {
            found: abi_major,
            expected: abi::IVT_ABI_MAJOR,
        });
    }
    let hdr_size = le_u32(page, hdr::HDR_SIZE);
    if hdr_size as usize != abi::HDR_SIZE {
        return Err(RegionError::HeaderSize {
            found: hdr_size,
            expected: abi::HDR_SIZE,
        });
    }
    let region_size = le_u64(page, hdr::REGION_SIZE);
    if region_size != actual {
        return Err(RegionError::SizeMismatch {
            header: region_size,
            actual,
        });
    }
    if !region_size.is_power_of_two() {
        return Err(RegionError::NotPowerOfTwo(region_size));
    }
    // A region of ABI 1.0 or 1.1 has zeros where 1.2 says how many
    // channels the ftrace relay has.
    let nr_ftrace = le_u32(page, hdr::NR_FTRACE_CHANNELS);
    let layout = parse_layout(&page[hdr::LAYOUT..hdr::LAYOUT + 48], nr_ftrace, region_size)?;
    Ok(Header {
        abi_major,
        abi_minor: le_u16(page, hdr::ABI_MINOR),
        region_size,
        features: le_u64(page, hdr::FEATURES),
        uuid: page[hdr::UUID..hdr::UUID + 16]
            .try_into()
            .expect("16 bytes"),
        default_mode: le_u32(page, hdr::DEFAULT_MODE),
        owner_pid: le_u32(page, hdr::OWNER_PID),
        layout,
        clock: parse_clock(&page[hdr::CLOCK..hdr::CLOCK + 32]),
    })
}

fn parse_clock(b: &[u8]) -> ClockRef {
    use abi::clock;
    ClockRef {
        freq_hz: le_u64(b, clock::FREQ_HZ),
        source: le_u32(b, clock::SOURCE),
        ref_ticks: le_u64(b, clock::REF_TICKS),
        ref_realtime_ns: le_u64(b, clock::REF_REALTIME_NS),
    }
}

fn parse_layout(b: &[u8], nr_ftrace: u32, region: u64) -> Result<Layout, RegionError> {
    use abi::layout as l;
    let channel_size = le_u32(b, l::CHANNEL_SIZE);
    if u64::from(channel_size) != abi::CHANNEL_SIZE {
        return Err(RegionError::ChannelSize {
            found: channel_size,
            expected: abi::CHANNEL_SIZE,
        });
    }
    let layout = Layout {
        channels_off: le_u64(b, l::CHANNELS_OFF),
        meta_off: le_u64(b, l::META_OFF),
        pool_off: le_u64(b, l::POOL_OFF),
        meta_size: le_u32(b, l::META_SIZE),
        nr_channels: le_u32(b, l::NR_CHANNELS),
        nr_kernel_channels: le_u32(b, l::NR_KERNEL_CHANNELS),
        nr_ftrace_channels: nr_ftrace,
        nr_subbufs: le_u32(b, l::NR_SUBBUFS),
        subbuf_size: le_u32(b, l::SUBBUF_SIZE),
    };
    check_counts(&layout)?;
    check_areas(&layout, region)?;
    Ok(layout)
}

fn check_counts(l: &Layout) -> Result<(), RegionError> {
    if l.nr_channels == 0 || l.nr_channels > abi::IVT_CHANNELS_MAX {
        return Err(RegionError::ChannelCount {
            found: l.nr_channels,
            max: abi::IVT_CHANNELS_MAX,
        });
    }
    if l.nr_kernel_channels > l.nr_channels
        || l.nr_ftrace_channels > l.nr_channels.saturating_sub(l.nr_kernel_channels)
    {
        return Err(RegionError::KernelChannels {
            kernel: l.nr_kernel_channels,
            ftrace: l.nr_ftrace_channels,
            total: l.nr_channels,
        });
    }
    check_pow2(
        "subbuf_size",
        l.subbuf_size,
        abi::IVT_SUBBUF_MIN,
        abi::IVT_SUBBUF_MAX,
    )?;
    check_pow2(
        "nr_subbufs",
        l.nr_subbufs,
        abi::IVT_SUBBUFS_MIN,
        abi::IVT_SUBBUFS_MAX,
    )
}

fn check_pow2(what: &'static str, value: u32, min: u32, max: u32) -> Result<(), RegionError> {
    if !value.is_power_of_two() || value < min || value > max {
        return Err(RegionError::Geometry {
            what,
            value,
            min,
            max,
        });
    }
    Ok(())
}

/// The three areas must be page aligned, inside the region, after the
/// header page and pairwise disjoint. Offsets, sizes and ends are u128:
/// three u32 factors and a u64 offset cannot overflow them (the products
/// saturate anyway, for the lint's sake).
fn check_areas(l: &Layout, region: u64) -> Result<(), RegionError> {
    let product = |factors: &[u32]| {
        factors
            .iter()
            .fold(1u128, |p, &f| p.saturating_mul(u128::from(f)))
    };
    let areas = [
        ("header", 0u64, abi::HDR_SIZE as u128),
        (
            "channel table",
            l.channels_off,
            product(&[l.nr_channels]).saturating_mul(u128::from(abi::CHANNEL_SIZE)),
        ),
        ("metadata area", l.meta_off, u128::from(l.meta_size)),
        (
            "sub-buffer pool",
            l.pool_off,
            product(&[l.nr_channels, l.nr_subbufs, l.subbuf_size]),
        ),
    ];
    let end = |off: u64, len: u128| u128::from(off).saturating_add(len);
    for &(what, off, len) in &areas[1..] {
        if off % abi::IVT_PAGE_SIZE != 0 {
            return Err(RegionError::Misaligned { what, off });
        }
        if len == 0 || end(off, len) > u128::from(region) {
            return Err(RegionError::OutOfBounds {
                what,
                off,
                len: u64::try_from(len).unwrap_or(u64::MAX),
                region,
            });
        }
    }
    for (i, a) in areas.iter().enumerate() {
        for b in areas.iter().skip(i.saturating_add(1)) {
            let disjoint = end(a.1, a.2) <= u128::from(b.1) || end(b.1, b.2) <= u128::from(a.1);
            if !disjoint {
                return Err(RegionError::Overlap { a: a.0, b: b.0 });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use ivtrace_testutil::RegionBuilder;

    fn open(bytes: &[u8]) -> Result<Region, RegionError> {
        Region::from_bytes(bytes, Access::ReadOnly)
    }

    #[test]
    fn a_well_formed_region_validates() {
        let b = RegionBuilder::new(2, 4, 4096).build();
        let r = open(&b).expect("valid");
        assert_eq!(r.layout().nr_channels, 2);
        assert_eq!(r.header().region_size, b.len() as u64);
    }

    #[test]
    fn each_header_fault_has_its_own_error() {
        let good = RegionBuilder::new(2, 4, 4096).build();
        type Mutation = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|b| b[0..8].fill(0)), "NotFormatted"),
            (Box::new(|b| b[0] ^= 1), "BadMagic"),
            (Box::new(|b| b[8] = 2), "AbiMajor"),
            (Box::new(|b| b[13] = 0), "HeaderSize"),
            (Box::new(|b| b[16] ^= 0x40), "SizeMismatch"),
            (Box::new(|b| b[64 + 37] = 0), "ChannelSize"),
            (Box::new(|b| b[64 + 28..64 + 32].fill(0)), "ChannelCount"),
            (Box::new(|b| b[64 + 32] = 9), "KernelChannels"),
            (Box::new(|b| b[64 + 44] = 1), "Geometry"),
            (Box::new(|b| b[64 + 40] = 3), "Geometry"),
            (Box::new(|b| b[64] = 8), "Misaligned"),
            (
                Box::new(|b| b[64 + 16..64 + 24].copy_from_slice(&(1u64 << 40).to_le_bytes())),
                "OutOfBounds",
            ),
            (
                Box::new(|b| {
                    let m = b[64 + 8..64 + 16].to_vec();
                    b[64..64 + 8].copy_from_slice(&m);
                }),
                "Overlap",
            ),
        ];
        for (mutate, want) in cases {
            let mut b = good.clone();
            mutate(&mut b);
            let err = open(&b).err().unwrap_or_else(|| panic!("{want}: accepted"));
            assert!(format!("{err:?}").starts_with(want), "{want}: got {err:?}");
        }
    }

    #[test]
    fn tiny_and_non_power_of_two_regions_are_refused() {
        assert!(matches!(
            open(&[0u8; 100]),
            Err(RegionError::TooSmall { .. })
        ));
        let mut b = RegionBuilder::new(1, 2, 4096).build();
        b.extend_from_slice(&[0u8; 4096]);
        let size = b.len() as u64;
        b[16..24].copy_from_slice(&size.to_le_bytes());
        assert!(matches!(open(&b), Err(RegionError::NotPowerOfTwo(_))));
    }

    #[test]
    fn read_only_regions_are_never_written() {
        let b = RegionBuilder::new(1, 2, 4096).build();
        let r = open(&b).unwrap();
        let off = r.layout().channel_offset(0) + abi::chan::CONSUMED;
        r.store_release_u64(off, 7);
        assert_eq!(r.load_relaxed_u64(off), 0);
    }

    #[test]
    fn copy_out_refuses_ranges_past_the_end() {
        let b = RegionBuilder::new(1, 2, 4096).build();
        let r = open(&b).unwrap();
        let mut buf = [0u8; 16];
        assert!(!r.copy_out(r.len() as u64 - 8, &mut buf));
        assert!(!r.copy_out(u64::MAX - 4, &mut buf));
        assert!(r.copy_out(0, &mut buf));
    }

    #[test]
    fn uuid_formats_canonically() {
        let u = [
            0x2a, 0x64, 0x22, 0xd0, 0x6c, 0xee, 0x11, 0xe0, 0x8c, 0x08, 0xcb, 0x07, 0xd7, 0xb3,
            0xa5, 0x64,
        ];
        assert_eq!(format_uuid(&u), "2a6422d0-6cee-11e0-8c08-cb07d7b3a564");
    }
}
