"""Torch datasets over a ``tezip prepare`` data set, decoding shards in the DataLoader's
workers. Importing this module imports torch; ``import tezip`` does not.

::

    from tezip.dataset import TezDataset, TezShardStream
    ds = TezDataset("dataset_dir", clip=8)                                # random access
    stream = TezShardStream("dataset_dir", clip=8, shuffle=1000, seed=0,  # streaming
                            batch_size=16)
    loader = torch.utils.data.DataLoader(stream, batch_size=16, num_workers=4)
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        for batch in loader: ...

Samples
    A sample is a clip of ``clip`` consecutive frames of one shard, a tensor of shape
    ``(clip, H, W[, C])``; with ``clip=None`` it is one frame, ``(H, W[, C])``. Clips start
    every ``stride`` frames (default: ``clip``) and never cross a shard boundary. Sample
    ``k`` is the same clip in both datasets (``locate(k)`` says where it comes from).
    ``root`` is a data set directory, or a ``Manifest`` (``manifest.from_stacks`` makes
    one of raw ``.npy`` stacks, so that a baseline reads the same samples).

Frame shapes
    Stacks of different frame shapes make samples of different shapes, which one batch
    cannot hold. ``crop=(h, w)`` (or ``"min"``: the smallest height and width in the data
    set) cuts every sample to ``h x w`` at a random place, the same for a sample id,
    seed and epoch in every process. Without a crop the stream groups its order by frame
    shape (``group_by_shape``, on by default when shapes differ; see ``order``) so that
    every batch holds one shape; for the map-style dataset ``ShapeBatchSampler`` makes
    one-shape batches.

Values
    Native dtype, except uint16 which becomes int32 (exact). ``normalize=True`` gives
    float32 ``(x - lo) / (hi - lo)`` with one ``(lo, hi)`` for the data set: the union of
    the value ranges the shards' headers record (``codec.value_range`` of raw shards), or
    the dtype's range for integer shards that record none; ``normalize=(lo, hi)`` sets it.
    ``transform`` is then applied to the tensor.

Node-local staging
    ``cache_dir=`` stages each shard on first use (``cache.ShardCache``); ``reader=``
    replaces ``open(path, "rb")`` for those copies. The stream stages the next
    ``prefetch`` shards of its plan in a background thread while it decodes. Without
    ``cache_dir`` shards are opened in place and only the windows needed are read.

Processes and threads
    Every process opens its own file handles, lazily (datasets pickle and fork without
    them). Inside DataLoader workers the datasets set ``torch.set_num_threads(threads)``
    (default 1) before the first decode.

The stream's order and what it guarantees are in ``tezip.dataset.order``: one global
order for any number of ranks and workers, the same number of samples on every rank,
disjoint ranks, resumption with ``set_epoch(epoch, start=position)``, and with
``shuffle > 0`` an order mixed over the whole data set (units of a window permuted,
lanes shuffled in blocks), at the read costs stated there.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from ..codec import TezFile, value_range
from ..errors import CorruptFileError, InputError, OptionError, TezipError
from . import order as od
from .cache import ShardCache
from .manifest import Manifest, ShardInfo, load, model_path
from .readers import open_shard, window_starts

__all__ = ["ShapeBatchSampler", "TezDataset", "TezShardStream", "worker_init_fn"]

DEFAULT_WINDOW_CACHE = 256 << 20
DEFAULT_LANES = 128
_MAX_OPEN = 128
Crop = tuple[int, int] | str | None


def _torch_dtype_of(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.int32) if dtype == np.uint16 else dtype


def _int_range(dtype: np.dtype) -> tuple[float, float]:
    info = np.iinfo(dtype)
    return float(info.min), float(info.max)


def _check_int(name: str, v: Any, low: int) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < low:
        raise OptionError(f"{name} must be an integer >= {low}, got {v!r}")
    return int(v)


def worker_init_fn(worker_id: int, threads: int = 1) -> None:
    """A DataLoader ``worker_init_fn`` that sets the worker's torch threads (the datasets
    also do this themselves before their first decode)."""
    torch.set_num_threads(threads)


def _resolve_crop(crop: Crop, shards: tuple[ShardInfo, ...]) -> tuple[int, int] | None:
    if crop is None:
        return None
    if isinstance(crop, str):
        if crop != "min":
            raise OptionError(f"crop must be (height, width), 'min' or None, got {crop!r}")
        return (min(s.shape[1] for s in shards), min(s.shape[2] for s in shards))
    try:
        h, w = (int(v) for v in crop)
    except (TypeError, ValueError):
        raise OptionError(f"crop must be (height, width), 'min' or None, got {crop!r}") \
            from None
    if h < 1 or w < 1:
        raise OptionError(f"crop must be positive, got {crop!r}")
    small = [s for s in shards if s.shape[1] < h or s.shape[2] < w]
    if small:
        raise OptionError(f"crop {h}x{w} is larger than the frames of {small[0].file} "
                          f"({small[0].shape[1]}x{small[0].shape[2]}); the smallest frames "
                          f"are {min(s.shape[1] for s in shards)}x"
                          f"{min(s.shape[2] for s in shards)} (crop='min')")
    return (h, w)


# ---------------------------------------------------------------------------------------
# the part both datasets share


class _ShardData:
    """Manifest, samples, per-process shard handles, crops, conversion to tensors."""

    def __init__(self, root: str | os.PathLike | Manifest, clip: int | None,
                 stride: int | None, normalize: bool | tuple[float, float],
                 transform: Callable | None, cache_dir: str | os.PathLike | None,
                 cache_bytes: int, reader: Callable[[Path], BinaryIO] | None, threads: int,
                 model: str | os.PathLike | None, crop: Crop, seed: int) -> None:
        self.manifest = root if isinstance(root, Manifest) else load(root)
        self.root = self.manifest.root
        if model is None:       # the data set's own model (prepare --adapt), if any
            model = model_path(self.manifest)
        # read by the first shard a worker opens that needs it, then found by hash
        self.model = None if model is None else str(model)
        shards = self.manifest.shards
        if clip is not None and (not isinstance(clip, int) or clip < 1):
            raise OptionError(f"clip must be a positive number of frames or None, got {clip}")
        self.clip = clip
        length = clip or 1
        stride = length if stride is None else stride
        if not isinstance(stride, int) or stride < 1:
            raise OptionError(f"stride must be a positive number of frames, got {stride}")
        self.stride = stride
        self.threads = _check_int("threads", threads, 1)
        self.seed = _check_int("seed", seed, 0)
        self.samples = od.Samples(tuple(s.frames for s in shards), length, stride)
        if self.samples.n == 0:
            raise OptionError(f"clip={clip} is longer than every shard of {self.root} "
                              f"(longest: {max(s.frames for s in shards)} frames)")
        self.counts, self.starts = self.samples.counts, self.samples.starts
        self.frame_offsets = self.samples.frame_offsets
        self.crop = _resolve_crop(crop, shards)
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
        self.epoch = 0
        self.stats = {"staged_bytes": 0, "windows_decoded": 0, "decoded_bytes": 0,
                      "decode_seconds": 0.0}
        self._stats_lock = threading.Lock()
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
        del state["_stats_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._stats_lock = threading.Lock()

    def _count(self, key: str, n: float) -> None:
        with self._stats_lock:
            self.stats[key] += n

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

    def set_epoch(self, epoch: int) -> None:
        """The epoch the random crops (and the stream's order) are drawn for."""
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise OptionError(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)

    # shards -----------------------------------------------------------------------------

    def _handle(self, s: int) -> Any:
        h = self._handles.get(s)
        if h is not None:
            self._handles.move_to_end(s)
            return h
        info = self.manifest.shards[s]
        for attempt in range(3):
            if self.cache is not None:
                path, n = self.cache.stage_counted(self.root, info)
                self._count("staged_bytes", n)
            else:
                path = self.root / info.file
            try:
                h = open_shard(path, self.manifest.window_request, self.model, self.threads)
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
        with self._stats_lock:
            self.stats["decode_seconds"] += time.perf_counter() - t
            self.stats["windows_decoded"] += 1
            self.stats["decoded_bytes"] += x.nbytes
        return int(self._wstarts[s][w]), x

    def __len__(self) -> int:
        return self.samples.n

    def locate(self, k: int) -> dict:
        """Where sample ``k`` comes from: shard file, first frame in the shard, source
        file and first frame in the source (when the manifest records them)."""
        s, t0 = self._locate(k)
        info = self.manifest.shards[s]
        src0 = info.source_frames[0] + t0 if info.source_frames else None
        return {"shard": info.file, "frame": t0, "frames": self.clip or 1,
                "source": info.source, "dataset": info.dataset, "source_frame": src0}

    def _locate(self, k: int) -> tuple[int, int]:
        s, t0 = self.samples.locate(np.array([k]))
        return int(s[0]), int(t0[0])

    def sample_shapes(self) -> np.ndarray:
        """The frame-shape class of every sample id (index into manifest.frame_shapes)."""
        shapes = self.manifest.frame_shapes
        cls = np.array([shapes.index(s.frame_shape) for s in self.manifest.shards], np.int64)
        return np.repeat(cls, self.samples.counts)

    # values -----------------------------------------------------------------------------

    def _dataset_range(self) -> tuple[float, float]:
        lo, hi = math.inf, -math.inf
        for info in self.manifest.shards:
            path = self.root / info.file
            dtype = np.dtype(info.dtype)
            if path.suffix == ".tez":
                with TezFile(path) as f:
                    vr = f.header.get("value_range") or [0.0, 0.0]
                r = (float(vr[0]), float(vr[1]))
                if r == (0.0, 0.0) and dtype.kind in "ui":
                    r = _int_range(dtype)
            else:
                h = open_shard(path, self.manifest.window_request, threads=self.threads)
                try:
                    r = value_range(h)
                finally:
                    h.close()
            lo, hi = min(lo, r[0]), max(hi, r[1])
        return (lo, hi) if lo <= hi else (0.0, 1.0)

    @property
    def value_range(self) -> tuple[float, float] | None:
        """The (lo, hi) that ``normalize`` maps to (0, 1); None without normalize."""
        return self._norm

    def _cropped(self, k: int, x: np.ndarray) -> np.ndarray:
        """``x`` (length, H, W[, C]) cut to the crop drawn for sample ``k``."""
        if self.crop is None:
            return x
        h, w = self.crop
        if x.shape[1:3] == (h, w):
            return x
        y0, x0 = od.crop_offsets(self.seed, self.epoch, np.array([k]), x.shape[1:3],
                                 self.crop)[0]
        return np.ascontiguousarray(x[:, y0:y0 + h, x0:x0 + w])

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

    def _sample(self, k: int, x: np.ndarray) -> torch.Tensor:
        """Frames (length, ...) of sample ``k`` -> the sample's tensor."""
        x = self._cropped(k, x)
        return self._to_tensor(x if self.clip is not None else x[0])


# ---------------------------------------------------------------------------------------
# map-style


class TezDataset(_ShardData, Dataset):
    """Map-style: ``ds[k]`` is sample ``k``, decoded from only the windows that hold it.
    Each process keeps an LRU cache of decoded windows of at most ``window_cache_bytes``,
    so reading consecutive clips decodes each window once. Works with any sampler, e.g.
    ``DistributedSampler``, or ``ShapeBatchSampler`` for data sets of several frame
    shapes. Random crops depend on ``seed`` and the epoch (``set_epoch``)."""

    def __init__(self, root: str | os.PathLike | Manifest, clip: int | None = None, *,
                 stride: int | None = None, normalize: bool | tuple[float, float] = False,
                 transform: Callable | None = None, crop: Crop = None, seed: int = 0,
                 cache_dir: str | os.PathLike | None = None, cache_bytes: int = 64 << 30,
                 reader: Callable[[Path], BinaryIO] | None = None,
                 window_cache_bytes: int = DEFAULT_WINDOW_CACHE, threads: int = 1,
                 model: str | os.PathLike | None = None) -> None:
        super().__init__(root, clip, stride, normalize, transform, cache_dir, cache_bytes,
                         reader, threads, model, crop, seed)
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
        """Sample ``k`` as a numpy array in the shards' dtype, (clip, H, W[, C]),
        uncropped."""
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
        k = int(k)
        x = self.frames(k)
        return self._sample(k % len(self), x)


class ShapeBatchSampler(Sampler[list[int]]):
    """Batches of one frame shape for a map-style dataset, split over ranks: per shape
    the sample ids (shuffled with ``seed`` and the epoch) are cut into batches (a short
    last batch filled with ids of the same shape, or dropped), all batches shuffled, and
    their number made a multiple of ``num_replicas`` (wrapping, or dropping), so every
    rank gets the same number of batches. Use as ``DataLoader(ds, batch_sampler=...)``;
    call ``set_epoch`` like DistributedSampler's."""

    def __init__(self, dataset: TezDataset, batch_size: int, *, num_replicas: int = 1,
                 rank: int = 0, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False) -> None:
        self.batch_size = _check_int("batch_size", batch_size, 1)
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise OptionError(f"rank {rank} is not in a world of {num_replicas}")
        self.classes = dataset.sample_shapes()
        self.world, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _batches(self) -> list[np.ndarray]:
        return od.shape_batches(self.classes, self.batch_size, self.seed, self.epoch,
                                self.world, self.rank, self.drop_last, self.shuffle)

    def __iter__(self) -> Iterator[list[int]]:
        return iter([b.tolist() for b in self._batches()])

    def __len__(self) -> int:
        return len(self._batches())


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


class TezShardStream(_ShardData, IterableDataset):
    """Iterable: every rank and DataLoader worker streams its part of one global sample
    order (``tezip.dataset.order``), reading windows as its samples need them and
    keeping decoded frames until their last use. Call ``set_epoch(e)`` before each
    epoch. ``rank``/``world_size`` default to torch.distributed's (when initialized
    before the stream is built), else to the ``RANK``/``WORLD_SIZE`` variables torchrun
    sets, else 0/1. ``batch_size`` should be the DataLoader's (exact order with several
    workers; one-shape batches when grouping by shape). ``with_index=True`` yields
    ``(sample id, tensor)`` pairs.

    ``shuffle=N``: with N > 0 units (the samples of one window, ``unit="window"``, or of
    one shard, ``unit="shard"``) are permuted over the whole data set and each of the
    ``lanes`` lanes is shuffled in blocks of ``ceil(N / lanes)`` samples.
    ``group_by_shape``: None (default) groups when the frames have several shapes and no
    ``crop`` is given; it needs ``batch_size x world_size`` to divide ``lanes``."""

    def __init__(self, root: str | os.PathLike | Manifest, clip: int | None = None, *,
                 stride: int | None = None, shuffle: int = 0, seed: int = 0,
                 lanes: int = DEFAULT_LANES, unit: od.Unit = "window",
                 batch_size: int = 1, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None,
                 crop: Crop = None, group_by_shape: bool | None = None,
                 normalize: bool | tuple[float, float] = False,
                 transform: Callable | None = None, with_index: bool = False,
                 cache_dir: str | os.PathLike | None = None, cache_bytes: int = 64 << 30,
                 reader: Callable[[Path], BinaryIO] | None = None, threads: int = 1,
                 prefetch: int = 2, model: str | os.PathLike | None = None) -> None:
        super().__init__(root, clip, stride, normalize, transform, cache_dir, cache_bytes,
                         reader, threads, model, crop, seed)
        self.shuffle = _check_int("shuffle", shuffle, 0)
        self.lanes = _check_int("lanes", lanes, 1)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.prefetch = _check_int("prefetch", prefetch, 0)
        self.drop_last, self.with_index = drop_last, with_index
        self.rank, self.world_size = _resolve_layout(rank, world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise OptionError(f"rank {self.rank} is not in a world of {self.world_size}")
        shapes = self.manifest.frame_shapes
        several = len(shapes) > 1 and self.crop is None
        group = several if group_by_shape is None else bool(group_by_shape) and several
        if group and self.lanes % (self.batch_size * self.world_size):
            names = ", ".join("x".join(map(str, s)) for s in shapes)
            raise OptionError(
                f"{self.root}: frames of {len(shapes)} shapes ({names}); to group batches "
                f"by shape, lanes ({self.lanes}) must be a multiple of batch_size x "
                f"world_size ({self.batch_size} x {self.world_size}); or pass crop=(h, w) "
                "or crop='min' for random crops to one size")
        self.group_by_shape = group
        if self.lanes % (self.batch_size * self.world_size):
            warnings.warn(
                f"lanes ({self.lanes}) is not a multiple of batch_size x world_size "
                f"({self.batch_size} x {self.world_size}): the order is the same, but ranks "
                "decode some windows several times (read_cost() counts them); a multiple of "
                "world_size x num_workers x batch_size reads each window once",
                stacklevel=2)
        if unit not in ("window", "shard"):
            raise OptionError(f"unit must be 'window' or 'shard', got {unit!r}")
        self.unit = unit
        cls = np.array([shapes.index(s.frame_shape) for s in self.manifest.shards], np.int64)
        self.order = od.GlobalOrder(
            self.samples, od.OrderSpec(self.shuffle, self.seed, self.lanes, unit,
                                       self.manifest.window, group,
                                       self._shard_units()), cls)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use the order of ``epoch`` from the next ``iter()`` on, beginning at position
        ``start`` of the global order (to resume part way through an epoch; with
        grouping by shape, a multiple of batch_size x world_size)."""
        super().set_epoch(epoch)
        if not isinstance(start, (int, np.integer)) or start < 0:
            raise OptionError(f"start must be >= 0, got {start}")
        if self.group_by_shape and start % (self.batch_size * self.world_size):
            raise OptionError(f"start {start} is not a multiple of batch_size x world_size "
                              f"({self.batch_size * self.world_size}); batches grouped by "
                              "shape resume at a batch boundary")
        self.start = int(start)

    def num_samples(self) -> int:
        """Positions of ``G`` in an epoch (``N``; grouped by shape: with the padding)."""
        return self.order.num_samples()

    def total(self) -> int:
        """Samples this epoch (from ``start`` on) over all ranks, after padding or
        dropping."""
        return od.total(self.num_samples(), self.world_size, self.drop_last, self.start)

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return self.total() // self.world_size

    def layout(self, rank: int | None = None, worker: int = 0, workers: int = 1) -> od.Layout:
        r = self.rank if rank is None else rank
        if not 0 <= r < self.world_size or not 0 <= worker < workers:
            raise OptionError(f"no worker {worker} of {workers} on rank {r} of "
                              f"{self.world_size}")
        return od.Layout(self.world_size, r, workers, worker, self.batch_size,
                         self.drop_last, self.start)

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """``G`` from ``start`` on, after padding or dropping for this world size: the
        sample ids of the (rest of the) epoch; rank r's j-th sample is
        ``global_order()[j * world_size + r]``."""
        e = self.epoch if epoch is None else epoch
        return self.order.ids_at(e, self.start + np.arange(self.total(), dtype=np.int64))

    def consumer_order(self, rank: int | None = None, worker: int = 0, workers: int = 1,
                       epoch: int | None = None) -> np.ndarray:
        """The sample ids that ``rank``'s worker ``worker`` (of ``workers``) yields."""
        e = self.epoch if epoch is None else epoch
        return od.consumer_ids(self.order, e, self.layout(rank, worker, workers))

    def _shard_units(self) -> tuple[int, ...]:
        """Each shard's unit of the order (its window), where they differ: automatic
        windows of frames of different sizes (else every shard's is the data set's)."""
        units = self.manifest.shard_windows
        return units if len(set(units)) > 1 else ()

    def read_cost(self, workers: int = 1, epoch: int | None = None) -> od.ReadCost:
        """Window decodes per epoch for this world size and ``workers`` per rank."""
        e = self.epoch if epoch is None else epoch
        starts = [window_starts(sh.file, sh.frames, sh.frame_shape,
                                self.manifest.window_request)
                  for sh in self.manifest.shards]
        return od.read_cost(self.order, e, self.manifest.window, self.world_size, workers,
                            self.batch_size, starts)

    # reading ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        self._check_process()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self._produce(self.consumer_order(self.rank, worker, workers, self.epoch))

    def _produce(self, ids: np.ndarray) -> Iterator[Any]:
        length = self.clip or 1
        shard, t0 = self.samples.locate(ids)
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
            x = np.stack(frames)
            del frames
            t = self._sample(int(ids[k]), x)
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
            data._count("staged_bytes", n)
