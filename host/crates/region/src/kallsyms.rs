//! The guest kernel's symbols, as the ftrace relay publishes them in its
//! `ftrace_symbols` events (abi/include/ivtrace/ftrace.h): `/proc/kallsyms`
//! lines, `ADDR TYPE NAME[\t[MODULE]]`. The same parser reads a System.map
//! or a kallsyms copy a user gives.
//!
//! Guest text: a line is taken only whole and well formed (an address of
//! at most 16 hex digits, a one-letter type, a name of symbol characters
//! `[A-Za-z0-9_.$@-]` of at most [`NAME_MAX`] bytes, a module of
//! `[A-Za-z0-9_-]`); anything else is counted and left out. At most
//! [`SYMBOLS_MAX`] symbols are kept, the rest counted. Names therefore reach
//! a terminal, a CTF string or an SVG label with nothing to escape but what
//! those formats always need.

use std::collections::HashMap;

/// KSYM_NAME_LEN of Linux 6.1+ (512), minus its NUL.
pub const NAME_MAX: usize = 511;
/// Far more than a kernel and its modules have (~150 k on Debian's 6.1).
pub const SYMBOLS_MAX: usize = 1 << 21;
/// An address further than this past a text symbol's start is not taken as
/// inside it (a gap, another module's memory).
pub const FUNCTION_SPAN_MAX: u64 = 1 << 20;

/// One symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    pub addr: u64,
    /// kallsyms' type letter (`t`/`T` text, `w`/`W` weak, `d`/`D` data...).
    pub kind: u8,
    pub name: String,
    /// The module it belongs to; None for the kernel image.
    pub module: Option<String>,
}

impl Symbol {
    /// Text (code) as kallsyms types it: functions, weak functions.
    pub fn is_text(&self) -> bool {
        matches!(self.kind, b't' | b'T' | b'w' | b'W')
    }
}

/// A symbol table, sorted by address.
#[derive(Debug, Clone, Default)]
pub struct Symbols {
    syms: Vec<Symbol>,
    /// Indexes into `syms` of the text symbols, by address.
    text: Vec<usize>,
    /// Lines that did not parse, and symbols past [`SYMBOLS_MAX`].
    pub refused: u64,
}

fn name_ok(b: &[u8]) -> bool {
    !b.is_empty()
        && b.len() <= NAME_MAX
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'$' | b'@' | b'-'))
}

