//! Event classes: what each event id of a stream class looks like, and the
//! precomputed payload program the packet walker runs for it.
//!
//! A payload of only fixed-size fields is one length ([`Payload::Fixed`]);
//! anything with strings, byte sequences or text arrays becomes a few
//! [`Op`]s (consecutive fixed fields merged into one skip).

use std::collections::HashSet;
use std::sync::Arc;

use crate::abi;

/// The type of one payload field (`IVT_FT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldType {
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    /// NUL-terminated UTF-8.
    String,
    /// u32 length, then that many bytes.
    Bytes,
    /// `count` bytes of NUL-padded text.
    Chars(u16),
    /// `count` little-endian u32 (CTF `integer[count]`). No `IVT_FT_*`: only
    /// the host's expanded kernel trace writes it (LTTng's `pipe` `fildes[2]`).
    U32Array(u16),
    /// A u8 count, then that many little-endian s32 (CTF: `_<name>_length`
    /// and a sequence). Output only (LTTng's `sched_process_fork` `vtids`).
    S32SeqU8,
    /// A u64 length, then that many bytes of text, no NUL (CTF:
    /// `_<name>_length` and a UTF-8 sequence). Output only (LTTng's
    /// `printk_console` `msg`).
    TextSeqU64,
}

impl FieldType {
    /// Decodes `IVT_FT_*` plus the record's count; None for unknown types
    /// and zero-length text arrays.
    pub fn from_abi(ty: u8, count: u16) -> Option<FieldType> {
        Some(match ty {
            abi::IVT_FT_U8 => FieldType::U8,
            abi::IVT_FT_U16 => FieldType::U16,
            abi::IVT_FT_U32 => FieldType::U32,
            abi::IVT_FT_U64 => FieldType::U64,
            abi::IVT_FT_S8 => FieldType::S8,
            abi::IVT_FT_S16 => FieldType::S16,
            abi::IVT_FT_S32 => FieldType::S32,
            abi::IVT_FT_S64 => FieldType::S64,
            abi::IVT_FT_STRING => FieldType::String,
            abi::IVT_FT_BYTES => FieldType::Bytes,
            abi::IVT_FT_CHARS if count > 0 => FieldType::Chars(count),
            _ => return None,
        })
    }

    /// Integer width in bytes and signedness, for integer types.
    pub fn integer(self) -> Option<(u32, bool)> {
        Some(match self {
            FieldType::U8 => (1, false),
            FieldType::U16 => (2, false),
            FieldType::U32 => (4, false),
            FieldType::U64 => (8, false),
            FieldType::S8 => (1, true),
            FieldType::S16 => (2, true),
            FieldType::S32 => (4, true),
            FieldType::S64 => (8, true),
            _ => return None,
        })
    }

    /// The integer type of `bytes` bytes and that signedness (inverse of
    /// [`FieldType::integer`]).
    pub fn from_integer(bytes: u32, signed: bool) -> Option<FieldType> {
        use FieldType::*;
        [U8, U16, U32, U64, S8, S16, S32, S64]
            .into_iter()
            .find(|t| t.integer() == Some((bytes, signed)))
    }

    /// A short stable name (sidecar, reports).
    pub fn name(self) -> String {
        match self {
            FieldType::U8 => "u8".into(),
            FieldType::U16 => "u16".into(),
            FieldType::U32 => "u32".into(),
            FieldType::U64 => "u64".into(),
            FieldType::S8 => "s8".into(),
            FieldType::S16 => "s16".into(),
            FieldType::S32 => "s32".into(),
            FieldType::S64 => "s64".into(),
            FieldType::String => "string".into(),
            FieldType::Bytes => "bytes".into(),
            FieldType::Chars(n) => format!("chars[{n}]"),
            FieldType::U32Array(n) => format!("u32[{n}]"),
            FieldType::S32SeqU8 => "s32[u8]".into(),
            FieldType::TextSeqU64 => "text[u64]".into(),
        }
    }

