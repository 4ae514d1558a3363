"""Readers and writers in tezip.io: round trips, format quirks and the errors users see."""

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
from PIL import Image

import tezip.io
from tezip.errors import InputError, OptionError, OutputExistsError, UnsupportedError
from tezip.io import SUPPORTED_DTYPES, OutputError, detect_format, open_input, open_output

EXT = {"npy": "stack.npy", "hdf5": "stack.h5", "tiff": "stack.tif", "folder": "frames"}


def make_stack(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Random frames that reach the dtype's extremes (and NaN/Inf for floats)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        data = rng.normal(0, 1000, shape).astype(dt)
        data.flat[:3] = [np.nan, np.inf, -np.inf]
    else:
        info = np.iinfo(dt)
        data = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
        data.flat[:2] = [info.min, info.max]
    return data


def write_stack(path, data: np.ndarray, **kwargs) -> None:
    with open_output(path, data.shape, data.dtype, **kwargs) as out:
        out.write(0, data[:2])  # two calls, to exercise streaming
        out.write(len(data[:2]), data[2:])


def read_back(path, **kwargs):
    with open_input(path, **kwargs) as stack:
        return stack.read(0, stack.shape[0]), stack.dtype, stack.shape, stack.metadata


def assert_round_trip(path, data: np.ndarray, fmt: str, **kwargs) -> dict:
    write_stack(path, data, **kwargs)
    got, dtype, shape, meta = read_back(path)
    assert shape == data.shape
    assert dtype == data.dtype
    assert got.dtype == data.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, data)
    assert meta["format"] == fmt
    json.dumps(meta)
    assert not [n for n in os.listdir(os.path.dirname(path)) if ".tmp-" in n]
    return meta


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "tiff"])
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES)
@pytest.mark.parametrize("shape", [(5, 6, 7), (4, 6, 5, 3)])
def test_round_trip_files(tmp_path, fmt, dtype, shape):
    assert_round_trip(str(tmp_path / EXT[fmt]), make_stack(shape, dtype), fmt)


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "tiff", "folder"])
def test_round_trip_single_frame(tmp_path, fmt):
    assert_round_trip(str(tmp_path / EXT[fmt]), make_stack((1, 4, 5), "uint16"), fmt)


@pytest.mark.parametrize("channels", [2, 4, 5])
def test_tiff_channels(tmp_path, channels):
    assert_round_trip(str(tmp_path / "c.tiff"), make_stack((3, 4, 5, channels), "uint8"), "tiff")


@pytest.mark.parametrize(
    ("shape", "dtype", "ext"),
    [
        ((4, 6, 7), "uint8", ".png"),
        ((4, 6, 7), "uint16", ".png"),
        ((4, 6, 7, 3), "uint8", ".png"),
        ((4, 6, 7, 4), "uint8", ".png"),
        ((4, 6, 7, 3), "uint16", ".tif"),
        ((4, 6, 7), "int16", ".tif"),
        ((4, 6, 7), "int32", ".tif"),
        ((4, 6, 7), "float32", ".tif"),
        ((4, 6, 7), "float64", ".tif"),
    ],
)
def test_round_trip_folder(tmp_path, shape, dtype, ext):
    path = tmp_path / "frames"
    assert_round_trip(str(path), make_stack(shape, dtype), "folder")
    assert sorted(os.listdir(path)) == [f"frame_{i:06d}{ext}" for i in range(shape[0])]


def test_folder_pads_names_to_fit(tmp_path):
    out = open_output(tmp_path / "f", (1_000_001, 1, 1), "uint8")
    out.write(0, np.zeros((2, 1, 1), np.uint8))
    assert sorted(os.listdir(out.temp)) == ["frame_0000000.png", "frame_0000001.png"]
    out.abort()
    assert os.listdir(tmp_path) == []


def test_hdf5_attrs_and_dataset_survive(tmp_path):
    src = tmp_path / "run.nxs"
    data = make_stack((3, 4, 5), "float32")
    with h5py.File(src, "w") as f:
        ds = f.create_dataset("/entry/data/data", data=data)
        ds.attrs["count"] = np.int32(7)
        ds.attrs["exposure"] = np.float64(0.25)
        ds.attrs["axes"] = np.array([1.5, 2.5])
        ds.attrs["units"] = b"counts"
        ds.attrs["title"] = "scan 12"
        ds.attrs["names"] = np.array(["a", "bc"], dtype=h5py.string_dtype())
        f.create_dataset("/entry/monitor", data=np.arange(3))
    got, dtype, shape, meta = read_back(src)
    np.testing.assert_array_equal(got, data)
    want = {
        "count": 7,
        "exposure": 0.25,
        "axes": [1.5, 2.5],
        "units": "counts",
        "title": "scan 12",
        "names": ["a", "bc"],
    }
    assert meta == {
        "source": "run.nxs",
        "format": "hdf5",
        "dataset": "/entry/data/data",
        "attrs": want,
    }
    out = tmp_path / "copy.h5"
    write_stack(out, data, metadata=meta)
    assert read_back(out)[3]["attrs"] == want
    with h5py.File(out) as f:
        assert f["/entry/data/data"].chunks == (1, 4, 5)


