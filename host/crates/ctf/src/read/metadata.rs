//! A trace's `metadata` read back: the TSDL ivtrace writes ([`crate::tsdl`],
//! [`crate::vm`]), parsed as a CTF reader parses it: the `env` block, the
//! clock (frequency and offset: every timestamp goes through them), each
//! stream class's packet layout, and the event classes with their payload
//! fields as [`FieldType`]s (the inverse of `tsdl::write_field`).
//!
//! Only the subset ivtrace writes is understood; anything else is an error
//! naming what was not understood, never a panic (a file on disk is not
//! trusted: a damaged disk, another tool's trace).

use std::collections::BTreeMap;

use ivtrace_region::classes::{EventClass, Field, FieldType};

use crate::tsdl::EnvValue;

/// A trace's clock class, as CTF readers apply it:
/// `ns_from_origin = offset_s * 1e9 + (offset + value) * 1e9 / freq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clock {
    pub name: String,
    pub uuid: String,
    pub freq: u64,
    pub offset_s: i64,
    /// Cycles.
    pub offset: u64,
    /// Cycles.
    pub precision: u64,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock {
            name: String::new(),
            uuid: String::new(),
            freq: 1_000_000_000,
            offset_s: 0,
            offset: 0,
            precision: 0,
        }
    }
}

const NS: i128 = 1_000_000_000;

impl Clock {
    /// Nanoseconds from the epoch of clock value `v`, as babeltrace2
    /// computes it (the offset and the value converted separately).
    pub fn ns_from_origin(&self, v: u64) -> i128 {
        self.origin_ns() + self.local_ns(v)
    }

    /// Nanoseconds from the epoch of value 0.
    pub fn origin_ns(&self) -> i128 {
        self.offset_s as i128 * NS + self.offset as i128 * NS / self.freq.max(1) as i128
    }

    /// Value `v` in nanoseconds since value 0 of this clock.
    pub fn local_ns(&self, v: u64) -> i128 {
        v as i128 * NS / self.freq.max(1) as i128
    }

    /// The precision in nanoseconds (CTF: in cycles).
    pub fn precision_ns(&self) -> u64 {
        (self.precision as i128 * NS / self.freq.max(1) as i128).clamp(0, u64::MAX as i128) as u64
    }
}

/// How a stream class's packets and event headers are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packets {
    /// `struct ivt_packet_hdr` (88 bytes) and the compact/extended event
    /// header of abi.h, events aligned on 4 bytes: the guest traces.
    Guest,
    /// [`crate::host_trace`]'s packets (68 bytes), a u32 id and u64 timestamp
    /// per event, byte-packed: the host trace and the VM view.
    Host,
}

/// One stream class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamDecl {
    pub id: u32,
    pub packets: Packets,
    /// Each event has an `_tid` context (s32) after its header.
    pub tid_context: bool,
}

/// Everything a trace's metadata says.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub env: BTreeMap<String, EnvValue>,
    pub clock: Clock,
    pub streams: BTreeMap<u32, StreamDecl>,
    /// Event classes in file order (ids are per stream class).
    pub classes: Vec<EventClass>,
}

impl Metadata {
    /// An env string, if the key is there and a string.
    pub fn env_str(&self, key: &str) -> Option<&str> {
        match self.env.get(key)? {
            EnvValue::Str(s) => Some(s),
            EnvValue::Int(_) => None,
        }
    }

