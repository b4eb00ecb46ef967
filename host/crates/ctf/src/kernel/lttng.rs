//! What lttng-modules writes where the module's wire is narrower, and the
//! system call events in LTTng's layout.
//!
//! Integers: the module keeps sched_switch at 16 bytes (priorities as s8,
//! prev_state as u16, ...); lttng-modules 2.10 declares those fields wider
//! (prio s32, prev_state s64, target_cpu s32, softirq vec u32, kmalloc sizes
//! u64), and analyses read the declared types. [`widened`] says which wire
//! fields the expansion re-encodes (sign- or zero-extended from their wire
//! type) and to what.
//!
//! System calls: the module writes, per call, the raw arguments it needs
//! and the user strings among them (docs/abi.md "System calls");
//! [`SyscallWire`] checks such an event against the row of
//! `syscalls::SYSCALLS` for its number, and [`write_syscall`] writes LTTng's
//! fields from it.

use ivtrace_region::bytes::{int_at, le_u16, le_u64, uint_at};
use ivtrace_region::classes::{Field, FieldType};

use super::syscalls::{Src, Syscall, F};

/// LTTng 2.10's type of wire field `field` of event `event`, where it is
/// wider than (or differs in sign from) the module's wire type.
pub fn widened(event: &str, field: &str) -> Option<FieldType> {
    use FieldType::*;
    Some(match (event, field) {
        ("sched_switch", "prev_prio" | "next_prio") => S32,
        ("sched_switch", "prev_state") => S64,
        ("sched_wakeup" | "sched_wakeup_new", "prio" | "target_cpu") => S32,
        ("sched_process_exit" | "sched_process_free", "prio") => S32,
        ("irq_softirq_entry" | "irq_softirq_exit" | "irq_softirq_raise", "vec") => U32,
        ("kmem_kmalloc", "bytes_req" | "bytes_alloc") => U64,
        _ => return None,
    })
}

/// How the expansion reshapes a wire field into LTTng's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reshape {
    /// Not in LTTng's event (a field the host needs on the wire only).
    Drop,
    /// A bytes field of s32 values -> LTTng's u8-counted s32 sequence.
    S32Seq,
    /// A string -> LTTng's u64-counted text sequence (no NUL).
    TextSeq,
}

/// What becomes of wire field `field` (of type `ty`) of event `event` in
/// LTTng 2.10's layout, where it is not simply copied or widened.
pub fn reshaped(event: &str, field: &str, ty: FieldType) -> Option<Reshape> {
    match (event, field, ty) {
        // The new name is the module's naming event; LTTng's exec has no comm.
        ("sched_process_exec", "comm", FieldType::Chars(_)) => Some(Reshape::Drop),
        ("sched_process_fork", "vtids", FieldType::Bytes) => Some(Reshape::S32Seq),
        ("printk_console", "msg", FieldType::String) => Some(Reshape::TextSeq),
        _ => None,
    }
}

/// The output type of a reshaped field (None: dropped).
pub fn reshaped_type(r: Reshape) -> Option<FieldType> {
    match r {
        Reshape::Drop => None,
        Reshape::S32Seq => Some(FieldType::S32SeqU8),
        Reshape::TextSeq => Some(FieldType::TextSeqU64),
    }
}

/// Writes wire field `wire` (its whole encoding) reshaped by `r`. A bytes
/// field longer than 255 values or not a whole number of them is cut.
pub fn write_reshaped(out: &mut Vec<u8>, r: Reshape, wire: &[u8]) {
    match r {
        Reshape::Drop => {}
        Reshape::S32Seq => {
            let values = &wire[4..];
            let n = (values.len() / 4).min(u8::MAX as usize);
            out.push(n as u8);
            out.extend_from_slice(&values[..4 * n]);
        }
        Reshape::TextSeq => {
            let text = &wire[..wire.len().saturating_sub(1)];
            out.extend_from_slice(&(text.len() as u64).to_le_bytes());
            out.extend_from_slice(text);
        }
    }
}

/// Writes the integer `v` (already sign- or zero-extended) as `ty`.
#[inline]
pub fn put_int(out: &mut Vec<u8>, ty: FieldType, v: u64) {
    let (bytes, _) = ty.integer().expect("integer type");
    out.extend_from_slice(&v.to_le_bytes()[..bytes as usize]);
}

/// The value of a wire integer field, sign- or zero-extended to 64 bits.
#[inline]
pub fn read_int(ty: FieldType, b: &[u8]) -> u64 {
    let (bytes, signed) = ty.integer().expect("integer type");
    let len = bytes as usize;
    let v = if signed {
        int_at(b, 0, len).map(|v| v as u64)
    } else {
        uint_at(b, 0, len)
    };
    v.expect("the caller sliced the field to its type's width")
}

