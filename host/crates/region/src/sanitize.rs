//! Guest strings made safe for TSDL, file systems and terminals.
//!
//! Names come from the metadata area, which the guest writes. Before a name
//! reaches CTF metadata it is restricted to a small alphabet, bounded in
//! length and made unique; nothing the guest writes ever names a file.
//! Any other text from a guest, a region or a trace file is printed
//! through [`Shown`] (one line) or [`ShownText`] (lines kept): control
//! characters reach a terminal escaped, never as the guest wrote them.

use std::collections::HashSet;

/// Characters kept in event names: TSDL string-safe and readable.
fn event_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b':' | b'.' | b'-')
}

/// Characters kept in field names: TSDL identifier characters.
fn field_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The bytes up to the first NUL of a fixed-size name slot.
fn until_nul(raw: &[u8]) -> &[u8] {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    &raw[..end]
}

/// The name slot `raw` with every byte `keep` refuses replaced by `_`, or
/// `empty()` if nothing is left; and whether it had to change.
fn restrict(raw: &[u8], keep: fn(u8) -> bool, empty: impl FnOnce() -> String) -> (String, bool) {
    let raw = until_nul(raw);
    let clean: String = raw
        .iter()
        .map(|&c| if keep(c) { c as char } else { '_' })
        .collect();
    if clean.is_empty() {
        return (empty(), true);
    }
    let changed = clean.as_bytes() != raw;
    (clean, changed)
}

/// An event name: `[A-Za-z0-9_:.-]`, others replaced by `_`; empty names
/// become `event_<id>`. Returns the name and whether it had to change.
pub fn event_name(raw: &[u8], id: u32) -> (String, bool) {
    restrict(raw, event_name_char, || format!("event_{id}"))
}

/// A field name: `[A-Za-z0-9_]`, others replaced by `_`; empty names
/// become `f<index>`. TSDL gets it with a leading underscore, so keywords
/// and leading digits cannot clash.
pub fn field_name(raw: &[u8], index: usize) -> (String, bool) {
    restrict(raw, field_name_char, || format!("f{index}"))
}

/// The longest host name kept, in characters.
pub const HOST_NAME_MAX: usize = 64;

/// A host or guest name that may name a directory, a relay session or a
/// trace's `hostname`: at most [`HOST_NAME_MAX`] characters of
/// `[A-Za-z0-9._-]`, every other character replaced by `_`. May be empty
/// (the caller picks its fallback); a leading `.` or `-` is kept, so a
/// caller that builds a path from it refuses or trims those itself.
pub fn host_name(name: &str) -> String {
    name.chars()
        .take(HOST_NAME_MAX)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// [`host_name`], or `fallback` when nothing of `name` is left.
pub fn host_name_or(name: &str, fallback: &str) -> String {
    match host_name(name) {
        n if n.is_empty() => fallback.to_string(),
        n => n,
    }
}

/// Makes `name` unique in `taken` by appending `_2`, `_3`, ... and
/// records it. Returns the unique name and whether it changed.
pub fn dedupe(name: String, taken: &mut HashSet<String>) -> (String, bool) {
    if taken.insert(name.clone()) {
        return (name, false);
    }
    let unique = (2u32..)
        .map(|n| format!("{name}_{n}"))
        .find(|candidate| !taken.contains(candidate))
        .expect("a free suffix exists");
    taken.insert(unique.clone());
    (unique, true)
}

/// Text shown on one line: every control character (C0 but the tab, DEL,
/// C1) and every bidirectional formatting character (which reorders what
/// a terminal shows around it) is written escaped, `\n`, `\x1b`,
/// `\u{202e}`, as Rust's `escape_debug` writes them; everything else as
/// it is.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a>(pub &'a str);

/// [`Shown`] for text of several lines: newlines are kept.
#[derive(Debug, Clone, Copy)]
pub struct ShownText<'a>(pub &'a str);

/// Whether `c` must not reach a terminal as it is.
fn unsafe_on_terminal(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn write_shown(
    f: &mut std::fmt::Formatter<'_>,
    text: &str,
    keep_newlines: bool,
) -> std::fmt::Result {
    use std::fmt::Write;
    for c in text.chars() {
        match c {
            c if !unsafe_on_terminal(c) || (keep_newlines && c == '\n') => f.write_char(c)?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            c if c.is_ascii() => write!(f, "\\x{:02x}", u32::from(c))?,
            c => write!(f, "{}", c.escape_unicode())?,
        }
    }
    Ok(())
}

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_shown(f, self.0, false)
    }
}

