"""HDF5 (and NeXus) stacks via h5py, read one slab of frames at a time."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from tezip.errors import InputError, OptionError
from tezip.io._base import (
    Stack,
    StackWriter,
    display_name,
    dtype_name,
    make_metadata,
    reason,
    shape_text,
)

DEFAULT_DATASET = "/data"
_MAX_LISTED = 20


def json_safe(value: Any) -> Any:
    """An attribute value as plain JSON types; TypeError if it has no sensible form."""
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        return json_safe(value.item())
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    raise TypeError(f"no JSON form for {type(value).__name__}")


def _read_attrs(obj: Any, skipped: list[str] | None = None) -> dict[str, Any]:
    attrs = {}
    for key in obj.attrs:
        try:
            attrs[str(key)] = json_safe(obj.attrs[key])
        except (TypeError, OSError, ValueError):
            # an attribute type JSON cannot carry (reference, empty, compound)
            if skipped is not None:
                skipped.append(str(key))
    return attrs


def _write_attr(obj: Any, key: str, value: Any) -> None:
    import h5py

    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        obj.attrs[key] = np.array(value, dtype=h5py.string_dtype())
        return
    try:
        obj.attrs[key] = value
    except (TypeError, ValueError):
        obj.attrs[key] = json.dumps(value)  # mixed or nested lists, None


def _datasets(file: Any) -> list[tuple[str, tuple[int, ...], str]]:
    import h5py

    found: list[tuple[str, tuple[int, ...], str]] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            found.append(("/" + name, obj.shape or (), dtype_name(obj.dtype)))

    file.visititems(visit)
    return found


def _listing(found: list[tuple[str, tuple[int, ...], str]]) -> str:
    if not found:
        return "none"
    items = [f"{n} ({shape_text(s)} {d})" for n, s, d in found[:_MAX_LISTED]]
    if len(found) > _MAX_LISTED:
        items.append(f"... {len(found) - _MAX_LISTED} more")
    return ", ".join(items)


_SLAB_LIMIT = 256 << 20   # bytes of decoded chunks kept between reads


class Hdf5Stack(Stack):
    """A 3-D or 4-D dataset, read in slabs of frames. A dataset chunked along time by more
    than one frame is read one row of chunks at a time (each chunk is decompressed once,
    however the codec's windows fall), if that row fits in 256 MB. With ``keep_file`` the
    metadata also carries the rest of the file (see ``hdf5_tree``)."""

    def __init__(self, path: str, dataset: str | None, keep_file: bool = False) -> None:
        import h5py

        name = display_name(path)
        try:
            self._file: Any = h5py.File(path, "r")
        except OSError as exc:
            raise InputError(f"cannot open {name} as HDF5: {reason(exc)}") from exc
        try:
            self._ds = self._find(name, dataset)
            skipped: list[str] = []
            self._setup(
                self._ds.shape or (),
                self._ds.dtype,
                make_metadata(path, "hdf5", self._ds.name, _read_attrs(self._ds, skipped)),
                label=f"dataset {self._ds.name} in {name}",
            )
            if keep_file:
                from tezip.io import hdf5_tree

                record = hdf5_tree.capture(self._file, self._ds)
                self.metadata[hdf5_tree.KEY] = record
                self.notes = list(record.get("not_kept") or [])
            else:
                self.notes = [f"attribute {self._ds.name}@{k} is not kept (a type the .tez "
                              "metadata cannot carry: reference, compound or empty)"
                              for k in skipped]
            self._slab: tuple[int, int, np.ndarray] | None = None
            chunks = self._ds.chunks
            row = math.prod(self.shape[1:]) * self.dtype.itemsize * (chunks[0] if chunks else 1)
            self._chunk_t = chunks[0] if chunks and chunks[0] > 1 and row <= _SLAB_LIMIT else 1
        except BaseException:
            self._file.close()
            raise

    def _find(self, name: str, dataset: str | None) -> Any:
        import h5py

        if dataset is not None:
            try:
                obj = self._file.get(dataset)
            except (KeyError, ValueError, TypeError, OSError):
                obj = None
            if not isinstance(obj, h5py.Dataset):
                raise InputError(
                    f"no dataset '{dataset}' in {name}; "
                    f"datasets found: {_listing(_datasets(self._file))}"
                )
            return obj
        found = _datasets(self._file)
        stacks = [f for f in found if len(f[1]) in (3, 4)]
        if len(stacks) == 1:
            return self._file[stacks[0][0]]
        if stacks:
            raise InputError(
                f"{name} holds {len(stacks)} datasets that could be stacks of frames; "
                f"choose one with --dataset: {_listing(stacks)}"
            )
        raise InputError(
            f"{name} holds no 3-D or 4-D dataset (T, H, W[, C]); pick one with --dataset; "
            f"datasets found: {_listing(found)}"
        )

    def _read(self, t0: int, t1: int) -> np.ndarray:
        c = self._chunk_t
        if c == 1:
            return self._slice(t0, t1)
        slab = self._slab
        if slab is not None and slab[0] <= t0 and t1 <= slab[1]:
            return slab[2][t0 - slab[0]:t1 - slab[0]]
        # read whole rows of chunks; keep what is already decoded of a row we stand in
        start, end = t0 // c * c, min(self.shape[0], -(-t1 // c) * c)
        kept = []
        if slab is not None and slab[0] <= t0 < slab[1]:
            kept, start = [slab[2][t0 - slab[0]:]], slab[1]
        data = np.concatenate([*kept, self._slice(start, end)]) if kept else \
            self._slice(start, end)
        self._slab = (t0 if kept else start, end, data)
        return data[t0 - self._slab[0]:t1 - self._slab[0]]

    def _slice(self, t0: int, t1: int) -> np.ndarray:
        try:
            return self._ds[t0:t1]
        except OSError as exc:
            raise InputError(
                f"cannot read frames {t0}..{t1 - 1} of {self.metadata['source']}: {reason(exc)}"
            ) from exc

    def close(self) -> None:
        self._file.close()


def reservation(ds: Any) -> int:
    """An upper bound of the bytes HDF5 will add to the file while the frames of ``ds``
    are written once each, chunk by chunk: raw size (plus 5% if filtered) and index."""
    raw = int(np.prod(ds.shape)) * ds.dtype.itemsize
    chunks = ds.chunks or ds.shape
    n = math.prod(-(-s // c) for s, c in zip(ds.shape, chunks, strict=True))
    filtered = ds.id.get_create_plist().get_nfilters() > 0
    return (raw + raw // 20 if filtered else raw) + 512 * n + (64 << 10)


class Hdf5Writer(StackWriter):
    """HDF5 cannot recover from a write that fails (a full disk, ``ulimit -f``): closing
    such a file crashes the process. So the writer checks the free space and the size
    limit first, reserves the disk blocks the frames will need (``tezip.atomic.reserve``),
    and writes each chunk once (whole rows of chunks along time)."""

    _file: Any = None
    _ds: Any = None
    _reserved = 0

    def __init__(self, *args: Any, dataset: str | None = None, **kwargs: Any) -> None:
        self._dataset = dataset
        self._pending: list[np.ndarray] = []
        self._pending_t0 = 0
        super().__init__(*args, **kwargs)

    def expected_bytes(self) -> tuple[int, int] | None:
        """Known once the dataset exists (filters, chunking)."""
        if self._ds is None:
            return None
        import os

        n = os.path.getsize(self.temp) + reservation(self._ds)
        return n, n

    def _create(self) -> None:
        import h5py

        from tezip.atomic import reserve
        from tezip.io import hdf5_tree

        path = self._dataset or self.metadata.get("dataset") or DEFAULT_DATASET
        tree = self.metadata.get(hdf5_tree.KEY)
        if isinstance(tree, dict) and self._dataset in (None, tree.get("path")):
            # the original file's other groups, datasets and attributes, and the stack's
            # own creation properties and attributes; only the frames are missing
            self._file, self._ds = hdf5_tree.restore(tree, self.temp, self.shape)
            self.notes += list(tree.get("not_kept") or [])    # lost when compressing
        else:
            self._file = h5py.File(self.temp, "w-", libver=hdf5_tree.LIBVER)
            try:
                ds = self._file.create_dataset(
                    path, shape=self.shape, dtype=self.dtype, chunks=(1, *self.shape[1:])
                )
            except (ValueError, TypeError, KeyError) as exc:
                msg = f"cannot create dataset '{path}' in {self.path}: {reason(exc)}"
                raise OptionError(msg) from exc
            for key, value in (self.metadata.get("attrs") or {}).items():
                try:
                    _write_attr(ds, key, value)
                except (TypeError, ValueError, OSError) as exc:
                    self.notes.append(f"attribute {path}@{key} is not kept in {self.path} "
                                      f"({reason(exc)})")
            self._ds = ds
        self._need()
        size = reservation(self._ds)
        if reserve(self.temp, size):
            self._reserved = size
        chunks = self._ds.chunks
        row = (chunks[0] if chunks else 1) * math.prod(self.shape[1:]) * self.dtype.itemsize
        self._chunk_t = chunks[0] if chunks and row <= _SLAB_LIMIT else 1

    def _write(self, t0: int, frames: np.ndarray) -> None:
        c = self._chunk_t
        if c == 1:
            self._ds[t0 : t0 + len(frames)] = frames
            return
        if not self._pending:
            self._pending_t0 = t0
        self._pending.append(frames)
        end = t0 + len(frames)
        upto = end if end == self.shape[0] else end // c * c   # whole rows of chunks only
        if upto <= self._pending_t0:
            return
        block = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        n = upto - self._pending_t0
        self._ds[self._pending_t0 : upto] = block[:n]
        rest = block[n:]
        self._pending = [rest] if len(rest) else []
        self._pending_t0 = upto

    def _close(self) -> None:
        # release the handle before closing: if close fails (disk full), a second close
        # of the same h5py file would crash the process
        file, self._file = self._file, None
        self._ds = None
        if file is not None:
            file.close()
            if self._reserved:
                from tezip.atomic import release

                release(self.temp, self._reserved)
