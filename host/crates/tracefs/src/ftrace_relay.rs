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

// Guest input (a guest's format files and ftrace pages): every arithmetic
// is checked or saturating, every narrowing cast explicit (docs/hardening.md).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::time::Instant;

use ivtrace_ctf::ftrace::{
    FtraceCpu, FtraceExpand, FtraceInput, FtraceOutput, FtraceStaged, FtraceStats, KALLSYMS_FILE,
};
use ivtrace_ctf::kernel::wire::{align_event, event_header, packet_content, PacketFile};
use ivtrace_ctf::outdir::OutDir;
use ivtrace_ctf::sidecar::TracefsFormats;
use ivtrace_ctf::ClockMapping;
use ivtrace_region::abi;
use ivtrace_region::bytes::{slice_at, u32_at, u64_at};
use ivtrace_region::classes::{EventClass, Field, FieldType, StreamClasses};
use ivtrace_region::ftrace::{FtraceFile, FtraceFormats};
use ivtrace_region::kallsyms::Symbols;
use ivtrace_region::packet::TickRange;
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
    fn expand(&mut self, input: &FtraceInput) -> io::Result<Option<FtraceOutput>> {
        expand(input).map(Some)
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
                    Err(_) => c.refused = c.refused.saturating_add(1),
                },
                FtraceFile::Format => match parse_event(&f.system, &text) {
                    Ok(e) if !e.system.is_empty() => {
                        c.parsed = c.parsed.saturating_add(1);
                        c.first.get_or_insert_with(|| e.clone());
                        c.texts.entry(e.id).or_insert_with(|| text.into_owned());
                        c.by_id.entry(e.id).or_insert(e);
                    }
                    _ => c.refused = c.refused.saturating_add(1),
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

/// The events of one staged packet with the times the relay wrote them,
/// and its CPU. None for a packet that does not walk as the relay writes
/// them (skipped, counted).
fn wire_events(pkt: &[u8]) -> Option<(u32, Vec<(u64, Wire<'_>)>)> {
    let (h, content) = packet_content(pkt)?;
    let content = pkt.get(..content)?;
    let mut off = abi::PACKET_HDR_SIZE;
    let mut last = h.timestamp_begin;
    let mut events = Vec::new();
    while off < content.len() {
        let eh = event_header(content, off, last)?;
        let p0 = off.checked_add(eh.len)?;
        let (event, len) = wire_event(content, p0, eh.id)?;
        events.push((eh.ts, event));
        last = eh.ts;
        off = align_event(p0.checked_add(len)?);
    }
    Some((h.cpu_id, events))
}

/// The wire event `id` whose payload starts at `p0`, and its length.
fn wire_event(content: &[u8], p0: usize, id: u32) -> Option<(Wire<'_>, usize)> {
    match id {
        abi::IVT_FTRACE_EV_PAGE => {
            // bytes: a u32 length, then the page.
            let (page, len) = wire_bytes(content, p0)?;
            Some((Wire::Page(page), len))
        }
        abi::IVT_FTRACE_EV_SYMBOLS => {
            let (text, len) = wire_bytes(content, p0)?;
            Some((Wire::Symbols(text), len))
        }
        abi::IVT_FTRACE_EV_STATS => {
            let mut s = [0u64; abi::IVT_FTRACE_STAT_COUNT];
            let mut pos = p0;
            for v in s.iter_mut() {
                *v = u64_at(content, pos)?;
                pos = pos.checked_add(8)?;
            }
            Some((Wire::Stats(s), pos.checked_sub(p0)?))
        }
        _ => None,
    }
}

/// A `bytes` payload at `p0` (a u32 length, then the bytes), and the
/// length it takes.
fn wire_bytes(content: &[u8], p0: usize) -> Option<(&[u8], usize)> {
    let n = u32_at(content, p0)? as usize;
    let bytes = slice_at(content, p0.checked_add(4)?, n)?;
    Some((bytes, n.checked_add(4)?))
}

/// Calls `f` for every wire event of the staged file `name`, in order,
/// with its CPU and the time the relay wrote it.
fn each_wire(staging: &OutDir, name: &str, mut f: impl FnMut(u32, u64, Wire)) -> io::Result<u64> {
    let mut file = PacketFile::new(staging.open_read(name)?, 64 << 10);
    let mut bad = 0u64;
    while file.next_packet()? {
        match wire_events(&file.buf) {
            Some((cpu, events)) => events.into_iter().for_each(|(at, e)| f(cpu, at, e)),
            None => bad = bad.saturating_add(1),
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
        each_wire(input.staging, &f.name, |_, _, w| match w {
            Wire::Page(p) => {
                page::walk(p, hp, |_, rec| {
                    if let Some(ty) = dec.type_of(rec) {
                        let n = fp.counts.entry(ty).or_default();
                        *n = n.saturating_add(1);
                    }
                });
            }
            Wire::Symbols(t) if fp.symbols.len().saturating_add(t.len()) <= SYMBOLS_TEXT_MAX => {
                fp.symbols.extend_from_slice(t)
            }
            Wire::Symbols(_) => fp.symbols_dropped = fp.symbols_dropped.saturating_add(1),
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
    Ok((
        syms.len() as u64,
        syms.refused.saturating_add(fp.symbols_dropped),
    ))
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
    let mut classes = StreamClasses::default();
    let mut decoder = Decoder::empty(cat.first.as_ref());
    let mut names = HashMap::new();
    let mut taken = HashSet::new();
    // Ids 0.. in order of frequency, at most IVT_EVENT_IDS_MAX of them.
    for (id, (ty, _)) in (0..abi::IVT_EVENT_IDS_MAX).zip(types) {
        let (class, dec) = guest_class(&cat.by_id[&ty], id, &mut taken);
        names.insert(ty, class.name.clone());
        classes.insert(class);
        decoder.insert(ty, dec);
    }
    (classes, decoder, names)
}

/// Where a CPU's records may lie in time: within what the trace's clock
/// can express, and no later than the relay had read their page, give or
/// take the skew between two CPUs' TSCs (ftrace's x86-tsc clock is the
/// counter the relay stamps its events with; the relay may run on another
/// CPU than the one that wrote the records). Linux stops trusting a TSC
/// that it sees step between CPUs, so honest skew is cycles; a millisecond
/// tolerates it thousands of times over while refusing a page from the
/// future. A page outside is skipped and its records counted lost, never
/// written (docs/hardening.md, "Timestamps").
///
/// When the relay had read a page is not the page event's own time: the
/// relay reserves the event (its time) and only then reads the page into
/// it, and ftrace goes on recording in between, for as long as the relay
/// is preempted there (its CPU given to the workload, its vCPU to another
/// host thread): milliseconds on a loaded machine. Whatever the relay
/// wrote next on the channel it wrote after the read returned, so that
/// event's time is the bound ([`HeldPage`]).
struct PageTimes {
    ticks: TickRange,
    skew: u64,
}

impl PageTimes {
    fn new(input: &FtraceInput) -> PageTimes {
        PageTimes {
            ticks: input.ticks,
            skew: input.freq_hz / 1000,
        }
    }

    /// The page's records (their count) if their times are acceptable: the
    /// relay had read the page by `read_by`.
    fn check(&self, page: &[u8], hp: &HeaderPage, read_by: u64) -> Result<(), u64> {
        let (mut first, mut last, mut n) = (u64::MAX, 0u64, 0u64);
        page::walk(page, hp, |ts, _| {
            first = first.min(ts);
            last = last.max(ts);
            n = n.saturating_add(1);
        });
        let latest = read_by.saturating_add(self.skew).min(self.ticks.max);
        if n == 0 || (first >= self.ticks.min && last <= latest) {
            Ok(())
        } else {
            Err(n)
        }
    }
}

/// Pass 2 over one channel: its pages into `out` (the kernel trace's
/// directory), its accounting and its events by name.
fn write_channel(
    input: &FtraceInput,
    out: &OutDir,
    f: &FtraceStaged,
    plan: &Plan,
) -> io::Result<(FtraceCpu, BTreeMap<String, u64>)> {
    let mut w = ChannelWriter {
        out: StreamOut::create(out, &f.name, f.chan)?,
        acc: FtraceCpu::default(),
        by_name: BTreeMap::new(),
        missed: 0,
        payload: Vec::with_capacity(256),
        err: Ok(()),
        clock: input.clock.clone(),
    };
    let times = PageTimes::new(input);
    let mut stats = None;
    let mut held = HeldPage::default();
    let bad = each_wire(input.staging, &f.name, |cpu, at, wire| {
        if let Some((cpu, _)) = held.take() {
            w.checked_page(cpu, &held.page, at, &times, plan);
        }
        match wire {
            Wire::Stats(s) => stats = Some(s),
            Wire::Symbols(_) => {}
            Wire::Page(page) => held.hold(cpu, at, page),
        }
    })?;
    // Nothing the relay wrote after its last page vouches for a later read
    // (it stops with its counters after its pages; killed, it may not).
    if let Some((cpu, at)) = held.take() {
        w.checked_page(cpu, &held.page, at, &times, plan);
    }
    let ChannelWriter {
        out,
        mut acc,
        by_name,
        missed,
        err,
        ..
    } = w;
    err?;
    acc.bad_pages = acc.bad_pages.saturating_add(bad);
    account(&mut acc, stats, missed);
    acc.lost_clamped = acc.lost > CTF_DISCARDED_MAX;
    acc.ts_clamped = out.clamped();
    out.finish(acc.cpu, acc.lost)?;
    Ok((acc, by_name))
}

/// A page kept until the relay's next event on its channel, whose time
/// says when the relay had read it ([`PageTimes`]): one page's copy at a
/// time, in a buffer reused for the channel.
#[derive(Default)]
struct HeldPage {
    /// The page's CPU and the time of its own event, while one is held.
    held: Option<(u32, u64)>,
    page: Vec<u8>,
}

impl HeldPage {
    fn hold(&mut self, cpu: u32, at: u64, page: &[u8]) {
        self.page.clear();
        self.page.extend_from_slice(page);
        self.held = Some((cpu, at));
    }

    /// The held page's CPU and time (its bytes stay in `page` until the
    /// next `hold`).
    fn take(&mut self) -> Option<(u32, u64)> {
        self.held.take()
    }
}

/// What pass 2 decodes with: the page layout, the decoder of the classes
/// declared, the class name of each ftrace type.
struct Plan {
    hp: HeaderPage,
    dec: Decoder,
    names: HashMap<u16, String>,
}

/// One channel's output while pass 2 writes it.
struct ChannelWriter {
    out: StreamOut,
    acc: FtraceCpu,
    by_name: BTreeMap<String, u64>,
    missed: u64,
    payload: Vec<u8>,
    err: io::Result<()>,
    /// Ticks to the kernel trace's nanoseconds.
    clock: ClockMapping,
}

impl ChannelWriter {
    /// The page's records if their times are acceptable (the relay had
    /// read it by `read_by`), else counted lost.
    fn checked_page(&mut self, cpu: u32, p: &[u8], read_by: u64, times: &PageTimes, plan: &Plan) {
        match times.check(p, &plan.hp, read_by) {
            Ok(()) => self.page(cpu, p, plan),
            Err(n) => {
                self.acc.pages_out_of_time = self.acc.pages_out_of_time.saturating_add(1);
                self.acc.events_out_of_time = self.acc.events_out_of_time.saturating_add(n);
            }
        }
    }

    /// The records of one page, written as events of the CPU's stream.
    fn page(&mut self, cpu: u32, p: &[u8], plan: &Plan) {
        self.acc.cpu = cpu;
        self.acc.pages = self.acc.pages.saturating_add(1);
        // The page's lost events came before its first one.
        let missed = page::missed_before(p, &plan.hp).0.unwrap_or(0);
        self.missed = self.missed.saturating_add(missed);
        self.out.set_discarded(self.missed);
        let info = page::walk(p, &plan.hp, |ts, rec| self.record(cpu, ts, rec, plan));
        self.acc.bad_pages = self.acc.bad_pages.saturating_add(u64::from(info.malformed));
    }

    fn record(&mut self, cpu: u32, ts: u64, rec: &[u8], plan: &Plan) {
        let Some(d) = plan.dec.decode(rec) else {
            self.acc.unknown_type = self.acc.unknown_type.saturating_add(1);
            return;
        };
        // The page check kept its records within what the clock expresses,
        // so this is a guard: a record the clock cannot place is lost.
        let Some(ns) = self.clock.ns_value(ts) else {
            self.acc.events_out_of_time = self.acc.events_out_of_time.saturating_add(1);
            return;
        };
        self.payload.clear();
        self.payload.extend_from_slice(&d.tid.to_le_bytes());
        self.payload.extend_from_slice(&d.payload);
        if self.err.is_ok() {
            self.err = self.out.event(cpu, d.class_id, ns, &self.payload);
        }
        self.acc.recorded = self.acc.recorded.saturating_add(1);
        if let Some(n) = plan.dec.type_of(rec).and_then(|t| plan.names.get(&t)) {
            let count = self.by_name.entry(n.clone()).or_default();
            *count = count.saturating_add(1);
        }
    }
}

/// Losses of one CPU from its last counters (or the pages' marks alone).
/// Records of pages refused for their times are lost too: ftrace counted
/// them as read, so they are part of `read - recorded`; without counters
/// they are added to the pages' marks.
fn account(acc: &mut FtraceCpu, stats: Option<[u64; abi::IVT_FTRACE_STAT_COUNT]>, missed: u64) {
    let marked = missed.saturating_add(acc.events_out_of_time);
    let Some(s) = stats else {
        acc.no_stats = true;
        acc.lost = marked;
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
    .max(marked);
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
    let (classes, dec, names) = plan_classes(&cat, &fp.counts);
    let (symbols, symbols_refused) = keep_symbols(input, &fp)?;
    let mut stats = FtraceStats {
        formats: cat.parsed,
        formats_refused: cat.refused,
        classes: classes.len() as u64,
        symbols,
        symbols_refused,
        ..FtraceStats::default()
    };
    let plan = Plan { hp, dec, names };
    let out = input.out_dir()?;
    for f in input.files {
        let (cpu, by_name) = write_channel(input, &out, f, &plan)?;
        for (name, n) in by_name {
            let count = stats.events_by_name.entry(name).or_default();
            *count = count.saturating_add(n);
        }
        stats.cpus.push(cpu);
    }
    stats.seconds = started.elapsed().as_secs_f64();
    let formats = cat.formats_of(plan.names.keys());
    Ok(FtraceOutput {
        classes,
        stats,
        formats,
    })
}
