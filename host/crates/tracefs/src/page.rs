//! Decoding the kernel ring buffer's sub-buffers as `trace_pipe_raw`
//! hands them out (the layout libtraceevent's kbuffer parses):
//!
//! ```text
//! header (events/header_page): u64 timestamp | local_t commit | data...
//!   commit: bits 0..26 data size; bit 31 events were missed before this
//!   page; bit 30 the missed count is stored after the data (a long)
//! event: u32 { type_len:5, time_delta:27 } then
//!   type_len 1..28: type_len*4 bytes of record
//!   type_len 0:     u32 length (including itself), then the record
//!   29 padding:     u32 length of the padding; time_delta 0: end of data
//!   30 time_extend: u32 high bits: ts += (high << 27) + time_delta
//!   31 time_stamp:  u32 high bits: ts = (high << 27) + time_delta (absolute)
//! ```
//!
//! Everything is bounds-checked: a truncated or corrupt page ends its walk
//! and is counted, never a panic.

use crate::format::{EventFmt, HeaderPage};

pub const TYPE_PADDING: u32 = 29;
pub const TYPE_TIME_EXTEND: u32 = 30;
pub const TYPE_TIME_STAMP: u32 = 31;
const TS_SHIFT: u32 = 27;
const COMMIT_MASK: u64 = (1 << 27) - 1;
const MISSED_EVENTS: u64 = 1 << 31;
const MISSED_STORED: u64 = 1 << 30;

/// What a page said about itself.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PageInfo {
    pub events: u64,
    /// Events lost before this page: Some(n) when the kernel stored the
    /// count, Some(0)... never; None when nothing was missed. A flag
    /// without a count gives `missed_unknown`.
    pub missed: Option<u64>,
    pub missed_unknown: bool,
    /// The walk stopped early on an inconsistent length.
    pub malformed: bool,
}

fn rd32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn rd64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The page header: its timestamp, its commit word and its data (cut to
/// the committed size where the page is long enough).
fn header<'a>(page: &'a [u8], hp: &HeaderPage) -> Option<(u64, u64, &'a [u8])> {
    let ts = rd64(page, hp.ts_offset)?;
    let commit = if hp.commit_size == 8 {
        rd64(page, hp.commit_offset)?
    } else {
        u64::from(rd32(page, hp.commit_offset)?)
    };
    let size = (commit & COMMIT_MASK) as usize;
    let data = page.get(hp.data_offset..)?;
    Some((ts, commit, &data[..size.min(data.len())]))
}

/// Events lost before this page: (the stored count, a flag without one).
fn missed(page: &[u8], hp: &HeaderPage, commit: u64) -> (Option<u64>, bool) {
    if commit & MISSED_EVENTS == 0 {
        return (None, false);
    }
    if commit & MISSED_STORED == 0 {
        return (None, true);
    }
    let after_data = hp.data_offset + (commit & COMMIT_MASK) as usize;
    let count = page.get(after_data..).and_then(|b| rd64(b, 0));
    (count.or(Some(0)), false)
}

/// Events lost before `page` (read from its header alone, so a reader
/// can count them before the page's events): (the stored count, a flag
/// without one). A page too short for its header says nothing.
pub fn missed_before(page: &[u8], hp: &HeaderPage) -> (Option<u64>, bool) {
    match header(page, hp) {
        Some((_, commit, _)) => missed(page, hp, commit),
        None => (None, false),
    }
}

/// What the event word at a position of the data turned out to be.
enum Step<'a> {
    /// Padding or a time word (the timestamp is updated): go on at `next`.
    Skip { next: usize },
    /// A record at the updated timestamp, then `next`.
    Record { rec: &'a [u8], next: usize },
    /// The null event: the rest of the page is unused.
    End,
    /// A length that does not fit: the walk stops.
    Malformed,
}

/// Decodes the event word at `pos` of `data` (and what follows it),
/// advancing `ts` by its delta.
fn step<'a>(data: &'a [u8], pos: usize, ts: &mut u64) -> Step<'a> {
    let Some(word) = rd32(data, pos) else {
        return Step::End;
    };
    let (type_len, delta, pos) = (word & 0x1f, (word >> 5) as u64, pos + 4);
    match type_len {
        TYPE_PADDING => padding(data, pos, delta, ts),
        TYPE_TIME_EXTEND | TYPE_TIME_STAMP => {
            let Some(hi) = rd32(data, pos) else {
                return Step::Malformed;
            };
            let v = ((hi as u64) << TS_SHIFT) + delta;
            if type_len == TYPE_TIME_EXTEND {
                *ts = ts.wrapping_add(v);
            } else {
                // Absolute; newer kernels store only the low 59 bits.
                let mask = (1u64 << 59) - 1;
                *ts = (*ts & !mask) | (v & mask);
            }
            Step::Skip { next: pos + 4 }
        }
        0 => long_record(data, pos, delta, ts),
        n => record(data, pos, n as usize * 4, delta, ts),
    }
}