    /// An env integer, if the key is there and an integer.
    pub fn env_int(&self, key: &str) -> Option<i64> {
        match self.env.get(key)? {
            EnvValue::Int(i) => Some(*i),
            EnvValue::Str(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Num(i128),
    Str(String),
    Sym(char),
}

/// Splits TSDL into tokens (comments dropped, string escapes undone).
fn lex(text: &str) -> Result<Vec<Tok>, String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if b[i..].starts_with(b"/*") {
            i = find(b, i + 2, b"*/").ok_or("an unterminated comment")? + 2;
        } else if b[i..].starts_with(b"//") {
            i = find(b, i, b"\n").unwrap_or(b.len());
        } else if c == b'"' {
            let (s, next) = string(b, i + 1)?;
            out.push(Tok::Str(s));
            i = next;
        } else if c.is_ascii_digit() || (c == b'-' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            let end = (i + 1..b.len())
                .find(|&j| !b[j].is_ascii_alphanumeric())
                .unwrap_or(b.len());
            out.push(Tok::Num(number(&text[i..end])?));
            i = end;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let end = (i..b.len())
                .find(|&j| !(b[j].is_ascii_alphanumeric() || b[j] == b'_'))
                .unwrap_or(b.len());
            out.push(Tok::Ident(text[i..end].to_string()));
            i = end;
        } else {
            out.push(Tok::Sym(c as char));
            i += 1;
        }
    }
    Ok(out)
}

fn find(b: &[u8], from: usize, what: &[u8]) -> Option<usize> {
    (from..b.len()).find(|&j| b[j..].starts_with(what))
}

/// A string literal's content from just after its opening quote; the
/// position after the closing quote.
fn string(b: &[u8], mut i: usize) -> Result<(String, usize), String> {
    let mut s = Vec::new();
    while i < b.len() {
        match b[i] {
            b'"' => return Ok((String::from_utf8_lossy(&s).into_owned(), i + 1)),
            b'\\' if i + 1 < b.len() => {
                s.push(b[i + 1]);
                i += 2;
            }
            c => {
                s.push(c);
                i += 1;
            }
        }
    }
    Err("an unterminated string".into())
}

fn number(t: &str) -> Result<i128, String> {
    let (neg, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t),
    };
    let v = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(h) => i128::from_str_radix(h, 16),
        None => digits.parse::<i128>(),
    }
    .map_err(|_| format!("not a number: {t}"))?;
    Ok(if neg { -v } else { v })
}

/// A cursor over the tokens.
struct P {
    toks: Vec<Tok>,
    at: usize,
}

impl P {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn next(&mut self) -> Result<Tok, String> {
        let t = self.toks.get(self.at).cloned().ok_or("unexpected end")?;
        self.at += 1;
        Ok(t)
    }

    fn sym(&mut self, c: char) -> Result<(), String> {
        match self.next()? {
            Tok::Sym(s) if s == c => Ok(()),
            t => Err(format!("expected `{c}`, found {t:?}")),
        }
    }

    fn ident(&mut self) -> Result<String, String> {
        match self.next()? {
            Tok::Ident(s) => Ok(s),
            t => Err(format!("expected a name, found {t:?}")),
        }
    }

    fn is_sym(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Sym(c))
    }

    /// The tokens of a `{ ... }` block (the cursor on `{`), without the braces.
    fn block(&mut self) -> Result<Vec<Tok>, String> {
        self.sym('{')?;
        let start = self.at;
        let mut depth = 1usize;
        while depth > 0 {
            match self.next()? {
                Tok::Sym('{') => depth += 1,
                Tok::Sym('}') => depth -= 1,
                _ => {}
            }
        }
        Ok(self.toks[start..self.at - 1].to_vec())
    }

    /// Skips to just after the next `;` outside braces.
    fn skip_statement(&mut self) -> Result<(), String> {
        let mut depth = 0usize;
        loop {
            match self.next()? {
                Tok::Sym('{') => depth += 1,
                Tok::Sym('}') => depth = depth.saturating_sub(1),
                Tok::Sym(';') if depth == 0 => return Ok(()),
                _ => {}
            }
        }
    }
}

