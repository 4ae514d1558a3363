"""End-to-end command-line tests: real processes, real files, every error path ends in one
line on stderr and a non-zero exit, and no partial output is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import tifffile
from conftest import smooth_stack
from exact import check_bound
from PIL import Image

import tezip


def run(*args, cwd=None, ok=True):
    env = {**os.environ, "TEZIP_DEBUG": ""}
    p = subprocess.run([sys.executable, "-m", "tezip", *map(str, args)], capture_output=True,
                       text=True, cwd=cwd, env=env, timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def one_line_error(p, code, *words):
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("tezip: error: "), lines[0]
    assert "Traceback" not in p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def only_files(d: Path):
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "int32", "float32", "float64"])
def test_npy_round_trip_every_dtype(tmp_path, dtype):
    a = smooth_stack((10, 20, 18), dtype, scale=200, offset=20)
    np.save(tmp_path / "in.npy", a)
    run("compress", tmp_path / "in.npy", tmp_path / "a.tez", "--mode", "abs", "--bound", "1.5")
    run("decompress", tmp_path / "a.tez", tmp_path / "out.npy")
    b = np.load(tmp_path / "out.npy")
    check_bound(a, b, "abs", 1.5)
    lim = 1.5 if a.dtype.kind == "f" else 1
    p = run("verify", tmp_path / "in.npy", tmp_path / "a.tez", "--json")
    rep = json.loads(p.stdout)
    assert rep["ok"] and rep["max_abs_error"] <= lim and rep["ratio"] > 1
    assert 0 < rep["ssim"] <= 1 and rep["psnr"] > 20


def test_hdf5_round_trip_keeps_attributes(tmp_path):
    a = smooth_stack((8, 16, 16), "uint16", scale=4000)
    with h5py.File(tmp_path / "run.h5", "w") as f:
        d = f.create_dataset("/entry/data/data", data=a, chunks=(1, 16, 16))
        d.attrs["units"] = "counts"
        d.attrs["exposure"] = 0.01
        f.create_dataset("/entry/other", data=np.arange(3))
    run("compress", tmp_path / "run.h5", tmp_path / "a.tez", "--dataset", "/entry/data/data",
        "--mode", "lossless")
    run("decompress", tmp_path / "a.tez", tmp_path / "back.h5")
    with h5py.File(tmp_path / "back.h5") as f:
        d = f["/entry/data/data"]
        assert np.array_equal(d[()], a)
        assert d.attrs["units"] == "counts" and d.attrs["exposure"] == 0.01
    p = run("compress", tmp_path / "run.h5", tmp_path / "b.tez", "--dataset", "/nope",
            ok=False)
    one_line_error(p, 1, "/nope", "/entry/data/data")


def test_tiff_and_png_folder_round_trips(tmp_path):
    a = smooth_stack((6, 12, 14), "float32")
    tifffile.imwrite(tmp_path / "s.tif", a)
    run("compress", tmp_path / "s.tif", tmp_path / "t.tez", "--mode", "rel", "--bound", "1e-3")
    run("decompress", tmp_path / "t.tez", tmp_path / "back.tif")
    b = tifffile.imread(tmp_path / "back.tif")
    check_bound(a, b, "rel", 1e-3)

    frames = tmp_path / "frames"
    frames.mkdir()
    g = smooth_stack((11, 9, 10), "uint8", scale=200)
    for i, f in enumerate(g):
        Image.fromarray(f).save(frames / f"frame_{i}.png")
    run("compress", frames, tmp_path / "f.tez", "--mode", "abs", "--bound", "2")
    run("decompress", tmp_path / "f.tez", tmp_path / "back.npy")
    back = np.load(tmp_path / "back.npy")
    check_bound(g, back, "abs", 2)                               # natural order kept
    run("decompress", tmp_path / "f.tez", tmp_path / "outframes", "--format", "folder")
    assert len(list((tmp_path / "outframes").iterdir())) == 11


def test_multichannel_stack(tmp_path):
    a = smooth_stack((6, 10, 12, 3), "uint8", scale=200)
    np.save(tmp_path / "rgb.npy", a)
    run("compress", tmp_path / "rgb.npy", tmp_path / "a.tez", "--mode", "lossless")
    run("decompress", tmp_path / "a.tez", tmp_path / "b.npy")
    assert np.array_equal(np.load(tmp_path / "b.npy"), a)


def test_info_and_verify_text(tmp_path):
    np.save(tmp_path / "in.npy", smooth_stack((20, 16, 16)))
    p = run("compress", tmp_path / "in.npy", tmp_path / "a.tez", "--bound", "1e-3",
            "--window", "10")
    assert "ratio" in p.stdout and "MB/s" in p.stdout
    p = run("info", tmp_path / "a.tez")
    assert "(20, 16, 16) float32" in p.stdout and "rel" in p.stdout
    info = json.loads(run("info", tmp_path / "a.tez", "--json").stdout)
    assert info["shape"] == [20, 16, 16] and info["windows"] == 2
    assert sum(info["window_predictors"].values()) == 2
    p = run("verify", tmp_path / "in.npy", tmp_path / "a.tez")
    assert "OK" in p.stdout and " dB, SSIM" in p.stdout and "n/a" not in p.stdout


def test_info_names_second_stage_windows():
    """A Lorenzo window with a second stage (format v4) is listed as 'lorenzo+stage'."""
    path = Path(__file__).parent / "fixtures" / "v4" / "f32_stage_lorenzo.tez"
    info = json.loads(run("info", path, "--json").stdout)
    assert info["format_version"] == 4 and info["window_predictors"] == {"lorenzo+stage": 1}
    assert "lorenzo+stage x1" in run("info", path).stdout


def test_verify_text_of_an_exact_file(tmp_path):
    # it printed "PSNR n/a dB"
    np.save(tmp_path / "in.npy", smooth_stack((4, 16, 16)))
    run("compress", tmp_path / "in.npy", tmp_path / "a.tez", "--mode", "lossless")
    p = run("verify", tmp_path / "in.npy", tmp_path / "a.tez")
    assert "PSNR inf (identical), SSIM 1," in p.stdout and "n/a" not in p.stdout


def test_info_of_a_format_v1_learned_file():
    """A format v1 file's model record names only the model's file and hash: ``info``
    says its size was not recorded (it printed "None parameters"), and counts its
    ``prednet+...`` windows as the learned predictor's."""
    v1 = Path(__file__).parent / "fixtures" / "v1"
    line = [ln for ln in run("info", v1 / "f32_prednet.tez").stdout.splitlines()
            if ln.startswith("model")]
    assert len(line) == 1 and "None" not in line[0]
    assert "size not recorded" in line[0] and "named only" in line[0]
    line = [ln for ln in run("info", v1 / "f32_lossless.tez").stdout.splitlines()
            if ln.startswith("model")]
    assert len(line) == 1 and "not used by any window" in line[0]


