"""``tezip prepare`` (MPI-parallel data set preparation) and ``tezip verify DATASET_DIR``:
real processes on small generated stacks, one rank and two ranks under mpiexec."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound

import tezip
from tezip.dataset import comm as dcomm
from tezip.dataset import config, plan, shards
from tezip.dataset import prepare as prep
from tezip.errors import InputError, TezipError

REPO = Path(__file__).resolve().parents[1]
BOUND = 1e-3
ARGS = ("--bound", str(BOUND), "--shard-size", "0.005", "--window", "16", "--quiet")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDI_"))}
    env["TEZIP_DEBUG"] = ""
    return env


def run(*args, ok=True, cwd=None, mpi=0):
    cmd = [sys.executable, "-m", "tezip", *map(str, args)]
    if mpi:
        cmd = [MPIEXEC, "-n", str(mpi), *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_env(), timeout=120)
    if ok:
        assert p.returncode == 0, (p.stdout, p.stderr)
    return p


def _mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
needs_mpi = pytest.mark.skipif(
    MPIEXEC is None or not HAVE_MPI4PY,
    reason="needs mpiexec and mpi4py (pip install -e .[mpi]); CI installs both")


def make_inputs(d: Path) -> list[str]:
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "a.npy", smooth_stack((40, 32, 30), "float32", seed=1))
    # windows of 16 frames: b's last 6 frames join the window before (windows.coded_windows),
    # so b has 4 windows; a (40 frames) and c (56) keep their last windows of 8, and c's 4
    # windows make 3 shards, the last of two windows (assembled from pieces on two ranks)
    np.save(d / "b.npy", smooth_stack((70, 24, 20), "uint16", seed=2, scale=3000))
    c = smooth_stack((56, 16, 16), "float64", seed=3)
    c[5, 3, 3] = np.nan
    with h5py.File(d / "c.h5", "w") as f:
        f.create_dataset("/entry/data/data", data=c)
        f.create_dataset("/entry/other", data=np.arange(3))
    return ["a.npy", "b.npy", "c.h5:/entry/data/data"]


def shard_digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.glob("shard-*.tez"))}


def source_array(root: Path, entry: dict) -> np.ndarray:
    path = root / entry["source"]
    if entry["dataset"]:
        with h5py.File(path) as f:
            return f[entry["dataset"]][()]
    return np.load(path)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    inputs = make_inputs(root)
    p = run("prepare", *inputs, "--out", "ds", *ARGS, cwd=root)
    return root, root / "ds", p


def test_one_rank_manifest_and_bound(one_rank):
    root, ds, p = one_rank
    assert "10 shards (10 written, 0 reused)" in p.stdout
    m = json.loads((ds / "manifest.json").read_text())
    assert m["format"] == "tezip-dataset" and m["version"] == 1
    assert m["codec"] == {"mode": "rel", "bound": BOUND, "rel_bound": None,
                          "predictor": "auto", "window": 16, "model": None,
                          "min_decode_mbps": 100.0, "adapt": False}
    # the data set floor (100 MB/s per core) leaves the shipped model out of every shard
    want = None
    assert m["created_by"] == f"tezip {tezip.__version__}" and m["model_hash"] == want
    shards = m["shards"]
    assert [s["file"] for s in shards] == [f"shard-{i:06d}.tez" for i in range(len(shards))]
    # sources are recorded as absolute paths, usable from any directory
    assert [s["source"] for s in shards] == [str(root / n) for n in
                                             ["a.npy"] * 3 + ["b.npy"] * 4 + ["c.h5"] * 3]
    assert m["total_frames"] == 166 == sum(s["frames"] for s in shards)
    assert m["total_bytes"] == sum(s["bytes"] for s in shards)
    first = 0
    sources: dict[str, np.ndarray] = {}
    for s in shards:
        assert s["first_frame"] == first
        first += s["frames"]
        a, b = s["source_frames"]
        assert b - a == s["frames"] == s["shape"][0]
        assert a % 16 == 0                       # cut on window boundaries
        path = ds / s["file"]
        assert path.stat().st_size == s["bytes"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == s["sha256"]
        if s["source"] not in sources:
            sources[s["source"]] = source_array(root, s)
        src = sources[s["source"]]
        with tezip.open(path) as f:
            got = f.read_all()
        assert list(got.shape) == s["shape"] and got.dtype.name == s["dtype"]
        want = src[a:b]
        fin = np.isfinite(src)
        whole = (float(src[fin].min()), float(src[fin].max()))   # range of the whole source
        check_bound(want, got, "rel", BOUND, value_range=whole)
    assert shards[-1]["dataset"] == "/entry/data/data"
    assert m["total_raw_bytes"] == sum(src.nbytes for src in sources.values())


def test_shards_are_ordinary_tez_files(one_rank, tmp_path):
    root, ds, _ = one_rank
    p = run("info", ds / "shard-000008.tez", "--json")
    info = json.loads(p.stdout)
    assert info["shape"] == [16, 16, 16] and info["metadata"]["source_frames"] == [16, 32]
    run("decompress", ds / "shard-000008.tez", tmp_path / "back.npy")
    assert np.load(tmp_path / "back.npy").shape == (16, 16, 16)


def test_verify_dataset_ok_then_damaged_and_missing(one_rank, tmp_path):
    _, ds, _ = one_rank
    p = run("verify", ds)
    assert "10 shards OK" in p.stdout
    copy = tmp_path / "ds"
    shutil.copytree(ds, copy)
    target = copy / "shard-000004.tez"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    (copy / "shard-000007.tez").unlink()
    p = run("verify", copy, ok=False)
    assert p.returncode == 1
    assert "shard-000004.tez: sha256" in p.stdout and "shard-000007.tez: missing" in p.stdout
    assert "shard-000000.tez" not in p.stdout
    rep = json.loads(run("verify", copy, "--json", ok=False).stdout)
    assert not rep["passed"] and rep["ok"] == 8
    assert {x["file"] for x in rep["problems"]} == {"shard-000004.tez", "shard-000007.tez"}


def test_verify_needs_a_dataset_or_two_files(tmp_path):
    (tmp_path / "empty").mkdir()
    p = run("verify", tmp_path / "empty", ok=False)
    assert p.returncode == 1 and "manifest.json" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@needs_mpi
def test_two_ranks_write_the_same_shards(one_rank):
    root, ds, _ = one_rank
    inputs = ["a.npy", "b.npy", "c.h5:/entry/data/data"]
    p = run("prepare", *inputs, "--out", "ds2", *ARGS, "--json", cwd=root, mpi=2)
    summary = json.loads(p.stdout)
    assert summary["ranks"] == 2 and summary["shards_written"] == 10
    assert all(r["shards_written"] > 0 for r in summary["per_rank"])   # both ranks worked
    assert shard_digests(root / "ds2") == shard_digests(ds)
    assert (root / "ds2" / "manifest.json").read_text() == (ds / "manifest.json").read_text()


@needs_mpi
def test_two_ranks_share_one_large_shard(one_rank, tmp_path):
    """128 MB shards: each input is one shard of several windows, cut into pieces that
    both ranks encode (then assembled); the shards are those of one rank."""
    root, _, _ = one_rank
    inputs = ["a.npy", "b.npy", "c.h5:/entry/data/data"]
    args = ("--bound", str(BOUND), "--predictor", "classical", "--window", "33", "--quiet",
            "--json")     # (the automatic windows of these small frames: one a stack)
    one = json.loads(run("prepare", *inputs, "--out", tmp_path / "one", *args,
                         cwd=root).stdout)
    two = json.loads(run("prepare", *inputs, "--out", tmp_path / "two", *args, cwd=root,
                         mpi=2).stdout)
    assert one["shards"] == two["shards"] == 3
    assert [r["pieces"] for r in one["per_rank"]] == [3]
    assert all(r["pieces"] >= 2 for r in two["per_rank"])
    assert sum(r["pieces"] for r in two["per_rank"]) > 3
    assert shard_digests(tmp_path / "one") == shard_digests(tmp_path / "two")
    assert (tmp_path / "one" / "manifest.json").read_text() == \
        (tmp_path / "two" / "manifest.json").read_text()


@needs_mpi
def test_force_rerun_over_a_finished_dataset(one_rank, tmp_path):
    """--force over a finished data set, on two ranks then one. Shards assembled from
    pieces used to meet the sidecar of the earlier run and fail with
    "shard-...tez.json already exists; use --force"."""
    root, ds, _ = one_rank
    inputs = ["a.npy", "b.npy", "c.h5:/entry/data/data"]
    d = tmp_path / "ds"
    shutil.copytree(ds, d)
    p = run("prepare", *inputs, "--out", d, *ARGS, "--force", "--json", cwd=root, mpi=2)
    summary = json.loads(p.stdout)
    assert summary["shards_written"] == 10 and summary["shards_reused"] == 0
    assert sum(r["pieces"] for r in summary["per_rank"]) > 10     # some shards assembled
    assert shard_digests(d) == shard_digests(ds)
    assert (d / "manifest.json").read_text() == (ds / "manifest.json").read_text()
    assert "10 shards OK" in run("verify", d).stdout
    # one rank over the two ranks' output, with --force
    p = run("prepare", *inputs, "--out", d, *ARGS, "--force", cwd=root)
    assert "(10 written, 0 reused)" in p.stdout
    assert "10 shards OK" in run("verify", d).stdout


@needs_mpi
def test_two_rank_rerun_with_other_options_replaces_the_sidecars(one_rank, tmp_path):
    """No --force, other options: no shard is reusable, so every shard and its sidecar
    is replaced, assembled ones included (they too failed on the old sidecar)."""
    root, ds, _ = one_rank
    inputs = ["a.npy", "b.npy", "c.h5:/entry/data/data"]
    d = tmp_path / "ds"
    shutil.copytree(ds, d)
    other = ("--bound", "1e-2", *ARGS[2:])
    run("prepare", *inputs, "--out", d, *other, cwd=root, mpi=2)
    m = json.loads((d / "manifest.json").read_text())
    n = len(m["shards"])
    assert m["codec"]["bound"] == 1e-2 and f"{n} shards OK" in run("verify", d).stdout
    assert sorted(x.name for x in d.glob("shard-*")) == [
        f"shard-{i:06d}.tez{s}" for i in range(n) for s in ("", ".json")]
    assert not [x for x in os.listdir(d) if x.endswith(".tmp") or x.startswith(".piece-")]


def test_resume_rewrites_only_what_is_missing(one_rank, tmp_path):
    root, ds, _ = one_rank
    work = tmp_path / "w"
    shutil.copytree(root, work, ignore=shutil.ignore_patterns("ds2"))
    d = work / "ds"
    before = {p.name: p.stat().st_mtime_ns for p in d.glob("shard-*.tez")}
    (d / "shard-000005.tez").unlink()
    (d / "shard-000002.tez.json").unlink()           # shard without sidecar: not trusted
    p = run("prepare", "a.npy", "b.npy", "c.h5:/entry/data/data", "--out", "ds", *ARGS,
            cwd=work)
    assert "(2 written, 8 reused)" in p.stdout
    after = {p.name: p.stat().st_mtime_ns for p in d.glob("shard-*.tez")}
    changed = {k for k in after if after[k] != before.get(k)}
    assert changed == {"shard-000002.tez", "shard-000005.tez"}
    assert (d / "manifest.json").read_text() == \
        (ds / "manifest.json").read_text().replace(str(root), str(work))
    # other options: nothing is reused, the manifest follows
    p = run("prepare", "a.npy", "--out", "ds", "--bound", "1e-2", "--shard-size", "0.005",
            "--window", "16", "--quiet", cwd=work)
    assert "(3 written, 0 reused)" in p.stdout
    assert sorted(x.name for x in d.glob("shard-*")) == [
        f"shard-{i:06d}.tez{s}" for i in range(3) for s in ("", ".json")]


def test_resume_after_sigkill(tmp_path):
    a = smooth_stack((16 * 14, 48, 48), "float32", seed=5)
    np.save(tmp_path / "big.npy", a)
    args = ("prepare", "big.npy", "--bound", str(BOUND), "--shard-size", "0.01", "--window",
            "16", "--quiet")
    d = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-m", "tezip", *args, "--out", "ds"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end and proc.poll() is None:
        if d.is_dir() and any(d.glob("shard-*.tez.json")):
            break
        time.sleep(0.005)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    if killed:
        assert not (d / "manifest.json").exists()
    p = run(*args, "--out", "ds", cwd=tmp_path)
    n = len(json.loads((d / "manifest.json").read_text())["shards"])
    assert n == 14
    if killed:
        reused = int(p.stdout.split(" reused")[0].rsplit(" ", 1)[1])
        assert 1 <= reused < n, p.stdout
    assert not [x for x in os.listdir(d) if x.endswith(".tmp")]
    run(*args, "--out", "clean", cwd=tmp_path)
    assert (d / "manifest.json").read_text() == (tmp_path / "clean/manifest.json").read_text()
    assert shard_digests(d) == shard_digests(tmp_path / "clean")
    assert "14 shards OK" in run("verify", d).stdout


def _corrupt_inputs(d: Path) -> list[str]:
    make_inputs(d)
    # big.npy is scanned by rank 0, the truncated copy (second largest) by rank 1
    np.save(d / "big.npy", smooth_stack((64, 40, 40), "float32", seed=4))
    raw = (d / "a.npy").read_bytes()
    (d / "bad.npy").write_bytes(raw[: len(raw) * 2 // 3])
    return ["big.npy", "a.npy", "bad.npy", "b.npy"]


@needs_mpi
def test_failing_input_on_one_rank_gives_no_manifest(tmp_path):
    inputs = _corrupt_inputs(tmp_path)
    p = run("prepare", *inputs, "--out", "ds", *ARGS, cwd=tmp_path, mpi=2, ok=False)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("tezip: error: rank 1 failed on bad.npy: "), p.stderr
    assert len([x for x in lines if x.startswith("tezip: error")]) == 1   # only rank 0 says it
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_failing_input_one_rank(tmp_path):
    inputs = _corrupt_inputs(tmp_path)
    p = run("prepare", *inputs, "--out", "ds", *ARGS, cwd=tmp_path, ok=False)
    assert p.returncode == 1
    assert p.stderr.strip() == (
        "tezip: error: rank 0 failed on bad.npy: bad.npy is truncated: its header declares "
        "(40, 32, 30) float32 (153600 bytes of data) but the file holds 102357")
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_failure_while_encoding_keeps_finished_shards(tmp_path, monkeypatch):
    make_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    real = shards.compress_stack

    def flaky(view, path, *a, **k):
        meta = view.metadata
        if meta.get("source") == "b.npy" and meta.get("source_frames", [0])[0] == 32:
            raise OSError(28, "No space left on device", str(path))
        return real(view, path, *a, **k)

    monkeypatch.setattr(shards, "compress_stack", flaky)
    cfg = config.PrepareConfig(("a.npy", "b.npy", "c.h5"), Path("ds"),
                               config.CodecConfig("rel", BOUND, window=16),
                               shard_size_mb=0.005,
                               progress=False)
    with pytest.raises(prep.RankFailure, match="rank 0 failed on b.npy: No space left"):
        prep.prepare(cfg, dcomm.SerialComm())
    assert not (tmp_path / "ds" / "manifest.json").exists()
    assert len(list((tmp_path / "ds").glob("shard-*.tez.json"))) == 5   # a: 3, b: 2
    monkeypatch.setattr(shards, "compress_stack", real)
    res = prep.prepare(cfg, dcomm.SerialComm())
    assert (res.shards_written, res.shards_reused) == (5, 5)


def test_plan_is_window_aligned_and_independent_of_ranks():
    info = plan.SourceInfo((1000, 64, 64), "float32", None, (0, 0), est_ratio=4.0)
    codec = config.CodecConfig("rel", BOUND, window=16)
    shards = plan.plan_shards([info, info], codec, target_bytes=1_000_000)
    per = [s for s in shards if s.source == 0]
    assert len(per) == 5        # 16.4 MB raw / ratio 4 / 1 MB -> 5 shards
    assert per[0].t0 == 0 and per[-1].t1 == 1000
    assert all(s.t0 % 16 == 0 for s in per)
    assert all(a.t1 == b.t0 for a, b in zip(per, per[1:], strict=False))
    assert max(s.t1 - s.t0 for s in per) - min(s.t1 - s.t0 for s in per) <= 16
    assert [s.index for s in shards] == list(range(10))
    owners = plan.assign([s.raw_bytes for s in shards], 3)
    loads = [sum(s.raw_bytes for s, o in zip(shards, owners, strict=True) if o == r)
             for r in range(3)]
    assert max(loads) - min(loads) <= max(s.raw_bytes for s in shards)
    assert plan.assign([5, 5, 5], 1) == [0, 0, 0]


def test_plan_never_makes_a_one_frame_shard():
    codec = config.CodecConfig("lossless", window=16)
    info = plan.SourceInfo((33, 8, 8), "uint8", None, (0, 0), est_ratio=1.0)
    shards = plan.plan_shards([info], codec, target_bytes=64 * 16)
    assert [(s.t0, s.t1) for s in shards] == [(0, 16), (16, 33)]
    big = plan.SourceInfo((5, 8192, 16384), "uint8", None, (0, 0), est_ratio=1.0)
    shards = plan.plan_shards([big], codec, target_bytes=1)     # 1-frame windows
    assert [(s.t0, s.t1) for s in shards] == [(0, 2), (2, 5)]


def test_expand_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_inputs(Path("runs"))
    src = plan.expand_inputs(["runs/*.npy", "runs/a.npy", "runs"], dataset="/entry/data/data")
    assert [(s.path, s.dataset) for s in src] == [
        ("runs/a.npy", None), ("runs/b.npy", None),
        ("runs/c.h5", "/entry/data/data")]
    src = plan.expand_inputs(["runs/c.h5:/entry/data/data"])
    assert src == [plan.Source("runs/c.h5", "/entry/data/data")]
    with pytest.raises(InputError, match="no file matches"):
        plan.expand_inputs(["runs/*.tif"])
    with pytest.raises(TezipError, match="HDF5"):
        plan.expand_inputs(["runs/a.npy:/x"])


def test_no_mpi_launcher_means_one_rank(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDI_")):
            monkeypatch.delenv(k)
    monkeypatch.delenv("TEZIP_MPI", raising=False)
    assert isinstance(dcomm.get_comm(), dcomm.SerialComm)


def test_mpirun_template_quotes_inputs_and_names_a_missing_mpiexec(tmp_path):
    script = REPO / "cli" / "mpirun.sh"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=30)
    assert p.returncode == 2 and "no mpiexec found" in p.stderr
    fake = tmp_path / "mpiexec"                 # prints the arguments it gets, one a line
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    (tmp_path / "x1.h5").write_bytes(b"")       # a glob the shell could expand
    p = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path,
                       env={**env, "MPIEXEC": str(fake), "NPROCS": "3",
                            "INPUTS": "*.h5 b c.h5:/entry/data"}, timeout=30)
    args = p.stdout.splitlines()
    assert args[:2] == ["-n", "3"]
    assert args[args.index("prepare") + 1:][:3] == ["*.h5", "b", "c.h5:/entry/data"]
