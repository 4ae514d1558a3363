"""The .tez container: one self-describing file, windows independently decodable.

Layout (little-endian)::

    magic (8) | u16 format version | u32 header length | header (UTF-8 JSON) | u32 crc32
    window payloads, back to back
    index: per window  u64 offset | u64 length | u32 first frame | u32 frames | u32 crc32
    footer: u64 index offset | u32 windows | u32 index crc32 | b"TEZINDEX" | u32 crc32

Every byte of the file is covered by a checksum or a structural check, so any flipped byte
or truncation is reported as ``CorruptFileError``. Writers write to a temporary name in the
destination directory and rename on success.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import CorruptFileError, FormatVersionError, InputError, OutputExistsError

MAGIC = b"\x89TEZ\r\n\x1a\n"
FORMAT_VERSION = 1
_PRE = struct.Struct("<8sHI")
_CRC = struct.Struct("<I")
_ENTRY = struct.Struct("<QQIII")
_FOOT = struct.Struct("<QII8sI")
_FOOT_MAGIC = b"TEZINDEX"
MAX_HEADER = 16 << 20


def crc32(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True)
class WindowEntry:
    offset: int
    length: int
    t0: int
    frames: int
    crc: int


class ContainerWriter:
    """Streams windows into ``path`` (or into ``fileobj`` when given, for in-memory use)."""

    def __init__(self, path: str | os.PathLike | None, header: dict, *, force: bool = False,
                 fileobj: BinaryIO | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._tmp: Path | None = None
        if fileobj is not None:
            self._f = fileobj
        else:
            assert self.path is not None
            if self.path.exists() and not force:
                raise OutputExistsError(f"{self.path} exists; pass --force to overwrite it")
            parent = self.path.parent if str(self.path.parent) else Path(".")
            if not parent.is_dir():
                raise InputError(f"output directory {parent} does not exist")
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=parent)
            self._tmp = Path(tmp)
            umask = os.umask(0o022)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            self._f = os.fdopen(fd, "wb")
        body = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        pre = _PRE.pack(MAGIC, FORMAT_VERSION, len(body)) + body
        self._f.write(pre + _CRC.pack(crc32(pre)))
        self._pos = len(pre) + _CRC.size
        self.entries: list[WindowEntry] = []
        self.bytes_written = self._pos

    def add_window(self, t0: int, frames: int, payload: bytes) -> None:
        self._f.write(payload)
        self.entries.append(WindowEntry(self._pos, len(payload), t0, frames, crc32(payload)))
        self._pos += len(payload)
        self.bytes_written = self._pos

    def close(self) -> None:
        index = b"".join(_ENTRY.pack(e.offset, e.length, e.t0, e.frames, e.crc)
                         for e in self.entries)
        foot = struct.pack("<QII8s", self._pos, len(self.entries), crc32(index), _FOOT_MAGIC)
        self._f.write(index + foot + _CRC.pack(crc32(foot)))
        self.bytes_written = self._pos + len(index) + _FOOT.size
        if self._tmp is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            assert self.path is not None
            os.replace(self._tmp, self.path)
            self._tmp = None

    def abort(self) -> None:
        if self._tmp is not None:
            self._f.close()
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    def __enter__(self) -> ContainerWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
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
        foot = self._read(size - _FOOT.size, _FOOT.size)
        index_off, n, index_crc, fmagic, fcrc = _FOOT.unpack(foot)
        if fmagic != _FOOT_MAGIC or fcrc != crc32(foot[:-_CRC.size]):
            raise self._bad("footer damaged or missing")
        index_len = n * _ENTRY.size
        if index_off < data_start or index_off + index_len + _FOOT.size != size:
            raise self._bad("window index out of place")
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
        if pos != index_off:
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
