"""Classical value predictors, each a compiled predict-quantize-reconstruct kernel:

- ``interp``: multilevel interpolation over (t, y, x) with exact anchors and level-wise
  bounds (``kernels.interp``); its axis order, cubic or linear interpolation and the
  level-wise bounds are tuned per window.
- ``lorenzo``: 3-D Lorenzo (``kernels.lorenzo``); ``spatial``: 2-D Lorenzo per frame.

Channels (T, H, W, C) are coded one after another with the same configuration, into one
stream. Instances hold no per-call state: one instance serves every thread.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ..errors import CorruptFileError, OptionError
from ..kernels import interp as KI
from ..kernels import lorenzo as KL
from ..kernels.consts import MODE_LOG
from ..kernels.core import call
from ..quantize import Quantizer
from . import Coded, ValuePredictor

ORDERS = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))
ALPHA_BETA = ((1.0, 1.0), (1.25, 2.0), (1.5, 2.5), (2.0, 3.0))
DEFAULT_ANCHOR = 32


def channels(x: np.ndarray) -> list[np.ndarray]:
    """The (T, H, W) volumes of a window, C-contiguous."""
    if x.ndim == 3:
        return [np.ascontiguousarray(x)]
    return [np.ascontiguousarray(x[..., c]) for c in range(x.shape[3])]


def _buffers(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, contexts, outlier positions (flat positions within a channel < 2^27)."""
    return np.empty(n, np.int32), np.empty(n, np.uint8), np.empty(n, np.int32)


def _rec(out: np.ndarray, quant: Quantizer) -> np.ndarray:
    """The prediction domain: the output itself, or float64 log-domain values."""
    return np.empty(out.shape, np.float64) if quant.mode == MODE_LOG else out


def _sign_of(sgn: np.ndarray, c: int, nch: int) -> np.ndarray:
    if sgn.ndim == 4:
        return np.ascontiguousarray(sgn[..., c])
    return sgn