/// Parses a trace's whole `metadata` text.
pub fn parse(text: &str) -> Result<Metadata, String> {
    let mut p = P {
        toks: lex(text)?,
        at: 0,
    };
    let mut m = Metadata::default();
    let mut clock = false;
    while p.peek().is_some() {
        let kw = p.ident()?;
        match kw.as_str() {
            "env" => m.env = env_block(p.block()?)?,
            "clock" => {
                m.clock = clock_block(p.block()?)?;
                clock = true;
            }
            "stream" => {
                let s = stream_block(&p.block()?)?;
                m.streams.insert(s.id, s);
            }
            "event" => m.classes.push(event_block(p.block()?)?),
            "trace" | "typealias" => {
                p.skip_statement()?;
                continue;
            }
            other => return Err(format!("unexpected `{other}` at the top level")),
        }
        p.sym(';')?;
    }
    if !clock {
        return Err("no clock block".into());
    }
    Ok(m)
}

/// A value of a `key = value;` assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Str(String),
    Int(i128),
}

/// `key = value;` pairs (strings and integers; other values are skipped).
fn assignments(toks: Vec<Tok>) -> Result<BTreeMap<String, Value>, String> {
    let mut p = P { toks, at: 0 };
    let mut out = BTreeMap::new();
    while p.peek().is_some() {
        let key = p.ident()?;
        p.sym('=')?;
        match p.next()? {
            Tok::Str(s) => {
                out.insert(key, Value::Str(s));
            }
            Tok::Num(n) => {
                out.insert(key, Value::Int(n));
            }
            _ => {}
        }
        p.sym(';')?;
    }
    Ok(out)
}

/// The `env` block (integers beyond 64 bits are left out).
fn env_block(toks: Vec<Tok>) -> Result<BTreeMap<String, EnvValue>, String> {
    Ok(assignments(toks)?
        .into_iter()
        .filter_map(|(k, v)| match v {
            Value::Str(s) => Some((k, EnvValue::Str(s))),
            Value::Int(n) => Some((k, EnvValue::Int(i64::try_from(n).ok()?))),
        })
        .collect())
}

fn clock_block(toks: Vec<Tok>) -> Result<Clock, String> {
    let a = assignments(toks)?;
    let int = |k: &str| match a.get(k) {
        Some(Value::Int(v)) => Some(*v),
        _ => None,
    };
    let text = |k: &str| match a.get(k) {
        Some(Value::Str(s)) => s.clone(),
        _ => String::new(),
    };
    let in_range = |k: &str, v: i128, lo: i128, hi: i128| {
        (lo..=hi)
            .contains(&v)
            .then_some(v)
            .ok_or(format!("clock {k} {v} is out of range"))
    };
    let freq = in_range(
        "freq",
        int("freq").unwrap_or(1_000_000_000),
        1,
        u64::MAX as i128,
    )?;
    let offset = in_range("offset", int("offset").unwrap_or(0), 0, u64::MAX as i128)?;
    let offset_s = in_range(
        "offset_s",
        int("offset_s").unwrap_or(0),
        i64::MIN as i128,
        i64::MAX as i128,
    )?;
    Ok(Clock {
        name: text("name"),
        uuid: text("uuid"),
        freq: freq as u64,
        offset_s: offset_s as i64,
        offset: offset as u64,
        precision: int("precision").unwrap_or(0).clamp(0, u64::MAX as i128) as u64,
    })
}

/// A stream block: its id, and which of ivtrace's two packet layouts its
/// packet context and event header declare.
fn stream_block(toks: &[Tok]) -> Result<StreamDecl, String> {
    let has = |name: &str| toks.iter().any(|t| *t == Tok::Ident(name.into()));
    let mut id = None;
    for w in toks.windows(3) {
        if let [Tok::Ident(k), Tok::Sym('='), Tok::Num(n)] = w {
            if k == "id" {
                id = u32::try_from(*n).ok();
                break;
            }
        }
    }
    let packets = if has("first_event_seq") && has("variant") {
        Packets::Guest
    } else if !has("variant") && has("timestamp_begin") {
        Packets::Host
    } else {
        return Err("a stream block of no layout ivtrace writes".into());
    };
    Ok(StreamDecl {
        id: id.ok_or("a stream block without an id")?,
        packets,
        tid_context: has("_tid"),
    })
}

