//! TSDL text for one stream class: the CTF 1.8 `metadata` file.
//!
//! The packet header and context declare exactly `struct ivt_packet_hdr`;
//! the event header is the compact/extended form of abi.h (a 5-bit id
//! aligned on 32 bits, a 27-bit timestamp, or u32 id + u64 timestamp
//! aligned on 32 bits); payload integers are byte-packed (`align = 8`).
//! Only sanitized names (ivtrace-ring's `sanitize`) and host-chosen
//! strings reach this text; env strings are escaped besides.

use std::fmt::Write;

use ivtrace_ring::classes::{EventClass, FieldType, StreamClasses};

use crate::clock::ClockMapping;

/// Name of the clock class in every trace.
pub const CLOCK_NAME: &str = "ivt_clock";

/// The tracer the kernel trace presents itself as: Trace Compass picks
/// its event layout from `tracer_name`/`tracer_major`/`tracer_minor`
/// (lttng-modules >= 2.9: the `Lttng29EventLayout` names this trace uses),
/// and babeltrace2 2.0 applies only its "lttng crash" index fix-up to
/// lttng-modules 2.13, which leaves packets with a correct
/// `timestamp_end` (every packet ivtrace writes) alone.
pub const KERNEL_TRACER: (&str, i64, i64, i64) = ("lttng-modules", 2, 13, 0);

/// One `env` entry value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    Str(String),
    Int(i64),
}

/// What the `env` block says about the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEnv {
    pub hostname: String,
    pub trace_name: String,
    pub creation_datetime: String,
    pub tracer_major: i64,
    pub tracer_minor: i64,
    /// Extra `ivtrace_*` keys (clock mapping, region facts).
    pub extra: Vec<(String, EnvValue)>,
}

/// The trace-wide facts the metadata needs.
pub struct TraceDesc<'a> {
    pub uuid: &'a str,
    pub clock_uuid: &'a str,
    pub clock: &'a ClockMapping,
    pub env: &'a TraceEnv,
}

/// A TSDL string literal's content: printable ASCII, `"` and `\` escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out
}

/// `env` keys must be identifiers.
fn env_key(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The `domain` env value of a stream class, as LTTng names them.
pub fn domain(stream: u32) -> &'static str {
    if stream == ivtrace_ring::abi::IVT_STREAM_KERNEL {
        "kernel"
    } else {
        "ust"
    }
}

/// The complete metadata text for stream class `stream`.
pub fn metadata(desc: &TraceDesc, stream: u32, classes: &StreamClasses) -> String {
    let mut t = String::with_capacity(4096 + classes.len() * 512);
    t.push_str("/* CTF 1.8 */\n\n");
    t.push_str(PRELUDE);
    write_trace(&mut t, desc);
    write_env(&mut t, desc.env, stream);
    write_clock(&mut t, desc);
    write_stream(&mut t, stream);
    for class in classes.iter() {
        write_event(&mut t, class);
    }
    t
}

const PRELUDE: &str = "\
typealias integer { size = 8; align = 8; signed = false; } := uint8_t;
typealias integer { size = 32; align = 32; signed = false; } := uint32_t;
typealias integer { size = 64; align = 64; signed = false; } := uint64_t;

";

fn write_trace(t: &mut String, desc: &TraceDesc) {
    let _ = write!(
        t,
        "trace {{
\tmajor = 1;
\tminor = 8;
\tuuid = \"{}\";
\tbyte_order = le;
\tpacket.header := struct {{
\t\tuint32_t magic;
\t\tuint32_t stream_id;
\t\tuint64_t stream_instance_id;
\t}};
}};

",
        escape(desc.uuid)
    );
}

