//! Reading the staged wire packets back: one packet at a time from a
//! stream file, then its events (header, timestamp, field offsets).
//!
//! The packets were validated by ivtrace-region when they were drained; this
//! walk still bounds every offset (a bug or a damaged file must not panic),
//! and reports a malformed packet as `None` for the caller to skip.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use ivtrace_region::abi;
use ivtrace_region::bytes::{le_u32, le_u64, u16_at, u32_at, u64_at, usize_from};
use ivtrace_region::classes::FieldType;
use ivtrace_region::packet::PacketHeader;

/// Field start offsets of one payload (relative to the payload), plus its
/// end: at most `IVT_FIELDS_MAX + 1` values.
pub type Offsets = [u32; abi::IVT_FIELDS_MAX as usize + 1];

/// Reads the packets of one stream file in order.
pub struct PacketFile {
    r: BufReader<File>,
    /// The current packet (header, content, padding).
    pub buf: Vec<u8>,
}

impl PacketFile {
    /// Reads `file` with a `buffer`-byte buffer (small: pass 1 has one
    /// open per kernel channel; packets larger than the buffer are read
    /// straight into `buf`).
    pub fn new(file: File, buffer: usize) -> PacketFile {
        PacketFile {
            r: BufReader::with_capacity(buffer, file),
            buf: Vec::new(),
        }
    }

    pub fn open(path: &Path) -> io::Result<PacketFile> {
        Ok(PacketFile::new(
            crate::outdir::open_regular(path)?,
            64 << 10,
        ))
    }

    /// Reads the next packet into `buf`; false at the end of the file.
    pub fn next_packet(&mut self) -> io::Result<bool> {
        let hdr = abi::PACKET_HDR_SIZE;
        self.buf.resize(hdr, 0);
        match self.r.read_exact(&mut self.buf) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
            r => r?,
        }
        let h = PacketHeader::parse(&self.buf);
        let size = h.packet_size / 8;
        if !h.packet_size.is_multiple_of(8)
            || size < hdr as u64
            || size > abi::IVT_SUBBUF_MAX as u64
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("staged packet_size {} bits is not valid", h.packet_size),
            ));
        }
        self.buf.resize(size as usize, 0);
        self.r.read_exact(&mut self.buf[hdr..])?;
        Ok(true)
    }
}

/// The header of `packet` and its content length in bytes, if sane.
pub fn packet_content(packet: &[u8]) -> Option<(PacketHeader, usize)> {
    if packet.len() < abi::PACKET_HDR_SIZE {
        return None;
    }
    let h = PacketHeader::parse(packet);
    let content = h.content_size / 8;
    let ok = h.content_size.is_multiple_of(8)
        && content >= abi::PACKET_HDR_SIZE as u64
        && content <= packet.len() as u64;
    ok.then_some((h, content as usize))
}

/// One event header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventHeader {
    pub id: u32,
    /// Full timestamp (compact ones unwrapped against the previous event).
    pub ts: u64,
    /// 4 (compact) or 16 (extended).
    pub len: usize,
}

/// Decodes the event header at `off` of `content` (the previous event's
/// timestamp is `prev`). None if it runs past the content or the clock
/// would overflow.
#[inline]
pub fn event_header(content: &[u8], off: usize, prev: u64) -> Option<EventHeader> {
    if off + abi::IVT_EV_COMPACT_SIZE > content.len() {
        return None;
    }
    let word = le_u32(content, off);
    let id = word & ((1 << abi::IVT_EV_ID_BITS) - 1);
    if id == abi::IVT_EV_ID_EXTENDED {
        if off + abi::IVT_EV_EXT_SIZE > content.len() {
            return None;
        }
        return Some(EventHeader {
            id: le_u32(content, off + 4),
            ts: le_u64(content, off + 8),
            len: abi::IVT_EV_EXT_SIZE,
        });
    }
    let low = (word >> abi::IVT_EV_ID_BITS) as u64;
    let ts = (prev & !abi::IVT_EV_TS_MASK) | low;
    let ts = if ts >= prev {
        ts
    } else {
        ts.checked_add(abi::IVT_EV_TS_MASK + 1)?
    };
    Some(EventHeader {
        id,
        ts,
        len: abi::IVT_EV_COMPACT_SIZE,
    })
}

/// Rounds an offset up to the 4-byte event alignment.
#[inline]
pub fn align_event(off: usize) -> usize {
    (off + abi::IVT_EV_ALIGN - 1) & !(abi::IVT_EV_ALIGN - 1)
}

/// How to find each field of an event class's payload.
#[derive(Debug, Clone)]
pub struct Layout {
    types: Box<[FieldType]>,
    /// Offsets when every field has a fixed size.
    fixed: Option<Box<Offsets>>,
}