fn event_block(toks: Vec<Tok>) -> Result<EventClass, String> {
    let mut p = P { toks, at: 0 };
    let (mut name, mut id, mut stream, mut fields) = (None, None, 0u32, Vec::new());
    while p.peek().is_some() {
        let key = p.ident()?;
        if key == "fields" {
            p.sym(':')?;
            p.sym('=')?;
            if p.ident()? != "struct" {
                return Err("event fields that are not a struct".into());
            }
            fields = fields_of(p.block()?)?;
        } else {
            p.sym('=')?;
            match (key.as_str(), p.next()?) {
                ("name", Tok::Str(s)) => name = Some(s),
                ("id", Tok::Num(n)) => id = u32::try_from(n).ok(),
                ("stream_id", Tok::Num(n)) => {
                    stream = u32::try_from(n).map_err(|e| e.to_string())?
                }
                _ => {}
            }
        }
        p.sym(';')?;
    }
    let name = name.ok_or("an event without a name")?;
    let id = id.ok_or_else(|| format!("event {name} without an id"))?;
    Ok(EventClass::new(id, stream, name, fields))
}

/// One declaration of a struct.
#[derive(Debug, Clone)]
struct Decl {
    name: String,
    /// None for `string`.
    int: Option<IntSpec>,
    /// `[N]` or `[length_field]`.
    len: Option<Tok>,
}

#[derive(Debug, Clone, Copy)]
struct IntSpec {
    bits: u32,
    signed: bool,
    hex: bool,
    text: bool,
}

fn decls(toks: Vec<Tok>) -> Result<Vec<Decl>, String> {
    let mut p = P { toks, at: 0 };
    let mut out = Vec::new();
    while p.peek().is_some() {
        let int = match p.ident()?.as_str() {
            "string" => None,
            "integer" => Some(int_spec(p.block()?)?),
            other => return Err(format!("a field of type {other}")),
        };
        let name = p.ident()?;
        let mut len = None;
        if p.is_sym('[') {
            p.sym('[')?;
            len = Some(p.next()?);
            p.sym(']')?;
        }
        p.sym(';')?;
        out.push(Decl { name, int, len });
    }
    Ok(out)
}

fn int_spec(toks: Vec<Tok>) -> Result<IntSpec, String> {
    let mut p = P { toks, at: 0 };
    let mut s = IntSpec {
        bits: 0,
        signed: false,
        hex: false,
        text: false,
    };
    while p.peek().is_some() {
        let key = p.ident()?;
        p.sym('=')?;
        let v = p.next()?;
        p.sym(';')?;
        match (key.as_str(), v) {
            ("size", Tok::Num(n)) => s.bits = u32::try_from(n).map_err(|e| e.to_string())?,
            ("signed", Tok::Ident(b)) => s.signed = b == "true" || b == "TRUE",
            ("signed", Tok::Num(n)) => s.signed = n != 0,
            ("base", Tok::Num(n)) => s.hex = n == 16,
            ("encoding", Tok::Ident(e)) => s.text = e != "none",
            _ => {}
        }
    }
    Ok(s)
}

/// CTF's leading-underscore escape: `_prev_comm` is `prev_comm`.
fn unescape(name: &str) -> String {
    name.strip_prefix('_').unwrap_or(name).to_string()
}

