"""The writer enforces every limit the reader enforces (issue 14, items 3 and 4): for each
limit, a file at the limit is written and read back, and limit + 1 is refused by the
writer with a TezipError and no file. Limits of the reader:

- header length <= container.MAX_HEADER bytes                 (ContainerReader)
- every axis of the shape in 1 .. container.MAX_FRAMES        (TezFile)
- frame values x window <= windows.MAX_WINDOW_VALUES          (TezFile)
- each window holds 1 .. window frames, windows consecutive   (ContainerReader, TezFile)
- the quantizer step is finite and > 0 (pwrel bound)          (QuantParams.from_dict)
- a recorded model has a SHA-256 hash                         (TezFile)
- the HDF5 skeleton unpacks to <= hdf5_tree.MAX_SKELETON_BYTES (hdf5_tree.restore)

(The window's JSON record, <= 64 KiB, holds a few integers and a registered predictor
name: the writer cannot reach that limit.)"""

from __future__ import annotations

import io
import math
import struct

import h5py
import numpy as np
import pytest
from exact import check_bound

import tezip
from tezip import container
from tezip.cli import main
from tezip.container import MAX_HEADER, ContainerWriter
from tezip.io import hdf5_tree
from tezip.windows import MAX_WINDOW_VALUES

MAX_FRAMES = getattr(container, "MAX_FRAMES", 2**31)     # TezFile: max(shape) <= 2**31
A = np.random.default_rng(0).normal(size=(3, 8, 8)).astype(np.float32)


def header_length(blob: bytes) -> int:
    return struct.unpack_from("<I", blob, 10)[0]


def test_header_at_the_limit_is_written_and_read_one_more_byte_is_refused():
    # (classical: auto's header names the model until its windows are coded, and a small
    # file that does not use it is then written without: ``lean``)
    kw = {"mode": "abs", "bound": 0.1, "predictor": "classical"}
    base = header_length(tezip.compress(A, metadata={"pad": ""}, **kw))
    pad = MAX_HEADER - base
    blob = tezip.compress(A, metadata={"pad": "x" * pad}, **kw)
    assert header_length(blob) == MAX_HEADER
    check_bound(A, tezip.decompress(blob), "abs", 0.1)
    with pytest.raises(tezip.OptionError, match="16 MiB.*'pad'"):
        tezip.compress(A, metadata={"pad": "x" * (pad + 1)}, **kw)


