"""Error bounds: what the user asks for (``ErrorBound``), the resolved parameters stored
in a file's header (``QuantParams``), and one quantizer class per kind that tells the
compiled kernels how to turn values into integer codes and back.

Kinds (``QuantParams.kind``) and their quantizers:

- ``float`` (``FloatQuantizer``): float data, absolute bound ``e``; codes are multiples of
  ``2e`` around a prediction; every reconstruction, rounded to the data's type, is
  checked against the original exactly (error-free subtraction), and a value that fails
  is stored exactly (an outlier), as are NaN and +-Inf, bit for bit.
- ``int`` / ``identity`` (``IntQuantizer``): integer data, bound ``e >= 1`` (the integer
  part of the bound) or lossless (``e = 0``); step ``2e+1`` around the rounded
  prediction, exact in integer arithmetic.
- ``log`` (``LogQuantizer``): point-wise relative bound ``b``: log2|x| on a grid of step
  ``2 log2(1+b)`` around a prediction, signs and exact zeros kept in bit masks; checked
  exactly like ``float``.
- ``bits`` (``BitsQuantizer``): lossless floats: the IEEE bit patterns mapped to ordered
  integers, so NaN payloads and -0.0 survive.

Level-wise bounds: multilevel predictors may quantize their coarse levels with a tighter
bound (``levels``); the bound every value is checked against stays the user's.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import ClassVar

import numpy as np

from .errors import OptionError, UnsupportedError
from .kernels.consts import MODE_FLOAT, MODE_INT, MODE_LOG, OUT_F32, OUT_F64, OUT_INT

MODES = ("abs", "rel", "absrel", "pwrel", "lossless")
INT_DTYPES = ("uint8", "uint16", "int16", "int32")
FLOAT_DTYPES = ("float32", "float64")
SUPPORTED_DTYPES = INT_DTYPES + FLOAT_DTYPES
# grid indices beyond this are outliers: q * step stays exact in float64 and the
# predictors' integer sums of a few codes cannot overflow int64.
_MAX_CODE = float(2**52)
_MAX_INT_EB = 2**40
_MIN_FLOAT_EB = 2.0 ** -1000  # below: bit-exact (1 / step stays finite at every level)


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


#: the largest magnitude up to which every integer is a value of the float type
EXACT_INTEGERS = {"float32": 2.0**24, "float64": 2.0**53}


def resolve(bound: ErrorBound, dtype: np.dtype,
            value_range: float | tuple[float, float], integral: bool = False) -> QuantParams:
    """Turn the user's bound into grid parameters for this stack (``value_range``: (min,
    max) over the finite values, or their difference; 0 for a constant or all-NaN
    stack). The enforced absolute bound never exceeds the exact one asked for.
    ``integral``: every value of a float stack is finite and an integer (``value_range``
    then (min, max)); where its bound is an integer e >= 1 and at most half more, it is
    coded as integers are (kind "int", bins of 2e + 1 integers, reconstructions that are
    integers), when every integer it may reconstruct is a value of its type. Its own grid
    (bins 2e wide, around predictions that are not integers) covers 2e or 2e + 1 of them:
    detector counts in float32 coded 3.2x as large as in uint16 at abs 2, 1.15x at rel
    1e-4; at abs 1.9, where the integers' bins are 1.58x narrower, 0.97x."""
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
    if integral and not is_int and isinstance(value_range, tuple):
        e = math.floor(min(eb, _MAX_INT_EB))
        top = max(abs(float(value_range[0])), abs(float(value_range[1])))
        if e >= 1 and eb - e <= 0.5 and top <= EXACT_INTEGERS[name] - (2 * e + 1):
            return QuantParams("int", name, step=float(2 * e + 1), eb=float(e))
    if is_int:
        e = math.floor(min(eb, _MAX_INT_EB))  # beyond any integer range: same result
        if e < 1:
            return QuantParams("identity", name)
        return QuantParams("int", name, step=float(2 * e + 1), eb=float(e))
    if not eb >= _MIN_FLOAT_EB or not math.isfinite(eb):
        # a constant stack under a relative bound: nothing may change, code it exactly;
        # so too a bound so small that the reciprocal of a level's step would overflow
        # (only a value within it of a subnormal differs from that value): bit-exact
        # coding meets it
        return QuantParams("bits", name)
    eb = min(eb, 1e300)  # keeps the step finite; larger bounds change nothing
    return QuantParams("float", name, step=2.0 * eb, eb=eb)