fn write_env(t: &mut String, env: &TraceEnv, stream: u32) {
    t.push_str("env {\n");
    let _ = writeln!(t, "\thostname = \"{}\";", escape(&env.hostname));
    let _ = writeln!(t, "\tdomain = \"{}\";", domain(stream));
    if stream == ivtrace_ring::abi::IVT_STREAM_KERNEL {
        let (name, major, minor, patch) = KERNEL_TRACER;
        let _ = write!(
            t,
            "\tsysname = \"Linux\";\n\ttracer_name = \"{name}\";\n\ttracer_major = {major};\n\
             \ttracer_minor = {minor};\n\ttracer_patchlevel = {patch};\n\
             \ttrace_buffering_scheme = \"global\";\n"
        );
        let _ = writeln!(t, "\tivtrace_tracer_major = {};", env.tracer_major);
        let _ = writeln!(t, "\tivtrace_tracer_minor = {};", env.tracer_minor);
    } else {
        t.push_str("\ttracer_name = \"ivtrace\";\n");
        let _ = writeln!(t, "\ttracer_major = {};", env.tracer_major);
        let _ = writeln!(t, "\ttracer_minor = {};", env.tracer_minor);
    }
    let _ = writeln!(t, "\ttrace_name = \"{}\";", escape(&env.trace_name));
    let _ = writeln!(
        t,
        "\ttrace_creation_datetime = \"{}\";",
        escape(&env.creation_datetime)
    );
    write_env_entries(t, &env.extra);
    t.push_str("};\n\n");
}

/// `env` lines for `entries`, keys made identifiers, strings escaped.
pub fn write_env_entries(t: &mut String, entries: &[(String, EnvValue)]) {
    for (key, value) in entries {
        match value {
            EnvValue::Str(s) => writeln!(t, "\t{} = \"{}\";", env_key(key), escape(s)),
            EnvValue::Int(i) => writeln!(t, "\t{} = {};", env_key(key), i),
        }
        .expect("writing to a String");
    }
}

fn write_clock(t: &mut String, desc: &TraceDesc) {
    let c = desc.clock;
    let (offset_s, offset) = c.ctf_offset();
    let _ = write!(
        t,
        "clock {{
\tname = \"{CLOCK_NAME}\";
\tuuid = \"{}\";
\tdescription = \"writer clock mapped to host CLOCK_REALTIME ({}, error <= {} ns)\";
\tfreq = {};
\tprecision = {};
\toffset_s = {offset_s};
\toffset = {offset};
\tabsolute = TRUE;
}};

typealias integer {{ size = 64; align = 64; signed = false; map = clock.{CLOCK_NAME}.value; }} := uint64_clock_t;

",
        escape(desc.clock_uuid),
        escape(&c.method),
        c.error_ns,
        c.freq_hz.max(1),
        c.precision_cycles(),
    );
}

fn write_stream(t: &mut String, stream: u32) {
    let _ = write!(
        t,
        "stream {{
\tid = {stream};
\tpacket.context := struct {{
\t\tuint64_clock_t timestamp_begin;
\t\tuint64_clock_t timestamp_end;
\t\tuint64_t content_size;
\t\tuint64_t packet_size;
\t\tuint64_t packet_seq_num;
\t\tuint64_t events_discarded;
\t\tuint64_t first_event_seq;
\t\tuint32_t event_count;
\t\tuint32_t cpu_id;
\t\tuint32_t owner_pid;
\t\tuint32_t owner_tid;
\t}};
\tevent.header := struct {{
\t\tenum : integer {{ size = 5; align = 32; signed = false; }} {{ compact = 0 ... 30, extended = 31 }} id;
\t\tvariant <id> {{
\t\t\tstruct {{
\t\t\t\tinteger {{ size = 27; align = 1; signed = false; map = clock.{CLOCK_NAME}.value; }} timestamp;
\t\t\t}} compact;
\t\t\tstruct {{
\t\t\t\tinteger {{ size = 32; align = 32; signed = false; }} id;
\t\t\t\tinteger {{ size = 64; align = 32; signed = false; map = clock.{CLOCK_NAME}.value; }} timestamp;
\t\t\t}} extended;
\t\t}} v;
\t}};
}};

