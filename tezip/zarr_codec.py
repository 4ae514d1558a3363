"""tezip as a numcodecs codec, so zarr (and through it xarray and dask) can store a
(T, H, W) or (T, H, W, C) array chunked along time with tezip.

Two faces over one implementation:

``Tezip``
    a ``numcodecs.abc.Codec`` (``codec_id = "tezip"``), found by
    ``numcodecs.get_codec({"id": "tezip", ...})`` through the ``numcodecs.codecs`` entry
    point. Use it as the ``compressor`` of a zarr format 2 array (zarr-python 2, or
    zarr-python 3 with ``zarr_format=2``): there zarr hands the compressor the chunk as an
    ndarray with its shape, which is what tezip needs.

``TezipZarr3``
    the same codec as a zarr format 3 *array-to-bytes* codec (the ``serializer`` of
    ``zarr.create_array``; name ``"tezip"`` in the array metadata), registered through
    the ``zarr.codecs`` entry point. zarr 3 hands its bytes-to-bytes ``compressors`` a flat
    byte buffer without shape or dtype, so tezip cannot be one of those; it replaces the
    default ``bytes`` serializer instead. Built on first access, so importing this module
    does not import zarr. ``Tezip(...).zarr3()`` converts.

Each chunk is one self-contained ``.tez`` stream (header, window index, checksums): a
damaged chunk raises ``tezip.CorruptFileError`` instead of returning wrong data.

Chunk shapes. tezip codes stacks of frames; the leading axis of a chunk is time, so chunk
along time with several frames per chunk (e.g. ``chunks=(16, H, W)``); the compressor
exploits the time correlation only inside a chunk. Other shapes are handled rather than
refused, so an array whose chunking you do not control still round-trips within the bound:

- 3-D (T, H, W) and 4-D (T, H, W, C) chunks are coded as they are;
- a single-frame chunk (T == 1) and a 2-D chunk (H, W) are coded as a two-frame stack
  whose second frame repeats the first (it costs almost nothing: it is predicted exactly),
  and the original shape is recorded in the stream;
- a chunk with more than 4 axes (T, H, W, a, b, ...) is coded as (T, H, W, a*b*...) and
  reshaped back;
- 0-D and 1-D chunks, and plain byte buffers (which carry no shape), raise
  ``tezip.UnsupportedError``: there is no frame to code.

Unsupported dtypes (tezip takes uint8, uint16, int16, int32, float32, float64) raise
``tezip.UnsupportedError``; with zarr 3 this happens when the array is created.

Relative bounds. ``mode="rel"`` (and the relative part of ``"absrel"``) is relative to
the value range of *each chunk* unless ``value_range=(lo, hi)`` is given: zarr encodes
chunks independently, so without it every chunk resolves ``bound * (max - min)`` over its
own finite values (including fill values zarr pads an edge chunk with), and a chunk with a
small range is stored more finely than one with a large range. To get the whole-array
guarantee ``|x - x'| <= bound * (max - min)`` of ``tezip compress --mode rel``, pass the
array's range as ``value_range``; each chunk then uses the absolute bound
``bound * (hi - lo)``, and values outside [lo, hi] are still stored within it.
"""

from __future__ import annotations

import asyncio
import io
import math
from typing import Any

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy

from . import make_bound
from .codec import ArrayStack, Options, TezFile, compress_stack
from .errors import CorruptFileError, InputError, OptionError, UnsupportedError
from .quantize import MODES, check_dtype

__all__ = ["Tezip", "TezipZarr3"]  # noqa: F822 - TezipZarr3 is built on first access

_META_KEY = "zarr_chunk"  # header metadata when the coded shape or byte order differs


