//! Finishing a recording whose recorder stopped without finalizing it
//! (SIGKILL, a crash, a power cut): `ivtrace recover DIR`, and the first
//! step of `ivtrace record --resume`.
//!
//! A recording writes whole packets with write(2), but a write the kernel
//! cut short (a fatal signal arrives between two pages, the machine stops)
//! can leave the last packet of a stream file incomplete, and babeltrace2
//! refuses a whole trace for one incomplete packet. The kernel stream is
//! still in its wire form in `.kernel-wire/`. Recovery:
//!
//! 1. reads the sidecar the recording wrote while it ran (`state:
//!    recording`: the event layouts, the clock, the env);
//! 2. cuts every stream file (user and staged kernel) back to its last
//!    whole, well-formed packet ([`scan`]);
//! 3. expands the staged kernel stream into `kernel/` with its metadata
//!    (a `kernel/` left half-written by a killed expansion is redone);
//! 4. writes the sidecar again, `state: recovered`, with what the stream
//!    files hold: events, packets, and the losses their last packets
//!    declare (`lost.unattributed`: the reasons died with the recorder).
//!
//! Everything is done through directory descriptors ([`crate::outdir`]),
//! so recovering a directory another user can write is as safe as
//! recording into it.

use std::io;

use ivtrace_region::abi;
use ivtrace_region::classes::EventClasses;
use ivtrace_region::names::NameTable;
use ivtrace_region::packet::PacketHeader;
use ivtrace_region::reader::walk_own_packet;

use crate::dir::read_sidecar;
use crate::kernel::{self, Staged, STAGING_DIR, WIRE_METADATA};
use crate::outdir::{EntryKind, OutDir};
use crate::sidecar::{ChannelSummary, Sidecar, StreamLayout, STATE_RECOVERED};
use crate::trace::{create_err, stream_dir, write_err, write_json, CtfError, NO_CHANNEL_FILE};
use crate::tsdl::{self, Timebase, TraceDesc};

/// One whole packet of a stream file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketAt {
    pub offset: u64,
    pub header: PacketHeader,
}

/// What a stream file holds: its whole packets and where they end.
#[derive(Debug, Clone, Default)]
pub struct Scanned {
    pub packets: Vec<PacketAt>,
    /// Bytes of whole packets (the file is cut here).
    pub whole: u64,
    /// Bytes after them (an incomplete or malformed packet, cut away).
    pub cut: u64,
}

/// Walks the packet headers of a stream file: whole, well-formed packets
/// (magic, sizes within bounds and the file, sequence numbers rising).
pub fn scan(file: &std::fs::File) -> io::Result<Scanned> {
    let len = file.metadata()?.len();
    let mut out = Scanned::default();
    let mut hdr = [0u8; abi::PACKET_HDR_SIZE];
    let mut last_seq: Option<u64> = None;
    while out.whole + abi::PACKET_HDR_SIZE as u64 <= len {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(&mut hdr, out.whole)?;
        let h = PacketHeader::parse(&hdr);
        let size = h.packet_size / 8;
        let sane = h.magic == abi::IVT_CTF_MAGIC
            && h.packet_size.is_multiple_of(8)
            && size >= abi::PACKET_HDR_SIZE as u64
            && size <= abi::IVT_SUBBUF_MAX as u64
            && h.content_size <= h.packet_size
            && out.whole + size <= len
            && last_seq.is_none_or(|s| h.packet_seq_num >= s);
        if !sane {
            break;
        }
        last_seq = Some(h.packet_seq_num);
        out.packets.push(PacketAt {
            offset: out.whole,
            header: h,
        });
        out.whole += size;
    }
    out.cut = len - out.whole;
    Ok(out)
}

/// Keeps only the packets of `s` with a sequence number below `seq` (a
/// resumed recording re-reads the others from the region).
pub fn keep_below(s: &mut Scanned, seq: u64) {
    let keep = s
        .packets
        .iter()
        .take_while(|p| p.header.packet_seq_num < seq)
        .count();
    let end = s.packets.get(keep).map_or(s.whole, |p| p.offset);
    s.cut += s.whole - end;
    s.whole = end;
    s.packets.truncate(keep);
}

/// Cuts `dir/name` to its whole packets (and, with `below`, to the packets
/// numbered below it). Returns what it keeps.
pub fn cut_stream_file(dir: &OutDir, name: &str, below: Option<u64>) -> io::Result<Scanned> {
    let f = dir.open_rw(name)?;
    let mut s = scan(&f)?;
    if let Some(seq) = below {
        keep_below(&mut s, seq);
    }
    if s.cut > 0 {
        f.set_len(s.whole)?;
    }
    Ok(s)
}

