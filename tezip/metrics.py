"""Quality of a reconstruction against its original: errors, PSNR, SSIM, bound check."""

from __future__ import annotations

import math
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
    """Stream both stacks window by window and report errors, PSNR, SSIM and the bound."""
    qp: QuantParams = tez.quant
    max_abs = max_rel = 0.0
    sq = 0.0
    count = 0
    violations = 0
    lo, hi = math.inf, -math.inf
    ssims: list[float] = []
    pairs = []
    vr = tez.header.get("value_range") or [0.0, 0.0]
    hint = float(vr[1]) - float(vr[0])
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
                sq += float(np.sum(err * err))
                count += int(err.size)
                lo, hi = min(lo, float(xf[fin].min())), max(hi, float(xf[fin].max()))
            if ssim:
                pairs.append((np.where(fin, xf, 0.0), np.where(fin, yf, 0.0)))
                if sum(len(p[0]) for p in pairs) * x[0].size > _SLAB_VALUES * 4:
                    ssims.extend(_ssim_frames(pairs, hint if hint > 0 else hi - lo))
                    pairs = []
            del xf, yf, fin
        if progress:
            progress(len(window))
    drange = hi - lo if hi > lo else 0.0
    if ssim and pairs:
        ssims.extend(_ssim_frames(pairs, hint if hint > 0 else drange))
    mse = sq / count if count else 0.0
    psnr = None if mse == 0 or drange == 0 else 20 * math.log10(drange) - 10 * math.log10(mse)
    raw = int(np.prod(tez.shape)) * tez.dtype.itemsize
    return {
        "max_abs_error": max_abs, "max_rel_error": max_rel, "mse": mse, "psnr": psnr,
        "ssim": float(np.mean(ssims)) if ssims and all(map(math.isfinite, ssims)) else None,
        "ratio": raw / tez.compressed_bytes, "raw_bytes": raw,
        "compressed_bytes": tez.compressed_bytes, "bound_mode": tez.header["bound"]["mode"],
        "bound": tez.header["bound"], "enforced": qp.to_dict(), "violations": violations,
        "ok": violations == 0, "identical": sq == 0 and violations == 0,
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
