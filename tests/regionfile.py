"""Byte-level access to a region file, for tests that play a buggy or hostile guest.

Offsets come from abi/vectors.json (conftest.abi), so the tests follow the ABI.
"""

import mmap
import os
import struct

from common import abi

HDR_LAYOUT = abi("offsetof.ivt_region_hdr.layout")
CHAN_SIZE = abi("sizeof.ivt_channel")


class Region:
    """A region file mapped read-write; u32/u64 read a field, or write it given a value."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, 0)

    def close(self):
        self.map.close()
        os.close(self.fd)

    def u32(self, off, value=None):
        if value is None:
            return struct.unpack_from("<I", self.map, off)[0]
        struct.pack_into("<I", self.map, off, value)

    def u64(self, off, value=None):
        if value is None:
            return struct.unpack_from("<Q", self.map, off)[0]
        struct.pack_into("<Q", self.map, off, value)

    def layout(self, field):
        """(offset, value) of an ivt_layout field: offsets are 64-bit, counts 32-bit."""
        off = HDR_LAYOUT + abi(f"offsetof.ivt_layout.{field}")
        size = 8 if field.endswith("_off") else 4
        return off, (self.u64(off) if size == 8 else self.u32(off))

    def channel(self, idx, field):
        base = self.layout("channels_off")[1] + idx * CHAN_SIZE
        return base + abi(f"offsetof.ivt_channel.{field}")

    def packet(self, chan, seq):
        nr = self.layout("nr_subbufs")[1]
        size = self.layout("subbuf_size")[1]
        return self.layout("pool_off")[1] + (chan * nr + seq % nr) * size

    def first_user_channel(self):
        return self.layout("nr_kernel_channels")[1]
