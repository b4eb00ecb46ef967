//! The metadata area: event descriptions appended by writers.
//!
//! Records are parsed in order from where the last scan stopped. A record
//! counts once its `commit` word is seen (acquire); the parser stops at the
//! first uncommitted one, and skips it (with a warning) only when its
//! length is sane and it has stayed uncommitted too long or the recording
//! is ending. Each record is copied out before it is parsed; every count
//! in it is bounded and every name sanitized.

use std::time::{Duration, Instant};

use crate::abi;
use crate::bytes::{le_u16, le_u32, usize_from};
use crate::classes::{EventClass, EventClasses, Field, FieldType};
use crate::region::Region;
use crate::sanitize;

/// Largest event record a valid writer produces (88 + 32 fields * 40 bytes).
pub const META_REC_MAX: usize =
    abi::META_REC_SIZE + abi::IVT_FIELDS_MAX as usize * abi::META_FIELD_SIZE;
/// Largest record copied out: an ftrace format file with its header.
const META_COPY_MAX: usize = abi::FTRACE_REC_SIZE + abi::IVT_FTRACE_TEXT_MAX + 8;
/// How long a reserved record may stay uncommitted before it is skipped.
pub const UNCOMMITTED_GRACE: Duration = Duration::from_secs(2);
/// Warnings kept for the user (the counters keep counting past this).
const WARNINGS_MAX: usize = 64;

/// What the parser has seen so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaStats {
    /// Event classes added.
    pub classes: u64,
    /// Records refused: bad stream, id, field count, type or length.
    pub invalid: u64,
    /// Records whose id was already registered (the first one wins).
    pub duplicates: u64,
    /// Records skipped because their commit never came.
    pub skipped_uncommitted: u64,
    /// Names that had to be sanitized or deduplicated.
    pub renamed: u64,
    /// Records of kinds this reader does not know.
    pub unknown_kind: u64,
    /// ftrace description files kept (docs/ftrace.md).
    pub ftrace_files: u64,
}

/// Whether the recording is still live (wait for slow commits) or ending
/// (skip what will never be committed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    Live,
    Final,
}

/// Incremental parser of the metadata area.
#[derive(Debug, Default)]
pub struct MetaParser {
    next_off: u32,
    pending: Option<(u32, Instant)>,
    broken: bool,
    pub stats: MetaStats,
    pub warnings: Vec<String>,
}

enum RecordOutcome {
    /// Parsed (or refused and counted); continue after `len` bytes.
    Next(u32),
    /// Not committed yet: stop here for now.
    Wait,
    /// The length is unusable: nothing after this record can be found.
    Broken,
}

impl MetaParser {
    pub fn new() -> MetaParser {
        MetaParser::default()
    }

    fn warn(&mut self, msg: String) {
        if self.warnings.len() < WARNINGS_MAX {
            self.warnings.push(msg);
        }
    }

    /// Parses every newly committed record. Returns the classes added.
    pub fn scan(&mut self, region: &Region, classes: &mut EventClasses, mode: ScanMode) -> usize {
        let layout = *region.layout();
        let tail = region.protocol().meta_tail().min(layout.meta_size);
        let before = self.stats.classes;
        // next_off + a record's size: u32 values added in u64, no overflow.
        let room = |off: u32| u64::from(tail).saturating_sub(u64::from(off));
        while !self.broken && room(self.next_off) >= abi::META_REC_SIZE as u64 {
            match self.record_at(region, classes, tail, mode) {
                // len <= tail - next_off (record_at checked): fits a u32.
                RecordOutcome::Next(len) => self.next_off = self.next_off.saturating_add(len),
                RecordOutcome::Wait => break,
                RecordOutcome::Broken => self.broken = true,
            }
        }
        let added = usize_from(self.stats.classes.saturating_sub(before));
        if added > 0 {
            classes.bump_generation();
        }
        added
    }

