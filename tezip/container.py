"""The .tez container: one self-describing file, windows independently decodable.

Layout (little-endian)::

    magic (8) | u16 format version | u32 header length | header (UTF-8 JSON) | u32 crc32
    window payloads, back to back
    [v2: the learned model the windows use, if it is stored in the file]
    index: per window  u64 offset | u64 length | u32 first frame | u32 frames | u32 crc32
    footer v1: u64 index offset | u32 windows | u32 index crc32 | b"TEZINDEX" | u32 crc32
    footer v2: u64 index offset | u32 windows | u32 index crc32 | u64 model offset |
               u32 model length | u32 model crc32 | b"TEZINDX2" | u32 crc32

The model is written after the windows, and only if a window uses it (the encoder
decides per window), so the header names the model by hash but cannot say whether the
file stores it: the footer does.

Every byte of the file is covered by a checksum or a structural check, so any flipped byte
or truncation is reported as ``CorruptFileError``. The writer refuses to write what the
reader would refuse (``check_header``, ``encode_header``), and writes through
``tezip.atomic.AtomicOutput`` (temporary name in the destination directory, fsync,
rename on success).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .atomic import AtomicOutput, reason
from .checksum import crc32
from .errors import CorruptFileError, FormatVersionError, InputError, OptionError, OutputError

MAGIC = b"\x89TEZ\r\n\x1a\n"
FORMAT_VERSION = 8          # v1 files are read by tezip.legacy.v1; v2 to v8 by this reader
#                             (v4: the Lorenzo predictors' second stage, {"pq": 1, "w": [...]};
#                             v5: interp's linear extrapolation at edges, {"edge": 1..3};
#                             v6: the Lorenzo predictors' run coding, {"r": 1}; v7: interp's;
#                             v8: the wavelet transform coder, predictor "wavelet")
_PRE = struct.Struct("<8sHI")
_CRC = struct.Struct("<I")
_ENTRY = struct.Struct("<QQIII")
_FOOT = struct.Struct("<QII8sI")
_FOOT_MAGIC = b"TEZINDEX"
_FOOT2 = struct.Struct("<QIIQII8sI")
_FOOT2_MAGIC = b"TEZINDX2"
MAX_HEADER = 16 << 20             # header bytes a reader accepts
MAX_FRAMES = 2**31                # largest extent of any axis a reader accepts
MAX_MODEL = 8 << 20               # embedded model bytes a reader accepts
_SHA256 = re.compile("[0-9a-f]{64}")


@dataclass(frozen=True)
class WindowEntry:
    offset: int
    length: int
    t0: int
    frames: int
    crc: int


def _json_size(value: object) -> int:
    try:
        return len(json.dumps(value, separators=(",", ":")))
    except (TypeError, ValueError):
        return 0


def _largest_metadata(header: dict, n: int = 3) -> str:
    """The largest metadata entries (one level into 'attrs'), for an error message."""
    meta = header.get("metadata")
    if not isinstance(meta, dict):
        return ""
    sizes = []
    for key, value in meta.items():
        if key == "attrs" and isinstance(value, dict):
            sizes += [(_json_size(v), f"attribute '{k}'") for k, v in value.items()]
        else:
            sizes.append((_json_size(value), "the rest of the HDF5 file" if key == "hdf5_file"
                          else f"metadata '{key}'"))
    sizes.sort(reverse=True)
    return ", ".join(f"{name} {size / 1e6:.1f} MB" for size, name in sizes[:n]
                     if size >= 100_000)


def encode_header(header: dict) -> bytes:
    """The header as the file stores it. OptionError if it cannot be stored: not JSON
    (e.g. metadata holding arrays or objects), or longer than the MAX_HEADER bytes a
    reader accepts."""
    try:
        body = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise OptionError(f"the .tez header cannot hold this metadata ({exc}); metadata must "
                          "be JSON: dicts with string keys, lists, strings, numbers, "
                          "booleans, None") from None
    if len(body) > MAX_HEADER:
        big = _largest_metadata(header)
        raise OptionError(
            f"the .tez header would take {len(body) / 1e6:.1f} MB, more than the "
            f"{MAX_HEADER >> 20} MiB ({MAX_HEADER} bytes) a .tez file may hold"
            + (f"; largest metadata: {big}" if big else "")
            + "; drop large attributes or metadata (for an HDF5 input, --data-only leaves "
              "out the rest of the file)")
    return body


def check_axes(shape: tuple[int, ...] | list[int]) -> None:
    """Refuse (OptionError) a stack with an axis a .tez file cannot hold."""
    if min(shape) < 1 or max(shape) > MAX_FRAMES:
        raise OptionError(f"a .tez file holds stacks of 1 to {MAX_FRAMES} values along each "
                          f"axis, and this one is shaped {tuple(shape)}; split it")


def check_header(header: dict) -> None:
    """Refuse (OptionError) a header the reader (``codec.TezFile``) would call damaged:
    the writer enforces every limit the reader enforces."""
    from .quantize import QuantParams  # a stage the container checks, not uses
    from .windows import MAX_WINDOW_VALUES

    shape = header.get("shape")
    if (not isinstance(shape, list) or len(shape) not in (3, 4)
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape)):
        raise OptionError(f"a .tez file holds a stack shaped (T, H, W) or (T, H, W, C), "
                          f"not {shape}")
    check_axes(shape)
    window = header.get("window")
    if not isinstance(window, int) or window < 1:
        raise OptionError(f"window must be a positive number of frames, got {window!r}")
    if math.prod(shape[1:]) * window > MAX_WINDOW_VALUES:
        raise OptionError(f"a window of {window} frames shaped {tuple(shape[1:])} holds more "
                          f"than the {MAX_WINDOW_VALUES} values a reader accepts")
    try:
        qp = QuantParams.from_dict(header.get("quant") or {})
    except (ValueError, TypeError):
        raise OptionError(f"the error bound cannot be coded: quantizer {header.get('quant')} "
                          "(a step of 0 or beyond the float range); choose a larger bound "
                          "or --mode lossless") from None
    if qp.dtype != header.get("dtype"):
        raise OptionError(f"quantizer dtype {qp.dtype} does not match the stack's "
                          f"{header.get('dtype')}")
    model = header.get("model")
    if model is not None and not (isinstance(model, dict) and isinstance(model.get("hash"), str)
                                  and _SHA256.fullmatch(model["hash"])):
        raise OptionError(f"the model record {model!r} has no SHA-256 content hash")


LEAN_MAX = 1 << 20      # the payload bytes a writer keeps so that ``close`` may write the
#                        lean header instead (past them, a 118-byte model record is under
#                        0.011% of the file)


class ContainerWriter:
    """Streams windows into ``path`` (or into ``fileobj`` when given, for in-memory use).

    A file output goes through ``tezip.atomic.AtomicOutput`` (checks, temporary name,
    fsync, no-replace rename without ``force``). The header and every window are checked
    against the limits the reader enforces before they are written; ``check=False`` skips
    that, for tests that craft damaged files on purpose. ``lean_header``: a header that
    ``close(lean=True)`` writes in ``header``'s place (one without the learned model's
    record, where no window turned out to use it), if the windows hold at most LEAN_MAX
    bytes and the output is a file or an ``io.BytesIO``: the file is then rewritten from
    its start, windows kept in memory."""

    def __init__(self, path: str | os.PathLike | None, header: dict, *, force: bool = False,
                 fileobj: BinaryIO | None = None, check: bool = True,
                 version: int = FORMAT_VERSION, lean_header: dict | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._check = check
        if check:
            check_header(header)
        self._lean: bytes | None = None
        self._kept: list[bytes] | None = None
        self._kept_bytes = 0
        self._start = 0
        if lean_header is not None and check and (fileobj is None
                                                  or isinstance(fileobj, io.BytesIO)):
            check_header(lean_header)
            self._lean = encode_header(lean_header)
            self._kept = []
            self._start = fileobj.tell() if fileobj is not None else 0
        body = encode_header(header) if check else json.dumps(
            header, sort_keys=True, separators=(",", ":")).encode()
        self._frames = int(header["shape"][0]) if check else None
        self._window = int(header["window"]) if check else None
        self._out: AtomicOutput | None = None
        if fileobj is not None:
            self._f = fileobj
        else:
            assert self.path is not None
            self._out = AtomicOutput(self.path, force=force)
            try:
                fd = os.open(self._out.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_CLOEXEC", 0), 0o666)
            except OSError as exc:
                raise OutputError(f"cannot create {self.path}: {reason(exc)}") from exc
            self._f = os.fdopen(fd, "wb")
        self._version = version         # another version only to craft test files
        pre = _PRE.pack(MAGIC, version, len(body)) + body
        self._write(pre + _CRC.pack(crc32(pre)))
        self._pos = len(pre) + _CRC.size
        self.entries: list[WindowEntry] = []
        self.bytes_written = self._pos
        self._t = 0
        self._closed = False

    def _write(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write {self.path}: {reason(exc)}") from exc

    def add_window(self, t0: int, frames: int, payload: bytes) -> None:
        if self._check:
            assert self._frames is not None and self._window is not None
            if t0 != self._t or not 1 <= frames <= self._window or t0 + frames > self._frames:
                self.abort()
                raise OptionError(f"window of frames {t0}..{t0 + frames - 1} does not follow "
                                  f"frame {self._t - 1} within a stack of {self._frames} "
                                  f"frames and windows of at most {self._window}")
        self._write(payload)
        self.entries.append(WindowEntry(self._pos, len(payload), t0, frames, crc32(payload)))
        self._pos += len(payload)
        self._t += frames
        self.bytes_written = self._pos
        if self._kept is not None:
            self._kept_bytes += len(payload)
            if self._kept_bytes > LEAN_MAX:
                self._kept = None
            else:
                self._kept.append(payload)

    def _rewrite_lean(self) -> None:
        """The file again from its start, with the lean header (``lean_header``)."""
        assert self._lean is not None and self._kept is not None
        try:
            self._f.seek(self._start)
            self._f.truncate()
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write {self.path}: {reason(exc)}") from exc
        pre = _PRE.pack(MAGIC, self._version, len(self._lean)) + self._lean
        self._write(pre + _CRC.pack(crc32(pre)))
        pos = len(pre) + _CRC.size
        entries = []
        for e, payload in zip(self.entries, self._kept, strict=True):
            self._write(payload)
            entries.append(WindowEntry(pos, e.length, e.t0, e.frames, e.crc))
            pos += len(payload)
        self.entries = entries
        self._pos = self.bytes_written = pos

    def close(self, model: bytes | None = None, lean: bool = False) -> None:
        """Finish the file; ``model``: the learned model's bytes, stored after the
        windows (when a window uses it and it is not a shipped one); ``lean``: write the
        lean header where the writer has one and kept the windows (see the class)."""
        if self._check and self._t != self._frames:
            self.abort()
            raise OutputError(f"only {self._t} of {self._frames} frames were written; "
                              f"{self.path or 'the stream'} discarded")
        if lean and not model and self._kept is not None:
            self._rewrite_lean()
        self._kept = None
        model = model or b""
        if len(model) > MAX_MODEL:
            self.abort()
            raise OptionError(f"the model takes {len(model)} bytes; a .tez file may store at "
                              f"most {MAX_MODEL}")
        model_off = self._pos
        self._write(model)
        self._pos += len(model)
        index = b"".join(_ENTRY.pack(e.offset, e.length, e.t0, e.frames, e.crc)
                         for e in self.entries)
        if self._version >= 2:
            foot = _FOOT2.pack(self._pos, len(self.entries), crc32(index), model_off,
                               len(model), crc32(model), _FOOT2_MAGIC, 0)[:-_CRC.size]
        else:
            foot = _FOOT.pack(self._pos, len(self.entries), crc32(index), _FOOT_MAGIC,
                              0)[:-_CRC.size]
        self._write(index + foot + _CRC.pack(crc32(foot)))
        self.bytes_written = self._pos + len(index) + len(foot) + _CRC.size
        if self._out is not None:
            try:
                self._f.close()         # flushes; AtomicOutput.commit fsyncs and renames
            except OSError as exc:
                self.abort()
                raise OutputError(f"cannot write {self.path}: {reason(exc)}") from exc
            self._out.commit()
            self._out = None
        self._closed = True

    def abort(self) -> None:
        self._closed = True
        if self._out is not None:
            with contextlib.suppress(OSError):
                self._f.close()
            self._out.abort()
            self._out = None

    def __enter__(self) -> ContainerWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if not self._closed:
                self.close()
        else:
            self.abort()


class ContainerReader:
    """Validates the structure on open; ``payload(i)`` returns a checksum-verified window."""

    def __init__(self, source: str | os.PathLike | bytes | bytearray | memoryview | BinaryIO
                 ) -> None:
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._f: BinaryIO = io.BytesIO(bytes(source))
            self.name = "<bytes>"
        elif hasattr(source, "read") and hasattr(source, "seek"):
            self._f = source                      # e.g. a .tez stream inside an HDF5 file
            self.name = str(getattr(source, "name", "<stream>"))
        else:
            self.name = str(source)
            try:
                self._f = open(source, "rb")  # noqa: SIM115 - closed in close()
            except FileNotFoundError:
                raise InputError(f"{source}: no such file") from None
            except IsADirectoryError:
                raise InputError(f"{source} is a directory, not a .tez file") from None
            except OSError as exc:
                raise InputError(f"{source}: cannot open ({exc.strerror})") from None
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _bad(self, what: str) -> CorruptFileError:
        return CorruptFileError(f"{self.name}: {what}; the file is damaged or truncated")

    def _read(self, offset: int, size: int) -> bytes:
        self._f.seek(offset)
        data = self._f.read(size)
        if len(data) != size:
            raise self._bad("unexpected end of file")
        return data

    def _parse(self) -> None:
        self._f.seek(0, os.SEEK_END)
        size = self._f.tell()
        if size < _PRE.size:
            if size >= 4 and self._read(0, 4) != MAGIC[:4]:
                raise InputError(f"{self.name} is not a .tez file")
            raise self._bad("file too short")
        magic, version, hlen = _PRE.unpack(self._read(0, _PRE.size))
        if magic != MAGIC:
            if magic[:4] == MAGIC[:4]:
                raise self._bad("bad file signature")
            raise InputError(f"{self.name} is not a .tez file")
        if hlen > MAX_HEADER or _PRE.size + hlen + _CRC.size + _FOOT.size > size:
            raise self._bad("bad header length")
        # (the v2 footer is longer: checked once the version is known)
        pre = self._read(0, _PRE.size + hlen)
        (hcrc,) = _CRC.unpack(self._read(_PRE.size + hlen, _CRC.size))
        if hcrc != crc32(pre):
            raise self._bad("header checksum mismatch")
        if version > FORMAT_VERSION:
            raise FormatVersionError(
                f"{self.name} was written with .tez format version {version}; this tezip reads "
                f"up to version {FORMAT_VERSION}: upgrade tezip")
        if version < 1:
            raise self._bad(f"unknown format version {version}")
        self.version = version
        try:
            header = json.loads(pre[_PRE.size:].decode())
        except (UnicodeDecodeError, ValueError):
            raise self._bad("header is not valid JSON") from None
        if not isinstance(header, dict):
            raise self._bad("header is not a JSON object")
        self.header: dict = header
        data_start = _PRE.size + hlen + _CRC.size
        self.model_bytes: bytes | None = None
        if version >= 2:
            fsize, fstruct, fmagic_want = _FOOT2.size, _FOOT2, _FOOT2_MAGIC
        else:
            fsize, fstruct, fmagic_want = _FOOT.size, _FOOT, _FOOT_MAGIC
        if size < data_start + fsize:
            raise self._bad("file too short")
        foot = self._read(size - fsize, fsize)
        if version >= 2:
            index_off, n, index_crc, model_off, model_len, model_crc, fmagic, fcrc = \
                fstruct.unpack(foot)
        else:
            index_off, n, index_crc, fmagic, fcrc = fstruct.unpack(foot)
            model_off, model_len, model_crc = index_off, 0, 0
        if fmagic != fmagic_want or fcrc != crc32(foot[:-_CRC.size]):
            raise self._bad("footer damaged or missing")
        index_len = n * _ENTRY.size
        if index_off < data_start or index_off + index_len + fsize != size:
            raise self._bad("window index out of place")
        if model_len > MAX_MODEL or model_off + model_len != index_off or model_off < data_start:
            raise self._bad("model section out of place")
        if model_len:
            blob = self._read(model_off, model_len)
            if crc32(blob) != model_crc:
                raise self._bad("model checksum mismatch")
            self.model_bytes = blob
        index = self._read(index_off, index_len)
        if crc32(index) != index_crc:
            raise self._bad("window index checksum mismatch")
        entries = [WindowEntry(*_ENTRY.unpack_from(index, i * _ENTRY.size)) for i in range(n)]
        pos, t = data_start, 0
        for e in entries:
            if e.offset != pos or e.t0 != t or e.frames < 1:
                raise self._bad("window index inconsistent")
            pos += e.length
            t += e.frames
        if pos != model_off:
            raise self._bad("window index inconsistent")
        self.entries = entries
        self.size = size

    def payload(self, i: int) -> bytes:
        e = self.entries[i]
        data = self._read(e.offset, e.length)
        if crc32(data) != e.crc:
            last = e.t0 + e.frames - 1
            raise self._bad(f"checksum mismatch in window {i} (frames {e.t0}-{last})")
        return data

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ContainerReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