/// Padding: its length follows (delta 0: the null event, end of data).
fn padding<'a>(data: &'a [u8], pos: usize, delta: u64, ts: &mut u64) -> Step<'a> {
    if delta == 0 {
        return Step::End;
    }
    let Some(len) = rd32(data, pos) else {
        return Step::Malformed;
    };
    match pos.checked_add(len as usize) {
        Some(next) if len >= 4 => {
            *ts = ts.wrapping_add(delta);
            Step::Skip { next }
        }
        _ => Step::Malformed,
    }
}

/// A record whose length (including itself) is in the next word.
fn long_record<'a>(data: &'a [u8], pos: usize, delta: u64, ts: &mut u64) -> Step<'a> {
    let Some(len) = rd32(data, pos) else {
        return Step::Malformed;
    };
    let Some(len) = (len as usize).checked_sub(4) else {
        return Step::Malformed;
    };
    record(data, pos + 4, (len + 3) & !3, delta, ts)
}

/// The `len` bytes of record at `start`.
fn record<'a>(data: &'a [u8], start: usize, len: usize, delta: u64, ts: &mut u64) -> Step<'a> {
    let Some(rec) = data.get(start..start.saturating_add(len)) else {
        return Step::Malformed;
    };
    *ts = ts.wrapping_add(delta);
    Step::Record {
        rec,
        next: start + len,
    }
}

/// Walks one sub-buffer, calling `emit(ts, record)` for every record.
pub fn walk(page: &[u8], hp: &HeaderPage, mut emit: impl FnMut(u64, &[u8])) -> PageInfo {
    let mut info = PageInfo::default();
    let Some((mut ts, commit, data)) = header(page, hp) else {
        info.malformed = true;
        return info;
    };
    info.malformed = (commit & COMMIT_MASK) as usize > data.len();
    (info.missed, info.missed_unknown) = missed(page, hp, commit);
    let mut pos = 0usize;
    while pos + 4 <= data.len() {
        match step(data, pos, &mut ts) {
            Step::Skip { next } => pos = next,
            Step::Record { rec, next } => {
                emit(ts, rec);
                info.events += 1;
                pos = next;
            }
            Step::End => break,
            Step::Malformed => {
                info.malformed = true;
                break;
            }
        }
    }
    info
}

/// A tracefs record of `f` written by `pid`: integers and text by field
/// name, at the format file's offsets (tests, fixtures; panics on a field
/// `f` does not have).
pub fn build_record(
    f: &EventFmt,
    pid: i32,
    ints: &[(&str, u64)],
    texts: &[(&str, &str)],
) -> Vec<u8> {
    let len = f
        .fields
        .iter()
        .map(|x| x.offset + x.size)
        .max()
        .unwrap_or(8);
    let mut r = vec![0u8; len];
    r[0..2].copy_from_slice(&f.id.to_le_bytes());
    r[4..8].copy_from_slice(&pid.to_le_bytes());
    for (name, v) in ints {
        let x = f
            .field(name)
            .unwrap_or_else(|| panic!("{} has no {name}", f.name));
        r[x.offset..x.offset + x.size].copy_from_slice(&v.to_le_bytes()[..x.size]);
    }
    for (name, t) in texts {
        let x = f.field(name).unwrap();
        r[x.offset..x.offset + t.len()].copy_from_slice(t.as_bytes());
    }
    r
}

/// Builds sub-buffers the way the kernel writes them (exports to
/// trace-cmd's files; tests and fixtures).
pub struct PageBuilder {
    hp: HeaderPage,
    size: usize,
    ts0: u64,
    last: u64,
    data: Vec<u8>,
    missed: Option<u64>,
}

/// Bytes a record of `len` bytes takes in a page `delta` after the
/// previous one: a time extend when the delta needs one, the event word
/// (plus a length word past 112 bytes or when asked), the data padded to 4.
pub fn record_space(delta: u64, len: usize, long_form: bool) -> usize {
    let extend = if delta >= 1 << TS_SHIFT { 8 } else { 0 };
    let padded = (len + 3) & !3;
    let head = if long_form || padded > 28 * 4 { 8 } else { 4 };
    extend + head + padded
}

impl PageBuilder {
    pub fn new(hp: HeaderPage, size: usize, ts0: u64) -> PageBuilder {
        PageBuilder {
            hp,
            size,
            ts0,
            last: ts0,
            data: Vec::new(),
            missed: None,
        }
    }

    /// Announces `n` missed events before this page.
    pub fn missed(mut self, n: u64) -> Self {
        self.missed = Some(n);
        self
    }

    /// The page's timestamp and its last record's.
    pub fn times(&self) -> (u64, u64) {
        (self.ts0, self.last)
    }

    /// True if a record of `len` bytes at `ts` fits what is left (the
    /// missed count the page announces included).
    pub fn fits(&self, ts: u64, len: usize) -> bool {
        let reserved = if self.missed.is_some() { 8 } else { 0 };
        let need = record_space(ts.saturating_sub(self.last), len, false);
        self.hp.data_offset + self.data.len() + need + reserved <= self.size
    }

    /// Bytes of records so far.
    pub fn used(&self) -> usize {
        self.data.len()
    }

    fn word(&mut self, type_len: u32, delta: u64) {
        self.data
            .extend_from_slice(&(type_len | ((delta as u32) << 5)).to_le_bytes());
    }

