//! What the fuzz targets share.

use ivtrace_ctf::ClockMapping;

/// Bytes of input [`mapping_from`] reads.
pub const MAPPING_BYTES: usize = 24;

/// A clock mapping picked by the fuzzer from the last [`MAPPING_BYTES`] of
/// its input (zeros where the input is shorter), so the checks of guest
/// timestamps run against any frequency (1 Hz to ~17 GHz), reference tick
/// and date, not one fixed clock: a mapping is host state, but every
/// range computed from it meets hostile ticks.
pub fn mapping_from(data: &[u8]) -> ClockMapping {
    let mut b = [0u8; MAPPING_BYTES];
    let tail = &data[data.len().saturating_sub(MAPPING_BYTES)..];
    b[..tail.len()].copy_from_slice(tail);
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    ClockMapping {
        // Never 0 (the mapping's constructors refuse it); up to 2^34 Hz.
        freq_hz: (word(0) >> 30).max(1),
        ref_ticks: word(8),
        ref_realtime_ns: word(16),
        error_ns: 1_000,
        method: "fuzz".into(),
        coarse: false,
        samples: 8,
    }
}
