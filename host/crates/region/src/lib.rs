//! ivtrace-region: the host's reader of an ivtrace shared-memory region.
//!
//! Every byte of the region is hostile input. [`region`] maps and validates
//! the header into typed errors; [`meta`] parses the writers' event
//! descriptions into [`classes`]; [`reader`] copies packets out of the
//! channels and checks each copy with [`packet`] before handing it to a
//! [`reader::PacketSink`]. [`protocol`] is the host's half of the
//! shared-memory protocol (drain positions, the sleep handshake, control
//! commands, clock sync, statistics): the only code that reads or writes a
//! control word, each access with its ordering. [`abi`] is the checked
//! mirror of `abi/include/ivtrace/abi.h`; [`bytes`] the little-endian
//! readers (checked ones for guest input). [`names`] reads the thread name table a
//! kernel writer keeps in the metadata area (crash salvage); [`ftrace`]
//! keeps the guest's ftrace format files the relay publishes there;
//! [`kallsyms`] parses the kernel symbols it sends (`ftrace_symbols`);
//! [`forward`] reads the stream an L1 guest forwards for its own guest
//! (nested tracing).
//!
//! ```no_run
//! use ivtrace_region::{packet::TickRange, region::{Access, Region}, reader::Reader};
//! let region = Region::open("/dev/shm/x".as_ref(), Access::ReadOnly)?;
//! // What the trace's clock can express: ivtrace-time's
//! // `ClockMapping::expressible()`.
//! let reader = Reader::new(region, TickRange::ALL);
//! # Ok::<(), ivtrace_region::region::RegionError>(())
//! ```

// Every byte of a region is guest input: arithmetic is checked, saturating
// or wrapping by intent, narrowing casts explicit (docs/hardening.md,
// "Arithmetic on guest values"); the exceptions are annotated one by one.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

pub mod abi;
pub mod bytes;
pub mod classes;
pub mod forward;
pub mod ftrace;
pub mod kallsyms;
pub mod meta;
pub mod names;
pub mod ns;
pub mod packet;
pub mod protocol;
pub mod reader;
pub mod region;
pub mod retime;
pub mod sanitize;
pub mod sigbus;

pub use classes::{EventClass, EventClasses, Field, FieldType, StreamClasses};
pub use protocol::{Ack, Command, ControlError, FtraceAck, FtraceError, Protocol};
pub use reader::{PacketSink, Reader};
pub use region::{Access, Header, Region, RegionError};