def test_hdf5_output_dataset_option(tmp_path):
    data = make_stack((3, 4, 5), "int16")
    write_stack(tmp_path / "a.h5", data, dataset="/x/y")
    assert read_back(tmp_path / "a.h5", dataset="/x/y")[3]["dataset"] == "/x/y"
    write_stack(tmp_path / "b.h5", data)
    assert read_back(tmp_path / "b.h5")[3]["dataset"] == "/data"


def test_big_endian_inputs(tmp_path):
    data = make_stack((3, 4, 5), "float32")
    np.save(tmp_path / "be.npy", data.astype(">f4"))
    with h5py.File(tmp_path / "be.h5", "w") as f:
        f.create_dataset("d", data=data.astype(">f4"))
    tifffile.imwrite(tmp_path / "be.tif", data, byteorder=">", photometric="minisblack")
    for name in ("be.npy", "be.h5", "be.tif"):
        got, dtype, _, _ = read_back(tmp_path / name)
        assert dtype == np.dtype("float32") and dtype.isnative and got.dtype.isnative
        np.testing.assert_array_equal(got, data)


def test_npy_fortran_order_and_partial_reads(tmp_path):
    data = make_stack((6, 4, 5), "int32")
    np.save(tmp_path / "f.npy", np.asfortranarray(data))
    with open_input(tmp_path / "f.npy") as stack:
        part = stack.read(2, 5)
        assert part.flags.c_contiguous and part.flags.writeable
        np.testing.assert_array_equal(part, data[2:5])
        assert stack.read(3, 3).shape == (0, 4, 5)
        assert len(stack) == 6
        with pytest.raises(IndexError):
            stack.read(4, 7)


def test_tiff_compressed_and_planar(tmp_path):
    data = make_stack((5, 6, 7), "uint16")
    tifffile.imwrite(tmp_path / "z.tif", data, compression="zlib")
    with open_input(tmp_path / "z.tif") as stack:
        np.testing.assert_array_equal(stack.read(1, 4), data[1:4])
        np.testing.assert_array_equal(stack.read(4, 5), data[4:5])
    rgb = make_stack((3, 6, 7, 3), "uint8")
    tifffile.imwrite(
        tmp_path / "p.tif", np.moveaxis(rgb, -1, 1), photometric="rgb", planarconfig="separate"
    )
    got, _, shape, _ = read_back(tmp_path / "p.tif")
    assert shape == (3, 6, 7, 3)
    np.testing.assert_array_equal(got, rgb)


def test_tiff_from_separate_pages(tmp_path):
    data = make_stack((4, 3, 5), "float32")
    with tifffile.TiffWriter(tmp_path / "pages.tif") as tw:
        for frame in data:
            tw.write(frame)  # one series per page, as many tools write them
    np.testing.assert_array_equal(read_back(tmp_path / "pages.tif")[0], data)


def test_folder_natural_sort_ignores_others(tmp_path):
    folder = tmp_path / "scan"
    folder.mkdir()
    for i in (10, 2, 1, 33, 3):
        Image.fromarray(np.full((4, 5), i, np.uint8)).save(folder / f"frame_{i}.png")
    Image.fromarray(np.zeros((9, 9), np.uint8)).save(folder / ".hidden.png")
    (folder / "notes.txt").write_text("not a frame")
    (folder / "sub.png").mkdir()
    with open_input(folder) as stack:
        assert stack.shape == (5, 4, 5)
        assert [int(f[0, 0]) for f in stack.read(0, 5)] == [1, 2, 3, 10, 33]
        assert stack.metadata["source"] == "scan"


def test_folder_mixed_png_and_tiff_and_palette(tmp_path):
    folder = tmp_path / "mix"
    folder.mkdir()
    rgb = make_stack((2, 4, 5, 3), "uint8")
    Image.fromarray(rgb[0]).save(folder / "a1.png")
    tifffile.imwrite(folder / "a2.TIFF", rgb[1], photometric="rgb")
    np.testing.assert_array_equal(read_back(folder)[0], rgb)
    pal = Image.fromarray(rgb[0]).convert("P")
    pal.save(folder / "a3.png")
    got = read_back(folder)[0]
    assert got.shape == (3, 4, 5, 3)
    np.testing.assert_array_equal(got[2], np.asarray(pal.convert("RGB")))


