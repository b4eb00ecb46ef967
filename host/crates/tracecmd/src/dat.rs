//! The trace-cmd file container, version 7 (`man trace-cmd.dat.v7`), as
//! trace-cmd 3.x writes it uncompressed:
//!
//! ```text
//! 17 08 44 "tracing" "7\0" endian(0) long-size(8) page-size(u32) "none\0" "\0"
//! u64 offset of the first options section
//! sections, each: u16 id | u16 flags | u32 description (strings offset) | u64 size | data
//!   16 headers        "header_page\0" u64 len text "header_event\0" u64 len text
//!   17 ftrace events  u32 n, n x (u64 len, format text)
//!   18 events format  u32 systems, per system: name\0 u32 n, n x (u64 len, format text)
//!   19 kallsyms       u32 len, text        20 printk   u32 len, text
//!   21 command lines  u64 len, "pid comm\n" lines
//!    3 flyrecord      padding, then each CPU's ring-buffer pages, page aligned
//!    0 options        u16 id | u32 size | data ..., DONE (u64 next options section: 0)
//!   15 strings        the descriptions, NUL-terminated
//! ```
//!
//! trace-cmd finds every section's strings by walking the sections one
//! after the other from the end of the header, so they follow each other
//! with exact sizes and nothing in between; the options point at the
//! other sections by offset. Everything is little-endian, longs 8 bytes.

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};

/// The ring buffer's page size the files declare.
pub const PAGE_SIZE: u32 = 4096;

/// Option and section ids (trace-cmd's `enum tracecmd_file_options`).
pub mod opt {
    pub const DONE: u16 = 0;
    pub const CPUSTAT: u16 = 2;
    pub const BUFFER: u16 = 3;
    pub const TRACECLOCK: u16 = 4;
    pub const UNAME: u16 = 5;
    pub const CPUCOUNT: u16 = 8;
    pub const VERSION: u16 = 9;
    pub const TRACEID: u16 = 11;
    pub const TIME_SHIFT: u16 = 12;
    pub const GUEST: u16 = 13;
    pub const STRINGS: u16 = 15;
    pub const HEADER_INFO: u16 = 16;
    pub const FTRACE_EVENTS: u16 = 17;
    pub const EVENT_FORMATS: u16 = 18;
    pub const KALLSYMS: u16 = 19;
    pub const PRINTK: u16 = 20;
    pub const CMDLINES: u16 = 21;
}

/// Everything of a file but its ring-buffer pages.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    pub header_page: String,
    pub header_event: String,
    /// `events/ftrace/*/format`.
    pub ftrace_formats: Vec<String>,
    /// Per system, its events' format texts.
    pub systems: Vec<(String, Vec<String>)>,
    /// `saved_cmdlines`: "pid comm" lines.
    pub cmdlines: String,
    /// The trace clock's name (the BUFFER option's clock).
    pub clock: String,
    /// Options besides the sections' and the buffer's, in order.
    pub options: Vec<(u16, Vec<u8>)>,
}

/// One CPU's pages, in a file of their own until the container is written.
#[derive(Debug)]
pub struct CpuData {
    pub cpu: u32,
    pub file: File,
    pub len: u64,
}

/// A file being written: its position, its strings, its options.
struct Out<W: Write + Seek> {
    w: W,
    pos: u64,
    strings: Vec<u8>,
    options: Vec<(u16, Vec<u8>)>,
}

impl<W: Write + Seek> Out<W> {
    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.w.write_all(b)?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn string(&mut self, s: &str) -> u32 {
        let at = self.strings.len() as u32;
        self.strings.extend_from_slice(s.as_bytes());
        self.strings.push(0);
        at
    }

    /// A section's header; returns the position of its size field.
    fn section_start(&mut self, id: u16, desc: &str, option: bool) -> io::Result<u64> {
        if option {
            self.options.push((id, self.pos.to_le_bytes().to_vec()));
        }
        let d = self.string(desc);
        self.put(&id.to_le_bytes())?;
        self.put(&0u16.to_le_bytes())?;
        self.put(&d.to_le_bytes())?;
        let at = self.pos;
        self.put(&0u64.to_le_bytes())?;
        Ok(at)
    }

    /// Writes the size of the section whose size field is at `at`.
    fn section_end(&mut self, at: u64) -> io::Result<()> {
        let size = self.pos - at - 8;
        self.w.seek(SeekFrom::Start(at))?;
        self.w.write_all(&size.to_le_bytes())?;
        self.w.seek(SeekFrom::Start(self.pos))?;
        Ok(())
    }

    fn section(&mut self, id: u16, desc: &str, data: &[u8]) -> io::Result<()> {
        let at = self.section_start(id, desc, true)?;
        self.put(data)?;
        self.section_end(at)
    }
}

/// `u64 len` + text, for every text.
fn sized_texts(out: &mut Vec<u8>, texts: &[String]) {
    for t in texts {
        out.extend_from_slice(&(t.len() as u64).to_le_bytes());
        out.extend_from_slice(t.as_bytes());
    }
}

