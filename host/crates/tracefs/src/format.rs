//! tracefs format files, parsed at run time (as trace-cmd/libtraceevent
//! do): `events/header_page` (the sub-buffer header) and
//! `events/<system>/<event>/format` (id and field offsets). Field layouts
//! differ across kernels (kvm_entry gained `immediate_exit` in 6.1.153,
//! docs/kvm.md "Host tracepoints about a guest"), so nothing here is hard-coded.

// Guest input (a guest's format files and ftrace pages): every arithmetic
// is checked or saturating, every narrowing cast explicit (docs/hardening.md).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use ivtrace_region::bytes::uint_at;
use thiserror::Error;

/// No tracefs record is longer than a ring-buffer sub-buffer: one page by
/// default, a few with `buffer_subbuf_size_kb`, never near this. A field
/// said to end past it (a guest's format text says anything) is refused
/// with its format, so every `offset + size` the decoder computes fits.
pub const RECORD_MAX: usize = 1 << 20;

/// Why a format file (or `header_page`) was refused. Its text comes from
/// the kernel's tracefs, or from a guest's relayed copy: the message names
/// the event and what is missing or out of range, so a reader can find the
/// file; nothing past a refused file is decoded.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("format file without `name:`")]
    NoName,
    #[error("format of {event} without `ID:`")]
    NoId { event: String },
    #[error("format of {event} has no common_type field")]
    NoCommonType { event: String },
    #[error(
        "format of {event}: field {field} (offset {offset}, size {size}{elements}) ends past any \
         record ({RECORD_MAX} bytes)",
        elements = .array.map_or(String::new(), |n| format!(", {n} elements"))
    )]
    PastRecord {
        event: String,
        field: String,
        offset: usize,
        size: usize,
        array: Option<usize>,
    },
    #[error("unexpected header_page layout: {0:?}")]
    HeaderPage(HeaderPage),
}

/// One field of an event record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldFmt {
    /// The declaration as written, e.g. `char prev_comm[16]`.
    pub decl: String,
    pub name: String,
    pub offset: usize,
    pub size: usize,
    pub signed: bool,
    /// `type name[N]`: N (0 for `name[]`).
    pub array: Option<usize>,
    /// `__data_loc` (u32: offset | length << 16 of dynamic data).
    pub data_loc: bool,
}

impl FieldFmt {
    /// Where the field ends, if that is within [`RECORD_MAX`].
    pub fn end(&self) -> Option<usize> {
        self.offset
            .checked_add(self.size)
            .filter(|&e| e <= RECORD_MAX && self.array.is_none_or(|n| n <= RECORD_MAX))
    }

    /// Refuses a field that ends past any record.
    fn check_bounds(&self, event: &str) -> Result<(), FormatError> {
        match self.end() {
            Some(_) => Ok(()),
            None => Err(FormatError::PastRecord {
                event: event.to_string(),
                field: self.name.clone(),
                offset: self.offset,
                size: self.size,
                array: self.array,
            }),
        }
    }

    /// The element type is `char` (text).
    pub fn is_char(&self) -> bool {
        // `__data_loc char[] comm` (sched_migrate_task since 6.x) too.
        let t = self.decl.trim_start_matches("__data_loc ");
        let t = t
            .trim_start_matches("const ")
            .trim_start_matches("unsigned ");
        // `char name[16]`, and a dynamic string's `__data_loc char[] name`.
        t.starts_with("char ") || t.starts_with("char[")
    }

    /// The field's value in record `rec` as an unsigned integer (little
    /// endian, sizes 1 to 8, not an array); None when the record is too
    /// short for it or the field is no plain integer.
    pub fn uint(&self, rec: &[u8]) -> Option<u64> {
        if self.array.is_some() || self.data_loc || !(1..=8).contains(&self.size) {
            return None;
        }
        uint_at(rec, self.offset, self.size)
    }
}

/// One event's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFmt {
    pub system: String,
    pub name: String,
    pub id: u16,
    /// `common_*` fields.
    pub common: Vec<FieldFmt>,
    /// The event's own fields, in order.
    pub fields: Vec<FieldFmt>,
}

