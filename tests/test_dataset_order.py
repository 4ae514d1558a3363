"""tezip.dataset.order: the global sample order, its guarantees and how well it mixes.
numpy only: these tests never import torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tezip.dataset import order as od

REPO = Path(__file__).resolve().parents[1]


def _order(frames, length=4, stride=4, **spec) -> od.GlobalOrder:
    samples = od.Samples(tuple(frames), length, stride)
    shape_class = spec.pop("shape_class", None)
    opts = {"shuffle": 1000, "seed": 3, "lanes": 16, "unit_frames": 16}
    opts.update(spec)
    return od.GlobalOrder(samples, od.OrderSpec(**opts), shape_class)


def _rank_sequence(o: od.GlobalOrder, epoch: int, world: int, rank: int, workers: int,
                   batch: int, **kw) -> np.ndarray:
    """What a DataLoader with ``workers`` and batch size ``batch`` yields on ``rank``:
    batches taken from the workers in turn."""
    streams = [od.consumer_ids(o, epoch, od.Layout(world, rank, workers, w, batch, **kw))
               for w in range(workers)]
    out, pos, k = [], [0] * workers, 0
    while any(p < len(s) for p, s in zip(pos, streams, strict=True)):
        w = k % workers
        out.append(streams[w][pos[w]:pos[w] + batch])
        pos[w] += batch
        k += 1
    return np.concatenate(out)


def test_units_partition_the_samples():
    s = od.Samples((13, 17, 7, 9, 14), 3, 2)
    first, n = od.units(s, "window", 4)
    ids = np.concatenate([np.arange(a, a + k) for a, k in zip(first, n, strict=True)])
    np.testing.assert_array_equal(ids, np.arange(s.n))
    shard, t0 = s.locate(ids)
    for a, k in zip(first, n, strict=True):     # one unit: one shard, one window of starts
        sh, t = s.locate(np.arange(a, a + k))
        assert len(set(sh.tolist())) == 1 and len(set((t // 4).tolist())) == 1
    first, n = od.units(s, "shard", 4)
    assert n.tolist() == s.counts.tolist()


@pytest.mark.parametrize("unit", ["window", "shard"])
def test_one_order_for_every_layout(unit):
    o = _order([37, 61, 5, 90, 23], length=3, stride=2, shuffle=40, lanes=12, unit=unit)
    n = o.num_samples()
    ref = o.epoch_order(2)
    assert sorted(ref.tolist()) == list(range(n))          # nothing lost, nothing doubled
    for world in (1, 2, 3, 4):
        for drop in (False, True):
            for workers in (1, 2, 3):
                for batch in (1, 3):
                    ranks = [_rank_sequence(o, 2, world, r, workers, batch, drop_last=drop)
                             for r in range(world)]
                    assert len({len(x) for x in ranks}) == 1          # equal per rank
                    glob = np.stack(ranks, axis=1).reshape(-1)        # G[j * world + r]
                    m = world * (n // world if drop else -(-n // world))
                    assert len(glob) == m
                    np.testing.assert_array_equal(glob[:min(n, m)], ref[:min(n, m)])
                    np.testing.assert_array_equal(glob[n:], ref[:max(0, m - n)])   # wrap


def test_resume_on_another_allocation():
    o = _order([37, 61, 5, 90, 23], shuffle=64, lanes=12)
    full = o.epoch_order(1)
    done = np.stack([_rank_sequence(o, 1, 2, r, 2, 3)[:6] for r in range(2)], 1).reshape(-1)
    rest = [_rank_sequence(o, 1, 3, r, 2, 2, start=len(done)) for r in range(3)]
    assert len({len(x) for x in rest}) == 1
    resumed = np.stack(rest, axis=1).reshape(-1)
    np.testing.assert_array_equal(np.concatenate([done, resumed])[:len(full)], full)


def test_epochs_and_seeds_differ_and_no_shuffle_is_natural():
    o = _order([200, 300])
    assert not np.array_equal(o.epoch_order(0), o.epoch_order(1))
    assert not np.array_equal(o.epoch_order(0), _order([200, 300], seed=4).epoch_order(0))
    plain = _order([200, 300], shuffle=0, lanes=1)
    np.testing.assert_array_equal(plain.epoch_order(5), np.arange(125))
    rr = _order([200, 300], shuffle=0, lanes=4).epoch_order(0)   # lanes of 32, 31, 31, 31
    np.testing.assert_array_equal(rr[:8], [0, 32, 63, 94, 1, 33, 64, 95])


# the layouts of the mixing test: (world, workers, batch)
LAYOUTS = [(1, 1, 1), (1, 2, 8), (2, 2, 8), (4, 4, 8), (2, 1, 1)]


@pytest.mark.parametrize("frames", [[32000], [1000] * 32], ids=["one-stack", "32-stacks"])
def test_shuffle_mixes_every_consumer(frames):
    """shuffle=1000 (the README's example, default 128 lanes): every consumer's order is
    close to a random one. Measured: the emitted order's rank correlation with the natural
    order, over the epoch and over runs of 64 samples; the share of consecutive samples
    that were neighbours in the data; the mean jump between consecutive ids against a
    random order's. A random order gives about 0, 0.1, 0 and 1; the thresholds leave
    room for chance (a consumer's 500 samples come in units of 4 consecutive ones, so its
    correlation varies by about +-0.1)."""
    o = _order(frames, shuffle=1000, lanes=128)
    assert o.num_samples() == 8000
    for world, workers, batch in LAYOUTS:
        for r in range(world):
            for w in range(workers):
                ids = od.consumer_ids(o, 0, od.Layout(world, r, workers, w, batch))
                m = od.mixing(ids)
                assert abs(m.spearman) < 0.3, (world, workers, m)
                assert m.local_spearman < 0.25, (world, workers, m)
                assert m.neighbours < 0.02, (world, workers, m)
                assert 0.85 < m.step < 1.2, (world, workers, m)
    # the measures see an unshuffled order (128 lanes in turn: a sweep) and a shuffle
    # of whole stacks (one stack: the same sweep, jittered by the lanes' blocks)
    m = od.mixing(od.consumer_ids(_order(frames, shuffle=0, lanes=128), 0, od.Layout()))
    assert m.local_spearman > 0.9 and m.step < 0.1
    coarse = _order(frames, shuffle=1000, lanes=128, unit="shard")
    m = od.mixing(od.consumer_ids(coarse, 0, od.Layout()))
    assert m.step < 0.5


def test_shuffle_cost_in_reads():
    """Lanes a multiple of world x workers x batch: each window is decoded by one
    consumer, but for those cut by a lane boundary (at most lanes - 1); otherwise a
    window's clips spread over consumers and each decodes it. The order is the same."""
    o = _order([256] * 32, shuffle=1000, lanes=128)
    windows = 32 * 16
    cost = od.read_cost(o, 0, 16, world=2, workers=2, batch=8)
    assert cost.windows == windows and cost.decodes <= windows + 127
    assert min(cost.shards_per_consumer) >= 28       # window units: every consumer, every stack
    assert od.read_cost(o, 0, 16, world=3, workers=2, batch=8).factor > 2


def test_group_by_shape_gives_one_shape_per_batch():
    frames = [50, 70, 33, 90, 21]
    cls = np.array([0, 1, 0, 2, 1])
    o = _order(frames, shuffle=100, lanes=16, group_by_shape=True, shape_class=cls)
    g = o.epoch_order(1)
    n = o.samples.n
    assert sorted(set(g.tolist())) == list(range(n))
    assert len(g) % 16 == 0 and len(g) - n < 16 * 3              # < lanes per class
    sample_class = np.repeat(cls, o.samples.counts)
    for world, workers, batch in [(1, 1, 16), (2, 2, 8), (4, 1, 4), (1, 3, 2)]:
        ranks = [_rank_sequence(o, 1, world, r, workers, batch) for r in range(world)]
        assert len({len(x) for x in ranks}) == 1
        for seq in ranks:
            for b in range(0, len(seq), batch):
                assert len(set(sample_class[seq[b:b + batch]].tolist())) == 1


def test_shape_batches_for_map_style():
    cls = np.array([0] * 23 + [1] * 10 + [2] * 41)
    per_rank = [od.shape_batches(cls, 4, 0, 2, 3, r) for r in range(3)]
    assert len({len(b) for b in per_rank}) == 1
    seen = set()
    for batches in per_rank:
        for b in batches:
            assert len(b) == 4 and len(set(cls[b].tolist())) == 1
            seen |= set(b.tolist())
    assert seen == set(range(len(cls)))
    assert od.shape_batches(cls, 4, 0, 2, 3, 0)[0].tolist() != \
        od.shape_batches(cls, 4, 0, 3, 3, 0)[0].tolist()


def test_crop_offsets_are_deterministic_and_inside():
    ids = np.arange(500)
    a = od.crop_offsets(1, 2, ids, (100, 60), (64, 60))
    np.testing.assert_array_equal(a, od.crop_offsets(1, 2, ids, (100, 60), (64, 60)))
    assert a[:, 0].min() == 0 and a[:, 0].max() == 36 and (a[:, 1] == 0).all()
    assert not np.array_equal(a, od.crop_offsets(1, 3, ids, (100, 60), (64, 60)))


def test_order_does_not_import_torch():
    code = ("import sys, tezip.dataset, tezip.dataset.order, tezip.dataset.prepare, "
            "tezip.dataset.cache, tezip.parallel; sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