fn headers(m: &Meta) -> Vec<u8> {
    let mut d = Vec::new();
    for (name, text) in [
        ("header_page", &m.header_page),
        ("header_event", &m.header_event),
    ] {
        d.extend_from_slice(name.as_bytes());
        d.push(0);
        d.extend_from_slice(&(text.len() as u64).to_le_bytes());
        d.extend_from_slice(text.as_bytes());
    }
    d
}

fn event_formats(m: &Meta) -> Vec<u8> {
    let mut d = (m.systems.len() as u32).to_le_bytes().to_vec();
    for (system, formats) in &m.systems {
        d.extend_from_slice(system.as_bytes());
        d.push(0);
        d.extend_from_slice(&(formats.len() as u32).to_le_bytes());
        sized_texts(&mut d, formats);
    }
    d
}

fn u32_text(t: &str) -> Vec<u8> {
    let mut d = (t.len() as u32).to_le_bytes().to_vec();
    d.extend_from_slice(t.as_bytes());
    d
}

/// Writes the whole file to `w`: metadata sections, then every CPU's pages.
pub fn write(w: impl Write + Seek, m: &Meta, cpus: &mut [CpuData]) -> io::Result<()> {
    let mut o = Out {
        w: BufWriter::with_capacity(1 << 20, w),
        pos: 0,
        strings: Vec::new(),
        options: Vec::new(),
    };
    o.put(&[0x17, 0x08, 0x44])?;
    o.put(b"tracing7\0")?;
    o.put(&[0, 8])?;
    o.put(&PAGE_SIZE.to_le_bytes())?;
    o.put(b"none\0\0")?;
    let options_at = o.pos;
    o.put(&0u64.to_le_bytes())?;
    o.section(opt::HEADER_INFO, "headers", &headers(m))?;
    let mut ftrace = (m.ftrace_formats.len() as u32).to_le_bytes().to_vec();
    sized_texts(&mut ftrace, &m.ftrace_formats);
    o.section(opt::FTRACE_EVENTS, "ftrace events", &ftrace)?;
    o.section(opt::EVENT_FORMATS, "events format", &event_formats(m))?;
    o.section(opt::KALLSYMS, "kallsyms", &u32_text(""))?;
    o.section(opt::PRINTK, "printk", &u32_text(""))?;
    let mut cmd = (m.cmdlines.len() as u64).to_le_bytes().to_vec();
    cmd.extend_from_slice(m.cmdlines.as_bytes());
    o.section(opt::CMDLINES, "command lines", &cmd)?;
    let buffer = flyrecord(&mut o, m, cpus)?;
    o.options.push((opt::BUFFER, buffer));
    o.options.extend(m.options.iter().cloned());
    let options = o.pos;
    let at = o.section_start(opt::DONE, "options", false)?;
    for (id, data) in std::mem::take(&mut o.options) {
        o.put(&id.to_le_bytes())?;
        o.put(&(data.len() as u32).to_le_bytes())?;
        o.put(&data)?;
    }
    o.put(&opt::DONE.to_le_bytes())?;
    o.put(&8u32.to_le_bytes())?;
    o.put(&0u64.to_le_bytes())?;
    o.section_end(at)?;
    let at = o.section_start(opt::STRINGS, "strings", false)?;
    let strings = std::mem::take(&mut o.strings);
    o.put(&strings)?;
    o.section_end(at)?;
    o.w.seek(SeekFrom::Start(options_at))?;
    o.w.write_all(&options.to_le_bytes())?;
    o.w.flush()
}

/// The flyrecord section (the CPUs' pages, each page aligned) and the
/// BUFFER option's data that describes it.
fn flyrecord<W: Write + Seek>(
    o: &mut Out<W>,
    m: &Meta,
    cpus: &mut [CpuData],
) -> io::Result<Vec<u8>> {
    let start = o.pos;
    let at = o.section_start(opt::BUFFER, "buffer flyrecord ", false)?;
    let mut opt = start.to_le_bytes().to_vec();
    opt.push(0); // the top instance's name: ""
    opt.extend_from_slice(m.clock.as_bytes());
    opt.push(0);
    opt.extend_from_slice(&PAGE_SIZE.to_le_bytes());
    let with_data: Vec<&mut CpuData> = cpus.iter_mut().filter(|c| c.len > 0).collect();
    opt.extend_from_slice(&(with_data.len() as u32).to_le_bytes());
    let page = PAGE_SIZE as u64;
    for c in with_data {
        let pad = (page - o.pos % page) % page;
        o.put(&vec![0u8; pad as usize])?;
        opt.extend_from_slice(&c.cpu.to_le_bytes());
        opt.extend_from_slice(&o.pos.to_le_bytes());
        opt.extend_from_slice(&c.len.to_le_bytes());
        c.file.seek(SeekFrom::Start(0))?;
        let copied = io::copy(&mut (&mut c.file).take(c.len), &mut o.w)?;
        if copied != c.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("CPU {} pages: {copied} of {} bytes", c.cpu, c.len),
            ));
        }
        o.pos += copied;
    }
    o.section_end(at)?;
    Ok(opt)
}
