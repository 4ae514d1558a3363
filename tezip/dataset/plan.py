"""What ``tezip prepare`` will do: the inputs, what each one holds (scan), the shards
(a function of the inputs and options only, never of the number of ranks) and the pieces
the ranks encode (window-aligned runs of one shard, so one large stack is spread over
every rank). Everything but ``expand_inputs`` and ``scan_source`` is a pure function."""

from __future__ import annotations

import glob
import heapq
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import io
from ..codec import ArrayStack, check_stack, compress_stack
from ..errors import InputError, OptionError
from ..windows import coded_windows, window_length
from .config import CodecConfig

# a source estimated to compress better than this is still cut as if it compressed this
# well, so one shard never holds more than MAX_EST_RATIO x --shard-size of raw data
MAX_EST_RATIO = 16.0
STACK_EXT = (".npy", ".h5", ".hdf5", ".hdf", ".nxs")
FRAME_EXT = (".png", ".tif", ".tiff")


@dataclass(frozen=True)
class Source:
    """One input stack: ``path`` as the user named it (or a glob/folder expanded it)."""

    path: str
    dataset: str | None = None


@dataclass(frozen=True)
class SourceInfo:
    shape: tuple[int, ...]
    dtype: str
    dataset: str | None        # the dataset actually read (HDF5), else None
    identity: tuple[Any, ...]  # size and mtime of the file(s), for resume
    est_ratio: float = 1.0     # estimated compression ratio (1.0 when not estimated)

    @property
    def frame_values(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def frame_bytes(self) -> int:
        return self.frame_values * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Shard:
    """Frames [t0, t1) of source ``source``; ``index`` is its place in the data set."""

    index: int
    source: int
    t0: int
    t1: int
    raw_bytes: int

    @property
    def file(self) -> str:
        return f"shard-{self.index:06d}.tez"

    @property
    def frames(self) -> int:
        return self.t1 - self.t0


@dataclass(frozen=True)
class Piece:
    """Frames [t0, t1) (source frame numbers) of shard ``shard``: whole windows, one
    rank's unit of work. ``whole``: the piece is the entire shard."""

    index: int
    shard: int
    t0: int
    t1: int
    raw_bytes: int
    whole: bool


# ---------------------------------------------------------------------------------------
# inputs


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _split_dataset(item: str) -> tuple[str, str | None]:
    """``run.h5:/entry/data`` -> ("run.h5", "/entry/data") when the whole is not a path."""
    if os.path.exists(item) or ":/" not in item:
        return item, None
    path, _, ds = item.rpartition(":/")
    return path, "/" + ds


def _dir_members(path: str) -> list[str] | None:
    """The stack files of a directory of stacks, or None for a folder of frames."""
    names = sorted(os.listdir(path))
    if any(n.lower().endswith(FRAME_EXT) for n in names):
        return None
    found = [os.path.join(path, n) for n in names
             if n.lower().endswith(STACK_EXT) and os.path.isfile(os.path.join(path, n))]
    if not found:
        raise InputError(f"{path} holds neither frame images ({', '.join(FRAME_EXT)}) nor "
                         f"stack files ({', '.join(STACK_EXT)})")
    return found


def expand_inputs(inputs: Iterable[str], dataset: str | None = None) -> list[Source]:
    """Files, quoted globs (sorted), folders (a folder of frames is one stack; a folder of
    stack files gives each, sorted) and ``FILE.h5:/dataset``, in the order given, without
    repeats. ``dataset`` applies to HDF5 inputs that do not name their own."""
    out: list[Source] = []
    seen: set[tuple[str, str | None]] = set()
    for item in inputs:
        path, ds = _split_dataset(item)
        if _has_magic(path) and not os.path.exists(path):
            paths = sorted(glob.glob(path, recursive=True))
            if not paths:
                raise InputError(f"no file matches {path}")
        elif not os.path.exists(path):
            raise InputError(f"no such file or directory: {path}")
        else:
            paths = [path]
        for p in paths:
            members = _dir_members(p) if os.path.isdir(p) else None
            for m in members if members is not None else [p]:
                fmt = io.detect_format(m)
                use = ds if ds is not None else (dataset if fmt == "hdf5" else None)
                if ds is not None and fmt != "hdf5":
                    raise OptionError(f"{item}: a dataset path applies to HDF5 files only")
                key = (os.path.realpath(m), use)
                if key not in seen:
                    seen.add(key)
                    out.append(Source(m, use))
    return out


def identity(path: str) -> tuple[Any, ...]:
    """Size and modification time of a file (count, size, newest mtime of a folder)."""
    st = os.stat(path)
    if not os.path.isdir(path):
        return (st.st_size, st.st_mtime_ns)
    n = size = mtime = 0
    for e in os.scandir(path):
        if e.is_file():
            s = e.stat()
            n, size, mtime = n + 1, size + s.st_size, max(mtime, s.st_mtime_ns)
    return (n, size, mtime)


def disk_bytes(path: str) -> int:
    """Bytes on disk (0 if unreadable: the scan then reports the problem)."""
    try:
        if os.path.isdir(path):
            return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        return os.path.getsize(path)
    except OSError:
        return 0


# ---------------------------------------------------------------------------------------
# scan


def effective_window(codec: CodecConfig, shape: tuple[int, ...]) -> int:
    return window_length(codec.window, math.prod(shape[1:]))


class _Counter:
    """A write-only file that only counts bytes."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, b: bytes) -> int:
        self.n += len(b)
        return len(b)


def scan_source(src: Source, codec: CodecConfig, target_bytes: int) -> SourceInfo:
    """Open one source: layout, identity and (if it needs more than one shard) the ratio
    of its first window as an estimate for the whole."""
    with io.open_input(src.path, dataset=src.dataset) as stack:
        shape = tuple(int(s) for s in stack.shape)
        dtype = np.dtype(stack.dtype)
        check_stack(shape, dtype)
        meta = stack.metadata or {}
        ratio = 1.0
        if math.prod(shape) * dtype.itemsize > target_bytes:
            n = min(shape[0], max(2, effective_window(codec, shape)))
            sample = ArrayStack(stack.read(0, n))
            # classical predictors: a cheap estimate, and no model needed yet (--adapt)
            opts = replace(codec.options(), predictor="classical", model=None)
            stats = compress_stack(sample, None, opts, fileobj=_Counter())
            ratio = min(MAX_EST_RATIO, max(1.0, stats.ratio))
    return SourceInfo(shape, dtype.name, meta.get("dataset") if meta.get("format") == "hdf5"
                      else None, identity(src.path), ratio)


# ---------------------------------------------------------------------------------------
# plan


def _cuts(t: int, wlen: int, n: int, frame_values: int = 1) -> list[int]:
    """Frame numbers cutting ``t`` frames into ``n`` runs of whole windows (dealt out
    evenly) where no run is a single frame. The windows are those a stack of ``t`` frames
    is coded in (``windows.coded_windows``), so that each run, coded on its own, has the
    same windows as in the whole."""
    starts = [a for a, _ in coded_windows(t, wlen, frame_values)] + [t]
    n_windows = len(starts) - 1
    n = max(1, min(n, n_windows))
    cuts = [starts[i * n_windows // n] for i in range(n + 1)]
    # a run of one frame (windows of one frame, --window 1 or frames of 2^26 values and
    # more) joins the run after it, a last one the run before: a stack of one frame is
    # not a stack, and a piece of one frame could not be coded
    out = [cuts[0]]
    for c in cuts[1:-1]:
        if c - out[-1] >= 2:
            out.append(c)
    out.append(cuts[-1])
    if len(out) > 2 and out[-1] - out[-2] < 2:
        del out[-2]
    return out


def plan_shards(infos: list[SourceInfo], codec: CodecConfig, target_bytes: int) -> list[Shard]:
    """Shards in global order: sources in input order, each cut into consecutive runs of
    whole windows. A source gets ceil(estimated compressed size / target) shards (at least
    one) and its windows are dealt out evenly, so the shards of a source differ by at most
    one window; every shard holds at least two frames (a stack of one frame is not a
    stack). Depends only on the inputs and options, never on the number of ranks."""
    shards: list[Shard] = []
    for s, info in enumerate(infos):
        t = info.shape[0]
        est = t * info.frame_bytes / info.est_ratio
        n = max(1, min(t // 2, math.ceil(est / target_bytes)))
        cuts = _cuts(t, effective_window(codec, info.shape), n, info.frame_values)
        for a, b in zip(cuts, cuts[1:], strict=False):
            shards.append(Shard(len(shards), s, a, b, (b - a) * info.frame_bytes))
    return shards


def piece_bytes(total_raw: int, ranks: int, per_rank: int) -> int:
    """The raw size pieces are cut to: ``per_rank`` pieces per rank over the whole data
    set (a function of the data set and the number of ranks, not of what is left to do,
    so a resumed run cuts the same pieces)."""
    return max(1, total_raw // max(1, ranks * per_rank))


def plan_pieces(shards: list[Shard], infos: list[SourceInfo], codec: CodecConfig,
                size: int) -> list[Piece]:
    """Each shard cut into ceil(raw / size) runs of whole windows (one piece, the whole
    shard, when it is not larger than ``size``), numbered in shard order."""
    pieces: list[Piece] = []
    for sh in shards:
        info = infos[sh.source]
        n = max(1, math.ceil(sh.raw_bytes / size))
        cuts = [sh.t0 + c for c in _cuts(sh.frames, effective_window(codec, info.shape), n,
                                          info.frame_values)]
        whole = len(cuts) == 2
        for a, b in zip(cuts, cuts[1:], strict=False):
            pieces.append(Piece(len(pieces), sh.index, a, b, (b - a) * info.frame_bytes, whole))
    return pieces


def assign(weights: list[int], size: int) -> list[int]:
    """Rank of each item: largest first onto the least-loaded rank (ties: lower index,
    lower rank). Deterministic."""
    heap = [(0, r) for r in range(size)]
    owner = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, r = heapq.heappop(heap)
        owner[i] = r
        heapq.heappush(heap, (load + weights[i], r))
    return owner
