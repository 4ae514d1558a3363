"""tezip prepare spread over ranks by pieces (windows of one stack), in one process: ranks
are threads talking through queues (the same protocol as over MPI), so the scheduling,
the assembly and failures are tested without mpiexec. test_parallel.py runs mpiexec."""

from __future__ import annotations

import hashlib
import json
import pickle
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import smooth_stack

from tezip.codec import ArrayStack, Options, TezFile, compress_stack, tune_stack
from tezip.dataset import config, plan, shards
from tezip.dataset import prepare as prep
from tezip.dataset.comm import SerialComm
from tezip.errors import TezipError

BOUND = 1e-3


class ThreadWorld:
    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=120)
        self.slots: list[Any] = [None] * n
        self.queues = [queue.Queue() for _ in range(n)]


class ThreadComm:
    """One rank of a ThreadWorld; objects are copied through pickle, as MPI sends them."""

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self.w, self.rank, self.size = world, rank, world.n

    def allgather(self, obj: Any) -> list[Any]:
        self.w.slots[self.rank] = pickle.dumps(obj)
        self.w.barrier.wait()
        out = [pickle.loads(s) for s in self.w.slots]
        self.w.barrier.wait()
        return out

    def bcast(self, obj: Any) -> Any:
        if self.rank == 0:
            self.w.slots[0] = pickle.dumps(obj)
        self.w.barrier.wait()
        out = pickle.loads(self.w.slots[0])
        self.w.barrier.wait()
        return out

    def send(self, obj: Any, dest: int) -> None:
        self.w.queues[dest].put((self.rank, pickle.dumps(obj)))

    def poll(self) -> list[tuple[int, Any]]:
        out = []
        while True:
            try:
                src, data = self.w.queues[self.rank].get_nowait()
            except queue.Empty:
                return out
            out.append((src, pickle.loads(data)))

    def flush(self) -> None:
        pass


def run_ranks(cfg: config.PrepareConfig, n: int) -> list[Any]:
    """prepare() on n thread ranks; each rank's result or exception."""
    world = ThreadWorld(n)
    out: list[Any] = [None] * n

    def rank(r: int) -> None:
        try:
            out[r] = prep.prepare(cfg, ThreadComm(world, r))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out[r] = exc
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return out


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.glob("shard-*.tez"))}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("in")
    np.save(d / "big.npy", smooth_stack((150, 40, 36), "float32", seed=1))   # 9 windows of 16
    np.save(d / "small.npy", smooth_stack((20, 24, 20), "uint16", seed=2, scale=3000))
    return d


def _cfg(d: Path, out: str, **kw: Any) -> config.PrepareConfig:
    # (windows of 33 frames: the automatic ones of these small frames would hold the
    # big stack whole, which could not then be cut into pieces)
    opts = {"codec": config.CodecConfig("rel", BOUND, predictor="classical", window=33),
            "shard_size_mb": 128.0, "progress": False}
    opts.update(kw)
    return config.PrepareConfig((str(d / "big.npy"), str(d / "small.npy")), d / out, **opts)


