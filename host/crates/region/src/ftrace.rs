//! The guest's ftrace description files, as the relay published them in
//! the metadata area (`struct ivt_ftrace_rec`, docs/ftrace.md): text the
//! host's tracefs decoder (ivtrace-tracefs) parses like the host's own
//! `events/header_page` and `events/<system>/<event>/format`.
//!
//! Everything here is guest text: each file is bounded by
//! `IVT_FTRACE_TEXT_MAX`, the count of files by [`FORMATS_MAX`], the system
//! name is cut at its NUL and must be a tracefs directory name; the text
//! is kept as bytes for the parser, which bounds everything it reads.

use crate::abi;
use crate::bytes::{le_u16, le_u32};

/// Files kept at most (a guest has ~2000 events; one format each).
pub const FORMATS_MAX: usize = 8192;

/// Which file a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FtraceFile {
    /// `events/header_page`: the layout of a ring-buffer page header.
    HeaderPage,
    /// `events/<system>/<event>/format`.
    Format,
}

/// One published file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FtraceText {
    pub file: FtraceFile,
    /// The event's directory under `events/` (`[A-Za-z0-9_-]`, else empty).
    pub system: String,
    pub text: Vec<u8>,
}

/// Every file published so far, in order.
#[derive(Debug, Clone, Default)]
pub struct FtraceFormats {
    files: Vec<FtraceText>,
    /// Files refused (over the count, a bad record).
    pub refused: u64,
}

impl FtraceFormats {
    pub fn iter(&self) -> impl Iterator<Item = &FtraceText> {
        self.files.iter()
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The latest `events/header_page`, if one was published.
    pub fn header_page(&self) -> Option<&FtraceText> {
        self.files
            .iter()
            .rev()
            .find(|f| f.file == FtraceFile::HeaderPage)
    }

    pub fn push(&mut self, f: FtraceText) -> bool {
        if self.files.len() >= FORMATS_MAX {
            self.refused = self.refused.saturating_add(1);
            return false;
        }
        self.files.push(f);
        true
    }
}

/// A system name as a tracefs directory name, or empty.
fn system_name(raw: &[u8]) -> String {
    let raw = raw.split(|&b| b == 0).next().unwrap_or(&[]);
    let ok = raw
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        String::from_utf8_lossy(raw).into_owned()
    } else {
        String::new()
    }
}

/// Checks one committed `IVT_META_FTRACE` record (a private copy of `len`
/// bytes, `rec` possibly shorter if the copy was capped).
pub fn parse_record(rec: &[u8], len: u32) -> Result<FtraceText, String> {
    if rec.len() < abi::FTRACE_REC_SIZE {
        return Err(format!(
            "ftrace record of {len} bytes is shorter than its header"
        ));
    }
    let file = match le_u16(rec, abi::ftrace_rec::WHAT) {
        abi::IVT_FTRACE_HEADER_PAGE => FtraceFile::HeaderPage,
        abi::IVT_FTRACE_FORMAT => FtraceFile::Format,
        w => return Err(format!("ftrace record of unknown file kind {w}")),
    };
    let text_len = le_u32(rec, abi::ftrace_rec::TEXT_LEN) as usize;
    let end = abi::FTRACE_REC_SIZE.saturating_add(text_len);
    if text_len > abi::IVT_FTRACE_TEXT_MAX || end > len as usize || end > rec.len() {
        return Err(format!(
            "ftrace record of {len} bytes cannot hold {text_len} bytes of text"
        ));
    }
    let sys = &rec[abi::ftrace_rec::SYSTEM..abi::ftrace_rec::SYSTEM + abi::IVT_FTRACE_SYSTEM_MAX];
    Ok(FtraceText {
        file,
        system: system_name(sys),
        text: rec[abi::ftrace_rec::TEXT..end].to_vec(),
    })
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn record(what: u16, system: &str, text: &[u8], claimed: Option<u32>) -> Vec<u8> {
        let mut r = vec![0u8; abi::FTRACE_REC_SIZE + text.len()];
        r[abi::ftrace_rec::WHAT..][..2].copy_from_slice(&what.to_le_bytes());
        let tl = claimed.unwrap_or(text.len() as u32);
        r[abi::ftrace_rec::TEXT_LEN..][..4].copy_from_slice(&tl.to_le_bytes());
        r[abi::ftrace_rec::SYSTEM..][..system.len()].copy_from_slice(system.as_bytes());
        r[abi::ftrace_rec::TEXT..].copy_from_slice(text);
        r
    }

    #[test]
    fn records_parse_and_systems_are_directory_names() {
        let r = record(abi::IVT_FTRACE_FORMAT, "block", b"name: x\nID: 5\n", None);
        let t = parse_record(&r, r.len() as u32).unwrap();
        assert_eq!((t.file, t.system.as_str()), (FtraceFile::Format, "block"));
        assert_eq!(t.text, b"name: x\nID: 5\n");
        let r = record(abi::IVT_FTRACE_FORMAT, "../etc", b"x", None);
        assert_eq!(parse_record(&r, r.len() as u32).unwrap().system, "");
    }

    #[test]
    fn hostile_records_are_refused() {
        let r = record(9, "x", b"x", None);
        assert!(parse_record(&r, r.len() as u32).is_err());
        let r = record(abi::IVT_FTRACE_FORMAT, "x", b"abc", Some(4000));
        assert!(parse_record(&r, r.len() as u32).is_err());
        let r = record(abi::IVT_FTRACE_FORMAT, "x", b"abc", Some(u32::MAX));
        assert!(parse_record(&r, r.len() as u32).is_err());
        assert!(parse_record(&[0u8; 10], 10).is_err());
        let mut f = FtraceFormats::default();
        for _ in 0..FORMATS_MAX + 3 {
            f.push(FtraceText {
                file: FtraceFile::Format,
                system: String::new(),
                text: vec![],
            });
        }
        assert_eq!((f.len(), f.refused), (FORMATS_MAX, 3));
    }
}