/// An LTTng field type from the table's spelling (`s32x`, `string`, `u32[2]`).
pub fn field_type(ty: &str) -> (FieldType, bool) {
    if ty == "string" {
        return (FieldType::String, false);
    }
    if let Some(n) = ty.strip_prefix("u32[").and_then(|r| r.strip_suffix(']')) {
        return (
            FieldType::U32Array(n.parse().expect("table array size")),
            false,
        );
    }
    let (base, hex) = match ty.strip_suffix('x') {
        Some(b) => (b, true),
        None => (ty, false),
    };
    (FieldType::parse(base).expect("table integer type"), hex)
}

/// The output fields of one side (entry or exit) of a system call.
pub fn fields(side: &[F]) -> Vec<Field> {
    side.iter()
        .map(|f| {
            let (ty, hex) = field_type(f.ty);
            Field::new(f.name, ty, hex)
        })
        .collect()
}

/// The parts of one wire `syscall_entry` / `syscall_exit` payload.
#[derive(Debug, Clone, Copy)]
pub struct SyscallWire<'a> {
    pub nr: u64,
    /// The exit's return value (0 for an entry).
    pub ret: u64,
    /// The arguments, u64 each (entry: the first `nargs`; exit: those of
    /// `out_mask`).
    pub args: &'a [u8],
    /// Entry: the user strings, each NUL-terminated; exit: the data.
    pub extra: &'a [u8],
}

impl<'a> SyscallWire<'a> {
    /// Splits a payload whose field offsets are `offs` (entry: id, args,
    /// strings; exit: id, ret, args, data; BYTES fields are a u32 length and
    /// the bytes).
    pub fn parse(exit: bool, payload: &'a [u8], offs: &[u32]) -> SyscallWire<'a> {
        let field = |i: usize| &payload[offs[i] as usize..offs[i + 1] as usize];
        let bytes = |i: usize| &field(i)[4..];
        let nr = le_u16(payload, 0) as u64;
        if exit {
            let ret = le_u64(field(1), 0);
            SyscallWire {
                nr,
                ret,
                args: bytes(2),
                extra: bytes(3),
            }
        } else {
            SyscallWire {
                nr,
                ret: 0,
                args: bytes(1),
                extra: bytes(2),
            }
        }
    }

    /// Whether the event is what the table says the module writes for its
    /// number: the right number of arguments, one string per string
    /// argument, the right amount of data.
    pub fn matches(&self, exit: bool, s: &Syscall) -> bool {
        if exit {
            let data = if s.data_arg != 0 { 8 } else { 0 };
            self.args.len() == 8 * s.out_mask.count_ones() as usize && self.extra.len() == data
        } else {
            let strings = s.str_mask.count_ones() as usize;
            self.args.len() == 8 * s.nargs as usize
                && self.extra.iter().filter(|&&b| b == 0).count() == strings
                && self.extra.last().is_none_or(|&b| b == 0)
        }
    }

    fn arg(&self, exit: bool, s: &Syscall, i: u8) -> u64 {
        let pos = if exit {
            (s.out_mask & ((1u8 << i) - 1)).count_ones() as usize
        } else {
            i as usize
        };
        le_u64(self.args, 8 * pos)
    }

    fn string(&self, k: u8) -> &'a [u8] {
        let mut rest = self.extra;
        for _ in 0..k {
            let nul = rest.iter().position(|&b| b == 0).expect("matched");
            rest = &rest[nul + 1..];
        }
        let nul = rest.iter().position(|&b| b == 0).expect("matched");
        &rest[..=nul]
    }
}

/// Writes the payload of LTTng's event for `w` (which [`SyscallWire::matches`] `s`).
pub fn write_syscall(out: &mut Vec<u8>, exit: bool, s: &Syscall, w: &SyscallWire) {
    let side = if exit { s.exit } else { s.entry };
    for f in side {
        let (ty, _) = field_type(f.ty);
        match f.src {
            Src::Ret => put_int(out, ty, w.ret),
            Src::Arg(i) => put_int(out, ty, w.arg(exit, s, i)),
            Src::Str(k) => out.extend_from_slice(w.string(k)),
            Src::Data => out.extend_from_slice(w.extra),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_sign_or_zero_extended() {
        assert_eq!(read_int(FieldType::S8, &[0xff]) as i64, -1);
        assert_eq!(read_int(FieldType::U8, &[0xff]), 255);
        assert_eq!(read_int(FieldType::U16, &[0x00, 0x01]), 256);
        assert_eq!(read_int(FieldType::S64, &(-5i64).to_le_bytes()) as i64, -5);
        let mut out = Vec::new();
        put_int(&mut out, FieldType::S32, (-1i64) as u64);
        assert_eq!(out, [0xff; 4]);
    }

    #[test]
    fn table_types_parse() {
        assert_eq!(field_type("s32x"), (FieldType::S32, true));
        assert_eq!(field_type("u64"), (FieldType::U64, false));
        assert_eq!(field_type("string"), (FieldType::String, false));
        assert_eq!(field_type("u32[2]"), (FieldType::U32Array(2), false));
        for s in super::super::syscalls::SYSCALLS.iter().flatten() {
            for f in s.entry.iter().chain(s.exit) {
                let _ = field_type(f.ty); // every table type is known
            }
        }
    }
}
