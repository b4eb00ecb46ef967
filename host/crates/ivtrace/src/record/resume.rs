//! `ivtrace record --resume`: going on with a recording whose recorder
//! died, so that every packet lands in the trace exactly once.
//!
//! A recorder hands a sub-buffer back to the writer (`consumed`) only
//! after write(2) of its packet returned, so when it dies:
//!
//! - every packet numbered below `consumed` is in its stream file (the
//!   page cache keeps what write(2) took, whatever kills the process);
//! - packets from `consumed` on may or may not be in the file (written,
//!   not yet handed back; a committed prefix flushed at a stop; a write
//!   cut short by the kill), and in discard mode the writer has not
//!   reused their sub-buffers: the region still holds every one of them.
//!
//! So a resumed recording cuts each stream file back to its whole packets
//! numbered below `consumed` and reads the region from `consumed` on, as
//! any recorder would: nothing is lost, nothing is written twice, and the
//! running loss counts go on from the last packet kept (CTF readers see
//! them rise, never fall).

use std::path::Path;

use anyhow::{Context, Result};

use ivtrace_ctf::dir::StreamFile;
use ivtrace_ctf::recover::{count_file, cut_stream_file};
use ivtrace_ctf::trace::{stream_dir, NO_CHANNEL_FILE};
use ivtrace_ctf::{CtfWriter, OutDir, OutputPolicy};
use ivtrace_region::meta::ScanMode;
use ivtrace_region::ns::NsScale;
use ivtrace_region::{abi, EventClasses, Reader};

/// Opens DIR, which must hold a recording that was not finalized (its
/// recorder died) or is incomplete (its output failed).
pub fn open(dir: &Path, policy: &OutputPolicy) -> Result<OutDir> {
    Ok(ivtrace_ctf::dir::open_interrupted(dir, policy)?)
}

/// Adopts DIR's stream files for the region `reader` reads (the same
/// region: same uuid), cut back to what the region no longer holds, and
/// starts each channel after them.
pub fn continue_recording(out: &OutDir, reader: &mut Reader, writer: &mut CtfWriter) -> Result<()> {
    let uuid = reader.region().header().uuid_string();
    let before = ivtrace_ctf::dir::resume(out, &uuid)?;
    // The earlier run wrote its user times with the mapping it measured.
    let earlier = before.clock.ns_scale();
    reader.scan_metadata(ScanMode::Live);
    let classes = before.event_classes();
    let mut adopted = Vec::new();
    let (mut packets, mut cut) = (0u64, 0u64);
    let layout = reader.region().layout();
    for f in ivtrace_ctf::dir::stream_files(out, reader.nr_channels(), |c| layout.stream_of(c))? {
        // The relay's staged pages are counted with the region's wire
        // classes (the sidecar declares the decoded ones only).
        let classes = match f.stream == abi::IVT_STREAM_FTRACE {
            true => reader.classes().clone(),
            false => classes.clone(),
        };
        let (len, kept, dropped) = adopt_file(&f, reader, &classes, earlier)?;
        packets += kept;
        cut += dropped;
        adopted.push((f.chan, f.stream, len));
    }
    if let Some(len) = adopt_no_channel(out, reader)? {
        adopted.push((reader.no_channel_stream(), abi::IVT_STREAM_USER, len));
    }
    writer.adopt(&adopted, reader.classes())?;
    eprintln!(
        "ivtrace: resuming {}: {} stream files, {packets} packets kept, {cut} bytes cut \
         (read again from the region)",
        out.path().display(),
        adopted.len()
    );
    Ok(())
}

/// The no-channel stream's file (`user/user_no_channel`), cut to whole
/// packets; its count and sequence continue after its last packet.
/// Returns its length, if it exists.
fn adopt_no_channel(out: &OutDir, reader: &mut Reader) -> Result<Option<u64>> {
    let Ok(dir) = out.open_dir(stream_dir(abi::IVT_STREAM_USER)) else {
        return Ok(None);
    };
    if dir.kind(NO_CHANNEL_FILE)?.is_none() {
        return Ok(None);
    }
    let scanned = cut_stream_file(&dir, NO_CHANNEL_FILE, None).with_context(|| {
        format!(
            "cannot cut {} back to whole packets",
            dir.join(NO_CHANNEL_FILE).display()
        )
    })?;
    if let Some(last) = scanned.packets.last() {
        reader.resume_no_channel(&last.header);
    }
    Ok(Some(scanned.whole))
}

/// Cuts one stream file and starts its channel after it (user times read
/// back with `earlier`, the mapping that wrote them); returns the bytes
/// kept, the packets kept and the bytes cut.
fn adopt_file(
    file: &StreamFile,
    reader: &mut Reader,
    classes: &EventClasses,
    earlier: NsScale,
) -> Result<(u64, u64, u64)> {
    let (dir, name, c) = (&file.dir, file.name.as_str(), file.chan);
    let consumed = reader.region().protocol().consumed(c);
    let shown = dir.join(name).display().to_string();
    let scanned = cut_stream_file(dir, name, Some(consumed))
        .with_context(|| format!("cannot cut {shown} back to whole packets"))?;
    if let Some(last) = scanned.packets.last() {
        let f = dir
            .open_read(name)
            .with_context(|| format!("cannot read {shown}"))?;
        let counted = count_file(&f, classes).with_context(|| format!("cannot read {shown}"))?;
        let written = (counted.events, counted.packets, counted.bytes);
        reader.resume_channel(c, &last.header, written, earlier);
    }
    Ok((scanned.whole, scanned.packets.len() as u64, scanned.cut))
}
