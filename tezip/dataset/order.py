"""The global sample order of a data set, and what reading it costs. numpy only.

Samples
    A sample is a clip of ``length`` consecutive frames of one shard, starting every
    ``stride`` frames, never crossing a shard boundary. Ids are consecutive: shards in
    manifest order, clips in frame order (the *natural order*).

The order of an epoch (``GlobalOrder``), for given samples, ``OrderSpec`` and epoch:

    1. Units: the samples are grouped into units of consecutive samples: those starting
       in the same ``unit_frames`` frames of a shard (``unit="window"``, the default; the
       data set's window, so a unit's samples share one or two decoded windows), or
       whole shards (``unit="shard"``).
    2. With ``shuffle > 0`` the units are permuted over the whole data set (seeded by
       ``seed`` and the epoch); without, they stay in natural order. Concatenated, their
       samples form the sequence ``S`` of ``N`` samples.
    3. ``S`` is cut into ``lanes`` contiguous pieces whose lengths differ by at most one
       (earlier ones longer). With ``shuffle > 0`` each lane is shuffled in blocks of
       ``ceil(shuffle / lanes)`` consecutive samples (a uniform permutation of each block).
    4. ``G[k * lanes + l]`` is the k-th sample of lane ``l`` (round robin).

    Grouped by frame shape (``group_by_shape``), steps 1-3 run per shape class, each
    class's lanes are padded to a whole number of rounds by repeating the class's first
    samples (fewer than ``lanes`` repeats per class and epoch), and the rounds of all
    classes are interleaved in a random order: every block ``G[k * lanes:(k + 1) *
    lanes]`` holds one frame shape, so a batch is one shape whenever ``batch_size x
    world_size`` divides ``lanes``.

Consumers (``Layout``)
    Equal counts: ``G`` is cut (``drop_last``) or extended by wrapping to its start to a
    multiple of ``world``; rank ``r`` yields ``G[start + j * world + r]``. Worker ``w`` of
    ``W`` takes the rank's positions ``j`` with ``(j // batch) % W == w``, so a DataLoader
    with the same batch size, which takes batches from its workers in turn, rebuilds the
    rank's sequence exactly. ``G`` does not depend on the layout; only the wrapped or
    dropped tail does.

Costs
    When ``lanes`` is a multiple of ``world x workers x batch`` every lane belongs to one
    consumer and each window is decoded by one consumer per epoch (``read_cost`` counts
    it for any layout). A consumer holds decoded frames for about one unit per lane it
    reads plus ``ceil(shuffle / lanes)`` samples per lane. Units of windows spread every
    consumer over the whole data set: each window is one read of about one window's
    bytes; staged whole (``cache_dir``), every node copies nearly every shard once per
    epoch unless its cache holds them. ``unit="shard"`` reads runs of whole shards (a
    node stages only its share) at the price of mixing only within lanes' blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Unit = Literal["window", "shard"]


# ---------------------------------------------------------------------------------------
# samples


@dataclass(frozen=True)
class Samples:
    """The samples of a data set: ``frames[s]`` frames in shard ``s``."""

    frames: tuple[int, ...]
    length: int = 1
    stride: int = 1
    counts: np.ndarray = field(init=False, repr=False, compare=False)
    starts: np.ndarray = field(init=False, repr=False, compare=False)
    frame_offsets: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        f = np.asarray(self.frames, np.int64)
        counts = np.where(f < self.length, 0, (f - self.length) // self.stride + 1)
        object.__setattr__(self, "counts", counts.astype(np.int64))
        object.__setattr__(self, "starts",
                           np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        object.__setattr__(self, "frame_offsets",
                           np.concatenate([[0], np.cumsum(f)]).astype(np.int64))

    @property
    def n(self) -> int:
        return int(self.starts[-1])

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shard and first frame in the shard of each sample id."""
        ids = np.asarray(ids, np.int64)
        shard = np.searchsorted(self.starts, ids, side="right") - 1
        return shard, (ids - self.starts[shard]) * self.stride


