"""Every error a user can cause on the command line ends as exactly one line on stderr,
``tezip: error: ...`` naming what is wrong, with exit code 1 (bad input, damaged file,
refused option) or 2 (bad usage), no traceback and no output file left behind.

Runs ``tezip.cli.main`` in-process (the console script is a thin wrapper around it);
tests/test_cli.py runs the real executable for the most common ones."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from exact import check_bound
from PIL import Image

import tezip
from tezip.cli import main


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli_errors")
    rng = np.random.default_rng(0)
    a = (rng.random((6, 8, 8)) * 100).astype(np.float32)
    np.save(d / "a.npy", a)
    np.save(d / "img2d.npy", a[0])
    np.save(d / "five_d.npy", a.reshape(1, 6, 8, 8, 1)[..., None])
    np.save(d / "i64.npy", a.astype(np.int64))
    np.save(d / "bool.npy", a > 50)
    (d / "trunc.npy").write_bytes((d / "a.npy").read_bytes()[:150])
    (d / "notes.txt").write_text("not data")
    (d / "noext").write_bytes(b"\x00\x01\x02 mystery bytes")
    with h5py.File(d / "two.h5", "w") as f:
        f["/a"] = a
        f["/b"] = a
    with h5py.File(d / "flat.h5", "w") as f:
        f["/v"] = np.arange(10)
    (d / "empty_dir").mkdir()
    (d / "mixed").mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(d / "mixed" / "f_1.png")
    Image.fromarray(np.zeros((9, 8), np.uint8)).save(d / "mixed" / "f_2.png")
    blob = tezip.compress(a, mode="abs", bound=0.5, predictor="classical")
    (d / "a.tez").write_bytes(blob)
    damaged = bytearray(blob)
    damaged[len(blob) // 2] ^= 0x10
    (d / "damaged.tez").write_bytes(bytes(damaged))
    (d / "short.tez").write_bytes(blob[: len(blob) // 3])
    newer = bytearray(blob)
    struct.pack_into("<H", newer, 8, 999)          # a future version, header CRC resealed
    end = 14 + struct.unpack_from("<I", newer, 10)[0]
    struct.pack_into("<I", newer, end, zlib.crc32(newer[:end]))
    (d / "newer.tez").write_bytes(bytes(newer))
    (d / "dataset_dir").mkdir()
    (d / "model.safetensors").write_bytes(b"this is not a safetensors file")
    # issue 14: lying .npy headers, a .tez under a .npy name, damaged TIFFs
    import io

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False,
                                                "shape": (5, 10, 10)})
    (d / "neg.npy").write_bytes(head.getvalue().replace(b"(5, 10, 10)", b"(-5, 10, 10)")
                                + b"\0" * 2000)
    (d / "tez_named.npy").write_bytes(blob)
    import tifffile

    tifffile.imwrite(d / "good.tif", (a * 100).astype(np.uint16))
    good = (d / "good.tif").read_bytes()
    (d / "trunc.tif").write_bytes(good[: len(good) // 2])
    bad_ifd = bytearray(good)
    bad_ifd[4:8] = b"\xff\xff\xff\x00"
    (d / "bad_ifd.tif").write_bytes(bytes(bad_ifd))
    return d


# (arguments; exit code; words the one line must contain). {d} is the fixture directory,
# {o} a fresh output path that must not exist afterwards.
CASES = [
    # compress: options
    ("compress {d}/a.npy {o}.tez --mode absrel --bound 1", 1, ["--rel-bound"]),
    ("compress {d}/a.npy {o}.tez --mode rel --bound 1e-3 --rel-bound 1e-3", 1, ["absrel"]),
    ("compress {d}/a.npy {o}.tez --mode lossless --bound 1", 1, ["lossless", "no bound"]),
    ("compress {d}/a.npy {o}.tez --mode abs", 1, ["needs a bound"]),
    ("compress {d}/a.npy {o}.tez --mode abs --bound 0", 1, ["positive"]),
    ("compress {d}/a.npy {o}.tez --mode abs --bound -1", 1, ["positive"]),
    ("compress {d}/a.npy {o}.tez --mode abs --bound nan", 1, ["bound"]),
    ("compress {d}/a.npy {o}.tez --mode abs --bound inf", 1, ["bound"]),
    ("compress {d}/a.npy {o}.tez --mode pwrel --bound 1.5", 1, ["point-wise", "below 1"]),
    ("compress {d}/a.npy {o}.tez --mode bogus", 2, ["bogus"]),
    ("compress {d}/a.npy {o}.tez --bound abc", 2, ["abc"]),
    ("compress {d}/a.npy {o}.tez --bound 1 --predictor magic", 1, ["magic", "auto"]),
    ("compress {d}/a.npy {o}.tez --bound 1 --window 0", 1, ["window"]),
    ("compress {d}/a.npy {o}.tez --bound 1 --threshold -1", 1, ["threshold"]),
    ("compress {d}/a.npy {o}.tez --bound 1 --format png", 2, ["png"]),
    ("compress {d}/a.npy {o}.tez --bound 1 --dataset /x", 1, ["--dataset", "HDF5"]),
    ("compress {d}/a.npy {o}.tez --bound 1 --predictor learned --model {d}/missing.st", 1,
     ["missing.st"]),
    ("compress {d}/a.npy {o}.tez --bound 1 --predictor learned --model {d}/model.safetensors",
     1, ["model.safetensors"]),
    ("compress {d}/a.npy", 2, ["OUTPUT"]),
    # compress: inputs
    ("compress {d}/missing.npy {o}.tez --bound 1", 1, ["missing.npy"]),
    ("compress {d}/img2d.npy {o}.tez --bound 1", 1, ["single image"]),
    ("compress {d}/five_d.npy {o}.tez --bound 1", 1, ["dimensions"]),
    ("compress {d}/i64.npy {o}.tez --bound 1", 1, ["int64", "supported"]),
    ("compress {d}/bool.npy {o}.tez --bound 1", 1, ["bool"]),
    ("compress {d}/trunc.npy {o}.tez --bound 1", 1, ["trunc.npy"]),
    ("compress {d}/notes.txt {o}.tez --bound 1", 1, ["notes.txt"]),
    ("compress {d}/noext {o}.tez --bound 1", 1, ["noext", "--format"]),
    ("compress {d}/two.h5 {o}.tez --bound 1", 1, ["--dataset", "/a", "/b"]),
    ("compress {d}/flat.h5 {o}.tez --bound 1", 1, ["3-D", "/v"]),
    ("compress {d}/two.h5 {o}.tez --bound 1 --dataset /nope", 1, ["/nope", "/a"]),
    ("compress {d}/empty_dir {o}.tez --bound 1", 1, ["empty_dir"]),
    ("compress {d}/mixed {o}.tez --bound 1", 1, ["f_2.png"]),
    ("compress {d}/a.npy {d}/no_such_dir/o.tez --bound 1", 1, ["no_such_dir"]),
    ("compress {d}/a.npy {d}/a.tez --bound 1", 1, ["exists", "--force"]),
    # decompress
    ("decompress {d}/missing.tez {o}.npy", 1, ["missing.tez"]),
    ("decompress {d}/notes.txt {o}.npy", 1, ["not a .tez file"]),
    ("decompress {d}/damaged.tez {o}.npy", 1, ["damaged"]),
    ("decompress {d}/short.tez {o}.npy", 1, ["truncated"]),
    ("decompress {d}/newer.tez {o}.npy", 1, ["version 999"]),
    ("decompress {d}/a.tez {o}.xyz", 1, ["--format"]),
    ("decompress {d}/a.tez {o}.npy --dataset /x", 1, ["--dataset", "HDF5"]),
    ("decompress {d}/a.tez {d}/no_such_dir/o.npy", 1, ["no_such_dir"]),
    ("decompress {d}/a.tez {d}/a.npy", 1, ["exists", "--force"]),
    ("decompress {d}/a.tez", 2, ["OUTPUT"]),
    # info
    ("info {d}/missing.tez", 1, ["missing.tez"]),
    ("info {d}/notes.txt", 1, ["not a .tez file"]),
    ("info {d}/short.tez", 1, ["truncated"]),
    ("info {d}/newer.tez", 1, ["version 999"]),
    # verify
    ("verify {d}/img2d.npy {d}/a.tez", 1, ["single image"]),
    ("verify {d}/i64.npy {d}/a.tez", 1, ["int64"]),
    ("verify {d}/two.h5 {d}/a.tez --dataset /a --no-ssim --format npy", 1, ["--dataset"]),
    ("verify {d}/a.npy {d}/damaged.tez", 1, ["damaged"]),
    ("verify {d}/a.npy {d}/missing.tez", 1, ["missing.tez"]),
    ("verify {d}/dataset_dir", 1, ["manifest.json"]),
    ("verify {d}/nothing_here", 2, ["verify"]),
    ("verify {d}/a.tez {d}/a.npy", 2, ["ORIGINAL first", "give {d}/a.npy before it"]),
    ("verify {d}/a.tez {d}/a.tez", 2, ["ORIGINAL first", "{d}/a.tez is a .tez file",
                                       "!give"]),
    # prepare
    ("prepare {d}/nothing*.npy --out {o} --bound 1e-3", 1, ["nothing*.npy"]),
    ("prepare {d}/a.npy --out {o} --mode abs --bound -1", 1, ["positive"]),
    ("prepare {d}/a.npy --out {o} --bound 1e-3 --shard-size 0", 1, ["shard"]),
    ("prepare {d}/a.npy", 2, ["--out"]),
    # bench
    ("bench {d}/missing.npy", 1, ["missing.npy"]),
    ("bench {d}/a.npy --bounds 1e-3,abc", 2, ["abc"]),
    ("bench {d}/a.npy --codecs nosuchcodec", 2, ["nosuchcodec"]),
    # issue 14
    ("compress {d}/a.npy {o}.tez --mode pwrel --bound 1e-30", 1, ["lossless"]),
    ("compress {d}/a.npy {o}.tif --bound 1", 1, [".tez", "{o}.tif"]),
    ("compress {d}/a.npy {d}/dataset_dir --bound 1 --force", 1, ["directory", "--force"]),
    ("compress {d}/a.npy {o}.dat --bound 1", 1, [".tez", "{o}.dat"]),
    ("compress {d}/a.npy {o}.tez --bound 1 --predictor learned --model {d}/dataset_dir", 1,
     ["dataset_dir", "directory", "!does not exist"]),
    ("compress {d}/neg.npy {o}.tez --bound 1", 1, ["neg.npy", "(-5, 10, 10)", "damaged"]),
    ("compress {d}/tez_named.npy {o}.tez --bound 1", 1, ["tez_named.npy", ".tez file",
                                                          "!allow_pickle", "!pickle"]),
    ("compress {d}/trunc.tif {o}.tez --bound 1", 1, ["trunc.tif", "damaged"]),
    ("compress {d}/bad_ifd.tif {o}.tez --bound 1", 1, ["bad_ifd.tif", "damaged"]),
    ("decompress {d}/a.tez -", 1, ["standard output"]),
    ("decompress {d}/a.tez {o}.npy --format tiff", 1, ["{o}.npy", "--format"]),
    ("decompress {d}/a.tez {d}/dataset_dir --format npy --force", 1, ["directory"]),
    ("decompress {d}/a.tez {o}.npy --model {d}/dataset_dir", 1, ["dataset_dir"]),
    # the learned predictor does not code pwrel: refused before any input is read or any
    # output made (it used to say only "not this mode", after reading the whole input)
    ("compress {d}/a.npy {o}.tez --mode pwrel --bound 1e-2 --adapt --predictor learned", 1,
     ["learned predictor", "point-wise relative", "--predictor auto"]),
    ("compress {d}/missing.npy {o}.tez --mode pwrel --bound 1e-2 --predictor learned", 1,
     ["point-wise relative", "!missing.npy"]),
    ("prepare {d}/a.npy --out {o} --mode pwrel --bound 1e-2 --predictor learned", 1,
     ["point-wise relative", "!rank"]),
    # general
    ("frobnicate", 2, ["frobnicate"]),
    ("compress --no-such-option", 2, ["--no-such-option"]),
]


@pytest.mark.parametrize("args,code,words", CASES, ids=[c[0].split(" {o}")[0] for c in CASES])
def test_error_is_one_line_with_exit_code(files, tmp_path, capsys, args, code, words):
    out = tmp_path / "out"
    argv = args.format(d=files, o=out).split()
    before = sorted(p.name for p in files.iterdir())
    rc = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == code, (rc, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("tezip: error: "), lines[0]
    assert "Traceback" not in err and "internal error" not in err
    for w in words:                  # "!word": must not appear
        w = w.format(d=files, o=out)
        assert (w[1:] not in lines[0]) if w.startswith("!") else (w in lines[0]), (w, lines[0])
    assert not list(tmp_path.iterdir()), "an output was left behind"
    assert sorted(p.name for p in files.iterdir()) == before


def test_adapt_with_pwrel_says_so_and_codes_classically(files, tmp_path, capsys):
    """--adapt (predictor auto) with --mode pwrel: the learned predictor does not code
    point-wise relative bounds, so nothing is fitted; one note says so (it used to say
    nothing) and the classical predictors code the data."""
    out = tmp_path / "o.tez"
    rc = main(["compress", str(files / "a.npy"), str(out), "--adapt", "--mode", "pwrel",
               "--bound", "1e-2", "--json"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert err.strip().splitlines() == [
        "tezip: note: --adapt skipped: the learned predictor does not code point-wise "
        "relative bounds (--mode pwrel); the classical predictors code the data"]
    a = np.load(files / "a.npy")
    with tezip.TezFile(out) as f:
        assert f.header["model"] is None and f.header["bound"]["pw"] == 1e-2
        assert "learned" not in {f.window_meta(i)["p"] for i in range(f.n_windows)}
        check_bound(a, f.read_all(), "pwrel", 1e-2)


@pytest.mark.parametrize("command,hint", [("compress", "--window"), ("decompress", "--threads")])
@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("can't start new thread")])
def test_running_out_of_memory_names_what_the_command_can_change(files, tmp_path, capsys,
                                                                 monkeypatch, command, hint,
                                                                 error):
    """Out of memory, or no thread started under a memory limit: one line with exit 1
    naming an option of the command that ran (decompress has no --window)."""
    from tezip import cli

    tez = tmp_path / "a.tez"
    assert main(["compress", str(files / "a.npy"), str(tez), "--mode", "abs",
                 "--bound", "0.5"]) == 0
    capsys.readouterr()

    def boom(*a, **k):
        raise error

    monkeypatch.setattr(cli, "compress_stack" if command == "compress" else "TezFile", boom)
    args = ([command, str(files / "a.npy"), str(tmp_path / "b.tez"), "--mode", "abs",
             "--bound", "0.5"] if command == "compress" else
            [command, str(tez), str(tmp_path / "b.npy")])
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tezip: error: ") and hint in err[0]
    assert ("--window" in err[0]) == (command == "compress")
