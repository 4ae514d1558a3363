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
import sys
from dataclasses import asdict, dataclass
from fractions import Fraction

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
                flag = "--rel-bound" if self.mode == "absrel" and name == "rel" else "--bound"
                raise OptionError(f"mode '{self.mode}' needs a bound ({flag})")
            if not math.isfinite(value) or value <= 0:
                raise OptionError(
                    f"bound must be a positive finite number for mode '{self.mode}', "
                    f"got {value}")
        if self.mode == "pwrel" and self.pw is not None and self.pw >= 1:
            raise OptionError(f"a point-wise relative bound must be below 1, got {self.pw}")
        if self.mode == "pwrel" and self.pw is not None and 1.0 + self.pw == 1.0:
            raise OptionError(f"a point-wise relative bound of {self.pw} is below float64 "
                              "resolution (about 1.1e-16); use --mode lossless to keep the "
                              "values bit-exact")


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


def relative_bound(rel: float, value_range: float | tuple[float, float]) -> float:
    """The largest float <= rel * (max - min), decided exactly: rounding the product (or
    the difference) to nearest may land one ulp above the bound the user was promised."""
    if isinstance(value_range, tuple):
        lo, hi = value_range
        exact = Fraction(rel) * (Fraction(hi) - Fraction(lo))
    else:
        exact = Fraction(rel) * Fraction(value_range)
    if exact > Fraction(sys.float_info.max):
        return sys.float_info.max
    eb = float(exact)
    return math.nextafter(eb, 0.0) if Fraction(eb) > exact else eb


def resolve(bound: ErrorBound, dtype: np.dtype,
            value_range: float | tuple[float, float]) -> QuantParams:
    """Turn the user's bound into grid parameters for this stack (``value_range``: (min,
    max) over the finite values, or their difference; 0 for a constant or all-NaN
    stack). The enforced absolute bound never exceeds the exact one asked for."""
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
        candidates.append(relative_bound(float(bound.rel), value_range))  # type: ignore[arg-type]
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


def find_outliers(x: np.ndarray, out: np.ndarray, p: QuantParams) -> np.ndarray:
    """Flat indices where ``out`` breaks the bound (decided exactly) or, for NaN/Inf, is
    not bit-identical to ``x``; those values are stored exactly."""
    if p.kind in ("identity", "bits"):
        return np.flatnonzero(_ordered_neq(x, out))
    if p.kind == "int":                       # exact in int64
        return np.flatnonzero(np.abs(x.astype(np.int64) - out.astype(np.int64)) > int(p.eb))
    xf, of = x.astype(np.float64), out.astype(np.float64)
    if p.kind == "log":
        limit: np.ndarray | float = p.eb * np.abs(xf)
    else:
        limit = p.eb
    bad = ~_within(xf, of, limit)
    if x.dtype.kind == "f":
        fin = np.isfinite(xf)
        bad = np.where(fin, bad, _ordered_neq(x, out))
    return np.flatnonzero(bad)


def _ordered_neq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.ascontiguousarray(a).view(view) != np.ascontiguousarray(b).view(view)
