//! ivtrace-time: where guest time becomes host time.
//!
//! Writers timestamp events with their TSC; the host maps those ticks
//! onto one host time base ([`timebase`]: CLOCK_MONOTONIC shifted onto
//! CLOCK_REALTIME), so guest and host streams share a timeline. The result
//! is a [`ClockMapping`] (a line with an error bound, [`mapping`]); how it
//! is obtained is a [`ClockEstimator`]:
//!
//! - [`estimator`]: the loopback TSC fit (writers on this host read the
//!   host's TSC) and the region header's reference pair (coarse);
//! - [`kvm`]: KVM's TSC offset and scaling from debugfs, composed with a
//!   fit of the host's TSC;
//! - [`versioned`]: KVM's parameters as versions that follow
//!   `kvm_write_tsc_offset`, with the one exact ticks -> host ns conversion;
//! - [`pingpong`]: the clock exchange through the region's sync mailbox
//!   (TCG, or KVM without debugfs): bursts of round trips with a writer
//!   that spins, the minimum-round-trip point of each kept;
//! - [`fit`]: the line through those points and its bound over the
//!   recording;
//! - [`guest`]: the combination a served guest uses.
//!
//! A recording drives its clock through [`ClockSync`]: the mapping to
//! write with, exchanges while recording, the final mapping.

pub mod estimator;
pub mod fit;
pub mod guest;
pub mod kvm;
pub mod mapping;
pub mod pingpong;
pub mod realtime;
pub mod timebase;
pub mod versioned;

pub use estimator::{estimator_for, ClockEstimator, ClockSync};
pub use guest::GuestClock;
pub use mapping::ClockMapping;
