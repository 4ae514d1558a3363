"""NumPy .npy stacks, read through a memory map."""

from __future__ import annotations

import io
import math
import os
from typing import BinaryIO

import numpy as np

from tezip.errors import InputError
from tezip.io._base import Stack, StackWriter, display_name, make_metadata, reason

_TEZ_MAGIC = b"\x89TEZ"


def _check_header(path: str, name: str) -> None:
    """Read the .npy header and check it against the file, so that a damaged or foreign
    file gets a message instead of numpy's (or a crash in the memory map)."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            head = f.read(6)
            if head.startswith(_TEZ_MAGIC):
                raise InputError(f"{name} is a .tez file, not a .npy file; decompress it with "
                                 "'tezip decompress' (or rename it to .tez)")
            if head.startswith(b"PK\x03\x04"):
                raise InputError(f"{name} is an .npz archive; save the stack alone with "
                                 "numpy.save")
            if head != b"\x93NUMPY":
                raise InputError(f"cannot read {name} as a .npy file: it has no NumPy "
                                 "header; give --format if it is another format")
            f.seek(0)
            version = fmt.read_magic(f)
            read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
            if version not in read:
                raise InputError(f"{name}: .npy format version {version} is not supported")
            shape, fortran, dtype = read[version](f, max_header_size=1 << 16)
            start = f.tell()
            size = os.fstat(f.fileno()).st_size
    except InputError:
        raise
    except (OSError, ValueError, EOFError, SyntaxError, TypeError) as exc:
        raise InputError(f"cannot read {name} as a .npy file: {reason(exc)}") from exc
    if dtype.hasobject:
        raise InputError(f"{name} holds Python objects (pickled data), which tezip never "
                         "loads; save a numeric array")
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise InputError(f"{name}: the header declares shape {shape}; the file is damaged")
    need = math.prod(shape) * dtype.itemsize
    if size - start < need:
        raise InputError(f"{name} is truncated: its header declares {shape} {dtype} "
                         f"({need} bytes of data) but the file holds {size - start}")


class NpyStack(Stack):
    def __init__(self, path: str) -> None:
        name = display_name(path)
        _check_header(path, name)
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError, OverflowError) as exc:
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
    """Writes the .npy header, then the frames in order with plain writes: a full disk or
    a file size limit surfaces as an OSError (OutputError), never as a SIGBUS from a
    memory-mapped page that cannot be backed."""

    _f: BinaryIO | None = None

    def expected_bytes(self) -> tuple[int, int]:
        n = len(self._header()) + math.prod(self.shape) * self.dtype.itemsize
        return n, n

    def _header(self) -> bytes:
        buf = io.BytesIO()
        fmt = np.lib.format
        d = {"descr": fmt.dtype_to_descr(self.dtype), "fortran_order": False,
             "shape": self.shape}
        try:
            fmt.write_array_header_1_0(buf, d)
        except ValueError:                       # header too long for version 1.0
            buf = io.BytesIO()
            fmt.write_array_header_2_0(buf, d)
        return buf.getvalue()

    def _create(self) -> None:
        self._f = open(self.temp, "xb")  # noqa: SIM115 - closed in _close
        self._f.write(self._header())

    def _write(self, t0: int, frames: np.ndarray) -> None:
        assert self._f is not None
        self._f.write(memoryview(frames.astype(self.dtype, copy=False)).cast("B"))

    def _close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            f.close()
