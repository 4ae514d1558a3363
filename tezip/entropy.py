"""Entropy coding of int64 residuals.

Residual ``r`` -> zigzag ``z`` (unsigned) -> split ``z = hi << k | lo``. ``hi`` is coded with
rANS (``constriction``) under a static categorical model whose counts travel with the
data; ``hi`` values at or past ``ESCAPE`` become the escape symbol and are stored aside.
The ``k`` low bits are near-uniform when the residuals are wide, so they are stored as
raw bit planes (zstd-compressed only where that helps). ``k`` is chosen per call from the
data; narrow residuals get ``k = 0``.

Stream layout (all little-endian), see ``encode``:
``u8 k | u8 flags | u32 alphabet | u32 n_escapes | u32 len(counts) | u32 len(ans) |
u32 len(escapes) | u32 len(low) | counts | ans | escapes | low``.
"""

from __future__ import annotations

import struct

import constriction
import numpy as np
import zstandard

from .errors import CorruptFileError

ESCAPE = 4096
_HEAD = struct.Struct("<BBIIIIII")
_F_COUNTS_Z, _F_ESC_Z, _F_LOW_Z, _F_SINGLE = 1, 2, 4, 8
_ZLEVEL = 3


def zigzag(r: np.ndarray) -> np.ndarray:
    r = r.astype(np.int64, copy=False)
    return ((r << 1) ^ (r >> 63)).view(np.uint64)


def unzigzag(z: np.ndarray) -> np.ndarray:
    return ((z >> np.uint64(1)).view(np.int64)) ^ -(z & np.uint64(1)).view(np.int64)


def _entropy_bits(counts: np.ndarray) -> float:
    c = counts[counts > 0].astype(np.float64)
    n = c.sum()
    return float(-(c * np.log2(c / n)).sum())


def estimate_bits(r: np.ndarray) -> float:
    """Estimated code length in bits of ``encode(r)`` (for choosing predictors)."""
    z = zigzag(r.ravel())
    k = _choose_k(z)
    hi = z >> np.uint64(k)
    sym = np.minimum(hi, ESCAPE).astype(np.intp)
    counts = np.bincount(sym, minlength=ESCAPE + 1)
    return _entropy_bits(counts) + k * z.size + 64.0 * counts[ESCAPE]