    fn record_at(
        &mut self,
        region: &Region,
        classes: &mut EventClasses,
        tail: u32,
        mode: ScanMode,
    ) -> RecordOutcome {
        let off = self.next_off;
        let base = region.layout().meta_off.saturating_add(u64::from(off));
        let (commit, len) = region.protocol().meta_record(base);
        let len_ok = len.is_multiple_of(8)
            && len as usize >= abi::META_REC_SIZE
            && u64::from(off).saturating_add(u64::from(len)) <= u64::from(tail);
        if commit != abi::IVT_META_COMMIT {
            return self.uncommitted(off, len, len_ok, mode);
        }
        self.pending = None;
        if !len_ok {
            self.stats.invalid = self.stats.invalid.saturating_add(1);
            self.warn(format!(
                "metadata record at +{off:#x} has unusable length {len}; later records are ignored"
            ));
            return RecordOutcome::Broken;
        }
        let mut rec = vec![0u8; (len as usize).min(META_COPY_MAX)];
        // Plain copy: ordered after the commit load-acquire above; a writer
        // rewriting a committed record only hurts itself (we parse the copy).
        region.copy_out(base, &mut rec);
        self.parse_record(&rec, len, classes);
        RecordOutcome::Next(len)
    }

    fn uncommitted(&mut self, off: u32, len: u32, len_ok: bool, mode: ScanMode) -> RecordOutcome {
        let since = match self.pending {
            Some((at, since)) if at == off => since,
            _ => {
                self.pending = Some((off, Instant::now()));
                Instant::now()
            }
        };
        let give_up = mode == ScanMode::Final || since.elapsed() >= UNCOMMITTED_GRACE;
        if !(len_ok && give_up) {
            return RecordOutcome::Wait;
        }
        self.stats.skipped_uncommitted = self.stats.skipped_uncommitted.saturating_add(1);
        self.pending = None;
        self.warn(format!(
            "metadata record at +{off:#x} ({len} bytes) was never committed; skipped"
        ));
        RecordOutcome::Next(len)
    }

    fn parse_record(&mut self, rec: &[u8], len: u32, classes: &mut EventClasses) {
        let kind = le_u16(rec, abi::meta::KIND);
        if kind == crate::names::IVT_META_NAMES {
            return; // the thread name table: crate::names reads it
        }
        if kind == abi::IVT_META_FTRACE {
            return self.parse_ftrace(rec, len, classes);
        }
        if kind != abi::IVT_META_EVENT {
            self.stats.unknown_kind = self.stats.unknown_kind.saturating_add(1);
            return;
        }
        let parsed = match parse_event(rec, len) {
            Ok(p) => p,
            Err(why) => {
                self.stats.invalid = self.stats.invalid.saturating_add(1);
                self.warn(format!("event description refused: {why}"));
                return;
            }
        };
        if classes.stream(parsed.stream).contains(parsed.id) {
            self.stats.duplicates = self.stats.duplicates.saturating_add(1);
            self.warn(format!(
                "event id {} of stream {} registered twice; the first wins",
                parsed.id, parsed.stream
            ));
            return;
        }
        let class = self.name_event(parsed, classes);
        classes.stream_mut(class.stream).insert(class);
        self.stats.classes = self.stats.classes.saturating_add(1);
    }

    fn parse_ftrace(&mut self, rec: &[u8], len: u32, classes: &mut EventClasses) {
        match crate::ftrace::parse_record(rec, len) {
            Ok(f) => match classes.ftrace.push(f) {
                true => self.stats.ftrace_files = self.stats.ftrace_files.saturating_add(1),
                false => self.stats.invalid = self.stats.invalid.saturating_add(1),
            },
            Err(why) => {
                self.stats.invalid = self.stats.invalid.saturating_add(1);
                self.warn(format!("ftrace format refused: {why}"));
            }
        }
    }