    /// Appends a record at time `ts` (a time earlier than the previous
    /// record's counts as the same time; time_extend when the delta needs
    /// it; the type_len-0 form for records longer than 112 bytes or when
    /// asked). The caller checks [`PageBuilder::fits`] first.
    pub fn record(&mut self, ts: u64, rec: &[u8], long_form: bool) {
        let ts = ts.max(self.last);
        let mut delta = ts - self.last;
        if delta >= 1 << TS_SHIFT {
            self.word(TYPE_TIME_EXTEND, delta & ((1 << TS_SHIFT) - 1));
            self.data
                .extend_from_slice(&((delta >> TS_SHIFT) as u32).to_le_bytes());
            delta = 0;
        }
        self.last = ts;
        let padded = (rec.len() + 3) & !3;
        if long_form || padded > 28 * 4 {
            self.word(0, delta);
            self.data
                .extend_from_slice(&((rec.len() + 4) as u32).to_le_bytes());
        } else {
            self.word((padded / 4) as u32, delta);
        }
        self.data.extend_from_slice(rec);
        self.data.resize(self.data.len() + padded - rec.len(), 0);
    }

    /// A padding event (a discarded record) of `len` bytes after its header.
    /// Its time delta (1) counts, as a discarded event's does.
    pub fn padding(&mut self, len: u32) {
        self.word(TYPE_PADDING, 1);
        self.last += 1;
        self.data.extend_from_slice(&len.to_le_bytes());
        self.data.resize(self.data.len() + len as usize - 4, 0);
    }

    pub fn finish(self) -> Vec<u8> {
        let mut p = vec![0u8; self.size];
        p[self.hp.ts_offset..self.hp.ts_offset + 8].copy_from_slice(&self.ts0.to_le_bytes());
        let mut commit = self.data.len() as u64;
        if self.missed.is_some() {
            commit |= MISSED_EVENTS | MISSED_STORED;
        }
        let c = self.hp.commit_offset;
        let commit = commit.to_le_bytes();
        p[c..c + self.hp.commit_size].copy_from_slice(&commit[..self.hp.commit_size]);
        let d = self.hp.data_offset;
        p[d..d + self.data.len()].copy_from_slice(&self.data);
        if let Some(n) = self.missed {
            let at = d + self.data.len();
            let n = n.to_le_bytes();
            p[at..at + self.hp.commit_size].copy_from_slice(&n[..self.hp.commit_size]);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_pages_walk_back() {
        let hp = HeaderPage::default();
        let mut b = PageBuilder::new(hp, 4096, 1_000).missed(7);
        b.record(1_010, &[1, 2, 3, 4, 5], false);
        b.padding(12);
        b.record(1_010 + (5 << 27) + 3, &[9; 200], false); // time_extend + long form
        b.record(1_010 + (5 << 27) + 4, &[8; 8], true);
        let page = b.finish();
        let mut got = Vec::new();
        let info = walk(&page, &hp, |ts, rec| got.push((ts, rec.to_vec())));
        assert!(!info.malformed, "{info:?}");
        assert_eq!(info.missed, Some(7));
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], (1_010, vec![1, 2, 3, 4, 5, 0, 0, 0]));
        assert_eq!(got[1].0, 1_010 + (5 << 27) + 3);
        assert_eq!(got[1].1.len(), 200);
        assert_eq!(got[2], (1_010 + (5 << 27) + 4, vec![8; 8]));
    }

    #[test]
    fn fits_says_what_a_page_takes() {
        let hp = HeaderPage::default();
        let mut b = PageBuilder::new(hp, 4096, 0).missed(3);
        let mut n = 0;
        while b.fits(n, 20) {
            b.record(n, &[1; 20], false);
            n += 1;
        }
        // 4096 - 16 of data, 8 for the missed count, 24 per record.
        assert_eq!(n, (4096 - 16 - 8) / 24);
        // 16 bytes left: an 8-byte record fits, not with a time extend.
        assert!(b.fits(n, 8) && !b.fits(n << 27, 8));
        let page = b.finish();
        let info = walk(&page, &hp, |_, _| {});
        assert_eq!(
            (info.events, info.missed, info.malformed),
            (n, Some(3), false)
        );
        let mut b = PageBuilder::new(hp, 4096, 100);
        b.record(90, &[2; 4], false); // earlier: the same time
        let mut got = Vec::new();
        walk(&b.finish(), &hp, |ts, _| got.push(ts));
        assert_eq!(got, [100]);
    }

    #[test]
    fn hostile_pages_never_panic() {
        let hp = HeaderPage::default();
        let mut page = vec![0xffu8; 4096];
        let _ = walk(&page, &hp, |_, _| {});
        page[8..16].copy_from_slice(&4000u64.to_le_bytes());
        for seed in 0u32..200 {
            for (i, b) in page[16..].iter_mut().enumerate() {
                *b = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed)
                    .to_le_bytes()[1];
            }
            let _ = walk(&page, &hp, |_, _| {});
        }
        assert!(walk(&page[..10], &hp, |_, _| {}).malformed);
    }
}
