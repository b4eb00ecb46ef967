//! The guest's ftrace, relayed (docs/ftrace.md): the pages the relay
//! copied into its channels (stream class 2), decoded with the guest's own
//! format files by this crate's [`crate::format`], [`crate::page`] and
//! [`crate::decode`] (the decoder of the host's own tracefs pages), into
//! streams of the guest's kernel trace, one per CPU.
//!
//! Names: events of the systems whose events LTTng records under ftrace's
//! own names, and the native probes never write ([`LTTNG_SYSTEMS`]:
//! block, net, workqueue), keep their names, so Trace Compass's analyses
//! apply (its disk analysis reads block_rq_*); a block request's `rwbs`
//! becomes LTTng's flag bits and block_rq_complete's `error` LTTng's
//! `errors`. Every other event is `ftrace:<system>:<event>`
//! (`ftrace:<event>` for the tracers' own, events/ftrace/): nothing
//! collides with the native probes' LTTng names. Each event's payload
//! starts with the writing thread (`common_pid`; LTTng's `tid` for the
//! LTTng-named ones).
//!
//! Two passes over the staged pages: the first counts each ftrace type, so
//! the most frequent get the 4-byte compact event header (ids 0..=30) and
//! only events that occur are declared, and gathers the kernel symbols the
//! relay sent (checked, into `DIR/kallsyms`); the second writes. Losses per CPU
//! come from ftrace's own counters (the last `ftrace_stats` the relay
//! wrote after the pages they count) and from the pages' missed-events
//! marks, which place them in time ([`ivtrace_ctf::ftrace::FtraceCpu`]).
//!
//! All of it is guest input: formats and pages are bounded and checked
//! (a record that does not match its format, a page that does not walk is
//! counted, never a panic), names are sanitized and made unique.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::time::Instant;

use ivtrace_ctf::ftrace::{
    FtraceCpu, FtraceExpand, FtraceInput, FtraceOutput, FtraceStaged, FtraceStats, KALLSYMS_FILE,
};
use ivtrace_ctf::kernel::wire::{align_event, event_header, le_u32, packet_content, PacketFile};
use ivtrace_ctf::outdir::OutDir;
use ivtrace_ctf::sidecar::TracefsFormats;
use ivtrace_region::abi;
use ivtrace_region::classes::{EventClass, Field, FieldType, StreamClasses};
use ivtrace_region::ftrace::{FtraceFile, FtraceFormats};
use ivtrace_region::kallsyms::Symbols;
use ivtrace_region::reader::CTF_DISCARDED_MAX;
use ivtrace_region::sanitize;

use crate::decode::{class_with, Adjust, Decoder, EventDecoder, FieldPlan};
use crate::format::{parse_event, parse_header_page, EventFmt, FieldFmt, HeaderPage};
use crate::page;

pub mod out;
use out::StreamOut;

/// Systems whose events LTTng names as ftrace does and which the native
/// probes do not write: their events keep their names in the trace.
pub const LTTNG_SYSTEMS: &[&str] = &["block", "net", "workqueue"];

/// The expander the recording engine installs on its CTF writer.
#[derive(Debug, Default)]
pub struct RelayExpander;

impl FtraceExpand for RelayExpander {
    fn expand(&mut self, input: &FtraceInput) -> io::Result<FtraceOutput> {
        expand(input)
    }
}

/// The guest's published formats, parsed.
struct Catalog {
    hp: HeaderPage,
    by_id: HashMap<u16, EventFmt>,
    /// The texts as published: `events/header_page`, and each format by id.
    header_page: String,
    texts: HashMap<u16, String>,
    first: Option<EventFmt>,
    parsed: u64,
    refused: u64,
}

impl Catalog {
    fn new(formats: &FtraceFormats) -> Catalog {
        let mut c = Catalog {
            hp: HeaderPage::default(),
            by_id: HashMap::new(),
            header_page: String::new(),
            texts: HashMap::new(),
            first: None,
            parsed: 0,
            refused: formats.refused,
        };
        for f in formats.iter() {
            let text = String::from_utf8_lossy(&f.text);
            match f.file {
                FtraceFile::HeaderPage => match parse_header_page(&text) {
                    Ok(hp) => {
                        c.hp = hp;
                        c.header_page = text.into_owned();
                    }
                    Err(_) => c.refused += 1,
                },
                FtraceFile::Format => match parse_event(&f.system, &text) {
                    Ok(e) if !e.system.is_empty() => {
                        c.parsed += 1;
                        c.first.get_or_insert_with(|| e.clone());
                        c.texts.entry(e.id).or_insert_with(|| text.into_owned());
                        c.by_id.entry(e.id).or_insert(e);
                    }
                    _ => c.refused += 1,
                },
            }
        }
        c
    }
}

