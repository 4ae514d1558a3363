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

from tezip.errors import CorruptFileError, InputError, OptionError, OutputError
from tezip.zstd_util import unzstd_exact

KEY = "hdf5_file"                 # the metadata key the record lives under
STREAM_ATTR = "tezip_stream"      # marks a uint8 dataset holding a whole .tez stream
SKELETON_LIMIT = 8 << 20          # compressed bytes; the .tez header holds at most 16 MB
_KEPT_FILTERS = ("gzip", "lzf")   # always available to h5py for writing
MAX_SKELETON_BYTES = 1 << 30      # what a decoder accepts to unpack (the writer too)


# the skeleton and HDF5 outputs use the HDF5 1.8 file format at least: it stores
# attributes larger than 64 KiB (dense attribute storage), which the 1.6 format cannot
LIBVER = ("v108", "latest")
_REF_ATTRS = ("DIMENSION_LIST", "REFERENCE_LIST")    # dimension scale bookkeeping
_KEPT_FILTER_IDS = {1: "gzip", 2: "shuffle", 3: "fletcher32", 32000: "lzf"}


def has_references(tid: Any) -> bool:
    """True if the HDF5 type holds object or region references anywhere in it."""
    import h5py

    cls = tid.get_class()
    if cls == h5py.h5t.REFERENCE:
        return True
    if cls == h5py.h5t.COMPOUND:
        return any(has_references(tid.get_member_type(i)) for i in range(tid.get_nmembers()))
    if cls in (h5py.h5t.VLEN, h5py.h5t.ARRAY):
        return has_references(tid.get_super())
    return False


def _copy_attrs(src: Any, dst: Any, refs: list[str] | None = None) -> list[str]:
    """Copy attributes with their HDF5 types; returns the names that could not be copied.
    Attributes holding references are not copied (they point into the source file); their
    names go to ``refs`` for the caller to rebuild."""
    skipped = []
    for name in src.attrs:
        try:
            aid = src.attrs.get_id(name)
            if has_references(aid.get_type()):
                if refs is not None:
                    refs.append(name)
                continue
            dst.attrs.create(name, src.attrs[name], dtype=aid.dtype)
        except (TypeError, ValueError, OSError, KeyError):
            skipped.append(f"{src.name}@{name}")
    return skipped


