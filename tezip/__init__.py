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

from .codec import ArrayStack, Options, TezFile, __version__, compress_stack
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
from .quantize import MODES, SUPPORTED_DTYPES, ErrorBound

__all__ = [
    "compress", "decompress", "open", "make_bound", "TezFile", "ErrorBound", "Options", "MODES",
    "TezipError", "InputError", "UnsupportedError", "OptionError", "CorruptFileError",
    "FormatVersionError", "OutputExistsError", "OutputError", "DecodeMismatchError",
    "__version__",
]


def _number(value: object, name: str) -> float | None:
    """A bound given as any real number (Python, numpy scalar, 0-d array) -> float."""
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise OptionError(f"{name} must be a real number, got {value!r} "
                          f"({type(value).__name__})")
    return float(value)


def make_bound(mode: str, bound: float | None = None, rel_bound: float | None = None) -> ErrorBound:
    """Build an ErrorBound from a mode and its value(s). ``absrel`` takes ``bound`` (absolute)
    and ``rel_bound`` (fraction of the value range); every other mode takes ``bound`` only.
    Bounds may be Python or numpy numbers (or 0-d arrays)."""
    if not isinstance(mode, str):
        raise OptionError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    bound, rel_bound = _number(bound, "bound"), _number(rel_bound, "rel_bound")
    if rel_bound is not None and mode != "absrel":
        raise OptionError("rel_bound is only for mode 'absrel'"
                          + (f"; for mode '{mode}' give the bound as bound=" if mode == "rel"
                             else ""))
    if mode == "abs":
        return ErrorBound("abs", abs=bound)
    if mode == "rel":
        return ErrorBound("rel", rel=bound)
    if mode == "absrel":
        return ErrorBound("absrel", abs=bound, rel=rel_bound)
    if mode == "pwrel":
        return ErrorBound("pwrel", pw=bound)
    if mode == "lossless":
        if bound not in (None, 0):
            raise OptionError("mode 'lossless' takes no bound")
        return ErrorBound("lossless")
    return ErrorBound(mode)  # raises OptionError for an unknown mode


def _as_array(array: object) -> np.ndarray:
    """What compress() accepts: anything numpy turns into a regular numeric array, and
    torch tensors (detached, on the CPU); everything else is an InputError."""
    if type(array).__module__.startswith("torch") and hasattr(array, "detach"):
        dtype = str(getattr(array, "dtype", ""))
        if dtype.replace("torch.", "") not in SUPPORTED_DTYPES:
            raise UnsupportedError(f"tensors of {dtype} are not supported; convert it, e.g. with "
                                   f".to(torch.float32) (supported: "
                                   f"{', '.join(SUPPORTED_DTYPES)})")
        array = array.detach().cpu().numpy()   # type: ignore[attr-defined]
    if array is None:
        raise InputError("compress() needs an array of frames, got None")
    try:
        out = np.asarray(array)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise InputError(f"cannot make an array of frames from this "
                         f"{type(array).__name__}: {' '.join(str(exc).split())}") from None
    if out.dtype == object:
        raise UnsupportedError("the frames do not form a regular numeric array (ragged "
                               "lists or objects); give a (T, H, W) or (T, H, W, C) array")
    return out


def _json_metadata(value: object, where: str = "metadata") -> object:
    """Metadata as plain JSON types (numpy scalars and arrays converted); OptionError
    naming the first entry that has no JSON form."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise OptionError(f"{where} keys must be strings, got {k!r}")
            out[k] = _json_metadata(v, f"{where}['{k}']")
        return out
    if isinstance(value, (list, tuple)):
        return [_json_metadata(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.ndarray):
        return _json_metadata(value.tolist(), where)
    if isinstance(value, np.generic):
        return _json_metadata(value.item(), where)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise OptionError(f"{where} is a {type(value).__name__}, which a .tez header cannot "
                      "hold; metadata must be JSON (dicts with string keys, lists, strings, "
                      "numbers, booleans, None)")


def compress(array: np.ndarray, mode: str = "rel", bound: float | None = 1e-3, *,
             rel_bound: float | None = None, predictor: str = "auto",
             window: int | None = None, metadata: dict | None = None,
             model: str | os.PathLike | None = None, threshold: float | None = None,
             threads: int | None = None, adapt: bool = False, adapt_seconds: float = 30.0,
             min_decode_mbps: float | None = None) -> bytes:
    """Compress a (T, H, W) or (T, H, W, C) array into the bytes of a .tez file.
    ``bound``: the bound of ``mode`` (for ``absrel`` the absolute one, with ``rel_bound``
    the relative one); ``model``: learned model file (default: the shipped one);
    ``adapt``: fit the learned forecaster to ``array`` within ``adapt_seconds`` (needs
    PyTorch) and store it in the file; ``min_decode_mbps``: use the learned predictor only
    where it decodes at least this fast (MB/s per core); ``window``: frames per window
    (None: 33, more for small frames, ``tezip.windows.window_length``);
    ``threshold``: dynamic windows (see ``tezip.windows.dynamic_windows``); ``metadata``:
    a JSON-like dict stored in the header; ``threads``: windows coded in parallel
    (default: one thread per CPU)."""
    if mode == "lossless" and isinstance(bound, float) and bound == 1e-3:
        bound = None
    opts = Options(make_bound(mode, bound, rel_bound), predictor=predictor, window=window,
                   model=None if model is None else str(model), threshold=threshold,
                   threads=threads, adapt=bool(adapt), adapt_seconds=adapt_seconds,
                   min_decode_mbps=min_decode_mbps)
    if metadata is not None and not isinstance(metadata, dict):
        raise OptionError(f"metadata must be a dict, got {type(metadata).__name__}")
    meta = _json_metadata(metadata or {})
    buf = _io.BytesIO()
    compress_stack(ArrayStack(_as_array(array), meta), None, opts, fileobj=buf, lean=True)  # type: ignore[arg-type]
    return buf.getvalue()


def _memory_limit() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _source(data: object, what: str) -> bytes | str | os.PathLike:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, (str, os.PathLike)):
        return data
    if isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1:
        return data.tobytes()
    raise InputError(f"{what} takes the bytes of a .tez file or a path to one, not "
                     f"{type(data).__name__}")


def decompress(data: bytes | os.PathLike | str,
               model: str | os.PathLike | None = None, threads: int | None = None) -> np.ndarray:
    """Decode the bytes of a .tez file (or a path to one) into an array (windows decoded
    in ``threads`` threads; default one per CPU)."""
    with TezFile(_source(data, "decompress()"),  # type: ignore[arg-type]
                 model=None if model is None else str(model), threads=threads) as f:
        need = int(np.prod(f.shape, dtype=np.float64)) * f.dtype.itemsize
        if need > _memory_limit():
            raise TezipError(f"the stack needs {need / 2**30:.1f} GiB, more than this machine's "
                             "memory; decode it to a file with `tezip decompress` or read "
                             "frame ranges with tezip.open()")
        return f.read_all()


def open(path: str | os.PathLike,  # noqa: A001 - mirrors the file-like idiom
         model: str | os.PathLike | None = None) -> TezFile:
    """Open a .tez file for random access: ``tezip.open(p)[10:20]``."""
    return TezFile(_source(path, "open()"),  # type: ignore[arg-type]
                   model=None if model is None else str(model))