impl Catalog {
    /// The published texts of the formats of `types` (as sanitized system
    /// and event names: `system/event`) and the header page.
    fn formats_of<'a>(&self, types: impl Iterator<Item = &'a u16>) -> TracefsFormats {
        let events = types
            .filter_map(|ty| Some((self.by_id.get(ty)?, self.texts.get(ty)?)))
            .map(|(f, text)| (format!("{}/{}", f.system, f.name), text.clone()))
            .collect();
        TracefsFormats {
            header_page: self.header_page.clone(),
            events,
        }
    }
}

/// The trace's name of an ftrace event ([`LTTNG_SYSTEMS`], else prefixed).
pub fn trace_name(system: &str, event: &str) -> String {
    if LTTNG_SYSTEMS.contains(&system) {
        event.to_string()
    } else if system == "ftrace" {
        format!("ftrace:{event}")
    } else {
        format!("ftrace:{system}:{event}")
    }
}

fn guest_hex(name: &str) -> bool {
    matches!(
        name,
        "ip" | "parent_ip"
            | "func"
            | "call_site"
            | "ptr"
            | "skbaddr"
            | "page"
            | "function"
            | "work"
            | "hrtimer"
            | "addr"
            | "caller"
            | "callback"
    ) || name.ends_with("_addr")
        || name.ends_with("_ptr")
        || name.ends_with("_ip")
}

/// How the trace shows one field of a guest event.
fn guest_plan(fmt: &EventFmt, f: &FieldFmt) -> FieldPlan {
    let block = fmt.system == "block";
    let mut name = sanitize::field_name(f.name.as_bytes(), 0).0;
    let mut adjust = Adjust::None;
    if block && name == "rwbs" && f.is_char() {
        adjust = Adjust::Rwbs;
    }
    if block
        && name == "error"
        && matches!(fmt.name.as_str(), "block_rq_complete" | "block_rq_requeue")
    {
        name = "errors".into();
    }
    let hex = guest_hex(&name);
    FieldPlan { name, adjust, hex }
}

/// The class of an ftrace event as id `id`: the writing thread first, then
/// the format's fields, names unique.
fn guest_class(fmt: &EventFmt, id: u32, taken: &mut HashSet<String>) -> (EventClass, EventDecoder) {
    let raw = trace_name(&fmt.system, &fmt.name);
    let name = sanitize::dedupe(sanitize::event_name(raw.as_bytes(), id).0, taken).0;
    let (class, dec) = class_with(fmt, id, abi::IVT_STREAM_FTRACE, name, &|f| {
        guest_plan(fmt, f)
    });
    let tid_name = if LTTNG_SYSTEMS.contains(&fmt.system.as_str()) {
        "tid"
    } else {
        "common_pid"
    };
    let mut names = HashSet::new();
    let mut fields = vec![Field::new(tid_name, FieldType::S32, false)];
    names.insert(tid_name.to_string());
    for f in class.fields {
        let (n, _) = sanitize::dedupe(f.name.clone(), &mut names);
        fields.push(Field { name: n, ..f });
    }
    (EventClass::new(id, class.stream, class.name, fields), dec)
}

/// The class (and decoder) the relay gives ftrace event `fmt` when it
/// decodes its records, under the name it takes when no other event
/// sanitizes to the same: what an export matches the trace's classes
/// against to write the records back in the guest's layout.
pub fn relayed_class(fmt: &EventFmt) -> (EventClass, EventDecoder) {
    guest_class(fmt, 0, &mut HashSet::new())
}