def dropped_filters(ds: Any) -> list[str]:
    """The filters of ``ds`` an output will not have (only gzip, lzf, shuffle and
    fletcher32 are kept: always available to h5py, and lossless)."""
    dcpl = ds.id.get_create_plist()
    out = []
    for i in range(dcpl.get_nfilters()):
        code, _, _, name = dcpl.get_filter(i)
        if code not in _KEPT_FILTER_IDS:
            text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            out.append({4: "szip", 5: "nbit", 6: "scaleoffset"}.get(code, text or str(code)))
    return out


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
    """Copies everything but the stack into ``dst``, then rebuilds what HDF5's object copy
    cannot carry between files: references (object and region, in datasets and
    attributes) and dimension scales. What cannot be rebuilt is dropped and listed in
    ``notes`` (never a reference into the source file, which would dangle)."""

    def __init__(self, src: Any, dst: Any, target: Any) -> None:
        import h5py

        self.h5py = h5py
        self.src = src
        self.dst = dst
        self.target = target
        self.stack_path = ""                # set once the placeholder exists
        self.aliases: list[str] = []        # every hard-link path of the stack
        self.seen: dict[Any, str] = {}      # object -> its first path in dst (hard links)
        self.ref_attrs: list[tuple[Any, str, str]] = []    # (src object, dst path, name)
        self.ref_data: list[tuple[Any, str]] = []          # (src dataset, dst path)
        self.scaled: list[tuple[Any, str]] = []            # datasets with dimension scales
        self.notes: list[str] = []
        self.skipped: list[str] = self.attrs(src, dst)
        self.seen[src.id] = "/"
        self.walk(src, dst)

    def attrs(self, src: Any, dst: Any) -> list[str]:
        refs: list[str] = []
        skipped = _copy_attrs(src, dst, refs)
        self.ref_attrs += [(src, dst.name, name) for name in refs]
        if "DIMENSION_LIST" in refs and isinstance(src, self.h5py.Dataset):
            self.scaled.append((src, dst.name))
        return skipped

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
                self.skipped += self.attrs(obj, sub)
                self.walk(obj, sub)
                continue
            src.copy(obj, dst, name=name)               # datasets and named datatypes
            if isinstance(obj, h5py.Dataset):
                for attr in obj.attrs:                  # HDF5 copied these as null refs
                    if has_references(obj.attrs.get_id(attr).get_type()):
                        self.ref_attrs.append((obj, path, attr))
                        if attr == "DIMENSION_LIST":
                            self.scaled.append((obj, path))
                if has_references(obj.id.get_type()):
                    self.ref_data.append((obj, path))

    # -- references ----------------------------------------------------------------------

    def path_of(self, obj: Any) -> str | None:
        if isinstance(obj, self.h5py.Dataset) and obj == self.target:
            return self.stack_path
        return self.seen.get(obj.id)

    def remap(self, ref: Any, region: bool, where: str) -> Any:
        """The reference in dst to what ``ref`` points to in src (null if nothing)."""
        h5py = self.h5py
        null = h5py.h5r.RegionReference() if region else h5py.Reference()
        if not ref:
            return null
        try:
            obj = self.src[ref]
        except (ValueError, KeyError, OSError, RuntimeError):
            self.notes.append(f"{where}: a reference that points nowhere in the source file "
                              "was written as a null reference")
            return null
        path = self.path_of(obj)
        if path is None or path not in self.dst:
            self.notes.append(f"{where}: a reference to {obj.name}, which is not kept, was "
                              "written as a null reference")
            return null
        if not region:
            return self.dst[path].ref
        space = h5py.h5r.get_region(ref, self.src.id)
        return h5py.h5r.create(self.dst.id, path.encode(), h5py.h5r.DATASET_REGION, space)

    def remap_all(self, values: Any, kind: Any, where: str) -> Any:
        import numpy as np

        region = kind is self.h5py.RegionReference
        arr = np.asarray(values, dtype=object)
        out = np.empty(arr.shape, dtype=object)
        for i, ref in enumerate(arr.flat):
            out.flat[i] = self.remap(ref, region, where)
        dtype = self.h5py.regionref_dtype if region else self.h5py.ref_dtype
        return (out[()] if out.ndim == 0 else out), dtype

    def fix(self) -> None:
        """Rebuild references and dimension scales once every object exists in dst."""
        import numpy as np

        h5py = self.h5py
        for src, dpath, name in self.ref_attrs:
            where = f"attribute {src.name}@{name}"
            try:
                holder = self.dst[dpath]
                if name in holder.attrs:
                    del holder.attrs[name]
                if name in _REF_ATTRS and isinstance(src, h5py.Dataset):
                    continue                            # rebuilt by attaching the scales
                kind = h5py.check_dtype(ref=src.attrs.get_id(name).dtype)
                if kind is None:
                    self.notes.append(f"{where} was not kept (references inside a compound "
                                      "or variable-length value)")
                    continue
                value, dtype = self.remap_all(src.attrs[name], kind, where)
                holder.attrs.create(name, value, dtype=dtype)
            except (OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
                self.notes.append(f"{where} was not kept ({' '.join(str(exc).split())})")
        for src, dpath in self.ref_data:
            where = f"dataset {src.name}"
            try:
                kind = h5py.check_dtype(ref=src.dtype)
                if kind is None:
                    del self.dst[dpath]
                    self.notes.append(f"{where} was not kept (references inside a compound "
                                      "or variable-length type)")
                    continue
                if kind is h5py.Reference:
                    values = src[()]
                else:                       # element by element: RegionReference objects
                    values = np.empty(src.shape, dtype=object)
                    for idx in np.ndindex(src.shape):
                        values[idx] = src[idx]
                value, _ = self.remap_all(values, kind, where)
                self.dst[dpath][...] = value
            except (OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
                with contextlib.suppress(KeyError, OSError):
                    del self.dst[dpath]
                self.notes.append(f"{where} was not kept ({' '.join(str(exc).split())})")
        for src, dpath in self.scaled:
            try:
                ds = self.dst[dpath]
                for i, dim in enumerate(src.dims):
                    for scale in dim.values():
                        spath = self.path_of(scale)
                        if spath is None or spath not in self.dst:
                            self.notes.append(f"dimension scale {scale.name} of {src.name} was "
                                              "not kept")
                            continue
                        sc = self.dst[spath]
                        if not h5py.h5ds.is_scale(sc.id):
                            sc.make_scale(h5py.h5ds.get_scale_name(scale.id).decode()
                                          if h5py.h5ds.get_scale_name(scale.id) else "")
                        ds.dims[i].attach_scale(sc)
                    if dim.label:
                        ds.dims[i].label = dim.label
            except (OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
                self.notes.append(f"dimension scales of {src.name} were not kept "
                                  f"({' '.join(str(exc).split())})")


def capture(file: Any, ds: Any) -> dict[str, Any]:
    """The record of everything in ``file`` but the dataset ``ds`` (both open h5py objects).
    Raises OptionError if the rest of the file is too large to carry in a .tez header.
    ``not_kept`` lists, for the user, what the restored file will not have."""
    import h5py

    buf = io.BytesIO()
    with h5py.File(buf, "w", libver=LIBVER) as dst:
        c = _Copier(file, dst, ds)
        aliases = c.aliases or [ds.name]
        c.stack_path = aliases[0]
        _placeholder(ds, dst, aliases[0])
        c.skipped += c.attrs(ds, dst[aliases[0]])
        for extra in aliases[1:]:
            dst[extra] = dst[aliases[0]]
        c.fix()
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
    filters = dropped_filters(ds)
    notes = [f"attribute {name} was not kept (a type the copy does not handle)"
             for name in c.skipped] + c.notes
    if filters:
        notes.append(f"the {', '.join(filters)} filter of {ds.name} is not kept; the restored "
                     "stack is stored without it")
    return {"path": aliases[0], "aliases": aliases[1:], "size": len(raw),
            "skeleton": base64.b64encode(packed).decode("ascii"),
            "skipped_attrs": c.skipped, "dropped_filters": filters, "not_kept": notes}


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
        file = h5py.File(temp, "r+", libver=LIBVER)
    except OSError as exc:
        raise OutputError(f"cannot write {temp}: {exc}") from exc
    ds = file.get(path)
    if not isinstance(ds, h5py.Dataset) or tuple(ds.shape) != tuple(shape):
        file.close()
        raise CorruptFileError("the recorded HDF5 file structure does not match the stack")
    return file, ds


# ---------------------------------------------------------------------------------------
# a .tez stream embedded in an HDF5 file in place of the stack


def _rewrite_references(file: Any, old: Any, new: Any | None, notes: list[str]) -> None:
    """Point every object reference to ``old`` in ``file`` (datasets and attributes of plain
    reference type) at ``new``; region references to ``old`` (whose selection ``new``
    cannot carry) become null, with a note."""
    import h5py
    import numpy as np

    def fixed(values: Any, region: bool, where: str) -> tuple[Any, bool]:
        arr = np.asarray(values, dtype=object)
        changed = False
        for i, ref in enumerate(arr.flat):
            if ref and file[ref] == old:
                changed = True
                if region or new is None:
                    arr.flat[i] = h5py.h5r.RegionReference() if region else h5py.Reference()
                    notes.append(f"{where}: a reference into the stack was written as a null "
                                 "reference (the stack is stored as compressed bytes here)")
                else:
                    arr.flat[i] = new.ref
        return (arr[()] if arr.ndim == 0 else arr), changed

    holders: list[Any] = [file]
    file.visititems(lambda _, obj: holders.append(obj) if obj != old else None)
    for obj in holders:
        for name in list(obj.attrs):
            kind = h5py.check_dtype(ref=obj.attrs.get_id(name).dtype)
            if kind is None or name in _REF_ATTRS:
                continue
            value, changed = fixed(obj.attrs[name], kind is h5py.RegionReference,
                                   f"attribute {obj.name}@{name}")
            if changed:
                dtype = h5py.regionref_dtype if kind is h5py.RegionReference else h5py.ref_dtype
                obj.attrs.create(name, value, dtype=dtype)
        if isinstance(obj, h5py.Dataset):
            kind = h5py.check_dtype(ref=obj.dtype)
            if kind is None:
                continue
            region = kind is h5py.RegionReference
            values = np.empty(obj.shape, dtype=object)
            for idx in np.ndindex(obj.shape):
                values[idx] = obj[idx]
            value, changed = fixed(values, region, f"dataset {obj.name}")
            if changed:
                obj[...] = value


def embed(tez_path: str, out: str, record: dict | None, dataset: str, attrs: dict,
          shape: tuple[int, ...], dtype: str) -> list[str]:
    """Write ``out``: the original file's structure (``record``, or a file holding just
    ``dataset`` when None) with the stack at ``dataset`` replaced by a contiguous uint8
    dataset holding the whole .tez stream at ``tez_path``. The stack's attributes stay on
    it (NeXus ``signal``, units, ...), so tools still browse the file; tezip reads the
    stream in place (``open_embedded``). References to the stack now point to the stream;
    its dimension scales are detached (the stream is 1-D; ``tezip decompress`` restores
    them). Returns notes on what this file does not keep."""
    import h5py
    import numpy as np

    from tezip.atomic import check_space, release, reserve

    notes: list[str] = []
    size = os.path.getsize(tez_path)
    extra = size + (64 << 10)
    # HDF5 cannot recover from a failed write: check the space first, then reserve it
    check_space(out, extra + (int(record.get("size", 0)) if isinstance(record, dict) else 0))
    if record is not None:
        file, placeholder = restore(record, out, shape)
        path, aliases = str(record["path"]), [str(a) for a in record.get("aliases", [])]
    else:
        file, placeholder = h5py.File(out, "x", libver=LIBVER), None
        path, aliases = dataset, []
    reserved = False
    try:
        reserved = reserve(out, extra)
        parent = path.rsplit("/", 1)[0] or "/"
        group = file.require_group(parent)
        tmp = f"{parent.rstrip('/')}/.tezip-{os.getpid()}"
        blob = group.create_dataset(tmp, shape=(size,), dtype=np.uint8)   # contiguous
        if placeholder is not None:
            scales = [(i, s) for i, dim in enumerate(placeholder.dims) for s in dim.values()]
            for i, scale in scales:
                placeholder.dims[i].detach_scale(scale)
            if scales:
                notes.append(f"the dimension scales of {path} are not attached in {out} (the "
                             "stack is stored there as compressed bytes); tezip decompress "
                             "restores them")
            refs: list[str] = []
            notes += [f"attribute {name} is not kept in {out}"
                      for name in _copy_attrs(placeholder, blob, refs)]
            for name in refs:
                if name in _REF_ATTRS:
                    continue
                if h5py.check_dtype(ref=placeholder.attrs.get_id(name).dtype) is None:
                    notes.append(f"attribute {path}@{name} is not kept in {out}")
                    continue
                blob.attrs.create(name, placeholder.attrs[name],
                                  dtype=placeholder.attrs.get_id(name).dtype)
            _rewrite_references(file, placeholder, blob, notes)
            for name in [path, *aliases]:
                del file[name]
        else:
            for key, value in attrs.items():
                try:
                    blob.attrs[key] = value
                except (TypeError, ValueError, OSError):
                    notes.append(f"attribute {path}@{key} is not kept in {out}")
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
    return notes


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