def test_folder_mismatch_names_file(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(np.zeros((4, 5), np.uint8)).save(folder / f"f{i}.png")
    Image.fromarray(np.zeros((4, 5), np.uint16)).save(folder / "f10.png")
    Image.fromarray(np.zeros((4, 6), np.uint8)).save(folder / "f5.png")
    with pytest.raises(InputError, match=r"f5\.png is 4x6 uint8 but f0\.png is 4x5 uint8"):
        open_input(folder)


def test_folder_multipage_tiff_refused(tmp_path):
    folder = tmp_path / "mp"
    folder.mkdir()
    tifffile.imwrite(folder / "a.tif", np.zeros((2, 4, 5), np.uint8))
    with pytest.raises(InputError, match="2 pages"):
        open_input(folder)


# ---------------------------------------------------------------- input errors


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        open_input(tmp_path / "nope.npy")


@pytest.mark.parametrize("dtype", ["complex64", "bool", "int64", "float16"])
def test_unsupported_dtype(tmp_path, dtype):
    np.save(tmp_path / "a.npy", np.zeros((2, 3, 4), dtype))
    with pytest.raises(UnsupportedError, match=f"dtype {dtype}.*supported dtypes: uint8, "):
        open_input(tmp_path / "a.npy")


def test_unsupported_dtype_hdf5_and_tiff(tmp_path):
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("d", data=np.zeros((2, 3, 4), np.complex64))
    with pytest.raises(UnsupportedError, match="complex64"):
        open_input(tmp_path / "c.h5")
    tifffile.imwrite(tmp_path / "i.tif", np.zeros((2, 3, 4), np.int8), photometric="minisblack")
    with pytest.raises(UnsupportedError, match="int8"):
        open_input(tmp_path / "i.tif")


def test_two_dimensional_inputs(tmp_path):
    np.save(tmp_path / "img.npy", np.zeros((3, 4), np.uint8))
    tifffile.imwrite(tmp_path / "img.tif", np.zeros((3, 4), np.uint8))
    tifffile.imwrite(tmp_path / "rgb.tif", np.zeros((3, 4, 3), np.uint8), photometric="rgb")
    for name in ("img.npy", "img.tif", "rgb.tif"):
        with pytest.raises(UnsupportedError, match="stack of frames"):
            open_input(tmp_path / name)


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4, 5, 6), ()])
def test_wrong_rank(tmp_path, shape):
    np.save(tmp_path / "a.npy", np.zeros(shape, np.uint8))
    with pytest.raises(UnsupportedError, match="dimensions"):
        open_input(tmp_path / "a.npy")


@pytest.mark.parametrize("shape", [(0, 4, 4), (3, 0, 4), (2, 3, 4, 0)])
def test_empty_stack(tmp_path, shape):
    np.save(tmp_path / "a.npy", np.zeros(shape, np.float32))
    with pytest.raises(InputError, match="empty stack"):
        open_input(tmp_path / "a.npy")


def test_empty_folder(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError, match="empty stack"):
        open_input(tmp_path / "d")


def test_single_frame_is_accepted(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros((1, 3, 4), np.uint8))
    with open_input(tmp_path / "one.npy") as stack:
        assert stack.shape == (1, 3, 4)


def test_hdf5_wrong_dataset_lists_candidates(tmp_path):
    with h5py.File(tmp_path / "run.h5", "w") as f:
        f.create_dataset("/entry/data/data", data=np.zeros((2, 3, 4), np.uint16))
        f.create_dataset("/x", data=np.zeros(3))
    with pytest.raises(InputError) as err:
        open_input(tmp_path / "run.h5", dataset="/entry/data")
    msg = str(err.value)
    assert "no dataset '/entry/data' in run.h5; datasets found: /entry/data/data" in msg
    assert "/x" in msg and "\n" not in msg
    with pytest.raises(InputError, match="no dataset '/nope'"):
        open_input(tmp_path / "run.h5", dataset="/nope")
    with open_input(tmp_path / "run.h5") as stack:  # the one rank-3 dataset is chosen
        assert stack.metadata["dataset"] == "/entry/data/data"


