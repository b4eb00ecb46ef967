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

use anyhow::{bail, Context, Result};

use ivtrace_ctf::kernel::STAGING_DIR;
use ivtrace_ctf::recover::{channel_of, count_file, cut_stream_file, read_sidecar};
use ivtrace_ctf::sidecar::{STATE_INCOMPLETE, STATE_RECORDING};
use ivtrace_ctf::trace::{stream_dir, stream_file_name, NO_CHANNEL_FILE};
use ivtrace_ctf::{CtfWriter, OutDir, OutputPolicy};
use ivtrace_engine::{session, UserError};
use ivtrace_region::meta::ScanMode;
use ivtrace_region::{abi, EventClasses, Reader};

/// Opens DIR, which must hold a recording that was not finalized (its
/// recorder died) or is incomplete (its output failed).
pub fn open(dir: &Path, policy: &OutputPolicy) -> Result<OutDir> {
    let root = session::open_root(dir, policy)?;
    let sidecar = read_sidecar(&root).map_err(|e| UserError {
        message: format!("--resume: {e}"),
        hint: "--resume goes on with a recording in DIR; without one, drop --resume".into(),
    })?;
    if sidecar.state != STATE_RECORDING && sidecar.state != STATE_INCOMPLETE {
        return Err(UserError {
            message: format!(
                "--resume: the recording in {} is {} ({}), not interrupted",
                dir.display(),
                sidecar.state,
                sidecar.stop_reason
            ),
            hint: "record into a new directory (or --force to replace this one)".into(),
        }
        .into());
    }
    Ok(root)
}

/// Adopts DIR's stream files for the region `reader` reads (the same
/// region: same uuid), cut back to what the region no longer holds, and
/// starts each channel after them.
pub fn continue_recording(out: &OutDir, reader: &mut Reader, writer: &mut CtfWriter) -> Result<()> {
    let before = read_sidecar(out)?;
    let uuid = reader.region().header().uuid_string();
    if before.trace_uuid != uuid {
        bail!(UserError {
            message: format!(
                "--resume: {} holds a recording of region {}, but the region is now {uuid} \
                 (re-formatted, or another region)",
                out.path().display(),
                before.trace_uuid
            ),
            hint: "record the new region into a new directory".into(),
        });
    }
    if out.kind(STAGING_DIR)?.is_some() {
        // A kernel expansion the recorder did not finish: redone at the end.
        out.remove_tree(stream_dir(abi::IVT_STREAM_KERNEL))?;
    }
    reader.scan_metadata(ScanMode::Live);
    let classes = before.event_classes();
    let mut adopted = Vec::new();
    let (mut packets, mut cut) = (0u64, 0u64);
    for stream in [
        abi::IVT_STREAM_USER,
        abi::IVT_STREAM_KERNEL,
        abi::IVT_STREAM_FTRACE,
    ] {
        let dir_name = match stream {
            abi::IVT_STREAM_KERNEL | abi::IVT_STREAM_FTRACE => STAGING_DIR,
            _ => stream_dir(stream),
        };
        let Ok(dir) = out.open_dir(dir_name) else {
            continue;
        };
        for name in dir.entries()? {
            let Some(c) = channel_of(&name).filter(|&c| c < reader.nr_channels()) else {
                continue;
            };
            if name != stream_file_name(stream, c)
                || reader.region().layout().stream_of(c) != stream
            {
                continue;
            }
            // The relay's staged pages are counted with the region's
            // wire classes (the sidecar declares the decoded ones only).
            let classes = match stream == abi::IVT_STREAM_FTRACE {
                true => reader.classes().clone(),
                false => classes.clone(),
            };
            let (len, kept, dropped) = adopt_file(&dir, &name, c, reader, &classes)?;
            packets += kept;
            cut += dropped;
            adopted.push((c, stream, len));
        }
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

/// Cuts one stream file and starts its channel after it; returns the
/// bytes kept, the packets kept and the bytes cut.
fn adopt_file(
    dir: &OutDir,
    name: &str,
    c: u32,
    reader: &mut Reader,
    classes: &EventClasses,
) -> Result<(u64, u64, u64)> {
    let consumed = reader.region().protocol().consumed(c);
    let shown = dir.join(name).display().to_string();
    let scanned = cut_stream_file(dir, name, Some(consumed))
        .with_context(|| format!("cannot cut {shown} back to whole packets"))?;
    if let Some(last) = scanned.packets.last() {
        let f = dir
            .open_read(name)
            .with_context(|| format!("cannot read {shown}"))?;
        let counted = count_file(&f, classes).with_context(|| format!("cannot read {shown}"))?;
        reader.resume_channel(
            c,
            &last.header,
            counted.events,
            counted.packets,
            counted.bytes,
        );
    }
    Ok((scanned.whole, scanned.packets.len() as u64, scanned.cut))
}
