"""The v1 format's quantization helpers: dual quantization onto a fixed grid (grid
predictors) and the predict-then-quantize rule of its value predictors. Kept so that v1
files decode bit for bit; v2 quantizes inside the compiled kernels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..quantize import _MAX_CODE, QuantParams, _from_ordered_bits, _ordered_bits

# ---------------------------------------------------------------------------------------
# predict-then-quantize rule (value predictors)


@dataclass(frozen=True)
class ValueGrid:
    """Reconstruction levels around a prediction: ``step`` apart, ``eb`` the bound;
    ``integer`` rounds the prediction first so every reconstruction is an integer."""

    step: float
    eb: float
    integer: bool

    def quantize(self, y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Codes and reconstructions of values ``y`` given predictions ``p``."""
        with np.errstate(invalid="ignore", over="ignore"):
            if self.integer:
                p = np.rint(p)
                k = np.floor((y - p + self.eb) / self.step)
            else:
                k = np.rint((y - p) / self.step)
            k = np.where(np.abs(k) <= _MAX_CODE, k, 0.0)   # NaN, Inf, overflow: outliers
        k = k.astype(np.int64)   # reconstruct from the integer, exactly as the decoder does
        return k, self.reconstruct(p, k)

    def reconstruct(self, p: np.ndarray, k: np.ndarray) -> np.ndarray:
        if self.integer:
            p = np.rint(p)
        with np.errstate(invalid="ignore", over="ignore"):
            return p + np.asarray(k).astype(np.float64) * self.step


def value_grid(p: QuantParams) -> ValueGrid:
    if p.kind == "float":
        return ValueGrid(p.step, p.eb, False)
    if p.kind == "int":
        return ValueGrid(p.step, p.eb, True)
    if p.kind == "identity":
        return ValueGrid(1.0, 0.0, True)
    if p.kind == "log":
        return ValueGrid(p.step, p.step / 2, False)
    raise ValueError(f"no value-domain coding for quantizer kind {p.kind}")


# ---------------------------------------------------------------------------------------
# forward


@dataclass
class Masks:
    """Point-wise relative mode: sign bit and exact-zero flag of every value (flat)."""

    signs: np.ndarray
    zeros: np.ndarray


def masks(x: np.ndarray, p: QuantParams) -> Masks | None:
    if p.kind != "log":
        return None
    return Masks(np.signbit(x).ravel(), (x == 0).ravel())


def value_domain(x: np.ndarray, p: QuantParams) -> np.ndarray:
    """Values as float64 in the domain value predictors work in (log2|x| for pwrel);
    values that cannot be coded (NaN, Inf, zeros under pwrel) become NaN and are coded
    as 'no change' and restored exactly afterwards."""
    y = x.astype(np.float64)
    if p.kind != "log":
        return y
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log2(np.abs(y))
    y[~np.isfinite(y)] = np.nan
    return y


def grid_codes(x: np.ndarray, p: QuantParams) -> np.ndarray:
    """Integer codes on the fixed grid (grid predictors, dual quantization)."""
    if p.kind == "identity":
        return x.astype(np.int64)
    if p.kind == "bits":
        return _ordered_bits(np.ascontiguousarray(x))
    if p.kind == "int":
        return np.floor_divide(x.astype(np.int64) + int(p.eb), int(p.step))
    y = value_domain(x, p)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        qf = np.rint(y / p.step)
    bad = ~(np.abs(qf) <= _MAX_CODE)            # NaN, Inf and overflowing codes
    if bad.any():
        ok = qf[~bad]
        qf[bad] = ok.min() if ok.size else 0.0   # any value decodes right after outliers
    return qf.astype(np.int64)


# ---------------------------------------------------------------------------------------
# backward


def _to_dtype(v: np.ndarray, p: QuantParams, m: Masks | None) -> np.ndarray:
    dtype = np.dtype(p.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        if p.kind == "log":
            assert m is not None
            mag = np.exp2(v).reshape(-1)
            mag[m.zeros] = 0.0
            v = np.where(m.signs, -mag, mag).reshape(v.shape)
        if dtype.kind == "f":
            return v.astype(dtype)
        info = np.iinfo(dtype)
        v = np.where(np.isfinite(v), v, 0.0)
        return np.clip(np.rint(v), info.min, info.max).astype(dtype)


def from_grid(q: np.ndarray, p: QuantParams, m: Masks | None) -> np.ndarray:
    """Grid codes -> values in ``p.dtype`` (outliers not yet applied)."""
    dtype = np.dtype(p.dtype)
    if p.kind == "identity":
        return q.astype(dtype)
    if p.kind == "bits":
        return _from_ordered_bits(q, dtype)
    if p.kind == "int":
        info = np.iinfo(dtype)
        return np.clip(q * int(p.step), info.min, info.max).astype(dtype)
    return _to_dtype(q.astype(np.float64) * p.step, p, m)


def from_values(y: np.ndarray, p: QuantParams, m: Masks | None) -> np.ndarray:
    """Value-domain reconstructions -> values in ``p.dtype`` (outliers not yet applied)."""
    return _to_dtype(y, p, m)


