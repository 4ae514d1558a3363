"""The learned predictor: a forecaster (``tezip.learned``) forecasts each frame of the
window from the reconstructed frames before it; the forecast error is coded by the 2-D
interpolation stage (``kernels.interp`` with the forecast as its base). The keyframe is
coded by 2-D interpolation alone.

Determinism: the forecast is computed by exact float32 kernels, then snapped to 1/64 of
the quantization step (a decoder whose arithmetic differed in the last bits would still
land on the same grid point almost always); a CRC-32 of the snapped forecasts travels
with the window and a decoder that does not reproduce it refuses to return data.

One instance per model (registered by hash), no per-call state: thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np

from ..checksum import crc32
from ..errors import CorruptFileError, DecodeMismatchError
from ..kernels import interp as KI
from ..kernels import nn as NN
from ..kernels.core import call
from ..learned.model import Model
from ..learned.runtime import Forecaster
from ..quantize import Quantizer
from . import Coded, ValuePredictor
from .classical import DEFAULT_ANCHOR, Interpolation, interp_kind

SNAP = 64.0
N_CTX = 2 * KI.N_CTX              # the keyframe's contexts, then the forecast errors'
GROUPS = np.concatenate([KI.GROUPS, [KI.N_CTX], KI.GROUPS + KI.N_CTX])
# keyframe and forecast-error stages: both linear or both cubic (cubic codes smooth
# forecast errors about 6% smaller on ks_pypde, linear noisy ones 2-5% smaller)
_STAGES = [{"order": [0, 1, 2], "cubic": c, "ab": [1.0, 1.0], "anchor": DEFAULT_ANCHOR}
           for c in (False, True)]


class Learned(ValuePredictor):
    name = "learned"
    n_ctx: ClassVar[int] = N_CTX
    groups: ClassVar[np.ndarray] = GROUPS

    def __init__(self, model: Model) -> None:
        self.model = model

    def supports(self, x_shape: tuple[int, ...], quant: Quantizer) -> bool:
        """Float and integer bounds (not the point-wise relative one, not bit-exact floats),
        frames with the model's channel count."""
        channels = x_shape[3] if len(x_shape) == 4 else 1
        return quant.mode in (0, 1) and channels == self.model.channels and x_shape[0] >= 2

    def configs(self, x: np.ndarray, quant: Quantizer) -> list[dict]:
        return [{"model": self.model.hash, "key": dict(k), "res": dict(k)} for k in _STAGES]

    def validate(self, config: Any, shape: tuple[int, ...]) -> dict:
        if not isinstance(config, dict) or set(config) != {"model", "key", "res"}:
            raise CorruptFileError("bad predictor configuration")
        if config["model"] != self.model.hash:
            raise DecodeMismatchError(
                f"window coded with model {str(config['model'])[:16]}, but the model at hand "
                f"is {self.model.hash[:16]}")
        interp = Interpolation()
        return {"model": self.model.hash, "key": interp.validate(config["key"], shape),
                "res": interp.validate(config["res"], shape)}

    # -- per frame ------------------------------------------------------------------------
    @staticmethod
    def _frames(a: np.ndarray, t: int) -> list[np.ndarray]:
        """Frame t as (1, H, W) volumes, one per channel."""
        f = a[t:t + 1]
        if f.ndim == 3:
            return [np.ascontiguousarray(f)]
        return [np.ascontiguousarray(f[..., c]) for c in range(f.shape[3])]

    @staticmethod
    def _snap(f: np.ndarray, unit: float, crc: int) -> tuple[np.ndarray, int]:
        f = np.ascontiguousarray(f, np.float64)
        k = np.empty(f.shape, "<i8")
        out = np.empty(f.shape, np.float64)
        NN.snap(f.reshape(-1), unit, k.reshape(-1), out.reshape(-1))
        return out, crc32(k.view(np.uint8), crc)

    def encode(self, x: np.ndarray, quant: Quantizer, config: dict, sgn: np.ndarray,
               sample: bool = False) -> Coded:
        coded = self._code(x, quant, config)
        assert coded is not None
        return coded

    def trial(self, x: np.ndarray, quant: Quantizer, configs: list[dict],
              stop: Callable[[Coded], bool] | None = None, prefix: int = 0
              ) -> Iterator[Coded]:
        """Codings of ``x`` under each of ``configs`` in turn, for their estimates, from
        one run of the forecaster: the first is the first configuration's ``encode``; the
        others code the forecasts made from its reconstruction (theirs differ only where
        their own reconstructions would have steered the forecast apart). The network is
        a trial's whole cost; a caller that stops after the first pays nothing more.
        ``stop``: given the first configuration's coding of the first ``prefix`` frames
        (where ``x`` has more), True ends the trial there, with nothing yielded."""
        bases: list[np.ndarray | None] = []
        first = self._code(x, quant, configs[0], bases, stop=stop, prefix=prefix)
        if first is None:
            return
        yield first
        for config in configs[1:]:
            coded = self._code(x, quant, config, bases, replay=True)
            assert coded is not None
            yield coded

    def _code(self, x: np.ndarray, quant: Quantizer, config: dict,
              bases: list[np.ndarray | None] | None = None, replay: bool = False,
              stop: Callable[[Coded], bool] | None = None, prefix: int = 0
              ) -> Coded | None:
        """``x`` coded under ``config``, each frame after the keyframe against the
        forecast from the frames before it (appended to ``bases`` where given); with
        ``replay``, against the forecasts in ``bases`` instead, without the network;
        None where ``stop`` (see ``trial``) ends it."""
        T = x.shape[0]
        frame_shape = x.shape[1:]
        nch = frame_shape[2] if len(frame_shape) == 3 else 1
        hw = frame_shape[0] * frame_shape[1]
        n = x.size
        codes = np.empty(n, np.int32)
        ctx = np.empty(n, np.uint8)
        outp = np.empty(n, np.int32)
        out = np.empty_like(x)
        positions = []
        nn = no = 0
        lo, hi = quant.range
        steps, eints = quant.levels()
        unit = float(steps[1]) / SNAP
        fc = None if replay else Forecaster(self.model, frame_shape)
        crc = 0
        for t in range(T):
            base = None
            if replay:
                assert bases is not None
                base = bases[t]
            elif t:
                assert fc is not None
                base, crc = self._snap(fc.forecast(), unit, crc)
            if bases is not None and not replay:
                bases.append(base)
            cfg = config["key"] if t == 0 else config["res"]
            for c, xc in enumerate(self._frames(x, t)):
                o = np.empty_like(xc)
                b = None if base is None else np.ascontiguousarray(
                    (base if len(frame_shape) == 2 else base[..., c])[None])
                rec = o if b is None else np.empty(xc.shape, np.float64)
                n0, no0 = nn, no
                nn, no = call(KI.encode, (8, 9), xc, b, o, rec, np.zeros(1, np.int8), steps,
                              eints, quant.eb, quant.mode, quant.otype, lo, hi,
                              np.asarray(cfg["order"], np.int64), interp_kind(cfg),
                              int(cfg["anchor"]), codes, ctx, outp, n0, no0)
                if t:
                    ctx[n0:nn] += KI.N_CTX
                p = outp[no0:no].astype(np.int64)
                o.reshape(-1)[p] = xc.reshape(-1)[p]          # exact values
                positions.append((t * hw + p) * nch + c)
                if len(frame_shape) == 2:
                    out[t] = o[0]
                else:
                    out[t, ..., c] = o[0]
            if stop is not None and t + 1 == prefix < T and stop(
                    Coded(config, codes[:nn], ctx[:nn], np.zeros(0, np.int64), None,
                          self.n_ctx, self.groups)):
                return None
            if fc is not None:
                fc.start(out[0]) if t == 0 else fc.observe(out[t])
        flat = np.concatenate(positions) if positions else np.zeros(0, np.int64)
        return Coded(config, codes[:nn], ctx[:nn], flat, out, self.n_ctx, self.groups,
                     extra={"f": crc})

    def decode(self, shape: tuple[int, ...], quant: Quantizer, config: dict, tables: Any,
               outlier_values: np.ndarray, sgn: np.ndarray, meta: dict | None = None,
               out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        T = shape[0]
        frame_shape = shape[1:]
        nch = frame_shape[2] if len(frame_shape) == 3 else 1
        hw = frame_shape[0] * frame_shape[1]
        lo, hi = quant.range
        steps, _ = quant.levels()
        unit = float(steps[1]) / SNAP
        st = tables.st
        outv = outlier_values.astype(np.float64)
        outp = np.zeros(max(1, outv.size), np.int32)
        out = np.empty(shape, quant.dtype)
        positions = []
        fc = Forecaster(self.model, frame_shape)
        crc = 0
        cmaps = (np.ascontiguousarray(tables.cmap[:KI.N_CTX]),
                 np.ascontiguousarray(tables.cmap[KI.N_CTX:]))
        for t in range(T):
            base = None
            if t:
                base, crc = self._snap(fc.forecast(), unit, crc)
            cfg = config["key"] if t == 0 else config["res"]
            cmap = cmaps[0] if t == 0 else cmaps[1]
            for c in range(nch):
                o = np.empty((1, *frame_shape[:2]), quant.dtype)
                b = None if base is None else np.ascontiguousarray(
                    (base if len(frame_shape) == 2 else base[..., c])[None])
                rec = o if b is None else np.empty(o.shape, np.float64)
                op0 = int(st[7])
                call(KI.decode, (5, 6, 21), o, rec, b, np.zeros(1, np.int8), steps,
                     quant.mode, quant.otype, lo, hi, np.asarray(cfg["order"], np.int64),
                     interp_kind(cfg), int(cfg["anchor"]), cmap, tables.kbs, tables.lut,
                     tables.fc, tables.words, tables.low, outv, outp, st, 0)
                op1 = min(int(st[7]), outv.size)
                p = outp[op0:op1].astype(np.int64)
                o.reshape(-1)[p] = outlier_values[op0:op1]
                positions.append((t * hw + p) * nch + c)
                if len(frame_shape) == 2:
                    out[t] = o[0]
                else:
                    out[t, ..., c] = o[0]
            fc.start(out[0]) if t == 0 else fc.observe(out[t])
        if meta is not None and meta.get("f") != crc:
            raise DecodeMismatchError(
                "the learned forecast differs from the encoder's on this machine; decoding "
                "would not reproduce the data (same model, different arithmetic)")
        flat = np.concatenate(positions) if positions else np.zeros(0, np.int64)
        return out, flat


_INSTANCES: dict[str, Learned] = {}
_LOCK = threading.Lock()


def for_model(model: Model) -> Learned:
    """The predictor of ``model`` (one per model hash)."""
    with _LOCK:
        pred = _INSTANCES.get(model.hash)
        if pred is None:
            pred = _INSTANCES[model.hash] = Learned(model)
        return pred