impl EventFmt {
    pub fn common(&self, name: &str) -> Option<&FieldFmt> {
        self.common.iter().find(|f| f.name == name)
    }
    pub fn field(&self, name: &str) -> Option<&FieldFmt> {
        self.fields.iter().find(|f| f.name == name)
    }
}

fn parse_field(line: &str) -> Option<FieldFmt> {
    // "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;"
    let mut decl = None;
    let (mut offset, mut size, mut signed) = (None, None, false);
    for part in line.trim().split(';') {
        let part = part.trim();
        if let Some(d) = part.strip_prefix("field:") {
            decl = Some(d.trim().to_string());
        } else if let Some(v) = part.strip_prefix("offset:") {
            offset = v.trim().parse().ok();
        } else if let Some(v) = part.strip_prefix("size:") {
            size = v.trim().parse().ok();
        } else if let Some(v) = part.strip_prefix("signed:") {
            signed = v.trim() == "1";
        }
    }
    let decl = decl?;
    let data_loc = decl.starts_with("__data_loc");
    let last = decl.split_whitespace().last()?;
    let (name, array) = match last.split_once('[') {
        Some((n, rest)) => (n, Some(rest.trim_end_matches(']').parse().unwrap_or(0))),
        None => (last, None),
    };
    let name = name.trim_start_matches('*').to_string();
    if name.is_empty() {
        return None;
    }
    Some(FieldFmt {
        decl: decl.clone(),
        name,
        offset: offset?,
        size: size?,
        signed,
        array,
        data_loc,
    })
}

/// Parses `events/<system>/<name>/format`.
pub fn parse_event(system: &str, text: &str) -> Result<EventFmt, FormatError> {
    let mut name = None;
    let mut id = None;
    let mut common = Vec::new();
    let mut fields = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = t.strip_prefix("ID:") {
            id = v.trim().parse::<u16>().ok();
        } else if t.starts_with("field:") {
            if let Some(f) = parse_field(t) {
                if f.name.starts_with("common_") {
                    common.push(f);
                } else {
                    fields.push(f);
                }
            }
        } else if t.starts_with("print fmt:") {
            break;
        }
    }
    let name = name.ok_or(FormatError::NoName)?;
    let Some(id) = id else {
        return Err(FormatError::NoId { event: name });
    };
    for f in common.iter().chain(&fields) {
        f.check_bounds(&name)?;
    }
    if common.iter().all(|f| f.name != "common_type") {
        return Err(FormatError::NoCommonType { event: name });
    }
    Ok(EventFmt {
        system: system.to_string(),
        name,
        id,
        common,
        fields,
    })
}

/// The sub-buffer header (`events/header_page`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderPage {
    pub ts_offset: usize,
    pub commit_offset: usize,
    pub commit_size: usize,
    pub data_offset: usize,
}

impl Default for HeaderPage {
    /// 64-bit kernels: u64 timestamp, local_t commit, data at 16.
    fn default() -> Self {
        HeaderPage {
            ts_offset: 0,
            commit_offset: 8,
            commit_size: 8,
            data_offset: 16,
        }
    }
}

