"""A directory of image files, one frame per file (PNG via Pillow, TIFF via tifffile)."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from tezip.errors import InputError, TezipError, UnsupportedError
from tezip.io._base import (
    FRAME_EXTENSIONS,
    Stack,
    StackWriter,
    display_name,
    dtype_name,
    make_metadata,
    native,
    reason,
    shape_text,
)
from tezip.io.tiff import (
    check_axes,
    page_array,
    page_layout,
    tifffile_warnings,
    write_options,
)

# Pillow pixel mode -> (dtype, channels; 0 for a gray 2-D frame)
_PIL_MODES = {
    "1": ("bool", 0),
    "L": ("uint8", 0),
    "LA": ("uint8", 2),
    "RGB": ("uint8", 3),
    "RGBA": ("uint8", 4),
    "I;16": ("uint16", 0),
    "I;16L": ("uint16", 0),
    "I;16B": ("uint16", 0),
    "I": ("int32", 0),
    "F": ("float32", 0),
}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

FrameInfo = tuple[tuple[int, ...], str]  # (frame shape, native dtype name)


def natural_key(name: str) -> tuple[list[int | str], str]:
    """Sort key that orders frame_2 before frame_10."""
    parts = re.split(r"(\d+)", name.lower())
    return [int(p) if i % 2 else p for i, p in enumerate(parts)], name


def _is_png(path: str) -> bool:
    return path.lower().endswith(".png")


def _pil_mode(path: str, im: Any) -> str:
    """The mode to decode `im` in; raises for modes that would lose data."""
    mode = im.mode
    if mode == "P":
        return "RGBA" if "transparency" in im.info else "RGB"
    if mode not in _PIL_MODES:
        raise UnsupportedError(
            f"{display_name(path)} has pixel mode {mode}, which tezip cannot read"
        )
    if mode in ("LA", "RGB", "RGBA") and im.format == "PNG":
        with open(path, "rb") as f:
            head = f.read(26)
        if head.startswith(_PNG_SIGNATURE) and head[24] == 16:
            raise UnsupportedError(
                f"{display_name(path)} is a 16-bit colour PNG, which Pillow reads as 8-bit; "
                "convert the frames to TIFF"
            )
    return mode


def _guard(path: str, action: Any) -> Any:
    """Run action(), turning library errors (and tifffile's warnings) about a bad file
    into InputError."""
    try:
        with tifffile_warnings() as found:
            out = action()
    except TezipError:
        raise
    except Exception as exc:  # Pillow and tifffile raise many kinds
        raise InputError(f"cannot read frame file {display_name(path)}: {reason(exc)}") from exc
    if found.messages:
        raise InputError(f"cannot read frame file {display_name(path)}: {found.messages[0]}; "
                         "the file is damaged or truncated")
    return out


def frame_info(path: str) -> FrameInfo:
    """Shape and dtype of one frame file, from its header only."""
    return _guard(path, lambda: _png_info(path) if _is_png(path) else _tiff_info(path))


def _png_info(path: str) -> FrameInfo:
    from PIL import Image

    with Image.open(path) as im:
        dtype, channels = _PIL_MODES[_pil_mode(path, im)]
        width, height = im.size
    return ((height, width, channels) if channels else (height, width)), dtype


def _tiff_info(path: str) -> FrameInfo:
    import tifffile

    with tifffile.TiffFile(path) as tf:
        if len(tf.pages) != 1:
            raise InputError(
                f"{display_name(path)} holds {len(tf.pages)} pages; a frame folder needs one "
                "image per file (open a multi-page TIFF directly instead)"
            )
        check_axes(tf, display_name(path), frame_file=True)
        shape, dtype, _ = page_layout(tf.pages.first)
    return shape, dtype_name(dtype)


def load_frame(path: str) -> np.ndarray:
    return _guard(path, lambda: _load_png(path) if _is_png(path) else _load_tiff(path))


def _load_png(path: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        mode = _pil_mode(path, im)
        return np.asarray(im if im.mode == mode else im.convert(mode))


def _load_tiff(path: str) -> np.ndarray:
    import tifffile

    with tifffile.TiffFile(path) as tf:
        return page_array(tf.pages.first)


class FolderStack(Stack):
    def __init__(self, path: str) -> None:
        name = display_name(path)
        try:
            names = [e.name for e in os.scandir(path) if e.is_file()]
        except OSError as exc:
            raise InputError(f"cannot list folder {name}: {reason(exc)}") from exc
        names = sorted(
            (n for n in names if not n.startswith(".") and n.lower().endswith(FRAME_EXTENSIONS)),
            key=natural_key,
        )
        if not names:
            raise InputError(f"empty stack: folder {name} holds no .png, .tif or .tiff files")
        self._files = [os.path.join(path, n) for n in names]
        first = frame_info(self._files[0])
        for file in self._files[1:]:
            info = frame_info(file)
            if info != first:
                raise InputError(
                    f"{display_name(file)} is {shape_text(info[0])} {info[1]} but "
                    f"{names[0]} is {shape_text(first[0])} {first[1]}; "
                    "all frames in a folder must have the same shape and dtype"
                )
        self._setup((len(names), *first[0]), first[1], make_metadata(path, "folder"))

    @property
    def files(self) -> list[str]:
        """The frame files in stack order."""
        return list(self._files)

    def _read(self, t0: int, t1: int) -> np.ndarray:
        out = np.empty((t1 - t0, *self.shape[1:]), self.dtype)
        for i, file in enumerate(self._files[t0:t1]):
            frame = load_frame(file)
            if frame.shape != out.shape[1:] or native(frame.dtype) != self.dtype:
                raise InputError(f"{display_name(file)} changed while tezip was reading it")
            out[i] = frame
        return out


def _png_ok(dtype: np.dtype, frame: tuple[int, ...]) -> bool:
    """True if PNG holds frames of this dtype and shape exactly."""
    if dtype == np.uint8:
        return len(frame) == 2 or frame[2] in (2, 3, 4)
    return dtype == np.uint16 and len(frame) == 2


class FolderWriter(StackWriter):
    is_dir = True

    def expected_bytes(self) -> tuple[int, int] | None:
        if _png_ok(self.dtype, self.shape[1:]):
            return None                               # PNG frames are compressed
        frame = int(np.prod(self.shape[1:])) * self.dtype.itemsize + 512
        return frame * self.shape[0], frame

    def _create(self) -> None:
        os.mkdir(self.temp)
        self._png = _png_ok(self.dtype, self.shape[1:])
        self._digits = max(6, len(str(self.shape[0] - 1)))

    def _write(self, t0: int, frames: np.ndarray) -> None:
        for t, frame in enumerate(frames, start=t0):
            stem = os.path.join(self.temp, f"frame_{t:0{self._digits}d}")
            if self._png:
                from PIL import Image

                Image.fromarray(frame).save(stem + ".png", format="PNG")
            else:
                import tifffile

                tifffile.imwrite(stem + ".tif", frame, **write_options(frame.shape))
