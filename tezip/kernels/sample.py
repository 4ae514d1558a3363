"""Activity of a window's tiles, for the encoder's tuning sample (``codec.sample_tiles``):
one pass instead of numpy temporaries over float64 copies (which cost more than the
kernel calls on the sample they chose)."""

from __future__ import annotations

import numpy as np

from .core import jit


@jit
def tile_activity(x, tstep, tile, ny, nx):
    """Per tile (``tile`` pixels square, ``ny`` x ``nx`` of them from the top left), the
    sum over its pixels of the absolute change between frames 0, tstep, 2 tstep, ... and
    of the absolute differences to the left and upper neighbours in frame 0 (channels
    averaged; a pixel whose sum is not finite counts 0). ``x``: (T, H, W, C)."""
    T = x.shape[0]
    C = x.shape[3]
    out = np.zeros(ny * nx, np.float64)
    inv = 1.0 / C
    for y in range(ny * tile):
        by = (y // tile) * nx
        for xx in range(nx * tile):
            f0 = 0.0
            up = 0.0
            left = 0.0
            for c in range(C):
                f0 += np.float64(x[0, y, xx, c])
                if y > 0:
                    up += np.float64(x[0, y - 1, xx, c])
                if xx > 0:
                    left += np.float64(x[0, y, xx - 1, c])
            f0 *= inv
            a = 0.0
            if y > 0:
                a += abs(f0 - up * inv)
            if xx > 0:
                a += abs(f0 - left * inv)
            prev = f0
            for t in range(tstep, T, tstep):
                v = 0.0
                for c in range(C):
                    v += np.float64(x[t, y, xx, c])
                v *= inv
                a += abs(v - prev)
                prev = v
            if abs(a) < np.inf:
                out[by + xx // tile] += a
    return out
