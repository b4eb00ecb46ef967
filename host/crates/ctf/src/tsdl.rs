//! TSDL text: the CTF 1.8 `metadata` file of every trace ivtrace writes
//! (a guest stream class's, [`metadata`]; the host trace's,
//! [`host_metadata`]).
//!
//! The packet header and context declare exactly `struct ivt_packet_hdr`;
//! the event header is the compact/extended form of abi.h (a 5-bit id
//! aligned on 32 bits, a 27-bit timestamp, or u32 id + u64 timestamp
//! aligned on 32 bits); payload integers are byte-packed (`align = 8`).
//! Only sanitized names (ivtrace-region's `sanitize`) and host-chosen
//! strings reach this text; env strings are escaped besides.

use std::fmt::Write;

use ivtrace_region::classes::{EventClass, FieldType, StreamClasses};
use ivtrace_time::ClockMapping;

use crate::host_trace::{HostTraceDesc, STREAM_IVTRACE, STREAM_KERNEL};

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

/// What a guest trace's timestamps count (docs/ctf.md, "Time").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timebase {
    /// The writers' ticks, as the drain copied them: the clock runs at
    /// the mapping's frequency, the date in its offset (user traces; the
    /// staged kernel packets).
    Ticks,
    /// Nanoseconds since the epoch, converted with the mapping (the kernel
    /// trace, which the host rewrites anyway): a 1 GHz clock with offset 0,
    /// which every reader adds as integers, exact to the nanosecond.
    Nanoseconds,
}

