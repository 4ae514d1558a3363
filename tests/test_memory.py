"""Bounded memory, fast: compress and decompress a 128 MB HDF5 stack in subprocesses whose
address space (RLIMIT_AS) is what Python and tezip's imports take plus 250 MB. Streaming
windows fits; coding the whole stack as one window does not (the control that shows the
limit bites). ``benchmarks/memory_bench.py`` is the 4 GB version."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from exact import check_bound

resource = pytest.importorskip("resource")
h5py = pytest.importorskip("h5py")

SHAPE = (512, 256, 256)  # float32: 128 MB
MARGIN = 250 << 20
DATASET = "/entry/data/data"
IMPORTS = ("import tezip, tezip.cli, tezip.codec, tezip.io.hdf5, h5py, zstandard, numpy, "
           "tqdm, click")
# the compiled kernels: loaded (or compiled and cached) by coding a small stack the way
# the commands will; numba's compiler and the loaded code are part of the baseline
WARM = ("import numpy as np\n"
        "a = np.sin(np.arange(4 * 40 * 40, dtype=np.float32) / 50).reshape(4, 40, 40)\n"
        "tezip.decompress(tezip.compress(a, mode='rel', bound=1e-3, predictor='classical'))")


def _import_peak() -> int:
    """VmPeak of a Python that imported and warmed up what the commands use, in bytes."""
    code = (f"{IMPORTS}\n{WARM}\nprint(next(int(l.split()[1]) for l in "
            "open('/proc/self/status') if l.startswith('VmPeak')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return int(out) * 1024


def _run(args: list[str], limit: int) -> subprocess.CompletedProcess:
    def pre() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "tezip", *args], preexec_fn=pre,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def big_h5(tmp_path_factory):
    path = tmp_path_factory.mktemp("mem") / "stack.h5"
    rng = np.random.default_rng(0)
    y = np.linspace(0, 1, SHAPE[1], dtype=np.float32)[:, None]
    x = np.linspace(0, 1, SHAPE[2], dtype=np.float32)[None, :]
    with h5py.File(path, "w") as f:
        ds = f.create_dataset(DATASET, shape=SHAPE, dtype="f4", chunks=(1, *SHAPE[1:]))
        for t in range(SHAPE[0]):
            ds[t] = (np.sin(7 * x + t / 20) * np.cos(5 * y - t / 30)
                     + 0.002 * rng.standard_normal(SHAPE[1:], dtype=np.float32))
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")
def test_compress_decompress_stream_under_limit(big_h5, tmp_path):
    limit = _import_peak() + MARGIN
    tez, out = tmp_path / "s.tez", tmp_path / "restored.h5"
    codec = ["--mode", "rel", "--bound", "1e-3", "--predictor", "classical"]
    r = _run(["compress", str(big_h5), str(tez), "--dataset", DATASET, *codec], limit)
    assert r.returncode == 0, r.stderr
    r = _run(["decompress", str(tez), str(out)], limit)
    assert r.returncode == 0, r.stderr
    with h5py.File(big_h5, "r") as a, h5py.File(out, "r") as b:
        x, y = a[DATASET][()], b[DATASET][()]
    assert y.shape == x.shape and y.dtype == x.dtype
    check_bound(x, y, "rel", 1e-3)
    # control: the whole stack as one window needs far more than the limit
    r = _run(["compress", str(big_h5), str(tmp_path / "one.tez"), "--dataset", DATASET,
              *codec, "--window", str(SHAPE[0])], limit)
    assert r.returncode == 1 and "out of memory" in r.stderr
    assert not (tmp_path / "one.tez").exists()
