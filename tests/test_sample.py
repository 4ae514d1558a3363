"""The tuning sample's tile activity against its definition, pixel by pixel in Python
(the kernel goes frame by frame over a row of tiles at a time: the same sums to the bit,
as each pixel's terms and the pixels' sums are added in the same order)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tezip.kernels.sample import tile_activity


def _reference(x: np.ndarray, tstep: int, tile: int, ny: int, nx: int) -> np.ndarray:
    T, C = x.shape[0], x.shape[3]
    inv = 1.0 / C

    def mean(t: int, y: int, xx: int) -> float:
        v = 0.0
        for c in range(C):
            v += float(x[t, y, xx, c])
        return v * inv

    out = np.zeros(ny * nx)
    for y in range(ny * tile):
        for xx in range(nx * tile):
            f0 = mean(0, y, xx)
            a = 0.0
            if y > 0:
                a += abs(f0 - mean(0, y - 1, xx))
            if xx > 0:
                a += abs(f0 - mean(0, y, xx - 1))
            prev = f0
            for t in range(tstep, T, tstep):
                v = mean(t, y, xx)
                a += abs(v - prev)
                prev = v
            if math.isfinite(a):
                out[(y // tile) * nx + xx // tile] += a
    return out


@pytest.mark.parametrize("seed", range(12))
def test_tile_activity_is_its_definition(seed):
    rng = np.random.default_rng(seed)
    T, C, tile = int(rng.integers(1, 7)), int(rng.integers(1, 4)), int(rng.integers(1, 7))
    ny, nx = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    shape = (T, ny * tile + int(rng.integers(0, 3)), nx * tile + int(rng.integers(0, 3)), C)
    dtype = [np.float32, np.float64, np.uint16, np.int16][seed % 4]
    x = rng.normal(0, 300, shape)
    if dtype in (np.float32, np.float64):
        x = x.astype(dtype)
        special = rng.random(shape) < 0.04
        x[special] = rng.choice([np.nan, np.inf, -np.inf, -0.0, 0.0], int(special.sum()))
    else:
        x = np.clip(x, np.iinfo(dtype).min, np.iinfo(dtype).max).astype(dtype)
    tstep = int(rng.integers(1, T + 2))
    got = tile_activity(x, tstep, tile, ny, nx)
    assert got.tobytes() == _reference(x, tstep, tile, ny, nx).tobytes()
