"""Opening one shard for decoding, by its file suffix: ``.tez`` (TezFile), and two
baselines behind the same interface (``shape``, ``dtype``, ``window_frames()``,
``decode_window(i)``, ``close()``) so that the same loaders read them: raw ``.npy``
(memory-mapped) and lossless blosc2 ``.b2nd`` (what a careful user would do without
tezip; chunks of whole frames along time). No torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..codec import TezFile
from ..errors import CorruptFileError, InputError, OptionError
from ..windows import coded_windows, fixed_windows, window_length


class NpyShard:
    """A raw ``.npy`` shard; windows are ``window`` frames (the data set's)."""

    def __init__(self, path: Path, window: int | None) -> None:
        try:
            self._a: Any = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except (OSError, ValueError) as exc:
            raise CorruptFileError(f"{path}: not a readable .npy file ({exc})") from None
        self.shape = tuple(self._a.shape)
        self.dtype = self._a.dtype.newbyteorder("=")
        self._windows = (fixed_windows(self.shape[0],
                                       _raw_window(window, math.prod(self.shape[1:])))
                         if self.shape else [])

    def window_frames(self) -> list[tuple[int, int]]:
        return self._windows

    def decode_window(self, i: int) -> np.ndarray:
        return self.read(*self._windows[i])

    def read(self, t0: int, t1: int) -> np.ndarray:
        return np.array(self._a[t0:t1], dtype=self.dtype)

    def close(self) -> None:
        self._a = None


class Blosc2Shard:
    """A lossless blosc2 NDArray (``.b2nd``); a window is one chunk along time.
    ``threads``: blosc2's decompression threads in this process."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        try:
            import blosc2
        except ImportError:
            raise OptionError(f"{path}: reading .b2nd shards needs blosc2 "
                              "(pip install blosc2)") from None
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        blosc2.set_nthreads(threads)
        try:
            self._a: Any = blosc2.open(str(path), mode="r")
        except Exception as exc:   # blosc2 raises assorted errors on damaged files
            raise CorruptFileError(f"{path}: not a readable blosc2 array ({exc})") from None
        self.shape = tuple(int(s) for s in self._a.shape)
        self.dtype = np.dtype(self._a.dtype).newbyteorder("=")
        self._windows = fixed_windows(self.shape[0], int(self._a.chunks[0]))

    def window_frames(self) -> list[tuple[int, int]]:
        return self._windows

    def decode_window(self, i: int) -> np.ndarray:
        return self.read(*self._windows[i])

    def read(self, t0: int, t1: int) -> np.ndarray:
        try:
            return np.asarray(self._a[t0:t1], dtype=self.dtype)
        except Exception as exc:
            raise CorruptFileError(f"blosc2 cannot decode frames {t0}-{t1 - 1} ({exc})") \
                from None

    def close(self) -> None:
        self._a = None


def open_shard(path: Path, window: int | None, model: str | None = None,
               threads: int = 1) -> Any:
    """The reader for ``path``: ``.npy``, ``.b2nd``, else a ``.tez`` file (``window``:
    the data set's, None: automatic)."""
    if path.suffix == ".npy":
        return NpyShard(path, window)
    if path.suffix == ".b2nd":
        return Blosc2Shard(path, threads)
    return TezFile(path, model=model)


def window_starts(file: str, frames: int, frame_shape: tuple[int, ...],
                  window: int | None) -> list[int]:
    """The first frame of each window of a shard's file (``window``: the data set's
    ``--window``, None: automatic), as its reader decodes them: the windows a ``.tez``
    shard was coded in (``windows.window_length``: lengthened for small frames where
    automatic, shortened for large ones; a short tail joined: ``windows.coded_windows``),
    fixed windows for the raw ``.npy`` and ``.b2nd`` baselines (chunks of ``window``
    frames, as ``write_blosc2`` writes them; automatic: as long as a .tez shard's)."""
    fv = math.prod(frame_shape)
    if file.endswith((".npy", ".b2nd")):
        return [a for a, _ in fixed_windows(frames, _raw_window(window, fv))]
    return [a for a, _ in coded_windows(frames, window_length(window, fv), fv)]


def _raw_window(window: int | None, frame_values: int) -> int:
    """A raw baseline shard's window: the one asked for, or the automatic length."""
    return window if window is not None else window_length(None, frame_values)


def write_blosc2(path: Path, array: np.ndarray, window: int, clevel: int = 5,
                 filters: str = "shuffle") -> None:
    """A ``.b2nd`` shard of ``array`` with chunks of ``window`` frames, zstd + byte or
    bit shuffle (for benchmarks and tests)."""
    import blosc2

    filt = {"shuffle": blosc2.Filter.SHUFFLE, "bitshuffle": blosc2.Filter.BITSHUFFLE}[filters]
    blosc2.asarray(np.ascontiguousarray(array), urlpath=str(path), mode="w",
                   chunks=(min(window, array.shape[0]), *array.shape[1:]),
                   cparams=blosc2.CParams(codec=blosc2.Codec.ZSTD, clevel=clevel,
                                          filters=[filt], nthreads=1))
