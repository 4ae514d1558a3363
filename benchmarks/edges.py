"""What format v5 changes: interp's linear extrapolation at the edges, and windows of
33 frames (2^5 + 1: a window ends on the anchor grid) instead of 32. Every stack and
bound is compressed with ``--predictor classical`` four ways: windows of 32 or 33 frames,
with the edge trial of the tuning or without it (``classical.EDGE_TRIAL = 0``: the
format-v4 choice); 32 without the trial is what 0.4.0 wrote (less the format version).
SZ3 3-D and SPERR 3-D code the same stacks (the bench's own rows). Every tezip file is
decoded and checked against the bound.

Stacks: the shared ones where present (``--data``), and three smooth fields generated
here from numpy (no download): ``heat`` (diffusion of a random field, 48 x 64 x 64),
``blobs`` (ten Gaussian blobs drifting, 64 x 128 x 128), ``grayscott`` (a Gray-Scott
reaction-diffusion run, 64 x 128 x 128), whose shapes hold windows of 32 and 33 frames
at their ends.

    python benchmarks/edges.py [--data DIR] [--bounds 1e-2,1e-3,1e-4]
        [--md benchmarks/results/edges.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import tezip
from tezip.atomic import atomic_output
from tezip.bench import bench_array
from tezip.predictors import classical

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = ("iris_sji2796", "ks_pypde", "smoke_phiflow", "speckle_hcipy")
WAYS = ((32, False), (32, True), (33, False), (33, True))


def _laplacian(a: np.ndarray) -> np.ndarray:
    return (np.roll(a, 1, 0) + np.roll(a, -1, 0) + np.roll(a, 1, 1) + np.roll(a, -1, 1)
            - 4 * a)


def heat(t: int = 48, n: int = 64) -> np.ndarray:
    """A random field diffusing, with a weak steady source: smooth in space and time."""
    u = np.random.default_rng(2).normal(0, 1, (n, n))
    for _ in range(200):
        u += 0.2 * _laplacian(u)
    src = 0.002 * np.sin(np.arange(n) / 5)[None, :]
    out = np.empty((t, n, n), np.float32)
    for i in range(t):
        for _ in range(5):
            u += 0.2 * _laplacian(u) + src
        out[i] = u
    return out


def blobs(t: int = 64, n: int = 128, k: int = 10) -> np.ndarray:
    """Gaussian blobs drifting over a slowly changing background."""
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:n, 0:n].astype(np.float64)
    c = rng.uniform(0, n, (k, 2))
    v = rng.normal(0, 0.3, (k, 2))
    s = rng.uniform(4, 12, k)
    amp = rng.normal(0, 1, k)
    out = np.empty((t, n, n), np.float32)
    for i in range(t):
        f = 0.1 * np.sin(x / 9 + i / 7) * np.cos(y / 11)
        for j in range(k):
            cy, cx = c[j] + v[j] * i
            f += amp[j] * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (2 * s[j] ** 2))
        out[i] = f
    return out


def grayscott(t: int = 64, n: int = 128, every: int = 40) -> np.ndarray:
    """The v field of a Gray-Scott reaction-diffusion run (F 0.037, k 0.06)."""
    rng = np.random.default_rng(0)
    u, v = np.ones((n, n)), np.zeros((n, n))
    for _ in range(12):
        y, x = rng.integers(0, n - 10, 2)
        u[y:y + 10, x:x + 10], v[y:y + 10, x:x + 10] = 0.5, 0.25
    u += 0.02 * rng.random((n, n))
    v += 0.02 * rng.random((n, n))

    def step() -> None:
        uvv = u * v * v
        u[...] += 0.16 * _laplacian(u) - uvv + 0.037 * (1 - u)
        v[...] += 0.08 * _laplacian(v) + uvv - 0.097 * v

    for _ in range(2000):
        step()
    out = np.empty((t, n, n), np.float32)
    for i in range(t):
        for _ in range(every):
            step()
        out[i] = v
    return out


def _edges(blob: bytes) -> str:
    with tezip.open(blob) as f:
        cfgs = [f.window_meta(i)["cfg"] for i in range(f.n_windows)]
    return "".join("e" if c.get("edge") else "." for c in cfgs)


def _tezip(a: np.ndarray, bound: float, window: int, edge: bool) -> tuple[float, str]:
    trial = classical.EDGE_TRIAL
    classical.EDGE_TRIAL = trial if edge else 0
    try:
        blob = tezip.compress(a, mode="rel", bound=bound, predictor="classical",
                              window=window)
    finally:
        classical.EDGE_TRIAL = trial
    d = tezip.decompress(blob).astype(np.float64)
    lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
    if not np.max(np.abs(d - a)) <= bound * (hi - lo):
        raise SystemExit(f"bound violated: window {window}, edge {edge}, bound {bound}")
    return a.nbytes / len(blob), _edges(blob)


def stacks(data: str) -> dict[str, np.ndarray]:
    """The three generated smooth fields, and the shared stacks found in ``data``."""
    out = {"heat": heat(), "blobs": blobs(), "grayscott": grayscott()}
    for name in SHARED:
        path = os.path.join(data, f"{name}.npy")
        if os.path.exists(path):
            out[name] = np.load(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data"))
    ap.add_argument("--bounds", default="1e-2,1e-3,1e-4")
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results", "edges.md"))
    args = ap.parse_args(argv)
    bounds = [float(b) for b in args.bounds.split(",")]
    t0 = time.perf_counter()
    head = ("| stack | bound | 32 | 32 + edge | 33 | 33 + edge (v5) | v5 / v4 | SZ3 3-D "
            "| SPERR 3-D | edge used (per window) |")
    lines = [head, "|---" * 10 + "|"]
    for name, a in stacks(args.data).items():
        others = {(r["codec"], r["bound"]): r["ratio"]
                  for r in bench_array(name, a, bounds=bounds, predictors=(),
                                       codecs=("sz3", "sperr"))}
        for b in bounds:
            got = [_tezip(a, b, w, e) for w, e in WAYS]
            r = [g[0] for g in got]
            sz3, sperr = others.get(("SZ3 3-D", b)), others.get(("SPERR 3-D", b))
            cell = [f"{x:.2f}" for x in r]
            best = max(r[3], sz3 or 0, sperr or 0)
            ext = [f"**{v:.2f}**" if v == best else f"{v:.2f}" if v else "-"
                   for v in (sz3, sperr)]
            if r[3] == best:
                cell[3] = f"**{cell[3]}**"
            lines.append(f"| {name} {a.shape[0]}x{a.shape[1]}x{a.shape[2]} | {b:g} | "
                         + " | ".join(cell) + f" | {r[3] / r[0]:.3f}x | " + " | ".join(ext)
                         + f" | {got[1][1]} / {got[3][1]} |")
            print(lines[-1], flush=True)
    text = (f"# Edge extrapolation and windows of 33 frames (format v5)\n\n"
            f"`python benchmarks/edges.py --bounds {args.bounds}` (tezip "
            f"{tezip.__version__}): compression ratio of `--predictor classical` with "
            "windows of 32 or 33 frames, with or without the tuning's edge trial (32 "
            "without: the format-v4 choice), against SZ3 3-D and SPERR 3-D at the same "
            "relative bound; best of v5 and the two others in bold. Last column: per "
            "window, e = linear extrapolation at edges chosen (windows of 32 / 33).\n\n"
            + "\n".join(lines) + f"\n\n{time.perf_counter() - t0:.0f} s.\n")
    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as fh:
        fh.write(text)
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
