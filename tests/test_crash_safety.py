"""Crash safety, fast: SIGKILL compress, decompress and prepare at random moments; no
partial output may exist under the final name and a rerun must succeed
(``benchmarks/crash_safety.py`` is the long version, and this test runs its harness)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

if sys.platform == "win32":  # process groups and SIGKILL
    pytest.skip("POSIX only", allow_module_level=True)

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "crash_safety.py"


def _harness_module():
    spec = importlib.util.spec_from_file_location("crash_safety", _PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["crash_safety"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cs = _harness_module()
    work = tmp_path_factory.mktemp("crash")
    return cs.Harness(work, frames=48, side=128, shard_mb=0.1, rng=random.Random(1),
                      prepare_inputs=2, log=False, mpi=False)


def _check(row, n):
    assert row.trials == n
    assert row.failures == []
    assert row.present_valid + row.absent == n
    assert row.rerun_ok == n


def test_kill_compress(harness):
    _check(harness.compress_trials(3), 3)


def test_kill_decompress(harness):
    _check(harness.decompress_trials(3), 3)  # the third one writes HDF5


def test_kill_prepare(harness):
    row = harness.prepare_trials(2, mpi_every=0)  # one rank
    _check(row, 2)
    assert row.temp_after_rerun == 0  # a rerun removes what a killed run left