def test_hdf5_ambiguous_or_no_stack(tmp_path):
    with h5py.File(tmp_path / "two.h5", "w") as f:
        f.create_dataset("a", data=np.zeros((2, 3, 4)))
        f.create_dataset("b", data=np.zeros((2, 3, 4, 3)))
    with pytest.raises(InputError, match=r"--dataset.*/a .*/b "):
        open_input(tmp_path / "two.h5")
    with h5py.File(tmp_path / "none.h5", "w") as f:
        f.create_dataset("img", data=np.zeros((3, 4)))
    with pytest.raises(InputError, match=r"no 3-D or 4-D dataset.*/img \(3x4 float64\)"):
        open_input(tmp_path / "none.h5")


@pytest.mark.parametrize("name", ["bad.npy", "bad.h5", "bad.tif"])
def test_corrupt_files(tmp_path, name):
    (tmp_path / name).write_bytes(b"this is not what the extension says" * 10)
    with pytest.raises(InputError, match="cannot"):
        open_input(tmp_path / name)


def test_corrupt_png_in_folder(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.png").write_bytes(b"garbage")
    with pytest.raises(InputError, match=r"a\.png"):
        open_input(tmp_path / "d")


def test_npz_is_refused(tmp_path):
    np.savez(tmp_path / "a.npy", x=np.zeros((2, 3, 4)))  # savez appends .npz
    os.rename(tmp_path / "a.npy.npz", tmp_path / "a.npy")
    with pytest.raises(InputError, match="npz"):
        open_input(tmp_path / "a.npy")


def test_dataset_option_on_non_hdf5(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((2, 3, 4), np.uint8))
    with pytest.raises(OptionError, match="HDF5"):
        open_input(tmp_path / "a.npy", dataset="/data")


def test_detect_format(tmp_path):
    assert detect_format("a.NPY") == "npy"
    for name in ("a.h5", "a.hdf5", "a.nxs", "a.hdf"):
        assert detect_format(name) == "hdf5"
    assert detect_format("a.tif") == detect_format("a.TIFF") == "tiff"
    assert detect_format(tmp_path) == "folder"
    assert detect_format(tmp_path / "new_output_dir") == "folder"
    assert detect_format("anything.bin", format="tif") == "tiff"
    np.save(tmp_path / "a.npy", np.zeros((2, 3, 4), np.uint8))
    os.rename(tmp_path / "a.npy", tmp_path / "noext")
    assert detect_format(tmp_path / "noext") == "npy"  # recognised by its magic bytes
    with pytest.raises(InputError, match="unknown format 'jpeg'"):
        detect_format("a.npy", format="jpeg")
    (tmp_path / "a.dat").write_bytes(b"??")
    with pytest.raises(InputError, match="--format"):
        open_input(tmp_path / "a.dat")


def test_lazy_imports():
    code = "import sys, tezip.io; print(sorted({'h5py', 'tifffile', 'PIL'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(tezip.io.__file__).parents[2])},
    )
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- output rules


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "tiff", "folder"])
def test_existing_output_needs_force(tmp_path, fmt):
    path = tmp_path / EXT[fmt]
    first, second = make_stack((3, 4, 5), "uint8", 1), make_stack((3, 4, 5), "uint8", 2)
    write_stack(path, first)
    with pytest.raises(OutputExistsError, match="--force"):
        open_output(path, first.shape, first.dtype)
    write_stack(path, second, force=True)
    np.testing.assert_array_equal(read_back(path)[0], second)
    assert sorted(os.listdir(tmp_path)) == [EXT[fmt]]


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "tiff", "folder"])
def test_abort_leaves_nothing(tmp_path, fmt):
    path = tmp_path / EXT[fmt]
    data = make_stack((3, 4, 5), "uint16")
    out = open_output(path, data.shape, data.dtype)
    out.write(0, data[:2])
    out.abort()
    out.abort()
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError), open_output(path, data.shape, data.dtype) as out:
        out.write(0, data[:1])
        raise RuntimeError("encoder failed")
    assert os.listdir(tmp_path) == []
    with (
        pytest.raises(ValueError, match="only 1 of 3"),
        open_output(path, data.shape, data.dtype) as out,
    ):
        out.write(0, data[:1])
    assert os.listdir(tmp_path) == []


def test_abort_keeps_old_output(tmp_path):
    path = tmp_path / "keep.npy"
    old = make_stack((3, 4, 5), "int16")
    np.save(path, old)
    out = open_output(path, (3, 4, 5), "int16", force=True)
    out.write(0, old[:1] + 1)
    out.abort()
    np.testing.assert_array_equal(np.load(path), old)
    assert os.listdir(tmp_path) == ["keep.npy"]


