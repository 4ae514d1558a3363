"""Shards on disk while ``tezip prepare`` writes them: frame-range views of a source, the
value range of a part, resume sidecars, and pieces (window-aligned runs of one shard,
encoded by any rank) assembled into the shard.

A shard cut into pieces is byte-identical to the same frames encoded in one go: windows
are coded independently, every piece is encoded with the source's value range, and the
shard's header is the one ``compress_stack`` writes for the whole range (the pieces'
header with the shard's frame count). ``tests/test_dataset_prepare.py`` checks it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..codec import Options, TezFile, Tuning, __version__, compress_stack, scan
from ..container import ContainerReader, ContainerWriter
from .config import CodecConfig
from .manifest import MANIFEST, sha256_file, write_json
from .plan import Piece, Shard, Source, SourceInfo

SIDECAR = ".json"


class FrameRange:
    """Frames [t0, t1) of a stack, as a stack (what compress_stack reads)."""

    def __init__(self, stack: Any, t0: int, t1: int, metadata: dict[str, Any]) -> None:
        self._s, self._t0 = stack, t0
        self.shape = (t1 - t0, *stack.shape[1:])
        self.dtype = stack.dtype
        self.metadata = metadata

    def read(self, a: int, b: int) -> np.ndarray:
        return self._s.read(self._t0 + a, self._t0 + b)


def piece_path(out: Path, piece: Piece) -> Path:
    """Where a piece of a shard waits for assembly (hidden; removed after)."""
    return out / f".piece-{piece.shard:06d}-{piece.index:06d}.tez"


def is_leftover(name: str) -> bool:
    """A file a killed run may leave behind: pieces and temporary files."""
    return name.startswith((".piece-", "..piece-", ".shard-", f".{MANIFEST}."))


def needs_range(codec: CodecConfig, dtype: str) -> bool:
    """Mirrors compress_stack: the value range is used for relative bounds and floats."""
    return codec.mode in ("rel", "absrel") or np.dtype(dtype).kind == "f"


def part_range(view: FrameRange) -> list | None:
    """[min, max] of the finite values of a part, and whether every value of a float
    part is a finite integer (``codec.scan``; False for other types); None if it has no
    finite value."""
    lo, hi, integral = scan(view, integers=view.dtype.kind == "f")
    if (lo, hi) == (0.0, 0.0) and view.dtype.kind == "f":
        # value_range says (0, 0) both for zeros and for no finite value at all
        empty = True
        for a in range(0, view.shape[0], 16):
            if np.isfinite(view.read(a, min(view.shape[0], a + 16))).any():
                empty = False
                break
        if empty:
            return None
    return [lo, hi, bool(integral)]


def combine_ranges(shards: list[Shard], infos: list[SourceInfo], codec: CodecConfig,
                   parts: dict[int, list[float] | None]) -> list[tuple[float, float] | None]:
    """Each source's (min, max) over the parts of its shards (``parts``: shard index ->
    [min, max] or None); (0, 0) if it has no finite value; None where compress_stack
    would not use one."""
    by_source: dict[int, list[list[float]]] = {}
    for sh in shards:
        part = parts.get(sh.index)
        if part is not None:
            by_source.setdefault(sh.source, []).append(part)
    out: list[tuple[float, float] | None] = []
    for s, info in enumerate(infos):
        if not needs_range(codec, info.dtype):
            out.append(None)
            continue
        vals = by_source.get(s, [])
        out.append((min(p[0] for p in vals), max(p[1] for p in vals)) if vals else (0.0, 0.0))
    return out


def combine_integral(shards: list[Shard], infos: list[SourceInfo],
                     parts: dict[int, list | None]) -> list[bool]:
    """Per source: whether it is a float stack whose every value is a finite integer
    (every part of each of its shards says so; a part with no finite value, or one
    recorded without the flag, says not), coded then on the integer grid as
    ``compress_stack`` codes such a stack that it reads itself."""
    out = [np.dtype(info.dtype).kind == "f" for info in infos]
    for sh in shards:
        part = parts.get(sh.index)
        if part is None or len(part) < 3 or part[2] is not True:
            out[sh.source] = False
    return out


def merge_parts(a: list | None, b: list | None) -> list | None:
    """Two parts' ``part_range`` as one; a part with no finite value (None) does not
    count towards the range, but makes the whole not one of integers."""
    if a is None or b is None:
        m = a if b is None else b
        return None if m is None else [m[0], m[1], False]
    return [min(a[0], b[0]), max(a[1], b[1]),
            len(a) > 2 and len(b) > 2 and a[2] is True and b[2] is True]


def shard_key(codec: CodecConfig, model: str | None, src: Source, info: SourceInfo,
              shard: Shard) -> Any:
    """What a shard's bytes depend on (``model``: codec.model_identity()); a sidecar with
    another key is not reused. The source is named as given (with its size and mtime), so
    a tree of inputs and data set moved together still resumes."""
    return json.loads(json.dumps({
        "tezip": __version__, "codec": codec.to_dict(), "model": model,
        "source": src.path, "dataset": info.dataset,
        "identity": list(info.identity), "shape": list(info.shape), "dtype": info.dtype,
        "source_frames": [shard.t0, shard.t1]}))


def reusable(out: Path, shard: Shard, key: Any) -> dict[str, Any] | None:
    """The sidecar of a complete shard written with the same key whose file still has the
    recorded size and sha256; None otherwise. The sidecar is written only after the shard
    was renamed into place, so a shard cut short by a kill is never trusted."""
    side = out / (shard.file + SIDECAR)
    path = out / shard.file
    try:
        meta = json.loads(side.read_text())
        rec = meta["record"]
        if (meta.get("key") != key or not path.is_file()
                or path.stat().st_size != rec["bytes"]):
            return None
        if sha256_file(path) != rec["sha256"]:
            return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def model_hash(path: Path) -> str | None:
    """The content hash of the learned model a shard was written with, from its header."""
    with TezFile(path) as f:
        rec = f.header.get("model")
    return rec.get("hash") if isinstance(rec, dict) else None


@dataclass(frozen=True)
class PieceResult:
    """A piece encoded: where it is and what it took."""

    piece: int
    path: str
    raw_bytes: int
    bytes: int


def encode_piece(piece: Piece, view: FrameRange, path: Path, options: Options,
                 vrange: tuple[float, float] | None,
                 step: Callable[[int], None] | None = None,
                 tuning: Tuning | None = None, integral: bool = False) -> PieceResult:
    """Encode one piece into ``path`` (the shard itself for a whole-shard piece);
    ``tuning``: the shard's (``tune_stack`` of the whole shard), for a part of it;
    ``integral``: the source's (``combine_integral``)."""
    st = compress_stack(view, path, options, force=True, progress=step,
                        vrange=tuple(vrange) if vrange is not None else None,
                        integral=integral, tuning=tuning)
    return PieceResult(piece.index, str(path), st.raw_bytes, path.stat().st_size)