class Tezip(Codec):
    """numcodecs codec for error-bounded compression of frame stacks with tezip.

    Parameters
    ----------
    mode : {"abs", "rel", "absrel", "pwrel", "lossless"}
        The error-bound mode (see the README). Default ``"rel"`` when ``bound`` is given,
        else ``"lossless"``.
    bound : float, optional
        The bound of ``mode``: absolute for ``abs`` and ``absrel``, a fraction of the value
        range for ``rel``, point-wise relative for ``pwrel``; none for ``lossless``.
    rel_bound : float, optional
        The relative part of ``absrel``.
    predictor : str
        ``"classical"`` (default): the classical predictors only. ``"auto"`` adds the
        wavelet transform coder where it codes a chunk's first window under 0.9x their
        size (format v8: readers need tezip 0.8 or later), and the learned predictor with
        the shipped default model where it codes a window smaller (readers need a tezip
        that ships the same model; no torch is needed to read or write); ``"learned"`` or
        ``"wavelet"`` forces that one; a classical predictor name forces that one.
    window : int, optional
        Frames per window inside a chunk (default: automatic, ``windows.window_length``:
        33, more for frames of fewer than 7,944 values); a chunk shorter than that is one
        window, and a last window of fewer than half as many frames joins the one before
        it.
    value_range : (float, float), optional
        ``(min, max)`` of the whole array, so that ``rel`` / ``absrel`` bounds are relative
        to the array's range instead of each chunk's (see the module docstring).
    """

    codec_id = "tezip"

    def __init__(self, mode: str | None = None, bound: float | None = None,
                 rel_bound: float | None = None, predictor: str = "classical",
                 window: int | None = None,
                 value_range: tuple[float, float] | list[float] | None = None) -> None:
        if mode is None:
            mode = "rel" if bound is not None else "lossless"
        if mode not in MODES:
            raise OptionError(f"unknown mode '{mode}'; choose one of {', '.join(MODES)}")
        self.mode = mode
        self.bound = None if bound is None else float(bound)
        self.rel_bound = None if rel_bound is None else float(rel_bound)
        self.predictor = str(predictor)
        if window is not None and (isinstance(window, bool)
                                   or not isinstance(window, (int, np.integer))):
            raise OptionError(f"window must be a positive number of frames, got {window!r}")
        self.window = None if window is None else int(window)
        if value_range is not None:
            try:
                lo, hi = (float(v) for v in value_range)
            except (TypeError, ValueError):
                raise OptionError(f"value_range must be (min, max), got {value_range!r}") from None
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise OptionError(f"value_range must be finite with min <= max, got "
                                  f"{value_range!r}")
            value_range = (lo, hi)
        self.value_range = value_range
        # validates bound values, predictor name and window now, not at the first chunk
        self._options = Options(make_bound(mode, self.bound, self.rel_bound),
                                predictor=self.predictor, window=self.window)

    # -- configuration -------------------------------------------------------------------

    def get_config(self) -> dict:
        config: dict[str, Any] = {"id": self.codec_id, "mode": self.mode, "bound": self.bound,
                                  "rel_bound": self.rel_bound, "predictor": self.predictor}
        if self.window is not None:     # (none: automatic; a config older tezips read too)
            config["window"] = self.window
        if self.value_range is not None:
            config["value_range"] = list(self.value_range)
        return config

    @classmethod
    def from_config(cls, config: dict) -> Tezip:
        config = dict(config)
        config.pop("id", None)
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items()
                         if k != "id" and v is not None)
        return f"{type(self).__name__}({args})"

    def zarr3(self) -> Any:
        """The same codec as a zarr format 3 serializer (``TezipZarr3``); needs zarr >= 3."""
        config = self.get_config()
        config.pop("id")
        return _zarr3_class()(**config)

    # -- coding --------------------------------------------------------------------------

    def encode(self, buf: Any) -> bytes:
        if isinstance(buf, (bytes, bytearray, memoryview)) or not hasattr(buf, "shape"):
            raise UnsupportedError(
                "the tezip codec needs the chunk as an array with its shape and dtype, got a "
                "byte buffer; use Tezip as the compressor of a zarr format 2 array, or "
                "TezipZarr3 (Tezip(...).zarr3()) as the serializer of a zarr format 3 array")
        arr = np.asarray(buf)
        check_dtype(arr.dtype)
        shape = tuple(int(s) for s in arr.shape)
        if arr.ndim < 2:
            raise UnsupportedError(
                f"the tezip codec codes chunks of frames (T, H, W) or (T, H, W, C); got a "
                f"{arr.ndim}-D chunk of shape {shape}")
        stack = arr
        duplicate = False
        if stack.ndim == 2:
            stack = stack[np.newaxis]
        elif stack.ndim > 4:
            stack = stack.reshape(*shape[:3], -1)
        if stack.shape[0] == 1:
            stack = np.concatenate([stack, stack])
            duplicate = True
        meta = {}
        swapped = arr.dtype.itemsize > 1 and not arr.dtype.isnative
        if duplicate or stack.shape != shape or swapped:
            # numcodecs decodes to the bytes it was given: keep the chunk's shape and order
            meta[_META_KEY] = {"shape": list(shape), "repeated": duplicate,
                               "byteorder": arr.dtype.byteorder if swapped else "="}
        out = io.BytesIO()
        compress_stack(ArrayStack(stack, meta), None, self._options, fileobj=out,
                       vrange=self.value_range, lean=True)
        return out.getvalue()

    def decode(self, buf: Any, out: Any = None) -> np.ndarray:
        data = ensure_contiguous_ndarray(buf).tobytes()
        try:
            with TezFile(data) as f:
                arr = f.read_all()
                meta = f.metadata.get(_META_KEY) if isinstance(f.metadata, dict) else None
        except (CorruptFileError, InputError) as e:  # InputError: not a .tez stream at all
            raise CorruptFileError(f"tezip zarr chunk is damaged: {e}") from e
        if meta is not None:
            try:
                shape = tuple(int(s) for s in meta["shape"])
                if meta.get("repeated"):
                    arr = arr[:1]
                arr = arr.reshape(shape)
                if meta.get("byteorder", "=") != "=":
                    arr = arr.astype(arr.dtype.newbyteorder(meta["byteorder"]))
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                raise CorruptFileError("tezip zarr chunk is damaged: its recorded chunk "
                                       "shape does not match the data") from None
        return ndarray_copy(arr, out) if out is not None else arr


