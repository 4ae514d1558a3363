"""HDF5 / NeXus files: compressing a dataset keeps the rest of the file, and decompressing
to .h5 restores an equivalent file (groups, other datasets, attributes with their types,
soft, external and hard links, the stack's chunking, filters and attributes). Chunked
datasets are read one row of chunks at a time."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
from exact import check_bound

import tezip
from tezip.io import hdf5_tree, open_input

STACK = "/entry/instrument/detector/data"


def nexus_file(path, stack: np.ndarray, chunks=(1, 24, 20), compression="gzip") -> None:
    with h5py.File(path, "w") as f:
        f.attrs["NX_class"] = "NXroot"
        f.attrs["file_name"] = str(path)
        f.attrs.create("creator_version", np.array([1, 4, 2], np.int16))
        entry = f.create_group("entry")
        entry.attrs["NX_class"] = "NXentry"
        entry.attrs["default"] = "data"
        entry.create_dataset("title", data="speckle run 42", dtype=h5py.string_dtype())
        entry.create_dataset("start_time", data=b"2026-11-23T12:00:00")
        det = entry.create_group("instrument/detector")
        det.attrs["NX_class"] = "NXdetector"
        d = det.create_dataset("data", data=stack, chunks=chunks, compression=compression,
                               fillvalue=stack.dtype.type(7))
        d.attrs["units"] = "counts"
        d.attrs.create("axes", ["frame", "y", "x"], dtype=h5py.string_dtype())
        d.attrs["interpretation"] = np.bytes_(b"image")
        det.create_dataset("x_pixel_size", data=75e-6).attrs["units"] = "m"
        det.create_dataset("dark", data=np.arange(24 * 20, dtype=np.uint16).reshape(24, 20),
                           compression="lzf")
        sample = entry.create_group("sample")
        sample.create_dataset("temperature", data=np.linspace(290, 300, stack.shape[0]))
        plot = entry.create_group("data")
        plot.attrs["NX_class"] = "NXdata"
        plot.attrs["signal"] = "data"
        plot["data"] = d                                          # hard link: same object
        plot["soft"] = h5py.SoftLink(STACK)
        entry["calibration"] = h5py.ExternalLink("calib.h5", "/geometry")
        entry["shared"] = sample                                  # a group with two names


def walk(path) -> dict:
    """Everything in a file that a user could tell apart, the stack's values aside."""
    out = {}
    with h5py.File(path, "r") as f:
        def attrs(o):
            return {k: (repr(o.attrs[k]), str(o.attrs.get_id(k).dtype)) for k in o.attrs}

        out["/"] = ("root", attrs(f))

        def visit(name, _obj=None):
            link = f.get(name, getlink=True)
            if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
                out[name] = (type(link).__name__, getattr(link, "filename", None), link.path)
                return
            obj = f[name]
            if isinstance(obj, h5py.Group):
                out[name] = ("group", attrs(obj))
                for k in obj:
                    visit(f"{name}/{k}")
            else:
                val = None if obj.name == STACK or name.endswith("data/data") else \
                    repr(obj[()])
                out[name] = ("dataset", obj.shape, str(obj.dtype), obj.chunks, obj.compression,
                             obj.fillvalue.item() if hasattr(obj.fillvalue, "item") else
                             obj.fillvalue, attrs(obj), val)

        for k in f:
            visit(k)
    return out


def stack_u16(t=20, h=24, w=20) -> np.ndarray:
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([1000 + 300 * np.sin(xx / 4 + i / 5) * np.cos(yy / 5) for i in range(t)])
    return (base + rng.integers(0, 30, base.shape)).astype(np.uint16)


def tezip_cli(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "tezip", *map(str, args)], capture_output=True,
                       text=True, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


