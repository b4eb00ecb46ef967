//! Little-endian integers in byte slices: the one place the host reads and
//! writes them.
//!
//! Two families, named apart so that a reader of a call site sees which
//! one it is:
//!
//! - `u16_at`, `u32_at`, `u64_at`, `i32_at`, `slice_at`, and `uint_at`,
//!   `int_at` for an integer of 1 to 8 bytes: **checked**. They
//!   return `None` when the slice is too short or the position overflows.
//!   Use them on anything a guest, a file or a client wrote: format files,
//!   ftrace pages, forwarded streams, trace files read back.
//! - `le_u16`, `le_u32`, `le_u64`, `put_u32`, `put_u64`: **panicking**, for
//!   slices whose length the caller has already established (a packet
//!   copy of a checked size, a buffer the host sized itself). A panic
//!   there is a bug in the host, never a guest's doing.

/// `len` bytes of `b` from `at`, or None past its end (or on overflow).
#[inline]
pub fn slice_at(b: &[u8], at: usize, len: usize) -> Option<&[u8]> {
    b.get(at..at.checked_add(len)?)
}

/// The `N` bytes of `b` from `at`, or None.
#[inline]
fn array_at<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    slice_at(b, at, N)?.try_into().ok()
}

/// `v` as a length or position, saturating: a value past `usize::MAX` (a
/// 32-bit host) becomes `usize::MAX`, which every bounds check after it
/// refuses. For lengths a guest wrote as u64.
#[inline]
pub fn usize_from(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// The little-endian u16 at `at`, or None when `b` is too short.
#[inline]
pub fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    array_at(b, at).map(u16::from_le_bytes)
}

/// The little-endian u32 at `at`, or None when `b` is too short.
#[inline]
pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    array_at(b, at).map(u32::from_le_bytes)
}

/// The little-endian i32 at `at`, or None when `b` is too short.
#[inline]
pub fn i32_at(b: &[u8], at: usize) -> Option<i32> {
    array_at(b, at).map(i32::from_le_bytes)
}

/// The little-endian u64 at `at`, or None when `b` is too short.
#[inline]
pub fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    array_at(b, at).map(u64::from_le_bytes)
}

/// The little-endian unsigned integer of `len` bytes (0 to 8) at `at`,
/// zero-extended to 64 bits; None when `b` is too short or `len` is past 8.
/// For fields whose width a format file or a class declares.
#[inline]
pub fn uint_at(b: &[u8], at: usize, len: usize) -> Option<u64> {
    let mut v = [0u8; 8];
    v.get_mut(..len)?.copy_from_slice(slice_at(b, at, len)?);
    Some(u64::from_le_bytes(v))
}

/// The little-endian two's-complement integer of `len` bytes (0 to 8) at
/// `at`, sign-extended from its top bit; None as [`uint_at`].
#[inline]
pub fn int_at(b: &[u8], at: usize, len: usize) -> Option<i64> {
    let src = slice_at(b, at, len)?;
    let negative = src.last().is_some_and(|&top| top & 0x80 != 0);
    let mut v = [if negative { 0xff } else { 0 }; 8];
    v.get_mut(..len)?.copy_from_slice(src);
    Some(i64::from_le_bytes(v))
}

/// The u16 at `off` of a slice the caller has bounds-checked; panics on a
/// short slice (a host bug).
#[inline]
pub fn le_u16(b: &[u8], off: usize) -> u16 {
    u16_at(b, off).expect("caller checked the length: 2 bytes")
}

/// The u32 at `off` of a slice the caller has bounds-checked; panics on a
/// short slice (a host bug).
#[inline]
pub fn le_u32(b: &[u8], off: usize) -> u32 {
    u32_at(b, off).expect("caller checked the length: 4 bytes")
}

/// The u64 at `off` of a slice the caller has bounds-checked; panics on a
/// short slice (a host bug).
#[inline]
pub fn le_u64(b: &[u8], off: usize) -> u64 {
    u64_at(b, off).expect("caller checked the length: 8 bytes")
}

/// Writes `v` at `off` of a buffer the host sized; panics if it is short.
#[inline]
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    put(b, off, &v.to_le_bytes());
}

/// Writes `v` at `off` of a buffer the host sized; panics if it is short.
#[inline]
pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    put(b, off, &v.to_le_bytes());
}

#[inline]
fn put(b: &mut [u8], off: usize, v: &[u8]) {
    let end = off
        .checked_add(v.len())
        .expect("the host sized this buffer: no overflow");
    b[off..end].copy_from_slice(v);
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn checked_readers_refuse_short_slices_and_overflowing_positions() {
        let b = [1u8, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(u16_at(&b, 6), Some(0x0807));
        assert_eq!(u16_at(&b, 7), None);
        assert_eq!(u32_at(&b, 4), Some(0x0807_0605));
        assert_eq!(u32_at(&b, 5), None);
        assert_eq!(u64_at(&b, 0), Some(0x0807_0605_0403_0201));
        assert_eq!(u64_at(&b, 1), None);
        assert_eq!(i32_at(&[0xff; 4], 0), Some(-1));
        for at in [usize::MAX, usize::MAX - 1, usize::MAX - 3] {
            assert_eq!(u32_at(&b, at), None);
            assert_eq!(u64_at(&b, at), None);
            assert_eq!(slice_at(&b, at, 2), None);
        }
        assert_eq!(slice_at(&b, 2, usize::MAX), None);
        assert_eq!(slice_at(&b, 8, 0), Some(&[][..]));
    }

    #[test]
    fn sized_readers_extend_as_their_sign_says() {
        let b = [0x01, 0x80, 0xff, 0x7f, 0, 0, 0, 0, 0x80];
        assert_eq!(uint_at(&b, 0, 2), Some(0x8001));
        assert_eq!(int_at(&b, 0, 2), Some(-0x7fff));
        assert_eq!(int_at(&b, 2, 1), Some(-1));
        assert_eq!(uint_at(&b, 2, 1), Some(0xff));
        assert_eq!(int_at(&b, 2, 2), Some(0x7fff));
        assert_eq!(int_at(&b, 1, 8), Some(i64::MIN + 0x7f_ff80));
        assert_eq!(uint_at(&b, 1, 8), Some(0x8000_0000_007f_ff80));
        assert_eq!(uint_at(&b, 0, 0), Some(0));
        assert_eq!(int_at(&b, 9, 0), Some(0));
        assert_eq!(uint_at(&b, 0, 9), None);
        assert_eq!(int_at(&b, 2, 8), None);
        assert_eq!(uint_at(&b, usize::MAX, 1), None);
    }

    #[test]
    fn panicking_forms_read_what_was_written() {
        let mut b = [0u8; 12];
        put_u32(&mut b, 0, 0xdead_beef);
        put_u64(&mut b, 4, u64::MAX - 1);
        assert_eq!(le_u32(&b, 0), 0xdead_beef);
        assert_eq!(le_u16(&b, 0), 0xbeef);
        assert_eq!(le_u64(&b, 4), u64::MAX - 1);
    }

    #[test]
    #[should_panic(expected = "caller checked")]
    fn panicking_forms_panic_on_a_short_slice() {
        le_u32(&[0u8; 3], 0);
    }
}