def test_verify_fails_on_a_different_original(tmp_path):
    a = smooth_stack((6, 8, 8))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", a + 1)
    run("compress", tmp_path / "a.npy", tmp_path / "a.tez", "--mode", "abs", "--bound", "0.01")
    p = run("verify", tmp_path / "b.npy", tmp_path / "a.tez", ok=False)
    assert p.returncode == 1 and "VIOLATED" in p.stdout


def test_error_paths_one_line_and_exit_code(tmp_path):
    a = smooth_stack((6, 8, 8))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "one.npy", a[:1])
    np.save(tmp_path / "empty.npy", a[:0])
    np.save(tmp_path / "c64.npy", a.astype(np.complex64))
    (tmp_path / "x.txt").write_text("hello")
    t = tmp_path
    cases = [
        (["compress", t / "missing.npy", t / "o.tez", "--bound", "1"], 1, "missing.npy"),
        (["compress", t / "one.npy", t / "o.tez", "--bound", "1"], 1, "single frame"),
        (["compress", t / "empty.npy", t / "o.tez", "--bound", "1"], 1, "empty"),
        (["compress", t / "c64.npy", t / "o.tez", "--bound", "1"], 1, "complex64"),
        (["compress", t / "x.txt", t / "o.tez", "--bound", "1"], 1, "x.txt"),
        (["compress", t / "a.npy", t / "o.tez", "--mode", "abs", "--bound", "0"], 1, "positive"),
        (["compress", t / "a.npy", t / "o.tez", "--mode", "abs", "--bound", "-2"], 1, "positive"),
        (["compress", t / "a.npy", t / "o.tez", "--mode", "abs"], 1, "needs a bound"),
        (["compress", t / "a.npy", t / "o.tez", "--mode", "bogus"], 2, "bogus"),
        (["compress", t / "a.npy", t / "o.tez", "--bound", "abc"], 2, "abc"),
        (["compress", t / "a.npy", t / "o.tez", "--predictor", "magic", "--bound", "1"], 1,
         "magic"),
        (["decompress", t / "missing.tez", t / "o.npy"], 1, "missing.tez"),
        (["decompress", t / "x.txt", t / "o.npy"], 1, "not a .tez file"),
        (["info", t / "x.txt"], 1, "not a .tez file"),
        (["frobnicate"], 2, "frobnicate"),
    ]
    for args, code, word in cases:
        one_line_error(run(*args, ok=False), code, word)
    assert not (t / "o.tez").exists() and not (t / "o.npy").exists()
    assert only_files(t) == ["a.npy", "c64.npy", "empty.npy", "one.npy", "x.txt"]


def test_existing_output_refused_without_force(tmp_path):
    np.save(tmp_path / "a.npy", smooth_stack((6, 8, 8)))
    run("compress", tmp_path / "a.npy", tmp_path / "a.tez", "--bound", "1e-2")
    before = (tmp_path / "a.tez").read_bytes()
    one_line_error(run("compress", tmp_path / "a.npy", tmp_path / "a.tez", "--bound", "1e-3",
                       ok=False), 1, "--force")
    assert (tmp_path / "a.tez").read_bytes() == before
    run("compress", tmp_path / "a.npy", tmp_path / "a.tez", "--bound", "1e-3", "--force")
    assert (tmp_path / "a.tez").read_bytes() != before
    run("decompress", tmp_path / "a.tez", tmp_path / "b.npy")
    one_line_error(run("decompress", tmp_path / "a.tez", tmp_path / "b.npy", ok=False), 1,
                   "--force")


