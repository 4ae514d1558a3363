"""Bit-exact coding of floats by byte planes and zstd (``shuffle``), the alternative to
the ``bits`` grid predictor that a window takes when it codes smaller.

The rANS coder of ``bits`` spends a little on every value; data with many copies of one
value (the exact zeros around a smoke plume, the fill value around a solar image) or with
bytes that repeat in longer runs than a residual model sees code smaller as byte planes
through an LZ coder, as blosc2 does. This coder, in numpy and zstd only:

1. ``fill``: the window's most frequent bit pattern, when frequent enough, is taken out
   into a bit mask (the payload's ``masks`` section); only the other values are coded.
2. The kept values' IEEE bit patterns, mapped to ordered integers (as ``bits`` does, so
   nearby values differ little), are transformed (``t``):
   ``raw``: as they are; ``space``: the difference to the previous kept value in raster
   order (zigzag); ``time``: the difference to the same pixel of the previous frame, the
   first frame of each channel as ``space`` (zigzag). Differences are modulo 2^bits, so
   every pattern (NaN payloads, -0.0, Inf) comes back exactly.
3. The transformed values are split into byte planes (least significant first), each
   plane one zstd frame, back to back in the ``planes`` section; their sizes are in the
   configuration (``zs``).

Channels (T, H, W, C) are coded channel-major, so ``time`` and ``space`` look at values of
the same channel. The transform is chosen on a sample of the window (zstd at a fast level
on evenly spaced rows of every frame); the codec then keeps this coding or ``bits``
by the real size of the two payloads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import zstandard

from ..errors import CorruptFileError
from ..zstd_util import unzstd_exact

TRANSFORMS = ("raw", "space", "time")
LEVEL = 3                     # zstd level of the planes: 5-9 gain 0.1-0.4% at 1.5-2x the time
RANK_LEVEL = 1                # ... of the sample that ranks the transforms
FILL_FRACTION = 1 / 64        # a value this frequent in the window goes to the mask
_FILL_SAMPLE = 4096           # values looked at to find the candidate fill value
_RANK_VALUES = 1 << 16        # values of the sample the transforms are ranked on


def _ordered(u: np.ndarray) -> np.ndarray:
    """Bit patterns <-> ordered integers (an involution): negative floats get their
    other bits flipped, so the integer order follows the float order (two's complement
    modulo 2^bits, as ``quantize._ordered_bits``). A new array."""
    bits = 8 * u.dtype.itemsize
    out = u >> u.dtype.type(bits - 1)
    out *= u.dtype.type((1 << (bits - 1)) - 1)
    out ^= u
    return out


def _zigzag(d: np.ndarray) -> np.ndarray:
    """Differences modulo 2^bits, read as signed -> small unsigned codes (in place)."""
    bits = 8 * d.dtype.itemsize
    sign = d >> d.dtype.type(bits - 1)
    np.negative(sign, out=sign)                       # 0 or all ones
    d <<= d.dtype.type(1)
    d ^= sign
    return d


def _unzigzag(z: np.ndarray) -> np.ndarray:
    """Inverse of ``_zigzag`` (in place)."""
    low = z & z.dtype.type(1)
    np.negative(low, out=low)
    z >>= z.dtype.type(1)
    z ^= low
    return z


def _volumes(x: np.ndarray) -> np.ndarray:
    """Window (T, H, W[, C]) -> bit patterns (C, T, H*W), C-contiguous, native order."""
    u = x.astype(x.dtype.newbyteorder("="), copy=False).view(f"u{x.itemsize}")
    if x.ndim == 3:
        return np.ascontiguousarray(u).reshape(1, x.shape[0], -1)
    return np.ascontiguousarray(np.moveaxis(u, 3, 0)).reshape(x.shape[3], x.shape[0], -1)


def _fill(u: np.ndarray) -> int | None:
    """The most frequent bit pattern of a strided sample, if it fills at least
    ``FILL_FRACTION`` of the window."""
    flat = u.reshape(-1)
    sample = flat[::max(1, flat.size // _FILL_SAMPLE)]
    vals, counts = np.unique(sample, return_counts=True)
    k = int(np.argmax(counts))          # the smallest of the most frequent: deterministic
    if counts[k] < FILL_FRACTION * sample.size:
        return None
    v = vals[k]
    if np.count_nonzero(flat == v) < FILL_FRACTION * flat.size:
        return None
    return int(v)


def _forward(q: np.ndarray, keep: np.ndarray | None, t: str) -> np.ndarray:
    """Ordered integers (C, T, F) -> the stream of kept values under transform ``t``
    (a new array)."""
    if t == "raw":
        return q[keep] if keep is not None else q.reshape(-1)
    if t == "space":
        g = q[keep] if keep is not None else q.reshape(-1)
        d = np.empty_like(g)
        d[:1] = g[:1]
        np.subtract(g[1:], g[:-1], out=d[1:])
        return _zigzag(d)
    # time: frame 0 of each channel as space, the others from the previous frame
    parts = []
    for c in range(q.shape[0]):
        g = q[c, 0][keep[c, 0]] if keep is not None else q[c, 0]
        d0 = np.empty_like(g)
        d0[:1] = g[:1]
        np.subtract(g[1:], g[:-1], out=d0[1:])
        dt = q[c, 1:] - q[c, :-1]
        parts += [d0, dt[keep[c, 1:]] if keep is not None else dt.reshape(-1)]
    return _zigzag(np.concatenate(parts))


def _inverse(s: np.ndarray, keep: np.ndarray | None, t: str, shape: tuple[int, int, int],
             fill_q: Any) -> np.ndarray:
    """Inverse of ``_forward``: the ordered integers (C, T, F), fill positions set to
    ``fill_q``."""
    q = np.empty(shape, s.dtype)
    if keep is not None:
        q[~keep] = fill_q
    if t == "raw":
        if keep is None:
            q.reshape(-1)[:] = s
        else:
            q[keep] = s
        return q
    d = _unzigzag(s)
    if t == "space":
        g = np.cumsum(d, dtype=d.dtype)          # wraps modulo 2^bits
        if keep is None:
            q.reshape(-1)[:] = g
        else:
            q[keep] = g
        return q
    pos = 0
    for c in range(shape[0]):
        k0 = keep[c, 0] if keep is not None else None
        n0 = shape[2] if k0 is None else int(np.count_nonzero(k0))
        g = np.cumsum(d[pos:pos + n0], dtype=d.dtype)
        pos += n0
        if k0 is None:
            q[c, 0] = g
        else:
            q[c, 0][k0] = g
        for f in range(1, shape[1]):
            kf = keep[c, f] if keep is not None else None
            nf = shape[2] if kf is None else int(np.count_nonzero(kf))
            if kf is None:
                q[c, f] = q[c, f - 1] + d[pos:pos + nf]
            else:
                q[c, f][kf] = q[c, f - 1][kf] + d[pos:pos + nf]
            pos += nf
    return q


def _planes(s: np.ndarray) -> np.ndarray:
    """Values -> byte planes (itemsize, n), least significant byte first."""
    k = s.dtype.itemsize
    return np.ascontiguousarray(s.astype(s.dtype.newbyteorder("<"), copy=False)
                                .view(np.uint8).reshape(-1, k).T)


def _rank_rows(q: np.ndarray, keep: np.ndarray | None, frame_shape: tuple[int, ...]
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """Whole rows, evenly spaced, of every frame: a sample on which the transforms rank
    as on the window (rows keep the raster neighbours, every frame keeps its
    predecessor), about ``_RANK_VALUES`` values."""
    c, t, f = q.shape
    h = frame_shape[0]
    rows = max(1, min(h, _RANK_VALUES // max(1, c * t * (f // h))))
    if rows >= h:
        return q, keep
    pick = np.linspace(0, h - 1, rows).astype(np.int64)
    sub = q.reshape(c, t, h, f // h)[:, :, pick].reshape(c, t, -1)
    ksub = None if keep is None else keep.reshape(c, t, h, f // h)[:, :, pick].reshape(c, t, -1)
    return sub, ksub


def _zsize(s: np.ndarray, level: int) -> int:
    cz = zstandard.ZstdCompressor(level=level)
    return sum(len(cz.compress(p)) for p in _planes(s))


class ByteShuffle:
    """Bit-exact floats as byte planes + zstd (see the module's docstring). Codes its own
    payload sections (``masks``, ``planes``) instead of codes for the rANS coder."""

    name = "shuffle"

    def validate(self, config: Any, shape: tuple[int, ...]) -> dict:
        ok = (isinstance(config, dict) and set(config) == {"fill", "t", "zs"}
              and config["t"] in TRANSFORMS and isinstance(config["zs"], list)
              and len(config["zs"]) in (1, 2, 4, 8)
              and all(type(v) is int and v >= 0 for v in config["zs"])
              and (config["fill"] is None
                   or (type(config["fill"]) is int and 0 <= config["fill"] < 2**64)))
        if not ok:
            raise CorruptFileError("bad predictor configuration")
        return {"fill": config["fill"], "t": config["t"], "zs": list(config["zs"])}

    def encode(self, x: np.ndarray, level: int = LEVEL) -> tuple[dict, dict[str, bytes]]:
        """Window ``x`` (float, native order) -> (configuration, payload sections)."""
        u = _volumes(x)
        fill = _fill(u)
        keep = None if fill is None else u != u.dtype.type(fill)
        q = _ordered(u)
        t = TRANSFORMS[0]
        if len(TRANSFORMS) > 1:
            qs, ks = _rank_rows(q, keep, x.shape[1:])
            costs = [(_zsize(_forward(qs, ks, c), RANK_LEVEL), i)
                     for i, c in enumerate(TRANSFORMS)]
            t = TRANSFORMS[min(costs)[1]]
        cz = zstandard.ZstdCompressor(level=level)
        planes = [cz.compress(p) if p.size else b"" for p in _planes(_forward(q, keep, t))]
        sections = {"planes": b"".join(planes)}
        if keep is not None:
            sections["masks"] = np.packbits(_window_order(keep, x.shape)).tobytes()
        return {"fill": fill, "t": t, "zs": [len(p) for p in planes]}, sections

    def decode(self, shape: tuple[int, ...], dtype: np.dtype, config: dict,
               masks: bytes, planes: bytes) -> np.ndarray:
        """The window (``shape``, native ``dtype``) from its sections; any inconsistency
        raises CorruptFileError before anything large is allocated."""
        dtype = np.dtype(dtype)
        k = dtype.itemsize
        n = math.prod(shape)
        zs = config["zs"]
        if len(zs) != k or sum(zs) != len(planes):
            raise CorruptFileError("bad plane sizes")
        nch = shape[3] if len(shape) == 4 else 1
        vshape = (nch, shape[0], n // (nch * shape[0]))
        fill = config["fill"]
        keep = None
        if fill is None:
            if masks:
                raise CorruptFileError("unexpected mask section")
            n_keep = n
        else:
            if fill >= 1 << (8 * k) or len(masks) != (n + 7) // 8:
                raise CorruptFileError("bad fill mask")
            bitsm = np.frombuffer(masks, np.uint8)
            if n % 8 and int(bitsm[-1]) & ((1 << (8 - n % 8)) - 1):
                raise CorruptFileError("bad fill mask")
            keep = _volume_order(np.unpackbits(bitsm, count=n).astype(bool), shape, vshape)
            n_keep = int(np.count_nonzero(keep))
        buf = np.empty((n_keep, k), np.uint8)
        pos = 0
        for i, size in enumerate(zs):
            part = planes[pos:pos + size]
            pos += size
            if n_keep == 0:
                if size:
                    raise CorruptFileError("bad plane sizes")
                continue
            buf[:, i] = np.frombuffer(unzstd_exact(part, n_keep), np.uint8)
        utype = np.dtype(f"u{k}")
        s = buf.view(f"<u{k}").reshape(-1).astype(utype, copy=False)
        fill_q = _ordered(np.array([fill or 0], utype))[0]
        q = _inverse(s, keep, config["t"], vshape, fill_q)
        u = _ordered(q)
        if len(shape) == 3:
            return u.reshape(shape).view(dtype)
        return np.ascontiguousarray(np.moveaxis(u.reshape(nch, *shape[:3]), 0, 3)).view(dtype)


def _window_order(keep: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Keep mask (C, T, F) -> the window's own order (T, H, W[, C]), flat: the mask is
    stored as the window's positions of the fill value."""
    if len(shape) == 3:
        return ~keep.reshape(-1)
    return ~np.moveaxis(keep.reshape(shape[3], *shape[:3]), 0, 3).reshape(-1)


def _volume_order(is_fill: np.ndarray, shape: tuple[int, ...],
                  vshape: tuple[int, int, int]) -> np.ndarray:
    """Inverse of ``_window_order``."""
    if len(shape) == 3:
        return ~is_fill.reshape(vshape)
    return np.ascontiguousarray(~np.moveaxis(is_fill.reshape(shape), 3, 0)).reshape(vshape)
