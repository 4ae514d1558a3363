"""Bound audit: every mode x dtype x data set, plus adversarial stacks, checked exactly.

    python benchmarks/bound_audit.py [--data DIR] [--frames 16] [--crop 96] [--full]
        [--dtypes uint8,...,float64]
        [--skip-shared] [--skip-adversarial] [--no-learned] [--out-dir DIR]

Data: the ``*.npy`` stacks in ``--data`` (default ``$TEZIP_DATA`` or ``../shared/data``),
cropped to ``--frames`` frames and a central ``--crop`` square (``--full``: whole
stacks), each cast to every supported dtype (float data are scaled onto an integer
dtype's whole range), compressed with the default predictor ``auto``; plus small
generated adversarial stacks (constants, zeros, extremes alternating in time, full-range
noise, values near the dtype limits, one-pixel and tiny frames, 1- and 2-frame stacks,
4-D multi-channel, denormals, +/-0.0, NaN/Inf islands with payloads, all-NaN, 60 decades
of magnitude, huge offsets, near-maximum values mixed with NaN/Inf) compressed with
``auto`` and with every classical predictor; ``learned`` (the shipped model) on a subset.

Every decoded value is checked against the guarantee of its mode with exact rational
arithmetic (a float64 filter; values near the limit or past it are decided with
``fractions.Fraction``):

- abs: |x - x'| <= e (integer data: floor(e));
- rel: |x - x'| <= r * (max - min) over the finite values (integer data: its floor);
- absrel: both; pwrel: |x - x'| <= b * |x|, zeros exact, sign bits kept;
- lossless: bit-exact (-0.0, NaN payloads);
- in every mode NaN and +/-Inf come back bit-exact and no finite value becomes NaN/Inf.

A ``TezipError`` is reported as "rejected" (with its message), not as a violation; a few
deliberately invalid options must be rejected. Writes ``bound_audit.md`` to ``--out-dir``
(default ``benchmarks/results``; ``--json PATH`` also writes every case) and prints a
one-line summary. Exit code 1 on any violation, crash (non-TezipError exception) or
accepted invalid option.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import tezip  # noqa: E402
from tezip import make_bound, predictors  # noqa: E402
from tezip.bench import bit_exact, value_range  # noqa: E402
from tezip.codec import Options  # noqa: E402

DTYPES = ("uint8", "uint16", "int16", "int32", "float32", "float64")
# every v2 predictor name a user can give besides auto/learned (v1's "previous" and "zero"
# are gone: asking for them is an OptionError, which the audit only counted as rejected)
CLASSICAL = ("lorenzo", "spatial", "interp", "classical")
LEARNED = "learned"
REL_BOUNDS = (1e-2, 1e-3, 1e-4)
PW_BOUNDS = (1e-2, 1e-3)
# float64 filter margin: float64 errors and limits are within a few ulps of the exact
# values, so anything within 2**-40 (relative) of the limit is decided exactly
_MARGIN = 2.0**-40
_TINY = 2.0**-960       # limits below this may have lost relative precision: decide exactly
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass
class Case:
    data: str
    dtype: str
    shape: tuple[int, ...]
    mode: str
    bound: float | None
    rel_bound: float | None
    predictor: str
    expect_reject: bool = False
    status: str = ""            # OK | VIOLATION | rejected | CRASH | ACCEPTED-INVALID
    ratio: float | None = None
    err_over_bound: float | None = None
    max_abs_error: float | None = None
    nonfinite: int = 0
    nonfinite_exact: str = "n/a"
    message: str = ""
    seconds: float = 0.0
    details: dict = field(default_factory=dict)

    def bound_text(self) -> str:
        if self.mode == "lossless":
            return "-"
        if self.mode == "absrel":
            return f"abs {_num(self.bound)}, rel {_num(self.rel_bound)}"
        return _num(self.bound)


def _num(v: float | None) -> str:
    return "None" if v is None else f"{v:.4g}"


# ---------------------------------------------------------------------------------------
# exact checking


def _frac(v: float) -> Fraction:
    return Fraction(float(v))


def _limit(mode: str, bound: float | None, rel_bound: float | None,
           orig: np.ndarray) -> Fraction:
    """The exact absolute limit of abs / rel / absrel for this stack."""
    lo, hi = value_range(orig)
    limits = []
    if mode in ("abs", "absrel"):
        limits.append(_frac(bound))  # type: ignore[arg-type]
    if mode in ("rel", "absrel"):
        r = rel_bound if mode == "absrel" else bound
        limits.append(_frac(r) * (_frac(hi) - _frac(lo)))  # type: ignore[arg-type]
    lim = min(limits)
    if orig.dtype.kind != "f":
        lim = Fraction(math.floor(lim))   # integer data: the integer part of the bound
    return lim


def _as_float(v: Fraction) -> float:
    try:
        return float(v)
    except OverflowError:
        return math.inf


def check(orig: np.ndarray, dec: np.ndarray, mode: str, bound: float | None,
          rel_bound: float | None) -> dict[str, Any]:
    """Decide exactly whether ``dec`` keeps the guarantee of ``mode`` for ``orig``."""
    out: dict[str, Any] = {"violations": 0, "err_over_bound": 0.0, "max_abs_error": 0.0,
                           "nonfinite": 0, "nonfinite_exact": "n/a", "problems": []}
    if dec.shape != orig.shape or dec.dtype != orig.dtype:
        out["violations"] = orig.size or 1
        out["err_over_bound"] = math.inf
        out["problems"].append(f"decoded {dec.dtype}{dec.shape}, expected "
                               f"{orig.dtype}{orig.shape}")
        return out
    x = np.ascontiguousarray(orig).reshape(-1)
    y = np.ascontiguousarray(dec).reshape(-1)
    is_float = x.dtype.kind == "f"
    fin = np.isfinite(x) if is_float else np.ones(x.shape, bool)
    if is_float:
        u = _UINT[x.dtype.itemsize]
        same_bits = x.view(u) == y.view(u)
        nf = ~fin
        out["nonfinite"] = int(nf.sum())
        nf_bad = int((nf & ~same_bits).sum())
        fin_broken = int((fin & ~np.isfinite(y)).sum())
        out["nonfinite_exact"] = "yes" if nf_bad == 0 and fin_broken == 0 else "no"
        if nf_bad:
            out["problems"].append(f"{nf_bad} NaN/Inf values not bit-exact")
        if fin_broken:
            out["problems"].append(f"{fin_broken} finite values decoded as NaN/Inf")
        out["violations"] += nf_bad + fin_broken
    if mode == "lossless":
        if not bit_exact(orig, dec):
            u = _UINT[x.dtype.itemsize]
            n = int((x.view(u) != y.view(u)).sum())
            out["violations"] = max(out["violations"], n)
            out["err_over_bound"] = math.inf
            out["problems"].append(f"{n} values not bit-exact")
        ok_fin = fin & np.isfinite(y)
        if ok_fin.any():
            with np.errstate(over="ignore", invalid="ignore"):
                d = np.abs(x[ok_fin].astype(np.float64) - y[ok_fin].astype(np.float64))
            out["max_abs_error"] = float(d.max())
        return out

    xs, ys = x[fin], y[fin]
    if xs.size == 0:
        return out
    if not is_float and mode != "pwrel":
        lim_i = int(_limit(mode, bound, rel_bound, orig))
        d = np.abs(xs.astype(np.int64) - ys.astype(np.int64))
        dmax = int(d.max())
        out["max_abs_error"] = float(dmax)
        bad = int((d > lim_i).sum())
        out["violations"] += bad
        out["err_over_bound"] = (dmax / lim_i if lim_i else (0.0 if dmax == 0 else math.inf))
        if bad:
            out["problems"].append(f"{bad} values off by more than {lim_i}")
        return out

    xf = xs.astype(np.float64)
    yf = ys.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.abs(xf - yf)                       # may round or overflow: filtered below
        if mode == "pwrel":
            b = _frac(bound)  # type: ignore[arg-type]
            lim_f = float(bound) * np.abs(xf)        # type: ignore[arg-type]
        else:
            lim_x = _limit(mode, bound, rel_bound, orig)
            lim_f = np.full(xf.shape, _as_float(lim_x))
        normal = lim_f >= _TINY
        safe = np.isfinite(d) & (((d <= lim_f * (1 - _MARGIN)) & normal) | (d == 0))
        sure_bad = np.isfinite(d) & normal & np.isfinite(lim_f) & (d > lim_f * (1 + _MARGIN))
    unsure = np.flatnonzero(~safe & ~sure_bad)
    exact_bad = sure_bad.copy()
    ex_err = 0.0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = np.where(lim_f > 0, d / np.where(lim_f > 0, lim_f, 1.0),
                     np.where(d == 0, 0.0, np.inf))
    for i in unsure:                              # decided (and measured) exactly
        xi, yi = float(xf[i]), float(yf[i])
        if not math.isfinite(yi):
            exact_bad[i], q[i] = True, math.inf
            continue
        err = abs(Fraction(xi) - Fraction(yi))
        ex_err = max(ex_err, _as_float(err))
        lim = b * abs(Fraction(xi)) if mode == "pwrel" else lim_x
        exact_bad[i] = err > lim
        q[i] = _as_float(err / lim) if lim > 0 else (0.0 if err == 0 else math.inf)
        if exact_bad[i] and not q[i] > 1:         # past the bound by less than an ulp
            q[i] = float(np.nextafter(1.0, 2.0))
        elif not exact_bad[i]:
            q[i] = min(q[i], 1.0)
    out["exact_decisions"] = int(unsure.size)
    out["err_over_bound"] = float(q.max())
    fd = d[np.isfinite(d)]
    out["max_abs_error"] = max(float(fd.max()) if fd.size else 0.0, ex_err)
    nbad = int(exact_bad.sum())
    if nbad:
        out["problems"].append(f"{nbad} values past the bound")
    out["violations"] += nbad
    if mode == "pwrel" and is_float:
        sb = int((np.signbit(xs) != np.signbit(ys)).sum())
        if sb:
            out["problems"].append(f"{sb} sign bits changed (incl. -0.0)")
            out["violations"] += sb
    return out


# ---------------------------------------------------------------------------------------
# data


def _smooth(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A smooth field moving in time, in [-1, 1], float64."""
    rng = np.random.default_rng(seed)
    t = np.arange(shape[0])[:, None, None]
    i = np.arange(shape[1])[None, :, None]
    j = np.arange(shape[2])[None, None, :]
    f = np.sin(0.37 * i + 0.21 * t + 0.3) * np.cos(0.29 * j - 0.13 * t) * 0.9
    f = f + 0.05 * rng.standard_normal((shape[0], shape[1], shape[2]))
    if len(shape) == 4:
        f = np.stack([f * (1 - 0.2 * c) for c in range(shape[3])], axis=-1)
    return np.clip(f, -1.0, 1.0)