    /// Sanitizes and deduplicates the event's and its fields' names.
    fn name_event(&mut self, p: ParsedEvent, classes: &mut EventClasses) -> EventClass {
        let (name, changed) = sanitize::event_name(&p.raw_name, p.id);
        let (name, deduped) = sanitize::dedupe(name, classes.stream_mut(p.stream).names_mut());
        let mut renamed = changed || deduped;
        let mut taken = std::collections::HashSet::new();
        let mut fields = Vec::with_capacity(p.fields.len());
        for (i, (raw, ty, flags)) in p.fields.into_iter().enumerate() {
            let (fname, changed) = sanitize::field_name(&raw, i);
            let (fname, deduped) = dedupe_field(fname, ty, &mut taken);
            renamed |= changed || deduped;
            fields.push(Field {
                name: fname,
                ty,
                hex: flags & abi::IVT_FF_HEX != 0,
                // Only a u32 or s32 can be a thread id; the flag is ignored elsewhere.
                tid_comm: flags & abi::IVT_FF_TID_COMM != 0
                    && matches!(ty, FieldType::U32 | FieldType::S32),
            });
        }
        if renamed {
            self.stats.renamed = self.stats.renamed.saturating_add(1);
            self.warn(format!(
                "event id {} of stream {}: names sanitized to {name:?}",
                p.id, p.stream
            ));
        }
        EventClass::new(p.id, p.stream, name, fields)
    }
}

/// A byte field also declares `<name>_len`; both names must be unique
/// (also used for event classes forwarded by a nested guest).
pub fn dedupe_field(
    name: String,
    ty: FieldType,
    taken: &mut std::collections::HashSet<String>,
) -> (String, bool) {
    if ty != FieldType::Bytes {
        return sanitize::dedupe(name, taken);
    }
    let mut candidate = name.clone();
    let mut n = 1u32;
    while taken.contains(&candidate) || taken.contains(&format!("{candidate}_len")) {
        n = n.saturating_add(1);
        candidate = format!("{name}_{n}");
    }
    taken.insert(format!("{candidate}_len"));
    taken.insert(candidate.clone());
    (candidate, n > 1)
}

struct ParsedEvent {
    id: u32,
    stream: u32,
    raw_name: Vec<u8>,
    /// Raw name, type, `IVT_FF_*` flags.
    fields: Vec<(Vec<u8>, FieldType, u8)>,
}

/// Checks one committed event record (a private copy, `len` bytes long).
fn parse_event(rec: &[u8], len: u32) -> Result<ParsedEvent, String> {
    let nr_fields = le_u16(rec, abi::meta::NR_FIELDS);
    let id = le_u32(rec, abi::meta::EVENT_ID);
    let stream = le_u32(rec, abi::meta::STREAM);
    if stream >= abi::IVT_STREAM_CLASSES {
        return Err(format!("stream class {stream} does not exist"));
    }
    if id >= abi::IVT_EVENT_IDS_MAX {
        return Err(format!("event id {id} >= {}", abi::IVT_EVENT_IDS_MAX));
    }
    if nr_fields > abi::IVT_FIELDS_MAX {
        return Err(format!("{nr_fields} fields > {}", abi::IVT_FIELDS_MAX));
    }
    // nr_fields <= IVT_FIELDS_MAX (checked above): the product is small.
    let need = (nr_fields as usize)
        .saturating_mul(abi::META_FIELD_SIZE)
        .saturating_add(abi::META_REC_SIZE);
    if (len as usize) < need || rec.len() < need {
        return Err(format!(
            "record of {len} bytes cannot hold {nr_fields} fields"
        ));
    }
    let fields = rec[abi::meta::FIELDS..need]
        .chunks_exact(abi::META_FIELD_SIZE)
        .map(parse_field)
        .collect::<Result<Vec<_>, _>>()?;
    let name_end = abi::meta::NAME + abi::IVT_NAME_MAX;
    Ok(ParsedEvent {
        id,
        stream,
        raw_name: rec[abi::meta::NAME..name_end].to_vec(),
        fields,
    })
}