def test_force_does_not_remove_foreign_directories(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(OutputExistsError, match="thesis.tex"):
        open_output(tmp_path / "home", (2, 3, 4), "uint8", force=True)
    with pytest.raises(OutputExistsError, match="is a directory"):
        open_output(tmp_path / "home", (2, 3, 4), "uint8", format="npy", force=True)
    assert (tmp_path / "home" / "thesis.tex").read_text() == "precious"


def test_output_validation(tmp_path):
    with pytest.raises(UnsupportedError, match="complex64"):
        open_output(tmp_path / "a.npy", (2, 3, 4), "complex64")
    with pytest.raises(UnsupportedError, match="stack of frames"):
        open_output(tmp_path / "a.npy", (3, 4), "uint8")
    with pytest.raises(InputError, match="empty stack"):
        open_output(tmp_path / "a.npy", (0, 3, 4), "uint8")
    with pytest.raises(OptionError, match="HDF5"):
        open_output(tmp_path / "a.npy", (2, 3, 4), "uint8", dataset="/d")
    with pytest.raises(OutputError, match="does not exist"):
        open_output(tmp_path / "no" / "a.npy", (2, 3, 4), "uint8")
    with pytest.raises(OptionError, match="dataset '/'"):
        open_output(tmp_path / "a.h5", (2, 3, 4), "uint8", dataset="/")
    assert os.listdir(tmp_path) == []


def test_writer_checks_frames(tmp_path):
    with open_output(tmp_path / "a.npy", (3, 4, 5), "int32") as out:
        with pytest.raises(ValueError, match="expected frames from 0"):
            out.write(1, np.zeros((1, 4, 5), np.int32))
        with pytest.raises(ValueError, match="do not fit"):
            out.write(0, np.zeros((1, 4, 6), np.int32))
        with pytest.raises(ValueError, match="cannot store float64"):
            out.write(0, np.zeros((1, 4, 5)))
        out.write(0, np.ones((3, 4, 5), np.uint8))  # safe casts are fine
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.ones((3, 4, 5), np.int32))


# issue 14, item 8: shapes tezip does not support are refused, as for .npy


@pytest.mark.filterwarnings("ignore:.*separate component planes:DeprecationWarning")  # on purpose
def test_tiff_with_more_than_one_axis_of_frames_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    a5 = rng.integers(0, 1000, (2, 3, 4, 8, 8)).astype(np.uint16)
    tifffile.imwrite(tmp_path / "tzcyx.tif", a5, imagej=True, metadata={"axes": "TZCYX"})
    tifffile.imwrite(tmp_path / "shaped5.tif", a5)                     # was read as (6, 8, 8, 4)
    tifffile.imwrite(tmp_path / "tzyx.tif", a5[0], imagej=True, metadata={"axes": "TZYX"})
    for name in ("tzcyx.tif", "shaped5.tif", "tzyx.tif"):
        with pytest.raises(UnsupportedError, match=r"axes .*\(T, H, W\)"):
            open_input(tmp_path / name)
    # one axis of frames, with or without channels, still reads
    thw = a5.reshape(24, 8, 8)
    tifffile.imwrite(tmp_path / "thw.tif", thw)
    tifffile.imwrite(tmp_path / "thwc.tif", np.moveaxis(a5[0, :, :3], 1, -1).copy())
    with open_input(tmp_path / "thw.tif") as s:
        assert s.shape == (24, 8, 8) and np.array_equal(s.read(0, 24), thw)
    with open_input(tmp_path / "thwc.tif") as s:
        assert s.shape == (3, 8, 8, 3)


@pytest.mark.filterwarnings("ignore:.*separate component planes:DeprecationWarning")  # on purpose
def test_folder_of_plane_stacks_is_refused_not_read_as_channels(tmp_path):
    rng = np.random.default_rng(1)
    for n in (3, 4):
        d = tmp_path / f"planes{n}"
        d.mkdir()
        for i in range(3):
            tifffile.imwrite(d / f"f{i}.tif", rng.integers(0, 1000, (n, 8, 8)).astype(np.uint16))
        with pytest.raises(UnsupportedError, match="planes"):
            open_input(d)
    d = tmp_path / "camera_rgb"        # planar RGB from other software: colour frames
    d.mkdir()
    rgb = rng.integers(0, 255, (3, 3, 8, 8)).astype(np.uint8)
    for i in range(3):
        tifffile.imwrite(d / f"f{i}.tif", rgb[i], photometric="rgb", planarconfig="separate",
                         metadata=None)
    with open_input(d) as s:
        assert s.shape == (3, 8, 8, 3)
        assert np.array_equal(s.read(0, 3), np.moveaxis(rgb, 1, -1))