/// The struct's declarations as ivtrace's field types (a sequence and the
/// length field before it become one field).
fn fields_of(toks: Vec<Tok>) -> Result<Vec<Field>, String> {
    let d = decls(toks)?;
    let mut out = Vec::new();
    let mut i = 0;
    while i < d.len() {
        let next_is_sequence_of = |len_name: &str| {
            d.get(i + 1)
                .is_some_and(|n| n.len == Some(Tok::Ident(len_name.to_string())))
        };
        let x = &d[i];
        if x.len.is_none() && next_is_sequence_of(&x.name) {
            out.push(sequence(x, &d[i + 1])?);
            i += 2;
            continue;
        }
        out.push(single(x)?);
        i += 1;
    }
    Ok(out)
}

fn single(x: &Decl) -> Result<Field, String> {
    let name = unescape(&x.name);
    let Some(s) = x.int else {
        return Ok(Field::new(name, FieldType::String, false));
    };
    let ty = match (&x.len, s.bits, s.text) {
        (None, bits, _) => FieldType::from_integer(bits / 8, s.signed)
            .filter(|_| bits % 8 == 0)
            .ok_or_else(|| format!("{name}: a {bits}-bit integer"))?,
        (Some(Tok::Num(n)), 8, true) => FieldType::Chars(count(*n, &name)?),
        (Some(Tok::Num(n)), 32, false) => FieldType::U32Array(count(*n, &name)?),
        _ => return Err(format!("{name}: an array ivtrace does not write")),
    };
    Ok(Field::new(name, ty, s.hex && ty.integer().is_some()))
}

fn count(n: i128, name: &str) -> Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{name}: an array of {n}"))
}