def _choose_k(z: np.ndarray) -> int:
    if z.size == 0:
        return 0
    sample = z if z.size <= 65536 else z[:: z.size // 65536]
    m = float(np.mean(sample.astype(np.float64)))
    # keep the mean of hi near 8: below that the low bits stop being uniform
    return max(0, min(60, int(np.floor(np.log2(m + 1.0))) - 3))


def _maybe_zstd(data: bytes) -> tuple[bytes, bool]:
    if len(data) < 64:
        return data, False
    z = zstandard.ZstdCompressor(level=_ZLEVEL).compress(data)
    return (z, True) if len(z) < len(data) * 0.97 else (data, False)


def _unzstd(data: bytes, size: int) -> bytes:
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise CorruptFileError(f"damaged compressed section ({exc})") from None
    if len(out) != size:
        raise CorruptFileError("damaged compressed section (wrong size)")
    return out


def _pack_low(lo: np.ndarray, k: int) -> bytes:
    """k low bits of each value: k//8 whole byte planes, then k%8 packed bit planes."""
    parts = []
    nbytes = k // 8
    for b in range(nbytes):
        parts.append(((lo >> np.uint64(8 * b)) & np.uint64(0xFF)).astype(np.uint8).tobytes())
    rem = k % 8
    if rem:
        top = (lo >> np.uint64(8 * nbytes)).astype(np.uint8)
        for bit in range(rem):
            parts.append(np.packbits((top >> bit) & 1).tobytes())
    return b"".join(parts)


def _unpack_low(data: bytes, n: int, k: int) -> np.ndarray:
    lo = np.zeros(n, np.uint64)
    nbytes = k // 8
    pos = 0
    for b in range(nbytes):
        plane = np.frombuffer(data, np.uint8, n, pos)
        lo |= plane.astype(np.uint64) << np.uint64(8 * b)
        pos += n
    rem = k % 8
    plen = (n + 7) // 8
    top = np.zeros(n, np.uint8)
    for bit in range(rem):
        plane = np.unpackbits(np.frombuffer(data, np.uint8, plen, pos), count=n)
        top |= plane << bit
        pos += plen
    if rem:
        lo |= top.astype(np.uint64) << np.uint64(8 * nbytes)
    return lo


def low_size(n: int, k: int) -> int:
    return n * (k // 8) + ((n + 7) // 8) * (k % 8)


def encode(r: np.ndarray) -> bytes:
    z = zigzag(np.ascontiguousarray(r).ravel())
    k = _choose_k(z)
    hi = z >> np.uint64(k)
    sym = np.minimum(hi, ESCAPE).astype(np.int32)
    counts = np.bincount(sym, minlength=1).astype(np.uint32)
    alphabet = counts.size
    flags = 0
    escapes = hi[sym == ESCAPE]
    esc_bytes, esc_z = _maybe_zstd(escapes.astype("<u8").tobytes())
    flags |= _F_ESC_Z if esc_z else 0
    counts_bytes, cz = _maybe_zstd(counts.astype("<u4").tobytes())
    flags |= _F_COUNTS_Z if cz else 0
    if np.count_nonzero(counts) <= 1:
        flags |= _F_SINGLE          # one symbol only: nothing to entropy-code
        ans = b""
    else:
        coder = constriction.stream.stack.AnsCoder()
        model = constriction.stream.model.Categorical(counts.astype(np.float64), perfect=False)
        coder.encode_reverse(sym, model)
        ans = coder.get_compressed().tobytes()
    low = _pack_low(z & np.uint64((1 << k) - 1), k) if k else b""
    low, lz = _maybe_zstd(low)
    flags |= _F_LOW_Z if lz else 0
    head = _HEAD.pack(k, flags, alphabet, escapes.size, len(counts_bytes), len(ans),
                      len(esc_bytes), len(low))
    return b"".join((head, counts_bytes, ans, esc_bytes, low))


def decode(data: bytes, n: int) -> np.ndarray:
    """Inverse of ``encode`` for ``n`` values; any inconsistency -> CorruptFileError."""
    if len(data) < _HEAD.size:
        raise CorruptFileError("truncated residual stream")
    k, flags, alphabet, n_esc, lc, la, le, ll = _HEAD.unpack_from(data)
    if (k > 60 or not 1 <= alphabet <= ESCAPE + 1 or n_esc > n
            or _HEAD.size + lc + la + le + ll != len(data)):
        raise CorruptFileError("inconsistent residual stream header")
    if n == 0:
        return np.zeros(0, np.int64)
    pos = _HEAD.size
    counts_b = data[pos:pos + lc]
    pos += lc
    ans_b = data[pos:pos + la]
    pos += la
    esc_b = data[pos:pos + le]
    pos += le
    low_b = data[pos:pos + ll]
    if flags & _F_COUNTS_Z:
        counts_b = _unzstd(counts_b, 4 * alphabet)
    if len(counts_b) != 4 * alphabet:
        raise CorruptFileError("inconsistent residual model")
    counts = np.frombuffer(counts_b, "<u4").astype(np.int64)
    if counts.sum() != n or counts[-1] == 0:
        raise CorruptFileError("inconsistent residual model")
    if flags & _F_SINGLE:
        nz = np.flatnonzero(counts)
        if nz.size != 1:
            raise CorruptFileError("inconsistent residual model")
        sym = np.full(n, nz[0], np.int64)
    else:
        if la % 4:
            raise CorruptFileError("truncated residual stream")
        model = constriction.stream.model.Categorical(counts.astype(np.float64), perfect=False)
        try:
            coder = constriction.stream.stack.AnsCoder(np.frombuffer(ans_b, np.uint32).copy())
            sym = coder.decode(model, n).astype(np.int64)
        except BaseException as exc:  # constriction raises plain Exceptions/panics
            raise CorruptFileError(f"damaged entropy-coded data ({type(exc).__name__})") from None
    hi = sym.astype(np.uint64)
    esc_pos = np.flatnonzero(sym == ESCAPE)
    if esc_pos.size != n_esc:
        raise CorruptFileError("escape count does not match the residual stream")
    if n_esc:
        if flags & _F_ESC_Z:
            esc_b = _unzstd(esc_b, 8 * n_esc)
        if len(esc_b) != 8 * n_esc:
            raise CorruptFileError("inconsistent escape section")
        hi[esc_pos] = np.frombuffer(esc_b, "<u8")
    z = hi << np.uint64(k)
    if k:
        size = low_size(n, k)
        if flags & _F_LOW_Z:
            low_b = _unzstd(low_b, size)
        if len(low_b) != size:
            raise CorruptFileError("inconsistent low-bit section")
        z |= _unpack_low(low_b, n, k)
    return unzigzag(z)