/// The channel number in a stream file name (`user_chan12` -> 12;
/// `ftrace_chan2`: the ftrace relay's staged pages).
pub fn channel_of(name: &str) -> Option<u32> {
    let (_, n) = name.rsplit_once("_chan")?;
    n.parse().ok().filter(|_| {
        name.starts_with("user_chan")
            || name.starts_with("kernel_chan")
            || name.starts_with("ftrace_chan")
    })
}

/// Staged ftrace pages (`.kernel-wire/ftrace_chanN`) in `staging`.
fn ftrace_staged(staging: &OutDir) -> usize {
    let names = staging.entries().unwrap_or_default();
    names
        .iter()
        .filter(|n| n.starts_with("ftrace_chan"))
        .count()
}

/// What recovery did, per stream file.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// (relative path, packets kept, bytes cut).
    pub files: Vec<(String, u64, u64)>,
    pub kernel_expanded: bool,
    /// Channels of ftrace pages left staged in `.kernel-wire/`: decoding
    /// them needs the guest's format files, which only the region holds
    /// (docs/ftrace.md), so recovery keeps them rather than delete them.
    pub ftrace_kept: usize,
    pub sidecar: Sidecar,
}

/// Recovers the recording in `root` (see the module documentation).
/// `reason` says why (it goes into the sidecar's `stop_reason`).
pub fn recover(root: &OutDir, reason: &str) -> Result<Recovered, CtfError> {
    let before = read_sidecar(root)?;
    let classes = before.event_classes();
    let mut done = Recovered::default();
    for stream in [abi::IVT_STREAM_USER, abi::IVT_STREAM_KERNEL] {
        let dir_name = crate::dir::recording_dir(stream);
        cut_dir(root, dir_name, &mut done)?;
    }
    if root.kind(STAGING_DIR).ok().flatten() == Some(EntryKind::Dir) {
        expand_staged(root, &before, &classes, &mut done)?;
    }
    let mut sidecar = recovered_sidecar(root, before, &done, reason)?;
    if done.ftrace_kept > 0 {
        sidecar.warnings.push(format!(
            "{} channels of ftrace pages stay undecoded in {STAGING_DIR}/ (their formats are \
             in the guest's region, not in the recording)",
            done.ftrace_kept
        ));
    }
    write_json(root, &sidecar)?;
    done.sidecar = sidecar;
    Ok(done)
}

fn cut_dir(root: &OutDir, dir_name: &str, done: &mut Recovered) -> Result<(), CtfError> {
    let Ok(dir) = root.open_dir(dir_name) else {
        return Ok(());
    };
    let mut names = dir.entries().map_err(create_err(dir.path().display()))?;
    names.sort();
    // The no-channel stream's packets are whole packets too (its losses
    // are the sidecar's lost_no_channel).
    let stream_file = |n: &&String| channel_of(n).is_some() || *n == NO_CHANNEL_FILE;
    for name in names.iter().filter(stream_file) {
        let s = cut_stream_file(&dir, name, None).map_err(write_err(dir.join(name).display()))?;
        done.files
            .push((format!("{dir_name}/{name}"), s.packets.len() as u64, s.cut));
    }
    Ok(())
}

