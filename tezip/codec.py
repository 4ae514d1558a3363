"""The encoder and decoder: compose quantizer, predictor, entropy coder and container.

The pipeline per window is pure functions over numpy arrays (``encode_window`` /
``decode_window``); ``compress_stack`` and ``TezFile`` do the I/O at the edges, streaming
one window at a time so memory stays bounded by the window size.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zstandard

from . import entropy, predictors, quantize
from .container import FORMAT_VERSION, ContainerReader, ContainerWriter
from .errors import CorruptFileError, DecodeMismatchError, OptionError, UnsupportedError
from .quantize import ErrorBound, QuantParams, check_dtype, resolve
from .windows import MAX_WINDOW_VALUES, dynamic_windows, fixed_windows, window_length

__version__ = "0.1.0"
DEFAULT_WINDOW = 16
_META_LEN = struct.Struct("<I")
_MAX_META = 1 << 16
_SHA256 = re.compile("[0-9a-f]{64}")


@dataclass(frozen=True)
class Options:
    """Codec options: the error bound; the predictor ('auto': every available predictor,
    learned included; 'classical': the classical ones; or a registered name); the window
    length in frames (SWP), or with ``threshold`` the maximum length of dynamic windows
    (DWP, see ``windows.dynamic_windows``); the learned model file (None: the shipped
    default)."""

    bound: ErrorBound
    predictor: str = "auto"
    window: int = DEFAULT_WINDOW
    model: str | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.threshold is not None and not (self.threshold > 0 and
                                               math.isfinite(self.threshold)):
            raise OptionError(f"threshold must be a positive fraction of the value range, "
                              f"got {self.threshold}")
        if self.predictor not in ("auto", "classical", *predictors.names()):
            raise OptionError(f"unknown predictor '{self.predictor}'; choose one of "
                              f"{', '.join(['auto', 'classical', *predictors.names()])}")
        if not isinstance(self.window, int) or self.window < 1:
            raise OptionError(f"window must be a positive number of frames, got {self.window}")
        if self.predictor in predictors.LEARNED and not predictors.learned_available(self.model):
            raise OptionError(f"predictor '{self.predictor}' needs torch and a model file; "
                              "install torch or pass --model")

    def candidates(self) -> tuple[str, ...]:
        if self.predictor == "classical":
            return predictors.CLASSICAL_CANDIDATES
        if self.predictor == "auto":
            learned = predictors.LEARNED if predictors.learned_available(self.model) else ()
            return predictors.CLASSICAL_CANDIDATES + learned
        return (self.predictor,)


# ---------------------------------------------------------------------------------------
# one window


def _window_crc(values: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<"),
                                                          copy=False).tobytes()) & 0xFFFFFFFF


_SAMPLE_SIDE = 128
_SAMPLE_FRAMES = 4


def _sample(x: np.ndarray) -> np.ndarray:
    """A central crop of the first frames: enough to rank predictors at a fraction of the
    cost of coding the window."""
    h, w = x.shape[1:3]
    y0, x0 = max(0, (h - _SAMPLE_SIDE) // 2), max(0, (w - _SAMPLE_SIDE) // 2)
    return x[:_SAMPLE_FRAMES, y0:y0 + _SAMPLE_SIDE, x0:x0 + _SAMPLE_SIDE]


def _resolve_predictor(name: str, qp: QuantParams, model: str | None = None) -> Any:
    pred = predictors.get(name, model)
    if pred.domain == "value" and qp.kind == "bits":
        return pred.grid_fallback       # bit-exact floats have no value domain
    return pred


def _run(pred: Any, x: np.ndarray, qp: QuantParams,
         m: quantize.Masks | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """codes, contexts and the reconstruction (in p.dtype, before outliers)."""
    if pred.domain == "grid":
        codes, ctx, q = pred.encode(quantize.grid_codes(x, qp))
        return codes, ctx, quantize.from_grid(q, qp, m)
    codes, ctx, y = pred.encode(quantize.value_domain(x, qp), quantize.value_grid(qp))
    return codes, ctx, quantize.from_values(y, qp, m)


def _rank(x: np.ndarray, qp: QuantParams, candidates: tuple[str, ...],
          model: str | None) -> list[str]:
    """Candidates by estimated code length on a sample of the window, shortest first."""
    if len(candidates) == 1:
        return list(candidates)
    sample = _sample(x)
    m = quantize.masks(sample, qp)
    costs = []
    for cand in candidates:
        pred = _resolve_predictor(cand, qp, model)
        codes, ctx, _ = _run(pred, sample, qp, m)
        costs.append((entropy.estimate_bits(codes, ctx, pred.n_contexts), cand))
    return [c for _, c in sorted(costs)]


def _usable(candidates: tuple[str, ...], x: np.ndarray, qp: QuantParams,
            model: str | None) -> tuple[str, ...]:
    """Drop learned candidates that cannot run on ``x``: bit-exact float coding (no value
    domain; their fallback duplicates 'previous') and a model for another channel count."""
    if not any(c in predictors.LEARNED for c in candidates):
        return candidates
    channels = x.shape[3] if x.ndim == 4 else 1
    keep = []
    for c in candidates:
        if c in predictors.LEARNED:
            if qp.kind == "bits" and len(candidates) > 1:
                continue
            pred = predictors.get(c, model)
            if pred.channels != channels:
                if len(candidates) == 1:
                    raise OptionError(
                        f"the model {pred.model.path} forecasts {pred.channels}-channel frames "
                        f"but the data have {channels} channel(s); train one with "
                        f"'tezip train' on such data or use --predictor classical")
                continue
        keep.append(c)
    return tuple(keep)


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data) if data else b""


def _unzstd(data: bytes, size: int) -> bytes:
    if size == 0:
        if data:
            raise CorruptFileError("unexpected data in an empty section")
        return b""
    return entropy.unzstd_exact(data, size)


def _fp_quiet(fn: Callable) -> Callable:
    """Run ``fn`` without numpy floating-point warnings: near the float limits predictions
    overflow to inf/nan by design; the exact bound check turns those values into outliers
    (stored exactly) and the window CRC guards the decoder, so the warnings are noise."""
    @functools.wraps(fn)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    return quiet


@_fp_quiet
def encode_window(x: np.ndarray, qp: QuantParams, candidates: tuple[str, ...] | str,
                  model: str | None = None) -> tuple[bytes, str]:
    """Frames ``x`` (native dtype) -> window payload; returns (payload, predictor used)."""
    x = np.ascontiguousarray(x)
    if isinstance(candidates, str):
        candidates = Options(ErrorBound("lossless"), candidates, model=model).candidates()
    ranked = _rank(x, qp, _usable(candidates, x, qp, model), model)
    payload, name = _encode_with(ranked[0], x, qp, model)
    if name in predictors.LEARNED:
        # A short sample ranks learned and classical predictors less reliably than
        # classical ones among themselves (warm-up of the recurrent state, interpolation
        # in time): code the window with the best classical one too and keep the smaller,
        # so a window never costs more with the learned candidates than without them.
        alt = next((c for c in ranked if c not in predictors.LEARNED), None)
        if alt is not None:
            other, alt_name = _encode_with(alt, x, qp, model)
            if len(other) <= len(payload):
                payload, name = other, alt_name
    return payload, name


def _encode_with(name: str, x: np.ndarray, qp: QuantParams,
                 model: str | None) -> tuple[bytes, str]:
    pred = _resolve_predictor(name, qp, model)
    if name in predictors.LEARNED and not hasattr(pred, "hash"):
        name = pred.name     # bit-exact floats: the learned predictor's grid fallback ran
    m = quantize.masks(x, qp)
    codes, ctx, out = _run(pred, x, qp, m)
    stream = entropy.encode(codes, ctx, pred.n_contexts)
    outliers = quantize.find_outliers(x, out, qp)
    values = x.reshape(-1)[outliers]
    out.reshape(-1)[outliers] = values
    masks = b""
    if m is not None:
        masks = np.packbits(m.signs).tobytes() + np.packbits(m.zeros).tobytes()
    sections = [stream, _zstd(np.diff(outliers, prepend=0).astype("<u4").tobytes()),
                _zstd(values.astype(values.dtype.newbyteorder("<")).tobytes()), _zstd(masks)]
    meta = {"p": name, "n": int(x.shape[0]), "o": int(outliers.size),
            "s": [len(s) for s in sections], "c": _window_crc(out)}
    if hasattr(pred, "last_forecast_crc"):
        meta["f"] = pred.last_forecast_crc
    mb = json.dumps(meta, separators=(",", ":")).encode()
    return _META_LEN.pack(len(mb)) + mb + b"".join(sections), name


@_fp_quiet
def decode_window(payload: bytes, qp: QuantParams, frame_shape: tuple[int, ...],
                  frames: int, model: str | None = None,
                  model_hash: str | None = None) -> np.ndarray:
    """Inverse of ``encode_window``; any inconsistency -> CorruptFileError, a result that
    differs from the encoder's -> DecodeMismatchError."""
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
    if name not in predictors.names():
        raise CorruptFileError(f"window uses unknown predictor '{name}'")
    if name in predictors.LEARNED:
        if model_hash is None:
            raise CorruptFileError("window uses a learned predictor but no model is recorded")
        if not predictors.learned_available(model):
            raise OptionError("this file needs the learned predictor: install torch "
                              "(and pass --model if it was not the shipped default)")
    pred = _resolve_predictor(name, qp, model)
    if name in predictors.LEARNED and pred.hash != model_hash:
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
    dec = entropy.Decoder(parts[0], n, pred.n_contexts)
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
    if _window_crc(out) != crc:
        raise DecodeMismatchError(
            "decoded window differs from what the encoder produced (checksum of the "
            "reconstruction); this machine's arithmetic does not reproduce the encoder's")
    return out


