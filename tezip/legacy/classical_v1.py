"""The v1 format's classical predictors (kept so that v1 files decode bit for bit).

Two families, both exact and deterministic (encoder and decoder run the same IEEE
operations in the same order, or pure integer arithmetic):

- *grid* predictors (``zero``, ``spatial``, ``lorenzo``) work on integer codes ``q`` that the
  quantizer put on a fixed grid (dual quantization): residuals are integer differences,
  vectorized over the whole window.
- *value* predictors (``previous``, ``interp``) predict each value from already
  reconstructed values and quantize the prediction error (predict-then-quantize, as SZ
  does), so reconstructions are not tied to a fixed grid: a flat background sitting on a
  grid boundary costs nothing. They run frame by frame (``previous``) or level by level
  (``interp``), vectorized inside each step.

Every predictor also yields a *context* per residual, computed from values the decoder
has before it needs that residual; the entropy coder keeps a model per context class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .entropy_v1 import N_BUCKETS, bucketize
from .quant_v1 import ValueGrid

Take = Callable[[np.ndarray], np.ndarray]


# ---------------------------------------------------------------------------------------
# contexts


def _box_abs(r: np.ndarray) -> np.ndarray:
    """3x3 sum of |r| over the (y, x) axes of a frame (int64, zero padding)."""
    a = np.abs(r.astype(np.int64, copy=False))
    pad = [(1, 1), (1, 1)] + [(0, 0)] * (a.ndim - 2)
    c = np.pad(a, pad).cumsum(0).cumsum(1)
    c = np.pad(c, [(1, 0), (1, 0)] + [(0, 0)] * (a.ndim - 2))
    h, w = a.shape[:2]
    return c[3:3 + h, 3:3 + w] - c[:h, 3:3 + w] - c[3:3 + h, :w] + c[:h, :w]


def _frame_context(prev_codes: np.ndarray) -> np.ndarray:
    return (1 + bucketize(_box_abs(prev_codes))).astype(np.int16)


def _frame_contexts(codes: np.ndarray) -> np.ndarray:
    """Context of every residual of a frame-by-frame predictor: 0 for the keyframe, else
    1 + bucket of the previous frame's residual activity around the pixel."""
    ctx = np.zeros(codes.shape, np.int16)
    for t in range(1, codes.shape[0]):
        ctx[t] = _frame_context(codes[t - 1])
    return ctx


# ---------------------------------------------------------------------------------------
# grid predictors


def _diff(a: np.ndarray, axis: int) -> np.ndarray:
    return np.diff(a, axis=axis, prepend=np.zeros_like(a.take([0], axis=axis)))


def _lorenzo2d(q: np.ndarray) -> np.ndarray:
    """2-D Lorenzo residuals of each frame (axes 1, 2 of a window)."""
    return _diff(_diff(q, 1), 2)


def _unlorenzo2d_frame(r: np.ndarray) -> np.ndarray:
    return np.cumsum(np.cumsum(r, axis=0, dtype=np.int64), axis=1, dtype=np.int64)


