"""The host treats the region as hostile input.

Each test makes a real region with ivtrace-loadgen, corrupts it the way a buggy
or malicious guest could, and runs the recorder. Every case must end in a clear
error or a counted, skipped packet: never a panic, a hang, an unbounded
allocation or a file outside the output directory. babeltrace2 must still read
whatever was written.
"""

import os
import struct

import pytest

import ctf
import losses
from common import abi, assert_no_panic, run
from regionfile import Region


@pytest.fixture
def region(tools, shm):
    """A closed region with 2 packets' worth of events on one channel."""
    run([tools["loadgen"], "--shm", str(shm), "--events", 600, "--threads", 1,
         "--size", 16, "--subbufs", 8, "--subbuf-size", 4096, "--channels", 2])
    r = Region(shm)
    yield r
    r.close()


def record(tools, shm, out, timeout=60):
    p = run([tools["ivtrace"], "record", "--shm", str(shm), "-o", str(out), "--duration", 10],
            timeout=timeout, check=False)
    assert_no_panic(p)
    return p


def assert_only_inside(out):
    """Nothing was written next to the output directory, and nothing in it is a link."""
    parent = out.parent
    assert sorted(os.listdir(parent)) == [out.name], os.listdir(parent)
    for root, dirs, files in os.walk(out):
        for name in dirs + files:
            assert not os.path.islink(os.path.join(root, name))


# ---- region header: a clear error, exit 2 ------------------------------------------