impl std::fmt::Display for ShownText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_shown(f, self.0, true)
    }
}

/// Replaces every byte of an invalid UTF-8 sequence in `text` with `?`,
/// in place (the length must not change: the payload is binary).
/// Returns how many bytes were replaced.
pub fn fix_utf8_in_place(mut text: &mut [u8]) -> u32 {
    let mut replaced = 0u32;
    loop {
        match std::str::from_utf8(text) {
            Ok(_) => return replaced,
            Err(e) => {
                // valid_up_to() <= len, and the bad sequence ends within
                // the text: std's Utf8Error guarantees both.
                let bad_at = e.valid_up_to();
                let bad_len = e.error_len().unwrap_or(text.len().saturating_sub(bad_at));
                let bad_end = bad_at.saturating_add(bad_len);
                text[bad_at..bad_end].fill(b'?');
                replaced = replaced.saturating_add(u32::try_from(bad_len).unwrap_or(u32::MAX));
                text = &mut text[bad_end..];
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn host_names_keep_a_small_alphabet_and_length() {
        assert_eq!(host_name("vm-1.lab_a"), "vm-1.lab_a");
        assert_eq!(host_name("a/b c\u{1b}[2J"), "a_b_c__2J");
        assert_eq!(host_name("é"), "_");
        assert_eq!(host_name(""), "");
        assert_eq!(host_name_or("", "guest"), "guest");
        assert_eq!(host_name_or("vm0", "guest"), "vm0");
        assert_eq!(host_name(&"x".repeat(100)).len(), HOST_NAME_MAX);
    }

    #[test]
    fn hostile_event_names_are_restricted() {
        assert_eq!(
            event_name(b"sched:switch\0junk", 3),
            ("sched:switch".into(), false)
        );
        assert_eq!(
            event_name(b"a\"; } evil {", 3),
            ("a_____evil__".into(), true)
        );
        assert_eq!(event_name(b"../../etc", 3).0, ".._.._etc");
        assert_eq!(event_name(b"\0", 7), ("event_7".into(), true));
    }

    #[test]
    fn field_names_keep_identifier_characters_only() {
        assert_eq!(field_name(b"prev_comm", 0), ("prev_comm".into(), false));
        assert_eq!(field_name(b"a-b c", 0), ("a_b_c".into(), true));
        assert_eq!(field_name(b"", 4), ("f4".into(), true));
    }

    #[test]
    fn collisions_get_numbered_suffixes() {
        let mut taken = HashSet::new();
        assert_eq!(dedupe("x".into(), &mut taken), ("x".into(), false));
        assert_eq!(dedupe("x".into(), &mut taken), ("x_2".into(), true));
        taken.insert("x_3".into());
        assert_eq!(dedupe("x".into(), &mut taken), ("x_4".into(), true));
    }

    #[test]
    fn text_reaches_a_terminal_with_its_control_characters_escaped() {
        let hostile = "tsc\x1b[2J\x1b]0;owned\x07 ok\tno\r\nfake line\u{9b}31m\u{202e}evil\x7f";
        let one_line = Shown(hostile).to_string();
        assert_eq!(
            one_line,
            "tsc\\x1b[2J\\x1b]0;owned\\x07 ok\tno\\r\\nfake line\\u{9b}31m\\u{202e}evil\\x7f"
        );
        assert!(!one_line.chars().any(unsafe_on_terminal));
        let lines = ShownText(hostile).to_string();
        assert_eq!(lines.lines().count(), 2);
        assert!(!lines.chars().any(|c| c != '\n' && unsafe_on_terminal(c)));
        assert_eq!(Shown("héllo wörld: 42").to_string(), "héllo wörld: 42");
    }

    #[test]
    fn invalid_utf8_is_replaced_without_changing_length() {
        let mut s = *b"ok\xff\xfeok\xe2\x82";
        assert_eq!(fix_utf8_in_place(&mut s), 4);
        assert_eq!(&s, b"ok??ok??");
        let mut fine = "héllo".as_bytes().to_vec();
        assert_eq!(fix_utf8_in_place(&mut fine), 0);
    }
}
