"""Error-bound modes: map values onto an integer grid and back.

Every mode turns a window of values into int64 *codes* ``q`` on which the predictors work
with exact integer arithmetic (dual quantization: the grid value is the reconstruction, so
prediction from reconstructed values needs no per-pixel loop), plus a set of *outliers*:
positions whose value cannot be reproduced within the bound from the grid (NaN, +/-Inf,
values whose grid index would overflow, and values a float rounding would push past the
bound). Outliers are stored exactly, bit for bit.

Kinds of grid (``QuantParams.kind``):

- ``int``: integer data, absolute bound ``e >= 1`` (integer part of the bound); step
  ``2e+1``, exact integer arithmetic, never an outlier.
- ``float``: float data, absolute bound ``e``; step ``2e``; every reconstructed value is
  checked against the original with an exact (error-free) subtraction.
- ``log``: point-wise relative bound ``b``: log2|x| on a grid of step ``2 log2(1+b)``,
  signs and exact zeros kept in bit masks; checked like ``float``.
- ``identity``: lossless integers (codes are the values).
- ``bits``: lossless floats (codes are the IEEE bit patterns mapped to ordered integers,
  so NaN payloads and -0.0 survive).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .errors import OptionError, UnsupportedError

MODES = ("abs", "rel", "absrel", "pwrel", "lossless")
INT_DTYPES = ("uint8", "uint16", "int16", "int32")
FLOAT_DTYPES = ("float32", "float64")
SUPPORTED_DTYPES = INT_DTYPES + FLOAT_DTYPES
# grid indices beyond this are outliers: q * step stays exact in float64 and the
# predictors' integer sums of a few codes cannot overflow int64.
_MAX_CODE = float(2**52)
_MAX_INT_EB = 2**40


@dataclass(frozen=True)
class ErrorBound:
    """What the user asked for. ``abs``: absolute bound; ``rel``: fraction of the value
    range; ``absrel``: both (the tighter wins); ``pwrel``: |x - x'| <= pw * |x|."""

    mode: str
    abs: float | None = None
    rel: float | None = None
    pw: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError(f"unknown mode '{self.mode}'; choose one of {', '.join(MODES)}")
        need = {"abs": ("abs",), "rel": ("rel",), "absrel": ("abs", "rel"), "pwrel": ("pw",),
                "lossless": ()}[self.mode]
        for name in need:
            value = getattr(self, name)
            if value is None:
                raise OptionError(f"mode '{self.mode}' needs a bound (--bound)")
            if not math.isfinite(value) or value <= 0:
                raise OptionError(
                    f"bound must be a positive finite number for mode '{self.mode}', "
                    f"got {value}")
        if self.mode == "pwrel" and self.pw is not None and self.pw >= 1:
            raise OptionError(f"a point-wise relative bound must be below 1, got {self.pw}")


@dataclass(frozen=True)
class QuantParams:
    """The resolved grid, stored in the .tez header; enough to decode."""

    kind: str          # int | float | log | identity | bits
    dtype: str
    step: float = 0.0  # grid step (int: an integer stored as float)
    eb: float = 0.0    # the absolute (or point-wise relative, for log) bound enforced

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> QuantParams:
        kind, dtype = d.get("kind"), d.get("dtype")
        step, eb = d.get("step"), d.get("eb")
        if kind not in ("int", "float", "log", "identity", "bits") or dtype not in SUPPORTED_DTYPES:
            raise ValueError("bad quantizer parameters")
        if not isinstance(step, (int, float)) or not isinstance(eb, (int, float)):
            raise ValueError("bad quantizer parameters")
        if kind in ("int", "float", "log") and not (math.isfinite(step) and step > 0):
            raise ValueError("bad quantizer step")
        if kind == "int" and (step != int(step) or step > 2 * _MAX_INT_EB + 1):
            raise ValueError("bad integer quantizer step")
        return cls(kind=kind, dtype=dtype, step=float(step), eb=float(eb))


