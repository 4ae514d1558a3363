"""The shipped model is package data: a wheel installed into a fresh virtual environment
(not this checkout, not an editable install) decodes a file coded with it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_stack

import tezip
from tezip.models_path import default_model_path

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_decodes_the_default_models_files(tmp_path):
    if not default_model_path().is_file():
        pytest.skip("this checkout has no shipped default model")
    # build from a copy of the tracked files: no stale build/ tree, nothing left in the repo
    src = tmp_path / "src"
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(src)], check=True, capture_output=True)
    wheel = next(dist.glob("tezip-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # the dependencies come from this environment's site-packages (a path, so its .pth
    # files, this checkout's editable install among them, are not read); tezip itself
    # only from the wheel
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True,
                          text=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True)
    a = smooth_stack((12, 24, 24), "float32", seed=3)
    blob = tezip.compress(a, mode="rel", bound=1e-3, predictor="learned")
    with tezip.TezFile(blob) as f:
        assert f.header["model"] is not None and f.window_meta(0)["p"] == "learned"
        assert f._c.model_bytes is None             # named, not stored: the wheel's copy
    (tmp_path / "x.tez").write_bytes(blob)
    code = ("import sys, numpy as np, tezip; "
            "assert 'site-packages' in tezip.__file__, tezip.__file__; "
            "np.save(sys.argv[2], tezip.decompress(sys.argv[1]))")
    p = subprocess.run([str(py), "-c", code, str(tmp_path / "x.tez"), str(tmp_path / "y.npy")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert np.array_equal(np.load(tmp_path / "y.npy"), tezip.decompress(blob))