@pytest.mark.parametrize("mode", ["lossless", "abs"])
def test_nexus_file_comes_back_equivalent(tmp_path, mode):
    data = stack_u16()
    src, tez, back = tmp_path / "run.nxs", tmp_path / "run.tez", tmp_path / "back.h5"
    nexus_file(src, data)
    bound = ["--mode", "lossless"] if mode == "lossless" else ["--mode", "abs", "--bound", "3"]
    tezip_cli("compress", src, tez, "--dataset", "/entry/data/data", *bound,
              "--predictor", "classical")
    tezip_cli("decompress", tez, back)
    assert walk(back) == walk(src)
    with h5py.File(src, "r") as a, h5py.File(back, "r") as b:
        got = b[STACK][()]
        assert b["/entry/data/data"] == b[STACK]                  # still one object
        assert b["/entry/shared"] == b["/entry/sample"]
        assert np.array_equal(b["/entry/data/soft"][()], got)
        if mode == "lossless":
            assert np.array_equal(got, a[STACK][()])
        else:
            err = np.abs(got.astype(np.int64) - a[STACK][()].astype(np.int64)).max()
            assert 0 < err <= 3
    info = tezip_cli("info", tez, "--json").stdout
    assert '"skeleton"' not in info and '"skeleton_bytes"' in info
    assert "hdf5 file" in tezip_cli("info", tez).stdout


def test_data_only_keeps_just_the_dataset(tmp_path):
    src, tez, back = tmp_path / "run.h5", tmp_path / "run.tez", tmp_path / "back.h5"
    nexus_file(src, stack_u16())
    tezip_cli("compress", src, tez, "--dataset", STACK, "--data-only", "--mode", "lossless")
    tezip_cli("decompress", tez, back)
    with h5py.File(back, "r") as b:
        assert list(b.keys()) == ["entry"] and list(b["entry"].keys()) == ["instrument"]
        assert b[STACK].attrs["units"] == "counts"


def test_a_dataset_output_path_writes_only_the_stack(tmp_path):
    src, tez, back = tmp_path / "run.h5", tmp_path / "run.tez", tmp_path / "back.h5"
    nexus_file(src, stack_u16())
    tezip_cli("compress", src, tez, "--dataset", STACK, "--mode", "lossless")
    tezip_cli("decompress", tez, back, "--dataset", "/frames")
    with h5py.File(back, "r") as b:
        assert list(b.keys()) == ["frames"]


def test_python_api_keeps_no_skeleton_unless_asked(tmp_path):
    src = tmp_path / "run.h5"
    nexus_file(src, stack_u16())
    with open_input(src, dataset=STACK) as s:
        assert hdf5_tree.KEY not in s.metadata
    with open_input(src, dataset=STACK, keep_file=True) as s:
        rec = s.metadata[hdf5_tree.KEY]
        assert rec["path"] == "/entry/data/data" or rec["path"] == STACK
        assert len(rec["aliases"]) == 1 and rec["skipped_attrs"] == []


def test_too_large_rest_of_file_is_refused_with_advice(tmp_path, monkeypatch):
    src = tmp_path / "run.h5"
    nexus_file(src, stack_u16())
    with h5py.File(src, "a") as f:
        f.create_dataset("/entry/noise", data=np.random.default_rng(0).random(40_000))
    monkeypatch.setattr(hdf5_tree, "SKELETON_LIMIT", 100_000)
    with pytest.raises(tezip.OptionError, match="--data-only"):
        open_input(src, dataset=STACK, keep_file=True)


def test_chunked_dataset_is_read_one_row_of_chunks_at_a_time(tmp_path):
    data = stack_u16(t=37)
    src = tmp_path / "c.h5"
    nexus_file(src, data, chunks=(8, 12, 10))
    reads = []
    with open_input(src, dataset=STACK) as s:
        real = s._slice

        def counted(t0, t1):
            reads.append((t0, t1))
            return real(t0, t1)

        s._slice = counted
        got = np.concatenate([s.read(t0, min(37, t0 + 5)) for t0 in range(0, 37, 5)])
        assert np.array_equal(got, data)
        assert s.read(3, 30).tobytes() == data[3:30].tobytes()
    # 5-frame reads over 8-frame chunks: each row of chunks decoded once in the first pass
    first_pass = reads[:5]
    assert [r[1] for r in first_pass] == [8, 16, 24, 32, 37]
    covered = np.zeros(37, int)
    for a, b in first_pass:
        covered[a:b] += 1
    assert covered.max() == 1 and covered.min() == 1