def test_large_metadata_and_attributes_are_refused_by_the_writer(tmp_path, capsys):
    with pytest.raises(tezip.OptionError, match="header"):
        tezip.compress(A, mode="abs", bound=0.1, metadata={"big": "y" * (50 << 20)})
    with h5py.File(tmp_path / "big.h5", "w", libver="latest") as f:   # large attributes
        d = f.create_dataset("data", data=A)
        # 8 MB of float64, about 19 MB as the header's JSON (which holds at most 16 MiB)
        d.attrs["huge"] = np.random.default_rng(1).random(1 << 20)
    for extra in ([], ["--data-only"]):
        rc = main(["compress", str(tmp_path / "big.h5"), str(tmp_path / "o.tez"),
                   "--bound", "1e-3", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and len(err) == 1 and "MiB" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.h5"]


def header(shape, window, dtype="uint8", quant=None, model=None) -> dict:
    return {"shape": list(shape), "window": window, "dtype": dtype,
            "quant": quant or {"kind": "identity", "dtype": dtype, "step": 0.0, "eb": 0.0},
            "model": model, "metadata": {}}


def write(h: dict, windows) -> bytes:
    buf = io.BytesIO()
    w = ContainerWriter(None, h, fileobj=buf)
    for t0, n in windows:
        w.add_window(t0, n, b"payload")
    w.close()
    return buf.getvalue()


def opens(blob: bytes) -> tezip.TezFile:
    with tezip.open(blob) as f:       # TezFile validates header and index on open
        return f


def test_frames_axis_limit():
    big = 1 << 27                                          # frames per window at 1x1
    blob = write(header((MAX_FRAMES, 1, 1), big),
                 [(t, big) for t in range(0, MAX_FRAMES, big)])
    assert opens(blob).shape == (MAX_FRAMES, 1, 1)
    with pytest.raises(tezip.OptionError, match="split"):
        ContainerWriter(None, header((MAX_FRAMES + 1, 1, 1), big), fileobj=io.BytesIO())


def test_frames_axis_limit_is_checked_before_reading_the_stack(monkeypatch):
    class Huge:
        shape, dtype, metadata = (MAX_FRAMES + 1, 1, 1), np.dtype(np.uint8), {}

        def read(self, t0, t1):
            raise AssertionError("read a stack the writer must refuse")

    def plan(*args):
        raise AssertionError("planned the windows (a list as long as the stack) first")

    monkeypatch.setattr(tezip.codec, "coded_windows", plan)
    opts = tezip.Options(tezip.make_bound("abs", 1))
    with pytest.raises(tezip.OptionError, match="split"):
        tezip.codec.compress_stack(Huge(), None, opts, fileobj=io.BytesIO())
    Huge.shape = (2, -1, 3)
    with pytest.raises(tezip.UnsupportedError, match="negative"):
        tezip.codec.compress_stack(Huge(), None, opts, fileobj=io.BytesIO())


def test_window_values_limit():
    blob = write(header((2, 1, MAX_WINDOW_VALUES), 1), [(0, 1), (1, 1)])
    assert opens(blob).window == 1
    with pytest.raises(tezip.OptionError, match="values"):
        ContainerWriter(None, header((2, 1, MAX_WINDOW_VALUES + 1), 1), fileobj=io.BytesIO())
    with pytest.raises(tezip.OptionError, match="values"):
        ContainerWriter(None, header((4, 1, MAX_WINDOW_VALUES // 2), 3), fileobj=io.BytesIO())


def test_frames_per_window_and_order():
    assert opens(write(header((5, 2, 2), 3), [(0, 3), (3, 2)])).n_windows == 2
    for windows in ([(0, 4), (4, 1)],          # window + 1 frames
                    [(0, 0)],                  # an empty window
                    [(0, 2), (3, 2)],          # a gap
                    [(0, 3), (3, 3)]):         # past the end
        with pytest.raises(tezip.OptionError):
            write(header((5, 2, 2), 3), windows)
    with pytest.raises(tezip.OutputError, match="only 3 of 5"):
        write(header((5, 2, 2), 3), [(0, 3)])


def test_quantizer_step_limit_pwrel(tmp_path, capsys):
    """pwrel: 1 + b must differ from 1 in float64, or the grid step is 0."""
    limit = 2.0**-53                                         # 1 + limit == 1
    above = math.nextafter(limit, 1.0)
    a = np.random.default_rng(2).normal(size=(4, 8, 8))
    b = tezip.decompress(tezip.compress(a, mode="pwrel", bound=above))
    assert np.array_equal(b, a)           # that bound leaves every value exact
    for bad in (limit, 1e-30, 5e-324):
        with pytest.raises(tezip.OptionError, match="lossless"):
            tezip.compress(a, mode="pwrel", bound=bad)
    np.save(tmp_path / "a.npy", a)
    rc = main(["compress", str(tmp_path / "a.npy"), str(tmp_path / "a.tez"), "--mode", "pwrel",
               "--bound", "1e-30"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "lossless" in err[0], err
    assert not (tmp_path / "a.tez").exists()
    # the writer's own check, whatever the bound said
    with pytest.raises(tezip.OptionError, match="step"):
        ContainerWriter(None, header((2, 2, 2), 2, "float64", {"kind": "log", "dtype": "float64",
                                                                "step": 0.0, "eb": 1e-30}),
                        fileobj=io.BytesIO())


def test_model_record_needs_a_hash():
    good = {"hash": "0" * 64, "file": "m.safetensors"}
    assert opens(write(header((2, 2, 2), 2, model=good), [(0, 2)])).model_hash == "0" * 64
    with pytest.raises(tezip.OptionError, match="hash"):
        ContainerWriter(None, header((2, 2, 2), 2, model={"hash": "abc"}), fileobj=io.BytesIO())


def test_hdf5_skeleton_size_limit(tmp_path, monkeypatch):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.create_dataset("data", data=A)
        f.create_dataset("other", data=np.arange(1000))
    with h5py.File(tmp_path / "f.h5") as f:
        size = hdf5_tree.capture(f, f["data"])["size"]
    monkeypatch.setattr(hdf5_tree, "MAX_SKELETON_BYTES", size, raising=False)  # at the limit
    tezip.codec.compress_stack(tezip.io.open_input(tmp_path / "f.h5", keep_file=True),
                               tmp_path / "f.tez", tezip.Options(tezip.make_bound("lossless")))
    assert main(["decompress", str(tmp_path / "f.tez"), str(tmp_path / "back.h5")]) == 0
    with h5py.File(tmp_path / "back.h5") as f:
        assert np.array_equal(f["other"][()], np.arange(1000))
    monkeypatch.setattr(hdf5_tree, "MAX_SKELETON_BYTES", size - 1, raising=False)  # over
    with pytest.raises(tezip.OptionError, match="--data-only"):
        tezip.io.open_input(tmp_path / "f.h5", keep_file=True)


def test_writer_refuses_metadata_that_is_not_json():
    with pytest.raises(tezip.OptionError, match="JSON"):
        container.encode_header({"metadata": {"x": object()}})
