"""Closed-loop vs keyframe-only (open-loop) learned forecasts, measured as real coded size.

    python benchmarks/keyframe_vs_closed_loop.py [--data DIR] [--frames N] [--bounds 1e-3,1e-2]

- closed loop: the shipped ``prednet`` predictor (each frame forecast from the reconstructed
  frames before it), through ``tezip.compress(..., predictor="prednet")``.
- keyframe only: the same model and the same step loop, but after the keyframe the network
  is fed its own snapped forecasts instead of reconstructions, so every forecast of a window
  depends on the keyframe alone (a decoder could compute them all before decoding any
  residual). Registered at run time as ``prednet-keyframe`` and coded through the same
  ``tezip.compress`` path (same quantizer, contexts, entropy coder, container), then
  decoded with ``tezip.decompress`` to check the bound holds.
- previous: the classical previous-frame predictor, ``tezip.compress(..., "previous")``.

Numbers are whole .tez sizes (headers, window metadata, outliers included): bits per value
= 8 * bytes / number of values. A second table gives, per frame offset in the window, the
zeroth-order entropy of the quantized residual codes of both learned schemes.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import tezip  # noqa: E402
from tezip import predictors, quantize  # noqa: E402
from tezip.models_path import default_model_path  # noqa: E402
from tezip.predictors.classical import Interpolation, Take, _frame_context  # noqa: E402
from tezip.predictors.prednet import PredNetPredictor, _Runner  # noqa: E402

WINDOW = 16
OPEN = "prednet-keyframe"


class KeyframePredictor(PredNetPredictor):
    """PredNet forecasts of frames 1..T-1 from the window's keyframe only: the network's
    own snapped forecasts are fed back as its inputs (open loop)."""

    name = OPEN

    def __init__(self, model: str | None = None) -> None:
        super().__init__(model or str(MODEL))

    def _forecasts(self, rec0: np.ndarray, n: int, g: quantize.ValueGrid) -> list[np.ndarray]:
        run = _Runner(self.net, rec0.shape, *self._norm(rec0))
        run.push(rec0, first=True)
        out = []
        for _ in range(1, n):
            p = self._snap(run.forecast(), g)
            out.append(p)
            run.push(p)                      # the forecast, not the reconstruction
        return out

    def encode(self, y: np.ndarray, g: quantize.ValueGrid):
        k0, c0, rec0 = self.key.encode(y[:1], g)
        rec = np.empty_like(y)
        rec[0] = rec0[0]
        codes = np.zeros(y.shape, np.int64)
        parts_k, parts_c = [k0], [c0]
        self._crc = 0
        for t, p in enumerate(self._forecasts(rec[0], y.shape[0], g), start=1):
            codes[t], rec[t] = g.quantize(y[t], p)
            parts_k.append(codes[t].ravel())
            parts_c.append(_frame_context(codes[t - 1]).ravel() + (Interpolation.n_contexts - 1))
        self.last_forecast_crc = self._crc
        self.last_codes = codes
        return np.concatenate(parts_k), np.concatenate(parts_c), rec

    def decode(self, shape: tuple[int, ...], g: quantize.ValueGrid, take: Take) -> np.ndarray:
        rec = np.empty(shape, np.float64)
        rec[:1] = self.key.decode((1, *shape[1:]), g, take)
        self._crc = 0
        prev_k = np.zeros(shape[1:], np.int64)
        for t, p in enumerate(self._forecasts(rec[0], shape[0], g), start=1):
            k = take(_frame_context(prev_k) + (Interpolation.n_contexts - 1)).reshape(shape[1:])
            rec[t] = g.reconstruct(p, k)
            prev_k = k
        self.last_forecast_crc = self._crc
        return rec


class ClosedRecorder(PredNetPredictor):
    """The shipped closed-loop predictor, unchanged; only keeps the codes for the
    per-offset table (used outside the codec path)."""

    def encode(self, y: np.ndarray, g: quantize.ValueGrid):
        codes, ctx, rec = super().encode(y, g)
        n0 = int(np.prod(y.shape[1:]))
        # frames 1.. are the last (T-1)*n0 codes, in frame order (non-spatial path)
        full = np.zeros(y.shape, np.int64)
        full[1:] = codes[-(y.shape[0] - 1) * n0:].reshape(y.shape[0] - 1, *y.shape[1:])
        self.last_codes = full
        return codes, ctx, rec


MODEL = default_model_path()


def entropy0(codes: np.ndarray) -> float:
    _, counts = np.unique(codes, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def offset_entropies(x: np.ndarray, rel: float, pred: PredNetPredictor) -> dict[str, float]:
    """Zeroth-order entropy (bits/value) of the residual codes per group of frame offsets
    within the window, pooled over the windows of ``x``."""
    finite = x[np.isfinite(x)]
    qp = quantize.resolve(tezip.ErrorBound("rel", rel=rel), x.dtype,
                          float(finite.max()) - float(finite.min()))
    g = quantize.value_grid(qp)
    groups = {"1": (1, 2), "2-3": (2, 4), "4-7": (4, 8), "8-15": (8, 16)}
    pooled: dict[str, list[np.ndarray]] = {k: [] for k in groups}
    for t0 in range(0, x.shape[0], WINDOW):
        w = x[t0:t0 + WINDOW]
        if w.shape[0] < 2:
            continue
        pred.encode(quantize.value_domain(w, qp), g)
        for k, (a, b) in groups.items():
            if a < w.shape[0]:
                pooled[k].append(pred.last_codes[a:b].ravel())
    return {k: entropy0(np.concatenate(v)) for k, v in pooled.items() if v}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.environ.get("TEZIP_DATA", "/work/shared/data"))
    ap.add_argument("--frames", type=int, default=0, help="crop each stack to N frames (0: all)")
    ap.add_argument("--bounds", default="1e-3,1e-2")
    ap.add_argument("--no-offsets", action="store_true", help="skip the per-offset table")
    args = ap.parse_args(argv)
    bounds = [float(b) for b in args.bounds.split(",")]
    predictors.register(OPEN, f"{__name__}:KeyframePredictor")

    rows, offs = [], []
    for path in sorted(glob.glob(os.path.join(args.data, "*.npy"))):
        name = os.path.splitext(os.path.basename(path))[0]
        x = np.load(path)
        if args.frames:
            x = x[:args.frames]
        n = x.size
        lo, hi = float(np.nanmin(x)), float(np.nanmax(x))
        for rel in bounds:
            t = time.perf_counter()
            size = {}
            for scheme in ("prednet", OPEN, "previous"):
                blob = tezip.compress(x, "rel", rel, predictor=scheme, window=WINDOW)
                size[scheme] = len(blob)
                if scheme == OPEN:   # the open-loop stream decodes within the bound
                    err = np.abs(tezip.decompress(blob).astype(np.float64) - x).max()
                    assert err <= rel * (hi - lo), (name, rel, err)
            bpv = {k: 8.0 * v / n for k, v in size.items()}
            rows.append((name, x.shape, 8 * x.dtype.itemsize, rel, bpv))
            print(f"{name} {rel:g}: " + ", ".join(f"{k} {v:.4f}" for k, v in bpv.items())
                  + f" ({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
            if not args.no_offsets:
                offs.append((name, rel, offset_entropies(x, rel, ClosedRecorder(str(MODEL))),
                             offset_entropies(x, rel, KeyframePredictor())))

    print("\nReal coded size (whole .tez, bits per value; lower is better), windows of "
          f"{WINDOW} frames, bound = fraction of the value range\n")
    print("| data | shape | bound | closed loop (prednet) | keyframe only | previous "
          "| keyframe vs closed | closed vs previous |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape, raw, rel, b in rows:
        c, o, p = b["prednet"], b[OPEN], b["previous"]
        print(f"| {name} | {'x'.join(map(str, shape))} | {rel:g} | {c:.4f} ({raw / c:.2f}x) "
              f"| {o:.4f} | {p:.4f} | {100 * (o - c) / c:+.1f}% | {100 * (c - p) / p:+.1f}% |")
    if offs:
        print("\nZeroth-order entropy of the residual codes (bits/value) by frame offset in "
              "the window (closed / keyframe only)\n")
        keys = ["1", "2-3", "4-7", "8-15"]
        print("| data | bound | " + " | ".join(f"offset {k}" for k in keys) + " |")
        print("|---|---|" + "---|" * len(keys))
        for name, rel, c, o in offs:
            cells = [f"{c[k]:.3f} / {o[k]:.3f}" if k in c else "-" for k in keys]
            print(f"| {name} | {rel:g} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