def test_corrupted_and_newer_files_fail_cleanly_without_partial_output(tmp_path):
    a = smooth_stack((12, 16, 16))
    blob = bytearray(tezip.compress(a, mode="abs", bound=0.01, window=4))
    blob[len(blob) // 2] ^= 0x10
    (tmp_path / "bad.tez").write_bytes(bytes(blob))
    p = run("decompress", tmp_path / "bad.tez", tmp_path / "out.npy", ok=False)
    one_line_error(p, 1, "damaged")
    (tmp_path / "short.tez").write_bytes(bytes(blob[:100]))
    one_line_error(run("info", tmp_path / "short.tez", ok=False), 1, "truncated")
    assert only_files(tmp_path) == ["bad.tez", "short.tez"]


def test_version_and_help():
    assert tezip.__version__ in run("--version").stdout
    for cmd in ("compress", "decompress", "info", "verify", "bench"):
        assert "Usage" in run(cmd, "--help").stdout


def test_help_and_info_start_without_the_compiled_kernels(tmp_path):
    """``--help`` and ``info`` import neither numba (about 0.4 s of start-up, and its
    first use about 0.5 s more) nor torch: the command line's modules take zstd from
    ``tezip.zstd_util``, not from the entropy coder."""
    tez = tmp_path / "a.tez"
    tez.write_bytes(tezip.compress(smooth_stack((4, 16, 16)), mode="abs", bound=1e-3))
    code = ("import sys\n"
            "from tezip.cli import main\n"
            "assert main(sys.argv[1:]) == 0\n"
            "print(sorted({'numba', 'torch'} & set(sys.modules)))\n")
    for args in (["--help"], ["info", str(tez)], ["info", str(tez), "--json"]):
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip().splitlines()[-1] == "[]", (args, p.stdout)


def test_the_program_skips_numbas_blas_probe_but_library_use_does_not(tmp_path):
    """The ``tezip`` program, in a process of its own, lets numba's first use skip
    importing scipy.linalg (``kernels.skip_blas_probe``: 0.3-0.45 s of start-up) and
    still codes; a program that calls ``cli.main`` or imports tezip keeps numba's BLAS."""
    x = smooth_stack((4, 16, 16))
    np.save(tmp_path / "a.npy", x)
    cli = ("import sys\n"
           "from tezip.cli import {}\n"
           "sys.argv[1:] = sys.argv[2:]\n"
           "assert {}() == 0\n"
           "am = sys.modules.get('numba.np.arraymath')\n"
           "print(['scipy.linalg' in sys.modules, getattr(am, '_HAVE_BLAS', None)])\n")
    args = ["compress", str(tmp_path / "a.npy"), str(tmp_path / "a.tez"), "--mode", "abs",
            "--bound", "1e-3", "--force"]
    # the program's entry point (console script, python -m tezip) skips the probe ...
    p = subprocess.run([sys.executable, "-c", cli.format("console_main", "console_main"),
                        "x", *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    # arraymath is imported (without the probe) only where a kernel compiles; from the
    # disk cache, kernels load without it (``kernels.fast_cache_load``)
    assert p.stdout.strip().splitlines()[-1] in ("[False, False]", "[False, None]")
    check_bound(x, tezip.decompress(str(tmp_path / "a.tez")), "abs", 1e-3)
    # ... main() called from a program (a notebook, a test) does not
    p = subprocess.run([sys.executable, "-c", cli.format("main", "(lambda: main(sys.argv[1:]))"),
                        "x", *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1].endswith(", True]")
    lib = ("import sys, numpy as np, tezip\n"
           "x = np.load(sys.argv[1])\n"
           "tezip.decompress(tezip.compress(x, mode='abs', bound=1e-3))\n"
           "import numba.np.arraymath as am\n"
           "print(am._HAVE_BLAS)\n")
    p = subprocess.run([sys.executable, "-c", lib, str(tmp_path / "a.npy")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "True"


def test_progress_bar_only_where_it_shows(tmp_path):
    """No terminal and no TEZIP_PROGRESS: no bar, and tqdm is not even imported (about 40 ms of
    the start-up); with TEZIP_PROGRESS a bar is drawn on stderr."""
    np.save(tmp_path / "in.npy", smooth_stack((4, 16, 16)))
    code = ("import sys; from tezip.cli import main; sys.argv = ['tezip', 'compress', "
            f"{str(tmp_path / 'in.npy')!r}, {str(tmp_path / 'a.tez')!r}, '--bound', '1e-3', "
            "'--force']\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code\n"
            "print('tqdm' in sys.modules)")
    for progress, imported in (("", "False"), ("1", "True")):
        env = {**os.environ, "TEZIP_PROGRESS": progress}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=300)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip().splitlines()[-1] == imported
        assert ("compress: " in p.stderr) == bool(progress), p.stderr
