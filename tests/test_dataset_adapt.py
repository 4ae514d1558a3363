"""``tezip prepare --adapt``: one model for the data set, saved once beside the shards,
listed in the manifest, found by the loader; over 1 and 2 MPI ranks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound
from test_parallel import needs_mpi, run

from tezip.dataset import manifest as mf
from tezip.dataset.adapt import ADAPTED

pytest.importorskip("torch")

BOUND = 1e-3
# the learned predictor forced, so every shard needs the data set's model to decode
ARGS = ("--bound", str(BOUND), "--predictor", "learned", "--adapt", "--adapt-seconds", "2",
        "--min-decode-mbps", "1", "--window", "8", "--shard-size", "0.02", "--quiet", "--json")


def _inputs(d: Path) -> dict[str, np.ndarray]:
    d.mkdir(parents=True, exist_ok=True)
    srcs = {"a.npy": smooth_stack((24, 32, 32), "float32", seed=1),
            "b.npy": smooth_stack((16, 24, 28), "float32", seed=2)}
    for name, a in srcs.items():
        np.save(d / name, a)
    return srcs


def _check(ds: Path, srcs: dict[str, np.ndarray]) -> dict:
    from tezip.dataset.torch import TezDataset

    m = json.loads((ds / "manifest.json").read_text())
    model = ds / m["model_file"]
    assert m["model_file"] == ADAPTED and m["codec"]["adapt"] is True
    assert hashlib.sha256(model.read_bytes()).hexdigest() == m["model_hash"]
    for s in m["shards"]:       # shards name the model; they do not carry it
        assert model.read_bytes() not in (ds / s["file"]).read_bytes()
    assert mf.verify(ds).passed
    data = TezDataset(ds)                 # finds the model through the manifest
    assert len(data) == sum(s["frames"] for s in m["shards"])
    for s in m["shards"]:
        src = srcs[Path(s["source"]).name]
        a, b = s["source_frames"]
        got = np.stack([np.asarray(data[s["first_frame"] + i]) for i in range(b - a)])
        check_bound(src[a:b], got.reshape(src[a:b].shape), "rel", BOUND,
                    value_range=(float(src.min()), float(src.max())))
    return m


def test_prepare_adapt_one_rank(tmp_path):
    srcs = _inputs(tmp_path)
    out = json.loads(run("prepare", *srcs, "--out", "ds", *ARGS, cwd=tmp_path).stdout)
    assert out["shards"] >= 2
    m = _check(tmp_path / "ds", srcs)
    # a rerun reuses the model and every shard
    again = json.loads(run("prepare", *srcs, "--out", "ds", *ARGS, cwd=tmp_path).stdout)
    assert again["shards_reused"] == out["shards"]
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text()) == m


def test_missing_or_damaged_model_is_reported(tmp_path):
    from tezip.dataset.torch import TezDataset
    from tezip.errors import TezipError

    srcs = _inputs(tmp_path)
    run("prepare", *srcs, "--out", "ds", *ARGS, cwd=tmp_path)
    ds = tmp_path / "ds"
    model = ds / ADAPTED
    good = model.read_bytes()
    model.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    rep = mf.verify(ds)
    assert not rep.passed and (ADAPTED, "sha256 is not the manifest's model_hash (damaged)") \
        in rep.problems
    model.unlink()
    rep = mf.verify(ds)
    assert (ADAPTED, "the data set's model is missing") in rep.problems
    with pytest.raises(TezipError):
        TezDataset(ds)[0]


def test_adapt_refuses_other_predictors(tmp_path):
    srcs = _inputs(tmp_path)
    p = run("prepare", *srcs, "--out", "ds", "--bound", "1e-3", "--adapt", "--predictor",
            "classical", cwd=tmp_path, ok=False)
    assert p.returncode == 1
    assert p.stderr.strip() == ("tezip: error: --adapt fits a learned predictor; it does "
                                "not go with --predictor classical")


def test_adapt_below_the_data_set_floor_says_so_and_codes_classically(tmp_path):
    """The data set default floor (100 MB/s per core, so loaders keep up) excludes the
    learned forecaster: --adapt says so in one note instead of training a model no window
    may use, and the data set is written with the classical predictors."""
    srcs = _inputs(tmp_path)
    p = run("prepare", *srcs, "--out", "ds", "--bound", "1e-3", "--adapt", "--quiet",
            cwd=tmp_path)
    assert p.stderr.startswith("tezip: note: --adapt skipped: the learned forecaster "
                               "decodes float32 at about ")
    assert "below --min-decode-mbps 100" in p.stderr and p.stderr.count("\n") == 1
    assert not (tmp_path / "ds" / ADAPTED).exists()
    m = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert m["model_hash"] is None and "model_file" not in m
    assert mf.verify(tmp_path / "ds").passed


@needs_mpi
def test_prepare_adapt_two_ranks(tmp_path):
    srcs = _inputs(tmp_path)
    out = json.loads(run("prepare", *srcs, "--out", "ds", *ARGS, cwd=tmp_path,
                         mpi=2).stdout)
    assert len(out["per_rank"]) == 2
    _check(tmp_path / "ds", srcs)


def test_the_skip_notes_hint_lets_the_forecaster_through():
    """For tiny frames (under 1 MB/s) the suggested floor is under the estimate (it was
    "1", which skipped again), and the note calls the floor the default only if it is."""
    from types import SimpleNamespace

    from tezip import make_bound
    from tezip.codec import Options
    from tezip.dataset import adapt, plan

    def run_of(shape, floor):
        return SimpleNamespace(infos=[plan.SourceInfo(shape, "float32", None, (0, 0))],
                               options=Options(make_bound("rel", 1e-3),
                                               min_decode_mbps=floor))

    for shape, floor in (((20000, 1, 1), 1.0), ((20000, 1, 1), 100.0), ((64, 64, 64), 100.0)):
        note = adapt.too_slow(run_of(shape, floor))
        hint = float(note.split("Pass --min-decode-mbps ")[1].split()[0])
        assert adapt.too_slow(run_of(shape, hint)) is None
        assert ("the data set default" in note) == (floor == 100.0)
