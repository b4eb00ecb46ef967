"""The payload pattern of ivtrace-loadgen, recomputed independently.

Keep in sync with `ivtrace-loadgen --help` (guest/lib/tools/loadgen.c):
thread t writes events seq = 0..N-1 of `loadgen:payload { thread, seq, data }`;
the data length L(t, seq) is fixed (--size B) or MIN + splitmix64((t << 40) ^ seq)
% (MAX - MIN + 1) (--size MIN-MAX); byte i of the data is
  text   (default): chr(0x21 + (seq*131 + t*7 + i) % 94)   (a NUL-terminated string)
  binary:           (seq*131 + t*7 + i) & 0xff             (a u32 length + bytes)
"""

M64 = (1 << 64) - 1


def splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def length(t: int, seq: int, lo: int, hi: int) -> int:
    if lo == hi:
        return lo
    return lo + splitmix64(((t << 40) ^ seq) & M64) % (hi - lo + 1)


_TEXT = "".join(chr(0x21 + i % 94) for i in range(94 * 13))  # > 1 KiB + 94
_BIN = bytes(i & 0xFF for i in range(256 * 6))


def text(t: int, seq: int, n: int) -> str:
    start = (seq * 131 + t * 7) % 94
    if n <= len(_TEXT) - start:
        return _TEXT[start:start + n]
    return "".join(chr(0x21 + (start + i) % 94) for i in range(n))


def binary(t: int, seq: int, n: int) -> bytes:
    start = (seq * 131 + t * 7) & 0xFF
    if n <= len(_BIN) - start:
        return _BIN[start:start + n]
    return bytes((start + i) & 0xFF for i in range(n))
