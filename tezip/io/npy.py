"""NumPy .npy stacks, read through a memory map."""

from __future__ import annotations

import numpy as np

from tezip.errors import InputError
from tezip.io._base import Stack, StackWriter, display_name, make_metadata, reason


class NpyStack(Stack):
    def __init__(self, path: str) -> None:
        name = display_name(path)
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise InputError(f"cannot read {name} as a .npy file: {reason(exc)}") from exc
        if not isinstance(arr, np.ndarray):  # an .npz archive
            arr.close()
            raise InputError(f"{name} is an .npz archive; save the stack alone with numpy.save")
        self._arr: np.ndarray | None = arr
        self._setup(arr.shape, arr.dtype, make_metadata(path, "npy"))

    def _read(self, t0: int, t1: int) -> np.ndarray:
        assert self._arr is not None, "stack is closed"
        return np.array(self._arr[t0:t1], dtype=self.dtype, order="C")

    def close(self) -> None:
        self._arr = None  # the memory map closes when its last reference goes


class NpyWriter(StackWriter):
    _mm: np.memmap | None = None

    def _create(self) -> None:
        self._mm = np.lib.format.open_memmap(
            self.temp, mode="w+", dtype=self.dtype, shape=self.shape
        )

    def _write(self, t0: int, frames: np.ndarray) -> None:
        assert self._mm is not None
        self._mm[t0 : t0 + len(frames)] = frames

    def _close(self) -> None:
        if self._mm is not None:
            self._mm.flush()
            self._mm = None