def test_compress_into_the_hdf5_file_itself(tmp_path):
    """OUTPUT.nxs: the same file with the stack replaced by the compressed stream; its
    metadata stays readable with h5py, and tezip reads the stream in place."""
    data = stack_u16(t=24)
    src, small, back = tmp_path / "run.nxs", tmp_path / "small.nxs", tmp_path / "back.nxs"
    nexus_file(src, data)
    tezip_cli("compress", src, small, "--dataset", STACK, "--mode", "abs", "--bound", "2",
              "--predictor", "classical")
    before, after = walk(src), walk(small)
    changed = {k for k in before if before[k] != after.get(k)}
    assert changed == {"entry/instrument/detector/data", "entry/data/data"}
    with h5py.File(small, "r") as f:
        blob = f[STACK]
        assert blob.dtype == np.uint8 and blob.attrs["tezip_stream"] == "tez"
        assert blob.attrs["units"] == "counts"                    # the stack's own attributes
        assert list(blob.attrs["tezip_shape"]) == list(data.shape)
        assert f["/entry/data/data"] == blob                      # hard link kept
        assert f["/entry/title"][()] == b"speckle run 42"
    assert small.stat().st_size < src.stat().st_size
    with tezip.open(small) as f:                                  # random access in place
        part = f[5:9]
        check_bound(data[5:9], part, "abs", 2)
    assert "(24, 24, 20) uint16" in tezip_cli("info", small).stdout
    assert "OK" in tezip_cli("verify", src, small, "--dataset", STACK).stdout
    tezip_cli("decompress", small, back)
    assert walk(back) == walk(src)
    with h5py.File(back, "r") as f:
        check_bound(data, f[STACK][()], "abs", 2)


def test_npy_into_hdf5_and_data_only(tmp_path):
    data = stack_u16(t=10)
    np.save(tmp_path / "a.npy", data)
    tezip_cli("compress", tmp_path / "a.npy", tmp_path / "a.h5", "--mode", "lossless")
    assert np.array_equal(tezip.decompress(tmp_path / "a.h5"), data)
    nexus_file(tmp_path / "run.h5", data)
    tezip_cli("compress", tmp_path / "run.h5", tmp_path / "d.h5", "--dataset", STACK,
              "--data-only", "--mode", "lossless")
    with h5py.File(tmp_path / "d.h5", "r") as f:
        assert list(f) == ["entry"] and f[STACK].attrs["units"] == "counts"
    assert np.array_equal(tezip.decompress(tmp_path / "d.h5"), data)