def units(samples: Samples, unit: Unit, unit_frames: int,
          shards: np.ndarray | None = None,
          shard_units: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(first sample id, number of samples) of each unit in natural order, over
    ``shards`` (default: all); ``shard_units``: each shard's unit in frames, where they
    differ (else ``unit_frames`` for every shard)."""
    firsts, lens = [], []
    for s in (range(len(samples.frames)) if shards is None else shards.tolist()):
        c = int(samples.counts[s])
        if c == 0:
            continue
        base = int(samples.starts[s])
        if unit == "shard":
            firsts.append(np.array([base]))
            lens.append(np.array([c]))
            continue
        # sample k starts at frame k * stride; unit w holds the k with
        # w * U <= k * stride < (w + 1) * U
        uf = shard_units[s] if shard_units else unit_frames
        last_frame = (c - 1) * samples.stride
        w = np.arange(last_frame // uf + 2, dtype=np.int64)
        k0 = np.minimum(c, -(-w * uf // samples.stride))
        n = np.diff(k0)
        keep = n > 0
        firsts.append(base + k0[:-1][keep])
        lens.append(n[keep])
    if not firsts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(firsts).astype(np.int64), np.concatenate(lens).astype(np.int64)


# ---------------------------------------------------------------------------------------
# the order


@dataclass(frozen=True)
class OrderSpec:
    shuffle: int = 0            # samples in shuffle blocks over all lanes; 0: no shuffle
    seed: int = 0
    lanes: int = 128
    unit: Unit = "window"
    unit_frames: int = 16       # frames per unit (the data set's window)
    group_by_shape: bool = False
    shard_units: tuple[int, ...] = ()   # each shard's unit, where they differ (automatic
    #                                     windows: their length depends on the frames')

    def __post_init__(self) -> None:
        for name in ("shuffle", "seed", "lanes", "unit_frames"):
            v = getattr(self, name)
            low = 1 if name in ("lanes", "unit_frames") else 0
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        if self.unit not in ("window", "shard"):
            raise ValueError(f"unit must be 'window' or 'shard', got {self.unit!r}")
        if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1
               for v in self.shard_units):
            raise ValueError(f"shard_units must be integers >= 1, got {self.shard_units!r}")

    @property
    def block(self) -> int:
        return -(-self.shuffle // self.lanes) if self.shuffle > 0 else 0


class _Class:
    """Steps 1-3 for the samples of some shards (one shape class, or all)."""

    def __init__(self, samples: Samples, spec: OrderSpec, shards: np.ndarray | None,
                 tag: int) -> None:
        self.spec = spec
        self.tag = tag
        self.first, self.len = units(samples, spec.unit, spec.unit_frames, shards,
                                     spec.shard_units)
        self.n = int(self.len.sum())
        self.q, self.r = divmod(self.n, spec.lanes)
        self._units: tuple[int, np.ndarray, np.ndarray] | None = None

    def _permuted(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """First id of each unit in epoch order, and where each starts in ``S`` (cached
        for the last epoch asked; one tuple, so threads never see half an update)."""
        cached = self._units
        if cached is not None and cached[0] == epoch:
            return cached[1], cached[2]
        order = np.arange(len(self.first))
        if self.spec.shuffle > 0:
            order = np.random.default_rng([self.spec.seed, epoch, 0, self.tag]).permutation(
                len(self.first))
        pos = np.concatenate([[0], np.cumsum(self.len[order])]).astype(np.int64)
        self._units = (epoch, self.first[order], pos)
        return self.first[order], pos

    def s_at(self, epoch: int, idx: np.ndarray) -> np.ndarray:
        """``S[idx]``: sample ids."""
        ufirst, pos = self._permuted(epoch)
        u = np.searchsorted(pos, idx, side="right") - 1
        return ufirst[u] + (idx - pos[u])

    def lane_length(self, lane: int) -> int:
        return self.q + (lane < self.r)

    def lane(self, epoch: int, lane: int) -> np.ndarray:
        """Lane ``lane`` of this epoch, block-shuffled."""
        a = lane * self.q + min(lane, self.r)
        items = self.s_at(epoch, np.arange(a, a + self.lane_length(lane), dtype=np.int64))
        block = self.spec.block
        if block > 1 and len(items) > 1:
            rng = np.random.default_rng([self.spec.seed, epoch, 1, self.tag, lane])
            keys = rng.random(len(items))
            items = items[np.lexsort((keys, np.arange(len(items)) // block))]
        return items


class GlobalOrder:
    """``G`` for every epoch (see the module docstring). ``shape_class[s]``: the frame
    shape class of shard ``s`` (needed with ``group_by_shape``)."""

    def __init__(self, samples: Samples, spec: OrderSpec,
                 shape_class: np.ndarray | None = None) -> None:
        self.samples = samples
        self.spec = spec
        L = spec.lanes
        cls = np.zeros(len(samples.frames), np.int64) if shape_class is None else \
            np.asarray(shape_class, np.int64)
        self.grouped = bool(spec.group_by_shape) and len(np.unique(cls)) > 1
        if not self.grouped:
            self.classes = [_Class(samples, spec, None, 0)]
            self._n = self.classes[0].n
        else:
            self.classes = [_Class(samples, spec, np.flatnonzero(cls == c), int(c))
                            for c in np.unique(cls)]
            self.classes = [c for c in self.classes if c.n > 0]
            self.rounds = np.array([-(-c.n // L) for c in self.classes], np.int64)
            self._n = int(self.rounds.sum()) * L
        self._rounds: tuple[int, np.ndarray, np.ndarray] | None = None

    def num_samples(self) -> int:
        """Positions in ``G`` (grouped: including the padding of each class's rounds)."""
        return self._n

    def _round_plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Grouped: the class and the class's round number of each round of ``G``."""
        cached = self._rounds
        if cached is not None and cached[0] == epoch:
            return cached[1], cached[2]
        label = np.repeat(np.arange(len(self.classes)), self.rounds)
        rng = np.random.default_rng([self.spec.seed, epoch, 2])
        label = label[rng.permutation(len(label))]
        index = np.empty_like(label)
        for c in range(len(self.classes)):
            sel = label == c
            index[sel] = np.arange(int(sel.sum()))
        self._rounds = (epoch, label, index)
        return label, index

    def _padded_lane(self, c: _Class, epoch: int, lane: int) -> np.ndarray:
        items = c.lane(epoch, lane)
        want = -(-c.n // self.spec.lanes)
        if len(items) < want:     # pad with the class's first samples of S
            k = lane - c.r
            extra = c.s_at(epoch, np.arange(k, k + want - len(items), dtype=np.int64) % c.n)
            items = np.concatenate([items, extra])
        return items

    def ids_at(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Sample ids at positions of ``G`` (positions >= num_samples() wrap around)."""
        positions = np.asarray(positions, np.int64)
        n, L = self._n, self.spec.lanes
        if positions.size == 0 or n == 0:
            return np.empty(0, np.int64)
        i = np.where(positions >= n, (positions - n) % n, positions)
        lane, k = i % L, i // L
        out = np.empty_like(i)
        if self.grouped:
            label, index = self._round_plan(epoch)
            keys, k = label[k] * L + lane, index[k]
        else:
            keys = lane
        by = np.argsort(keys, kind="stable")
        uniq, first = np.unique(keys[by], return_index=True)
        ends = [*first[1:].tolist(), len(i)]
        for key, a, b in zip(uniq.tolist(), first.tolist(), ends, strict=True):
            sel = by[a:b]
            if self.grouped:
                seq = self._padded_lane(self.classes[key // L], epoch, key % L)
            else:
                seq = self.classes[0].lane(epoch, key)
            out[sel] = seq[k[sel]]
        return out

    def epoch_order(self, epoch: int) -> np.ndarray:
        """All of ``G`` for ``epoch``."""
        return self.ids_at(epoch, np.arange(self._n, dtype=np.int64))


# ---------------------------------------------------------------------------------------
# consumers


@dataclass(frozen=True)
class Layout:
    """Who consumes: rank of world, worker of workers, the DataLoader's batch size, and
    where in ``G`` the epoch starts (resuming) and how it ends."""

    world: int = 1
    rank: int = 0
    workers: int = 1
    worker: int = 0
    batch: int = 1
    drop_last: bool = False
    start: int = 0


def total(n: int, world: int, drop_last: bool, start: int = 0) -> int:
    """Positions consumed this epoch from ``start`` on, over all ranks (equal per rank)."""
    m = max(0, n - start)
    return world * (m // world if drop_last else -(-m // world))


def positions(n: int, lay: Layout) -> np.ndarray:
    """Positions in ``G`` that one consumer yields, in order."""
    j = np.arange(total(n, lay.world, lay.drop_last, lay.start) // lay.world, dtype=np.int64)
    if lay.workers > 1:
        j = j[(j // lay.batch) % lay.workers == lay.worker]
    return lay.start + j * lay.world + lay.rank


def consumer_ids(order: GlobalOrder, epoch: int, lay: Layout) -> np.ndarray:
    return order.ids_at(epoch, positions(order.num_samples(), lay))


# ---------------------------------------------------------------------------------------
# grouped batches for map-style datasets


def shape_batches(sample_class: np.ndarray, batch: int, seed: int, epoch: int, world: int,
                  rank: int, drop_last: bool = False, shuffle: bool = True
                  ) -> list[np.ndarray]:
    """Batches of sample ids of one class each, for ``rank`` of ``world``: per class the
    ids (shuffled) cut into batches, a short last batch dropped or filled with the
    class's first ids; all batches shuffled; their number cut or extended by wrapping to
    a multiple of ``world``; rank r takes batches r, r + world, ..."""
    sample_class = np.asarray(sample_class, np.int64)
    rng = np.random.default_rng([seed, epoch, 4])
    batches: list[np.ndarray] = []
    for c in np.unique(sample_class):
        ids = np.flatnonzero(sample_class == c)
        if shuffle:
            ids = ids[rng.permutation(len(ids))]
        full, rest = divmod(len(ids), batch)
        batches += [ids[i * batch:(i + 1) * batch] for i in range(full)]
        if rest and not drop_last:
            batches.append(ids[np.arange(full * batch, (full + 1) * batch) % len(ids)])
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    n = len(batches)
    m = world * (n // world if drop_last else -(-n // world))
    if n == 0:
        return []
    batches = [batches[i % n] for i in range(m)]
    return batches[rank::world]


# ---------------------------------------------------------------------------------------
# crops


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-mixed 64-bit hash (numpy uint64 wraps)."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def crop_offsets(seed: int, epoch: int, ids: np.ndarray, frame: tuple[int, int],
                 crop: tuple[int, int]) -> np.ndarray:
    """(y, x) of the top-left corner of the random crop of each sample: a hash of
    (seed, epoch, id), so the same in every process and layout. Shape (len(ids), 2)."""
    ids = np.asarray(ids, np.int64).astype(np.uint64)
    base = _mix(np.array([seed], np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                + np.array([epoch], np.uint64))
    out = np.empty((len(ids), 2), np.int64)
    for axis in range(2):
        room = frame[axis] - crop[axis] + 1
        h = _mix(base ^ _mix(ids * np.uint64(2) + np.uint64(axis)))
        out[:, axis] = (h % np.uint64(room)).astype(np.int64)
    return out


# ---------------------------------------------------------------------------------------
# measuring an order


@dataclass(frozen=True)
class Mixing:
    """How far an emitted sequence is from the natural order."""

    spearman: float             # rank correlation of emitted position and id (0: none)
    local_spearman: float       # mean |rank correlation| over runs of ``window`` samples
    neighbours: float           # share of consecutive emitted pairs with ids differing by 1
    step: float                 # mean |id jump| between consecutive samples / a random
                                # order's (1: as far apart as random; small: a sweep)
    samples: int


def _spearman(ids: np.ndarray) -> float:
    if len(ids) < 3:
        return 0.0
    r = np.empty(len(ids))
    r[np.argsort(ids, kind="stable")] = np.arange(len(ids))
    p = np.arange(len(ids), dtype=np.float64)
    r -= r.mean()
    p -= p.mean()
    den = math.sqrt(float((r * r).sum() * (p * p).sum()))
    return float((r * p).sum() / den) if den else 0.0


def mixing(ids: np.ndarray, window: int = 64) -> Mixing:
    """Mixing of one consumer's emitted ids (see ``Mixing``)."""
    ids = np.asarray(ids, np.int64)
    local = [abs(_spearman(ids[a:a + window])) for a in range(0, len(ids) - window + 1, window)]
    jumps = np.abs(np.diff(ids))
    nb = float(np.mean(jumps == 1)) if len(ids) > 1 else 0.0
    # E|a - b| for two distinct ids drawn from the consumer's own ids
    srt = np.sort(ids).astype(np.float64)
    n = len(srt)
    pairs = n * (n - 1) / 2
    expect = float(np.dot(srt, 2 * np.arange(n) - n + 1) / pairs) if n > 1 else 0.0
    step = float(jumps.mean() / expect) if n > 1 and expect > 0 else 0.0
    return Mixing(_spearman(ids), float(np.mean(local)) if local else 0.0, nb, step, n)


@dataclass(frozen=True)
class ReadCost:
    """Window decodes and shards touched per epoch for a layout."""

    windows: int                # distinct windows holding samples
    decodes: int                # window decodes over all consumers
    per_consumer: list[int]     # decodes per consumer (rank-major, then worker)
    shards_per_consumer: list[int]

    @property
    def factor(self) -> float:
        return self.decodes / self.windows if self.windows else 0.0


def read_cost(order: GlobalOrder, epoch: int, window: int, world: int, workers: int,
              batch: int, starts: Sequence[Sequence[int]] | None = None) -> ReadCost:
    """Each consumer decodes each window its samples touch once (frames it still needs
    are kept), so its decodes are the distinct windows of its samples. ``starts``: each
    shard's window start frames, as its files were written (``TezDataset.read_cost``
    gives them: a .tez shard's last window may hold a joined tail, and large frames
    shorten the window); None: fixed windows of ``window`` frames."""
    s = order.samples
    if starts is not None:
        # every window of the data set by its first global frame, in order
        firsts = np.concatenate([np.asarray(st, np.int64) + s.frame_offsets[i]
                                 for i, st in enumerate(starts)] or [np.zeros(0, np.int64)])
    every: set[int] = set()
    per, shards = [], []
    for r in range(world):
        for w in range(workers):
            ids = consumer_ids(order, epoch, Layout(world, r, workers, w, batch))
            shard, t0 = s.locate(ids)
            if starts is None:
                first = shard * (1 << 32) + t0 // window
                last = shard * (1 << 32) + (t0 + s.length - 1) // window
            else:
                g = s.frame_offsets[shard] + t0
                first = np.searchsorted(firsts, g, side="right") - 1
                last = np.searchsorted(firsts, g + s.length - 1, side="right") - 1
            keys = set()
            for d in range(int((last - first).max()) + 1 if len(ids) else 0):
                sel = first + d <= last
                keys.update((first[sel] + d).tolist())
            every |= keys
            per.append(len(keys))
            shards.append(len(np.unique(shard)))
    return ReadCost(len(every), sum(per), per, shards)