class GridPredictor:
    """Frame-sequential predictor on integer grid codes."""

    name = "grid"
    domain = "grid"
    n_contexts = N_BUCKETS + 1

    def residuals(self, q: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def frame(self, t: int, r: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError

    def encode(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = self.residuals(q)
        return r.ravel(), _frame_contexts(r).ravel(), q

    def decode(self, shape: tuple[int, ...], take: Take) -> np.ndarray:
        q = np.empty(shape, np.int64)
        r = np.zeros(shape[1:], np.int64)
        for t in range(shape[0]):
            ctx = _frame_context(r) if t else np.zeros(shape[1:], np.int16)
            r = take(ctx).reshape(shape[1:])
            q[t] = self.frame(t, r, q[t - 1] if t else None)
        return q


class Zero(GridPredictor):
    """No prediction: the codes themselves (noise-like data)."""

    name = "zero"

    def residuals(self, q: np.ndarray) -> np.ndarray:
        return q.copy()

    def frame(self, t: int, r: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
        return r


class Lorenzo2D(GridPredictor):
    """2-D Lorenzo within each frame (no use of time)."""

    name = "spatial"

    def residuals(self, q: np.ndarray) -> np.ndarray:
        return _lorenzo2d(q)

    def frame(self, t: int, r: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
        return _unlorenzo2d_frame(r)


class Lorenzo3D(GridPredictor):
    """3-D Lorenzo over (t, y, x); on the keyframe it reduces to 2-D Lorenzo."""

    name = "lorenzo"

    def residuals(self, q: np.ndarray) -> np.ndarray:
        return _diff(_lorenzo2d(q), 0)

    def frame(self, t: int, r: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
        d = _unlorenzo2d_frame(r)
        return d if prev is None else prev + d


class GridPrevious(GridPredictor):
    """Previous frame on grid codes (used for bit-exact float coding)."""

    name = "previous"

    def residuals(self, q: np.ndarray) -> np.ndarray:
        r = _diff(q, 0)
        r[:1] = _lorenzo2d(q[:1])
        return r

    def frame(self, t: int, r: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
        return _unlorenzo2d_frame(r) if prev is None else prev + r


# ---------------------------------------------------------------------------------------
# value predictors


def _sl(ndim: int, axis: int, s: slice) -> tuple[slice, ...]:
    idx = [slice(None)] * ndim
    idx[axis] = s
    return tuple(idx)


def _interp_steps(shape: tuple[int, ...], axes: tuple[int, ...]) -> Iterator[tuple]:
    """(selection, axis, stride) from coarse to fine: at stride s along axis d, the points
    at odd multiples of s along d (multiples of s along the axes before d, of 2s after)."""
    top = 1
    while top < max(shape[a] for a in axes):
        top *= 2
    s = top // 2
    while s >= 1:
        for d in axes:
            sel = [slice(None)] * len(shape)
            for a in axes:
                sel[a] = slice(None, None, s if a <= d else 2 * s)
            if shape[d] > s:
                yield tuple(sel), d, s
        s //= 2


def _interp_predict(line: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Predict the odd entries along ``d`` of ``line`` from its even entries: cubic with
    four neighbours, linear with two, else the left one. Also returns |left - right|
    (0 without a right neighbour), the local variation used as context."""
    nd = line.ndim
    even = line[_sl(nd, d, slice(0, None, 2))]
    n_odd = line.shape[d] // 2
    n_even = even.shape[d]
    left = even[_sl(nd, d, slice(0, n_odd))]
    pred = left.copy()
    var = np.zeros_like(left)
    n_lin = min(n_odd, n_even - 1)
    if n_lin > 0:
        a = even[_sl(nd, d, slice(0, n_lin))]
        b = even[_sl(nd, d, slice(1, n_lin + 1))]
        pred[_sl(nd, d, slice(0, n_lin))] = (a + b) * 0.5
        var[_sl(nd, d, slice(0, n_lin))] = np.abs(a - b)
    hi = min(n_odd, n_even - 2)
    if hi > 1:
        a = even[_sl(nd, d, slice(0, hi - 1))]
        b = even[_sl(nd, d, slice(1, hi))]
        c = even[_sl(nd, d, slice(2, hi + 1))]
        e = even[_sl(nd, d, slice(3, hi + 2))]
        pred[_sl(nd, d, slice(1, hi))] = (9.0 * (b + c) - (a + e)) * 0.0625
    return pred, var


def _var_context(var: np.ndarray, step: float, fine: bool) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.floor(np.minimum(var / step, 2.0**62))
    v = np.where(np.isfinite(v), v, 2.0**62).astype(np.int64)
    return (bucketize(v) + (0 if fine else N_BUCKETS)).astype(np.int16)


class Interpolation:
    """Multilevel interpolation (the family SZ3 uses by default), predict-then-quantize:
    coarse-to-fine over (t, y, x); each level predicts odd points along one axis from
    reconstructed even ones (cubic / linear / nearest at borders)."""

    name = "interp"
    domain = "value"
    n_contexts = 2 * N_BUCKETS + 1
    axes: tuple[int, ...] = (0, 1, 2)

    def __init__(self) -> None:
        self.grid_fallback = Lorenzo3D()

    def _origin(self, ndim: int) -> tuple:
        """The anchor points: coordinate 0 on every interpolated axis."""
        return tuple(0 if a in self.axes else slice(None) for a in range(ndim))

    def encode(self, y: np.ndarray, g: ValueGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rec = np.empty_like(y)
        codes, ctxs = [], []
        origin = self._origin(y.ndim)
        k, rec[origin] = g.quantize(y[origin], np.zeros(y[origin].shape))
        codes.append(k.ravel())
        ctxs.append(np.full(k.size, 2 * N_BUCKETS, np.int16))
        for sel, d, s in _interp_steps(y.shape, self.axes):
            line = rec[sel]
            odd = _sl(line.ndim, d, slice(1, None, 2))
            pred, var = _interp_predict(line, d)
            k, line[odd] = g.quantize(y[sel][odd], pred)
            codes.append(k.ravel())
            ctxs.append(_var_context(var, g.step, s == 1).ravel())
        return np.concatenate(codes), np.concatenate(ctxs), rec

    def decode(self, shape: tuple[int, ...], g: ValueGrid, take: Take) -> np.ndarray:
        rec = np.empty(shape, np.float64)
        origin = self._origin(len(shape))
        n0 = rec[origin].size
        k = take(np.full(n0, 2 * N_BUCKETS, np.int16)).reshape(rec[origin].shape)
        rec[origin] = g.reconstruct(np.zeros(k.shape), k)
        for sel, d, s in _interp_steps(shape, self.axes):
            line = rec[sel]
            odd = _sl(line.ndim, d, slice(1, None, 2))
            pred, var = _interp_predict(line, d)
            k = take(_var_context(var, g.step, s == 1)).reshape(pred.shape)
            line[odd] = g.reconstruct(pred, k)
        return rec


class Interpolation2D(Interpolation):
    axes = (1, 2)


class Previous:
    """The previous reconstructed frame, predict-then-quantize; the keyframe is coded with
    2-D interpolation."""

    name = "previous"
    domain = "value"
    n_contexts = Interpolation.n_contexts + N_BUCKETS + 1

    def __init__(self) -> None:
        self.key = Interpolation2D()
        self.grid_fallback = GridPrevious()

    def encode(self, y: np.ndarray, g: ValueGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k0, c0, rec0 = self.key.encode(y[:1], g)
        rec = np.empty_like(y)
        rec[0] = rec0[0]
        codes = np.zeros(y.shape, np.int64)   # frame 0's entry is a neutral context only
        for t in range(1, y.shape[0]):
            codes[t], rec[t] = g.quantize(y[t], rec[t - 1])
        ctx = _frame_contexts(codes)[1:] + (Interpolation.n_contexts - 1)
        return (np.concatenate([k0, codes[1:].ravel()]),
                np.concatenate([c0, ctx.ravel()]), rec)

    def decode(self, shape: tuple[int, ...], g: ValueGrid, take: Take) -> np.ndarray:
        rec = np.empty(shape, np.float64)
        rec[:1] = self.key.decode((1, *shape[1:]), g, take)
        prev_k = np.zeros(shape[1:], np.int64)
        for t in range(1, shape[0]):
            k = take(_frame_context(prev_k) + (Interpolation.n_contexts - 1)).reshape(shape[1:])
            rec[t] = g.reconstruct(rec[t - 1], k)
            prev_k = k
        return rec
