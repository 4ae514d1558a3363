"""The numcodecs / zarr face: tezip.zarr_codec.Tezip (zarr format 2 compressor) and
TezipZarr3 (zarr format 3 serializer) store a (T, H, W) array chunked along time within
the bound."""

from __future__ import annotations

import importlib.metadata
import pathlib

import numpy as np
import pytest
from exact import check_bound

numcodecs = pytest.importorskip("numcodecs")
zarr = pytest.importorskip("zarr")

import tezip  # noqa: E402
from tezip.zarr_codec import Tezip  # noqa: E402

SHAPE = (24, 32, 40)
CHUNKS = (8, 32, 40)
FORMATS = [2, 3]


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    rng = np.random.default_rng(7)
    t, y, x = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in SHAPE), indexing="ij")
    smooth = np.sin(0.21 * x + 0.13 * t) * np.cos(0.17 * y - 0.05 * t) + 0.02 * t
    return (smooth + 0.01 * rng.standard_normal(SHAPE)).astype(np.float32)


def _create(path: pathlib.Path, codec: Tezip, fmt: int, *, shape=SHAPE, chunks=CHUNKS,
            dtype="float32"):
    kw = ({"compressors": codec} if fmt == 2
          else {"serializer": codec.zarr3(), "compressors": None})
    return zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype,
                             zarr_format=fmt, **kw)


def _stored_bytes(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*")
               if p.is_file() and not p.name.startswith((".z", "zarr.json")))


@pytest.mark.parametrize("fmt", FORMATS)
def test_abs_bound_round_trip(tmp_path, data, fmt):
    path = tmp_path / "a.zarr"
    arr = _create(path, Tezip(mode="abs", bound=1e-3), fmt)
    arr[:] = data
    back = zarr.open_array(str(path), mode="r")[:]
    assert back.shape == data.shape and back.dtype == data.dtype
    check_bound(data, back, "abs", 1e-3)
    assert 0 < _stored_bytes(path) < data.nbytes


@pytest.mark.parametrize("fmt", FORMATS)
def test_rel_bound_with_global_value_range(tmp_path, data, fmt):
    lo, hi = float(data.min()), float(data.max())
    path = tmp_path / "r.zarr"
    arr = _create(path, Tezip(mode="rel", bound=1e-3, value_range=(lo, hi)), fmt)
    arr[:] = data
    back = zarr.open_array(str(path), mode="r")[:]
    check_bound(data, back, "rel", 1e-3, value_range=(lo, hi))
    assert 0 < _stored_bytes(path) < data.nbytes


def test_rel_bound_without_value_range_is_per_chunk(tmp_path, data):
    c = Tezip(mode="rel", bound=1e-3)
    for t0 in range(0, SHAPE[0], CHUNKS[0]):
        chunk = data[t0:t0 + CHUNKS[0]]
        back = c.decode(c.encode(chunk))
        check_bound(chunk, back, "rel", 1e-3)          # each chunk's own range


@pytest.mark.parametrize("fmt", FORMATS)
def test_uint16_lossless_bit_exact(tmp_path, fmt):
    rng = np.random.default_rng(3)
    x = (1000 + np.cumsum(rng.integers(-3, 4, size=SHAPE), axis=0)).astype(np.uint16)
    path = tmp_path / "u.zarr"
    arr = _create(path, Tezip(mode="lossless"), fmt, dtype="uint16")
    arr[:] = x
    back = zarr.open_array(str(path), mode="r")[:]
    assert back.dtype == np.uint16 and np.array_equal(back, x)


@pytest.mark.parametrize("fmt", FORMATS)
def test_single_frame_chunks_and_partial_edge_chunk(tmp_path, data, fmt):
    # chunks of one frame (the xarray default for many time series) and an edge chunk
    # zarr pads: both are coded, not refused
    for name, chunks, shape in [("one", (1, 32, 40), SHAPE), ("edge", (8, 32, 40), (21, 32, 40))]:
        path = tmp_path / f"{name}.zarr"
        x = data[:shape[0]]
        arr = _create(path, Tezip(mode="abs", bound=1e-2), fmt, shape=shape, chunks=chunks)
        arr[:] = x
        check_bound(x, zarr.open_array(str(path), mode="r")[:], "abs", 1e-2)


def test_chunk_shapes_and_byte_order_round_trip():
    rng = np.random.default_rng(5)
    c = Tezip(mode="abs", bound=1e-2)
    for shape, dtype in [((1, 16, 16), "<f4"), ((16, 16), "<f4"), ((3, 4, 5, 6, 2), "<f8"),
                         ((4, 8, 8, 3), "<f4"), ((4, 8, 8), ">f4")]:
        x = rng.random(shape).astype(dtype)
        back = c.decode(c.encode(x))
        assert back.shape == x.shape and back.dtype == x.dtype
        check_bound(x, back, "abs", 1e-2)
        out = np.empty_like(x)
        assert c.decode(c.encode(x), out=out) is out
        check_bound(x, out, "abs", 1e-2)
    x = np.arange(2 * 8 * 8, dtype=">u2").reshape(2, 8, 8)
    assert Tezip().decode(Tezip().encode(x)).tobytes() == x.tobytes()


