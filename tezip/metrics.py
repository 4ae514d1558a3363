"""Quality of a reconstruction against its original: errors, PSNR, SSIM, bound check."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .quantize import QuantParams, find_outliers

_SLAB_VALUES = 1 << 22  # values compared at a time


def bound_violations(x: np.ndarray, y: np.ndarray, qp: QuantParams) -> int:
    """How many values of reconstruction ``y`` break the bound recorded in ``qp`` (decided
    exactly); NaN/Inf must come back bit-exact in every mode."""
    return int(find_outliers(x, y, qp).size)


def compare_stacks(original: Any, tez: Any, *, ssim: bool = True,
                   progress: Callable[[int], None] | None = None) -> dict:
    """Stream both stacks window by window and report errors, PSNR, SSIM and the bound.
    Quiet on any data: NaN/Inf (skipped in the statistics, checked bit for bit by the
    bound) and values near the float64 maximum (PSNR and SSIM are computed on the stack
    scaled by a power of two, which they do not depend on, so nothing overflows). A
    statistic that is undefined or infinite is reported as such (None for 'undefined')."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _compare(original, tez, ssim, progress)


def _compare(original: Any, tez: Any, ssim: bool,
             progress: Callable[[int], None] | None) -> dict:
    qp: QuantParams = tez.quant
    max_abs = max_rel = 0.0
    sm, ssq = 0.0, 0.0          # sum of squared errors = sm**2 * ssq (no overflow)
    count = 0
    violations = 0
    lo, hi = math.inf, -math.inf
    ssims: list[float] = []
    pairs = []
    vr = tez.header.get("value_range") or [0.0, 0.0]
    # a power of two that brings the values near 1 when they are near the float64 limits
    big = max(abs(float(vr[0])), abs(float(vr[1])))
    scale = 2.0 ** -math.frexp(big)[1] if math.isfinite(big) and big > 1e100 else 1.0
    hint = float(vr[1]) * scale - float(vr[0]) * scale
    for t0, window in tez.iter_windows():
        # a few frames at a time, so the float64 temporaries stay small for large frames
        step = max(1, _SLAB_VALUES // max(1, window[0].size))
        for s0 in range(0, len(window), step):
            rec = window[s0:s0 + step]
            x = original.read(t0 + s0, t0 + s0 + len(rec))
            violations += bound_violations(x, rec, qp)
            xf, yf = x.astype(np.float64), rec.astype(np.float64)
            fin = np.isfinite(xf) & np.isfinite(yf)
            if fin.any():
                err = np.abs(xf[fin] - yf[fin])
                ax = np.abs(xf[fin])
                max_abs = max(max_abs, float(err.max()))
                nz = ax > 0
                if nz.any():
                    max_rel = max(max_rel, float((err[nz] / ax[nz]).max()))
                m = float(err.max())
                if m > 0:
                    r = err / m
                    part = float(np.sum(r * r)) if math.isfinite(m) else math.inf
                    if m > sm:
                        ssq = (ssq * (sm / m) ** 2 if sm > 0 else 0.0) + part
                        sm = m
                    else:
                        ssq += part * (m / sm) ** 2
                count += int(err.size)
                lo, hi = min(lo, float(xf[fin].min())), max(hi, float(xf[fin].max()))
            if ssim:
                pairs.append((np.where(fin, xf * scale, 0.0), np.where(fin, yf * scale, 0.0)))
                if sum(len(p[0]) for p in pairs) * x[0].size > _SLAB_VALUES * 4:
                    ssims.extend(_ssim_frames(pairs, hint if hint > 0 else
                                              hi * scale - lo * scale))
                    pairs = []
            del xf, yf, fin
        if progress:
            progress(len(window))
    drange = hi * scale - lo * scale if hi > lo else 0.0
    if ssim and pairs:
        ssims.extend(_ssim_frames(pairs, hint if hint > 0 else drange))
    mse = psnr = None
    if count and sm > 0 and math.isfinite(sm * ssq):
        log_mse = 2 * math.log10(sm) + math.log10(ssq) - math.log10(count)
        mse = 10.0 ** log_mse if log_mse < 308 else math.inf
        if drange > 0:
            psnr = 20 * (math.log10(drange) - math.log10(scale)) - 10 * log_mse
    elif count and sm > 0:
        mse = math.inf
    elif count:
        mse = 0.0
    raw = int(np.prod(tez.shape)) * tez.dtype.itemsize
    return {
        "max_abs_error": max_abs, "max_rel_error": max_rel,
        "mse": mse if mse is not None else 0.0, "psnr": psnr,
        "ssim": float(np.mean(ssims)) if ssims and all(map(math.isfinite, ssims)) else None,
        "ratio": raw / tez.compressed_bytes, "raw_bytes": raw,
        "compressed_bytes": tez.compressed_bytes, "bound_mode": tez.header["bound"]["mode"],
        "bound": tez.header["bound"], "enforced": qp.to_dict(), "violations": violations,
        "ok": violations == 0, "identical": sm == 0 and violations == 0,
    }


def _ssim_frames(pairs: list[tuple[np.ndarray, np.ndarray]], drange: float) -> list[float]:
    from skimage.metrics import structural_similarity

    out = []
    for x, y in pairs:
        for a, b in zip(x, y, strict=True):
            side = min(a.shape[0], a.shape[1])
            if side < 3:
                return []
            win = min(7, side if side % 2 else side - 1)
            if drange <= 0:
                out.append(1.0 if np.array_equal(a, b) else 0.0)
                continue
            out.append(float(structural_similarity(
                a, b, data_range=drange, win_size=win,
                channel_axis=-1 if a.ndim == 3 else None)))
    return out
