"""tezip: error-bounded compression of stacks of frames in time.

>>> import numpy as np, tezip
>>> data = np.random.default_rng(0).normal(size=(8, 32, 32)).astype("float32")
>>> blob = tezip.compress(data, mode="abs", bound=1e-3)
>>> restored = tezip.decompress(blob)
>>> bool(np.abs(restored - data).max() <= 1e-3)
True
"""

from __future__ import annotations

import io as _io
import os

import numpy as np

from .codec import DEFAULT_WINDOW, ArrayStack, Options, TezFile, __version__, compress_stack
from .errors import (
    CorruptFileError,
    DecodeMismatchError,
    FormatVersionError,
    InputError,
    OptionError,
    OutputError,
    OutputExistsError,
    TezipError,
    UnsupportedError,
)
from .quantize import MODES, ErrorBound

__all__ = [
    "compress", "decompress", "open", "make_bound", "TezFile", "ErrorBound", "Options", "MODES",
    "TezipError", "InputError", "UnsupportedError", "OptionError", "CorruptFileError",
    "FormatVersionError", "OutputExistsError", "OutputError", "DecodeMismatchError",
    "__version__",
]


def make_bound(mode: str, bound: float | None = None, rel_bound: float | None = None) -> ErrorBound:
    """Build an ErrorBound from a mode and its value(s). ``absrel`` takes ``bound`` (absolute)
    and ``rel_bound`` (fraction of the value range)."""
    if mode == "abs":
        return ErrorBound("abs", abs=bound)
    if mode == "rel":
        return ErrorBound("rel", rel=bound if bound is not None else rel_bound)
    if mode == "absrel":
        return ErrorBound("absrel", abs=bound, rel=rel_bound)
    if mode == "pwrel":
        return ErrorBound("pwrel", pw=bound)
    if mode == "lossless":
        if bound not in (None, 0):
            raise OptionError("mode 'lossless' takes no bound")
        return ErrorBound("lossless")
    return ErrorBound(mode)  # raises OptionError for an unknown mode


def compress(array: np.ndarray, mode: str = "rel", bound: float | None = 1e-3, *,
             rel_bound: float | None = None, predictor: str = "auto",
             window: int = DEFAULT_WINDOW, metadata: dict | None = None,
             model: str | os.PathLike | None = None, threshold: float | None = None) -> bytes:
    """Compress a (T, H, W) or (T, H, W, C) array into the bytes of a .tez file.
    ``model``: learned model file (default: the shipped one); ``threshold``: dynamic
    windows (see ``tezip.windows.dynamic_windows``)."""
    if mode == "lossless" and bound == 1e-3:
        bound = None
    opts = Options(make_bound(mode, bound, rel_bound), predictor=predictor, window=window,
                   model=None if model is None else str(model), threshold=threshold)
    buf = _io.BytesIO()
    compress_stack(ArrayStack(array, metadata), None, opts, fileobj=buf)
    return buf.getvalue()


def _memory_limit() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def decompress(data: bytes | os.PathLike | str,
               model: str | os.PathLike | None = None) -> np.ndarray:
    """Decode the bytes of a .tez file (or a path to one) into an array."""
    with TezFile(data if isinstance(data, (bytes, bytearray, memoryview, str, os.PathLike))
                 else bytes(data), model=None if model is None else str(model)) as f:
        need = int(np.prod(f.shape, dtype=np.float64)) * f.dtype.itemsize
        if need > _memory_limit():
            raise TezipError(f"the stack needs {need / 2**30:.1f} GiB, more than this machine's "
                             "memory; decode it to a file with `tezip decompress` or read "
                             "frame ranges with tezip.open()")
        return f.read_all()


def open(path: str | os.PathLike,  # noqa: A001 - mirrors the file-like idiom
         model: str | os.PathLike | None = None) -> TezFile:
    """Open a .tez file for random access: ``tezip.open(p)[10:20]``."""
    return TezFile(path, model=None if model is None else str(model))