/// Pass 1 + 2 of the kernel expansion over the staged files, then the
/// kernel trace's metadata from the sidecar's clock and env.
fn expand_staged(
    root: &OutDir,
    before: &Sidecar,
    classes: &EventClasses,
    done: &mut Recovered,
) -> Result<(), CtfError> {
    let staging = root
        .open_dir(STAGING_DIR)
        .map_err(create_err(root.join(STAGING_DIR).display()))?;
    let kernel_dir = stream_dir(abi::IVT_STREAM_KERNEL);
    root.remove_tree(kernel_dir)
        .map_err(write_err(root.join(kernel_dir).display()))?;
    let mut staged: Vec<Staged> = staging
        .entries()
        .map_err(create_err(staging.path().display()))?
        .iter()
        .filter(|n| n.starts_with("kernel_chan"))
        .filter_map(|n| channel_of(n))
        .map(Staged::channel)
        .collect();
    staged.sort_by_key(|s| s.chan);
    done.ftrace_kept = ftrace_staged(&staging);
    if staged.is_empty() && done.ftrace_kept > 0 {
        // Only ftrace pages: no kernel trace to make.
        return Ok(());
    }
    let wire = classes.stream(abi::IVT_STREAM_KERNEL);
    let at = (&staged[..], &before.clock);
    let (expanded, out) = kernel::expand_dir(root, &staging, wire, at, &NameTable::default())?;
    let env = before.env.clone().unwrap_or_default().to_env();
    let uuid = parse_uuid(&before.trace_uuid).unwrap_or_default();
    let (_, kernel_uuid, clock_uuid) = crate::trace::trace_uuid_strings(uuid);
    let desc = TraceDesc {
        uuid: &kernel_uuid,
        clock_uuid: &clock_uuid,
        clock: &before.clock,
        timebase: Timebase::Nanoseconds,
        env: &env,
    };
    let text = tsdl::metadata(&desc, abi::IVT_STREAM_KERNEL, &expanded.classes);
    out.write_atomically("metadata", text.as_bytes())
        .map_err(write_err(out.join("metadata").display()))?;
    let _ = staging.remove_file(WIRE_METADATA);
    if done.ftrace_kept == 0 {
        kernel::remove_staging(root);
    } else {
        for s in &staged {
            let _ = staging.remove_file(&s.name);
        }
    }
    done.kernel_expanded = true;
    done.sidecar.kernel_expansion = Some(expanded.stats);
    done.sidecar.streams.push(StreamLayout::from_classes(
        abi::IVT_STREAM_KERNEL,
        kernel_dir,
        &expanded.classes,
    ));
    Ok(())
}

/// `8-4-4-4-12` hex back to 16 bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(b)
}

/// The sidecar of the recovered trace: layouts as they are now, channels
/// as their files say.
fn recovered_sidecar(
    root: &OutDir,
    before: Sidecar,
    done: &Recovered,
    reason: &str,
) -> Result<Sidecar, CtfError> {
    let mut streams: Vec<StreamLayout> = before
        .streams
        .iter()
        .filter(|s| s.stream_class != abi::IVT_STREAM_KERNEL || !done.kernel_expanded)
        .cloned()
        .collect();
    streams.extend(done.sidecar.streams.iter().cloned());
    streams.sort_by_key(|s| s.stream_class);
    let mut after = Sidecar {
        state: STATE_RECOVERED.into(),
        stop_reason: format!("{reason} (was: {})", before.stop_reason),
        streams,
        kernel_expansion: done
            .sidecar
            .kernel_expansion
            .clone()
            .or(before.kernel_expansion.clone()),
        ..before
    };
    let classes = after.event_classes();
    after.channels = count_channels(root, &classes)?;
    Ok(after)
}

/// Every stream file's counters, walked with the output classes.
pub fn count_channels(
    root: &OutDir,
    classes: &EventClasses,
) -> Result<Vec<ChannelSummary>, CtfError> {
    let mut out = Vec::new();
    for stream in [abi::IVT_STREAM_KERNEL, abi::IVT_STREAM_USER] {
        let name = stream_dir(stream);
        let Ok(dir) = root.open_dir(name) else {
            continue;
        };
        let mut files: Vec<(u32, String)> = dir
            .entries()
            .map_err(create_err(dir.path().display()))?
            .into_iter()
            .filter_map(|n| Some((channel_of(&n)?, n)))
            .collect();
        files.sort();
        for (chan, file) in files {
            let f = dir
                .open_read(&file)
                .map_err(create_err(dir.join(&file).display()))?;
            let summary = count_file(&f, classes).map_err(write_err(dir.join(&file).display()))?;
            out.push(ChannelSummary {
                channel: chan,
                stream_class: stream,
                file: Some(format!("{name}/{file}")),
                ..summary
            });
        }
    }
    out.sort_by_key(|c| c.channel);
    Ok(out)
}

pub fn count_file(f: &std::fs::File, classes: &EventClasses) -> io::Result<ChannelSummary> {
    use std::os::unix::fs::FileExt;
    let scanned = scan(f)?;
    let mut c = ChannelSummary::default();
    let mut buf = Vec::new();
    for p in &scanned.packets {
        buf.resize((p.header.packet_size / 8) as usize, 0);
        f.read_exact_at(&mut buf, p.offset)?;
        c.packets += 1;
        c.bytes += buf.len() as u64;
        c.lost.unattributed = p.header.events_discarded;
        if let Ok((h, s)) = walk_own_packet(&mut buf, classes, &mut ()) {
            c.events += s.events;
            if s.events > 0 {
                c.first_ts.get_or_insert(h.timestamp_begin);
                c.last_ts = Some(s.last_ts);
            }
        }
    }
    Ok(c)
}