def assemble(path: Path, pieces: list[Path]) -> None:
    """Write the shard at ``path`` from its pieces, in order: their windows, offset, under
    the header the whole range would have had (written atomically by ContainerWriter)."""
    readers = [ContainerReader(p) for p in pieces]
    try:
        frames = sum(sum(e.frames for e in r.entries) for r in readers)
        header = dict(readers[0].header)
        header["shape"] = [frames, *header["shape"][1:]]
        # the longest window (the last piece's may hold a joined tail, windows.coded_windows)
        header["window"] = max(int(r.header["window"]) for r in readers)
        with ContainerWriter(path, header, force=True) as w:
            offset = 0
            for r in readers:
                for i, e in enumerate(r.entries):
                    w.add_window(offset + e.t0, e.frames, r.payload(i))
                offset += sum(e.frames for e in r.entries)
    finally:
        for r in readers:
            r.close()
    for p in pieces:
        with contextlib.suppress(OSError):
            os.unlink(p)


def record(out: Path, shard: Shard, src: Source, info: SourceInfo) -> dict[str, Any]:
    """The manifest entry of a shard on disk (``first_frame`` comes later)."""
    path = out / shard.file
    return {"file": shard.file, "bytes": path.stat().st_size, "sha256": sha256_file(path),
            "frames": shard.frames, "shape": [shard.frames, *info.shape[1:]],
            "dtype": info.dtype, "source": os.path.abspath(src.path),
            "dataset": info.dataset, "source_frames": [shard.t0, shard.t1]}


def write_sidecar(out: Path, shard: Shard, key: Any, rec: dict[str, Any],
                  part: list | None, vrange: tuple[float, float] | None,
                  mhash: str | None, integral: bool = False) -> None:
    """The resume record of ``shard``, just written. It replaces the sidecar of an
    earlier run: that one described the shard file this run has replaced (``--force``,
    other options), and is tezip's own bookkeeping, not a user's output."""
    write_json(out / (shard.file + SIDECAR),
               {"key": key, "record": rec, "part_range": part,
                "vrange": list(vrange) if vrange is not None else None,
                "integral": integral, "model_hash": mhash},
               force=True)
