"""zstd compression of a file's sections, one context per thread (no compiled kernels
here: the modules that only read containers, and the command line's ``--help``, import
this without numba)."""

from __future__ import annotations

import threading

import zstandard

from .errors import CorruptFileError

_LOCAL = threading.local()   # per thread: zstd contexts are not thread-safe


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's compressor at ``level`` (making one costs 20-35 us, a few times per
    window; one-shot compression with a reused context gives the same bytes)."""
    cache = getattr(_LOCAL, "c", None)
    if cache is None:
        cache = _LOCAL.c = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level)
    return c


def zstd(data: bytes, level: int = 3) -> bytes:
    return _compressor(level).compress(data) if data else b""


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_LOCAL, "d", None)
    if d is None:
        d = _LOCAL.d = zstandard.ZstdDecompressor()
    return d


def unzstd_at_most(data: bytes, cap: int, what: str = "compressed section") -> bytes:
    """zstd-decompress ``data`` that may give at most ``cap`` bytes; anything else (damage,
    a frame that declares more: zstd allocates what a frame header declares before
    looking at ``max_output_size``) is a CorruptFileError about ``what``."""
    try:
        declared = zstandard.frame_content_size(data)
        if declared > cap:
            raise CorruptFileError(f"damaged {what} (declares {declared} bytes, at most "
                                   f"{cap} expected)")
        return _decompressor().decompress(data, max_output_size=cap)
    except (zstandard.ZstdError, MemoryError) as exc:
        raise CorruptFileError(f"damaged {what} ({exc})") from None


def unzstd_exact(data: bytes, size: int) -> bytes:
    """``unzstd_at_most`` of ``data`` that must give exactly ``size`` bytes."""
    out = unzstd_at_most(data, size)
    if len(out) != size:
        raise CorruptFileError(f"damaged compressed section ({len(out)} bytes, {size} "
                               "expected)")
    return out