fn parse_field(f: &[u8]) -> Result<(Vec<u8>, FieldType, u8), String> {
    let ty = f[abi::meta::FIELD_TYPE];
    let count = le_u16(f, abi::meta::FIELD_COUNT);
    let ty = FieldType::from_abi(ty, count)
        .ok_or_else(|| format!("field type {ty} (count {count}) unknown"))?;
    let flags = f[abi::meta::FIELD_FLAGS];
    Ok((f[..abi::IVT_FIELD_NAME_MAX].to_vec(), ty, flags))
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::region::Access;
    use ivtrace_testutil::RegionBuilder;

    fn scan(bytes: &[u8], mode: ScanMode) -> (EventClasses, MetaParser) {
        let region = Region::from_bytes(bytes, Access::ReadOnly).unwrap();
        let mut classes = EventClasses::default();
        let mut parser = MetaParser::new();
        parser.scan(&region, &mut classes, mode);
        (classes, parser)
    }

    #[test]
    fn committed_records_become_classes() {
        let mut r = RegionBuilder::new(1, 2, 4096).build_region();
        r.register_loadgen(0);
        r.register(
            0,
            5,
            "sched_switch",
            &[("prev_comm", abi::IVT_FT_CHARS, 16)],
        );
        let (classes, parser) = scan(&r.bytes, ScanMode::Live);
        let user = classes.stream(1).get(0).unwrap();
        assert_eq!(user.name, "loadgen:payload");
        assert_eq!(user.fields.len(), 3);
        assert_eq!(
            classes.stream(0).get(5).unwrap().fields[0].ty,
            FieldType::Chars(16)
        );
        assert_eq!(parser.stats.classes, 2);
        assert_eq!(classes.generation(), 1);
    }

    #[test]
    fn duplicate_ids_keep_the_first_and_are_counted() {
        let mut r = RegionBuilder::new(1, 2, 4096).build_region();
        r.register(1, 2, "first", &[]);
        r.register(1, 2, "second", &[]);
        let (classes, parser) = scan(&r.bytes, ScanMode::Live);
        assert_eq!(classes.stream(1).get(2).unwrap().name, "first");
        assert_eq!(parser.stats.duplicates, 1);
    }

    #[test]
    fn parsing_stops_at_an_uncommitted_record_until_the_end() {
        let mut r = RegionBuilder::new(1, 2, 4096).build_region();
        r.register(1, 0, "a", &[]);
        r.register(1, 1, "b", &[]);
        r.register(1, 2, "c", &[]);
        let meta_off =
            crate::bytes::le_u64(&r.bytes, abi::hdr::LAYOUT + abi::layout::META_OFF) as usize;
        r.bytes[meta_off + 88 + 4..meta_off + 88 + 8].fill(0); // un-commit "b"
        let (classes, parser) = scan(&r.bytes, ScanMode::Live);
        assert_eq!(classes.stream(1).len(), 1);
        assert_eq!(parser.stats.skipped_uncommitted, 0);
        let (classes, parser) = scan(&r.bytes, ScanMode::Final);
        assert_eq!(classes.stream(1).len(), 2);
        assert!(classes.stream(1).contains(2));
        assert_eq!(parser.stats.skipped_uncommitted, 1);
    }

    #[test]
    fn hostile_records_are_refused_and_names_sanitized() {
        let mut r = RegionBuilder::new(1, 2, 4096).build_region();
        r.register(7, 0, "bad_stream", &[]);
        r.register(1, 5000, "bad_id", &[]);
        r.register(1, 1, "bad_type", &[("x", 42, 0)]);
        r.register(
            1,
            2,
            "ev\"il}",
            &[
                ("a b", abi::IVT_FT_U8, 0),
                ("a_b", abi::IVT_FT_U8, 0),
                ("d", abi::IVT_FT_BYTES, 0),
                ("d_len", abi::IVT_FT_U8, 0),
            ],
        );
        let (classes, parser) = scan(&r.bytes, ScanMode::Live);
        assert_eq!(parser.stats.invalid, 3);
        let ev = classes.stream(1).get(2).unwrap();
        assert_eq!(ev.name, "ev_il_");
        let names: Vec<&str> = ev.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a_b", "a_b_2", "d", "d_len_2"]);
        assert_eq!(parser.stats.renamed, 1);
    }

    #[test]
    fn a_record_with_an_impossible_length_stops_parsing() {
        let mut r = RegionBuilder::new(1, 2, 4096).build_region();
        r.register(1, 0, "a", &[]);
        let meta_off =
            crate::bytes::le_u64(&r.bytes, abi::hdr::LAYOUT + abi::layout::META_OFF) as usize;
        r.bytes[meta_off..meta_off + 4].copy_from_slice(&13u32.to_le_bytes());
        let (classes, parser) = scan(&r.bytes, ScanMode::Final);
        assert!(classes.stream(1).is_empty());
        assert_eq!(parser.stats.invalid, 1);
    }
}