/// One event of a staged wire packet: a page, a CPU's counters, or a
/// chunk of the kernel's symbols.
enum Wire<'a> {
    Page(&'a [u8]),
    Stats([u64; abi::IVT_FTRACE_STAT_COUNT]),
    Symbols(&'a [u8]),
}

/// The kernel symbols' text is ~2-4 MB (Debian's 6.1 with its modules):
/// more than this is not a kallsyms the host keeps.
const SYMBOLS_TEXT_MAX: usize = 64 << 20;

/// The events of one staged packet, and its CPU. None for a packet that
/// does not walk as the relay writes them (skipped, counted).
fn wire_events(pkt: &[u8]) -> Option<(u32, Vec<Wire<'_>>)> {
    let (h, content) = packet_content(pkt)?;
    let content = pkt.get(..content)?;
    let mut off = abi::PACKET_HDR_SIZE;
    let mut last = h.timestamp_begin;
    let mut events = Vec::new();
    while off < content.len() {
        let eh = event_header(content, off, last)?;
        let p0 = off + eh.len;
        let len = match eh.id {
            abi::IVT_FTRACE_EV_PAGE | abi::IVT_FTRACE_EV_SYMBOLS => {
                4 + le_u32(content.get(p0..p0 + 4)?, 0) as usize
            }
            abi::IVT_FTRACE_EV_STATS => 8 * abi::IVT_FTRACE_STAT_COUNT,
            _ => return None,
        };
        let payload = content.get(p0..p0.checked_add(len)?)?;
        events.push(match eh.id {
            abi::IVT_FTRACE_EV_PAGE => Wire::Page(&payload[4..]),
            abi::IVT_FTRACE_EV_SYMBOLS => Wire::Symbols(&payload[4..]),
            _ => {
                let mut s = [0u64; abi::IVT_FTRACE_STAT_COUNT];
                for (i, v) in s.iter_mut().enumerate() {
                    *v = u64::from_le_bytes(payload[8 * i..8 * i + 8].try_into().ok()?);
                }
                Wire::Stats(s)
            }
        });
        last = eh.ts;
        off = align_event(p0 + len);
    }
    Some((h.cpu_id, events))
}

/// Calls `f` for every wire event of the staged file `name`, in order.
fn each_wire(staging: &OutDir, name: &str, mut f: impl FnMut(u32, Wire)) -> io::Result<u64> {
    let mut file = PacketFile::new(staging.open_read(name)?, 64 << 10);
    let mut bad = 0u64;
    while file.next_packet()? {
        match wire_events(&file.buf) {
            Some((cpu, events)) => events.into_iter().for_each(|e| f(cpu, e)),
            None => bad += 1,
        }
    }
    Ok(bad)
}

/// What pass 1 found: how often each ftrace type occurs, and the text of
/// the kernel's symbols (with the chunks past [`SYMBOLS_TEXT_MAX`]).
#[derive(Default)]
struct FirstPass {
    counts: HashMap<u16, u64>,
    symbols: Vec<u8>,
    symbols_dropped: u64,
}

/// Pass 1 over every staged page and symbol chunk.
fn first_pass(input: &FtraceInput, hp: &HeaderPage, dec: &Decoder) -> io::Result<FirstPass> {
    let mut fp = FirstPass::default();
    for f in input.files {
        each_wire(input.staging, &f.name, |_, w| match w {
            Wire::Page(p) => {
                page::walk(p, hp, |_, rec| {
                    if let Some(ty) = dec.type_of(rec) {
                        *fp.counts.entry(ty).or_default() += 1;
                    }
                });
            }
            Wire::Symbols(t) if fp.symbols.len() + t.len() <= SYMBOLS_TEXT_MAX => {
                fp.symbols.extend_from_slice(t)
            }
            Wire::Symbols(_) => fp.symbols_dropped += 1,
            Wire::Stats(_) => {}
        })?;
    }
    Ok(fp)
}

/// The symbols, checked line by line, into `DIR/kallsyms`; (kept,
/// refused).
fn keep_symbols(input: &FtraceInput, fp: &FirstPass) -> io::Result<(u64, u64)> {
    if fp.symbols.is_empty() {
        return Ok((0, fp.symbols_dropped));
    }
    let syms = Symbols::parse(&fp.symbols);
    input
        .root
        .write_atomically(KALLSYMS_FILE, syms.to_text().as_bytes())?;
    Ok((syms.len() as u64, syms.refused + fp.symbols_dropped))
}

/// The classes of the types that occur and have a format, the most
/// frequent first (compact headers), and their decoder.
fn plan_classes(
    cat: &Catalog,
    counts: &HashMap<u16, u64>,
) -> (StreamClasses, Decoder, HashMap<u16, String>) {
    let mut types: Vec<(u16, u64)> = counts
        .iter()
        .filter(|(ty, _)| cat.by_id.contains_key(ty))
        .map(|(&ty, &n)| (ty, n))
        .collect();
    types.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    types.truncate(abi::IVT_EVENT_IDS_MAX as usize);
    let mut classes = StreamClasses::default();
    let mut decoder = Decoder::empty(cat.first.as_ref());
    let mut names = HashMap::new();
    let mut taken = HashSet::new();
    for (id, (ty, _)) in types.into_iter().enumerate() {
        let (class, dec) = guest_class(&cat.by_id[&ty], id as u32, &mut taken);
        names.insert(ty, class.name.clone());
        classes.insert(class);
        decoder.insert(ty, dec);
    }
    (classes, decoder, names)
}

/// Pass 2 over one channel: its pages into `input.out`, its accounting.
fn write_channel(
    input: &FtraceInput,
    f: &FtraceStaged,
    hp: &HeaderPage,
    dec: &Decoder,
    by_name: &mut BTreeMap<String, u64>,
    names: &HashMap<u16, String>,
) -> io::Result<FtraceCpu> {
    let mut out = StreamOut::create(input.out, &f.name, f.chan)?;
    let mut acc = FtraceCpu::default();
    let mut stats = None;
    let mut missed = 0u64;
    let mut payload = Vec::with_capacity(256);
    let mut err = Ok(());
    let bad = each_wire(input.staging, &f.name, |cpu, w| match w {
        Wire::Stats(s) => stats = Some(s),
        Wire::Symbols(_) => {}
        Wire::Page(p) => {
            acc.cpu = cpu;
            acc.pages += 1;
            // The page's lost events came before its first one.
            missed = missed.saturating_add(page::missed_before(p, hp).0.unwrap_or(0));
            out.set_discarded(missed);
            let info = page::walk(p, hp, |ts, rec| {
                let Some(d) = dec.decode(rec) else {
                    acc.unknown_type += 1;
                    return;
                };
                payload.clear();
                payload.extend_from_slice(&d.tid.to_le_bytes());
                payload.extend_from_slice(&d.payload);
                if err.is_ok() {
                    err = out.event(cpu, d.class_id, ts, &payload);
                }
                acc.recorded += 1;
                if let Some(n) = dec.type_of(rec).and_then(|t| names.get(&t)) {
                    *by_name.entry(n.clone()).or_default() += 1;
                }
            });
            acc.bad_pages += info.malformed as u64;
        }
    })?;
    err?;
    acc.bad_pages += bad;
    account(&mut acc, stats, missed);
    acc.lost_clamped = acc.lost > CTF_DISCARDED_MAX;
    acc.ts_clamped = out.clamped();
    out.finish(acc.cpu, acc.lost)?;
    Ok(acc)
}

/// Losses of one CPU from its last counters (or the pages' marks alone).
fn account(acc: &mut FtraceCpu, stats: Option<[u64; abi::IVT_FTRACE_STAT_COUNT]>, missed: u64) {
    let Some(s) = stats else {
        acc.no_stats = true;
        acc.lost = missed;
        return;
    };
    acc.entries = s[0];
    acc.overrun = s[1];
    acc.commit_overrun = s[2];
    acc.dropped = s[3];
    acc.clock_reset = s[6];
    let read = s[4];
    acc.read_not_recorded = read.saturating_sub(acc.recorded);
    acc.lost = [
        acc.overrun,
        acc.commit_overrun,
        acc.dropped,
        acc.clock_reset,
        acc.read_not_recorded,
    ]
    .iter()
    .fold(0u64, |a, &b| a.saturating_add(b))
    .max(missed);
    acc.produced = [
        acc.entries,
        acc.overrun,
        read,
        acc.dropped,
        acc.commit_overrun,
    ]
    .iter()
    .fold(0u64, |a, &b| a.saturating_add(b));
}

/// Both passes over every staged channel.
pub fn expand(input: &FtraceInput) -> io::Result<FtraceOutput> {
    let started = Instant::now();
    let cat = Catalog::new(input.formats);
    let hp = cat.hp;
    let probe = Decoder::empty(cat.first.as_ref());
    let fp = first_pass(input, &hp, &probe)?;
    let (classes, decoder, names) = plan_classes(&cat, &fp.counts);
    let (symbols, symbols_refused) = keep_symbols(input, &fp)?;
    let mut stats = FtraceStats {
        formats: cat.parsed,
        formats_refused: cat.refused,
        classes: classes.len() as u64,
        symbols,
        symbols_refused,
        ..FtraceStats::default()
    };
    for f in input.files {
        let cpu = write_channel(input, f, &hp, &decoder, &mut stats.events_by_name, &names)?;
        stats.cpus.push(cpu);
    }
    stats.seconds = started.elapsed().as_secs_f64();
    let formats = cat.formats_of(names.keys());
    Ok(FtraceOutput {
        classes,
        stats,
        formats,
    })
}