# ---------------------------------------------------------------------------------------
# whole stacks


class ArrayStack:
    """Adapts an in-memory array to the reader interface (shape, dtype, read)."""

    def __init__(self, array: np.ndarray, metadata: dict | None = None) -> None:
        self.array = np.asarray(array)
        self.shape = tuple(self.array.shape)
        self.dtype = self.array.dtype.newbyteorder("=")
        self.metadata = metadata or {}

    def read(self, t0: int, t1: int) -> np.ndarray:
        return np.ascontiguousarray(self.array[t0:t1], dtype=self.dtype)


def check_stack(shape: tuple[int, ...], dtype: np.dtype) -> str:
    name = check_dtype(dtype)
    if len(shape) not in (3, 4):
        raise UnsupportedError(f"expected a stack of frames (T, H, W) or (T, H, W, C), got "
                               f"shape {tuple(shape)}")
    if min(shape) == 0:
        raise UnsupportedError(f"empty stack (shape {tuple(shape)})")
    if shape[0] == 1:
        raise UnsupportedError("the stack has a single frame; tezip compresses stacks of "
                               "frames in time (T >= 2)")
    if math.prod(shape[1:]) > MAX_WINDOW_VALUES:
        raise UnsupportedError(f"frames of shape {tuple(shape[1:])} are too large "
                               f"(at most {MAX_WINDOW_VALUES} values per frame)")
    return name


