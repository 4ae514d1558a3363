"""Multi-page TIFF stacks via tifffile: one page per frame."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from tezip.errors import InputError, TezipError, UnsupportedError
from tezip.io._base import (
    Stack,
    StackWriter,
    display_name,
    make_metadata,
    reason,
    shape_text,
    single_image_error,
)

_BIGTIFF_BYTES = 2**32 - 2**25  # leave room for tags in a classic TIFF


def page_layout(page: Any) -> tuple[tuple[int, ...], np.dtype | None, bool]:
    """(frame shape as (H, W) or (H, W, C), dtype, planar) of one TIFF page."""
    shape = tuple(page.shape)
    planar = len(shape) == 3 and page.samplesperpixel > 1 and page.planarconfig == 2
    if planar:
        shape = (*shape[1:], shape[0])
    return shape, page.dtype, planar


def page_array(page: Any) -> np.ndarray:
    planar = page_layout(page)[2]
    arr = page.asarray()
    return np.moveaxis(arr, 0, -1) if planar else arr


def write_options(shape: tuple[int, ...]) -> dict[str, str]:
    """photometric/planarconfig for frames of `shape` (the per-frame shape)."""
    if len(shape) == 2:
        return {"photometric": "minisblack"}
    color = "rgb" if shape[-1] in (3, 4) else "minisblack"
    return {"photometric": color, "planarconfig": "contig"}


def check_axes(tf: Any, name: str, frame_file: bool = False) -> None:
    """Refuse a TIFF whose array (as tifffile reads it: ImageJ hyperstacks, tifffile's
    shaped files) is not a stack tezip handles: one axis of frames, then Y, X and
    optionally samples (channels). A frame file of a folder has no axis of frames."""
    series = tf.series[0] if tf.series else None
    if series is None:
        return
    shape, axes = tuple(series.shape), str(series.axes)
    others = [a for a in axes if a not in "YXS"]
    if len(others) > (0 if frame_file else 1) or axes.count("S") > 1:
        what = "a frame folder needs one 2-D image (H, W) or (H, W, C) per file" if frame_file \
            else "tezip needs one axis of frames: (T, H, W) or (T, H, W, C)"
        raise UnsupportedError(
            f"{name} holds a {len(shape)}-D array ({shape_text(shape)}, axes {axes}); {what}; "
            "save the other axes as separate files or reshape the array")
    meta = tf.shaped_metadata or ()
    if frame_file and axes == "SYX" and meta and tuple(meta[0].get("shape", ())) == shape:
        # tifffile stored a (N, H, W) array as N planes of one page: N frames, not colours
        raise UnsupportedError(
            f"{name} holds an array shaped {shape_text(shape)} (written as {shape[0]} planes "
            "of one page); a frame folder needs one 2-D image (H, W) or (H, W, C) per file; "
            "save one frame per file, or colour images channels-last")


class _Warnings(logging.Handler):
    """Collects what tifffile logs (it reports damage as log warnings and goes on), so
    that nothing reaches stderr and a damaged file is refused with what was found."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(" ".join(record.getMessage().split()))


@contextlib.contextmanager
def tifffile_warnings() -> Iterator[_Warnings]:
    log = logging.getLogger("tifffile")
    handler = _Warnings()
    log.addHandler(handler)
    propagate, log.propagate = log.propagate, False
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


def damaged(path: str, found: list[str]) -> InputError:
    return InputError(f"cannot read {display_name(path)} as TIFF: {found[0]}; the file is "
                      "damaged or truncated")


def _open(path: str) -> Any:
    import tifffile

    try:
        return tifffile.TiffFile(path)
    except (OSError, ValueError) as exc:  # TiffFileError is a ValueError
        raise InputError(f"cannot read {display_name(path)} as TIFF: {reason(exc)}") from exc


class TiffStack(Stack):
    def __init__(self, path: str) -> None:
        self._path = path
        with tifffile_warnings() as found:
            self._file = _open(path)
            self._memmap: np.ndarray | None = None
            try:
                self._init(path)
            except BaseException as exc:
                self._file.close()
                if found.messages and isinstance(exc, TezipError):
                    raise damaged(path, found.messages) from exc   # the damage explains it
                raise
            if found.messages:
                self._file.close()
                raise damaged(path, found.messages)

    def _init(self, path: str) -> None:
        pages = self._file.pages
        count = len(pages)
        if count == 0:
            raise InputError(f"empty stack: {display_name(path)} holds no TIFF pages")
        frame, dtype, planar = page_layout(pages.first)
        check_axes(self._file, display_name(path))
        if count == 1 and not self._shaped_as_stack(len(frame)):
            raise single_image_error(display_name(path), frame)
        self._setup((count, *frame), dtype, make_metadata(path, "tiff"))
        if not planar:
            self._memmap = self._try_memmap()

    def _shaped_as_stack(self, frame_rank: int) -> bool:
        """True if tifffile's own description says this one page is a stack of one."""
        meta = self._file.shaped_metadata or ()
        return bool(meta) and len(meta[0].get("shape", ())) > frame_rank

    def _try_memmap(self) -> np.ndarray | None:
        import tifffile

        try:
            arr = tifffile.memmap(self._path, mode="r")
        except (OSError, ValueError):
            return None  # compressed or scattered pages
        if arr.size != np.prod(self.shape):
            return None
        return arr.reshape(self.shape)

    def _read(self, t0: int, t1: int) -> np.ndarray:
        if self._memmap is not None:
            return np.array(self._memmap[t0:t1], dtype=self.dtype)
        with tifffile_warnings() as found:
            arr = self._read_pages(t0, t1)
        if found.messages:
            raise damaged(self._path, found.messages)
        return arr

    def _read_pages(self, t0: int, t1: int) -> np.ndarray:
        try:
            if page_layout(self._file.pages.first)[2]:
                arr = np.stack([page_array(self._file.pages[t]) for t in range(t0, t1)])
            else:
                arr = self._file.asarray(key=range(t0, t1))
        except (OSError, ValueError, RuntimeError, IndexError, KeyError) as exc:
            raise InputError(
                f"cannot read frames {t0}..{t1 - 1} of {self.metadata['source']}: {reason(exc)}"
            ) from exc
        if arr.size == (t1 - t0) * int(np.prod(self.shape[1:])):
            arr = arr.reshape((t1 - t0, *self.shape[1:]))
        return arr

    def close(self) -> None:
        self._memmap = None
        self._file.close()


class TiffWriter(StackWriter):
    _tw: Any = None

    def expected_bytes(self) -> tuple[int, int]:
        n = int(np.prod(self.shape)) * self.dtype.itemsize + 512 * self.shape[0]
        return n, n

    def _create(self) -> None:
        import tifffile

        big = int(np.prod(self.shape)) * self.dtype.itemsize > _BIGTIFF_BYTES
        self._tw = tifffile.TiffWriter(self.temp, bigtiff=big)
        self._options = write_options(self.shape[1:])

    def _write(self, t0: int, frames: np.ndarray) -> None:
        assert self._tw is not None
        if self.shape[0] == 1:  # keep the leading 1 in tifffile's shape description
            self._tw.write(frames, contiguous=True, **self._options)
            return
        for frame in frames:
            self._tw.write(frame, contiguous=True, **self._options)

    def _close(self) -> None:
        tw, self._tw = self._tw, None
        if tw is not None:
            tw.close()
