"""tezip.data: map-style and iterable datasets over a `tezip prepare` data set."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_stack

torch = pytest.importorskip("torch")

import tezip  # noqa: E402
from tezip.codec import ArrayStack, Options, compress_stack, value_range  # noqa: E402
from tezip.data import ShardCache, TezDataset, TezShardStream  # noqa: E402
from tezip.errors import (  # noqa: E402
    CorruptFileError,
    FormatVersionError,
    InputError,
    OptionError,
)
from tezip.windows import coded_windows, fixed_windows  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLIP, STRIDE = 3, 2
# most layouts here do not divide the lanes on purpose (test_stream_options checks it warns)
pytestmark = pytest.mark.filterwarnings("ignore:lanes .* is not a multiple")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_dataset(root: Path, sources: list[tuple[np.ndarray, list[int]]], *,
                  window: int = 4, raw: bool = False) -> Path:
    """A data set as `tezip prepare` writes it: each source cut at the given frames into
    shards (.tez, or .npy with ``raw``) and a manifest.json."""
    root.mkdir(parents=True, exist_ok=True)
    shards, first = [], 0
    for si, (stack, cuts) in enumerate(sources):
        vr = value_range(ArrayStack(stack))
        bounds = [0, *cuts, stack.shape[0]]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            name = f"shard-{len(shards):06d}.{'npy' if raw else 'tez'}"
            path = root / name
            if raw:
                np.save(path, stack[a:b])
            else:
                compress_stack(ArrayStack(stack[a:b], {"source_frames": [a, b]}), path,
                               Options(tezip.make_bound("rel", 1e-3), window=window),
                               vrange=vr)
            shards.append({"file": name, "bytes": path.stat().st_size, "sha256": _sha(path),
                           "frames": b - a, "shape": [b - a, *stack.shape[1:]],
                           "dtype": stack.dtype.name, "source": f"run{si}.npy",
                           "dataset": None, "source_frames": [a, b], "first_frame": first})
            first += b - a
    manifest = {"format": "tezip-dataset", "version": 1, "created_by": "tests",
                "codec": {"mode": "rel", "bound": 1e-3, "rel_bound": None,
                          "predictor": "auto", "window": window},
                "model_hash": None, "total_frames": first, "total_raw_bytes": 0,
                "total_bytes": sum(s["bytes"] for s in shards), "shards": shards}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def _sources(dtype: str = "float32") -> list[tuple[np.ndarray, list[int]]]:
    # shards of 13, 17, 7 frames (run 0) and 9, 14 frames (run 1)
    a = smooth_stack((37, 12, 10), dtype=dtype, seed=1, scale=100.0, offset=5.0)
    b = smooth_stack((23, 12, 10), dtype=dtype, seed=2, scale=300.0, offset=40.0)
    return [(a, [13, 30]), (b, [9])]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return build_dataset(tmp_path_factory.mktemp("data") / "ds", _sources())


@pytest.fixture(scope="module")
def decoded(dataset) -> list[np.ndarray]:
    m = json.loads((dataset / "manifest.json").read_text())
    return [tezip.decompress(dataset / s["file"]) for s in m["shards"]]


def _expected(ds: TezDataset, decoded: list[np.ndarray], k: int) -> np.ndarray:
    loc = ds.locate(k)
    x = decoded[int(loc["shard"][6:12])][loc["frame"]:loc["frame"] + loc["frames"]]
    return x if ds.clip is not None else x[0]


def _all_samples(ds: TezDataset) -> np.ndarray:
    return np.stack([ds[k].numpy() for k in range(len(ds))])


# ---------------------------------------------------------------------------------------
# map-style


def test_map_style_equals_decompress(dataset, decoded):
    ds = TezDataset(dataset, clip=CLIP, stride=STRIDE)
    # (13-3)//2+1 + (17-3)//2+1 + (7-3)//2+1 + (9-3)//2+1 + (14-3)//2+1
    assert len(ds) == 6 + 8 + 3 + 4 + 6
    rng = np.random.default_rng(0)
    for k in [*rng.integers(0, len(ds), 15).tolist(), 0, len(ds) - 1, 5, 6]:
        t = ds[k]
        assert t.shape == (CLIP, 12, 10) and t.dtype == torch.float32
        np.testing.assert_array_equal(t.numpy(), _expected(ds, decoded, k))
    np.testing.assert_array_equal(ds[-1].numpy(), ds[len(ds) - 1].numpy())
    with pytest.raises(IndexError):
        ds[len(ds)]
    # clips never cross shards: sample 6 is the first of shard 1
    assert ds.locate(6) == {"shard": "shard-000001.tez", "frame": 0, "frames": CLIP,
                            "source": "run0.npy", "dataset": None, "source_frame": 13}
    # reading consecutive clips decodes each window once
    seq = TezDataset(dataset, clip=CLIP, stride=STRIDE)
    _all_samples(seq)
    # (windows of 4 frames, a last one of 1 joined to the one before: 3, 4, 2, 2, 4)
    assert seq.stats["windows_decoded"] == sum(len(coded_windows(f, 4))
                                               for f in (13, 17, 7, 9, 14)) == 15

    frames = TezDataset(dataset)                 # clip=None: single frames
    assert len(frames) == 60 and frames[20].shape == (12, 10)
    np.testing.assert_array_equal(frames[20].numpy(), decoded[1][7])


def test_dtypes_normalize_transform(tmp_path):
    root = build_dataset(tmp_path / "u16", _sources("uint16"))
    ref = [tezip.decompress(p) for p in sorted(root.glob("*.tez"))]
    native = TezDataset(root, clip=CLIP, stride=STRIDE)
    t = native[7]
    assert t.dtype == torch.int32                # uint16 widened exactly
    np.testing.assert_array_equal(t.numpy(), ref[1][2:5].astype(np.int32))

    lo = min(float(s[0].min()) for s in _sources("uint16"))
    hi = max(float(s[0].max()) for s in _sources("uint16"))
    norm = TezDataset(root, clip=CLIP, stride=STRIDE, normalize=True,
                      transform=lambda x: x * 2)
    assert norm.value_range == (lo, hi)
    t = norm[7]
    assert t.dtype == torch.float32
    np.testing.assert_allclose(t.numpy(), 2 * (ref[1][2:5] - lo) / (hi - lo), rtol=1e-6,
                               atol=1e-6)
    fixed = TezDataset(root, clip=None, normalize=(0.0, 1000.0))
    np.testing.assert_allclose(fixed[0].numpy(), ref[0][0] / 1000.0, rtol=1e-6)


def test_distributed_sampler_and_workers(dataset, decoded):
    from torch.utils.data import DataLoader, DistributedSampler
    ds = TezDataset(dataset, clip=CLIP, stride=STRIDE)
    ds[3]                                        # handles opened before the fork
    want = _all_samples(TezDataset(dataset, clip=CLIP, stride=STRIDE))
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        sampler.set_epoch(1)
        idx = list(sampler)
        loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2)
        got = torch.cat(list(loader)).numpy()
        assert got.shape == (len(idx), CLIP, 12, 10)
        np.testing.assert_array_equal(got, want[idx])
        seen += idx
    assert sorted(set(seen)) == list(range(len(ds)))
    # a pickled copy (spawned workers) reopens its files
    copy = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(copy[10].numpy(), want[10])


# ---------------------------------------------------------------------------------------
# iterable: order, counts, layouts


def _stream(root, **kw) -> TezShardStream:
    opts = {"clip": CLIP, "stride": STRIDE, "shuffle": 5, "seed": 7, "lanes": 4}
    opts.update(kw)
    return TezShardStream(root, **opts)


def _rank_sequence(s: TezShardStream, rank: int, workers: int, b: int) -> np.ndarray:
    """What a DataLoader with ``workers`` and batch size ``b`` yields on ``rank``:
    batches taken from the workers in turn."""
    streams = [s.consumer_order(rank, w, max(1, workers)) for w in range(max(1, workers))]
    out, pos, k = [], [0] * len(streams), 0
    while any(p < len(st) for p, st in zip(pos, streams, strict=True)):
        w = k % len(streams)
        out.append(streams[w][pos[w]:pos[w] + b])
        pos[w] += b
        k += 1
    return np.concatenate(out)


def test_stream_order_is_the_same_for_any_layout(dataset):
    n = 27
    ref = _stream(dataset, world_size=1, rank=0).global_order(epoch=2)
    assert sorted(ref.tolist()) == list(range(n))        # nothing lost, nothing doubled
    for world in range(1, 6):
        for drop in (False, True):
            for workers in (1, 2, 3):
                for b in (1, 2, 3):
                    ranks = []
                    for r in range(world):
                        s = _stream(dataset, world_size=world, rank=r, batch_size=b,
                                    drop_last=drop)
                        s.set_epoch(2)
                        seq = _rank_sequence(s, r, workers, b)
                        assert len(seq) == len(s)
                        ranks.append(seq)
                    counts = {len(x) for x in ranks}
                    assert len(counts) == 1                        # equal per rank
                    glob = np.stack(ranks, axis=1).reshape(-1)     # G[j * world + r]
                    np.testing.assert_array_equal(glob, s.global_order())
                    if drop:
                        assert len(glob) == world * (n // world)
                        np.testing.assert_array_equal(glob, ref[:len(glob)])
                    else:
                        assert len(glob) == world * -(-n // world)
                        np.testing.assert_array_equal(glob[:n], ref)
                        np.testing.assert_array_equal(glob[n:], ref[:len(glob) - n])


def test_resume_mid_epoch_on_another_allocation(dataset):
    full = _stream(dataset, world_size=1, rank=0).global_order(3)
    done = []
    for r in range(2):                           # 2 ranks, 2 steps of batch 3
        s = _stream(dataset, world_size=2, rank=r, batch_size=3)
        s.set_epoch(3)
        done.append(_rank_sequence(s, r, 2, 3)[:6])
    consumed = np.stack(done, axis=1).reshape(-1)
    rest = []
    for r in range(3):                           # resume on 3 ranks
        s = _stream(dataset, world_size=3, rank=r, batch_size=2)
        s.set_epoch(3, start=len(consumed))
        rest.append(_rank_sequence(s, r, 2, 2))
        assert len(rest[-1]) == len(s) == 5      # 15 left: 5 each
    resumed = np.stack(rest, axis=1).reshape(-1)
    np.testing.assert_array_equal(np.concatenate([consumed, resumed]), full)


def test_stream_real_dataloader_layouts(dataset, decoded):
    """Worlds 1-3 x workers 0-2 through real DataLoaders: the same global sequence, each
    sample decoded right."""
    from torch.utils.data import DataLoader
    want = _all_samples(TezDataset(dataset, clip=CLIP, stride=STRIDE))
    ref = None
    b = 2
    for world in (1, 2, 3):
        for workers in (0, 1, 2):
            ranks = []
            for r in range(world):
                s = _stream(dataset, world_size=world, rank=r, batch_size=b, with_index=True)
                s.set_epoch(1)
                ids, xs = [], []
                for i, x in DataLoader(s, batch_size=b, num_workers=workers):
                    ids.append(i)
                    xs.append(x)
                ids_a, xs_a = torch.cat(ids).numpy(), torch.cat(xs).numpy()
                np.testing.assert_array_equal(xs_a, want[ids_a])
                assert len(ids_a) == len(s)
                ranks.append(ids_a)
            glob = np.stack(ranks, axis=1).reshape(-1)
            if ref is None:
                ref = glob
                assert sorted(ref.tolist()) == list(range(27))
            np.testing.assert_array_equal(glob[:27], ref)


def test_set_epoch_and_seed(dataset):
    s = _stream(dataset, world_size=2, rank=0)
    e0, e1 = s.global_order(0), s.global_order(1)
    assert not np.array_equal(e0, e1)
    s.set_epoch(1)
    np.testing.assert_array_equal(s.global_order(), e1)
    np.testing.assert_array_equal(_stream(dataset, world_size=3, rank=1).global_order(1)[:27],
                                  e1[:27])
    assert not np.array_equal(_stream(dataset, seed=8).global_order(1), e1[:27])
    plain = _stream(dataset, shuffle=0, lanes=1, world_size=1, rank=0)
    np.testing.assert_array_equal(plain.global_order(5), np.arange(27))
    rr = _stream(dataset, shuffle=0, lanes=4, world_size=1, rank=0).global_order(3)
    # lanes of 7, 7, 7, 6 samples taken in turn
    np.testing.assert_array_equal(rr[:8], [0, 7, 14, 21, 1, 8, 15, 22])


def test_stream_decodes_each_window_once_per_consumer(dataset):
    windows = sum(len(coded_windows(f, 4)) for f in (13, 17, 7, 9, 14))
    one = _stream(dataset, world_size=1, rank=0, shuffle=40)
    list(one)
    assert one.stats["windows_decoded"] == windows
    # 4 lanes = world 2 x workers 2 x batch 1: consumers read disjoint lanes; clips of 3
    # frames every 2 cross windows of 4, so some windows are needed by two consumers.
    # read_cost() predicts the decodes exactly
    for shuffle in (0, 5):
        decodes = []
        for r in range(2):
            for w in range(2):
                s = _stream(dataset, world_size=2, rank=r, lanes=4, shuffle=shuffle)
                list(s._produce(s.consumer_order(r, w, 2)))
                decodes.append(s.stats["windows_decoded"])
        cost = _stream(dataset, world_size=2, rank=0, lanes=4, shuffle=shuffle).read_cost(2)
        assert cost.windows == windows and cost.per_consumer == decodes


def test_read_cost_of_raw_stacks_counts_their_fixed_windows(tmp_path):
    """Raw .npy shards (``manifest.from_stacks``, the baseline of examples/train_ddp.py
    --raw) are read in fixed windows: a short last window is not joined there, and
    read_cost() counts it as the reader decodes it."""
    from tezip.dataset import TezShardStream
    from tezip.dataset.manifest import from_stacks

    np.save(tmp_path / "raw70.npy", np.zeros((70, 8, 8), np.float32))
    m = from_stacks([tmp_path / "raw70.npy"])
    s = TezShardStream(m, clip=1, rank=0, world_size=1, lanes=1)
    s.set_epoch(0)
    cost = s.read_cost()
    list(s._produce(s.consumer_order(0, 0, 1)))
    assert cost.per_consumer == [s.stats["windows_decoded"]] == [len(fixed_windows(70,
                                                                                    m.window))]


def test_window_starts_follow_each_shards_reader():
    from tezip.dataset.readers import window_starts
    from tezip.windows import MAX_WINDOW_VALUES

    assert window_starts("shard-000000.tez", 70, (8, 8), 33) == [0, 33]       # joined
    assert window_starts("/data/run.npy", 70, (8, 8), 33) == [0, 33, 66]      # fixed
    assert window_starts("run.b2nd", 70, (8, 8), 33) == [0, 33, 66]
    # large frames: the window is shortened, and a join that would pass the cap is not made
    fv = MAX_WINDOW_VALUES // 16
    assert window_starts("s.tez", 21, (fv,), 16) == [0, 16]
    assert window_starts("s.tez", 45, (MAX_WINDOW_VALUES // 20,), 33) == [0, 20, 40]
    # automatic windows (None): lengthened for small frames, in .tez and raw shards alike
    assert window_starts("s.tez", 600, (16, 16), None) == [0]               # 1,025 frames
    assert window_starts("s.tez", 600, (32, 32), None) == [0, 257]          # 343 joined
    assert window_starts("run.npy", 600, (32, 32), None) == [0, 257, 514]
    assert window_starts("s.tez", 70, (128, 128), None) == [0, 33]


def test_a_manifest_records_an_automatic_window(tmp_path):
    """``prepare`` without --window records None; the loader's window is then the
    automatic one of the shards' frames, and a manifest of 0.7.5 (a number) reads as
    before."""
    from tezip.dataset import manifest as mf

    m = mf.Manifest(tmp_path, (mf.ShardInfo("s.tez", 600, (600, 32, 32), "float32"),),
                    {"window": None}, 600, {})
    assert m.window_request is None and m.window == 257
    old = mf.Manifest(tmp_path, m.shards, {"window": 33}, 600, {})
    assert old.window_request == old.window == 33
    assert mf.Manifest(tmp_path, m.shards, {}, 600, {}).window == 33    # raw stacks
    # frames of two sizes: each shard's own window, whatever the order of the inputs
    a = mf.ShardInfo("a.tez", 1025, (1025, 16, 16), "float32")
    b = mf.ShardInfo("b.tez", 33, (33, 128, 128), "float32")
    for shards in ((a, b), (b, a)):
        mixed = mf.Manifest(tmp_path, shards, {"window": None}, 1058, {})
        assert mixed.window == 33
        assert mixed.shard_windows == tuple(1025 if s is a else 33 for s in shards)


def test_units_follow_each_shards_window():
    """The order's units are each shard's window where they differ (automatic windows of
    frames of two sizes), and the one ``unit_frames`` elsewhere."""
    from tezip.dataset import order as od

    s = od.Samples((100, 100), length=1, stride=1)
    first, lens = od.units(s, "window", 33, None, (50, 25))
    assert lens.tolist() == [50, 50, 25, 25, 25, 25]
    assert od.units(s, "window", 50)[1].tolist() == [50, 50, 50, 50]
    with pytest.raises(ValueError, match="shard_units"):
        od.OrderSpec(shard_units=(0, 3))

def test_stream_options_and_frames(dataset, decoded):
    s = TezShardStream(dataset, shuffle=3, lanes=2, rank=0, world_size=1, with_index=True)
    got = dict((i, x.numpy()) for i, x in s)
    assert len(got) == 60 and got[20].shape == (12, 10)
    np.testing.assert_array_equal(got[20], decoded[1][7])
    with pytest.warns(UserWarning, match=r"lanes \(2\) is not a multiple of batch_size x "
                                          r"world_size \(3 x 1\)"):
        TezShardStream(dataset, lanes=2, batch_size=3, rank=0, world_size=1)
    with pytest.raises(OptionError):
        TezShardStream(dataset, clip=3, rank=2, world_size=2)
    with pytest.raises(OptionError):
        TezShardStream(dataset, clip=3, shuffle=-1)
    with pytest.raises(OptionError):
        TezShardStream(dataset, clip=40)         # longer than every shard


def test_raw_npy_shards(tmp_path):
    srcs = _sources()
    root = build_dataset(tmp_path / "raw", srcs, raw=True)
    ds = TezDataset(root, clip=CLIP, stride=STRIDE)
    np.testing.assert_array_equal(ds[7].numpy(), srcs[0][0][13 + 2:13 + 5])
    s = TezShardStream(root, clip=CLIP, stride=STRIDE, shuffle=4, rank=0, world_size=1,
                       with_index=True)
    for i, x in s:
        np.testing.assert_array_equal(x.numpy(), ds[i].numpy())


# ---------------------------------------------------------------------------------------
# node-local staging


class CountingReader:
    def __init__(self) -> None:
        self.opened: list[str] = []

    def __call__(self, path: Path):
        self.opened.append(Path(path).name)
        return open(path, "rb")  # noqa: SIM115


def test_cache_dir_staging_and_lru(dataset, tmp_path):
    want = _all_samples(TezDataset(dataset, clip=CLIP, stride=STRIDE))
    cache = tmp_path / "cache"
    reader = CountingReader()
    ds = TezDataset(dataset, clip=CLIP, stride=STRIDE, cache_dir=cache, reader=reader)
    np.testing.assert_array_equal(_all_samples(ds), want)
    assert sorted(reader.opened) == [f"shard-{i:06d}.tez" for i in range(5)]
    m = json.loads((dataset / "manifest.json").read_text())
    assert ds.stats["staged_bytes"] == sum(s["bytes"] for s in m["shards"])
    assert sorted(p.name for p in ShardCache(cache, 1).entries()) == \
        sorted(s["sha256"] + ".tez" for s in m["shards"])
    # a second job on the node reads the local copies only
    again = TezShardStream(dataset, clip=CLIP, stride=STRIDE, rank=0, world_size=1,
                           cache_dir=cache, reader=reader)
    assert len(list(again)) == 27 and len(reader.opened) == 5

    # a stream stages ahead in a background thread: each shard copied once, all counted
    slow = CountingReader()
    fresh = TezShardStream(dataset, clip=CLIP, stride=STRIDE, rank=0, world_size=1,
                           shuffle=10, lanes=2, cache_dir=tmp_path / "c2", reader=slow,
                           prefetch=2, with_index=True)
    for i, x in fresh:
        np.testing.assert_array_equal(x.numpy(), want[i])
    assert sorted(slow.opened) == [f"shard-{i:06d}.tez" for i in range(5)]
    assert fresh.stats["staged_bytes"] == sum(s["bytes"] for s in m["shards"])

    # size-bounded, least recently used goes first
    sizes = [s["bytes"] for s in m["shards"]]
    small = tmp_path / "small"
    limit = sizes[0] + sizes[1] + sizes[2]
    c = ShardCache(small, limit, reader)
    root = Path(dataset)
    shards = TezDataset(dataset).manifest.shards
    for i in (0, 1, 2, 0):                       # 0 is then the most recently used
        c.stage(root, shards[i])
        time.sleep(0.01)
    c.stage(root, shards[3])
    names = {p.name for p in c.entries()}
    assert c.total_bytes() <= max(limit, sizes[3])
    assert shards[0].sha256 + ".tez" in names and shards[3].sha256 + ".tez" in names
    assert shards[1].sha256 + ".tez" not in names


def test_cache_dir_damaged_shard(dataset, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in dataset.iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    target = bad / "shard-000002.tez"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    ds = TezDataset(bad, clip=CLIP, stride=STRIDE, cache_dir=cache)
    ds[0]
    with pytest.raises(CorruptFileError, match="sha256"):
        ds[14]                                   # the first clip of shard 2
    left = [p.name for p in cache.iterdir() if p.is_file()]
    assert len(left) == 1                        # shard 0 only: no partial copy kept
    # without staging the container's own checksums catch it
    with pytest.raises(CorruptFileError, match="shard-000002"):
        _all_samples(TezDataset(bad, clip=CLIP, stride=STRIDE))


def test_manifest_errors(dataset, tmp_path):
    with pytest.raises(InputError, match="manifest.json"):
        TezDataset(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="not a tezip data set"):
        TezDataset(tmp_path)
    m = json.loads((dataset / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**m, "version": 2}))
    with pytest.raises(FormatVersionError, match="upgrade"):
        TezDataset(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(m))   # no shard files here
    ds = TezDataset(tmp_path, clip=CLIP)
    with pytest.raises(InputError, match="shard-000000.tez"):
        ds[0]
    evil = {**m, "shards": [{**m["shards"][0], "file": "../x.tez"}]}
    (tmp_path / "manifest.json").write_text(json.dumps(evil))
    with pytest.raises(CorruptFileError, match="malformed"):
        TezDataset(tmp_path)


# ---------------------------------------------------------------------------------------
# frames of several shapes


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    a = smooth_stack((20, 12, 10), seed=1, scale=100.0)
    b = smooth_stack((26, 16, 14), seed=2, scale=50.0)
    c = smooth_stack((9, 12, 10), seed=3, scale=70.0)
    return build_dataset(tmp_path_factory.mktemp("mixed") / "ds",
                         [(a, [12]), (b, [13]), (c, [])])


def test_mixed_shapes_stream_groups_batches_by_default(mixed):
    from torch.utils.data import DataLoader
    want = TezDataset(mixed, clip=CLIP, stride=STRIDE)
    for world, workers in ((1, 2), (2, 1)):
        seen = []
        for r in range(world):
            s = TezShardStream(mixed, clip=CLIP, stride=STRIDE, shuffle=20, lanes=8,
                               batch_size=4, rank=r, world_size=world, with_index=True)
            assert s.group_by_shape
            n = 0
            for ids, x in DataLoader(s, batch_size=4, num_workers=workers):  # default collate
                for i, xi in zip(ids.tolist(), x, strict=True):
                    np.testing.assert_array_equal(xi.numpy(), want[i].numpy())
                n += len(ids)
                seen += ids.tolist()
            assert n == len(s)
        assert set(seen) == set(range(len(want)))
    with pytest.raises(OptionError, match="multiple of batch_size x world_size"):
        TezShardStream(mixed, clip=CLIP, lanes=6, batch_size=4, rank=0, world_size=1)


def test_mixed_shapes_random_crops(mixed):
    from torch.utils.data import DataLoader
    full = TezDataset(mixed, clip=CLIP, stride=STRIDE)
    crop = TezDataset(mixed, clip=CLIP, stride=STRIDE, crop="min", seed=5)
    assert crop.crop == (12, 10)
    s = TezShardStream(mixed, clip=CLIP, stride=STRIDE, crop="min", seed=5, shuffle=10,
                       lanes=4, rank=0, world_size=1, with_index=True)
    assert not s.group_by_shape
    for epoch in (0, 1):
        crop.set_epoch(epoch)
        s.set_epoch(epoch)
        offsets = set()
        for ids, x in DataLoader(s, batch_size=3, num_workers=0):
            assert x.shape[1:] == (CLIP, 12, 10)
            for i, xi in zip(ids.tolist(), x, strict=True):
                np.testing.assert_array_equal(xi.numpy(), crop[i].numpy())   # same crop
                big = full[i].numpy()
                if big.shape[1:] != (12, 10):       # find where it was cut
                    hits = [(y, z) for y in range(big.shape[1] - 11)
                            for z in range(big.shape[2] - 9)
                            if np.array_equal(big[:, y:y + 12, z:z + 10], xi.numpy())]
                    assert hits
                    offsets.add(hits[0])
        assert len(offsets) > 1
    with pytest.raises(OptionError, match="larger than the frames"):
        TezDataset(mixed, clip=CLIP, crop=(13, 10))


def test_mixed_shapes_map_style_batches(mixed):
    from torch.utils.data import DataLoader

    from tezip.dataset.torch import ShapeBatchSampler
    ds = TezDataset(mixed, clip=CLIP, stride=STRIDE)
    got = []
    for r in range(2):
        sampler = ShapeBatchSampler(ds, 3, num_replicas=2, rank=r, seed=1)
        sampler.set_epoch(2)
        batches = list(DataLoader(ds, batch_sampler=sampler, num_workers=1))
        assert len(batches) == len(sampler)
        got.append(len(batches))
    assert got[0] == got[1]


def test_raw_stacks_as_a_data_set(tmp_path):
    from tezip.dataset import manifest
    a = smooth_stack((20, 12, 10), seed=1)
    b = smooth_stack((15, 16, 14), "uint16", seed=2, scale=900)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    m = manifest.from_stacks([tmp_path / "a.npy", tmp_path / "b.npy"])
    ds = TezDataset(m, clip=CLIP, stride=STRIDE, normalize=True)
    lo, hi = min(a.min(), b.min()), max(a.max(), b.max())
    assert ds.value_range == (float(lo), float(hi))
    np.testing.assert_allclose(ds[len(ds) - 1].numpy(),
                               (b[12:15].astype(np.float32) - lo) / (hi - lo), rtol=1e-6)
    s = TezShardStream(m, clip=CLIP, stride=STRIDE, crop="min", shuffle=8, rank=0,
                       world_size=1)
    assert all(x.shape == (CLIP, 12, 10) for x in s)


def test_import_tezip_does_not_import_torch():
    code = "import sys, tezip, tezip.codec; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# ---------------------------------------------------------------------------------------
# a real 2-process DDP run over uneven shards


def _ddp_rank(rank: int, root: str, store: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    stream = TezShardStream(root, clip=CLIP, stride=STRIDE, shuffle=8, seed=1, lanes=8,
                            batch_size=4, normalize=True, with_index=True)
    loader = DataLoader(stream, batch_size=4, num_workers=2)
    model = DistributedDataParallel(torch.nn.Conv2d(CLIP - 1, 1, 3, padding=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps, ids = 0, []
    for epoch in range(2):
        stream.set_epoch(epoch)
        for i, x in loader:
            loss = torch.nn.functional.mse_loss(model(x[:, :-1]), x[:, -1:])
            opt.zero_grad()
            loss.backward()                      # all-reduce: hangs if ranks differ
            opt.step()
            steps += 1
            ids += i.tolist() if epoch == 0 else []
    Path(out).write_text(json.dumps({"steps": steps, "ids": ids}))
    dist.destroy_process_group()


def test_ddp_two_processes_uneven_shards(dataset, tmp_path):
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [ctx.Process(target=_ddp_rank, args=(r, str(dataset), str(tmp_path / "store"),
                                                 str(outs[r]))) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
        p.join()
    assert not hung, "DDP run did not finish (ranks hung)"
    assert [p.exitcode for p in procs] == [0, 0]
    res = [json.loads(o.read_text()) for o in outs]
    assert res[0]["steps"] == res[1]["steps"] > 0
    n = 27                                       # 27 clips over 2 ranks: one wraps
    ids = res[0]["ids"] + res[1]["ids"]
    assert sorted(set(ids)) == list(range(n)) and len(ids) == n + 1   # 1 wrapped sample


def test_example_runs_under_torchrun(mixed, tmp_path):
    """The DDP example on frames of three shapes (random crops by default), then its
    raw baseline on .npy stacks of two shapes, grouped by shape, in one process."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(REPO / "examples" / "train_ddp.py"), "--data",
           str(mixed), "--epochs", "1", "--clip", "3", "--batch-size", "4",
           "--workers", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "random crops 12x10" in r.stdout and "samples/s" in r.stdout
    np.save(tmp_path / "a.npy", smooth_stack((20, 12, 10), seed=1))
    np.save(tmp_path / "b.npy", smooth_stack((15, 16, 14), seed=2))
    cmd = [sys.executable, str(REPO / "examples" / "train_ddp.py"), "--raw", "a.npy",
           "b.npy", "--group", "--clip", "3", "--batch-size", "2", "--workers", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "batches grouped by shape" in r.stdout and "samples/s" in r.stdout