def test_unusable_chunks_raise_tezip_errors(tmp_path):
    c = Tezip(mode="abs", bound=1e-2)
    with pytest.raises(tezip.UnsupportedError, match="1-D"):
        c.encode(np.zeros(10, np.float32))
    with pytest.raises(tezip.UnsupportedError, match="byte buffer"):
        c.encode(b"\0" * 64)
    with pytest.raises(tezip.UnsupportedError, match="int64"):
        c.encode(np.zeros((2, 4, 4), np.int64))
    with pytest.raises(tezip.UnsupportedError, match="int64"):
        _create(tmp_path / "i.zarr", c, 3, dtype="int64")
    with pytest.raises(tezip.OptionError):
        Tezip(mode="rel", bound=1e-3, value_range=(1.0, 0.0))
    with pytest.raises(tezip.OptionError):
        Tezip(mode="nope", bound=1.0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_chunk_raises(tmp_path, data, fmt):
    path = tmp_path / "d.zarr"
    arr = _create(path, Tezip(mode="abs", bound=1e-3), fmt)
    arr[:] = data
    chunk = next(p for p in sorted(path.rglob("*"))
                 if p.is_file() and not p.name.startswith((".z", "zarr.json")))
    blob = bytearray(chunk.read_bytes())
    blob[len(blob) // 2] ^= 0x5A
    chunk.write_bytes(bytes(blob))
    with pytest.raises(tezip.CorruptFileError):
        zarr.open_array(str(path), mode="r")[:]
    with pytest.raises(tezip.CorruptFileError):
        Tezip().decode(b"not a tez stream")


def test_config_round_trip():
    c = Tezip(mode="absrel", bound=0.5, rel_bound=1e-3, predictor="classical", window=8,
              value_range=(-1.0, 2.0))
    config = c.get_config()
    assert config == {"id": "tezip", "mode": "absrel", "bound": 0.5, "rel_bound": 1e-3,
                      "predictor": "classical", "window": 8, "value_range": [-1.0, 2.0]}
    assert Tezip.from_config(config) == c
    assert numcodecs.get_codec(config) == c
    assert Tezip(bound=1e-3).mode == "rel" and Tezip().mode == "lossless"
    # the automatic window is no entry (a config tezip 0.7.5 reads too, as 33 frames)
    auto = Tezip(bound=1e-3)
    assert auto.window is None and "window" not in auto.get_config()
    assert Tezip.from_config(auto.get_config()) == auto
    a3 = auto.zarr3()           # (its fields: window None, no entry in its configuration)
    assert a3.window is None and "window" not in a3.to_dict()["configuration"]
    assert type(a3).from_dict(a3.to_dict()) == a3 and hash(a3) == hash(a3) and repr(a3)
    v3 = c.zarr3()
    assert type(v3).from_dict(v3.to_dict()) == v3
    assert v3.to_dict()["name"] == "tezip"


def test_registered_through_entry_points(monkeypatch):
    eps = importlib.metadata.entry_points(group="numcodecs.codecs").select(name="tezip")
    assert [e.value for e in eps] == ["tezip.zarr_codec:Tezip"]
    # not registered by an import: numcodecs must load it through the entry point
    monkeypatch.delitem(numcodecs.registry.codec_registry, "tezip", raising=False)
    codec = numcodecs.get_codec({"id": "tezip", "mode": "abs", "bound": 0.25})
    assert isinstance(codec, Tezip) and codec.bound == 0.25
    (ep3,) = importlib.metadata.entry_points(group="zarr.codecs").select(name="tezip")
    assert ep3.value == "tezip.zarr_codec:TezipZarr3"
    assert ep3.load() is type(Tezip().zarr3())


def test_learned_predictor_under_zarr_concurrency(tmp_path):
    """zarr v3 codes and decodes chunks in threads: a learned-coded array written and read
    back under zarr's default concurrency keeps the bound (and its chunks are learned)."""
    from tezip.models_path import default_model_path

    if not default_model_path().is_file():
        pytest.skip("this installation ships no default model")
    rng = np.random.default_rng(3)
    a = np.cumsum(rng.normal(size=(48, 24, 20)), axis=0).astype(np.float32)
    codec = Tezip(mode="abs", bound=0.05, predictor="learned", window=8)
    z = _create(tmp_path / "l.zarr", codec, 3, shape=a.shape, chunks=(8, 12, 10))
    z[:] = a
    back = zarr.open_array(str(tmp_path / "l.zarr"), mode="r")[:]
    check_bound(a, back, "abs", 0.05)
    chunk = next(p for p in (tmp_path / "l.zarr").rglob("*")
                 if p.is_file() and p.name != "zarr.json")
    with tezip.TezFile(chunk.read_bytes()) as f:
        assert {f.window_meta(i)["p"] for i in range(f.n_windows)} == {"learned"}
