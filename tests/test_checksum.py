"""The CRC-32 of every checksum in a .tez file: zlib-ng's where installed, zlib's values
either way (files written with one read with the other)."""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tezip import checksum
from tezip.codec import window_crc


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data, start):
    assert checksum.crc32(data) == zlib.crc32(data) & 0xFFFFFFFF
    assert checksum.crc32(data, start) == zlib.crc32(data, start) & 0xFFFFFFFF


def test_window_crc_reads_arrays_in_place_as_little_endian_bytes():
    a = np.random.default_rng(0).random((3, 17, 19), np.float32)
    assert window_crc(a) == zlib.crc32(a.astype("<f4").tobytes())
    assert window_crc(a.astype(">f4")) == window_crc(a)            # byte order of the values
    assert window_crc(a[:, ::2]) == zlib.crc32(np.ascontiguousarray(a[:, ::2]).tobytes())


def test_the_fast_crc_is_in_use():
    # a dependency: without it every read would quietly check at a quarter of the speed
    assert checksum._crc32.__module__.startswith("zlib_ng")