def _to_int(u: np.ndarray, dtype: str) -> np.ndarray:
    """Values in [0, 1] onto the whole range of integer ``dtype``."""
    info = np.iinfo(dtype)
    v = np.rint(float(info.min) + u * (float(info.max) - float(info.min)))
    return np.clip(v, info.min, info.max).astype(dtype)


def cast(a: np.ndarray, dtype: str) -> np.ndarray:
    """A shared data set in ``dtype``: floats as they are; a different integer dtype gets
    the finite value range scaled onto its whole range."""
    if np.dtype(dtype).kind == "f" or a.dtype == np.dtype(dtype):
        return a.astype(dtype)
    lo, hi = value_range(a)
    u = (a.astype(np.float64) - lo) / (hi - lo) if hi > lo else np.zeros(a.shape)
    return _to_int(np.nan_to_num(u), dtype)


def shared_sets(data_dir: str, frames: int | None,
                crop: int | None) -> Iterator[tuple[str, np.ndarray]]:
    """The shared stacks: the first ``frames`` frames, a central ``crop`` x ``crop`` part."""
    for path in sorted(glob.glob(os.path.join(data_dir, "*.npy"))):
        a = np.load(path, mmap_mode="r")
        if frames:
            a = a[:frames]
        if crop:
            h0, w0 = max(0, (a.shape[1] - crop) // 2), max(0, (a.shape[2] - crop) // 2)
            a = a[:, h0:h0 + crop, w0:w0 + crop]
        yield os.path.splitext(os.path.basename(path))[0], np.ascontiguousarray(a)


def _nan(dtype: str, bits: int) -> Any:
    u = _UINT[np.dtype(dtype).itemsize]
    return np.array([bits], dtype=u).view(dtype)[0]


def adversarial(dtype: str) -> list[tuple[str, np.ndarray]]:
    """Small stacks built to break predictors, grids and range arithmetic."""
    dt = np.dtype(dtype)
    is_f = dt.kind == "f"
    rng = np.random.default_rng(1234)
    shape = (8, 16, 16)
    out: list[tuple[str, np.ndarray]] = []

    def level(s: np.ndarray) -> np.ndarray:     # smooth [-1, 1] -> a sensible dtype range
        if is_f:
            return (s * 100.0).astype(dt)
        return _to_int((s + 1) / 2, dtype)

    const = {"uint8": 200, "uint16": 40000, "int16": -1234, "int32": 2_000_000_000,
             "float32": 3.14159, "float64": -2.718281828459045}[dtype]
    out.append(("constant", np.full(shape, const, dt)))
    out.append(("zeros", np.zeros(shape, dt)))
    lo, hi = (-np.finfo(dt).max, np.finfo(dt).max) if is_f else (np.iinfo(dt).min,
                                                                np.iinfo(dt).max)
    par = np.indices(shape).sum(axis=0) % 2
    out.append(("checker_extremes", np.where(par == 1, hi, lo).astype(dt)))
    if is_f:
        out.append(("uniform_noise", (rng.uniform(-1, 1, shape) * (hi * 0.5)).astype(dt)))
        s = _smooth(shape, 2)
        out.append(("near_max_pm", (s / np.abs(s).max() * (hi * 0.95)).astype(dt)))
        out.append(("near_max_pos", (hi * (0.975 + 0.025 * s)).astype(dt)))
    else:
        info = np.iinfo(dt)
        out.append(("uniform_noise", rng.integers(info.min, int(info.max) + 1, shape,
                                                  dtype=np.int64).astype(dt)))
        s = _to_int(np.clip((_smooth(shape, 2) + 1) / 2 * 1.4 - 0.2, 0, 1), dtype)
        s = s.copy()
        s[:, 0, 0], s[:, 0, 1] = info.min + 1, info.max - 1
        out.append(("near_limits", s))
    out.append(("one_pixel", level(_smooth((24, 1, 1), 3))))
    out.append(("tiny_frames", level(_smooth((24, 1, 7), 4))))
    out.append(("two_frames", level(_smooth((2, 16, 16), 5))))
    out.append(("single_frame", level(_smooth((1, 16, 16), 6))))
    out.append(("multichannel", level(_smooth((8, 12, 12, 3), 7))))
    jump = level(_smooth(shape, 8)).copy()
    jump[1::2] = np.flip(jump[1::2], axis=(1, 2))        # frames swap between two scenes
    out.append(("frame_flip", jump))
    if not is_f:
        return out

    tiny = np.finfo(dt).smallest_subnormal
    den = (_smooth(shape, 9) * (1e-40 if dtype == "float32" else 1e-310)).astype(dt)
    den[:, 0, :4] = [tiny, -tiny, 2 * tiny, 0.0]
    out.append(("denormals", den))
    z = np.where(rng.random(shape) < 0.5, 0.0, -0.0).astype(dt)
    z[rng.random(shape) < 0.1] = 1e-3
    z[rng.random(shape) < 0.05] = -7.5
    out.append(("signed_zeros", z))
    isl = level(_smooth(shape, 10)).copy()
    isl[2, 3:6, 3:6] = np.nan
    isl[3, 8:10, 1:4] = np.inf
    isl[4, 12:15, 10:12] = -np.inf
    isl[5] = np.nan
    nan_bits = ((0x7FC00001, 0xFFC00000, 0x7F800001, 0x7FFFFFFF) if dtype == "float32" else
                (0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001,
                 0x7FFFFFFFFFFFFFFF))
    for k, bits in enumerate(nan_bits):
        isl[6, 1 + k, 1 + k] = _nan(dtype, bits)
    isl[7, 0, 0] = -0.0
    out.append(("nan_inf_islands", isl))
    alln = np.full(shape, np.nan, dt)
    alln[0, 0, 0], alln[1, 1, 1] = np.inf, -np.inf
    out.append(("all_nan_inf", alln))
    dec = 36 if dtype == "float32" else 300
    out.append(("log_span", (np.where(rng.random(shape) < 0.5, -1.0, 1.0)
                             * 10.0 ** rng.uniform(-dec, dec, shape)).astype(dt)))
    off = 1e9 if dtype == "float32" else 1e17
    out.append(("huge_offset", (off + _smooth(shape, 11) * 1e3).astype(dt)))
    # near-maximum values next to NaN (with payloads) and +/-Inf in one stack (issue 14:
    # a decoder comparing finiteness instead of bit patterns turned NaN into inf there)
    fmax = np.finfo(dt).max
    pool = np.array([fmax, -fmax, fmax * 0.99, -fmax * 0.99, np.nextafter(fmax, 0), np.nan,
                     _nan(dtype, nan_bits[0]), _nan(dtype, nan_bits[1]), np.inf, -np.inf,
                     0.0, -0.0, 1.0], dt)
    out.append(("extremes_nonfinite", rng.choice(pool, size=shape)))
    return out


# ---------------------------------------------------------------------------------------
# cases


def _range_of(a: np.ndarray) -> float:
    lo, hi = value_range(a)
    with np.errstate(over="ignore"):
        return float(np.float64(hi) - np.float64(lo))


def shared_modes(a: np.ndarray) -> list[tuple[str, float | None, float | None]]:
    r = _range_of(a)
    modes: list[tuple[str, float | None, float | None]] = [("rel", b, None)
                                                           for b in REL_BOUNDS]
    modes += [("abs", r * 1e-2, None), ("abs", r * 1e-4, None)]
    modes += [("absrel", r * 1e-3, 1e-2), ("absrel", r * 1e-2, 1e-4)]
    modes += [("pwrel", b, None) for b in PW_BOUNDS]
    modes.append(("lossless", None, None))
    return modes


def adversarial_modes(a: np.ndarray) -> list[tuple[str, float | None, float | None]]:
    r = _range_of(a)
    modes: list[tuple[str, float | None, float | None]] = [("rel", b, None)
                                                           for b in REL_BOUNDS]
    abs_bounds = [0.5, 3.0, 1e30]
    if math.isfinite(r) and r > 0 and r * 1e-3 not in abs_bounds:
        abs_bounds.append(r * 1e-3)
    modes += [("abs", b, None) for b in abs_bounds]
    modes += [("absrel", 3.0, 1e-3), ("absrel", 1e30, 1e-4)]
    modes += [("pwrel", b, None) for b in PW_BOUNDS]
    modes.append(("lossless", None, None))
    return modes


INVALID = [("pwrel", 1.0, None), ("pwrel", 1.5, None), ("rel", 0.0, None),
           ("abs", -1.0, None), ("abs", math.nan, None), ("rel", math.inf, None),
           ("absrel", 1.0, None),
           # issue 14: a point-wise bound below float64 resolution (its grid step is 0),
           # and a relative bound given to a mode that does not take one
           ("pwrel", 1e-30, None), ("pwrel", 2.0**-53, None), ("rel", 1e-3, 0.5)]
LEARNED_SUBSET = {"nan_inf_islands", "multichannel", "tiny_frames", "one_pixel",
                  "near_limits", "near_max_pm", "denormals", "frame_flip",
                  "extremes_nonfinite"}
# the learned predictor codes abs, rel, absrel and lossless integers; pwrel and lossless
# floats are rejected by design (OptionError), so auditing them there checks nothing
LEARNED_MODES = {("rel", 1e-3), ("abs", 3.0), ("absrel", 3.0), ("lossless", None)}


def learned_codes(mode: str, dtype: str) -> bool:
    """Whether the learned predictor takes this mode for this dtype."""
    return mode != "pwrel" and not (mode == "lossless" and dtype.startswith("float"))


def build_cases(args: argparse.Namespace, learned: bool) -> list[tuple[Case, np.ndarray]]:
    cases: list[tuple[Case, np.ndarray]] = []

    def add(name: str, a: np.ndarray, mode: str, b: float | None, rb: float | None,
            pred: str, expect_reject: bool = False) -> None:
        cases.append((Case(name, str(a.dtype), tuple(a.shape), mode, b, rb, pred,
                           expect_reject), a))

    if not args.skip_shared:
        frames, crop = (None, None) if args.full else (args.frames, args.crop)
        for name, raw in shared_sets(args.data, frames, crop):
            for dtype in args.dtypes:
                a = cast(raw, dtype)
                for mode, b, rb in shared_modes(a):
                    add(name, a, mode, b, rb, "auto")
                    if learned and dtype in ("float32", "uint16") and \
                            learned_codes(mode, dtype) and \
                            (mode == "absrel" and rb == 1e-2 or
                             (mode, b) in {("rel", 1e-3), ("lossless", None)}):
                        add(name, a, mode, b, rb, LEARNED)
    if not args.skip_adversarial:
        for dtype in args.dtypes:
            for name, a in adversarial(dtype):
                for mode, b, rb in adversarial_modes(a):
                    for pred in ("auto", *CLASSICAL):
                        add(name, a, mode, b, rb, pred)
                    if learned and name in LEARNED_SUBSET and (mode, b) in LEARNED_MODES \
                            and learned_codes(mode, dtype) \
                            and dtype in ("float32", "float64", "uint16", "int32"):
                        add(name, a, mode, b, rb, LEARNED)
        a = adversarial("float32")[0][1]
        for mode, b, rb in INVALID:
            add("constant", a, mode, b, rb, "auto", expect_reject=True)
    return cases


def run_case(case: Case, a: np.ndarray) -> Case:
    t0 = time.perf_counter()
    try:
        blob = tezip.compress(a, mode=case.mode, bound=case.bound, rel_bound=case.rel_bound,
                              predictor=case.predictor)
        dec = tezip.decompress(blob)
    except tezip.TezipError as exc:
        case.status = "rejected"
        case.message = f"{type(exc).__name__}: {exc}"
        case.seconds = time.perf_counter() - t0
        return case
    except Exception as exc:  # noqa: BLE001 - any other exception is a crash to report
        case.status = "CRASH"
        case.message = f"{type(exc).__name__}: {exc}"
        case.details["traceback"] = traceback.format_exc()
        case.seconds = time.perf_counter() - t0
        return case
    case.seconds = time.perf_counter() - t0
    case.ratio = a.nbytes / len(blob) if blob else None
    if case.expect_reject:
        case.status = "ACCEPTED-INVALID"
        case.message = "an invalid option was accepted"
        return case
    res = check(a, dec, case.mode, case.bound, case.rel_bound)
    case.err_over_bound = res["err_over_bound"]
    case.max_abs_error = res["max_abs_error"]
    case.nonfinite = res["nonfinite"]
    case.nonfinite_exact = res["nonfinite_exact"]
    case.details = {k: v for k, v in res.items() if k in ("violations", "exact_decisions")}
    if res["violations"]:
        case.status = "VIOLATION"
        case.message = "; ".join(res["problems"])
    else:
        case.status = "OK"
    return case


# ---------------------------------------------------------------------------------------
# reporting


def _fmt(v: float | None, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, spec)


HEAD = ("| data | dtype | shape | mode | bound | predictor | ratio | max err / bound | "
        "NaN/Inf exact | status |\n|---|---|---|---|---|---|---|---|---|---|\n")


def _ratio(v: float | None) -> str:
    """max err / bound: 4 decimals, all digits when past 1 (a violation by an ulp)."""
    return _fmt(v, ".17g" if v is not None and v > 1 else ".4f")


def _row(c: Case) -> str:
    shape = "x".join(map(str, c.shape))
    status = c.status if c.status in ("OK",) else f"{c.status}: {c.message}"
    nf = c.nonfinite_exact if not c.nonfinite else f"{c.nonfinite_exact} ({c.nonfinite})"
    return (f"| {c.data} | {c.dtype} | {shape} | {c.mode} | {c.bound_text()} | {c.predictor} "
            f"| {_fmt(c.ratio, '.2f')} | {_ratio(c.err_over_bound)} | {nf} | "
            f"{status.replace('|', '/')} |\n")


def summarize(cases: list[Case], seconds: float) -> tuple[str, bool]:
    n = len(cases)
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.status] = counts.get(c.status, 0) + 1
    checked = [c for c in cases if c.status in ("OK", "VIOLATION") and
               c.err_over_bound is not None]
    worst = max(checked, key=lambda c: c.err_over_bound) if checked else None  # type: ignore
    lossy = [c for c in checked if c.mode != "lossless"]
    worst_lossy = max(lossy, key=lambda c: c.err_over_bound) if lossy else None  # type: ignore
    bad = counts.get("VIOLATION", 0) + counts.get("CRASH", 0) + counts.get("ACCEPTED-INVALID",
                                                                           0)
    w = worst_lossy or worst
    line = (f"bound audit: {n} cases, {counts.get('VIOLATION', 0)} violations, "
            f"{counts.get('CRASH', 0)} crashes, {counts.get('rejected', 0)} rejected "
            f"({sum(c.status == 'rejected' and c.expect_reject for c in cases)} of them "
            f"deliberately invalid options), {counts.get('ACCEPTED-INVALID', 0)} invalid "
            f"options accepted, {counts.get('OK', 0)} OK; worst max-error/bound "
            f"{_fmt(w.err_over_bound, '.17g') if w else '-'}"
            + (f" ({w.data} {w.dtype} {w.mode} {w.bound_text()} {w.predictor})" if w else "")
            + f"; {seconds:.0f} s")
    return line, bad == 0


