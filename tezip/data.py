"""Torch datasets that read a ``tezip prepare`` data set and decode shards in the loader.

Reading shards that are several times smaller than the raw frames, and decoding them in
the DataLoader's worker processes, moves the bottleneck of training on a shared parallel
file system from storage to CPU. Importing this module imports torch; ``import tezip``
does not.

::

    from tezip.data import TezDataset, TezShardStream
    ds = TezDataset("dataset_dir", clip=8)                                # random access
    stream = TezShardStream("dataset_dir", clip=8, shuffle=1000, seed=0,  # streaming
                            batch_size=16)
    loader = torch.utils.data.DataLoader(stream, batch_size=16, num_workers=4)
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        for batch in loader: ...

Samples
    A sample is a clip of ``clip`` consecutive frames of one shard, a tensor of shape
    ``(clip, H, W[, C])``; with ``clip=None`` it is one frame, shape ``(H, W[, C])``.
    Clips start every ``stride`` frames (default: ``clip``, so that an epoch sees every
    frame once) and never cross a shard boundary (consecutive shards may be different
    runs). Sample ``k`` is the same clip in both datasets: shards in manifest order, clips
    in frame order (``TezDataset.locate(k)`` says where it comes from).

Values
    Native dtype, except uint16 which becomes int32 (torch's uint16 lacks most
    operations; the widening is exact). ``normalize=True`` gives float32
    ``(x - lo) / (hi - lo)`` with one ``(lo, hi)`` for the whole data set: the union of
    the value ranges the shards' headers record, or the dtype's range for integer shards
    that record none (``normalize=(lo, hi)`` sets it; True reads each shard's header once,
    in the constructor). ``transform`` is then applied to the tensor.

Node-local staging
    ``cache_dir=`` copies each shard, on its first use on this node, from the data set
    directory (shared storage) to ``cache_dir`` in one sequential read, checks its size
    and sha256 against the manifest (a mismatch raises ``CorruptFileError`` and nothing
    is kept) and later reads it there. Entries are named by their sha256, written under
    a temporary name and renamed, shared by every process on the node (file locks), and
    evicted least-recently-used when their total exceeds ``cache_bytes``. ``reader=``
    replaces ``open(path, "rb")`` for those copies (e.g. to throttle them). The stream
    stages the next ``prefetch`` shards of its plan in a background thread while it
    decodes. Without ``cache_dir`` shards are opened in place and only the windows needed
    are read.

Processes and threads
    Every process opens its own file handles, lazily (datasets pickle and fork without
    them). Inside DataLoader workers the datasets set ``torch.set_num_threads(threads)``
    (default 1) before the first decode, so that the workers' decoders, which matter for
    the learned predictor, do not compete for cores; the main process is left alone.

Ordering and equal counts of ``TezShardStream`` (what is guaranteed)
    For a data set, ``clip``/``stride``, ``shuffle``, ``lanes``, ``seed`` and ``epoch``
    (and the same tezip and numpy versions) the stream defines one global sequence ``G``
    of sample ids, the same for any number of ranks and workers:

    1. the shards are permuted (``shuffle > 0``; manifest order otherwise) and their
       clips concatenated in frame order: the sequence ``S`` of ``N`` samples;
    2. ``S`` is cut into ``lanes`` contiguous pieces whose lengths differ by at most one
       (earlier pieces longer); each piece goes through its own shuffle buffer of
       ``ceil(shuffle / lanes)`` samples (reservoir style: the buffer fills, then each
       new sample replaces a uniformly chosen one, which is emitted; the rest is emitted
       in random order at the end), seeded by ``(seed, epoch, lane)``;
    3. ``G[k * lanes + l]`` is the k-th sample out of lane ``l`` (round robin);
    4. equal counts: ``G`` is cut (``drop_last=True``) or extended by wrapping around to
       its start (the default) to ``n = world_size * floor`` (or ``ceil``)
       ``(N / world_size)``; every rank yields exactly ``n / world_size`` samples
       (``len(stream)``), so every rank runs the same number of batches and DDP does not
       hang on uneven shards. Only the wrapped or dropped tail depends on ``world_size``.

    Rank ``r`` yields ``G[j * world_size + r]`` for ``j = 0, 1, ...`` (DistributedSampler's
    convention), so the union over ranks is ``G`` exactly, nothing lost or doubled
    except the documented wrap-around. Worker ``w`` of ``W`` takes the rank's positions
    ``j`` with ``(j // batch_size) % W == w``; the DataLoader, which takes batches from
    its workers in turn, then rebuilds the rank's sequence exactly when it is given the
    same ``batch_size`` (with another batch size the multiset is the same, the order
    within groups of ``W * batch_size`` differs).

    Reads: every consumer (rank x worker) reads, in order, the lanes its positions fall
    in: contiguous runs of whole shards, window by window, each window read and decoded
    once per consumer and epoch. When ``lanes`` is a multiple of ``world_size *
    num_workers * batch_size`` each lane belongs to one consumer and the consumers read
    disjoint windows; otherwise the order and counts are the same but some windows are
    read by several consumers. A consumer holds about one window per lane it reads plus
    its share of the shuffle buffers (``shuffle / (world_size * workers)`` samples).

    Resuming, also on a different allocation: ``set_epoch(e, start=p)`` continues epoch
    ``e`` at position ``p`` of ``G`` (the samples consumed so far, e.g. steps done x
    global batch size); the remaining ``N - p`` positions are split and equalized over
    the new ``world_size`` as above.

    ``set_epoch`` takes effect in workers started after it: the DataLoader's default
    (``persistent_workers=False``) starts them at every ``iter(loader)``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from .codec import DEFAULT_WINDOW, TezFile
from .errors import CorruptFileError, FormatVersionError, InputError, OptionError, TezipError
from .windows import fixed_windows

__all__ = ["Manifest", "ShardInfo", "ShardCache", "TezDataset", "TezShardStream",
           "load_manifest", "worker_init_fn"]

MANIFEST = "manifest.json"
FORMAT = "tezip-dataset"
VERSION = 1
DEFAULT_WINDOW_CACHE = 256 << 20
DEFAULT_LANES = 128
_MAX_OPEN = 64


# ---------------------------------------------------------------------------------------
# manifest


@dataclass(frozen=True)
class ShardInfo:
    """One shard of the manifest: consecutive frames of one source stack."""

    file: str
    frames: int
    shape: tuple[int, ...]
    dtype: str
    bytes: int | None = None
    sha256: str | None = None
    source: str | None = None
    dataset: str | None = None
    source_frames: tuple[int, int] | None = None


@dataclass(frozen=True)
class Manifest:
    root: Path
    shards: tuple[ShardInfo, ...]
    codec: dict
    total_frames: int
    raw: dict

    @property
    def window(self) -> int:
        try:
            return max(1, int(self.codec.get("window") or DEFAULT_WINDOW))
        except (TypeError, ValueError):
            return DEFAULT_WINDOW


def load_manifest(root: str | os.PathLike) -> Manifest:
    """Read and check ``root/manifest.json``; problems raise a TezipError naming them."""
    root = Path(root)
    path = root / MANIFEST
    if not root.is_dir():
        raise InputError(f"{root}: no such data set directory")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{root} has no {MANIFEST}: write one with `tezip prepare` "
                         "(or it is still running)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptFileError(f"{path}: not a readable JSON manifest ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise InputError(f"{path} is not a tezip data set manifest")
    version = raw.get("version")
    if not isinstance(version, int) or version < 1:
        raise CorruptFileError(f"{path}: bad manifest version {version!r}")
    if version > VERSION:
        raise FormatVersionError(f"{path} has manifest version {version}; this tezip reads "
                                 f"up to version {VERSION}: upgrade tezip")
    entries = raw.get("shards")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path} lists no shards")
    shards = []
    for i, e in enumerate(entries):
        try:
            file = str(e["file"])
            shape = tuple(int(s) for s in e["shape"])
            frames = int(e.get("frames", shape[0]))
            dtype = np.dtype(e["dtype"]).name
            sf = e.get("source_frames")
            info = ShardInfo(
                file, frames, shape, dtype,
                int(e["bytes"]) if e.get("bytes") is not None else None,
                str(e["sha256"]) if e.get("sha256") else None,
                str(e["source"]) if e.get("source") is not None else None,
                str(e["dataset"]) if e.get("dataset") is not None else None,
                (int(sf[0]), int(sf[1])) if sf is not None else None)
        except (KeyError, TypeError, ValueError, IndexError, OverflowError):
            raise CorruptFileError(f"{path}: shard entry {i} is malformed") from None
        if (Path(file).name != file or file in ("", ".", "..") or len(shape) not in (3, 4)
                or frames != shape[0] or min(shape) < 1):
            raise CorruptFileError(f"{path}: shard entry {i} ({file!r}) is malformed")
        shards.append(info)
    codec = raw.get("codec") if isinstance(raw.get("codec"), dict) else {}
    return Manifest(root, tuple(shards), codec, sum(s.frames for s in shards), raw)


# ---------------------------------------------------------------------------------------
# node-local staging


def _default_reader(path: Path) -> BinaryIO:
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _touch(path: Path) -> None:
    """Mark as used now, with the clock's full resolution (file times set by the kernel
    are coarser, which would make the LRU order of quick successive uses arbitrary)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


