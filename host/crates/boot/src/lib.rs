//! ivtrace-boot: the boot of a traced guest, from its kernel trace.
//!
//! - [`levels`]: the initcall levels and which one an initcall is in;
//! - [`events`]: the events the analysis reads, out of the trace's records;
//! - [`scan`]: pass 1, the boot's timeline (phases, initcalls, marks,
//!   what ran on each vCPU);
//! - [`profile`]: pass 2, function_graph's calls aggregated;
//! - [`stream`]: both as derived streams of the kernel trace, and back;
//! - [`derive`](mod@derive): all of it at the end of a recording;
//! - [`report`]: `ivtrace boot`'s numbers and text; [`chart`]: its SVG;
//! - [`model`]: the plain values.
pub mod chart;
pub mod derive;
pub mod events;
pub mod levels;
pub mod model;
pub mod profile;
pub mod report;
pub mod scan;
pub mod stream;