def check_dtype(dtype: np.dtype) -> str:
    name = np.dtype(dtype).newbyteorder("=").name
    if name not in SUPPORTED_DTYPES:
        raise UnsupportedError(
            f"dtype {np.dtype(dtype)} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
    return name


def resolve(bound: ErrorBound, dtype: np.dtype, value_range: float) -> QuantParams:
    """Turn the user's bound into grid parameters for this stack (``value_range`` is
    max - min over the finite values; 0 for a constant or all-NaN stack)."""
    name = check_dtype(dtype)
    is_int = name in INT_DTYPES
    if bound.mode == "lossless":
        return QuantParams("identity" if is_int else "bits", name)
    if bound.mode == "pwrel":
        assert bound.pw is not None
        return QuantParams("log", name, step=2.0 * math.log2(1.0 + bound.pw), eb=bound.pw)
    candidates = []
    if bound.mode in ("abs", "absrel"):
        candidates.append(float(bound.abs))  # type: ignore[arg-type]
    if bound.mode in ("rel", "absrel"):
        candidates.append(float(bound.rel) * float(value_range))  # type: ignore[arg-type]
    eb = min(candidates)
    if is_int:
        e = math.floor(min(eb, _MAX_INT_EB))  # beyond any integer range: same result
        if e < 1:
            return QuantParams("identity", name)
        return QuantParams("int", name, step=float(2 * e + 1), eb=float(e))
    if not eb > 0 or not math.isfinite(eb):
        # a constant stack under a relative bound: nothing may change, code it exactly
        return QuantParams("bits", name)
    eb = min(eb, 1e300)  # keeps the step finite; larger bounds change nothing
    return QuantParams("float", name, step=2.0 * eb, eb=eb)


# ---------------------------------------------------------------------------------------
# exact checks


def _within(x: np.ndarray, y: np.ndarray, limit: np.ndarray | float) -> np.ndarray:
    """|x - y| <= limit, decided exactly for float64 x, y (TwoSum error term)."""
    with np.errstate(over="ignore", invalid="ignore"):
        b = -y
        s = x + b
        bb = s - x
        t = (x - (s - bb)) + (b - bb)
        a = np.abs(s)
        ok = a < limit
        at = (a == limit) & (np.sign(s) * t <= 0)
    return ok | at


# ---------------------------------------------------------------------------------------
# forward


@dataclass
class Quantized:
    q: np.ndarray                 # int64 codes, same shape as the window
    outliers: np.ndarray          # flat indices (int64, sorted) of exactly stored values
    values: np.ndarray            # the outliers' original values, native dtype
    signs: np.ndarray | None = None   # log kind: sign bit per value (bool, flat)
    zeros: np.ndarray | None = None   # log kind: exact zero per value (bool, flat)


def _ordered_bits(x: np.ndarray) -> np.ndarray:
    """IEEE bit pattern -> integer whose order follows the float order (a bijection)."""
    if x.dtype == np.float32:
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, i ^ 0x7FFFFFFF, i)
    i = x.view(np.int64)
    return np.where(i < 0, i ^ 0x7FFFFFFFFFFFFFFF, i)


def _from_ordered_bits(q: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.float32:
        i = np.where(q < 0, q ^ 0x7FFFFFFF, q).astype(np.int32)
        return i.view(np.float32)
    i = np.where(q < 0, q ^ 0x7FFFFFFFFFFFFFFF, q).astype(np.int64)
    return i.view(np.float64)


def quantize(x: np.ndarray, p: QuantParams) -> Quantized:
    """Codes and outliers for one window ``x`` (native byte order, dtype ``p.dtype``)."""
    empty_i = np.zeros(0, np.int64)
    empty_v = np.zeros(0, x.dtype)
    if p.kind == "identity":
        return Quantized(x.astype(np.int64), empty_i, empty_v)
    if p.kind == "bits":
        return Quantized(_ordered_bits(np.ascontiguousarray(x)), empty_i, empty_v)
    if p.kind == "int":
        e, s = int(p.eb), int(p.step)
        q = np.floor_divide(x.astype(np.int64) + e, s)
        return Quantized(q, empty_i, empty_v)
    xf = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if p.kind == "float":
            qf = np.rint(xf / p.step)
            bad = ~(np.abs(qf) <= _MAX_CODE)           # NaN, Inf and overflowing codes
            qf[bad] = 0.0
            q = qf.astype(np.int64)
            recon = dequantize_values(q, p, None, None).astype(np.float64)
            bad |= ~_within(xf, recon, p.eb)
            signs = zeros = None
        else:  # log
            a = np.abs(xf)
            zero = a == 0
            signs_full = np.signbit(xf)
            qf = np.rint(np.log2(np.where(zero, 1.0, a)) / p.step)
            bad = ~np.isfinite(xf) | ~(np.abs(qf) <= _MAX_CODE)
            qf[bad] = 0.0
            live = ~(zero | bad)
            fill = qf[live].min() if live.any() else 0.0
            qf[zero] = fill    # any value decodes to 0 under the mask; pick a smooth one
            q = qf.astype(np.int64)
            recon = dequantize_values(q, p, signs_full.ravel(), zero.ravel()).astype(np.float64)
            bad |= ~_within(xf, recon, p.eb * a)
            signs, zeros = signs_full.ravel(), zero.ravel()
    flat_bad = np.flatnonzero(bad)
    return Quantized(q, flat_bad.astype(np.int64), np.ascontiguousarray(x).ravel()[flat_bad],
                     signs, zeros)


# ---------------------------------------------------------------------------------------
# backward


def dequantize_values(q: np.ndarray, p: QuantParams, signs: np.ndarray | None,
                      zeros: np.ndarray | None) -> np.ndarray:
    """Grid codes -> values in ``p.dtype`` (outliers not yet applied)."""
    dtype = np.dtype(p.dtype)
    if p.kind == "identity":
        return q.astype(dtype)
    if p.kind == "bits":
        return _from_ordered_bits(q, dtype)
    if p.kind == "int":
        info = np.iinfo(dtype)
        v = q * int(p.step)
        return np.clip(v, info.min, info.max).astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        if p.kind == "float":
            v = q.astype(np.float64) * p.step
        else:
            assert signs is not None and zeros is not None
            mag = np.exp2(q.astype(np.float64) * p.step).reshape(-1)
            mag[zeros] = 0.0
            v = np.where(signs, -mag, mag).reshape(q.shape)
        if dtype.kind == "f":
            return v.astype(dtype)
        info = np.iinfo(dtype)
        return np.clip(np.rint(v), info.min, info.max).astype(dtype)


def dequantize(qz: Quantized, p: QuantParams) -> np.ndarray:
    out = dequantize_values(qz.q, p, qz.signs, qz.zeros)
    if qz.outliers.size:
        out.reshape(-1)[qz.outliers] = qz.values
    return out
