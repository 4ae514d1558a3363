"""CRC-32 (zlib's polynomial) of bytes, the checksum of every header, index, payload and
reconstruction in a .tez file.

zlib-ng's implementation (SIMD) runs about 4x zlib's on this project's machine, and the
reconstruction of every window is checked on every read; where zlib-ng is not installed,
zlib's gives the same values."""

from __future__ import annotations

try:
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover - the package is a dependency; same values
    from zlib import crc32 as _crc32


def crc32(data: bytes | memoryview, value: int = 0) -> int:
    """CRC-32 of ``data`` (anything with the buffer protocol), continuing from ``value``."""
    return _crc32(data, value) & 0xFFFFFFFF
