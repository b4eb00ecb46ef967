//! JSON on stdout that a terminal can show: what `--json` prints.
//!
//! JSON escapes the C0 controls (below U+0020) itself; the text it leaves
//! as it is may still hold DEL, C1 controls (U+0080..U+009F: U+009B is a
//! CSI to many terminals) and bidirectional formatting characters. Those
//! are written as `\uXXXX` too: a JSON reader gets the exact text back, a
//! terminal never sees them raw (docs/hardening.md, "Text on a terminal").

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

/// Whether a JSON string may not carry `c` as it is.
fn escaped_in_json(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// JSON (pretty or compact, as `F` writes it) whose strings escape every
/// control character.
struct TerminalSafe<F>(F);

impl<F: Formatter> Formatter for TerminalSafe<F> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| escaped_in_json(c)) {
            w.write_all(&rest.as_bytes()[..at])?;
            // Outside the BMP there is no control character: one \u each.
            write!(w, "\\u{:04x}", u32::from(c))?;
            rest = &rest[at.saturating_add(c.len_utf8())..];
        }
        w.write_all(rest.as_bytes())
    }

    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

/// Writes `value` as pretty JSON, every control character escaped, then
/// a newline.
pub fn write_pretty<T: Serialize + ?Sized>(out: &mut impl Write, value: &T) -> io::Result<()> {
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut *out, TerminalSafe(PrettyFormatter::new()));
    value.serialize(&mut serializer).map_err(io::Error::other)?;
    writeln!(out)
}

/// Writes `value` as JSON on one line, every control character escaped,
/// then a newline (what scripts read line by line).
pub fn write_line<T: Serialize + ?Sized>(out: &mut impl Write, value: &T) -> io::Result<()> {
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut *out, TerminalSafe(CompactFormatter));
    value.serialize(&mut serializer).map_err(io::Error::other)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_character_is_escaped_and_the_text_comes_back() {
        let text = "a\u{1b}[2J\u{7f}\u{9b}1m\u{202e}b é \"q\" \\ \n";
        let mut out = Vec::new();
        write_pretty(&mut out, &serde_json::json!({ "method": text })).unwrap();
        let shown = String::from_utf8(out).unwrap();
        assert!(
            !shown.chars().any(|c| c != '\n' && escaped_in_json(c)),
            "{shown}"
        );
        assert!(
            shown.contains("\\u001b[2J\\u007f\\u009b1m\\u202eb é"),
            "{shown}"
        );
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["method"], text);
        let mut line = Vec::new();
        write_line(&mut line, &serde_json::json!({ "method": text })).unwrap();
        let line = String::from_utf8(line).unwrap();
        assert_eq!(line.lines().count(), 1);
        assert!(line.contains("\\u009b"), "{line}");
    }
}