"
    );
}

/// One `event` block: the class's payload fields, byte-packed (`align = 8`).
pub fn write_event(t: &mut String, class: &EventClass) {
    let _ = write!(
        t,
        "event {{\n\tname = \"{}\";\n\tid = {};\n\tstream_id = {};\n\tfields := struct {{\n",
        escape(&class.name),
        class.id,
        class.stream
    );
    for f in &class.fields {
        write_field(t, &f.name, f.ty, f.hex);
    }
    t.push_str("\t};\n};\n\n");
}

fn integer(bits: u32, signed: bool, base: u32) -> String {
    format!("integer {{ size = {bits}; align = 8; signed = {signed}; base = {base}; }}")
}

fn write_field(t: &mut String, name: &str, ty: FieldType, hex: bool) {
    let base = if hex { 16 } else { 10 };
    let _ = match ty {
        FieldType::String => writeln!(t, "\t\tstring _{name};"),
        FieldType::Bytes => writeln!(
            t,
            "\t\t{} _{name}_len;\n\t\t{} _{name}[_{name}_len];",
            integer(32, false, 10),
            integer(8, false, 16)
        ),
        FieldType::Chars(n) => writeln!(
            t,
            "\t\tinteger {{ size = 8; align = 8; signed = false; encoding = UTF8; }} _{name}[{n}];"
        ),
        FieldType::U32Array(n) => writeln!(t, "\t\t{} _{name}[{n}];", integer(32, false, base)),
        // LTTng's spelling: the length is `_<name>_length` (TSDL `__<name>_length`).
        FieldType::S32SeqU8 => writeln!(
            t,
            "\t\t{} __{name}_length;\n\t\t{} _{name}[ __{name}_length ];",
            integer(8, false, 10),
            integer(32, true, base)
        ),
        FieldType::TextSeqU64 => writeln!(
            t,
            "\t\t{} __{name}_length;\n\t\tinteger {{ size = 8; align = 8; signed = true; encoding = UTF8; }} _{name}[ __{name}_length ];",
            integer(64, false, 10)
        ),
        int => {
            let (bytes, signed) = int.integer().expect("integer type");
            writeln!(t, "\t\t{} _{name};", integer(bytes * 8, signed, base))
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_ring::classes::Field;

    #[test]
    fn escape_keeps_tsdl_strings_closed() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c_d");
    }

    #[test]
    fn metadata_declares_every_field_type() {
        let mut classes = StreamClasses::default();
        classes.insert(EventClass::new(
            3,
            1,
            "x:y".into(),
            vec![
                Field::new("a", FieldType::S16, false),
                Field::new("h", FieldType::U64, true),
                Field::new("d", FieldType::Bytes, false),
                Field::new("s", FieldType::String, false),
                Field::new("c", FieldType::Chars(16), false),
            ],
        ));
        let clock = ClockMapping {
            freq_hz: 1_000_000_000,
            ref_ticks: 0,
            ref_realtime_ns: 0,
            error_ns: 1,
            method: "m".into(),
            coarse: false,
            samples: 1,
        };
        let env = TraceEnv {
            hostname: "h".into(),
            trace_name: "t".into(),
            creation_datetime: "d".into(),
            tracer_major: 0,
            tracer_minor: 1,
            extra: vec![("ivtrace_x".into(), EnvValue::Int(5))],
        };
        let desc = TraceDesc {
            uuid: "u",
            clock_uuid: "c",
            clock: &clock,
            env: &env,
        };
        let text = metadata(&desc, 1, &classes);
        assert!(text.starts_with("/* CTF 1.8 */\n"));
        for needle in [
            "integer { size = 16; align = 8; signed = true; base = 10; } _a;",
            "base = 16; } _h;",
            "_d_len;",
            "_d[_d_len];",
            "string _s;",
            "encoding = UTF8; } _c[16];",
            "domain = \"ust\";",
            "ivtrace_x = 5;",
            "absolute = TRUE;",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
