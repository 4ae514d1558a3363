"""benchmarks/scale_model.py: the per-GPU limits and the check against loader runs, on
small made-up inputs (the published numbers come from the benchmark itself)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("scale_model", REPO / "benchmarks" /
                                              "scale_model.py")
sm = importlib.util.module_from_spec(spec)
sys.modules["scale_model"] = sm         # dataclasses look their module up there
spec.loader.exec_module(sm)


def test_per_gpu_limits():
    raw = sm.Format("raw", 1.0, 0.002, 0.0005, 0.5, "test")
    tez = sm.Format("tez", 10.0, 0.010, 0.0005, 0.5, "test")
    sys_ = sm.System()                       # 9 GB/s over max(N, 2160) GPUs, 7 cores
    r = sm.per_gpu_mbs(raw, sys_, 64)
    assert r["limit"] == "storage" and r["rate"] == pytest.approx(9000 / 2160)
    t = sm.per_gpu_mbs(tez, sys_, 64)
    assert t["limit"] == "consume" and t["rate"] == 40.0
    assert sm.per_gpu_mbs(tez, sys_, 4096)["limit"] == "storage"
    slow = sm.System(cores_per_gpu=1.0)
    learned = sm.Format("learned", 11.0, 0.020, 0.0005, 0.5, "test")
    assert sm.per_gpu_mbs(learned, slow, 1)["limit"] == "cpu"
    assert sm.per_gpu_mbs(learned, slow, 1)["rate"] == pytest.approx(0.5 / 0.0205)
    # a node cache that holds the data set takes the shared file system out of the way
    cached = sm.System(cache_gb=2000, dataset_tb=10, unit="window")
    assert sm.cache_hit(tez, cached, 4096) == 1.0
    assert sm.per_gpu_mbs(tez, cached, 4096)["limit"] == "consume"
    assert sm.cache_hit(raw, cached, 4096) == pytest.approx(0.2)


def test_predict_run_warm_and_cold():
    fmt = sm.Format("tez", 10.0, 0.010, 0.001, 0.5, "test", startup=0.2)
    loader = {"meta": {"mb": {"tez": 10.0}, "first_use": {}}}
    warm = {"ranks": 1, "workers": 2, "samples": 200, "rate": 0.0, "epoch": 1, "fmt": "tez"}
    # 2 workers on 2 cores: 200 x max(0.005, 0.001, 0.011 / 2) s + 0.2 s
    assert sm.predict_run(fmt, warm, loader, 2.0, 0.0) == pytest.approx(200 / 1.3)
    cold = {**warm, "rate": 4.0, "epoch": 0}       # 10 MB at 4 MB/s first, then the work
    assert sm.predict_run(fmt, cold, loader, 2.0, 0.0) == pytest.approx(200 / 3.8)
    loader["meta"]["first_use"] = {"1x2": {"tez": [[[0, 100], [5_000_000, 10_000_000]]]}}
    # half the bytes before sample 0, the rest before sample 100: 2.5 s + 100 samples
    # x 5.5 ms, after the 0.2 s start-up
    assert sm.predict_run(fmt, cold, loader, 2.0, 0.0) == pytest.approx(200 / 3.25)
