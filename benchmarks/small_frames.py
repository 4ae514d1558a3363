"""Stacks of small frames: tezip classical with windows of 33 frames (the fixed default
before 0.7.6) and with the automatic windows (``windows.window_length``: as many frames as
hold 262,144 values), against SZ3 3-D, one core each, best of ``--repeat`` timings.

    python benchmarks/small_frames.py [--ks DIR] [--frames 2048] [--repeat 3]
        [--bounds 1e-2,1e-3,1e-4] [--md benchmarks/results/small_frames.md]

The stacks are built here, none is played back and forth (SZ3's zstd stage finds the
repeats of a stack played forward and backward: on smoke's 64 x 64 crop lengthened to
1,024 frames it read 21.9 at 1e-4, against 5.8 on the 64 frames themselves):

- Gray-Scott reaction-diffusion (``edges.py``'s, numpy: a 64 x 64 periodic grid, v every
  10 steps after 2,000 steps of spin-up) and its central 32 x 32 and 16 x 16 crops;
- with ``--ks DIR`` (a directory where ``pip install --target DIR py-pde==0.59.0`` put
  py-pde, as ``datasets/build.py`` does for ``ks_pypde``): the Kuramoto-Sivashinsky
  equation (py-pde, nu = 1) on periodic 32 x 32 grids of side 32 after 60 time units,
  a frame every 0.25, and its central 16 x 16 crop;
- with ``--walks``: every pixel a random walk of its own (float32, 2^21 values), as
  frames of 1 x 1, 4 x 4 and 8 x 8.

Every file is decoded and checked against the bound.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_KS = r"""
import sys, numpy as np, pde
n, frames, every, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
grid = pde.CartesianGrid([[0.0, float(n)], [0.0, float(n)]], [n, n], periodic=True)
state = pde.ScalarField.random_uniform(grid, -0.01, 0.01, rng=np.random.default_rng(1))
store = pde.MemoryStorage()
times = [60.0 + i * every for i in range(frames)]
pde.KuramotoSivashinskyPDE(nu=1.0).solve(state, t_range=times[-1], dt=0.01, adaptive=True,
                                        tracker=[store.tracker(times)])
d = np.asarray(store.data)
np.save(out, (d - d.mean(axis=(1, 2), keepdims=True)).astype(np.float32))
"""


def crop(a: np.ndarray, side: int) -> np.ndarray:
    h, w = a.shape[1:3]
    y, x = (h - side) // 2, (w - side) // 2
    return np.ascontiguousarray(a[:, y:y + side, x:x + side])


def best(fn, repeat: int):  # noqa: ANN001, ANN201
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        r = fn()
        t = time.perf_counter() - t
        if out is None or t < out[0]:
            out = (t, r)
    return out


def sz3(a: np.ndarray, eb: float, repeat: int) -> tuple[float, float, float]:
    import pysz

    cfg = pysz.szConfig(a.shape)
    cfg.errorBoundMode = pysz.szErrorBoundMode.ABS
    cfg.absErrorBound = float(eb)
    te, (comp, _) = best(lambda: pysz.sz.compress(a, cfg), repeat)
    td, dec = best(lambda: pysz.sz.decompress(comp, a.dtype, a.shape), repeat)
    dec = dec[0] if isinstance(dec, tuple) else dec
    assert float(np.max(np.abs(dec.astype(np.float64) - a))) <= eb
    return a.nbytes / comp.nbytes, a.nbytes / te / 1e6, a.nbytes / td / 1e6


def tez(a: np.ndarray, bound: float, eb: float, window: int | None,
        repeat: int) -> tuple[float, float, float, int]:
    import tezip

    kw = dict(mode="rel", bound=bound, predictor="classical", threads=1, window=window)
    tezip.compress(a, **kw)
    te, blob = best(lambda: tezip.compress(a, **kw), repeat)
    td, dec = best(lambda: tezip.decompress(blob, threads=1), repeat)
    assert float(np.max(np.abs(dec.astype(np.float64) - a))) <= eb
    return (a.nbytes / len(blob), a.nbytes / te / 1e6, a.nbytes / td / 1e6,
            tezip.TezFile(blob).window)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", help="a pip --target directory holding py-pde 0.59.0")
    ap.add_argument("--frames", type=int, default=2048)
    ap.add_argument("--walks", action="store_true", help="also random walks, tiny frames")
    ap.add_argument("--bounds", default="1e-2,1e-3,1e-4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results",
                                                 "small_frames.md"))
    args = ap.parse_args(argv)
    import tezip

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from edges import grayscott

    gs = grayscott(t=args.frames, n=64, every=10)
    stacks = {f"gray_scott_{s}": crop(gs, s) for s in (16, 32, 64)}
    if args.ks:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ks.npy")
            subprocess.run([sys.executable, "-c", _KS, "32", str(args.frames), "0.25", path],
                           env={**os.environ, "PYTHONPATH": args.ks}, check=True)
            ks = np.load(path)
        stacks.update({"ks_16": crop(ks, 16), "ks_32": ks})
    if args.walks:
        walk = np.random.default_rng(0).normal(size=1 << 21).astype(np.float32)
        for s in (1, 4, 8):
            stacks[f"random_walks_{s}"] = np.cumsum(walk.reshape(-1, s, s), axis=0,
                                                    dtype=np.float32)
    lines = [
        "# Small frames: windows of 33 frames against the automatic windows",
        "",
        f"`python benchmarks/small_frames.py {' '.join(argv or sys.argv[1:])}`, tezip "
        f"{tezip.__version__}, {time.strftime('%Y-%m-%d')}, this project's 2-core machine, "
        f"one core per codec, best of {args.repeat}. Ratio (encode / decode MB/s); "
        "`window`: the frames per window the file holds (a joined tail makes the last "
        "longer). Bound: a fraction of the stack's value range.",
        "",
        "| stack | bound | SZ3 3-D | tezip, windows of 33 | tezip, automatic | window | "
        "auto / 33 | auto / SZ3 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, a in stacks.items():
        rng = float(a.max()) - float(a.min())
        for b in (float(v) for v in args.bounds.split(",")):
            eb = b * rng
            s = sz3(a, eb, args.repeat)
            f = tez(a, b, eb, 33, args.repeat)
            g = tez(a, b, eb, None, args.repeat)
            row = (f"| {name} {a.shape[0]}x{a.shape[1]}x{a.shape[2]} | {b:g} | "
                   f"{s[0]:.2f} ({s[1]:.0f} / {s[2]:.0f}) | {f[0]:.2f} ({f[1]:.0f} / "
                   f"{f[2]:.0f}) | {g[0]:.2f} ({g[1]:.0f} / {g[2]:.0f}) | {g[3]} | "
                   f"{g[0] / f[0]:.2f}x | {g[0] / s[0]:.2f}x |")
            print(row, flush=True)
            lines.append(row)
    from tezip.atomic import atomic_output

    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
