"""Decoding of format-v1 windows: numpy predictors (grid and value domain), the
constriction-based entropy coder and the torch PredNet forecaster of that version."""

from __future__ import annotations

import functools
import importlib
import json
import math
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import CorruptFileError, DecodeMismatchError, OptionError
from ..quantize import QuantParams
from ..zstd_util import unzstd_exact
from . import quant_v1 as quantize

_META_LEN = struct.Struct("<I")
_MAX_META = 1 << 16
LEARNED = ("prednet", "prednet+interp")
_CLASSES = {"zero": "classical_v1:Zero", "previous": "classical_v1:Previous",
            "lorenzo": "classical_v1:Lorenzo3D", "spatial": "classical_v1:Lorenzo2D",
            "interp": "classical_v1:Interpolation", "prednet": "prednet_v1:PredNetPredictor",
            "prednet+interp": "prednet_v1:PredNetSpatialPredictor"}
_CACHE: dict[str, Any] = {}
_LOCK = threading.Lock()


def _classical(name: str) -> Any:
    with _LOCK:
        if name not in _CACHE:
            module, _, attr = _CLASSES[name].partition(":")
            _CACHE[name] = getattr(importlib.import_module(f"tezip.legacy.{module}"), attr)()
        return _CACHE[name]


def _predictor(name: str, qp: QuantParams, model: str | None) -> Any:
    if name in LEARNED:
        # the v1 learned predictor keeps per-call state: one instance per window
        module, _, attr = _CLASSES[name].partition(":")
        pred = getattr(importlib.import_module(f"tezip.legacy.{module}"), attr)(model=model)
    else:
        pred = _classical(name)
    if pred.domain == "value" and qp.kind == "bits":
        return pred.grid_fallback       # bit-exact floats have no value domain
    return pred


def _crc(values: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<"),
                                                          copy=False).tobytes()) & 0xFFFFFFFF


def _unzstd(data: bytes, size: int) -> bytes:
    if size == 0:
        if data:
            raise CorruptFileError("unexpected data in an empty section")
        return b""
    return unzstd_exact(data, size)


def _fp_quiet(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    return quiet


def learned_available() -> bool:
    return importlib.util.find_spec("torch") is not None


@_fp_quiet
def decode_window(payload: bytes, qp: QuantParams, frame_shape: tuple[int, ...],
                  frames: int, model: str | None = None,
                  model_hash: str | None = None) -> np.ndarray:
    """A v1 window; any inconsistency -> CorruptFileError, a result that differs from
    the encoder's -> DecodeMismatchError."""
    from .entropy_v1 import Decoder

    if len(payload) < _META_LEN.size:
        raise CorruptFileError("truncated window")
    (mlen,) = _META_LEN.unpack_from(payload)
    if mlen > _MAX_META or _META_LEN.size + mlen > len(payload):
        raise CorruptFileError("bad window metadata length")
    try:
        meta = json.loads(payload[_META_LEN.size:_META_LEN.size + mlen])
        name, n_frames, n_out = str(meta["p"]), int(meta["n"]), int(meta["o"])
        sizes, crc = [int(v) for v in meta["s"]], int(meta["c"])
    except (ValueError, KeyError, TypeError, OverflowError):
        raise CorruptFileError("bad window metadata") from None
    shape = (frames, *frame_shape)
    n = math.prod(shape)
    if (n_frames != frames or len(sizes) != 4 or min(sizes) < 0 or not 0 <= n_out <= n
            or _META_LEN.size + mlen + sum(sizes) != len(payload)):
        raise CorruptFileError("window metadata does not match the index")
    if name not in _CLASSES:
        raise CorruptFileError(f"window uses unknown predictor '{name}'")
    if name in LEARNED:
        if model_hash is None:
            raise CorruptFileError("window uses a learned predictor but no model is recorded")
        if not learned_available():
            raise OptionError("this file (format v1) needs the learned predictor of that "
                              "version: install torch (and pass --model if it was not the "
                              "shipped default)")
    pred = _predictor(name, qp, model)
    if name in LEARNED and pred.hash != model_hash:
        raise DecodeMismatchError(
            f"encoded with model {model_hash[:16]}, but the model at hand ({pred.model.path})"
            f" is {pred.hash[:16]}; pass the encoder's model with --model")
    pos = _META_LEN.size + mlen
    parts = []
    for s in sizes:
        parts.append(payload[pos:pos + s])
        pos += s
    dtype = np.dtype(qp.dtype)
    idx = np.cumsum(np.frombuffer(_unzstd(parts[1], 4 * n_out), "<u4").astype(np.int64))
    if n_out and (idx[-1] >= n or np.any(np.diff(idx) <= 0)):
        raise CorruptFileError("bad outlier positions")
    vals = np.frombuffer(_unzstd(parts[2], n_out * dtype.itemsize),
                         dtype.newbyteorder("<")).astype(dtype)
    m = None
    if qp.kind == "log":
        plen = (n + 7) // 8
        raw = np.frombuffer(_unzstd(parts[3], 2 * plen), np.uint8)
        m = quantize.Masks(np.unpackbits(raw[:plen], count=n).astype(bool),
                           np.unpackbits(raw[plen:], count=n).astype(bool))
    elif sizes[3]:
        raise CorruptFileError("unexpected mask section")
    dec = Decoder(parts[0], n, pred.n_contexts)
    if pred.domain == "grid":
        out = quantize.from_grid(pred.decode(shape, dec.take), qp, m)
    else:
        out = quantize.from_values(pred.decode(shape, quantize.value_grid(qp), dec.take), qp, m)
    dec.finish()
    if "f" in meta and meta["f"] != getattr(pred, "last_forecast_crc", None):
        raise DecodeMismatchError(
            "the learned forecast differs from the encoder's on this machine; decoding would "
            "not reproduce the data (same model, different arithmetic)")
    out.reshape(-1)[idx] = vals
    if _crc(out) != crc:
        raise DecodeMismatchError(
            "decoded window differs from what the encoder produced (checksum of the "
            "reconstruction); this machine's arithmetic does not reproduce the encoder's")
    return out
