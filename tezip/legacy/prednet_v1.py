"""The learned predictor: PredNet forecasts each frame of a window from the reconstructed
frames before it; the codec quantizes the difference (predict-then-quantize).

Determinism. Encoder and decoder must produce the same forecast bit for bit, or the
reconstructions differ. Three measures:
1. The network runs in float64 (with as many intra-op threads as torch is set to use:
   1 and 2 threads give the same bytes, tested), so kernel and summation-order
   differences stay near 1e-16 relative instead of float32's 1e-7.
2. Each forecast is snapped to a grid of 1/64 of the quantization step before use. Two
   machines whose float64 forecasts differ by ~1e-12 (other SIMD kernels, other summation
   order) snap to the same value unless a forecast lies within that distance of a grid
   midpoint, which for float64 noise is vanishingly rare.
3. A CRC of the snapped forecasts is stored per window; a decoder that does not reproduce
   them raises DecodeMismatchError instead of returning different data.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np
import torch

from ..models_path import v1_model_path
from .classical_v1 import GridPrevious, Interpolation, Interpolation2D, Take, _frame_context
from .entropy_v1 import N_BUCKETS
from .models_v1 import LoadedModel, PredNet, load_model
from .quant_v1 import ValueGrid

SNAP = 64.0
_LOCK = threading.Lock()
_MODELS: dict[str, LoadedModel] = {}


def _pad(shape: tuple[int, int], depth: int) -> tuple[int, int]:
    m = 2 ** (depth - 1)
    return (-shape[0]) % m, (-shape[1]) % m


class _Runner:
    """Steps the network over one window, frame by frame, in float64 numpy <-> torch."""

    def __init__(self, net: PredNet, frame_shape: tuple[int, ...], lo: float, scale: float):
        self.net = net
        self.h, self.w = frame_shape[0], frame_shape[1]
        self.c = frame_shape[2] if len(frame_shape) == 3 else 1
        self.gray = len(frame_shape) == 2
        self.ph, self.pw = _pad((self.h, self.w), net.cfg.depth)
        self.lo, self.scale = lo, scale
        like = torch.zeros(1, dtype=torch.float64)
        self.state = net.initial_state(1, self.h + self.ph, self.w + self.pw, like)
        self.prev = self.prev2 = None

    def _to_t(self, frame: np.ndarray) -> torch.Tensor:
        x = (frame - self.lo) / self.scale
        x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        x = x.reshape(self.h, self.w, self.c).transpose(2, 0, 1)[None]
        t = torch.from_numpy(np.ascontiguousarray(x))
        if self.ph or self.pw:
            t = torch.nn.functional.pad(t, (0, self.pw, 0, self.ph), mode="replicate")
        return t

    def forecast(self) -> np.ndarray:
        assert self.prev is not None and self.prev2 is not None
        with torch.no_grad():
            self._f = self.net.forecast(self.prev, self.prev2, self.state)
        f = self._f[0, :, :self.h, :self.w].numpy().transpose(1, 2, 0)
        f = f.reshape((self.h, self.w) if self.gray else (self.h, self.w, self.c))
        return f * self.scale + self.lo

    def push(self, frame: np.ndarray, first: bool = False) -> None:
        t = self._to_t(frame)
        if not first:
            with torch.no_grad():
                self.net.observe(t, self._f, self.state)
        self.prev2 = self.prev if self.prev is not None else t
        self.prev = t


class PredNetPredictor:
    """Keyframe: 2-D interpolation; frames 1..T-1: PredNet forecast, snapped, then
    predict-then-quantize. Contexts as for 'previous'."""

    name = "prednet"
    domain = "value"
    n_contexts = 2 * Interpolation.n_contexts + N_BUCKETS + 1
    spatial = False

    def __init__(self, model: str | None = None) -> None:
        path = str(model or v1_model_path())
        with _LOCK:
            if path not in _MODELS:
                _MODELS[path] = load_model(path)
        self.model = _MODELS[path]
        self.net = self.model.net.to(torch.float64).eval()
        self.hash = self.model.hash
        self.channels = self.model.net.cfg.channels
        self.key = Interpolation2D()
        self.grid_fallback = GridPrevious()
        self.last_forecast_crc = 0

    def _norm(self, rec0: np.ndarray) -> tuple[float, float]:
        fin = rec0[np.isfinite(rec0)]
        if not fin.size:
            return 0.0, 1.0
        lo, hi = float(fin.min()), float(fin.max())   # min/max are exact: same everywhere
        return lo, (hi - lo) if hi > lo else 1.0

    def _snap(self, f: np.ndarray, g: ValueGrid) -> np.ndarray:
        unit = g.step / SNAP
        with np.errstate(invalid="ignore", over="ignore"):
            n = np.rint(f / unit)
        n = np.where(np.abs(n) <= 2.0**52, n, 0.0)
        self._crc = zlib.crc32(n.astype(np.int64).tobytes(), self._crc)
        return n * unit

    def encode(self, y: np.ndarray, g: ValueGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k0, c0, rec0 = self.key.encode(y[:1], g)
        rec = np.empty_like(y)
        rec[0] = rec0[0]
        codes = np.zeros(y.shape, np.int64)
        parts_k, parts_c = [k0], [c0]
        self._crc = 0
        run = _Runner(self.net, y.shape[1:], *self._norm(rec[0]))
        run.push(rec[0], first=True)
        for t in range(1, y.shape[0]):
            p = self._snap(run.forecast(), g)
            if self.spatial:       # the forecast error, coded by 2-D interpolation
                p = np.rint(p) if g.integer else p
                k, c, e = self.key.encode((y[t] - p)[None], g)
                rec[t] = p + e[0]
                parts_k.append(k)
                parts_c.append(c + Interpolation.n_contexts)
            else:
                codes[t], rec[t] = g.quantize(y[t], p)
                parts_k.append(codes[t].ravel())
                parts_c.append(_frame_context(codes[t - 1]).ravel()
                               + (Interpolation.n_contexts - 1))
            run.push(rec[t])
        self.last_forecast_crc = self._crc
        return np.concatenate(parts_k), np.concatenate(parts_c), rec

    def decode(self, shape: tuple[int, ...], g: ValueGrid, take: Take) -> np.ndarray:
        rec = np.empty(shape, np.float64)
        rec[:1] = self.key.decode((1, *shape[1:]), g, take)
        self._crc = 0
        prev_k = np.zeros(shape[1:], np.int64)
        run = _Runner(self.net, shape[1:], *self._norm(rec[0]))
        run.push(rec[0], first=True)
        for t in range(1, shape[0]):
            p = self._snap(run.forecast(), g)
            if self.spatial:
                p = np.rint(p) if g.integer else p
                e = self.key.decode((1, *shape[1:]), g,
                                    lambda c: take(c + Interpolation.n_contexts))
                rec[t] = p + e[0]
            else:
                k = take(_frame_context(prev_k) + (Interpolation.n_contexts - 1))
                k = k.reshape(shape[1:])
                rec[t] = g.reconstruct(p, k)
                prev_k = k
            run.push(rec[t])
        self.last_forecast_crc = self._crc
        return rec


class PredNetSpatialPredictor(PredNetPredictor):
    """PredNet forecast, then the forecast error coded by 2-D interpolation within the
    frame (wins where the error is spatially smooth, loses where it is noise)."""

    name = "prednet+interp"
    spatial = True
