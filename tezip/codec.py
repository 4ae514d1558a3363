"""The encoder and decoder: compose quantizer, predictor, entropy coder and container.

Per window (pure functions over numpy arrays): ``encode_window`` ranks the candidate
predictors and their configurations by estimated size on a sample of the window, codes
the window with the best one and packs the payload; ``decode_window`` reverses it.
``compress_stack`` and ``TezFile`` do the I/O at the edges, streaming windows so memory
stays bounded by a few windows; windows are coded and decoded in parallel threads (the
kernels release the GIL).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import re
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import predictors
from .container import FORMAT_VERSION, ContainerReader, ContainerWriter
from .errors import CorruptFileError, DecodeMismatchError, OptionError, UnsupportedError
from .kernels.consts import MODE_LOG
from .quantize import ErrorBound, Quantizer, QuantParams, check_dtype, quantizer, resolve
from .windows import MAX_WINDOW_VALUES, dynamic_windows, fixed_windows, window_length

__version__ = "0.2.0"
DEFAULT_WINDOW = 32
_SHA256 = re.compile("[0-9a-f]{64}")


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Options:
    """Codec options: the error bound; the predictor ('auto' and 'classical': the
    classical predictors, ranked per window; or a registered name); the window length in
    frames (SWP), or with ``threshold`` the maximum length of dynamic windows (DWP, see
    ``windows.dynamic_windows``); worker threads (None: one per CPU)."""

    bound: ErrorBound
    predictor: str = "auto"
    window: int = DEFAULT_WINDOW
    model: str | None = None
    threshold: float | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threshold is not None and not (self.threshold > 0 and
                                               math.isfinite(self.threshold)):
            raise OptionError(f"threshold must be a positive fraction of the value range, "
                              f"got {self.threshold}")
        allowed = ("auto", "classical", *predictors.CLASSICAL_CANDIDATES)
        if self.predictor not in allowed:
            raise OptionError(f"unknown predictor '{self.predictor}'; choose one of "
                              f"{', '.join(allowed)}")
        if not isinstance(self.window, int) or self.window < 1:
            raise OptionError(f"window must be a positive number of frames, got {self.window}")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise OptionError(f"threads must be a positive number, got {self.threads}")

    def candidates(self) -> tuple[str, ...]:
        if self.predictor in ("auto", "classical"):
            return predictors.CLASSICAL_CANDIDATES
        return (self.predictor,)

    def n_threads(self) -> int:
        return self.threads or default_threads()


# ---------------------------------------------------------------------------------------
# one window


def window_crc(values: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<"),
                                                          copy=False).tobytes()) & 0xFFFFFFFF


_TILE = 33                # sample tiles: _TILE x _TILE pixels over every frame of the window
_SAMPLE_VALUES = 1 << 17  # at least this many values (or the whole window)
_SAMPLE_FRACTION = 0.03   # and about this fraction of a large window


def sample_tiles(x: np.ndarray) -> np.ndarray:
    """Tiles of the window (every frame, a grid of spatial crops) stacked as channels:
    (T, tile, tile, k * C). The whole window when it is small."""
    t, h, w = x.shape[:3]
    if x.size <= _SAMPLE_VALUES or h < 2 * _TILE or w < 2 * _TILE:
        return x
    per = t * _TILE * _TILE * (x.shape[3] if x.ndim == 4 else 1)
    k = max(2, math.ceil(max(_SAMPLE_VALUES, _SAMPLE_FRACTION * x.size) / per))
    ny = max(1, min(h // _TILE, round(math.sqrt(k * h / w))))
    nx = max(1, min(w // _TILE, math.ceil(k / ny)))
    ys = np.linspace(0, h - _TILE, ny).round().astype(int)
    xs = np.linspace(0, w - _TILE, nx).round().astype(int)
    tiles = [x[:, y0:y0 + _TILE, x0:x0 + _TILE] for y0 in ys for x0 in xs]
    if x.ndim == 3:
        return np.ascontiguousarray(np.stack(tiles, axis=-1))
    return np.ascontiguousarray(np.concatenate(tiles, axis=-1))


def sign_map(x: np.ndarray, quant: Quantizer) -> np.ndarray:
    """Point-wise relative mode: +-1 by sign, +-2 for exact zeros (skipped by the
    kernels); other modes: a dummy."""
    if quant.mode != MODE_LOG:
        return np.zeros(1, np.int8)
    neg = np.signbit(x)
    s = np.where(neg, np.int8(-1), np.int8(1))
    return np.where(x == 0, s * 2, s).astype(np.int8)


def _masks_bytes(x: np.ndarray) -> bytes:
    return np.packbits(np.signbit(x).ravel()).tobytes() + np.packbits((x == 0).ravel()).tobytes()


def _sgn_from_masks(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    plen = (n + 7) // 8
    if len(raw) != 2 * plen:
        raise CorruptFileError("bad mask section")
    b = np.frombuffer(raw, np.uint8)
    neg = np.unpackbits(b[:plen], count=n).astype(bool)
    zero = np.unpackbits(b[plen:], count=n).astype(bool)
    s = np.where(neg, np.int8(-1), np.int8(1))
    return np.where(zero, s * 2, s).astype(np.int8).reshape(shape)


def _estimate(coded: predictors.Coded, itemsize: int) -> float:
    from . import entropy

    return entropy.estimate_bits(coded.codes, coded.ctx, coded.n_ctx, coded.groups,
                                 8.0 * itemsize, coded.has_outliers)


def choose(x: np.ndarray, quant: Quantizer, candidates: tuple[str, ...]) -> tuple[str, dict]:
    """The predictor and configuration to code window ``x`` with (smallest estimate on a
    sample of the window)."""
    if len(candidates) == 1:
        cfgs = predictors.get(candidates[0]).configs(x, quant)
        if len(cfgs) == 1:
            return candidates[0], cfgs[0]
    sample = sample_tiles(x)
    sgn = sign_map(sample, quant)
    best = None
    for name in candidates:
        bits, cfg = predictors.get(name).tune(sample, quant, sgn,
                                              lambda c: _estimate(c, sample.itemsize))
        if best is None or bits < best[0]:
            best = (bits, name, cfg)
    assert best is not None
    return best[1], best[2]


def _fp_quiet(fn: Callable) -> Callable:
    """Run ``fn`` without numpy floating-point warnings (near the float limits values
    overflow by design; the exact checks store those values exactly)."""
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)
    quiet.__doc__ = fn.__doc__
    quiet.__name__ = fn.__name__
    return quiet


@_fp_quiet
def encode_window(x: np.ndarray, qp: QuantParams,
                  candidates: tuple[str, ...] = predictors.CLASSICAL_CANDIDATES
                  ) -> tuple[bytes, str]:
    """Frames ``x`` (native dtype) -> window payload; returns (payload, predictor used)."""
    from . import entropy, payload
    from .predictors.lossless import ordered

    x = np.ascontiguousarray(x)
    quant = quantizer(qp)
    sections: dict[str, bytes] = {}
    if qp.kind == "bits":
        pred = predictors.get("bits")
        q = ordered(x)
        sample = sample_tiles(q)
        cfg = min(pred.configs(q), key=lambda c: _estimate(pred.encode(sample, c), 8))
        coded = pred.encode(q, cfg)
        name, out = "bits", x
    else:
        name, cfg = choose(x, quant, candidates)
        pred = predictors.get(name)
        coded = pred.encode(x, quant, cfg, sign_map(x, quant))
        out = coded.out
        if coded.outliers.size:
            sections["outliers"] = x.reshape(-1)[coded.outliers].astype(
                x.dtype.newbyteorder("<")).tobytes()
        if quant.mode == MODE_LOG:
            sections["masks"] = _masks_bytes(x)
    streams = entropy.encode(coded.codes, coded.ctx, coded.n_ctx, coded.groups,
                             coded.has_outliers)
    sections.update(model=streams.model, words=streams.words, low=streams.low)
    meta = {"p": name, "cfg": coded.config, "n": int(x.shape[0]),
            "o": int(coded.outliers.size), "c": window_crc(out), **coded.extra}
    return payload.pack(meta, sections), name


@_fp_quiet
def decode_window(data: bytes, qp: QuantParams, frame_shape: tuple[int, ...],
                  frames: int) -> np.ndarray:
    """Inverse of ``encode_window``; any inconsistency -> CorruptFileError, a result that
    differs from the encoder's -> DecodeMismatchError."""
    from . import entropy, payload
    from .predictors.lossless import from_ordered

    shape = (frames, *frame_shape)
    n = math.prod(shape)
    dtype = np.dtype(qp.dtype)
    limits = {"low": 17 * n + 8, "outliers": n * dtype.itemsize,
              "masks": 2 * ((n + 7) // 8)}
    p = payload.unpack(data, limits)
    meta = p.meta
    try:
        name, cfg = str(meta["p"]), meta["cfg"]
        n_frames, n_out, crc = int(meta["n"]), int(meta["o"]), int(meta["c"])
    except (KeyError, TypeError, ValueError, OverflowError):
        raise CorruptFileError("bad window metadata") from None
    if n_frames != frames or not 0 <= n_out <= n or not isinstance(cfg, dict):
        raise CorruptFileError("window metadata does not match the index")
    if name not in predictors.names() or (name == "bits") != (qp.kind == "bits"):
        raise CorruptFileError(f"window uses unknown predictor '{name}'")
    pred = predictors.get(name)
    cfg = pred.validate(cfg, shape)
    quant = quantizer(qp)
    tables = entropy.tables(entropy.Streams(p.sections["model"], p.sections["words"],
                                            p.sections["low"]), pred.n_ctx)
    if qp.kind == "bits":
        if n_out or p.sections["outliers"] or p.sections["masks"]:
            raise CorruptFileError("unexpected sections in a bit-exact window")
        q = pred.decode(shape, cfg, tables)
        tables.check_end()
        out = from_ordered(q, dtype)
    else:
        raw = p.sections["outliers"]
        if len(raw) != n_out * dtype.itemsize:
            raise CorruptFileError("bad outlier section")
        vals = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype)
        if quant.mode == MODE_LOG:
            sgn = _sgn_from_masks(p.sections["masks"], shape)
        elif p.sections["masks"]:
            raise CorruptFileError("unexpected mask section")
        else:
            sgn = np.zeros(1, np.int8)
        out, pos = pred.decode(shape, quant, cfg, tables, vals, sgn)
        tables.check_end()
        if pos.size != n_out:
            raise CorruptFileError("outlier count does not match the stream")
        out.reshape(-1)[pos] = vals
    if window_crc(out) != crc:
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


def build_header(stack: Any, options: Options, qp: QuantParams, vrange: tuple[float, float],
                 window: int) -> dict:
    b = options.bound
    return {
        "format": "tez", "format_version": FORMAT_VERSION, "tezip": __version__,
        "dtype": qp.dtype, "shape": [int(s) for s in stack.shape],
        "bound": {"mode": b.mode, "abs": b.abs, "rel": b.rel, "pw": b.pw},
        "quant": qp.to_dict(), "predictor": options.predictor, "window": window,
        "windows": ("dynamic" if options.threshold else "fixed"),
        "threshold": options.threshold, "model": None,
        "value_range": list(vrange), "metadata": getattr(stack, "metadata", {}) or {},
    }


def _ordered_map(fn: Callable[[Any], Any], items: Iterator[Any], threads: int) -> Iterator[Any]:
    """``map(fn, items)`` in order, with up to ``threads`` calls under way (and at most
    2 x threads items read ahead, so memory stays bounded)."""
    if threads <= 1:
        for item in items:
            yield fn(item)
        return
    with cf.ThreadPoolExecutor(threads, thread_name_prefix="tezip") as pool:
        pending: deque[cf.Future] = deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                while len(pending) >= 2 * threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


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
        frames = ((t0, t1, stack.read(t0, t1)) for t0, t1 in plan)

        def work(item: tuple[int, int, np.ndarray]) -> tuple[int, int, bytes, str]:
            t0, t1, x = item
            data, used = encode_window(x, qp, candidates)
            return t0, t1, data, used

        for t0, t1, data, used in _ordered_map(work, frames, options.n_threads()):
            w.add_window(t0, t1 - t0, data)
            stats.predictors[used] = stats.predictors.get(used, 0) + 1
            stats.windows += 1
            if progress:
                progress(t1 - t0)
    stats.compressed_bytes = w.bytes_written
    return stats


class TezFile:
    """Random access to a .tez file: ``f[10:20]`` decodes only the windows holding frames
    10-19. Also an iterator over decoded windows for streaming decompression. Windows are
    decoded in up to ``threads`` threads (None: one per CPU); one TezFile may be used from
    many threads at once."""

    def __init__(self, source: str | os.PathLike | bytes, model: str | None = None,
                 threads: int | None = None) -> None:
        self.model = model
        self.threads = threads or default_threads()
        self._lock = threading.Lock()
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
        self.version = self._c.version
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

    def _payload(self, i: int) -> bytes:
        with self._lock:                       # one file handle, shared
            return self._c.payload(i)

    def decode_window(self, i: int) -> np.ndarray:
        return self._decode(i, self._payload(i))

    def _decode(self, i: int, data: bytes) -> np.ndarray:
        e = self._c.entries[i]
        try:
            if self.version == 1:
                from .legacy import v1

                return v1.decode_window(data, self.quant, self.shape[1:], e.frames,
                                        self.model, self.model_hash)
            return decode_window(data, self.quant, self.shape[1:], e.frames)
        except CorruptFileError as exc:
            if str(exc).startswith(self._c.name):
                raise
            raise CorruptFileError(f"{self._c.name}: window {i}: {exc}") from None

    def window_meta(self, i: int) -> dict:
        """The small JSON record at the start of window ``i`` (predictor used, sizes)."""
        from .payload import peek_meta

        try:
            meta = peek_meta(self._payload(i))
        except CorruptFileError:
            meta = None
        if not isinstance(meta, dict) or "p" not in meta:
            raise CorruptFileError(f"{self._c.name}: window {i}: bad window metadata")
        return meta

    def _windows(self, indices: list[int]) -> Iterator[tuple[int, np.ndarray]]:
        """(index, decoded window) in order, decoded in parallel threads."""
        items = ((i, self._payload(i)) for i in indices)
        yield from _ordered_map(lambda it: (it[0], self._decode(*it)), items,
                                min(self.threads, max(1, len(indices))))

    def iter_windows(self) -> Iterator[tuple[int, np.ndarray]]:
        for i, w in self._windows(list(range(self.n_windows))):
            yield self._c.entries[i].t0, w

    def read(self, t0: int, t1: int) -> np.ndarray:
        t0, t1 = max(0, t0), min(self.shape[0], t1)
        out = np.empty((max(0, t1 - t0), *self.shape[1:]), self.dtype)
        if t1 <= t0:
            return out
        first = int(np.searchsorted(self._starts, t0, side="right") - 1)
        last = int(np.searchsorted(self._starts, t1 - 1, side="right") - 1)
        for i, w in self._windows(list(range(first, last + 1))):
            e = self._c.entries[i]
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