    /// Inverse of [`FieldType::name`].
    pub fn parse(name: &str) -> Option<FieldType> {
        let simple = [
            ("u8", FieldType::U8),
            ("u16", FieldType::U16),
            ("u32", FieldType::U32),
            ("u64", FieldType::U64),
            ("s8", FieldType::S8),
            ("s16", FieldType::S16),
            ("s32", FieldType::S32),
            ("s64", FieldType::S64),
            ("string", FieldType::String),
            ("bytes", FieldType::Bytes),
            ("s32[u8]", FieldType::S32SeqU8),
            ("text[u64]", FieldType::TextSeqU64),
        ];
        if let Some((_, t)) = simple.iter().find(|(n, _)| *n == name) {
            return Some(*t);
        }
        if let Some(n) = name.strip_prefix("u32[").and_then(|r| r.strip_suffix(']')) {
            return n.parse().ok().filter(|&n| n > 0).map(FieldType::U32Array);
        }
        let n = name
            .strip_prefix("chars[")?
            .strip_suffix(']')?
            .parse()
            .ok()?;
        (n > 0).then_some(FieldType::Chars(n))
    }
}

/// One payload field, its name already sanitized and unique in its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub ty: FieldType,
    pub hex: bool,
    /// `IVT_FF_TID_COMM`: a thread id whose name the host inserts before
    /// it (kernel stream only; see ivtrace-ctf's `kernel` module).
    pub tid_comm: bool,
}

impl Field {
    /// A field without `IVT_FF_TID_COMM`.
    pub fn new(name: impl Into<String>, ty: FieldType, hex: bool) -> Field {
        Field {
            name: name.into(),
            ty,
            hex,
            tid_comm: false,
        }
    }
}

/// One step of a variable-size payload walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Fixed-size bytes (merged integer fields).
    Skip(u32),
    /// u32 length + bytes.
    Bytes,
    /// NUL-terminated text, UTF-8 checked.
    String,
    /// Fixed-size text, UTF-8 checked.
    Chars(u32),
    /// A little-endian count of `len_bytes` bytes, then count x `elem`
    /// bytes (output-only sequences; their text is not UTF-8 checked).
    Seq { len_bytes: u8, elem: u8 },
}

/// How the walker finds the end of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    Fixed(u32),
    Program(Box<[Op]>),
}

impl Payload {
    /// Compiles fields into the cheapest walk.
    pub fn compile(fields: &[Field]) -> Payload {
        let mut ops: Vec<Op> = Vec::new();
        for f in fields {
            let op = match f.ty {
                FieldType::String => Op::String,
                FieldType::Bytes => Op::Bytes,
                FieldType::Chars(n) => Op::Chars(n as u32),
                // n is a u16 count: 4 * n fits a u32.
                FieldType::U32Array(n) => Op::Skip(4 * u32::from(n)),
                FieldType::S32SeqU8 => Op::Seq {
                    len_bytes: 1,
                    elem: 4,
                },
                FieldType::TextSeqU64 => Op::Seq {
                    len_bytes: 8,
                    elem: 1,
                },
                t => Op::Skip(t.integer().expect("integer").0),
            };
            match (ops.last_mut(), op) {
                // Saturating: a sum past u32 fails the walk's bounds check.
                (Some(Op::Skip(a)), Op::Skip(b)) => *a = a.saturating_add(b),
                _ => ops.push(op),
            }
        }
        match ops.as_slice() {
            [] => Payload::Fixed(0),
            [Op::Skip(n)] => Payload::Fixed(*n),
            _ => Payload::Program(ops.into_boxed_slice()),
        }
    }
}

/// An event class of one stream class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventClass {
    pub id: u32,
    pub stream: u32,
    pub name: String,
    pub fields: Vec<Field>,
    pub payload: Payload,
}

impl EventClass {
    pub fn new(id: u32, stream: u32, name: String, fields: Vec<Field>) -> EventClass {
        let payload = Payload::compile(&fields);
        EventClass {
            id,
            stream,
            name,
            fields,
            payload,
        }
    }
}

/// The event classes of one stream class, indexed by id (< IVT_EVENT_IDS_MAX).
#[derive(Debug, Clone, Default)]
pub struct StreamClasses {
    by_id: Vec<Option<Arc<EventClass>>>,
    names: HashSet<String>,
    count: usize,
}

impl StreamClasses {
    /// The class for `id`, if registered.
    #[inline]
    pub fn get(&self, id: u32) -> Option<&EventClass> {
        self.by_id.get(id as usize).and_then(|c| c.as_deref())
    }

