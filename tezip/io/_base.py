"""Shared pieces of the readers and writers: validation, the Stack and StackWriter bases,
temporary names and the final rename."""

from __future__ import annotations

import contextlib
import operator
import os
from typing import Any, Self

import numpy as np

from tezip import atomic as _atomic
from tezip.errors import InputError, OutputError, UnsupportedError
from tezip.quantize import SUPPORTED_DTYPES  # noqa: E402

FORMATS = ("npy", "hdf5", "tiff", "folder")
FRAME_EXTENSIONS = (".png", ".tif", ".tiff")


def native(dtype: Any) -> np.dtype:
    """The same dtype in native byte order."""
    return np.dtype(dtype).newbyteorder("=")


def dtype_name(dtype: Any) -> str:
    """'uint16', 'float32', ... for numbers; numpy's spelling ('|S3', ...) for the rest."""
    if dtype is None:
        return "unknown"
    dt = native(dtype)
    return dt.name if dt.kind in "biufc" else str(dt)


def reason(exc: BaseException) -> str:
    """What a library exception says, on one line."""
    if isinstance(exc, KeyError) and exc.args:
        return " ".join(str(exc.args[0]).split()) or "KeyError"
    return _atomic.reason(exc)


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(n) for n in shape) if shape else "scalar"


def check_layout(shape: tuple[int, ...], dtype: np.dtype | None, source: str) -> None:
    """Raise if (shape, dtype) is not a stack of frames tezip can handle."""
    if len(shape) == 2:
        raise single_image_error(source, shape)
    if len(shape) not in (3, 4):
        raise UnsupportedError(
            f"{source} has {len(shape)} dimensions ({shape_text(shape)}); tezip needs a stack of "
            "frames shaped (T, H, W) or (T, H, W, C)"
        )
    name = dtype_name(dtype)
    if name not in SUPPORTED_DTYPES:
        raise UnsupportedError(
            f"{source} has dtype {name}, which tezip does not support; "
            f"supported dtypes: {', '.join(SUPPORTED_DTYPES)}"
        )
    if 0 in shape:
        raise InputError(f"empty stack: {source} has shape {shape_text(shape)}")


def single_image_error(source: str, shape: tuple[int, ...]) -> UnsupportedError:
    return UnsupportedError(
        f"{source} holds a single image ({shape_text(shape)}); tezip needs a stack of "
        "frames shaped (T, H, W) or (T, H, W, C)"
    )


def make_metadata(
    path: str, fmt: str, dataset: str | None = None, attrs: dict | None = None
) -> dict[str, Any]:
    return {"source": display_name(path), "format": fmt, "dataset": dataset, "attrs": attrs or {}}


