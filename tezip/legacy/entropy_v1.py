"""The v1 format's entropy coder: context-modelled coding of int64 residuals (kept so
that v1 files decode bit for bit).

Each residual comes with a *context*: a small integer the decoder can compute before it
decodes that residual (from values it already has, e.g. the size of the previous frame's
residuals around the pixel, or the local gradient an interpolation used). Residuals of
similar contexts share a statistical model, which is where most of the gain over a single
zeroth-order model comes from.

Per model ("class"): residual ``r`` -> zigzag ``z`` -> split ``z = hi << k | lo``. ``hi`` is
coded with rANS (``constriction``) under a static categorical model whose counts travel
with the data; ``hi`` values at or past ``ESCAPE`` become the escape symbol and are stored
aside. The ``k`` low bits are near-uniform when residuals are wide, so they are stored as
raw bit planes (zstd only where it helps). ``k`` is chosen per class from the data.

Contexts with few residuals are merged with their neighbours (a context -> class map
travels in the stream), so a model's cost never outweighs what it saves.

Stream: ``u16 n_ctx | u8 map[n_ctx] | u16 n_class | u32 len[n_class] | class blobs``.
Class blob: ``u8 k | u8 flags | u32 alphabet | u32 n | u32 n_escapes | u32 len(counts) |
u32 len(ans) | u32 len(escapes) | u32 len(low) | counts | ans | escapes | low``.
"""

from __future__ import annotations

import struct

import constriction
import numpy as np
import zstandard

from ..errors import CorruptFileError
from ..zstd_util import unzstd_exact

ESCAPE = 4096
MIN_CLASS = 2048
_CLS = struct.Struct("<BBIIIIIII")
_F_COUNTS_Z, _F_ESC_Z, _F_LOW_Z, _F_SINGLE = 1, 2, 4, 8
_ZLEVEL = 3

# activity buckets, two per octave: 0 for 0, then 1 + 2*floor(log2 x) (+1 in the upper
# half-octave); from frexp, which is exact, so encoder and decoder agree on every machine
_BUCKET_CAP = 2**40
N_BUCKETS = 82
_SQRT_HALF = 0.7071067811865476


def bucketize(x: np.ndarray) -> np.ndarray:
    """Bucket of non-negative integer activity values (int64 in, int16 out)."""
    m, e = np.frexp(np.minimum(x, _BUCKET_CAP).astype(np.float64))
    b = 2 * e.astype(np.int16) - 1 + (m >= _SQRT_HALF)
    return np.where(x > 0, b, 0).astype(np.int16)


def zigzag(r: np.ndarray) -> np.ndarray:
    r = r.astype(np.int64, copy=False)
    return ((r << 1) ^ (r >> 63)).view(np.uint64)


def unzigzag(z: np.ndarray) -> np.ndarray:
    return ((z >> np.uint64(1)).view(np.int64)) ^ -(z & np.uint64(1)).view(np.int64)


