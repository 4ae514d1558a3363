"""Bit-exact coding of floats (``kernels.bits``): integer prediction of the ordered bit
patterns, modulo 2^64, from the previous frame, 2-D or 3-D Lorenzo."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptFileError
from ..kernels import bits as KB
from ..quantize import _from_ordered_bits, _ordered_bits
from . import Coded, GridPredictor
from .classical import channels

KINDS = {"previous": 0, "spatial": 1, "lorenzo": 2}


def ordered(x: np.ndarray) -> np.ndarray:
    """Float values -> ordered bit patterns as uint64 (same shape)."""
    return _ordered_bits(np.ascontiguousarray(x)).view(np.uint64)


def from_ordered(q: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return _from_ordered_bits(q.view(np.int64), np.dtype(dtype))


class BitsLorenzo(GridPredictor):
    name = "bits"
    n_ctx = KB.N_CTX
    groups = KB.GROUPS

    def configs(self, q: np.ndarray) -> list[dict]:
        return [{"kind": k} for k in KINDS]

    def validate(self, config, shape):
        if not isinstance(config, dict) or set(config) != {"kind"} or config["kind"] not in KINDS:
            raise CorruptFileError("bad predictor configuration")
        return {"kind": config["kind"]}

    def encode(self, q: np.ndarray, config: dict) -> Coded:
        kind = KINDS[config["kind"]]
        vols = channels(q)
        codes = np.empty(q.size, np.int64)
        ctx = np.empty(q.size, np.uint8)
        n = 0
        for v in vols:
            act = np.zeros(v.shape, np.uint8)
            m = KB.encode(v, kind, act, codes[n:], ctx[n:])
            n += m
        return Coded(config, codes[:n], ctx[:n], np.zeros(0, np.int64), None, self.n_ctx,
                     self.groups, has_outliers=False)

    def decode(self, shape: tuple[int, ...], config: dict, tables: Any) -> np.ndarray:
        kind = KINDS[config["kind"]]
        vol = shape[:3]
        nch = shape[3] if len(shape) == 4 else 1
        qs = []
        for _ in range(nch):
            qv = np.empty(vol, np.uint64)
            act = np.zeros(vol, np.uint8)
            KB.decode(qv, kind, act, tables.cmap, tables.kbs, tables.lut, tables.fc,
                      tables.words, tables.low, tables.st)
            qs.append(qv)
        if len(shape) == 3:
            return qs[0]
        out = np.empty(shape, np.uint64)
        for c, qv in enumerate(qs):
            out[..., c] = qv
        return out