def display_name(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


class Stack:
    """Lazy reader over a stack of frames shaped (T, H, W) or (T, H, W, C)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    metadata: dict[str, Any]
    notes: list[str] = []   # what the stack as read does not carry from the file (for the user)

    def _setup(
        self, shape: tuple[int, ...], dtype: Any, metadata: dict[str, Any], label: str = ""
    ) -> None:
        """Validate and record the layout; `label` names the data in messages."""
        check_layout(tuple(shape), dtype, label or metadata["source"])
        self.shape = tuple(int(n) for n in shape)
        self.dtype = native(dtype)
        self.metadata = metadata

    def read(self, t0: int, t1: int) -> np.ndarray:
        """Frames [t0, t1) as a C-contiguous array in native byte order."""
        t0, t1 = operator.index(t0), operator.index(t1)
        if not 0 <= t0 <= t1 <= self.shape[0]:
            raise IndexError(f"frames [{t0}, {t1}) are outside a stack of {self.shape[0]} frames")
        want = (t1 - t0, *self.shape[1:])
        if t0 == t1:
            return np.empty(want, self.dtype)
        out = self._read(t0, t1)
        if out.shape != want:
            raise InputError(
                f"{self.metadata['source']}: frames {t0}..{t1 - 1} have shape "
                f"{shape_text(out.shape)}, expected {shape_text(want)}; are all frames alike?"
            )
        return np.ascontiguousarray(out, dtype=self.dtype)

    def _read(self, t0: int, t1: int) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        """Release the file; safe to call twice."""

    def __len__(self) -> int:
        return self.shape[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.metadata['source']} {self.shape} {self.dtype}>"


def remove(path: str) -> None:
    """Delete a file or a directory tree if it exists."""
    _atomic.remove(path)


def frame_file(entry: os.DirEntry) -> bool:
    """True for a file a frame folder output may replace (PNG/TIFF frames)."""
    return entry.is_file() and entry.name.lower().endswith(FRAME_EXTENSIONS)


def check_output_path(path: str, is_dir: bool, force: bool) -> None:
    """Refuse an output tezip should not write (see ``tezip.atomic.check_target``)."""
    _atomic.check_target(path, force=force, directory=is_dir,
                         replaceable=frame_file if is_dir else None)


class StackWriter:
    """Streaming writer: frames go to a temporary name next to the output, and commit()
    renames it into place (``tezip.atomic.AtomicOutput``), so a failed run never leaves a
    partial output behind."""

    is_dir = False  # True for writers whose output is a directory

    def __init__(
        self, path: str, shape: tuple[int, ...], dtype: np.dtype, metadata: dict, force: bool
    ) -> None:
        self.path = path
        self.shape = shape
        self.dtype = dtype
        self.metadata = metadata
        self.force = force
        self.notes: list[str] = []     # what the output does not keep (told to the user)
        self._out = _atomic.AtomicOutput(path, force=force, directory=self.is_dir,
                                         replaceable=frame_file if self.is_dir else None)
        self.temp = self._out.temp
        self._next = 0
        self._state = "open"
        try:
            self._need()
            self._create()
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError):
                raise OutputError(f"cannot create {self.path}: {reason(exc)}") from exc
            raise

    def expected_bytes(self) -> tuple[int, int] | None:
        """(total bytes, bytes of the largest file) the output will take about, if the
        format stores the frames uncompressed; None if unknown. Checked against the free
        space and ``ulimit -f`` before writing."""
        return None

    def _need(self) -> None:
        size = self.expected_bytes()
        if size is not None:
            self._out.need(*size)

    def _create(self) -> None:
        raise NotImplementedError

    def _write(self, t0: int, frames: np.ndarray) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        """Flush and release handles; must tolerate a half-built writer and being called
        again after it failed (release the handle before closing it)."""

    def write(self, t0: int, frames: np.ndarray) -> None:
        """Write frames [t0, t0 + len(frames)); calls must follow each other without gaps."""
        if self._state != "open":
            raise ValueError(f"writer for {self.path} is already {self._state}")
        frames = np.asarray(frames)
        if t0 != self._next:
            raise ValueError(f"expected frames from {self._next}, got {t0}")
        if frames.shape[1:] != self.shape[1:] or t0 + len(frames) > self.shape[0]:
            raise ValueError(
                f"frames shaped {frames.shape} at {t0} do not fit a stack shaped {self.shape}"
            )
        if frames.dtype != self.dtype:
            if not np.can_cast(frames.dtype, self.dtype, "safe"):
                raise ValueError(f"cannot store {frames.dtype} frames in a {self.dtype} stack")
            frames = frames.astype(self.dtype)
        if len(frames) == 0:
            return
        try:
            self._write(t0, np.ascontiguousarray(frames))
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write {self.path}: {reason(exc)}") from exc
        self._next = t0 + len(frames)

    def commit(self) -> None:
        """Flush, close and move the finished output to its final name."""
        if self._state != "open":
            raise ValueError(f"writer for {self.path} is already {self._state}")
        if self._next != self.shape[0]:
            self.abort()
            raise ValueError(
                f"only {self._next} of {self.shape[0]} frames were written; {self.path} discarded"
            )
        try:
            self._close()
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError):
                raise OutputError(f"cannot write {self.path}: {reason(exc)}") from exc
            raise
        self._out.commit()      # removes the temporary output itself if it fails
        self._state = "committed"

    def abort(self) -> None:
        """Close and delete the temporary output; safe to call more than once."""
        if self._state == "committed":
            return
        with contextlib.suppress(Exception):  # cleaning up after a failure; the file goes anyway
            self._close()
        self._out.abort()
        self._state = "aborted"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
