"""Activity of a window's tiles, for the encoder's tuning sample (``codec.sample_tiles``):
one pass instead of numpy temporaries over float64 copies (which cost more than the
kernel calls on the sample they chose)."""

from __future__ import annotations

import numpy as np

from .core import inline, jit


@inline
def _mean(x, t, y, xx, C, inv):
    """The channel mean of pixel (y, xx) of frame t (the sum in channel order, times
    ``inv`` = 1 / C)."""
    if C == 1:
        # 0.0 + v and v * 1.0 are v, but for a zero's sign, which the sums do not see
        # (they add absolute differences)
        return np.float64(x[t, y, xx, 0])
    v = 0.0
    for c in range(C):
        v += np.float64(x[t, y, xx, c])
    return v * inv


@jit
def tile_activity(x, tstep, tile, ny, nx):
    """Per tile (``tile`` pixels square, ``ny`` x ``nx`` of them from the top left), the
    sum over its pixels of the absolute change between frames 0, tstep, 2 tstep, ... and
    of the absolute differences to the left and upper neighbours in frame 0 (channels
    averaged; a pixel whose sum is not finite counts 0). ``x``: (T, H, W, C).

    Frame by frame over per-pixel sums (a pixel's terms are added in the same order as
    pixel by pixel over its frames, so the sums are the same to the bit): each frame is
    read row by row once, instead of every pixel reading a column through the frames
    (2-3x faster)."""
    T = x.shape[0]
    C = x.shape[3]
    hh = ny * tile
    ww = nx * tile
    inv = 1.0 / C
    acc = np.empty((hh, ww), np.float64)
    prev = np.empty((hh, ww), np.float64)
    for y in range(hh):
        for xx in range(ww):
            prev[y, xx] = _mean(x, 0, y, xx, C, inv)
    for y in range(hh):
        for xx in range(ww):
            f0 = prev[y, xx]
            a = 0.0
            if y > 0:
                a += abs(f0 - prev[y - 1, xx])
            if xx > 0:
                a += abs(f0 - prev[y, xx - 1])
            acc[y, xx] = a
    for t in range(tstep, T, tstep):
        for y in range(hh):
            for xx in range(ww):
                v = _mean(x, t, y, xx, C, inv)
                acc[y, xx] += abs(v - prev[y, xx])
                prev[y, xx] = v
    out = np.zeros(ny * nx, np.float64)
    for y in range(hh):
        by = (y // tile) * nx
        for xx in range(ww):
            a = acc[y, xx]
            if abs(a) < np.inf:
                out[by + xx // tile] += a
    return out