def _choose_k(z: np.ndarray) -> int:
    if z.size == 0:
        return 0
    sample = z if z.size <= 65536 else z[:: z.size // 65536]
    m = float(np.mean(sample.astype(np.float64)))
    # keep the mean of hi near 8: below that the low bits stop being uniform
    return max(0, min(60, int(np.floor(np.log2(m + 1.0))) - 3))


def _class_map(counts: np.ndarray) -> np.ndarray:
    """Merge adjacent contexts until every class holds at least MIN_CLASS residuals."""
    cmap = np.zeros(counts.size, np.uint8)
    cls, acc = 0, 0
    for i, c in enumerate(counts):
        if acc >= MIN_CLASS and c > 0 and cls < 255:
            cls, acc = cls + 1, 0
        cmap[i] = cls
        acc += int(c)
    if cls > 0 and acc < MIN_CLASS:  # the last class is too small: fold it into the one before
        cmap[cmap == cls] = cls - 1
    return cmap


def estimate_bits(r: np.ndarray, ctx: np.ndarray, n_ctx: int) -> float:
    """Estimated code length in bits of ``encode(r, ctx, n_ctx)`` (to rank predictors):
    the empirical entropy of each class's high parts, its raw low bits, escapes and an
    allowance for the model; no entropy coder runs."""
    ctx = ctx.ravel().astype(np.intp)
    cmap = _class_map(np.bincount(ctx, minlength=n_ctx)).astype(np.intp)
    cls = cmap[ctx]
    n_class = int(cls.max()) + 1 if cls.size else 1
    z = zigzag(r.ravel())
    n = np.bincount(cls, minlength=n_class).astype(np.float64)
    mean = np.bincount(cls, weights=z.astype(np.float64), minlength=n_class) / np.maximum(n, 1)
    k = np.clip(np.floor(np.log2(mean + 1.0)).astype(np.int64) - 3, 0, 60)
    sym = np.minimum(z >> k[cls].astype(np.uint64), ESCAPE).astype(np.intp)
    counts = np.bincount(cls * (ESCAPE + 1) + sym, minlength=n_class * (ESCAPE + 1))
    counts = counts.reshape(n_class, ESCAPE + 1).astype(np.float64)
    nz = counts > 0
    bits = -float((counts[nz] * np.log2(counts[nz] / np.broadcast_to(
        np.maximum(n, 1)[:, None], counts.shape)[nz])).sum())
    bits += float((k * n).sum()) + 64.0 * float(counts[:, ESCAPE].sum())
    bits += 8.0 * (_CLS.size * n_class + 2 * np.count_nonzero(counts))
    return float(bits)


def _maybe_zstd(data: bytes) -> tuple[bytes, bool]:
    if len(data) < 64:
        return data, False
    z = zstandard.ZstdCompressor(level=_ZLEVEL).compress(data)
    return (z, True) if len(z) < len(data) * 0.97 else (data, False)


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


def _low_size(n: int, k: int) -> int:
    return n * (k // 8) + ((n + 7) // 8) * (k % 8)


def _encode_class(z: np.ndarray) -> bytes:
    k = _choose_k(z)
    hi = z >> np.uint64(k)
    sym = np.minimum(hi, ESCAPE).astype(np.int32)
    counts = np.bincount(sym, minlength=1)
    flags = 0
    escapes = hi[sym == ESCAPE]
    esc_bytes, esc_z = _maybe_zstd(escapes.astype("<u8").tobytes())
    flags |= _F_ESC_Z if esc_z else 0
    width = "<u2" if counts.max() < 65536 else "<u4"
    counts_bytes, cz = _maybe_zstd(counts.astype(width).tobytes())
    flags |= (_F_COUNTS_Z if cz else 0) | (16 if width == "<u4" else 0)
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
    head = _CLS.pack(k, flags, counts.size, z.size, escapes.size, len(counts_bytes), len(ans),
                     len(esc_bytes), len(low))
    return b"".join((head, counts_bytes, ans, esc_bytes, low))


def encode(r: np.ndarray, ctx: np.ndarray, n_ctx: int) -> bytes:
    """Code residuals ``r`` (in decode order) under contexts ``ctx`` (0 <= ctx < n_ctx)."""
    r, ctx = r.ravel(), ctx.ravel().astype(np.intp)
    cmap = _class_map(np.bincount(ctx, minlength=n_ctx))
    n_class = int(cmap.max()) + 1 if cmap.size else 1
    cls = cmap[ctx]
    z = zigzag(r)
    order = np.argsort(cls, kind="stable")          # group by class, keep decode order
    bounds = np.cumsum(np.bincount(cls, minlength=n_class))[:-1]
    blobs = [_encode_class(part) for part in np.split(z[order], bounds)]
    head = struct.pack("<H", n_ctx) + cmap.tobytes() + struct.pack("<H", n_class)
    head += b"".join(struct.pack("<I", len(b)) for b in blobs)
    return head + b"".join(blobs)


class _ClassDecoder:
    def __init__(self, data: bytes, limit: int) -> None:
        if len(data) < _CLS.size:
            raise CorruptFileError("truncated residual stream")
        k, flags, alphabet, n, n_esc, lc, la, le, ll = _CLS.unpack_from(data)
        if (k > 60 or not 1 <= alphabet <= ESCAPE + 1 or n > limit or n_esc > n
                or _CLS.size + lc + la + le + ll != len(data)):
            raise CorruptFileError("inconsistent residual stream header")
        self.n, self.k, self.pos = n, k, 0
        pos = _CLS.size
        counts_b, ans_b, esc_b, low_b = (data[pos:pos + lc], data[pos + lc:pos + lc + la],
                                         data[pos + lc + la:pos + lc + la + le],
                                         data[pos + lc + la + le:])
        width = 4 if flags & 16 else 2
        if flags & _F_COUNTS_Z:
            counts_b = unzstd_exact(counts_b, width * alphabet)
        if len(counts_b) != width * alphabet:
            raise CorruptFileError("inconsistent residual model")
        counts = np.frombuffer(counts_b, "<u4" if width == 4 else "<u2").astype(np.int64)
        if counts.sum() != n or (n and counts[-1] == 0):
            raise CorruptFileError("inconsistent residual model")
        self.single = None
        if flags & _F_SINGLE:
            nz = np.flatnonzero(counts)
            if n and nz.size != 1:
                raise CorruptFileError("inconsistent residual model")
            self.single = int(nz[0]) if nz.size else 0
        else:
            if la % 4:
                raise CorruptFileError("truncated residual stream")
            self.model = constriction.stream.model.Categorical(counts.astype(np.float64),
                                                               perfect=False)
            try:
                self.coder = constriction.stream.stack.AnsCoder(
                    np.frombuffer(ans_b, np.uint32).copy())
            except ValueError as exc:         # e.g. "never ends in a zero word"
                raise CorruptFileError(f"damaged entropy-coded data ({exc})") from None
        self.escapes = np.zeros(0, np.uint64)
        self.esc_pos = 0
        if n_esc:
            if flags & _F_ESC_Z:
                esc_b = unzstd_exact(esc_b, 8 * n_esc)
            if len(esc_b) != 8 * n_esc:
                raise CorruptFileError("inconsistent escape section")
            self.escapes = np.frombuffer(esc_b, "<u8").astype(np.uint64)
        self.low = None
        if k:
            size = _low_size(n, k)
            if flags & _F_LOW_Z:
                low_b = unzstd_exact(low_b, size)
            if len(low_b) != size:
                raise CorruptFileError("inconsistent low-bit section")
            self.low = _unpack_low(low_b, n, k)

    def take(self, m: int) -> np.ndarray:
        if self.pos + m > self.n:
            raise CorruptFileError("residual stream shorter than the data it codes")
        if self.single is not None:
            hi = np.full(m, self.single, np.uint64)
        else:
            try:
                hi = np.asarray(self.coder.decode(self.model, m)).astype(np.uint64)
            except BaseException as exc:  # constriction raises plain Exceptions/panics
                raise CorruptFileError(
                    f"damaged entropy-coded data ({type(exc).__name__})") from None
        esc = np.flatnonzero(hi == ESCAPE)
        if esc.size:
            if self.esc_pos + esc.size > self.escapes.size:
                raise CorruptFileError("escape count does not match the residual stream")
            hi[esc] = self.escapes[self.esc_pos:self.esc_pos + esc.size]
            self.esc_pos += esc.size
        z = hi << np.uint64(self.k)
        if self.low is not None:
            z |= self.low[self.pos:self.pos + m]
        self.pos += m
        return unzigzag(z)


class Decoder:
    """Hands out residuals in decode order: ``take(ctx)`` returns the residuals of the
    positions whose contexts are ``ctx``."""

    def __init__(self, data: bytes, n: int, n_ctx: int) -> None:
        try:
            (nc,) = struct.unpack_from("<H", data, 0)
            cmap = np.frombuffer(data, np.uint8, nc, 2)
            (n_class,) = struct.unpack_from("<H", data, 2 + nc)
            lens = struct.unpack_from(f"<{n_class}I", data, 4 + nc)
        except (struct.error, ValueError):
            raise CorruptFileError("truncated residual stream") from None
        if nc != n_ctx or n_class < 1 or (cmap.size and cmap.max() >= n_class):
            raise CorruptFileError("inconsistent residual stream header")
        pos = 4 + nc + 4 * n_class
        if pos + sum(lens) != len(data):
            raise CorruptFileError("inconsistent residual stream length")
        self.classes = []
        for ln in lens:
            self.classes.append(_ClassDecoder(data[pos:pos + ln], n))
            pos += ln
        if sum(c.n for c in self.classes) != n:
            raise CorruptFileError("residual count does not match the window")
        self.cmap = cmap
        self.n_ctx = n_ctx

    def take(self, ctx: np.ndarray) -> np.ndarray:
        cls = self.cmap[ctx.ravel()]               # uint8: the stable sort below is a radix sort
        out = np.empty(cls.size, np.int64)
        counts = np.bincount(cls, minlength=len(self.classes))
        if np.count_nonzero(counts) == 1:
            c = int(cls[0])
            out[:] = self.classes[c].take(cls.size)
            return out
        order = np.argsort(cls, kind="stable")
        out[order] = np.concatenate([self.classes[c].take(int(counts[c]))
                                     for c in np.flatnonzero(counts)])
        return out

    def finish(self) -> None:
        if any(c.pos != c.n for c in self.classes):
            raise CorruptFileError("residual stream longer than the data it codes")