/// The trace-wide facts the metadata needs.
pub struct TraceDesc<'a> {
    pub uuid: &'a str,
    pub clock_uuid: &'a str,
    pub clock: &'a ClockMapping,
    pub timebase: Timebase,
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
    if stream == ivtrace_region::abi::IVT_STREAM_KERNEL {
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

/// Another stream class of the same trace after [`metadata`]'s text: its
/// stream block and its `classes` (the kernel trace's ftrace streams).
pub fn append_stream(t: &mut String, stream: u32, classes: &StreamClasses) {
    write_stream(t, stream);
    for class in classes.iter() {
        write_event(t, class);
    }
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
    if stream == ivtrace_region::abi::IVT_STREAM_KERNEL {
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

/// Why the clock offset has the form it has (a TSDL comment).
pub(crate) fn offset_comment(c: &ClockMapping) -> &'static str {
    if c.offset_fits_cycles() {
        "the whole offset from the epoch is in cycles, for Trace Compass < 6.3 ignores offset_s"
    } else {
        "the offset from the epoch overflows int64 in cycles at this freq: Trace Compass < 6.3, \
         which ignores offset_s, places this trace in 1970"
    }
}

fn write_clock(t: &mut String, desc: &TraceDesc) {
    write_clock_block(t, desc.clock_uuid, desc.clock, desc.timebase);
    t.push_str(
        "typealias integer { size = 64; align = 64; signed = false; \
         map = clock.ivt_clock.value; } := uint64_clock_t;\n\n",
    );
}

/// The guest traces' `clock` block (name [`CLOCK_NAME`], UUID
/// `clock_uuid`) for timestamps that count `timebase`: ticks at the
/// mapping's frequency with the date in the offset, or nanoseconds since
/// the epoch at 1 GHz with offset 0 (the date is in the values, so every
/// reader adds integers: Trace Compass < 6.3 ignores `offset_s` and, at
/// 1 GHz, converts no value through a double).
pub(crate) fn write_clock_block(
    t: &mut String,
    clock_uuid: &str,
    c: &ClockMapping,
    timebase: Timebase,
) {
    let (freq, precision, comment, (offset_s, offset)) = match timebase {
        Timebase::Ticks => (
            c.freq_hz.max(1),
            c.precision_cycles(),
            offset_comment(c),
            c.ctf_offset(),
        ),
        Timebase::Nanoseconds => (
            1_000_000_000,
            c.error_ns.max(1),
            "values are nanoseconds since the epoch: exact in every reader",
            (0, 0),
        ),
    };
    let unit = match timebase {
        Timebase::Ticks => "",
        Timebase::Nanoseconds => " nanoseconds",
    };
    let _ = write!(
        t,
        "clock {{
\tname = \"{CLOCK_NAME}\";
\tuuid = \"{}\";
\tdescription = \"writer clock mapped to host CLOCK_REALTIME{unit} ({}, error <= {} ns)\";
\tfreq = {freq};
\tprecision = {precision};
\t/* {comment} */
\toffset_s = {offset_s};
\toffset = {offset};
\tabsolute = TRUE;
}};

",
        escape(clock_uuid),
        escape(&c.method),
        c.error_ns,
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

/// TSDL for the host trace (`DIR/host/`, [`crate::host_trace`]): its own
/// byte-aligned integer aliases, a nanosecond clock on the host time base,
/// the host kernel and ivtrace stream classes, then `classes`.
pub fn host_metadata(desc: &HostTraceDesc, uuid: &str, classes: &[EventClass]) -> String {
    let mut t = String::from("/* CTF 1.8 */\n\n");
    t.push_str(HOST_PRELUDE);
    let _ = write!(
        t,
        "trace {{\n\tmajor = 1;\n\tminor = 8;\n\tuuid = \"{uuid}\";\n\tbyte_order = le;\n\
         \tpacket.header := struct {{\n\t\th_u32 magic;\n\t\th_u32 stream_id;\n\
         \t\th_u64 stream_instance_id;\n\t}};\n}};\n\n"
    );
    write_host_env(&mut t, desc);
    write_host_clock(&mut t, desc);
    for (id, ctx) in [
        (
            STREAM_KERNEL,
            "\tevent.context := struct {\n\t\tinteger { size = 32; align = 8; signed = true; } _tid;\n\t};\n",
        ),
        (STREAM_IVTRACE, ""),
    ] {
        write_host_stream(&mut t, id, ctx);
    }
    for c in classes {
        write_event(&mut t, c);
    }
    t
}

/// Every host integer is byte-aligned: host packets need no padding.
pub(crate) const HOST_PRELUDE: &str = "\
typealias integer { size = 8; align = 8; signed = false; } := h_u8;
typealias integer { size = 32; align = 8; signed = false; } := h_u32;
typealias integer { size = 64; align = 8; signed = false; } := h_u64;

";

/// LTTng-kernel-style env (Trace Compass keys on domain/tracer_name).
fn write_host_env(t: &mut String, desc: &HostTraceDesc) {
    t.push_str("env {\n");
    let _ = writeln!(t, "\thostname = \"{}\";", escape(desc.hostname));
    let (tracer, major, minor, _) = KERNEL_TRACER;
    let _ = write!(
        t,
        "\tdomain = \"kernel\";\n\ttracer_name = \"{tracer}\";\n\
         \ttracer_major = {major};\n\ttracer_minor = {minor};\n"
    );
    let _ = writeln!(t, "\ttrace_name = \"{}\";", escape(desc.trace_name));
    let _ = writeln!(
        t,
        "\ttrace_creation_datetime = \"{}\";",
        creation_datetime(std::time::SystemTime::now())
    );
    t.push_str("\tivtrace_host_trace = 1;\n");
    write_env_entries(t, &desc.env);
    t.push_str("};\n\n");
}

/// Nanoseconds on the host time base: no offset, absolute.
fn write_host_clock(t: &mut String, desc: &HostTraceDesc) {
    let _ = write!(
        t,
        "clock {{\n\tname = \"ivt_host\";\n\tuuid = \"{}\";\n\
         \tdescription = \"host CLOCK_MONOTONIC on the CLOCK_REALTIME base (ivtrace host time)\";\n\
         \tfreq = 1000000000;\n\tprecision = {};\n\toffset_s = 0;\n\toffset = 0;\n\tabsolute = TRUE;\n}};\n\n",
        crate::host_trace::random_uuid(),
        desc.error_ns.max(1)
    );
    t.push_str(
        "typealias integer { size = 64; align = 8; signed = false; map = clock.ivt_host.value; } := h_clock_t;\n\n",
    );
}

/// A host stream class: the packet context of [`crate::host_trace`]'s packets,
/// a u32 id + u64 timestamp event header, and `ctx` (an event context).
pub(crate) fn write_host_stream(t: &mut String, id: u32, ctx: &str) {
    let _ = write!(
        t,
        "stream {{\n\tid = {id};\n\tpacket.context := struct {{\n\
         \t\th_clock_t timestamp_begin;\n\t\th_clock_t timestamp_end;\n\
         \t\th_u64 content_size;\n\t\th_u64 packet_size;\n\t\th_u64 packet_seq_num;\n\
         \t\th_u64 events_discarded;\n\t\th_u32 cpu_id;\n\t}};\n\
         \tevent.header := struct {{\n\t\th_u32 id;\n\t\th_clock_t timestamp;\n\t}};\n{ctx}}};\n\n"
    );
}

/// LTTng-style `YYYYMMDDTHHMMSS+0000` for a time since the epoch (the
/// `trace_creation_datetime` of every trace).
pub fn creation_datetime(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}+0000",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Gregorian date of a day number since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_region::classes::Field;

    #[test]
    fn datetime_is_lttng_style() {
        use std::time::{Duration, UNIX_EPOCH};
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(creation_datetime(t), "20231114T221320+0000");
        assert_eq!(
            creation_datetime(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "20000229T000000+0000"
        );
    }

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
            timebase: Timebase::Ticks,
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