def test_hdf5_without_a_stream_and_a_damaged_stream(tmp_path):
    nexus_file(tmp_path / "plain.h5", stack_u16())
    p = tezip_cli("decompress", tmp_path / "plain.h5", tmp_path / "x.npy", ok=False)
    assert p.returncode == 1 and "without a tezip stream" in p.stderr
    tezip_cli("compress", tmp_path / "plain.h5", tmp_path / "c.h5", "--dataset", STACK,
              "--mode", "lossless")
    with h5py.File(tmp_path / "c.h5", "r") as f:
        offset = f[STACK].id.get_offset()
    raw = bytearray((tmp_path / "c.h5").read_bytes())
    raw[offset + 40] ^= 0xFF                                      # inside the stream
    (tmp_path / "c.h5").write_bytes(bytes(raw))
    p = tezip_cli("decompress", tmp_path / "c.h5", tmp_path / "x.npy", ok=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "damaged" in p.stderr
    assert not (tmp_path / "x.npy").exists()
    assert sorted(q.name for q in tmp_path.iterdir()) == ["c.h5", "plain.h5"]


# ---------------------------------------------------------------------------------------
# issue 14, items 6 and 7: references, dimension scales, large attributes, lost filters

CHECK_REFS = r"""
import sys, h5py, numpy as np
out = []
with h5py.File(sys.argv[1]) as f:
    objs = [f]
    f.visititems(lambda n, o: objs.append(o))
    def resolve(ref, where):
        if ref:
            target = f[ref]                       # raises on a dangling reference
            out.append((where, target.name))
    for o in objs:
        for k in o.attrs:
            aid = o.attrs.get_id(k)
            v = o.attrs[k]
            if k == "DIMENSION_LIST":
                for row in v:
                    for r in row:
                        resolve(r, f"{o.name}@{k}")
            elif k == "REFERENCE_LIST":
                for row in v:
                    resolve(row[0], f"{o.name}@{k}")
            elif h5py.check_dtype(ref=aid.dtype) is not None:
                for r in np.ravel(np.asarray(v, dtype=object)):
                    resolve(r, f"{o.name}@{k}")
        if isinstance(o, h5py.Dataset) and h5py.check_dtype(ref=o.dtype) is not None:
            for idx in np.ndindex(o.shape):
                resolve(o[idx], o.name)
print(sorted(set(out)))
"""


def references(path) -> list:
    """Every (holder, target) reference in the file, resolved in a child process (a
    dangling reference may crash the HDF5 library instead of raising)."""
    p = subprocess.run([sys.executable, "-c", CHECK_REFS, str(path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, ("dangling reference", p.returncode, p.stderr[-2000:])
    return eval(p.stdout)  # noqa: S307 - our own repr of a list of string pairs


def referencing_file(path) -> np.ndarray:
    rng = np.random.default_rng(0)
    stack = rng.normal(size=(6, 8, 10)).astype(np.float32)
    with h5py.File(path, "w") as f:
        e = f.create_group("entry")
        d = e.create_dataset("data/data", data=stack, chunks=(1, 8, 10))
        t = e.create_dataset("data/t", data=np.arange(6.0))
        t.make_scale("time")
        y = e.create_dataset("data/y", data=np.arange(8.0))
        y.make_scale("y")
        d.dims[0].attach_scale(t)
        d.dims[1].attach_scale(y)
        d.dims[0].label = "frame"
        other = e.create_dataset("other", data=np.arange(20.0))
        x = e.create_dataset("x", data=np.arange(20.0))
        x.make_scale("x")
        other.dims[0].attach_scale(x)
        refs = f.create_dataset("refs", (2,), dtype=h5py.ref_dtype)
        refs[0], refs[1] = d.ref, other.ref
        e.attrs["signal_ref"] = d.ref
        regions = f.create_dataset("regions", (1,), dtype=h5py.regionref_dtype)
        regions[0] = other.regionref[2:7]
        d.attrs["units"] = "counts"
    return stack


EXPECTED_REFS = [
    ("/entry@signal_ref", "/entry/data/data"),
    ("/entry/data/data@DIMENSION_LIST", "/entry/data/t"),
    ("/entry/data/data@DIMENSION_LIST", "/entry/data/y"),
    ("/entry/data/t@REFERENCE_LIST", "/entry/data/data"),
    ("/entry/data/y@REFERENCE_LIST", "/entry/data/data"),
    ("/entry/other@DIMENSION_LIST", "/entry/x"), ("/entry/x@REFERENCE_LIST", "/entry/other"),
    ("/refs", "/entry/data/data"), ("/refs", "/entry/other"), ("/regions", "/entry/other"),
]


def test_references_and_dimension_scales_come_back(tmp_path, capsys):
    from tezip.cli import main

    stack = referencing_file(tmp_path / "refs.h5")
    assert references(tmp_path / "refs.h5") == sorted(EXPECTED_REFS)
    assert main(["compress", str(tmp_path / "refs.h5"), str(tmp_path / "r.tez"),
                 "--mode", "lossless"]) == 0
    assert main(["decompress", str(tmp_path / "r.tez"), str(tmp_path / "back.h5")]) == 0
    assert references(tmp_path / "back.h5") == sorted(EXPECTED_REFS)
    with h5py.File(tmp_path / "back.h5") as f:
        d = f["/entry/data/data"]
        assert np.array_equal(d[()], stack)
        assert [s.name for s in d.dims[0].values()] == ["/entry/data/t"]
        assert d.dims[0].label == "frame"
        r = f["regions"][0]
        assert np.array_equal(f[r][r], np.arange(2.0, 7.0))
    # the stack embedded in an HDF5 file: references to it point to the stream, and its
    # detached dimension scales are reported; nothing dangles
    capsys.readouterr()
    assert main(["compress", str(tmp_path / "refs.h5"), str(tmp_path / "emb.h5"),
                 "--mode", "lossless"]) == 0
    assert "dimension scales" in capsys.readouterr().err
    got = references(tmp_path / "emb.h5")
    assert ("/refs", "/entry/data/data") in got and ("/regions", "/entry/other") in got
    assert not [h for h, _ in got if h.startswith("/entry/data/t")]       # detached
    assert main(["decompress", str(tmp_path / "emb.h5"), str(tmp_path / "emb_back.h5")]) == 0
    assert references(tmp_path / "emb_back.h5") == sorted(EXPECTED_REFS)


def test_references_that_cannot_be_kept_are_dropped_and_reported(tmp_path, capsys):
    from tezip.cli import main

    referencing_file(tmp_path / "refs.h5")
    with h5py.File(tmp_path / "refs.h5", "a") as f:
        ct = np.dtype([("target", h5py.ref_dtype), ("weight", "f8")])
        c = f.create_dataset("compound_refs", (1,), dtype=ct)
        c[0] = (f["entry/other"].ref, 0.5)
        f["entry/data/data"].attrs["self"] = f["entry/data/data"].ref
    assert main(["compress", str(tmp_path / "refs.h5"), str(tmp_path / "r.tez"),
                 "--mode", "lossless"]) == 0
    err = capsys.readouterr().err
    assert "tezip: note:" in err and "/compound_refs" in err
    assert main(["decompress", str(tmp_path / "r.tez"), str(tmp_path / "back.h5")]) == 0
    assert "/compound_refs" in capsys.readouterr().err
    got = references(tmp_path / "back.h5")
    assert ("/entry/data/data@self", "/entry/data/data") in got
    with h5py.File(tmp_path / "back.h5") as f:
        assert "compound_refs" not in f
    # --data-only keeps the stack's attributes as metadata: a reference there is reported
    assert main(["compress", str(tmp_path / "refs.h5"), str(tmp_path / "d.tez"),
                 "--mode", "lossless", "--dataset", "/entry/data/data", "--data-only"]) == 0
    err = capsys.readouterr().err
    assert "@self" in err and "@DIMENSION_LIST" in err


def test_large_attribute_kept_and_dropped_filter_reported(tmp_path, capsys):
    from tezip.cli import main

    rng = np.random.default_rng(1)
    big = rng.random(200_000)                                  # 1.6 MB
    with h5py.File(tmp_path / "big.h5", "w", libver="latest") as f:
        d = f.create_dataset("data", data=rng.normal(size=(6, 8, 10)).astype(np.float32),
                             chunks=(1, 8, 10), scaleoffset=3)
        d.attrs["big"] = big
    assert main(["compress", str(tmp_path / "big.h5"), str(tmp_path / "b.tez"),
                 "--bound", "1e-2"]) == 0
    assert "scaleoffset" in capsys.readouterr().err
    with tezip.open(tmp_path / "b.tez") as f:
        assert f.metadata[hdf5_tree.KEY]["dropped_filters"] == ["scaleoffset"]
    assert main(["decompress", str(tmp_path / "b.tez"), str(tmp_path / "back.h5")]) == 0
    assert "scaleoffset" in capsys.readouterr().err
    assert main(["compress", str(tmp_path / "big.h5"), str(tmp_path / "emb.h5"),
                 "--bound", "1e-2"]) == 0
    assert "scaleoffset" in capsys.readouterr().err
    for out in ("back.h5", "emb.h5"):
        with h5py.File(tmp_path / out) as f:
            assert np.array_equal(f["data"].attrs["big"], big), out
