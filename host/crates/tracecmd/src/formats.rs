//! The format files the trace-cmd files declare, by where they come from:
//!
//! - the kernel's own, recorded: the sidecar's `tracefs_formats` (the host
//!   events', the guest's relayed events');
//! - the kernel's own, built in: `formats/linux-6.1.txt`, the guest
//!   kernel's files of the events ivtrace.ko's probes write, for the native
//!   events (and the host's sched events of recordings that kept none);
//! - generated: system call events in the kernel's shape (from the system
//!   call table the kernel expansion uses), and every other ivtrace event
//!   (user events, the state dump, the VM view...) described as what it is.
//!
//! Text that came from a guest is kept to printable ASCII before it reaches
//! a file, and every name to a C identifier.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write;
use std::sync::OnceLock;

use ivtrace_ctf::kernel::syscalls::{self, Src};
use ivtrace_region::classes::{EventClass, FieldType};

/// The built-in format files (see the module comment).
const LINUX_6_1: &str = include_str!("../formats/linux-6.1.txt");

/// The built-in files by `system/event` (and `header_page`, `header_event`).
pub struct Builtin {
    files: BTreeMap<String, String>,
}

impl Builtin {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.files.get(key).map(String::as_str)
    }
}

/// The built-in files, parsed once: a line `=== NAME` starts each.
pub fn builtin() -> &'static Builtin {
    static B: OnceLock<Builtin> = OnceLock::new();
    B.get_or_init(|| {
        let mut files = BTreeMap::new();
        let mut current: Option<(String, String)> = None;
        for line in LINUX_6_1.lines() {
            if let Some(name) = line.strip_prefix("=== ") {
                files.extend(current.take());
                current = Some((name.trim().to_string(), String::new()));
            } else if let Some((_, body)) = current.as_mut() {
                body.push_str(line);
                body.push('\n');
            }
        }
        files.extend(current);
        Builtin { files }
    })
}