/// Parses `events/header_page`.
pub fn parse_header_page(text: &str) -> Result<HeaderPage, FormatError> {
    let mut hp = HeaderPage::default();
    let mut seen = (false, false, false);
    for line in text.lines() {
        let Some(f) = parse_field(line) else { continue };
        f.check_bounds("header_page")?;
        match f.name.as_str() {
            "timestamp" => {
                hp.ts_offset = f.offset;
                seen.0 = true;
            }
            "commit" => {
                hp.commit_offset = f.offset;
                hp.commit_size = f.size;
                seen.1 = true;
            }
            "data" => {
                hp.data_offset = f.offset;
                seen.2 = true;
            }
            _ => {}
        }
    }
    if seen != (true, true, true) || !matches!(hp.commit_size, 4 | 8) {
        return Err(FormatError::HeaderPage(hp));
    }
    Ok(hp)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    const SCHED_SWITCH: &str = include_str!("../tests/fixtures/tracefs/sched_switch.format");
    const KVM_ENTRY: &str = include_str!("../tests/fixtures/tracefs/kvm_entry.format");
    const HEADER_PAGE: &str = include_str!("../tests/fixtures/tracefs/header_page");

    #[test]
    fn real_format_files_parse() {
        let e = parse_event("sched", SCHED_SWITCH).unwrap();
        assert_eq!(e.name, "sched_switch");
        let names: Vec<&str> = e.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "prev_comm",
                "prev_pid",
                "prev_prio",
                "prev_state",
                "next_comm",
                "next_pid",
                "next_prio"
            ]
        );
        let comm = e.field("prev_comm").unwrap();
        assert_eq!((comm.offset, comm.size, comm.array), (8, 16, Some(16)));
        assert!(comm.is_char());
        assert!(e.field("prev_pid").unwrap().signed);
        assert_eq!(e.common("common_pid").unwrap().offset, 4);
        let k = parse_event("kvm", KVM_ENTRY).unwrap();
        assert_eq!(k.name, "kvm_entry");
        assert!(k.field("vcpu_id").is_some());
        let hp = parse_header_page(HEADER_PAGE).unwrap();
        assert_eq!(hp, HeaderPage::default());
    }

    #[test]
    fn dynamic_strings_are_text() {
        let e = parse_event(
            "sched",
            "name: sched_process_exec\nID: 7\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:1;\n",
        )
        .unwrap();
        let f = e.field("filename").unwrap();
        assert!(f.data_loc && f.is_char(), "{f:?}");
    }

    /// A format whose field ends past any record (a guest's text says
    /// anything) is refused with the field named, never taken as is: its
    /// `offset + size` overflowed the decoder (issue 23, case 1).
    #[test]
    fn fields_past_any_record_are_refused() {
        let text = |off: &str, size: &str| {
            format!(
                "name: x\nID: 5\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:u64 v;\toffset:{off};\tsize:{size};\tsigned:0;\n"
            )
        };
        for (off, size) in [
            ("18446744073709551615", "8"),
            ("8", "18446744073709551615"),
            ("18446744073709551608", "8"),
            ("4294967296", "8"),
            ("8", "1048577"),
        ] {
            let e = parse_event("x", &text(off, size));
            let why = format!("{:#}", e.expect_err(&format!("offset {off} size {size}")));
            assert!(why.contains("field v"), "{why}");
        }
        assert!(parse_event("x", &text("8", "8")).is_ok());
        let hp = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\tfield: char data;\toffset:18446744073709551615;\tsize:4080;\tsigned:0;\n";
        assert!(parse_header_page(hp).is_err());
    }

    #[test]
    fn broken_formats_are_errors() {
        assert!(parse_event("x", "name: x\n").is_err());
        assert!(parse_event("x", "ID: 3\n").is_err());
        assert!(parse_header_page("nothing").is_err());
    }

    /// The refusals' texts are what the CLI printed before they were typed.
    #[test]
    fn refusals_say_which_event_and_what_is_missing() {
        let why = |text: &str| parse_event("x", text).unwrap_err().to_string();
        assert_eq!(why("ID: 3\n"), "format file without `name:`");
        assert_eq!(why("name: x\n"), "format of x without `ID:`");
        assert_eq!(
            why("name: x\nID: 3\n"),
            "format of x has no common_type field"
        );
        let past = "name: x\nID: 5\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:u8 v[4];\toffset:8;\tsize:1048577;\tsigned:0;\n";
        assert_eq!(
            why(past),
            "format of x: field v (offset 8, size 1048577, 4 elements) ends past any record \
             (1048576 bytes)"
        );
        let hp = parse_header_page("nothing").unwrap_err().to_string();
        assert!(
            hp.starts_with("unexpected header_page layout: HeaderPage {"),
            "{hp}"
        );
    }
}
