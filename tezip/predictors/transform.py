"""``wavelet``: transform coding (format v8, ``kernels.wavelet``): a separable 3-D CDF 9/7
wavelet transform of each window, its coefficients quantized on a grid of ``d`` tenths of
the bound, and every value corrected on the bound's own grid around the reconstruction,
so that the bound holds exactly (values that cannot meet it are stored exactly).

It wins where a field is smooth at every scale (a reaction-diffusion run: prediction
residuals there are mostly the quantization noise of the neighbours they are predicted
from, while most wavelet coefficients quantize to zero); it loses on noise and sharp
detail. ``codec.tune`` tries it beside the classical predictors on the stack's first
window where the options allow it (``auto``: ``codec._or_transform``), or takes it
(``--predictor wavelet``).

Absolute and relative bounds on floats and integers (not point-wise relative bounds,
not lossless data: ``configs`` offers nothing there). Non-finite values are stored
exactly (the transform sees the same pixel's nearest finite value in time in their
place: ``_filled``). Channels are coded one after another.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptFileError
from ..kernels import wavelet as KW
from ..kernels.consts import MODE_FLOAT, MODE_INT
from ..kernels.core import call
from ..quantize import Quantizer
from . import Coded
from .classical import _assemble, _flat_positions, _Kernel, channels

D_CHOICES = (10, 15, 20, 25, 30, 35, 40, 50, 60, 80, 120, 160)  # the coefficient step in
#                                  tenths of the bound (the tuning tries 20 first, then its
#                                  neighbours while they code smaller; a smooth sine at 1e-2
#                                  still shrank at 8: helper-47)
D_FIRST = 20


def _bands(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return KW.bands(shape[0]), KW.bands(shape[1]), KW.bands(shape[2])


def _filled(c: np.ndarray, bad: np.ndarray) -> None:
    """Non-finite values of the volume ``c`` (T, H, W) replaced, in place, by the same
    pixel's value in the nearest frame before (else after) where it is finite, 0 where
    it never is. The encoder's alone (those values are stored exactly, whatever the
    transform saw in their place): a frame of NaNs seen as zeros cost the transform its
    smoothness along time (a diffusing field with one: `auto` turned to interpolation,
    3.7x the wavelet's size; helper-49's stacks)."""
    ok = ~bad
    for t in range(1, c.shape[0]):
        m = ~ok[t] & ok[t - 1]
        c[t][m] = c[t - 1][m]
        ok[t] |= m
    for t in range(c.shape[0] - 2, -1, -1):
        m = ~ok[t] & ok[t + 1]
        c[t][m] = c[t + 1][m]
        ok[t] |= m
    c[~ok] = 0.0


def step_of(quant: Quantizer, config: dict) -> float:
    """The coefficient grid's step of ``config`` under ``quant``."""
    return config["d"] / 10.0 * quant.eb


class Wavelet(_Kernel):
    name = "wavelet"
    n_ctx = KW.N_CTX
    groups = KW.GROUPS

    def configs(self, x: np.ndarray, quant: Quantizer) -> list[dict]:
        if quant.mode not in (MODE_FLOAT, MODE_INT) or not quant.eb > 0:
            return []
        return [{"d": d} for d in (D_FIRST, *(d for d in D_CHOICES if d != D_FIRST))]

    def validate(self, config: Any, shape: tuple[int, ...]) -> dict:
        if (not isinstance(config, dict) or set(config) != {"d"} or type(config["d"]) is not int
                or config["d"] not in D_CHOICES):
            raise CorruptFileError("bad predictor configuration")
        return {"d": config["d"]}

    def forward(self, x: np.ndarray) -> list[np.ndarray]:
        """The forward transform of each channel of ``x`` (float64; non-finite values
        filled: ``_filled``), which ``encode`` and ``coefficients`` may be given so that
        trials of several steps on one window transform it once."""
        out = []
        for xc in channels(x):
            c = xc.astype(np.float64)
            bad = ~np.isfinite(c)
            if bad.any():
                _filled(c, bad)
            KW.forward(c)
            out.append(c)
        return out

    def encode(self, x: np.ndarray, quant: Quantizer, config: dict, sgn: np.ndarray,
               sample: bool = False, forward: list[np.ndarray] | None = None) -> Coded:
        if quant.mode not in (MODE_FLOAT, MODE_INT) or not quant.eb > 0:
            raise ValueError("the wavelet codes lossy absolute bounds only")
        vols = channels(x)
        n = x.size
        codes = np.empty(2 * n, np.int32)
        ctx = np.empty(2 * n, np.uint8)
        outp = np.empty(max(1, vols[0].size), np.int32)
        steps, eints = quant.levels()
        step = float(steps[1])
        lo, hi = quant.range
        d = step_of(quant, config)
        outs, pos = [], []
        nn = 0
        for i, xc in enumerate(vols):
            c = self.forward(xc)[0] if forward is None else forward[i].copy()
            nn = KW.code_coefficients(c, d, *_bands(xc.shape), codes, ctx, nn)
            KW.inverse(c)
            out = np.empty_like(xc)
            nn, no = call(KW.code_corrections, (3, 4), xc, c, out, quant.mode, quant.otype,
                          step, 1.0 / step, float(eints[1]), quant.eb, lo, hi, codes, ctx,
                          outp, nn, 0)
            del c
            if not sample:
                p = outp[:no].astype(np.int64)
                out.reshape(-1)[p] = xc.reshape(-1)[p]      # exact, bit for bit
                outs.append(out)
                pos.append(p)
        rec = None if sample else _assemble(outs, x.shape, x.dtype)
        flat = np.zeros(0, np.int64) if sample else _flat_positions(pos, x.shape)
        return Coded(config, codes[:nn], ctx[:nn], flat, rec, self.n_ctx, self.groups)

    def coefficients(self, x: np.ndarray, quant: Quantizer, config: dict
                     ) -> tuple[np.ndarray, np.ndarray]:
        """(codes, contexts) of the coefficients alone of ``x`` under ``config``: what
        most of its coding costs, at a third of the work (``codec._or_transform``'s
        screen)."""
        codes = np.empty(x.size, np.int32)
        ctx = np.empty(x.size, np.uint8)
        d = step_of(quant, config)
        nn = 0
        for c in self.forward(x):
            nn = KW.code_coefficients(c, d, *_bands(c.shape), codes, ctx, nn)
        return codes, ctx

    def _dec(self, out, rec, sg, quant, config, t, outv, outp, st):
        if quant.mode not in (MODE_FLOAT, MODE_INT) or not quant.eb > 0:
            raise CorruptFileError("a wavelet window under a bound it does not code")
        steps, _ = quant.levels()
        lo, hi = quant.range
        call(KW.decode, (5, 6), out, step_of(quant, config), *_bands(out.shape), quant.mode,
             quant.otype, float(steps[1]), lo, hi, t.cmap, t.kbs, t.lut, t.fc, t.words, t.low,
             outv, outp, st)
