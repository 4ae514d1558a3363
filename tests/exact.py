"""The one exact checker of tezip's guarantee, shared by every test that checks a bound.

``check_bound(original, restored, mode, bound, rel_bound=None)`` decides the guarantee as
the README documents it, with rational arithmetic wherever float rounding could hide a
one-ulp violation:

- every mode: same dtype and shape; NaN and +/-Inf bit-exact (payloads included);
- ``abs``: |x - x'| <= e (integer data: floor(e));
- ``rel``: |x - x'| <= r * (max - min) over the finite values (``value_range`` overrides
  the stack's own, e.g. a zarr array's global range);
- ``absrel``: both;
- ``pwrel``: |x - x'| <= b * |x|; zeros bit-exact (the sign of zero kept: -0.0 stays -0.0);
- ``lossless``: every value bit-exact (-0.0, NaN payloads).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from tezip.quantize import INT_DTYPES


def bytes_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise: same bit pattern."""
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.ascontiguousarray(a).view(view) == np.ascontiguousarray(b).view(view)


def exact_range(a: np.ndarray) -> Fraction:
    """max - min over the finite values, exactly."""
    f = a[np.isfinite(a)] if a.dtype.kind == "f" else a
    return Fraction(float(f.max())) - Fraction(float(f.min())) if f.size else Fraction(0)


def _as_float(v: Fraction) -> float:
    """A rational limit as a float for the fast pass; beyond the float range: inf."""
    return math.inf if v > Fraction(np.finfo(np.float64).max) else float(v)


def assert_within(x: np.ndarray, y: np.ndarray, limit: Fraction | np.ndarray) -> None:
    """|x - y| <= limit for every value (float64 arrays; ``limit`` a Fraction or an object
    array of them), decided exactly: a float pass, then rational arithmetic for every
    value within a relative 1e-9 of its limit."""
    lim = np.broadcast_to(np.asarray([_as_float(v) for v in np.ravel(limit)] if
                                     isinstance(limit, np.ndarray) else _as_float(limit)),
                          x.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        err = np.abs(x - y)
    assert (err <= lim * (1 + 1e-9)).all(), (err.max(), lim.max())
    near = np.flatnonzero(err >= lim * (1 - 1e-9))
    exact = np.ravel(limit) if isinstance(limit, np.ndarray) else None
    for i in near:
        want = exact[i] if exact is not None else limit
        got = abs(Fraction(float(x.flat[i])) - Fraction(float(y.flat[i])))
        assert got <= want, (float(x.flat[i]), float(y.flat[i]), _as_float(want))


def check_bound(a: np.ndarray, b: np.ndarray, mode: str, bound: float | None,
                rel_bound: float | None = None,
                value_range: tuple[float, float] | None = None) -> None:
    """Assert that ``b`` restores ``a`` within the documented guarantee of ``mode``."""
    a, b = np.asarray(a), np.asarray(b)
    assert b.dtype == a.dtype and b.shape == a.shape, (a.dtype, a.shape, b.dtype, b.shape)
    if mode == "lossless":
        assert bytes_equal(a, b).all(), "lossless output is not bit-exact"
        return
    if a.dtype.kind == "f":
        special = ~np.isfinite(a)
        assert bytes_equal(a[special], b[special]).all(), "NaN/Inf not bit-exact"
    fin = np.isfinite(a.astype(np.float64))
    x, y = a.astype(np.float64)[fin], b.astype(np.float64)[fin]
    if mode == "pwrel":
        zero = a[fin] == 0
        assert bytes_equal(a[fin][zero], b[fin][zero]).all(), \
            "pwrel: a zero did not come back bit-exact (value or sign of zero)"
        nz = x != 0
        pw = np.array([Fraction(bound) * abs(Fraction(float(v))) for v in x[nz]], object)
        if pw.size:
            assert_within(x[nz], y[nz], pw)
        return
    limits = []
    if mode in ("abs", "absrel"):
        limits.append(Fraction(bound))
    if mode in ("rel", "absrel"):
        r = Fraction(bound if mode == "rel" else rel_bound)
        span = (Fraction(float(value_range[1])) - Fraction(float(value_range[0]))
                if value_range is not None else exact_range(a))
        limits.append(r * span)
    lim = min(limits)
    if a.dtype.name in INT_DTYPES:
        lim = Fraction(math.floor(lim))
    assert_within(x, y, lim)
