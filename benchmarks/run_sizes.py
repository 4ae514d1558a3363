"""Run coding against file size: synthetic detector stacks coded with the run coding as
chosen (default), with runs forced (``codec.RUN_CHECK_BYTES = 0``, ``classical.RUN_SAMPLE
= 0``) and without runs (``classical.RUN_SHARE = 0``), file sizes and decoding times side
by side.

    python benchmarks/run_sizes.py [--repeat 5]

Run coding is chosen for decoding speed (``classical.RUN_GAIN``); a window that codes
under ``codec.RUN_CHECK_BYTES``, or one of integer data whose runs code a sample of it
larger (``classical.RUN_SAMPLE``), is also coded without runs, the smaller kept. The
default column should be the smaller of the other two in every row."""

from __future__ import annotations

import argparse
import time

import numpy as np

import tezip
from tezip import codec
from tezip.predictors import classical


def dark_frames(t: int, n: int, lam: float, hot: float, dtype: str, seed: int) -> np.ndarray:
    """A detector's dark frames: 100 + Poisson(lam) noise, a share ``hot`` of pixels
    hot (+1000..4000) in every frame."""
    r = np.random.default_rng(seed)
    x = 100 + r.poisson(lam, (t, n, n))
    x = x + (r.random((n, n)) < hot)[None] * r.integers(1000, 4000, (n, n))[None]
    return x.astype(dtype)


def sparse_events(t: int, n: int, share: float, dtype: str, seed: int) -> np.ndarray:
    """Photon counting: mostly zero, a share of pixels with counts 1..199."""
    r = np.random.default_rng(seed)
    return ((r.random((t, n, n)) < share) * r.integers(1, 200, (t, n, n))).astype(dtype)


CASES = [
    ("dark lam=0.2 int32 512", lambda: dark_frames(33, 512, 0.2, 0.002, "int32", 1), 2.0),
    ("dark lam=0.2 uint16 256", lambda: dark_frames(33, 256, 0.2, 0.002, "uint16", 2), 2.0),
    ("dark lam=0.5 uint16 512", lambda: dark_frames(33, 512, 0.5, 0.002, "uint16", 3), 2.0),
    ("events 0.5% int16 512", lambda: sparse_events(33, 512, 0.005, "int16", 4), 0.5),
    ("events 0.1% int16 512", lambda: sparse_events(33, 512, 0.001, "int16", 7), 0.5),
    ("events 2% uint16 256", lambda: sparse_events(33, 256, 0.02, "uint16", 5), 2.0),
]


def _decode_ms(blob: bytes, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        tezip.decompress(blob, threads=1)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print("| stack | abs bound | default B | runs forced B | no runs B | runs/no runs "
          "| decode ms: runs forced / no runs |")
    print("|---|---|---|---|---|---|---|")
    check, sample = codec.RUN_CHECK_BYTES, classical.RUN_SAMPLE
    for name, make, bound in CASES:
        x = make()
        kw = {"mode": "abs", "bound": bound, "predictor": "classical", "threads": 1}
        default = tezip.compress(x, **kw)
        codec.RUN_CHECK_BYTES, classical.RUN_SAMPLE = 0, 0
        try:
            forced = tezip.compress(x, **kw)
        finally:
            codec.RUN_CHECK_BYTES, classical.RUN_SAMPLE = check, sample
        share = classical.RUN_SHARE
        classical.RUN_SHARE = 0.0
        try:
            plain = tezip.compress(x, **kw)
        finally:
            classical.RUN_SHARE = share
        print(f"| {name} | {bound} | {len(default)} | {len(forced)} | {len(plain)} | "
              f"{len(forced) / len(plain):.3f}x | {_decode_ms(forced, args.repeat):.1f} / "
              f"{_decode_ms(plain, args.repeat):.1f} |")


if __name__ == "__main__":
    main()