/// `s` as a C identifier: `[A-Za-z0-9_]`, not empty, no leading digit.
pub fn ident(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// Guest text kept to what a format file holds: printable ASCII, newlines
/// and tabs.
pub fn clean_text(s: &str) -> String {
    s.chars()
        .filter(|&c| c == '\n' || c == '\t' || (' '..='~').contains(&c))
        .collect()
}

/// Format file `text` with its `key:` line (`name`, `ID`) saying `value`.
pub fn with_line(text: &str, key: &str, value: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for line in text.lines() {
        let said = line.trim_start().strip_prefix(key);
        if said.is_some_and(|rest| rest.starts_with(':')) {
            let _ = writeln!(out, "{key}: {value}");
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The common fields every event of a 64-bit Linux starts with.
const COMMON: &str = "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

";

/// Where a generated field's value comes from in an ivtrace event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Field `i` as it is (an integer, or text).
    Field(usize),
    /// Field `i`, bytes, written as hexadecimal text.
    Hex(usize),
    /// Field `i`, a sequence of integers, written as "a,b,c".
    List(usize),
    /// Element `k` of field `i`, an array of u32.
    Elem(usize, u16),
    /// The name the thread in field `i` had so far (task_rename's oldcomm).
    NameOf(usize),
    /// A constant (a system call's number).
    Const(i64),
    /// Nothing: zero.
    Zero,
}

/// A format being generated: its fields' text, layout and print format.
struct Gen {
    fields: String,
    offset: usize,
    fmt: Vec<String>,
    args: Vec<String>,
    names: HashSet<String>,
    sources: Vec<Source>,
}

impl Gen {
    fn new(first_offset: usize) -> Gen {
        Gen {
            fields: String::new(),
            offset: first_offset,
            fmt: Vec::new(),
            args: Vec::new(),
            names: HashSet::new(),
            sources: Vec::new(),
        }
    }

    fn unique(&mut self, name: &str) -> String {
        // `common_*` are the record header's names.
        let mut base = ident(name);
        if base.starts_with("common_") {
            base.insert(0, '_');
        }
        let mut n = base.clone();
        let mut k = 2;
        while !self.names.insert(n.clone()) {
            n = format!("{base}_{k}");
            k += 1;
        }
        n
    }

    /// A field `decl` of `size` bytes aligned on `align`.
    fn field(&mut self, decl: &str, size: usize, align: usize, signed: bool) {
        self.offset = self.offset.div_ceil(align) * align;
        let _ = writeln!(
            self.fields,
            "\tfield:{decl};\toffset:{};\tsize:{size};\tsigned:{};",
            self.offset, signed as u8
        );
        self.offset += size;
    }

    fn int(&mut self, name: &str, bytes: u32, signed: bool, hex: bool, src: Source) {
        let n = self.unique(name);
        let c = match (bytes, signed) {
            (1, false) => "unsigned char",
            (2, false) => "unsigned short",
            (4, false) => "unsigned int",
            (8, false) => "unsigned long",
            (1, true) => "signed char",
            (2, true) => "short",
            (4, true) => "int",
            _ => "long",
        };
        self.field(&format!("{c} {n}"), bytes as usize, bytes as usize, signed);
        let f = match (bytes, signed, hex) {
            (8, _, true) => "0x%lx",
            (_, _, true) => "0x%x",
            (8, true, _) => "%ld",
            (8, false, _) => "%lu",
            (_, true, _) => "%d",
            _ => "%u",
        };
        self.fmt.push(format!("{n}={f}"));
        self.args.push(format!("REC->{n}"));
        self.sources.push(src);
    }

    fn chars(&mut self, name: &str, len: u16, src: Source) {
        let n = self.unique(name);
        self.field(&format!("char {n}[{len}]"), len as usize, 1, true);
        self.fmt.push(format!("{n}=%s"));
        self.args.push(format!("REC->{n}"));
        self.sources.push(src);
    }

    fn text(&mut self, name: &str, src: Source) {
        let n = self.unique(name);
        self.field(&format!("__data_loc char[] {n}"), 4, 4, true);
        self.fmt.push(format!("{n}=%s"));
        self.args.push(format!("__get_str({n})"));
        self.sources.push(src);
    }

    fn finish(self, name: &str, id: u16) -> (String, Vec<Source>) {
        let mut t = format!("name: {name}\nID: {id}\nformat:\n{COMMON}{}\n", self.fields);
        let _ = write!(t, "print fmt: \"{}\"", self.fmt.join(" "));
        for a in &self.args {
            let _ = write!(t, ", {a}");
        }
        t.push('\n');
        (t, self.sources)
    }
}

/// A format for ivtrace event `class` (system `system`, event `name`), and
/// where each of its fields' values comes from: integers as they are,
/// `char[N]` as text arrays, strings and counted text as dynamic strings,
/// byte arrays as hexadecimal text, integer sequences as lists, arrays of
/// u32 as one field per element.
/// The first `skip` fields are left out (a relayed event's writing thread:
/// the record's `common_pid`).
pub fn generated(name: &str, id: u16, class: &EventClass, skip: usize) -> (String, Vec<Source>) {
    let mut g = Gen::new(8);
    for (i, f) in class.fields.iter().enumerate().skip(skip) {
        match f.ty {
            FieldType::Chars(n) => g.chars(&f.name, n, Source::Field(i)),
            FieldType::String | FieldType::TextSeqU64 => g.text(&f.name, Source::Field(i)),
            FieldType::Bytes => g.text(&f.name, Source::Hex(i)),
            FieldType::S32SeqU8 => g.text(&f.name, Source::List(i)),
            FieldType::U32Array(n) => {
                for k in 0..n {
                    g.int(
                        &format!("{}_{k}", f.name),
                        4,
                        false,
                        f.hex,
                        Source::Elem(i, k),
                    );
                }
            }
            int => {
                let (bytes, signed) = int.integer().expect("the other types are integers");
                g.int(&f.name, bytes, signed, f.hex, Source::Field(i));
            }
        }
    }
    g.finish(&ident(name), id)
}

/// A system call's number by its LTTng name.
pub fn syscall_nr(name: &str) -> Option<u32> {
    syscalls::SYSCALLS
        .iter()
        .position(|s| s.as_ref().is_some_and(|s| s.name == name))
        .map(|nr| nr as u32)
}

/// The argument names of system call `nr`, from LTTng's fields (`argN`
/// where it has none), and which are user strings.
fn syscall_args(nr: u32) -> Option<Vec<(String, bool)>> {
    let s = syscalls::get(nr as u64)?;
    let mut args: Vec<(String, bool)> = (0..s.nargs).map(|i| (format!("arg{i}"), false)).collect();
    let strings: Vec<usize> = (0..8).filter(|b| s.str_mask & (1 << b) != 0).collect();
    for f in s.entry.iter().chain(s.exit) {
        let at = match f.src {
            Src::Arg(i) => i as usize,
            Src::Str(k) => match strings.get(k as usize) {
                Some(&i) => i,
                None => continue,
            },
            Src::Ret | Src::Data => continue,
        };
        if let Some(a) = args.get_mut(at) {
            *a = (f.name.to_string(), matches!(f.src, Src::Str(_)));
        }
    }
    Some(args)
}

/// `syscalls:sys_enter_<name>` or `sys_exit_<name>` as the kernel shapes
/// them (`__syscall_nr`, then each argument in an 8-byte slot; the exit's
/// `ret`), except that a user string argument is the string (LTTng records
/// the string, not the pointer); the values by name from LTTng's event.
pub fn syscall(
    name: &str,
    exit: bool,
    id: u16,
    class: &EventClass,
) -> Option<(String, Vec<Source>)> {
    let nr = syscall_nr(name)?;
    let mut g = Gen::new(8);
    g.int("__syscall_nr", 4, true, false, Source::Const(nr as i64));
    g.offset = 16;
    let by_name = |n: &str| {
        class
            .fields
            .iter()
            .position(|f| f.name == n)
            .map_or(Source::Zero, Source::Field)
    };
    if exit {
        g.int("ret", 8, true, true, by_name("ret"));
    } else {
        for (arg, text) in syscall_args(nr)? {
            let at = 16 + 8 * g.sources.len().saturating_sub(1);
            g.offset = at;
            if text {
                g.text(&arg, by_name(&arg));
            } else {
                g.int(&arg, 8, false, true, by_name(&arg));
            }
        }
    }
    let event = format!("sys_{}_{name}", if exit { "exit" } else { "enter" });
    Some(g.finish(&event, id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_region::classes::Field;
    use ivtrace_tracefs::format::parse_event;

    #[test]
    fn the_builtin_files_are_the_kernels() {
        let b = builtin();
        for key in [
            "header_page",
            "header_event",
            "sched/sched_switch",
            "printk/console",
        ] {
            assert!(b.get(key).is_some(), "{key}");
        }
        let f = parse_event("sched", b.get("sched/sched_switch").unwrap()).unwrap();
        assert_eq!(f.field("next_pid").unwrap().offset, 56);
        assert!(b.get("header_page").unwrap().contains("commit"));
        assert!(!b.get("printk/console").unwrap().contains("==="));
    }

    #[test]
    fn generated_formats_parse_back_with_their_layout() {
        let class = EventClass::new(
            1,
            1,
            "loadgen:payload".into(),
            vec![
                Field::new("thread", FieldType::U16, false),
                Field::new("seq", FieldType::U64, false),
                Field::new("data", FieldType::Bytes, false),
                Field::new("who", FieldType::Chars(16), false),
                Field::new("pair", FieldType::U32Array(2), true),
                Field::new("1bad name", FieldType::S8, false),
            ],
        );
        let (text, src) = generated("loadgen:payload", 900, &class, 0);
        let f = parse_event("ivtrace_user", &text).unwrap();
        assert_eq!((f.name.as_str(), f.id), ("loadgen_payload", 900));
        let names: Vec<_> = f.fields.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "thread",
                "seq",
                "data",
                "who",
                "pair_0",
                "pair_1",
                "_1bad_name"
            ]
        );
        assert_eq!(f.field("seq").unwrap().offset, 16, "aligned");
        assert!(f.field("data").unwrap().data_loc);
        assert_eq!(src[2], Source::Hex(2));
        assert_eq!(src[5], Source::Elem(4, 1));
        assert!(text.contains("__get_str(data)"));
    }

    #[test]
    fn system_calls_take_the_kernels_shape() {
        let class = EventClass::new(
            1,
            0,
            "syscall_entry_openat".into(),
            vec![
                Field::new("dfd", FieldType::S32, false),
                Field::new("filename", FieldType::String, false),
                Field::new("flags", FieldType::S32, false),
                Field::new("mode", FieldType::U16, false),
            ],
        );
        let (text, src) = syscall("openat", false, 7, &class).unwrap();
        let f = parse_event("syscalls", &text).unwrap();
        assert_eq!(f.name, "sys_enter_openat");
        let at: Vec<_> = f
            .fields
            .iter()
            .map(|x| (x.name.as_str(), x.offset))
            .collect();
        assert_eq!(
            at,
            [
                ("__syscall_nr", 8),
                ("dfd", 16),
                ("filename", 24),
                ("flags", 32),
                ("mode", 40)
            ]
        );
        assert_eq!(src[0], Source::Const(257));
        assert_eq!(src[2], Source::Field(1));
        let (text, _) = syscall("openat", true, 8, &class).unwrap();
        assert_eq!(
            parse_event("syscalls", &text)
                .unwrap()
                .field("ret")
                .unwrap()
                .offset,
            16
        );
        assert!(syscall("no_such_call", false, 9, &class).is_none());
    }

    #[test]
    fn ids_and_guest_text_are_rewritten() {
        let text = "name: x\nID: 12\nformat:\n";
        assert_eq!(with_line(text, "ID", "99"), "name: x\nID: 99\nformat:\n");
        assert_eq!(with_line(text, "name", "y"), "name: y\nID: 12\nformat:\n");
        assert_eq!(clean_text("a\u{1b}[2Jb\tc\n\0"), "a[2Jb\tc\n");
        assert_eq!(ident("ftrace:sched:x"), "ftrace_sched_x");
    }
}