fn module_ok(b: &[u8]) -> bool {
    !b.is_empty()
        && b.len() <= 64
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// One line, or None if it is not exactly `ADDR TYPE NAME[ [MODULE]]`.
pub fn parse_line(line: &[u8]) -> Option<Symbol> {
    let mut words = line
        .split(|c| *c == b' ' || *c == b'\t')
        .filter(|w| !w.is_empty());
    let (addr, kind, name) = (words.next()?, words.next()?, words.next()?);
    let module = match words.next() {
        None => None,
        Some(m) => {
            let inner = m.strip_prefix(b"[")?.strip_suffix(b"]")?;
            if !module_ok(inner) || words.next().is_some() {
                return None;
            }
            Some(String::from_utf8(inner.to_vec()).ok()?)
        }
    };
    if addr.is_empty() || addr.len() > 16 || kind.len() != 1 || !kind[0].is_ascii_alphabetic() {
        return None;
    }
    let addr = u64::from_str_radix(std::str::from_utf8(addr).ok()?, 16).ok()?;
    if !name_ok(name) {
        return None;
    }
    Some(Symbol {
        addr,
        kind: kind[0],
        name: String::from_utf8(name.to_vec()).ok()?,
        module,
    })
}

impl Symbols {
    /// Every line of `text` (newline-separated; a last line without one
    /// counts).
    pub fn parse(text: &[u8]) -> Symbols {
        let mut syms = Vec::new();
        let mut refused = 0u64;
        for line in text.split(|c| *c == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            match parse_line(line) {
                Some(s) if syms.len() < SYMBOLS_MAX => syms.push(s),
                _ => refused = refused.saturating_add(1),
            }
        }
        Symbols::from_vec(syms, refused)
    }

    fn from_vec(mut syms: Vec<Symbol>, refused: u64) -> Symbols {
        syms.sort_by(|a, b| a.addr.cmp(&b.addr).then_with(|| a.name.cmp(&b.name)));
        let text = (0..syms.len()).filter(|&i| syms[i].is_text()).collect();
        Symbols {
            syms,
            text,
            refused,
        }
    }

    pub fn len(&self) -> usize {
        self.syms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }

    /// Every symbol, by address.
    pub fn iter(&self) -> impl Iterator<Item = &Symbol> {
        self.syms.iter()
    }

    /// The text symbol `addr` is in, and how far into it; None outside
    /// every function (or past [`FUNCTION_SPAN_MAX`] from the last start).
    pub fn function(&self, addr: u64) -> Option<(&Symbol, u64)> {
        let i = self
            .text
            .partition_point(|&i| self.syms[i].addr <= addr)
            .checked_sub(1)?;
        let s = &self.syms[self.text[i]];
        // partition_point found s.addr <= addr.
        let off = addr.checked_sub(s.addr)?;
        (off <= FUNCTION_SPAN_MAX).then_some((s, off))
    }

    /// The text symbol that starts exactly at `addr`.
    pub fn function_at(&self, addr: u64) -> Option<&Symbol> {
        self.function(addr)
            .filter(|(_, off)| *off == 0)
            .map(|(s, _)| s)
    }

    /// Symbols by name (of several with one name, the lowest address).
    pub fn by_name(&self) -> HashMap<&str, &Symbol> {
        let mut m = HashMap::with_capacity(self.syms.len());
        for s in &self.syms {
            m.entry(s.name.as_str()).or_insert(s);
        }
        m
    }

    /// Every address moved by `delta` (KASLR: a System.map's addresses are
    /// the link-time ones), wrapping as kernel addresses do.
    pub fn shifted(&self, delta: u64) -> Symbols {
        let syms = self
            .syms
            .iter()
            .map(|s| Symbol {
                addr: s.addr.wrapping_add(delta),
                ..s.clone()
            })
            .collect();
        Symbols::from_vec(syms, self.refused)
    }

    /// The table as kallsyms text (one line per symbol), what parses back
    /// to the same table.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut t = String::with_capacity(self.syms.len().saturating_mul(48));
        for s in &self.syms {
            let _ = write!(t, "{:016x} {} {}", s.addr, s.kind as char, s.name);
            if let Some(m) = &s.module {
                let _ = write!(t, "\t[{m}]");
            }
            t.push('\n');
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &[u8] = b"ffffffff8aa00000 T _text\n\
ffffffff8aa02460 T do_one_initcall\n\
ffffffff8aa02700 t helper.cold\n\
ffffffff8cca93f0 d __initcall__kmod_core__391_2229_init_hw_perf_eventsearly\n\
ffffffffc0a01000 t virtblk_probe\t[virtio_blk]\n";

    #[test]
    fn parses_kallsyms_lines() {
        let s = Symbols::parse(TEXT);
        assert_eq!(s.len(), 5);
        assert_eq!(s.refused, 0);
        let (f, off) = s.function(0xffffffff8aa02470).unwrap();
        assert_eq!((f.name.as_str(), off), ("do_one_initcall", 0x10));
        assert_eq!(
            s.function_at(0xffffffffc0a01000).unwrap().module.as_deref(),
            Some("virtio_blk")
        );
        // Data symbols name no code (and the data lies far past the text).
        assert!(s.function(0xffffffff8cca93f0).is_none());
        assert_eq!(
            s.function(0xffffffff8aa02710).unwrap().0.name,
            "helper.cold"
        );
        assert!(
            s.function(0xffffffff8a000000).is_none(),
            "before every symbol"
        );
    }

    #[test]
    fn text_round_trips() {
        let s = Symbols::parse(TEXT);
        let again = Symbols::parse(s.to_text().as_bytes());
        assert_eq!(
            again.iter().collect::<Vec<_>>(),
            s.iter().collect::<Vec<_>>()
        );
    }

    #[test]
    fn hostile_lines_are_counted_not_kept() {
        let long = format!("ffffffff81000000 T {}\n", "a".repeat(NAME_MAX + 1));
        for bad in [
            &b"ffffffff81000000 T na\x1b[31mme\n"[..],
            b"ffffffff81000000 TT name\n",
            b"1ffffffff81000000 T name\n",
            b"ffffffff81000000 T name [mod\n",
            b"ffffffff81000000 T name [mo d]\n",
            b"ffffffff81000000 T name [mod] extra\n",
            b"zz T name\n",
            b"ffffffff81000000 T\n",
            long.as_bytes(),
        ] {
            let s = Symbols::parse(bad);
            assert_eq!(
                (s.len(), s.refused),
                (0, 1),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn far_addresses_are_in_no_function() {
        let s = Symbols::parse(b"ffffffff81000000 T only\n");
        assert!(s.function(0xffffffff81000000 + FUNCTION_SPAN_MAX).is_some());
        assert!(s
            .function(0xffffffff81000000 + FUNCTION_SPAN_MAX + 1)
            .is_none());
    }

    #[test]
    fn shifting_moves_every_address() {
        let s = Symbols::parse(TEXT).shifted(0x200000);
        assert_eq!(
            s.function_at(0xffffffff8ac02460).unwrap().name,
            "do_one_initcall"
        );
    }
}
