"""Reading and writing stacks of frames: .npy, HDF5, multi-page TIFF and image folders.

    with open_input("run.h5", dataset="/entry/data/data") as stack:
        frames = stack.read(0, 10)          # (10, H, W) native-endian array

    with open_output("out.npy", stack.shape, stack.dtype, metadata=stack.metadata) as out:
        out.write(0, frames)                # renamed into place when the block ends cleanly

h5py, tifffile and Pillow are imported only when a file of their kind is opened.
"""

from __future__ import annotations

import os
from typing import Any

from tezip.atomic import AtomicOutput, atomic_output
from tezip.errors import InputError, OptionError
from tezip.io._base import (
    FORMATS,
    SUPPORTED_DTYPES,
    OutputError,
    Stack,
    StackWriter,
    check_layout,
    check_output_path,
    display_name,
    native,
)

__all__ = [
    "AtomicOutput",
    "FORMATS",
    "SUPPORTED_DTYPES",
    "OutputError",
    "Stack",
    "StackWriter",
    "atomic_output",
    "detect_format",
    "open_input",
    "open_output",
    "output_format",
    "sniff_format",
]

_EXTENSIONS = {
    ".npy": "npy",
    ".h5": "hdf5",
    ".hdf5": "hdf5",
    ".nxs": "hdf5",
    ".hdf": "hdf5",
    ".tif": "tiff",
    ".tiff": "tiff",
}
_ALIASES = {"h5": "hdf5", "hdf": "hdf5", "nxs": "hdf5", "tif": "tiff", "dir": "folder"}
_MAGIC = {
    b"\x93NUMPY": "npy",
    b"\x89HDF\r\n\x1a\n": "hdf5",
    b"II*\x00": "tiff",
    b"MM\x00*": "tiff",
    b"II+\x00": "tiff",
    b"MM\x00+": "tiff",
}


def detect_format(path: str | os.PathLike[str], format: str | None = None) -> str:
    """ "npy", "hdf5", "tiff" or "folder": `format` if given, else from the path.

    An existing directory, or a path without extension that does not exist yet, is a
    folder; an existing file with an unknown extension is recognised by its first bytes.
    """
    path = os.fspath(path)
    if format is not None:
        fmt = _ALIASES.get(format.lower(), format.lower())
        if fmt not in FORMATS:
            raise InputError(f"unknown format '{format}'; choose one of {', '.join(FORMATS)}")
        return fmt
    if os.path.isdir(path):
        return "folder"
    ext = os.path.splitext(path)[1].lower()
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    if os.path.isfile(path):
        fmt = sniff_format(path)
        if fmt:
            return fmt
    elif not ext:
        return "folder"
    raise InputError(
        f"cannot tell the format of {display_name(path)}; give --format "
        f"({', '.join(FORMATS)}) or use an extension: {', '.join(_EXTENSIONS)}"
    )


def sniff_format(path: str | os.PathLike[str]) -> str | None:
    """The format a file's first bytes announce (npy, hdf5, tiff), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    return next((fmt for magic, fmt in _MAGIC.items() if head.startswith(magic)), None)


def open_input(
    path: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    format: str | None = None,
    keep_file: bool = False,
) -> Stack:
    """Open a stack of frames for reading. Raises InputError or UnsupportedError with a
    message for the user when the file is missing, unreadable or not a stack tezip handles.
    ``keep_file``: an HDF5 input's metadata also records the rest of the file (groups,
    other datasets, attributes, links) so that an HDF5 output restores an equivalent file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"no such file or directory: {path}")
    fmt = detect_format(path, format)
    if dataset is not None and fmt != "hdf5":
        raise OptionError(f"--dataset applies to HDF5 files only, and {path} is {fmt}")
    if fmt == "npy":
        from tezip.io.npy import NpyStack

        return NpyStack(path)
    if fmt == "hdf5":
        from tezip.io.hdf5 import Hdf5Stack

        return Hdf5Stack(path, dataset, keep_file=keep_file)
    if fmt == "tiff":
        from tezip.io.tiff import TiffStack

        return TiffStack(path)
    if not os.path.isdir(path):
        raise InputError(f"{path} is not a directory, so it cannot be read as a frame folder")
    from tezip.io.folder import FolderStack

    return FolderStack(path)


def output_format(path: str | os.PathLike[str], format: str | None = None) -> str:
    """The format an output at ``path`` is written in: what its name says (.npy, .h5 /
    .hdf5 / .nxs / .hdf, .tif / .tiff; a name without extension is a folder of frames),
    or ``format``, which must agree with a name that says otherwise. Whether the path
    exists does not matter: a directory named ``d.h5`` is not a folder output."""
    path = os.fspath(path)
    if path in ("-", ""):
        raise OutputError("tezip writes its output to a file, not to standard output; "
                          "give an output file name")
    name = os.path.basename(os.path.normpath(path))
    ext = os.path.splitext(name)[1].lower()
    by_name = _EXTENSIONS.get(ext)
    if format is not None:
        fmt = _ALIASES.get(format.lower(), format.lower())
        if fmt not in FORMATS:
            raise InputError(f"unknown format '{format}'; choose one of {', '.join(FORMATS)}")
        if by_name is not None and by_name != fmt:
            raise OptionError(f"{path} is named as a {by_name} file but --format is {fmt}; "
                              "rename the output or drop --format")
        return fmt
    if by_name is not None:
        return by_name
    if not ext:
        return "folder"
    raise InputError(
        f"cannot tell the format of {display_name(path)}; give --format "
        f"({', '.join(FORMATS)}) or use an extension: {', '.join(_EXTENSIONS)}"
    )


def open_output(
    path: str | os.PathLike[str],
    shape: tuple[int, ...],
    dtype: Any,
    *,
    metadata: dict[str, Any] | None = None,
    format: str | None = None,
    dataset: str | None = None,
    force: bool = False,
) -> StackWriter:
    """Start writing a stack of `shape` and `dtype` to `path`, in the format its name says
    (see ``output_format``).

    Refuses an existing path unless `force`, and anything that is not a regular file (a
    folder output: a directory of frames) even with `force` (``tezip.atomic``). HDF5
    output uses `metadata`'s "dataset" (unless `dataset` is given, default "/data") and
    "attrs".
    """
    path = os.fspath(path)
    fmt = output_format(path, format)
    shape = tuple(int(n) for n in shape)
    dtype = native(dtype)
    check_layout(shape, dtype, f"output {display_name(path)}")
    if dataset is not None and fmt != "hdf5":
        raise OptionError(f"--dataset applies to HDF5 files only, and {path} is {fmt}")
    check_output_path(path, fmt == "folder", force)
    args = (path, shape, dtype, dict(metadata or {}), force)
    if fmt == "npy":
        from tezip.io.npy import NpyWriter

        return NpyWriter(*args)
    if fmt == "hdf5":
        from tezip.io.hdf5 import Hdf5Writer

        return Hdf5Writer(*args, dataset=dataset)
    if fmt == "tiff":
        from tezip.io.tiff import TiffWriter

        return TiffWriter(*args)
    from tezip.io.folder import FolderWriter

    return FolderWriter(*args)
