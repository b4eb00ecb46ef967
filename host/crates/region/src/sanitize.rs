//! Guest strings made safe for TSDL and file systems.
//!
//! Names come from the metadata area, which the guest writes. Before a name
//! reaches CTF metadata it is restricted to a small alphabet, bounded in
//! length and made unique; nothing the guest writes ever names a file.

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
    fn invalid_utf8_is_replaced_without_changing_length() {
        let mut s = *b"ok\xff\xfeok\xe2\x82";
        assert_eq!(fix_utf8_in_place(&mut s), 4);
        assert_eq!(&s, b"ok??ok??");
        let mut fine = "héllo".as_bytes().to_vec();
        assert_eq!(fix_utf8_in_place(&mut fine), 0);
    }
}
