from __future__ import annotations

import numpy as np
import pytest


def smooth_stack(shape=(12, 24, 20), dtype="float32", seed=0, scale=100.0, offset=0.0):
    """A small drifting-blob stack: temporally and spatially correlated like real data."""
    rng = np.random.default_rng(seed)
    t, h, w = shape[:3]
    yy, xx = np.mgrid[0:h, 0:w]
    frames = []
    for i in range(t):
        cy, cx = h / 2 + 3 * np.sin(i / 3), w / 2 + 3 * np.cos(i / 4)
        f = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (0.1 * h * w)) * scale + offset
        frames.append(f + rng.normal(0, scale * 0.01, f.shape))
    a = np.stack(frames)
    if len(shape) == 4:
        a = np.stack([a * (c + 1) / shape[3] for c in range(shape[3])], axis=-1)
    if np.dtype(dtype).kind in "ui":
        info = np.iinfo(dtype)
        a = np.clip(np.rint(a), info.min, info.max)
    return a.astype(dtype)


@pytest.fixture
def stack():
    return smooth_stack()