def _aggregate(cases: list[Case]) -> list[str]:
    """One row per data set and mode: cases, OK, rejected, worst max err / bound."""
    groups: dict[tuple[str, str], list[Case]] = {}
    for c in cases:
        groups.setdefault((c.data, c.mode), []).append(c)
    rows = ["| data | mode | dtypes | cases | OK | rejected | worst max err / bound |\n",
            "|---|---|---|---|---|---|---|\n"]
    for (data, mode), cs in groups.items():
        errs = [c.err_over_bound for c in cs if c.err_over_bound is not None]
        dtypes = ", ".join(dict.fromkeys(c.dtype for c in cs))
        rows.append(f"| {data} | {mode} | {dtypes} | {len(cs)} | "
                    f"{sum(c.status == 'OK' for c in cs)} | "
                    f"{sum(c.status == 'rejected' for c in cs)} | "
                    f"{_ratio(max(errs)) if errs else '-'} |\n")
    return rows


def write_reports(cases: list[Case], line: str, out_dir: str, argv: list[str],
                  seconds: float, json_path: str | None = None) -> None:
    os.makedirs(out_dir, exist_ok=True)
    bad = [c for c in cases if c.status in ("VIOLATION", "CRASH", "ACCEPTED-INVALID")]
    rejected: dict[str, list[Case]] = {}
    for c in cases:
        if c.status == "rejected":
            rejected.setdefault(c.message, []).append(c)
    md = ["# Bound audit\n\n",
          f"`python benchmarks/bound_audit.py {' '.join(argv)}` — tezip {tezip.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}, {seconds:.0f} s.\n\n",
          f"**{line}**\n\n",
          "max err / bound: largest |x - x'| / allowed error over the finite values "
          "(pwrel: per value, |x - x'| / (b |x|); integer data: allowed = floor of the "
          "bound, so 0/0 counts as 0), decided with exact rational arithmetic. "
          "NaN/Inf exact: non-finite values bit-identical and no finite value turned "
          "non-finite. Every case: `--json PATH` writes them all.\n\n"]
    if bad:
        md += [f"## Violations, crashes, invalid options accepted ({len(bad)})\n\n", HEAD,
               *map(_row, bad), "\n"]
    if rejected:
        md += ["## Rejected inputs and options\n\n| message | cases | data (dtypes) | "
               "deliberately invalid |\n|---|---|---|---|\n"]
        for msg, cs in rejected.items():
            where = ", ".join(dict.fromkeys(f"{c.data} ({c.dtype})" for c in cs))
            md.append(f"| {msg.replace('|', '/')} | {len(cs)} | {where} | "
                      f"{'yes' if all(c.expect_reject for c in cs) else 'no'} |\n")
        md.append("\n")
    md += [f"## By data set and mode ({len(cases)} cases)\n\n", *_aggregate(cases)]
    with open(os.path.join(out_dir, "bound_audit.md"), "w") as f:
        f.write("".join(md))
    if json_path is None:
        return

    def js(c: Case) -> dict:
        d = asdict(c)
        d["seconds"] = round(d["seconds"], 3)
        for k in ("ratio", "err_over_bound", "max_abs_error", "bound", "rel_bound"):
            v = d[k]
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = str(v)
        return d

    with open(json_path, "w") as f:
        f.write(json.dumps({"summary": line, "argv": argv, "seconds": round(seconds, 1),
                            "tezip_version": tezip.__version__, "cases": []})[:-2] + "\n")
        f.write(",\n".join(json.dumps(js(c), separators=(",", ":")) for c in cases))
        f.write("\n]}\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    default_data = os.environ.get("TEZIP_DATA") or os.path.normpath(
        os.path.join(REPO, "..", "shared", "data"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=default_data,
                    help="directory of *.npy stacks (default: $TEZIP_DATA or %(default)s)")
    ap.add_argument("--frames", type=int, default=16,
                    help="crop the shared stacks to this many frames (default: 16)")
    ap.add_argument("--crop", type=int, default=96,
                    help="and to a central square of this side (default: 96)")
    ap.add_argument("--full", action="store_true", help="whole shared stacks (no cropping)")
    ap.add_argument("--dtypes", default=",".join(DTYPES),
                    help="comma-separated dtypes to cast to (default: all; fewer for a "
                         "smoke run)")
    ap.add_argument("--skip-shared", action="store_true")
    ap.add_argument("--skip-adversarial", action="store_true")
    ap.add_argument("--no-learned", action="store_true",
                    help=f"skip the '{LEARNED}' cases")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
    ap.add_argument("--json", dest="json_path", help="also write every case as JSON here")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if bad := [d for d in args.dtypes if d not in DTYPES]:
        ap.error(f"unknown dtype(s) {', '.join(bad)}; choose from {', '.join(DTYPES)}")
    if not args.skip_shared and not glob.glob(os.path.join(args.data, "*.npy")):
        ap.error(f"no *.npy files in {args.data} (use --data or --skip-shared)")

    learned = not args.no_learned and predictors.model_identity(
        Options(make_bound("rel", 1e-3, None), predictor="learned")) is not None
    t0 = time.perf_counter()
    todo = build_cases(args, learned)
    done: list[Case] = []
    for k, (case, a) in enumerate(todo):
        done.append(run_case(case, a))
        if not args.quiet and (case.status not in ("OK", "rejected") or k % 50 == 0):
            print(f"[{k + 1}/{len(todo)} {time.perf_counter() - t0:.0f}s] " + _row(case).strip(),
                  file=sys.stderr, flush=True)
        if case.status == "CRASH" and not args.quiet:
            print(case.details["traceback"], file=sys.stderr, flush=True)
    seconds = time.perf_counter() - t0
    line, ok = summarize(done, seconds)
    write_reports(done, line, args.out_dir, argv, seconds, args.json_path)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