# ---------------------------------------------------------------------------------------
# zarr format 3: an array-to-bytes codec, built on first access so that importing this
# module does not import zarr


def _make_zarr3_class() -> type:
    from dataclasses import dataclass

    from zarr.abc.codec import ArrayBytesCodec
    from zarr.core.common import parse_named_configuration

    @dataclass(frozen=True)
    class TezipZarr3(ArrayBytesCodec):
        """tezip as a zarr format 3 array-to-bytes codec (``serializer=``); takes the same
        parameters as ``Tezip`` and stores them under the codec name ``"tezip"``."""

        mode: str
        bound: float | None
        rel_bound: float | None
        predictor: str
        window: int | None          # None: automatic (no entry in the configuration)
        value_range: tuple[float, float] | None

        is_fixed_size = False

        def __init__(self, **config: Any) -> None:
            codec = Tezip(**config)
            for key, value in codec.get_config().items():
                if key != "id":
                    object.__setattr__(self, key, tuple(value) if key == "value_range"
                                       else value)
            for key in ("window", "value_range"):     # (left out of get_config when None)
                if getattr(codec, key) is None:
                    object.__setattr__(self, key, None)
            object.__setattr__(self, "_codec", codec)

        @classmethod
        def from_dict(cls, data: dict) -> TezipZarr3:
            _, config = parse_named_configuration(data, "tezip", require_configuration=False)
            return cls(**(config or {}))

        def to_dict(self) -> dict:
            config = self._codec.get_config()
            config.pop("id")
            return {"name": "tezip",
                    "configuration": {k: v for k, v in config.items() if v is not None}}

        def validate(self, *, shape: tuple[int, ...], dtype: Any, chunk_grid: Any) -> None:
            check_dtype(np.dtype(dtype.to_native_dtype()))
            if len(shape) < 2:
                raise UnsupportedError(f"the tezip codec codes frames; a {len(shape)}-D "
                                       "array has none")

        async def _encode_single(self, chunk_array: Any, chunk_spec: Any) -> Any:
            arr = chunk_array.as_numpy_array()
            data = await asyncio.to_thread(self._codec.encode, arr)
            return chunk_spec.prototype.buffer.from_bytes(data)

        async def _decode_single(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            arr = await asyncio.to_thread(self._codec.decode, chunk_bytes.to_bytes())
            if arr.shape != tuple(chunk_spec.shape):
                raise CorruptFileError(f"tezip zarr chunk has shape {arr.shape}, the array's "
                                       f"chunks are {tuple(chunk_spec.shape)}")
            return chunk_spec.prototype.nd_buffer.from_numpy_array(arr)

        def compute_encoded_size(self, input_byte_length: int, chunk_spec: Any) -> int:
            raise NotImplementedError  # variable size

    TezipZarr3.__module__ = __name__
    TezipZarr3.__qualname__ = "TezipZarr3"
    return TezipZarr3


def _zarr3_class() -> type:
    cls = globals().get("TezipZarr3")
    if cls is None:
        try:
            cls = _make_zarr3_class()
        except ImportError as e:
            raise ImportError(f"TezipZarr3 needs zarr >= 3 (pip install 'tezip[zarr]'): "
                              f"{e}") from e
        globals()["TezipZarr3"] = cls
    return cls


def __getattr__(name: str) -> Any:
    if name == "TezipZarr3":
        return _zarr3_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