def value_range(stack: Any, chunk: int = 64,
                progress: Callable[[int], None] | None = None) -> tuple[float, float]:
    """(min, max) over the finite values, streaming; (0, 0) if there are none. Reads at
    most ``chunk`` frames and at most about 4M values at a time."""
    lo, hi = math.inf, -math.inf
    chunk = max(1, min(chunk, (1 << 22) // max(1, math.prod(stack.shape[1:]))))
    for t0 in range(0, stack.shape[0], chunk):
        x = stack.read(t0, min(stack.shape[0], t0 + chunk))
        if x.dtype.kind == "f":
            finite = np.isfinite(x)
            if not finite.all():
                x = x[finite]
            del finite
        if x.size:
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
        if progress:
            progress(0)
    return (lo, hi) if lo <= hi else (0.0, 0.0)


@dataclass
class Stats:
    raw_bytes: int = 0
    compressed_bytes: int = 0
    windows: int = 0
    predictors: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.compressed_bytes if self.compressed_bytes else math.inf


def _model_record(options: Options) -> dict | None:
    learned = [c for c in options.candidates() if c in predictors.LEARNED]
    if not learned:
        return None
    pred = predictors.get(learned[0], options.model)
    return {"hash": pred.hash, "file": os.path.basename(pred.model.path)}


def build_header(stack: Any, options: Options, qp: QuantParams, vrange: tuple[float, float],
                 window: int) -> dict:
    b = options.bound
    return {
        "format": "tez", "format_version": FORMAT_VERSION, "tezip": __version__,
        "dtype": qp.dtype, "shape": [int(s) for s in stack.shape],
        "bound": {"mode": b.mode, "abs": b.abs, "rel": b.rel, "pw": b.pw},
        "quant": qp.to_dict(), "predictor": options.predictor, "window": window,
        "windows": ("dynamic" if options.threshold else "fixed"),
        "threshold": options.threshold,
        "model": _model_record(options),
        "value_range": list(vrange), "metadata": getattr(stack, "metadata", {}) or {},
    }


def compress_stack(stack: Any, out: str | os.PathLike | None, options: Options, *,
                   force: bool = False, fileobj: Any = None,
                   progress: Callable[[int], None] | None = None,
                   vrange: tuple[float, float] | None = None) -> Stats:
    """Compress a reader (``shape``, ``dtype``, ``read(t0, t1)``, ``metadata``) into a .tez
    file at ``out`` (atomically) or into ``fileobj``. ``vrange`` (min, max of the finite
    values) overrides the stack's own, e.g. so that every shard of a larger stack resolves a
    relative bound against the whole stack's range."""
    shape = tuple(int(s) for s in stack.shape)
    dtype = np.dtype(stack.dtype)
    check_stack(shape, dtype)
    if vrange is None:
        vrange = (0.0, 0.0)
        if options.bound.mode in ("rel", "absrel") or dtype.kind == "f":
            vrange = value_range(stack)
    qp = resolve(options.bound, dtype, (float(vrange[0]), float(vrange[1])))
    wlen = window_length(options.window, math.prod(shape[1:]))
    header = build_header(stack, options, qp, vrange, wlen)
    candidates = options.candidates()
    stats = Stats(raw_bytes=math.prod(shape) * dtype.itemsize)
    with ContainerWriter(out, header, force=force, fileobj=fileobj) as w:
        if options.threshold:
            scale = vrange[1] - vrange[0]
            if scale <= 0:
                lo, hi = value_range(stack)
                scale = hi - lo
            plan = dynamic_windows(stack, wlen, options.threshold, scale)
        else:
            plan = fixed_windows(shape[0], wlen)
        for t0, t1 in plan:
            payload, used = encode_window(stack.read(t0, t1), qp, candidates, options.model)
            w.add_window(t0, t1 - t0, payload)
            stats.predictors[used] = stats.predictors.get(used, 0) + 1
            stats.windows += 1
            if progress:
                progress(t1 - t0)
    stats.compressed_bytes = w.bytes_written
    return stats


class TezFile:
    """Random access to a .tez file: ``f[10:20]`` decodes only the windows holding frames
    10-19. Also an iterator over decoded windows for streaming decompression."""

    def __init__(self, source: str | os.PathLike | bytes, model: str | None = None) -> None:
        self.model = model
        if isinstance(source, (str, os.PathLike)):
            from .io import hdf5_tree, sniff_format  # a .tez stream inside an HDF5 file

            if sniff_format(source) == "hdf5":
                source = hdf5_tree.open_embedded(os.fspath(source))  # type: ignore[assignment]
        self._c = ContainerReader(source)
        try:
            self._validate()
        except BaseException:
            self._c.close()
            raise

    def _validate(self) -> None:
        h = self._c.header
        bad = CorruptFileError(f"{self._c.name}: header fields are invalid; the file is damaged")
        try:
            shape = tuple(int(s) for s in h["shape"])
            dtype = np.dtype(h["dtype"])
            self.quant = QuantParams.from_dict(h["quant"])
            window = int(h["window"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise bad from None
        if (len(shape) not in (3, 4) or min(shape) < 1 or max(shape) > 2**31
                or self.quant.dtype != dtype.name or window < 1
                or math.prod(shape[1:]) * window > MAX_WINDOW_VALUES):
            raise bad
        entries = self._c.entries
        if sum(e.frames for e in entries) != shape[0] or any(e.frames > window for e in entries):
            raise bad
        self.header = h
        self.shape = shape
        self.dtype = dtype
        self.window = window
        self.metadata = h.get("metadata") or {}
        rec = h.get("model")
        self.model_hash = rec.get("hash") if isinstance(rec, dict) else None
        if rec is not None and not (isinstance(self.model_hash, str)
                                    and _SHA256.fullmatch(self.model_hash)):
            raise bad      # a learned window would name this hash in its messages
        self._starts = np.array([e.t0 for e in entries], np.int64)

    @property
    def n_windows(self) -> int:
        return len(self._c.entries)

    @property
    def compressed_bytes(self) -> int:
        return self._c.size

    def __len__(self) -> int:
        return self.shape[0]

    def window_frames(self) -> list[tuple[int, int]]:
        return [(e.t0, e.t0 + e.frames) for e in self._c.entries]

    def decode_window(self, i: int) -> np.ndarray:
        e = self._c.entries[i]
        try:
            return decode_window(self._c.payload(i), self.quant, self.shape[1:], e.frames,
                                 self.model, self.model_hash)
        except CorruptFileError as exc:
            if str(exc).startswith(self._c.name):
                raise
            raise CorruptFileError(f"{self._c.name}: window {i}: {exc}") from None

    def window_meta(self, i: int) -> dict:
        """The small JSON record at the start of window ``i`` (predictor used, sizes)."""
        payload = self._c.payload(i)
        (mlen,) = _META_LEN.unpack_from(payload) if len(payload) >= 4 else (0,)
        try:
            meta = json.loads(payload[_META_LEN.size:_META_LEN.size + mlen])
        except ValueError:
            meta = None
        if not isinstance(meta, dict) or "p" not in meta:
            raise CorruptFileError(f"{self._c.name}: window {i}: bad window metadata")
        return meta

    def iter_windows(self) -> Iterator[tuple[int, np.ndarray]]:
        for i, e in enumerate(self._c.entries):
            yield e.t0, self.decode_window(i)

    def read(self, t0: int, t1: int) -> np.ndarray:
        t0, t1 = max(0, t0), min(self.shape[0], t1)
        out = np.empty((max(0, t1 - t0), *self.shape[1:]), self.dtype)
        if t1 <= t0:
            return out
        first = int(np.searchsorted(self._starts, t0, side="right") - 1)
        last = int(np.searchsorted(self._starts, t1 - 1, side="right") - 1)
        for i in range(first, last + 1):
            e = self._c.entries[i]
            w = self.decode_window(i)
            a, b = max(t0, e.t0), min(t1, e.t0 + e.frames)
            out[a - t0:b - t0] = w[a - e.t0:b - e.t0]
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, tuple):
            first, rest = (key[0], key[1:]) if key else (slice(None), ())
            return self[first][(slice(None), *rest)] if not isinstance(first, (int, np.integer)) \
                else self[first][rest]
        if isinstance(key, (int, np.integer)):
            k = int(key) + (self.shape[0] if key < 0 else 0)
            if not 0 <= k < self.shape[0]:
                raise IndexError(f"frame {key} out of range for {self.shape[0]} frames")
            return self.read(k, k + 1)[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step == 1:
                return self.read(start, stop)
            idx = range(start, stop, step)
            if not idx:
                return self.read(0, 0)
            block = self.read(min(idx), max(idx) + 1)
            return block[np.array(idx) - min(idx)]
        raise TypeError(f"index with an int or a slice, not {type(key).__name__}")

    def read_all(self) -> np.ndarray:
        return self.read(0, self.shape[0])

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> TezFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