HEADER_CASES = {
    "bad magic": lambda r: r.u64(abi("offsetof.ivt_region_hdr.magic"), 0x4141414141414141),
    "future ABI major": lambda r: r.u32(abi("offsetof.ivt_region_hdr.abi_major"), 0x00630063),
    "region size mismatch": lambda r: r.u64(abi("offsetof.ivt_region_hdr.region_size"), 1 << 40),
    "too many channels": lambda r: r.u32(r.layout("nr_channels")[0], 0xFFFFFFFF),
    "pool beyond the end": lambda r: r.u64(r.layout("pool_off")[0], 1 << 50),
    "sub-buffer size not a power of two": lambda r: r.u32(r.layout("subbuf_size")[0], 3000),
    "metadata overlaps channels": lambda r: r.u64(r.layout("meta_off")[0], 4096 + 64),
    "channel table offset misaligned": lambda r: r.u64(r.layout("channels_off")[0], 4097),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_corrupt_header_is_a_clear_error(tools, shm, region, tmp_path, case):
    HEADER_CASES[case](region)
    out = tmp_path / "trace"
    p = record(tools, shm, out)
    assert p.returncode == 2, f"{case}: exit {p.returncode}\n{p.stderr}"
    assert p.stderr.startswith("ivtrace: "), p.stderr
    assert len(p.stderr.strip()) > 20, "the error should say what failed and why"


# ---- packets: counted and skipped, the rest intact ----------------------------------


def corrupt_first_packet(field, value):
    def apply(r):
        off = r.packet(r.first_user_channel(), 0) + abi(f"offsetof.ivt_packet_hdr.{field}")
        (r.u64 if field in ("content_size", "packet_seq_num", "timestamp_begin") else r.u32)(off, value)
    return apply


def unknown_event_id(r):
    # The first event header sits right after the packet header: make its id 29,
    # which no event type has.
    off = r.packet(r.first_user_channel(), 0) + abi("sizeof.ivt_packet_hdr")
    r.u32(off, (r.u32(off) & ~0x1F) | 29)


def bytes_length_past_end(r):
    # loadgen:payload is { u16 thread, u64 seq, u32 len + bytes }: the length
    # sits 10 bytes into the payload of the first event.
    off = r.packet(r.first_user_channel(), 0) + abi("sizeof.ivt_packet_hdr") + 4 + 10
    r.u32(off, 0x7FFFFFF0)


PACKET_CASES = {
    "packet magic": corrupt_first_packet("magic", 0xDEADBEEF),
    "content size past the packet": corrupt_first_packet("content_size", 1 << 40),
    "wrong sequence number": corrupt_first_packet("packet_seq_num", 77),
    "unknown event id": unknown_event_id,
}


@pytest.mark.parametrize("case", sorted(PACKET_CASES))
def test_corrupt_packet_is_counted_and_skipped(tools, shm, region, tmp_path, case):
    PACKET_CASES[case](region)
    out = tmp_path / "trace"
    p = record(tools, shm, out)
    assert p.returncode == 0, f"{case}: exit {p.returncode}\n{p.stderr}"
    assert "corrupt" in (p.stdout + p.stderr).lower(), "the skipped packet must be reported"
    evs = ctf.events(out)
    assert 0 < len(evs) < 600, "good packets are kept, the bad one is not"
    assert ctf.discarded(out) == 600 - len(evs), "the skipped events are counted as lost"
    losses.assert_every_loss_is_in_the_ctf(out, want=("corrupt",))
    assert_only_inside(out)


def test_byte_array_length_past_the_end(tools, shm, tmp_path):
    """A BYTES field whose length points past the packet: the packet is skipped and
    its events counted, the other packets survive."""
    run([tools["loadgen"], "--shm", str(shm), "--events", 600, "--threads", 1, "--size", 16,
         "--payload", "binary", "--subbufs", 8, "--subbuf-size", 4096, "--channels", 2])
    r = Region(shm)
    bytes_length_past_end(r)
    r.close()
    out = tmp_path / "trace"
    p = record(tools, shm, out)
    assert p.returncode == 0, p.stderr
    evs = ctf.events(out)
    assert 0 < len(evs) < 600
    assert ctf.discarded(out) == 600 - len(evs)


def test_huge_commit_position_does_not_hang(tools, shm, region, tmp_path):
    """A channel claiming 2^62 committed bytes must not make the host loop over
    billions of packets or allocate for them."""
    region.u64(region.channel(region.first_user_channel(), "commit_pos"), 1 << 62)
    out = tmp_path / "trace"
    p = record(tools, shm, out, timeout=30)
    assert p.returncode in (0, 2), p.stderr
    if p.returncode == 0:
        ctf.events(out)  # whatever was written is readable
    assert_only_inside(out)


# ---- metadata: names never reach TSDL or paths unchecked ----------------------------


def meta_name_offset(r):
    meta_off = r.layout("meta_off")[1]
    return meta_off + abi("offsetof.ivt_meta_rec.name")


NAMES = {
    "tsdl injection": b'evil"; }; event { name = "x',
    "path traversal": b"../../../../tmp/ivtrace-owned",
    "control characters": b"a\nb\x01c\x7f",
    "not utf-8": b"\xff\xfe\xc3(",
}


@pytest.mark.parametrize("case", sorted(NAMES))
def test_hostile_event_names_are_sanitised(tools, shm, region, tmp_path, case):
    name = NAMES[case][: abi("IVT_NAME_MAX") - 1]
    off = meta_name_offset(region)
    region.map[off:off + abi("IVT_NAME_MAX")] = name.ljust(abi("IVT_NAME_MAX"), b"\0")
    out = tmp_path / "trace"
    p = record(tools, shm, out)
    assert p.returncode == 0, p.stderr
    evs = ctf.events(out)
    assert len(evs) == 600, "a strange name is sanitised, not a reason to drop events"
    for ev in evs[:1]:
        assert '"' not in ev.name and "/" not in ev.name and "\n" not in ev.name, ev.name
    assert not os.path.exists("/tmp/ivtrace-owned")
    assert_only_inside(out)


def test_hostile_field_name(tools, shm, region, tmp_path):
    off = region.layout("meta_off")[1] + abi("offsetof.ivt_meta_rec.fields")
    region.map[off:off + abi("IVT_FIELD_NAME_MAX")] = b"x; } y := struct {".ljust(
        abi("IVT_FIELD_NAME_MAX"), b"\0")
    out = tmp_path / "trace"
    p = record(tools, shm, out)
    assert p.returncode == 0, p.stderr
    assert len(ctf.events(out)) == 600


def test_metadata_record_length_past_the_area(tools, shm, region, tmp_path):
    """A metadata record claiming more bytes than the area holds is rejected; the
    events that would need it are counted as lost, nothing else breaks."""
    region.u32(region.layout("meta_off")[1] + abi("offsetof.ivt_meta_rec.len"), 0xFFFFFFF8)
    out = tmp_path / "trace"
    p = record(tools, shm, out)
    assert p.returncode in (0, 2), p.stderr
    if p.returncode == 0:
        assert len(ctf.events(out)) + ctf.discarded(out) == 600
    assert_only_inside(out)


def test_too_many_fields(tools, shm, region, tmp_path):
    off = region.layout("meta_off")[1] + abi("offsetof.ivt_meta_rec.nr_fields")
    region.map[off:off + 2] = struct.pack("<H", 60000)
    out = tmp_path / "trace"
    p = record(tools, shm, out)
    assert p.returncode in (0, 2), p.stderr
    assert_only_inside(out)
