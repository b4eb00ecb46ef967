//! `ivtrace snapshot`: read-only salvage of a (flight-recorder) region.

use std::time::Instant;

use anyhow::{Context, Result};

use ivtrace_region::{Access, Reader, Region};

use crate::cli::SnapshotArgs;
use ivtrace_engine::session;

use crate::summary;

/// Runs `ivtrace snapshot`. Returns the events seen (salvaged + lost).
pub fn run(args: &SnapshotArgs) -> Result<u64> {
    let region = Region::open(&args.shm, Access::ReadOnly)
        .with_context(|| format!("cannot use region {}", args.shm.display()))?;
    let out = session::prepare_output(&args.output, args.force, &args.access.policy()?)?;
    let started = Instant::now();
    let mut estimator = ivtrace_time::estimator_for(region.header());
    let clock = estimator.finish();
    let host = session::host_name(&region, &args.shm, args.name.as_deref());
    let limits = ivtrace_ctf::streams::Limits::default();
    let mut writer = session::ctf_writer_named(&region, &out, &clock, &host, limits, "snapshot");
    let mut reader = Reader::new(region, clock.expressible());
    reader.set_user_clock(clock.ns_scale(), clock.expressible());
    reader.snapshot(&mut writer)?;
    // Names for the threads whose naming events the rings overwrote.
    if let Some(table) = ivtrace_region::names::read_thread_names(reader.region()) {
        writer.set_thread_name_table(table);
    }
    writer.finish(&clock, writer.env().clone(), reader.classes())?;
    let sidecar = session::build_sidecar(
        &reader,
        &writer,
        &args.shm,
        "snapshot",
        &clock,
        started.elapsed(),
        "snapshot taken",
    );
    writer.write_sidecar(&sidecar)?;
    summary::print(&sidecar, out.path(), args.json)?;
    Ok(session::events_seen(&sidecar))
}
