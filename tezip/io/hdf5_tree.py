"""The rest of an HDF5 / NeXus file: every group, dataset, attribute and link except the
stack being compressed, so that decompressing a .tez to .h5 gives back an equivalent file.

``capture`` copies the file into a small in-memory HDF5 *skeleton*: other datasets are
copied whole (HDF5's object copy: data, attributes, chunking and filters), soft and
external links stay links, objects reachable under several names stay one object, and the
stack itself becomes a placeholder dataset with its real shape, dtype, chunking,
compression, fill value and attributes but no data (HDF5 allocates storage late, so the
placeholder costs a few hundred bytes). The skeleton travels zstd-compressed in the .tez
header; ``restore`` writes it to the output's temporary name and returns the placeholder,
into which the decoder writes the frames.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
from typing import Any

import zstandard

from tezip.entropy import unzstd_exact
from tezip.errors import CorruptFileError, InputError, OptionError, OutputError

KEY = "hdf5_file"                 # the metadata key the record lives under
STREAM_ATTR = "tezip_stream"      # marks a uint8 dataset holding a whole .tez stream
SKELETON_LIMIT = 8 << 20          # compressed bytes; the .tez header holds at most 16 MB
_KEPT_FILTERS = ("gzip", "lzf")   # always available to h5py for writing
MAX_SKELETON_BYTES = 1 << 30      # what a decoder accepts to unpack (the writer too)


def _copy_attrs(src: Any, dst: Any) -> list[str]:
    """Copy attributes with their HDF5 types; returns the names that could not be copied
    (object references, which point into the source file, and exotic types)."""
    skipped = []
    for name in src.attrs:
        try:
            aid = src.attrs.get_id(name)
            dst.attrs.create(name, src.attrs[name], dtype=aid.dtype)
        except (TypeError, ValueError, OSError, KeyError):
            skipped.append(f"{src.name}@{name}")
    return skipped


def _placeholder(ds: Any, dst: Any, path: str) -> None:
    kw: dict[str, Any] = {"shape": ds.shape, "dtype": ds.dtype, "chunks": ds.chunks}
    if ds.chunks is not None:
        kw["maxshape"] = ds.maxshape
        if ds.compression in _KEPT_FILTERS:
            kw["compression"] = ds.compression
            kw["compression_opts"] = ds.compression_opts
        kw["shuffle"] = bool(ds.shuffle)
        kw["fletcher32"] = bool(ds.fletcher32)
    if ds.fillvalue is not None:
        kw["fillvalue"] = ds.fillvalue
    dst.create_dataset(path, **kw)


class _Copier:
    def __init__(self, src: Any, dst: Any, target: Any) -> None:
        import h5py

        self.h5py = h5py
        self.dst = dst
        self.target = target
        self.aliases: list[str] = []        # every hard-link path of the stack
        self.seen: dict[Any, str] = {}      # object -> its first path in dst (hard links)
        self.skipped: list[str] = _copy_attrs(src, dst)
        self.seen[src.id] = "/"
        self.walk(src, dst)

    def walk(self, src: Any, dst: Any) -> None:
        h5py = self.h5py
        for name in src:
            path = f"{dst.name.rstrip('/')}/{name}"
            link = src.get(name, getlink=True)
            if isinstance(link, h5py.SoftLink):
                dst[name] = h5py.SoftLink(link.path)
                continue
            if isinstance(link, h5py.ExternalLink):
                dst[name] = h5py.ExternalLink(link.filename, link.path)
                continue
            obj = src[name]
            if isinstance(obj, h5py.Dataset) and obj == self.target:
                self.aliases.append(path)
                continue
            if obj.id in self.seen:                     # a second name of one object
                if self.seen[obj.id] in self.dst:
                    dst[name] = self.dst[self.seen[obj.id]]
                continue
            self.seen[obj.id] = path
            if isinstance(obj, h5py.Group):
                sub = dst.create_group(name)
                self.skipped += _copy_attrs(obj, sub)
                self.walk(obj, sub)
            else:                                       # datasets and named datatypes
                src.copy(obj, dst, name=name)


def capture(file: Any, ds: Any) -> dict[str, Any]:
    """The record of everything in ``file`` but the dataset ``ds`` (both open h5py objects).
    Raises OptionError if the rest of the file is too large to carry in a .tez header."""
    import h5py

    buf = io.BytesIO()
    with h5py.File(buf, "w") as dst:
        c = _Copier(file, dst, ds)
        aliases = c.aliases or [ds.name]
        _placeholder(ds, dst, aliases[0])
        c.skipped += _copy_attrs(ds, dst[aliases[0]])
        for extra in aliases[1:]:
            dst[extra] = dst[aliases[0]]
    raw = buf.getvalue()
    if len(raw) > MAX_SKELETON_BYTES:       # the reader refuses to unpack more
        raise OptionError(
            f"the rest of the HDF5 file (other datasets, groups, attributes) takes "
            f"{len(raw) / 1e6:.1f} MB, more than the {MAX_SKELETON_BYTES >> 20} MiB a .tez "
            "file carries; pass --data-only to store just the dataset and its attributes")
    packed = zstandard.ZstdCompressor(level=19).compress(raw)
    if len(packed) > SKELETON_LIMIT:
        raise OptionError(
            f"the rest of the HDF5 file (other datasets, groups, attributes) takes "
            f"{len(packed) / 1e6:.1f} MB compressed, more than the {SKELETON_LIMIT >> 20} MiB a "
            f".tez header carries; pass --data-only to store just the dataset and its attributes")
    filters = [] if ds.compression in (None, *_KEPT_FILTERS) else [str(ds.compression)]
    return {"path": aliases[0], "aliases": aliases[1:], "size": len(raw),
            "skeleton": base64.b64encode(packed).decode("ascii"),
            "skipped_attrs": c.skipped, "dropped_filters": filters}


def summary(record: Any) -> dict[str, Any]:
    """The record without its skeleton bytes, for ``tezip info``."""
    if not isinstance(record, dict):
        return {}
    return {k: v for k, v in record.items() if k != "skeleton"} | {
        "skeleton_bytes": len(record.get("skeleton", "")) * 3 // 4}


def restore(record: Any, temp: str, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """Write the skeleton to ``temp`` and open it; returns (file, placeholder dataset)."""
    import h5py

    try:
        packed = base64.b64decode(record["skeleton"], validate=True)
        size = int(record["size"])
        if not 0 < size <= MAX_SKELETON_BYTES:
            raise ValueError("bad skeleton size")
        raw = unzstd_exact(packed, size)
        path = str(record["path"])
    except (KeyError, TypeError, ValueError, OverflowError):
        raise CorruptFileError("the recorded HDF5 file structure is damaged") from None
    try:
        with open(temp, "xb") as f:
            f.write(raw)
        file = h5py.File(temp, "r+")
    except OSError as exc:
        raise OutputError(f"cannot write {temp}: {exc}") from exc
    ds = file.get(path)
    if not isinstance(ds, h5py.Dataset) or tuple(ds.shape) != tuple(shape):
        file.close()
        raise CorruptFileError("the recorded HDF5 file structure does not match the stack")
    return file, ds


# ---------------------------------------------------------------------------------------
# a .tez stream embedded in an HDF5 file in place of the stack


def embed(tez_path: str, out: str, record: dict | None, dataset: str, attrs: dict,
          shape: tuple[int, ...], dtype: str) -> None:
    """Write ``out``: the original file's structure (``record``, or a file holding just
    ``dataset`` when None) with the stack at ``dataset`` replaced by a contiguous uint8
    dataset holding the whole .tez stream at ``tez_path``. The stack's attributes stay on
    it (NeXus ``signal``, units, ...), so tools still browse the file; tezip reads the
    stream in place (``open_embedded``)."""
    import h5py
    import numpy as np

    from tezip.atomic import check_space, release, reserve

    size = os.path.getsize(tez_path)
    extra = size + (64 << 10)
    # HDF5 cannot recover from a failed write: check the space first, then reserve it
    check_space(out, extra + (int(record.get("size", 0)) if isinstance(record, dict) else 0))
    if record is not None:
        file, placeholder = restore(record, out, shape)
        path, aliases = str(record["path"]), [str(a) for a in record.get("aliases", [])]
    else:
        file, placeholder, path, aliases = h5py.File(out, "x"), None, dataset, []
    reserved = False
    try:
        reserved = reserve(out, extra)
        parent = path.rsplit("/", 1)[0] or "/"
        group = file.require_group(parent)
        tmp = f"{parent.rstrip('/')}/.tezip-{os.getpid()}"
        blob = group.create_dataset(tmp, shape=(size,), dtype=np.uint8)   # contiguous
        if placeholder is not None:
            _copy_attrs(placeholder, blob)
            for name in [path, *aliases]:
                del file[name]
        else:
            for key, value in attrs.items():
                with contextlib.suppress(TypeError, ValueError):
                    blob.attrs[key] = value
        file.move(tmp, path)
        blob = file[path]
        blob.attrs[STREAM_ATTR] = "tez"
        blob.attrs["tezip_shape"] = np.array(shape, np.int64)
        blob.attrs["tezip_dtype"] = dtype
        for name in aliases:
            file[name] = blob
        with open(tez_path, "rb") as f:
            for pos in range(0, size, _EMBED_PIECE):
                piece = f.read(_EMBED_PIECE)
                blob[pos:pos + len(piece)] = np.frombuffer(piece, np.uint8)
    finally:
        file.close()
        if reserved:
            release(out, extra)


_EMBED_PIECE = 64 << 20


class _Window(io.RawIOBase):
    """Read-only view of ``size`` bytes at ``offset`` of an open file."""

    def __init__(self, f: Any, offset: int, size: int, name: str) -> None:
        self._f, self._off, self._size, self._pos, self.name = f, offset, size, 0, name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        n = self._size - self._pos if n is None or n < 0 else min(n, self._size - self._pos)
        if n <= 0:
            return b""
        self._f.seek(self._off + self._pos)
        data = self._f.read(n)
        self._pos += len(data)
        return data

    def close(self) -> None:
        self._f.close()
        super().close()


def open_embedded(path: str) -> _Window:
    """The .tez stream that ``tezip compress`` embedded in an HDF5 file, as a read-only
    file object over its bytes (read in place: no copy, random access kept)."""
    import h5py

    found = []
    try:
        with h5py.File(path, "r") as f:
            def visit(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset) and STREAM_ATTR in obj.attrs:
                    found.append((obj.name, obj.id.get_offset(), obj.shape, obj.dtype,
                                  obj.chunks, obj.compression))
            f.visititems(visit)
    except OSError as exc:
        raise CorruptFileError(f"{path}: cannot read as HDF5 ({exc})") from None
    names = sorted({x[0] for x in found})
    if not found:
        raise InputError(f"{path} is an HDF5 file without a tezip stream in it; compress it "
                         "with 'tezip compress' (or give a .tez file)")
    if len(names) > 1:
        raise InputError(f"{path} holds several tezip streams ({', '.join(names)}); "
                         "tezip reads files with one")
    name, offset, shape, dtype, chunks, compression = found[0]
    if (offset is None or len(shape) != 1 or dtype != "uint8" or chunks is not None
            or compression is not None):
        raise CorruptFileError(f"{path}: the tezip stream at {name} is not stored as "
                               "contiguous bytes; the file is damaged or was rewritten")
    return _Window(open(path, "rb"), int(offset), int(shape[0]), f"{path}:{name}")  # noqa: SIM115