# ---------------------------------------------------------------------------------------
# quantizers: one class per kind


N_LEVELS = 40


@dataclass(frozen=True)
class Quantizer:
    """A resolved bound as the kernels use it: ``mode`` (kernel specialisation), the
    output type and its range, the bound checked (``eb``) and the steps per level."""

    qp: QuantParams
    mode: ClassVar[int] = -1

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.qp.dtype)

    @property
    def otype(self) -> int:
        if self.dtype.kind in "iu":
            return OUT_INT
        return OUT_F32 if self.dtype == np.float32 else OUT_F64

    @property
    def range(self) -> tuple[float, float]:
        if self.dtype.kind in "iu":
            info = np.iinfo(self.dtype)
            return float(info.min), float(info.max)
        return -math.inf, math.inf

    @property
    def eb(self) -> float:
        return self.qp.eb

    def levels(self, alpha: float = 1.0, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(step, integer bound) per level l = 1.. (index l): level l uses the bound
        divided by min(alpha^(l-1), beta), never more than the user's."""
        raise NotImplementedError

    @staticmethod
    def _factors(alpha: float, beta: float) -> np.ndarray:
        return _level_factors(float(alpha), float(beta))


@functools.lru_cache(maxsize=256)
def _level_factors(alpha: float, beta: float) -> np.ndarray:
    """The divisors of ``Quantizer.levels`` (read-only; cached: every window decoded and
    every tuning trial asks for them, and building them took 3.9 us a call, 0.7 us
    with the cache, of the some 80 us of Python a small window's decoding pays)."""
    f = np.ones(N_LEVELS)
    f[1:] = np.minimum(np.power(max(alpha, 1.0), np.arange(N_LEVELS - 1)), max(beta, 1.0))
    f.flags.writeable = False
    return f


@dataclass(frozen=True)
class FloatQuantizer(Quantizer):
    mode: ClassVar[int] = MODE_FLOAT

    def levels(self, alpha: float = 1.0, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        return self.qp.step / self._factors(alpha, beta), np.zeros(N_LEVELS)


@dataclass(frozen=True)
class IntQuantizer(Quantizer):
    mode: ClassVar[int] = MODE_INT

    def levels(self, alpha: float = 1.0, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        e = np.floor(self.qp.eb / self._factors(alpha, beta))
        return 2.0 * e + 1.0, e


@dataclass(frozen=True)
class LogQuantizer(Quantizer):
    mode: ClassVar[int] = MODE_LOG

    def levels(self, alpha: float = 1.0, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        return self.qp.step / self._factors(alpha, beta), np.zeros(N_LEVELS)


@dataclass(frozen=True)
class BitsQuantizer(Quantizer):
    """Lossless floats: coded by the integer predictors of ``kernels.bits``."""


def quantizer(qp: QuantParams) -> Quantizer:
    cls = {"float": FloatQuantizer, "int": IntQuantizer, "identity": IntQuantizer,
           "log": LogQuantizer, "bits": BitsQuantizer}[qp.kind]
    return cls(qp)


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
# IEEE bit patterns as ordered integers (bit-exact float coding)


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


def find_outliers(x: np.ndarray, out: np.ndarray, p: QuantParams) -> np.ndarray:
    """Flat indices where ``out`` breaks the bound (decided exactly) or, for NaN/Inf, is
    not bit-identical to ``x``; those values are stored exactly."""
    if p.kind in ("identity", "bits"):
        return np.flatnonzero(_ordered_neq(x, out))
    if p.kind == "int":                       # exact in int64
        return np.flatnonzero(np.abs(x.astype(np.int64) - out.astype(np.int64)) > int(p.eb))
    xf, of = x.astype(np.float64), out.astype(np.float64)
    if p.kind == "log":
        from .kernels.core import pw_limits  # the encoder's limit, value by value

        limit: np.ndarray | float = pw_limits(float(p.eb), np.ascontiguousarray(np.abs(xf)))
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