    pub fn contains(&self, id: u32) -> bool {
        self.get(id).is_some()
    }

    /// Adds a class; false if its id is taken (first wins) or out of range.
    pub fn insert(&mut self, class: EventClass) -> bool {
        let id = class.id as usize;
        if id >= abi::IVT_EVENT_IDS_MAX as usize || self.contains(class.id) {
            return false;
        }
        if self.by_id.len() <= id {
            // id < IVT_EVENT_IDS_MAX (checked above): id + 1 fits.
            self.by_id.resize(id.saturating_add(1), None);
        }
        self.by_id[id] = Some(Arc::new(class));
        self.count = self.count.saturating_add(1);
        true
    }

    /// Names already used, for deduplication.
    pub fn names_mut(&mut self) -> &mut HashSet<String> {
        &mut self.names
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Classes in id order.
    pub fn iter(&self) -> impl Iterator<Item = &EventClass> {
        self.by_id.iter().filter_map(|c| c.as_deref())
    }
}

/// Event classes of every stream class, plus a generation number that
/// grows whenever a class is added (the CTF writer rewrites its metadata
/// when it changes), and the guest's ftrace format files (the ftrace
/// stream's pages are decoded with them).
#[derive(Debug, Clone, Default)]
pub struct EventClasses {
    streams: [StreamClasses; abi::IVT_STREAM_CLASSES as usize],
    generation: u64,
    pub ftrace: crate::ftrace::FtraceFormats,
}

/// The slot of a stream class; unknown values share the user stream's.
fn slot(stream: u32) -> usize {
    if stream < abi::IVT_STREAM_CLASSES {
        stream as usize
    } else {
        abi::IVT_STREAM_USER as usize
    }
}

impl EventClasses {
    /// Classes of stream class `stream`; the user stream for unknown values.
    pub fn stream(&self, stream: u32) -> &StreamClasses {
        &self.streams[slot(stream)]
    }

    pub fn stream_mut(&mut self, stream: u32) -> &mut StreamClasses {
        &mut self.streams[slot(stream)]
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn bump_generation(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn field(name: &str, ty: FieldType) -> Field {
        Field::new(name, ty, false)
    }

    #[test]
    fn integer_only_payloads_are_one_fixed_length() {
        let p = Payload::compile(&[field("a", FieldType::U64), field("b", FieldType::S8)]);
        assert_eq!(p, Payload::Fixed(9));
        assert_eq!(Payload::compile(&[]), Payload::Fixed(0));
    }

    #[test]
    fn variable_payloads_merge_fixed_runs() {
        let p = Payload::compile(&[
            field("thread", FieldType::U16),
            field("seq", FieldType::U64),
            field("data", FieldType::Bytes),
            field("s", FieldType::String),
            field("c", FieldType::Chars(16)),
            field("x", FieldType::U32),
        ]);
        let want = [
            Op::Skip(10),
            Op::Bytes,
            Op::String,
            Op::Chars(16),
            Op::Skip(4),
        ];
        assert_eq!(p, Payload::Program(want.into()));
    }

    #[test]
    fn first_registration_of_an_id_wins() {
        let mut s = StreamClasses::default();
        assert!(s.insert(EventClass::new(3, 1, "a".into(), vec![])));
        assert!(!s.insert(EventClass::new(3, 1, "b".into(), vec![])));
        assert!(!s.insert(EventClass::new(4096, 1, "c".into(), vec![])));
        assert_eq!(s.get(3).unwrap().name, "a");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn type_names_round_trip() {
        for t in [
            FieldType::U8,
            FieldType::S64,
            FieldType::Bytes,
            FieldType::Chars(16),
        ] {
            assert_eq!(FieldType::parse(&t.name()), Some(t));
        }
        assert_eq!(FieldType::from_abi(abi::IVT_FT_CHARS, 0), None);
        assert_eq!(FieldType::from_abi(12, 0), None);
    }

    #[test]
    fn integer_types_round_trip() {
        for bytes in [1, 2, 4, 8] {
            for signed in [false, true] {
                let t = FieldType::from_integer(bytes, signed).unwrap();
                assert_eq!(t.integer(), Some((bytes, signed)));
            }
        }
        for bytes in [0, 3, 16] {
            assert_eq!(FieldType::from_integer(bytes, false), None);
        }
    }
}
