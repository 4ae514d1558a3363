"""Generate the ``ks_pypde`` stack with py-pde; run by ``build.py`` in a subprocess.

Usage: ``python ks_pypde_worker.py OUT.npy`` with py-pde 0.59.0 importable (build.py puts
a private ``pip install --target`` directory on PYTHONPATH). Writes float64 (T, H, W).
"""

from __future__ import annotations

import sys

import numpy as np

GRID_POINTS = 256  # 256 x 256, periodic
DOMAIN = 256.0  # side length, so dx = 1 (unit grid)
SEED = 0
INIT_AMPLITUDE = 0.01  # uniform noise in [-A, A]
BURN_IN = 50.0  # time units before the first frame: growth from noise has saturated
FRAMES = 64  # one frame per time unit
DT = 0.01  # initial step for the adaptive explicit solver


def simulate() -> np.ndarray:
    import pde  # imported here so this module can be inspected without py-pde

    grid = pde.CartesianGrid(
        [[0.0, DOMAIN], [0.0, DOMAIN]], [GRID_POINTS, GRID_POINTS], periodic=True
    )
    rng = np.random.default_rng(SEED)
    state = pde.ScalarField.random_uniform(grid, -INIT_AMPLITUDE, INIT_AMPLITUDE, rng=rng)
    eq = pde.KuramotoSivashinskyPDE(nu=1.0)
    storage = pde.MemoryStorage()
    times = [BURN_IN + i for i in range(FRAMES)]
    eq.solve(
        state,
        t_range=BURN_IN + FRAMES - 1,
        dt=DT,
        adaptive=True,
        tracker=[storage.tracker(times)],
    )
    data = np.asarray(storage.data, dtype=np.float64)
    if data.shape[0] != FRAMES:
        raise RuntimeError(f"expected {FRAMES} stored frames, got {data.shape[0]}")
    return data - data.mean(axis=(1, 2), keepdims=True)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    np.save(sys.argv[1], simulate())
    return 0


if __name__ == "__main__":
    sys.exit(main())