class ShardCache:
    """A size-bounded directory of shard copies on node-local disk, shared by every
    process of the node, evicting the least recently used (by last staging or open)."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int,
                 reader: Callable[[Path], BinaryIO] | None = None) -> None:
        if max_bytes <= 0:
            raise OptionError(f"cache_bytes must be positive, got {max_bytes}")
        self.dir = Path(directory)
        self.max_bytes = int(max_bytes)
        self.reader = reader or _default_reader
        self.staged_bytes = 0          # read from shared storage by this process
        self._count_lock = threading.Lock()
        try:
            (self.dir / ".locks").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OptionError(f"cache_dir {self.dir}: cannot create it ({exc.strerror})") \
                from None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_count_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._count_lock = threading.Lock()

    @staticmethod
    def entry_name(shard: ShardInfo, root: Path) -> str:
        if shard.sha256:
            return shard.sha256.lower() + Path(shard.file).suffix
        key = hashlib.sha256(f"{root.resolve()}/{shard.file}".encode()).hexdigest()[:32]
        return f"unverified-{key}{Path(shard.file).suffix}"

    def entries(self) -> list[Path]:
        return [p for p in self.dir.iterdir() if p.is_file() and not p.name.startswith(".")]

    def total_bytes(self) -> int:
        total = 0
        for p in self.entries():
            with contextlib.suppress(FileNotFoundError):
                total += p.stat().st_size
        return total

    def stage(self, root: Path, shard: ShardInfo) -> Path:
        """The local copy of ``shard`` (copied now if missing); marks it recently used."""
        return self.stage_counted(root, shard)[0]

    def stage_counted(self, root: Path, shard: ShardInfo) -> tuple[Path, int]:
        """``stage`` and the number of bytes this call read from shared storage."""
        name = self.entry_name(shard, root)
        dst = self.dir / name
        with _locked(self.dir / ".locks" / name):
            if dst.exists():
                with contextlib.suppress(FileNotFoundError):
                    _touch(dst)
                    return dst, 0
            n = self._copy(root / shard.file, dst, shard)
            _touch(dst)
        with self._count_lock:
            self.staged_bytes += n
        with _locked(self.dir / ".locks" / ".evict"):
            self._evict(keep=dst)
        return dst, n

    def _copy(self, src: Path, dst: Path, shard: ShardInfo) -> int:
        h = hashlib.sha256()
        n = 0
        fd, tmp = tempfile.mkstemp(prefix=".stage-", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    f = self.reader(src)
                except FileNotFoundError:
                    raise InputError(f"{src}: shard listed in the manifest is missing") from None
                except OSError as exc:
                    raise InputError(f"{src}: cannot open ({exc.strerror})") from None
                with f:
                    while block := f.read(1 << 22):
                        h.update(block)
                        out.write(block)
                        n += len(block)
            if shard.bytes is not None and n != shard.bytes:
                raise CorruptFileError(f"{src}: {n} bytes, the manifest says {shard.bytes}; the "
                                       "shard is truncated or was rewritten after the manifest")
            if shard.sha256 and h.hexdigest() != shard.sha256.lower():
                raise CorruptFileError(f"{src}: sha256 does not match the manifest; the shard "
                                       "on shared storage is damaged or was rewritten")
            os.replace(tmp, dst)
            return n
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _evict(self, keep: Path | None = None) -> None:
        items = []
        for p in self.entries():
            with contextlib.suppress(FileNotFoundError):
                st = p.stat()
                items.append((st.st_mtime_ns, p.name, p, st.st_size))
        total = sum(i[3] for i in items)
        for _, _, p, size in sorted(items):
            if total <= self.max_bytes:
                break
            if p == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                p.unlink()   # processes that have it open keep reading it (POSIX)
            total -= size
        # temporary files of copies that died with their process
        now = time.time()
        for p in self.dir.glob(".stage-*"):
            with contextlib.suppress(FileNotFoundError):
                if now - p.stat().st_mtime > 3600:
                    p.unlink()


# ---------------------------------------------------------------------------------------
# shard readers


class _NpyShard:
    """A raw ``.npy`` shard behind the same interface as TezFile (for baselines)."""

    def __init__(self, path: Path, window: int) -> None:
        try:
            self._a = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except (OSError, ValueError) as exc:
            raise CorruptFileError(f"{path}: not a readable .npy file ({exc})") from None
        self.shape = tuple(self._a.shape)
        self.dtype = self._a.dtype.newbyteorder("=")
        self._windows = fixed_windows(self.shape[0], window) if self.shape else []

    def window_frames(self) -> list[tuple[int, int]]:
        return self._windows

    def decode_window(self, i: int) -> np.ndarray:
        t0, t1 = self._windows[i]
        return np.array(self._a[t0:t1], dtype=self.dtype)

    def close(self) -> None:
        self._a = None  # type: ignore[assignment]


def _torch_dtype_of(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.int32) if dtype == np.uint16 else dtype


def _int_range(dtype: np.dtype) -> tuple[float, float]:
    info = np.iinfo(dtype)
    return float(info.min), float(info.max)


def worker_init_fn(worker_id: int, threads: int = 1) -> None:
    """A DataLoader ``worker_init_fn`` that sets the worker's torch threads (the datasets
    also do this themselves before their first decode)."""
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------
# the part both datasets share


class _ShardData:
    """Manifest, sample index, per-process shard handles, conversion to tensors."""

    def __init__(self, root: str | os.PathLike, clip: int | None, stride: int | None,
                 normalize: bool | tuple[float, float], transform: Callable | None,
                 cache_dir: str | os.PathLike | None, cache_bytes: int,
                 reader: Callable[[Path], BinaryIO] | None, threads: int,
                 model: str | None = None) -> None:
        self.model = None if model is None else str(model)
        self.manifest = load_manifest(root)
        self.root = self.manifest.root
        if clip is not None and (not isinstance(clip, int) or clip < 1):
            raise OptionError(f"clip must be a positive number of frames or None, got {clip}")
        self.clip = clip
        length = clip or 1
        if stride is None:
            stride = length
        if not isinstance(stride, int) or stride < 1:
            raise OptionError(f"stride must be a positive number of frames, got {stride}")
        self.stride = stride
        if not isinstance(threads, int) or threads < 1:
            raise OptionError(f"threads must be a positive integer, got {threads}")
        self.threads = threads
        shards = self.manifest.shards
        self.counts = np.array([0 if s.frames < length else (s.frames - length) // stride + 1
                                for s in shards], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.frame_offsets = np.concatenate(
            [[0], np.cumsum([s.frames for s in shards])]).astype(np.int64)
        if self.starts[-1] == 0:
            raise OptionError(f"clip={clip} is longer than every shard of {self.root} "
                              f"(longest: {max(s.frames for s in shards)} frames)")
        self.transform = transform
        self.cache = (ShardCache(cache_dir, cache_bytes, reader)
                      if cache_dir is not None else None)
        self._norm: tuple[float, float] | None = None
        if normalize is True:
            self._norm = self._dataset_range()
        elif normalize is not False and normalize is not None:
            try:
                lo, hi = (float(v) for v in normalize)  # type: ignore[union-attr]
            except (TypeError, ValueError):
                raise OptionError("normalize must be True, False or (lo, hi)") from None
            self._norm = (lo, hi)
        self.stats = {"staged_bytes": 0, "windows_decoded": 0, "decoded_bytes": 0,
                      "decode_seconds": 0.0}
        self._reset()

    # per-process state ------------------------------------------------------------------

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._handles: OrderedDict[int, Any] = OrderedDict()
        self._wstarts: dict[int, np.ndarray] = {}
        self._threads_set = False

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for k in ("_handles", "_wstarts"):
            state[k] = type(state[k])()
        state["_pid"] = None
        state["_threads_set"] = False
        return state

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            # inherited through fork: the parent's handles share file offsets with it
            self._reset()
        if not self._threads_set:
            if get_worker_info() is not None:
                torch.set_num_threads(self.threads)
            self._threads_set = True

    def close(self) -> None:
        """Close this process's shard files (they reopen on demand)."""
        if self._pid == os.getpid():
            for h in self._handles.values():
                with contextlib.suppress(Exception):
                    h.close()
        self._reset()

    # shards -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _open_path(self, path: Path, info: ShardInfo) -> Any:
        if path.suffix == ".npy":
            return _NpyShard(path, self.manifest.window)
        return TezFile(path, model=self.model)

    def _handle(self, s: int) -> Any:
        h = self._handles.get(s)
        if h is not None:
            self._handles.move_to_end(s)
            return h
        info = self.manifest.shards[s]
        for attempt in range(3):
            if self.cache is not None:
                path, n = self.cache.stage_counted(self.root, info)
                with self.cache._count_lock:
                    self.stats["staged_bytes"] += n
            else:
                path = self.root / info.file
            try:
                h = self._open_path(path, info)
                break
            except InputError:
                # evicted by another process between staging and opening: stage again
                if self.cache is not None and attempt < 2 and not path.exists():
                    continue
                raise
        if tuple(h.shape) != info.shape or np.dtype(h.dtype).name != info.dtype:
            h.close()
            raise CorruptFileError(
                f"{self.root / info.file}: holds {np.dtype(h.dtype).name} {tuple(h.shape)}, "
                f"the manifest says {info.dtype} {info.shape}")
        self._handles[s] = h
        self._wstarts[s] = np.array([a for a, _ in h.window_frames()], np.int64)
        while len(self._handles) > _MAX_OPEN:
            _, old = self._handles.popitem(last=False)
            old.close()
        return h

    def _window_of(self, s: int, t: int) -> int:
        self._handle(s)      # opens the shard (and learns its windows) if needed
        return int(np.searchsorted(self._wstarts[s], t, side="right") - 1)

    def _decode(self, s: int, w: int) -> tuple[int, np.ndarray]:
        """Window ``w`` of shard ``s``: (first frame, frames)."""
        h = self._handle(s)
        t = time.perf_counter()
        try:
            x = h.decode_window(w)
        except TezipError as exc:
            raise type(exc)(f"{exc} (shard {self.manifest.shards[s].file} of "
                            f"{self.root})") from None
        self.stats["decode_seconds"] += time.perf_counter() - t
        self.stats["windows_decoded"] += 1
        self.stats["decoded_bytes"] += x.nbytes
        return int(self._wstarts[s][w]), x

    def locate(self, k: int) -> dict:
        """Where sample ``k`` comes from: shard file, first frame in the shard, source
        file and first frame in the source (when the manifest records them)."""
        s, t0 = self._locate(k)
        info = self.manifest.shards[s]
        src0 = info.source_frames[0] + t0 if info.source_frames else None
        return {"shard": info.file, "frame": t0, "frames": self.clip or 1,
                "source": info.source, "dataset": info.dataset, "source_frame": src0}

    def _locate(self, k: int) -> tuple[int, int]:
        s = int(np.searchsorted(self.starts, k, side="right") - 1)
        return s, int(k - self.starts[s]) * self.stride

    # values -----------------------------------------------------------------------------

    def _dataset_range(self) -> tuple[float, float]:
        lo, hi = math.inf, -math.inf
        for info in self.manifest.shards:
            path = self.root / info.file
            dtype = np.dtype(info.dtype)
            if path.suffix == ".npy":
                a = np.load(path, mmap_mode="r")
                fin = a[np.isfinite(a)] if dtype.kind == "f" else a
                r = (float(fin.min()), float(fin.max())) if fin.size else (0.0, 0.0)
            else:
                with TezFile(path) as f:
                    vr = f.header.get("value_range") or [0.0, 0.0]
                r = (float(vr[0]), float(vr[1]))
                if r == (0.0, 0.0) and dtype.kind in "ui":
                    r = _int_range(dtype)
            lo, hi = min(lo, r[0]), max(hi, r[1])
        return (lo, hi) if lo <= hi else (0.0, 1.0)

    @property
    def value_range(self) -> tuple[float, float] | None:
        """The (lo, hi) that ``normalize`` maps to (0, 1); None without normalize."""
        return self._norm

    def _to_tensor(self, x: np.ndarray) -> torch.Tensor:
        if self._norm is not None:
            lo, hi = self._norm
            scale = 1.0 / (hi - lo) if hi > lo else 1.0
            y = x.astype(np.float32)
            y -= np.float32(lo)
            y *= np.float32(scale)
            t = torch.from_numpy(y)
        else:
            target = _torch_dtype_of(x.dtype)
            t = torch.from_numpy(x.astype(target) if target != x.dtype else x)
        return self.transform(t) if self.transform is not None else t