def test_pieces_are_window_aligned_runs_of_their_shard():
    info = plan.SourceInfo((150, 40, 36), "float32", None, (0, 0))
    codec = config.CodecConfig("rel", BOUND, window=16)
    sh = plan.plan_shards([info], codec, 10**9)
    assert [(s.t0, s.t1) for s in sh] == [(0, 150)]
    pieces = plan.plan_pieces(sh, [info], codec, sh[0].raw_bytes // 4)
    # 9 windows: the last of 22 frames holds the tail of 6 (windows.coded_windows)
    assert [(p.t0, p.t1) for p in pieces] == [(0, 32), (32, 64), (64, 96), (96, 150)]
    assert not any(p.whole for p in pieces)
    assert plan.plan_pieces(sh, [info], codec, sh[0].raw_bytes)[0].whole
    # never more pieces than windows, never a piece of one frame
    tiny = plan.plan_pieces(plan.plan_shards([plan.SourceInfo((17, 8, 8), "uint8", None,
                                                             (0, 0))], codec, 10**9),
                            [plan.SourceInfo((17, 8, 8), "uint8", None, (0, 0))], codec, 1)
    assert [(p.t0, p.t1) for p in tiny] == [(0, 17)]


@pytest.mark.parametrize("finalists,predictor", [(1, "classical"), (3, "classical"),
                                                  (1, "auto")])
def test_assembled_pieces_equal_one_encoding(tmp_path, monkeypatch, finalists, predictor):
    # (auto: the learned predictor's trial, hopeless on the shard's first window, is
    # skipped in the windows like it: in the pieces as in the whole, from the tuning)
    if finalists == 3:
        # three finalists: every piece must code with the shard's best, as the whole does
        from tezip import codec as codec_mod

        monkeypatch.setattr(codec_mod, "_FULL_MARGIN", 100.0)
    a = smooth_stack((75, 20, 18), "float32", seed=5)
    meta = {"source_frames": [0, 75]}
    opts = Options(config.CodecConfig("rel", BOUND).options().bound, predictor=predictor,
                   window=16)     # the pieces below are runs of whole windows
    vr = (float(a.min()), float(a.max()))
    compress_stack(ArrayStack(a, meta), tmp_path / "whole.tez", opts, vrange=vr)
    tuning = tune_stack(ArrayStack(a, meta), opts, vr)     # what every piece is coded with
    assert (tuning.hopeless is not None) == (predictor == "auto")
    parts = []
    for i, (t0, t1) in enumerate([(0, 16), (16, 48), (48, 75)]):
        p = tmp_path / f".piece-{i}.tez"
        compress_stack(ArrayStack(a[t0:t1], meta), p, opts, vrange=vr, tuning=tuning)
        parts.append(p)
    shards.assemble(tmp_path / "joined.tez", parts)
    assert (tmp_path / "joined.tez").read_bytes() == (tmp_path / "whole.tez").read_bytes()
    assert not any(p.exists() for p in parts)
    with TezFile(tmp_path / "joined.tez") as f:
        assert f.shape == (75, 20, 18)


def test_two_ranks_spread_one_stack_and_write_the_same_shards(inputs):
    serial = prep.prepare(_cfg(inputs, "one"), SerialComm())
    assert serial.per_rank[0].pieces == 2                   # one piece per shard
    res = run_ranks(_cfg(inputs, "two"), 2)
    assert all(isinstance(r, prep.PrepareResult) for r in res), res
    assert digests(inputs / "two") == digests(inputs / "one")
    m1 = json.loads((inputs / "one" / "manifest.json").read_text())
    m2 = json.loads((inputs / "two" / "manifest.json").read_text())
    assert m1 == m2
    per = res[0].per_rank
    assert [r.rank for r in per] == [0, 1]
    assert all(r.pieces >= 2 and r.raw_bytes > 0 for r in per)   # both encoded the big one
    assert sum(r.raw_bytes for r in per) == serial.per_rank[0].raw_bytes
    assert sum(r.pieces for r in per) > 2                    # the big stack was cut
    assert not list((inputs / "two").glob(".piece-*"))
    # a rerun on 2 ranks reuses every shard
    again = run_ranks(_cfg(inputs, "two"), 2)
    assert again[0].shards_reused == 2 and again[0].shards_written == 0


def test_failure_on_one_rank_reaches_every_rank(inputs, monkeypatch):
    real = shards.compress_stack

    def flaky(view: Any, path: Any, *a: Any, **k: Any) -> Any:
        if view.shape[0] < 40:          # the small stack, and the last piece of the big one
            raise OSError(28, "No space left on device", str(path))
        return real(view, path, *a, **k)

    monkeypatch.setattr(shards, "compress_stack", flaky)
    res = run_ranks(_cfg(inputs, "fail"), 2)
    assert all(isinstance(r, prep.RankFailure) for r in res), res
    assert "No space left on device" in str(res[0]) and res[0].report and not res[1].report
    assert not (inputs / "fail" / "manifest.json").exists()
    assert isinstance(res[0], TezipError)
