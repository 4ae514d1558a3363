"""The Python API takes what users naturally pass (numpy scalars as bounds, tensors) and
answers everything else with a TezipError naming the problem; verify is quiet and its
JSON strict on any data (issue 14, items 10, 11, 13)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound

import tezip
from tezip.io import open_input

A = smooth_stack((6, 12, 10))


@pytest.mark.parametrize("bound", [np.float32(0.1), np.float64(0.1), np.array(0.1),
                                   np.int64(1), np.array(1, np.int32)])
def test_numpy_scalars_and_0d_arrays_are_bounds(bound):
    b = tezip.decompress(tezip.compress(A, mode="abs", bound=bound))
    check_bound(A, b, "abs", float(bound))
    blob = tezip.compress(A, mode="absrel", bound=bound, rel_bound=np.float32(1e-3))
    check_bound(A, tezip.decompress(blob), "absrel", float(bound), float(np.float32(1e-3)))


@pytest.mark.parametrize("bound", ["0.1", True, [0.1], np.array([0.1, 0.2]), object()])
def test_bounds_that_are_not_numbers_are_refused(bound):
    with pytest.raises(tezip.OptionError, match="bound"):
        tezip.compress(A, mode="abs", bound=bound)


def test_rel_bound_outside_absrel_is_refused():
    with pytest.raises(tezip.OptionError, match="rel_bound.*absrel"):
        tezip.compress(A, mode="rel", rel_bound=0.5)
    with pytest.raises(tezip.OptionError, match="rel_bound"):
        tezip.compress(A, mode="abs", bound=0.1, rel_bound=0.5)


@pytest.mark.parametrize("data", [None, 3, 1.5, [1, 2], object()])
def test_decompress_and_open_of_non_files(data):
    with pytest.raises(tezip.InputError, match="bytes of a .tez file"):
        tezip.decompress(data)
    with pytest.raises(tezip.InputError, match="bytes of a .tez file"):
        tezip.open(data)


@pytest.mark.parametrize("array", [[[[1, 2], [3]]], [[[1, 2]], [[3, 4], [5, 6]]], None,
                                   np.array([[[object()]]])])
def test_ragged_and_object_inputs(array):
    with pytest.raises(tezip.TezipError):
        tezip.compress(array, mode="abs", bound=0.1)


def test_tensors_are_taken_detached_and_bfloat16_refused():
    torch = pytest.importorskip("torch")
    t = torch.tensor(A, requires_grad=True)
    blob = tezip.compress(t, mode="abs", bound=0.1, predictor="lorenzo")
    assert blob == tezip.compress(A, mode="abs", bound=0.1, predictor="lorenzo")
    with pytest.raises(tezip.UnsupportedError, match="bfloat16"):
        tezip.compress(t.detach().to(torch.bfloat16), mode="abs", bound=0.1)


@pytest.mark.parametrize("meta", [{"x": object()}, {1: "a"}, {"s": {1, 2}}, {"f": print},
                                  "not a dict", ["a"]])
def test_metadata_that_is_not_json_is_refused(meta):
    with pytest.raises(tezip.OptionError, match="metadata"):
        tezip.compress(A, mode="abs", bound=0.1, metadata=meta)


def test_numpy_values_in_metadata_are_stored_as_json():
    meta = {"gain": np.float32(1.5), "roi": np.arange(3), "nested": {"n": np.int64(7)}}
    with tezip.open(tezip.compress(A, mode="abs", bound=0.1, metadata=meta)) as f:
        assert f.metadata == {"gain": 1.5, "roi": [0, 1, 2], "nested": {"n": 7}}


# ---------------------------------------------------------------------------------------
# item 11: a .npy header that lies


def npy_with_shape(path, declared: bytes, data: bytes = b"\0" * 2000) -> None:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                               "shape": (5, 10, 10)})
    path.write_bytes(buf.getvalue().replace(b"(5, 10, 10)", declared) + data)


@pytest.mark.parametrize("declared", [b"(-5, 10, 10)", b"(5, -1, 10)", b"(500, 10, 10)"])
def test_npy_header_that_does_not_match_the_file(tmp_path, declared):
    npy_with_shape(tmp_path / "bad.npy", declared)
    with pytest.raises(tezip.InputError, match="bad.npy"):
        open_input(tmp_path / "bad.npy")


# ---------------------------------------------------------------------------------------
# item 13: verify is quiet and strict


def extreme_stacks(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 16, 16))
    a[0, 0, :4] = [np.nan, np.inf, -np.inf, 1.7e308]
    a[1, 1, :3] = [-1.7e308, 1.7e308, np.finfo(np.float64).max]
    a[2, 2, 2] = np.array([0x7FF0000000000123], "u8").view("f8")[0]      # NaN payload
    b = rng.normal(size=(6, 16, 16)).astype(np.float32)
    b[0, 0, 0] = np.nan
    b[1, 1, 1] = np.array([0x7FC00123], "u4").view("f4")[0]
    c = np.full((4, 8, 8), 5e-324)                                       # denormals
    c[1] = 0.0
    out = []
    for name, arr, modes in (("ext", a, [("abs", "1e-3"), ("rel", "1e-3")]),
                             ("nanp", b, [("abs", "1e-3"), ("pwrel", "1e-2")]),
                             ("tiny", c, [("abs", "1e-3")])):
        np.save(tmp_path / f"{name}.npy", arr)
        for mode, bound in modes:
            tez = tmp_path / f"{name}_{mode}.tez"
            tez.write_bytes(tezip.compress(arr, mode=mode, bound=float(bound)))
            out.append((tmp_path / f"{name}.npy", tez))
    return out


def strict_json(text: str) -> dict:
    def refuse(const: str) -> None:
        raise ValueError(f"non-standard JSON constant {const}")

    return json.loads(text, parse_constant=refuse)


def test_verify_is_quiet_and_its_json_strict_on_nan_payloads_and_huge_values(tmp_path):
    for npy, tez in extreme_stacks(tmp_path):
        for extra in ([], ["--json"]):
            p = subprocess.run([sys.executable, "-W", "default", "-m", "tezip", "verify",
                                str(npy), str(tez), *extra], capture_output=True, text=True,
                               timeout=120)
            assert p.returncode == 0, p.stderr
            assert p.stderr == "", p.stderr                  # no RuntimeWarning
            if extra:
                rep = strict_json(p.stdout)
                assert rep["ok"] and rep["violations"] == 0
                assert rep["psnr"] is None or math.isfinite(rep["psnr"])
        info = subprocess.run([sys.executable, "-m", "tezip", "info", str(tez), "--json"],
                              capture_output=True, text=True, timeout=120)
        strict_json(info.stdout)


def test_model_directory_written_by_train_is_accepted(tmp_path):
    """--model DIR: the directory 'tezip train --out DIR' writes (its model.safetensors);
    a directory without one is refused by name (tests/test_cli_errors.py)."""
    from tezip.cli import main
    from tezip.learned.model import ModelConfig, init_params, to_bytes

    (tmp_path / "run").mkdir()
    cfg = ModelConfig(A.shape[3] if A.ndim == 4 else 1, (4,))
    (tmp_path / "run" / "model.safetensors").write_bytes(to_bytes(cfg, init_params(cfg)))
    np.save(tmp_path / "a.npy", A)
    assert main(["compress", str(tmp_path / "a.npy"), str(tmp_path / "a.tez"), "--mode", "abs",
                 "--bound", "0.1", "--predictor", "learned", "--model",
                 str(tmp_path / "run")]) == 0
    assert main(["decompress", str(tmp_path / "a.tez"), str(tmp_path / "b.npy"), "--model",
                 str(tmp_path / "run")]) == 0
    check_bound(A, np.load(tmp_path / "b.npy"), "abs", 0.1)