# ---------------------------------------------------------------------------------------
# map-style


class TezDataset(_ShardData, Dataset):
    """Map-style: ``ds[k]`` is sample ``k`` (see the module docstring), decoded from only
    the windows that hold it. Each process keeps an LRU cache of decoded windows of at
    most ``window_cache_bytes``, so reading consecutive clips decodes each window once.
    Works with any sampler, e.g. ``DistributedSampler``."""

    def __init__(self, root: str | os.PathLike, clip: int | None = None, *,
                 stride: int | None = None, normalize: bool | tuple[float, float] = False,
                 transform: Callable | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_bytes: int = 64 << 30, reader: Callable[[Path], BinaryIO] | None = None,
                 window_cache_bytes: int = DEFAULT_WINDOW_CACHE, threads: int = 1,
                 model: str | os.PathLike | None = None) -> None:
        super().__init__(root, clip, stride, normalize, transform, cache_dir, cache_bytes,
                         reader, threads, model)
        self.window_cache_bytes = int(window_cache_bytes)

    def _reset(self) -> None:
        super()._reset()
        self._windows: OrderedDict[tuple[int, int], tuple[int, np.ndarray]] = OrderedDict()
        self._window_bytes = 0

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_windows"] = OrderedDict()
        state["_window_bytes"] = 0
        return state

    def _cached(self, s: int, w: int) -> tuple[int, np.ndarray]:
        key = (s, w)
        hit = self._windows.get(key)
        if hit is not None:
            self._windows.move_to_end(key)
            return hit
        hit = self._decode(s, w)
        self._windows[key] = hit
        self._window_bytes += hit[1].nbytes
        while self._window_bytes > self.window_cache_bytes and len(self._windows) > 1:
            _, (_, old) = self._windows.popitem(last=False)
            self._window_bytes -= old.nbytes
        return hit

    def frames(self, k: int) -> np.ndarray:
        """Sample ``k`` as a numpy array in the shards' dtype, (clip, H, W[, C])."""
        self._check_process()
        n = len(self)
        if not -n <= k < n:
            raise IndexError(f"sample {k} out of range for {n} samples")
        s, t0 = self._locate(k % n)
        length = self.clip or 1
        info = self.manifest.shards[s]
        out = np.empty((length, *info.shape[1:]), np.dtype(info.dtype))
        t = t0
        while t < t0 + length:
            a, x = self._cached(s, self._window_of(s, t))
            b = min(t0 + length, a + x.shape[0])
            out[t - t0:b - t0] = x[t - a:b - a]
            t = b
        return out

    def __getitem__(self, k: int) -> torch.Tensor:
        x = self.frames(int(k))
        return self._to_tensor(x if self.clip is not None else x[0])