fn fixed_size(ty: FieldType) -> Option<u32> {
    match ty {
        FieldType::Chars(n) => Some(n as u32),
        FieldType::U32Array(n) => Some(4 * n as u32),
        FieldType::String | FieldType::Bytes | FieldType::S32SeqU8 | FieldType::TextSeqU64 => None,
        int => int.integer().map(|(bytes, _)| bytes),
    }
}

impl Layout {
    pub fn new(types: impl IntoIterator<Item = FieldType>) -> Layout {
        let types: Box<[FieldType]> = types.into_iter().collect();
        assert!(
            types.len() <= abi::IVT_FIELDS_MAX as usize,
            "too many fields"
        );
        let mut offs = [0u32; abi::IVT_FIELDS_MAX as usize + 1];
        let mut at = 0u32;
        let mut fixed = true;
        for (i, &t) in types.iter().enumerate() {
            offs[i] = at;
            match fixed_size(t) {
                Some(n) => at += n,
                None => fixed = false,
            }
        }
        offs[types.len()] = at;
        Layout {
            fixed: fixed.then(|| Box::new(offs)),
            types,
        }
    }

    pub fn types(&self) -> &[FieldType] {
        &self.types
    }

    /// The offsets of every field of the payload starting at `payload`
    /// (which runs to the end of the content), the last one its end. None
    /// if a field runs past the content or a string is not terminated.
    #[inline]
    pub fn offsets<'a>(&'a self, payload: &[u8], scratch: &'a mut Offsets) -> Option<&'a [u32]> {
        let n = self.types.len();
        if let Some(fixed) = &self.fixed {
            return (fixed[n] as usize <= payload.len()).then(|| &fixed[..=n]);
        }
        let mut at = 0usize;
        for (i, &t) in self.types.iter().enumerate() {
            scratch[i] = at as u32;
            at = match t {
                FieldType::String => {
                    let nul = memchr(&payload[at.min(payload.len())..])?;
                    at + nul + 1
                }
                FieldType::Bytes => {
                    let len = u32_at(payload, at)?;
                    at.checked_add(4)?.checked_add(len as usize)?
                }
                FieldType::S32SeqU8 => {
                    let n = *payload.get(at)? as usize;
                    at + 1 + 4 * n
                }
                FieldType::TextSeqU64 => {
                    let len = u64_at(payload, at)?;
                    at.checked_add(8)?.checked_add(usize_from(len))?
                }
                t => at + fixed_size(t).expect("fixed") as usize,
            };
            if at > payload.len() {
                return None;
            }
        }
        scratch[n] = at as u32;
        Some(&scratch[..=n])
    }
}

#[inline]
fn memchr(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == 0)
}

/// An unsigned integer field's value (u8..u64, little-endian); None for
/// other types or a field shorter than its type.
#[inline]
pub fn read_uint(ty: FieldType, b: &[u8]) -> Option<u64> {
    Some(match ty {
        FieldType::U8 => *b.first()? as u64,
        FieldType::U16 => u16_at(b, 0)? as u64,
        FieldType::U32 => u32_at(b, 0)? as u64,
        FieldType::U64 => u64_at(b, 0)?,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_layouts_are_precomputed() {
        let l = Layout::new([FieldType::U32, FieldType::S8, FieldType::Chars(16)]);
        let mut s = [0; 33];
        assert_eq!(l.offsets(&[0; 21], &mut s), Some(&[0u32, 4, 5, 21][..]));
        assert_eq!(l.offsets(&[0; 20], &mut s), None);
    }

    #[test]
    fn variable_layouts_are_walked() {
        let l = Layout::new([FieldType::String, FieldType::U32, FieldType::Bytes]);
        let mut p = b"ab\0".to_vec();
        p.extend_from_slice(&7u32.to_le_bytes());
        p.extend_from_slice(&2u32.to_le_bytes());
        p.extend_from_slice(&[1, 2, 9, 9]);
        let mut s = [0; 33];
        assert_eq!(l.offsets(&p, &mut s), Some(&[0u32, 3, 7, 13][..]));
        assert_eq!(l.offsets(b"abc", &mut s), None);
        assert_eq!(l.offsets(&p[..12], &mut s), None);
    }

    #[test]
    fn headers_unwrap_like_the_reader() {
        let prev = (5u64 << 27) + (1 << 27) - 10;
        let c = (3u32 << 5) | 2;
        let h = event_header(&c.to_le_bytes(), 0, prev).unwrap();
        assert_eq!((h.id, h.ts, h.len), (2, (6 << 27) + 3, 4));
        let mut e = 31u32.to_le_bytes().to_vec();
        e.extend_from_slice(&40u32.to_le_bytes());
        e.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let h = event_header(&e, 0, 0).unwrap();
        assert_eq!((h.id, h.ts, h.len), (40, 1 << 40, 16));
        assert_eq!(event_header(&e[..8], 0, 0), None);
    }
}