/// A length field and the sequence after it.
fn sequence(len: &Decl, seq: &Decl) -> Result<Field, String> {
    let name = unescape(&seq.name);
    let (l, e) = match (len.int, seq.int) {
        (Some(l), Some(e)) => (l, e),
        _ => return Err(format!("{name}: a sequence of strings")),
    };
    let ty = match (l.bits, e.bits, e.signed, e.text) {
        (32, 8, false, false) => FieldType::Bytes,
        (8, 32, true, false) => FieldType::S32SeqU8,
        (64, 8, _, true) => FieldType::TextSeqU64,
        _ => return Err(format!("{name}: a sequence ivtrace does not write")),
    };
    let hex = ty == FieldType::S32SeqU8 && e.hex;
    Ok(Field::new(name, ty, hex))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tsdl::{self, write_event, TraceDesc, TraceEnv};
    use ivtrace_region::classes::StreamClasses;
    use ivtrace_time::ClockMapping;

    fn every_type() -> Vec<Field> {
        use FieldType::*;
        let mut f = Vec::new();
        for (i, ty) in [
            U8,
            U16,
            U32,
            U64,
            S8,
            S16,
            S32,
            S64,
            String,
            Bytes,
            Chars(16),
            U32Array(2),
            S32SeqU8,
            TextSeqU64,
        ]
        .into_iter()
        .enumerate()
        {
            f.push(Field::new(format!("f{i}"), ty, false));
            if ty.integer().is_some() {
                f.push(Field::new(format!("h{i}"), ty, true));
            }
        }
        f
    }

    #[test]
    fn every_field_type_reads_back_as_written() {
        let class = EventClass::new(7, 1, "p:every \"type\"".into(), every_type());
        let mut t = String::new();
        write_event(&mut t, &class);
        let m = parse(&format!("clock {{ freq = 1000; }};\n{t}")).unwrap();
        assert_eq!(m.classes.len(), 1);
        let got = &m.classes[0];
        assert_eq!(
            (got.id, got.stream, got.name.as_str()),
            (7, 1, class.name.as_str())
        );
        assert_eq!(got.fields, class.fields);
    }

    #[test]
    fn guest_metadata_reads_back() {
        let clock = ClockMapping {
            freq_hz: 2_400_000_000,
            ref_ticks: 1_000,
            ref_realtime_ns: 1_795_500_000_123_456_789,
            error_ns: 300,
            method: "test".into(),
            ..ClockMapping::default()
        };
        let env = TraceEnv {
            hostname: "web{1}\"".into(),
            trace_name: "t".into(),
            creation_datetime: "x".into(),
            tracer_major: 0,
            tracer_minor: 1,
            extra: vec![("ivtrace_qemu_pid".into(), EnvValue::Int(-4))],
        };
        let desc = TraceDesc {
            uuid: "u",
            clock_uuid: "c",
            clock: &clock,
            timebase: tsdl::Timebase::Ticks,
            env: &env,
        };
        let mut classes = StreamClasses::default();
        classes.insert(EventClass::new(3, 0, "sched_switch".into(), every_type()));
        // The kernel trace's nanosecond clock: 1 GHz, offset 0, and a value
        // converted with the mapping reads back as the mapping's time.
        let ns = tsdl::metadata(
            &tsdl::TraceDesc {
                timebase: tsdl::Timebase::Nanoseconds,
                ..desc
            },
            0,
            &classes,
        );
        let m = parse(&ns).unwrap();
        assert_eq!(
            (m.clock.freq, m.clock.offset_s, m.clock.offset),
            (1_000_000_000, 0, 0)
        );
        assert_eq!(m.clock.precision, clock.error_ns.max(1));
        for t in [clock.ref_ticks, 123_456_789_000u64] {
            let v = clock.ns_value(t).unwrap();
            assert_eq!(m.clock.ns_from_origin(v), clock.realtime_ns(t));
        }
        let mut text = tsdl::metadata(&desc, 0, &classes);
        tsdl::append_stream(&mut text, 2, &StreamClasses::default());
        let m = parse(&text).unwrap();
        assert_eq!(m.env_str("hostname"), Some("web{1}\""));
        assert_eq!(m.env_int("ivtrace_qemu_pid"), Some(-4));
        assert_eq!(m.clock.freq, clock.freq_hz);
        let (s, off) = clock.ctf_offset();
        assert_eq!((m.clock.offset_s, m.clock.offset), (s, off));
        let t = 123_456_789_000u64;
        assert!((m.clock.ns_from_origin(t) - clock.realtime_ns(t)).abs() <= 1);
        assert_eq!(m.streams.len(), 2);
        for s in m.streams.values() {
            assert_eq!((s.packets, s.tid_context), (Packets::Guest, false));
        }
        assert_eq!(m.classes[0].fields, every_type());
    }

    #[test]
    fn host_metadata_reads_back() {
        let desc = crate::host_trace::HostTraceDesc {
            hostname: "h",
            trace_name: "t",
            error_ns: 5,
            env: vec![],
        };
        let classes = vec![EventClass::new(
            100,
            0,
            "sched_switch".into(),
            vec![Field::new("prev_comm", FieldType::Chars(16), false)],
        )];
        let m = parse(&tsdl::host_metadata(&desc, "u", &classes)).unwrap();
        assert_eq!(m.clock.freq, 1_000_000_000);
        assert_eq!(m.env_int("ivtrace_host_trace"), Some(1));
        assert_eq!(
            m.streams[&0],
            StreamDecl {
                id: 0,
                packets: Packets::Host,
                tid_context: true
            }
        );
        assert!(!m.streams[&1].tid_context);
        assert_eq!(m.classes[0].fields, classes[0].fields);
    }

    #[test]
    fn what_is_not_ivtraces_is_an_error() {
        for text in [
            "",
            "clock { freq = 0; };",
            "clock { freq = 10; }; event { name = \"x\"; id = 1; fields := struct { floating_point { } _a; }; };",
            "clock { freq = 10; }; event { name = \"x\"; id = 1; fields := struct { integer { size = 12; } _a; }; };",
            "clock { freq = 10; }; stream { id = 0; };",
            "clock { freq = 10; }; event { name = \"x; id = 1; };",
            "clock { freq = 10; }; /* open",
            "clock { freq = 10; }; event { name = \"x\"; id = 1; fields := struct { integer { size = 8; } _a[0]; }; };",
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
    }
}