# ---------------------------------------------------------------------------------------
# iterable


def _resolve_layout(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
    else:
        r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    return (r if rank is None else rank), (w if world_size is None else world_size)


def _reservoir(items: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """The order a shuffle buffer of ``size`` gives ``items``."""
    n = len(items)
    if size <= 1 or n <= 1:
        return items.copy()
    out = np.empty_like(items)
    buf = items[:size].copy()
    fill = len(buf)
    picks = rng.integers(0, fill, size=max(0, n - fill))
    for m in range(n - fill):
        j = picks[m]
        out[m] = buf[j]
        buf[j] = items[fill + m]
    out[n - fill:] = buf[rng.permutation(fill)]
    return out


class TezShardStream(_ShardData, IterableDataset):
    """Iterable: every rank and DataLoader worker streams its part of one global sample
    order (see the module docstring for exactly what is guaranteed), reading runs of
    whole shards window by window, through a shuffle buffer. Call ``set_epoch(e)`` before
    each epoch. ``rank``/``world_size`` default to torch.distributed's (when initialized
    before the stream is built), else to the ``RANK``/``WORLD_SIZE`` variables torchrun
    sets, else 0/1. ``batch_size`` should be the DataLoader's, for the exact order with
    several workers. ``with_index=True`` yields ``(sample id, tensor)`` pairs."""

    def __init__(self, root: str | os.PathLike, clip: int | None = None, *,
                 stride: int | None = None, shuffle: int = 0, seed: int = 0,
                 lanes: int = DEFAULT_LANES, batch_size: int = 1, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None,
                 normalize: bool | tuple[float, float] = False,
                 transform: Callable | None = None, with_index: bool = False,
                 cache_dir: str | os.PathLike | None = None, cache_bytes: int = 64 << 30,
                 reader: Callable[[Path], BinaryIO] | None = None, threads: int = 1,
                 prefetch: int = 2, model: str | os.PathLike | None = None) -> None:
        super().__init__(root, clip, stride, normalize, transform, cache_dir, cache_bytes,
                         reader, threads, model)
        for name, v, low in (("shuffle", shuffle, 0), ("seed", seed, 0), ("lanes", lanes, 1),
                             ("batch_size", batch_size, 1), ("prefetch", prefetch, 0)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < low:
                raise OptionError(f"{name} must be an integer >= {low}, got {v!r}")
        self.shuffle, self.seed, self.lanes = int(shuffle), int(seed), int(lanes)
        self.batch_size, self.drop_last, self.with_index = int(batch_size), drop_last, with_index
        self.prefetch = int(prefetch)
        self.rank, self.world_size = _resolve_layout(rank, world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise OptionError(f"rank {self.rank} is not in a world of {self.world_size}")
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use the order of ``epoch`` from the next ``iter()`` on, beginning at position
        ``start`` of the global order (to resume part way through an epoch)."""
        if epoch < 0 or start < 0:
            raise OptionError(f"epoch and start must be >= 0, got {epoch}, {start}")
        self.epoch, self.start = int(epoch), int(start)

    def total(self) -> int:
        """Samples this epoch (from ``start`` on) over all ranks, after padding or
        dropping."""
        n, w = max(0, self.num_samples() - self.start), self.world_size
        return w * (n // w if self.drop_last else -(-n // w))

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return self.total() // self.world_size

    def num_samples(self) -> int:
        """All distinct samples of an epoch (``N``)."""
        return int(self.starts[-1])

    # the order --------------------------------------------------------------------------

    def _sequence(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard order and the start of each shard's clips in ``S``."""
        n_shards = len(self.counts)
        order = np.arange(n_shards)
        if self.shuffle > 0:
            order = np.random.default_rng([self.seed, epoch, 0]).permutation(n_shards)
        pos = np.concatenate([[0], np.cumsum(self.counts[order])]).astype(np.int64)
        return order, pos

    def _s_range(self, order: np.ndarray, pos: np.ndarray, a: int, b: int) -> np.ndarray:
        """``S[a:b]``: sample ids."""
        out = []
        i = int(np.searchsorted(pos, a, side="right") - 1)
        while a < b:
            s = int(order[i])
            end = min(b, int(pos[i + 1]))
            base = int(self.starts[s]) - int(pos[i])
            out.append(np.arange(a + base, end + base, dtype=np.int64))
            a = end
            i += 1
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def _lane_orders(self, epoch: int, lanes: np.ndarray) -> dict[int, np.ndarray]:
        n, L = self.num_samples(), self.lanes
        q, r = divmod(n, L)
        order, pos = self._sequence(epoch)
        buf = -(-self.shuffle // L) if self.shuffle > 0 else 0
        out = {}
        for lane in lanes.tolist():
            a = lane * q + min(lane, r)
            items = self._s_range(order, pos, a, a + q + (lane < r))
            if buf > 1:
                items = _reservoir(items, buf, np.random.default_rng([self.seed, epoch, 1, lane]))
            out[lane] = items
        return out

    def _positions(self, rank: int, world: int, worker: int, workers: int) -> np.ndarray:
        """Positions in the padded/dropped ``G`` that a consumer yields, in order."""
        j = np.arange(self.total() // world, dtype=np.int64)
        if workers > 1:
            j = j[(j // self.batch_size) % workers == worker]
        return self.start + j * world + rank

    def _ids_at(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        n = self.num_samples()
        if positions.size == 0:
            return np.empty(0, np.int64)
        i = np.where(positions >= n, (positions - n) % n, positions)
        lane, k = i % self.lanes, i // self.lanes
        by_lane = np.argsort(lane, kind="stable")
        lanes, first = np.unique(lane[by_lane], return_index=True)
        orders = self._lane_orders(epoch, lanes)
        out = np.empty_like(i)
        for ln, a, b in zip(lanes.tolist(), first.tolist(), [*first[1:].tolist(), len(i)],
                            strict=True):
            sel = by_lane[a:b]
            out[sel] = orders[ln][k[sel]]
        return out

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """``G`` from ``start`` on, after padding or dropping for this world size: the
        sample ids of the (rest of the) epoch; rank r's j-th sample is
        ``global_order()[j * world_size + r]``."""
        e = self.epoch if epoch is None else epoch
        return self._ids_at(e, self.start + np.arange(self.total(), dtype=np.int64))

    def consumer_order(self, rank: int | None = None, worker: int = 0, workers: int = 1,
                       epoch: int | None = None) -> np.ndarray:
        """The sample ids that ``rank``'s worker ``worker`` (of ``workers``) yields."""
        e = self.epoch if epoch is None else epoch
        r = self.rank if rank is None else rank
        if not 0 <= r < self.world_size or not 0 <= worker < workers:
            raise OptionError(f"no worker {worker} of {workers} on rank {r} of "
                              f"{self.world_size}")
        return self._ids_at(e, self._positions(r, self.world_size, worker, workers))

    # reading ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        self._check_process()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        ids = self.consumer_order(self.rank, worker, workers, self.epoch)
        return self._produce(ids)

    def _produce(self, ids: np.ndarray) -> Iterator[Any]:
        length = self.clip or 1
        shard = np.searchsorted(self.starts, ids, side="right") - 1
        t0 = (ids - self.starts[shard]) * self.stride
        g0 = self.frame_offsets[shard] + t0
        # how often each frame is still needed by this consumer: windows are decoded
        # once, their needed frames kept until their last use
        need = np.zeros(int(self.frame_offsets[-1]) + 1, np.int32)
        np.add.at(need, g0, 1)
        np.add.at(need, g0 + length, -1)
        need = np.cumsum(need)
        store: dict[int, np.ndarray] = {}
        stager = (_Prefetcher(self, shard)
                  if self.cache is not None and self.prefetch else None)
        try:
            yield from self._emit(ids, shard, t0, g0, need, store, stager)
        finally:
            if stager is not None:
                stager.stop()

    def _emit(self, ids: np.ndarray, shard: np.ndarray, t0: np.ndarray, g0: np.ndarray,
              need: np.ndarray, store: dict[int, np.ndarray],
              stager: _Prefetcher | None) -> Iterator[Any]:
        length = self.clip or 1
        for k in range(len(ids)):
            s, a, g = int(shard[k]), int(t0[k]), int(g0[k])
            if stager is not None:
                stager.using(s)
            frames = []
            for d in range(length):
                if g + d not in store:
                    self._fill(s, a + d, need, store)
                frames.append(store[g + d])
                need[g + d] -= 1
                if need[g + d] == 0:
                    del store[g + d]
            x = np.stack(frames) if self.clip is not None else frames[0].copy()
            del frames
            t = self._to_tensor(x)
            yield (int(ids[k]), t) if self.with_index else t

    def _fill(self, s: int, t: int, need: np.ndarray, store: dict[int, np.ndarray]) -> None:
        a, x = self._decode(s, self._window_of(s, t))
        base = int(self.frame_offsets[s]) + a
        wanted = need[base:base + x.shape[0]] > 0
        keep_views = bool(wanted.all())
        for d in np.flatnonzero(wanted).tolist():
            if base + d not in store:
                store[base + d] = x[d] if keep_views else x[d].copy()


class _Prefetcher:
    """Stages the shards a stream consumer will open next, in plan order, at most
    ``prefetch`` ahead of the one it is reading, in a background thread. Failures are
    left to the consumer, which stages again and raises."""

    def __init__(self, data: TezShardStream, shard_of_sample: np.ndarray) -> None:
        _, first = np.unique(shard_of_sample, return_index=True)
        self._order = shard_of_sample[np.sort(first)].tolist()   # shards by first use
        self._rank = {s: i for i, s in enumerate(self._order)}
        self._data = data
        self._cur = 0
        self._done = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def using(self, s: int) -> None:
        i = self._rank[s]
        if i > self._cur:
            with self._cv:
                self._cur = i
                self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._done = True
            self._cv.notify()
        self._thread.join()

    def _run(self) -> None:
        data, cache = self._data, self._data.cache
        assert cache is not None
        for i, s in enumerate(self._order):
            with self._cv:
                while not self._done and i > self._cur + data.prefetch:
                    self._cv.wait()
                if self._done:
                    return
            if i <= self._cur:
                continue            # the consumer got there first
            try:
                n = cache.stage_counted(data.root, data.manifest.shards[s])[1]
            except Exception:
                return
            with cache._count_lock:
                data.stats["staged_bytes"] += n