def _assemble(outs: list[np.ndarray], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if len(shape) == 3:
        return outs[0]
    out = np.empty(shape, dtype)
    for c, o in enumerate(outs):
        out[..., c] = o
    return out


def _flat_positions(pos: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """Per-channel flat positions -> flat positions in the (T, H, W[, C]) array."""
    if len(shape) == 3:
        return pos[0]
    nch = shape[3]
    return np.concatenate([p * nch + c for c, p in enumerate(pos)]) if pos else np.zeros(0,
                                                                                          np.int64)


class _Kernel(ValuePredictor):
    """Shared driver: run the kernel per channel, collect codes and outliers."""

    kernel: ClassVar[Any]

    def _enc(self, xc: np.ndarray, out: np.ndarray, rec: np.ndarray, sg: np.ndarray,
             quant: Quantizer, config: dict, codes: np.ndarray, ctx: np.ndarray,
             outp: np.ndarray, n0: int, no0: int) -> tuple[int, int]:
        raise NotImplementedError

    def _dec(self, out: np.ndarray, rec: np.ndarray, sg: np.ndarray, quant: Quantizer,
             config: dict, t: Any, outv: np.ndarray, outp: np.ndarray,
             st: np.ndarray) -> None:
        raise NotImplementedError

    def encode(self, x: np.ndarray, quant: Quantizer, config: dict, sgn: np.ndarray,
               sample: bool = False) -> Coded:
        vols = channels(x)
        n = x.size
        codes, ctx, outp = _buffers(n)
        outs, pos = [], []
        nn = no = 0
        for c, xc in enumerate(vols):
            out = np.empty_like(xc)
            no_before = no
            nn, no = self._enc(xc, out, _rec(out, quant), _sign_of(sgn, c, len(vols)), quant,
                               config, codes, ctx, outp, nn, no)
            if not sample:
                p = outp[no_before:no]
                out.reshape(-1)[p] = xc.reshape(-1)[p]      # exact, bit for bit
                outs.append(out)
                pos.append(p.copy())
        rec = None if sample else _assemble(outs, x.shape, x.dtype)
        flat = np.zeros(0, np.int64) if sample else _flat_positions(pos, x.shape)
        return Coded(config, codes[:nn], ctx[:nn], flat, rec, self.n_ctx, self.groups)

    def decode(self, shape: tuple[int, ...], quant: Quantizer, config: dict, tables: Any,
               outlier_values: np.ndarray, sgn: np.ndarray, meta: dict | None = None,
               out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        vol = shape[:3]
        into = out if len(shape) == 3 else None
        nch = shape[3] if len(shape) == 4 else 1
        st = tables.st
        outv = outlier_values.astype(np.float64)
        outp = np.zeros(max(1, outv.size), np.int32)
        outs, pos = [], []
        for c in range(nch):
            out = into if into is not None else np.empty(vol, quant.dtype)
            op0 = int(st[7])
            self._dec(out, _rec(out, quant), _sign_of(sgn, c, nch), quant, config, tables,
                      outv, outp, st)
            op1 = min(int(st[7]), outv.size)
            outs.append(out)
            pos.append(outp[op0:op1].copy() if op1 > op0 else np.zeros(0, np.int64))
        return _assemble(outs, shape, quant.dtype), _flat_positions(pos, shape)


class Interpolation(_Kernel):
    name = "interp"
    n_ctx = KI.N_CTX
    groups = KI.GROUPS
    # the level-wise bounds: their sample ranking was the whole window's in every
    # finalist pair of the shared data sets' lossy cells; the axis order and cubic
    # against linear are ranked on the window (tiles' borders misrank cubic on speckle)
    sample_ranked = ("ab",)

    def configs(self, x: np.ndarray, quant: Quantizer) -> list[dict]:
        return [{"order": list(o), "cubic": cub, "ab": list(ab), "anchor": DEFAULT_ANCHOR}
                for o in ORDERS for cub in (False, True) for ab in ALPHA_BETA]

    def tune(self, sample, quant, sgn, cost, pmap=map):
        """Greedy: the axis order with linear interpolation (the orders tried side by
        side with ``pmap``), then cubic, then the level-wise bounds from the mildest on,
        while each improves (every one of the 48 combinations would cost 5x more for a
        few tenths of a percent on the shared data sets; every level-wise bound after
        one that did not improve, a fifth more for the same choices in their lossy
        cells; and where the bounds code alike, as in lossless integer coding, those
        ties crowded the other settings out of the finalists)."""
        def trial(cfg: dict) -> float:
            return cost(self.encode(sample, quant, cfg, sgn, sample=True))

        cfg = {"order": list(ORDERS[0]), "cubic": False, "ab": [1.0, 1.0],
               "anchor": DEFAULT_ANCHOR}
        first = [{**cfg, "order": list(o)} for o in ORDERS]
        tried = [(b, i, c) for i, (b, c) in enumerate(zip(pmap(trial, first), first,
                                                            strict=True))]
        best = min(tried, key=lambda t: t[:2])
        for key, value in [("cubic", True)] + [("ab", list(ab)) for ab in ALPHA_BETA[1:]]:
            c = {**best[2], key: value}
            tried.append((trial(c), len(tried), c))
            if tried[-1][:2] < best[:2]:
                best = tried[-1]
            elif key == "ab":
                break           # past one that lost, none won on the shared data sets
        return [(bits, c) for bits, _, c in sorted(tried, key=lambda t: t[:2])]

    def validate(self, config, shape):
        try:
            order = [int(v) for v in config["order"]]
            ab = [float(v) for v in config["ab"]]
            cfg = {"order": order, "cubic": bool(config["cubic"]), "ab": ab,
                   "anchor": int(config["anchor"])}
        except (KeyError, TypeError, ValueError, OverflowError):
            raise CorruptFileError("bad predictor configuration") from None
        a = cfg["anchor"]
        if (sorted(order) != [0, 1, 2] or len(ab) != 2 or not all(1.0 <= v <= 64.0 for v in ab)
                or a < 0 or a > 1 << 20 or (a & (a - 1))):
            raise CorruptFileError("bad predictor configuration")
        return cfg

    def _enc(self, xc, out, rec, sg, quant, config, codes, ctx, outp, n0, no0):
        steps, eints = quant.levels(*config["ab"])
        lo, hi = quant.range
        return call(KI.encode, (8, 9), xc, None, out, rec, sg, steps, eints, quant.eb,
                    quant.mode, quant.otype, lo, hi, np.asarray(config["order"], np.int64),
                    bool(config["cubic"]), int(config["anchor"]), codes, ctx, outp, n0, no0)

    def _dec(self, out, rec, sg, quant, config, t, outv, outp, st):
        steps, _ = quant.levels(*config["ab"])
        lo, hi = quant.range
        call(KI.decode, (5, 6), out, rec, None, sg, steps, quant.mode, quant.otype, lo, hi,
             np.asarray(config["order"], np.int64), bool(config["cubic"]),
             int(config["anchor"]), t.cmap, t.kbs, t.lut, t.fc, t.words, t.low, outv,
             outp, st)


class Lorenzo3D(_Kernel):
    name = "lorenzo"
    n_ctx = KL.N_CTX
    groups = KL.GROUPS
    three = True
    # {"pq": 1}: prequantized (format v3, what new files use; see ``kernels.lorenzo``);
    # {}: predicted from reconstructed values (format v2 files: decoded, no longer coded)
    PQ: ClassVar[dict] = {"pq": 1}

    def configs(self, x: np.ndarray, quant: Quantizer) -> list[dict]:
        return [dict(self.PQ)]

    def validate(self, config, shape):
        # exactly {} or {"pq": 1} (not true or 1.0, which Python finds equal to 1)
        if config != {} and not (config == self.PQ and type(config["pq"]) is int):
            raise CorruptFileError("bad predictor configuration")
        return dict(config)

    def _enc(self, xc, out, rec, sg, quant, config, codes, ctx, outp, n0, no0):
        steps, eints = quant.levels()
        lo, hi = quant.range
        if not config.get("pq"):
            raise OptionError(f"'{self.name}' codes only its format-v3 form {self.PQ} "
                              "(the v2 form is decoded, no longer coded)")
        return call(KL.encode_pq, (6, 7), xc, out, sg, float(steps[1]), float(eints[1]),
                    quant.eb, quant.mode, quant.otype, lo, hi, self.three, codes, ctx, outp,
                    n0, no0)

    def _dec(self, out, rec, sg, quant, config, t, outv, outp, st):
        steps, eints = quant.levels()
        lo, hi = quant.range
        if config.get("pq"):
            call(KL.decode_pq, (4, 5), out, sg, float(steps[1]), float(eints[1]), quant.mode,
                 quant.otype, lo, hi, self.three, t.cmap, t.kbs, t.lut, t.fc, t.words, t.low,
                 outv, outp, st)
            return
        act = np.zeros(out.shape, np.uint8)
        call(KL.decode, (6, 7), out, rec, None, sg, act, float(steps[1]), quant.mode,
             quant.otype, lo, hi, self.three, t.cmap, t.kbs, t.lut, t.fc, t.words, t.low,
             outv, outp, st)


class Lorenzo2D(Lorenzo3D):
    name = "spatial"
    three = False

    def extends(self, shape: tuple[int, ...]) -> bool:
        # every frame is coded on its own (``kernels.lorenzo._ring``: no previous frame),
        # its codes after those of the frames before; channels one after another, so
        # only a one-channel window's coding begins with its first frames'
        return len(shape) == 3

    def extend(self, head: Coded, x: np.ndarray, quant: Quantizer, config: dict,
               sgn: np.ndarray) -> Coded:
        nh = 0 if head.out is None else head.out.shape[0]
        if (not self.extends(x.shape) or head.out is None or not 0 < nh < x.shape[0]
                or head.out.shape[1:] != x.shape[1:] or head.out.dtype != x.dtype
                or head.config != config):
            raise ValueError("extend: head is not the full coding of x's first frames")
        if quant.mode == MODE_LOG and sgn.shape != (x.shape[0] - nh, *x.shape[1:]):
            raise ValueError("extend: sgn is not the sign map of the frames after the head")
        codes, ctx, outp = _buffers(x.size)
        nn, no = head.codes.size, head.outliers.size
        codes[:nn] = head.codes
        ctx[:nn] = head.ctx
        outp[:no] = head.outliers
        out = np.empty_like(x)
        out[:nh] = head.out
        rest, orest = x[nh:], out[nh:]
        nn, no2 = self._enc(rest, orest, _rec(orest, quant), sgn, quant, config, codes, ctx,
                            outp, nn, no)
        p = outp[no:no2]
        orest.reshape(-1)[p] = rest.reshape(-1)[p]      # exact, bit for bit
        p += nh * (x.size // x.shape[0])                # flat positions in the window
        return Coded(config, codes[:nn], ctx[:nn], outp[:no2].copy(), out, self.n_ctx,
                     self.groups)
