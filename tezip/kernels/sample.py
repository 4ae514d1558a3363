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

    One row of tiles at a time, frame by frame over its pixels' sums (each pixel's terms
    are added in the same order as pixel by pixel through its frames, and the pixels'
    sums into their tiles in raster order, so the sums are the same to the bit): each
    frame is read row by row instead of every pixel reading a column through the frames
    (2.5-4x faster on the shared stacks), with buffers of one row of tiles (frames of
    4096 x 4096 pixels would need 512 MB for whole-frame buffers)."""
    T = x.shape[0]
    C = x.shape[3]
    ww = nx * tile
    inv = 1.0 / C
    rows = tile if ny > 0 else 0        # no row of tiles: no buffers
    acc = np.empty((rows, ww), np.float64)
    prev = np.empty((rows, ww), np.float64)
    out = np.zeros(ny * nx, np.float64)
    for band in range(ny):
        y0 = band * tile
        for r in range(tile):
            for xx in range(ww):
                prev[r, xx] = _mean(x, 0, y0 + r, xx, C, inv)
        for r in range(tile):
            y = y0 + r
            for xx in range(ww):
                f0 = prev[r, xx]
                a = 0.0
                if y > 0:
                    up = prev[r - 1, xx] if r > 0 else _mean(x, 0, y - 1, xx, C, inv)
                    a += abs(f0 - up)
                if xx > 0:
                    a += abs(f0 - prev[r, xx - 1])
                acc[r, xx] = a
        for t in range(tstep, T, tstep):
            for r in range(tile):
                for xx in range(ww):
                    v = _mean(x, t, y0 + r, xx, C, inv)
                    acc[r, xx] += abs(v - prev[r, xx])
                    prev[r, xx] = v
        for r in range(tile):
            for xx in range(ww):
                a = acc[r, xx]
                if abs(a) < np.inf:
                    out[band * nx + xx // tile] += a
    return out
