"""Codec and container: predictors, random access, corruption detection, limits."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound

import tezip
from tezip import predictors, quantize
from tezip.container import FORMAT_VERSION, MAGIC


def _round_trip(pred, x, qp, model=None):
    """Encode with a predictor and decode through a take() that replays the codes."""
    from tezip.codec import _resolve_predictor, _run
    pred = _resolve_predictor(pred, qp, model)
    m = quantize.masks(x, qp)
    codes, ctx, out = _run(pred, x, qp, m)
    assert codes.shape == ctx.shape == (x.size,)
    assert ctx.min() >= 0 and ctx.max() < pred.n_contexts
    pos = 0

    def take(c):
        nonlocal pos
        assert np.array_equal(c.ravel(), ctx[pos:pos + c.size]), "decoder context differs"
        pos += c.size
        return codes[pos - c.size:pos]

    if pred.domain == "grid":
        back = quantize.from_grid(pred.decode(x.shape, take), qp, m)
    else:
        back = quantize.from_values(pred.decode(x.shape, quantize.value_grid(qp), take), qp, m)
    assert pos == codes.size
    return out, back


CLASSICAL = [n for n in predictors.names() if n not in predictors.LEARNED]


@pytest.mark.parametrize("name", CLASSICAL)
@pytest.mark.parametrize("shape", [(16, 33, 17), (5, 1, 9), (3, 4, 5, 3), (2, 64, 2), (1, 3, 3)])
@pytest.mark.parametrize("kind", ["float", "int", "bits", "log"])
def test_predictors_decode_exactly_what_they_encode(name, shape, kind):
    rng = np.random.default_rng(1)
    if kind == "int":
        x = rng.integers(0, 60000, size=shape).astype(np.uint16)
        qp = quantize.QuantParams("int", "uint16", step=7.0, eb=3.0)
    else:
        x = (np.cumsum(rng.normal(size=shape), axis=0) * 1e3).astype(np.float32)
        qp = {"float": quantize.QuantParams("float", "float32", step=0.2, eb=0.1),
              "bits": quantize.QuantParams("bits", "float32"),
              "log": quantize.QuantParams("log", "float32", step=0.02, eb=0.007)}[kind]
    out, back = _round_trip(name, x, qp)
    assert np.array_equal(out, back, equal_nan=True)


def test_grid_predictors_wrap_consistently_at_int64_limits():
    x = np.array([np.iinfo(np.int32).max, np.iinfo(np.int32).min] * 32, np.int32).reshape(4, 4, 4)
    qp = quantize.QuantParams("identity", "int32")
    for name in CLASSICAL:
        out, back = _round_trip(name, x, qp)
        assert np.array_equal(out, x) and np.array_equal(back, x), name


def test_auto_is_never_worse_than_the_best_fixed_predictor():
    a = smooth_stack((24, 40, 40), "float32")
    sizes = {p: len(tezip.compress(a, mode="rel", bound=1e-3, predictor=p))
             for p in predictors.CLASSICAL_CANDIDATES}
    auto = len(tezip.compress(a, mode="rel", bound=1e-3, predictor="auto"))
    assert auto <= min(sizes.values()) * 1.01, (auto, sizes)


def test_compression_actually_compresses_smooth_data():
    a = smooth_stack((32, 64, 64), "float32")
    assert a.nbytes / len(tezip.compress(a, mode="rel", bound=1e-3)) > 4


def test_random_access_decodes_only_needed_windows(tmp_path, monkeypatch):
    a = smooth_stack((40, 16, 16), "uint16", scale=3000)
    p = tmp_path / "a.tez"
    p.write_bytes(tezip.compress(a, mode="abs", bound=2, window=8))
    full = tezip.decompress(p.read_bytes())
    with tezip.open(p) as f:
        calls = []
        orig = f.decode_window
        monkeypatch.setattr(f, "decode_window", lambda i: calls.append(i) or orig(i))
        assert np.array_equal(f[10:20], full[10:20])
        assert calls == [1, 2]
        assert np.array_equal(f[17], full[17])
        assert np.array_equal(f[-1], full[-1])
        assert np.array_equal(f[3:30:7], full[3:30:7])
        assert np.array_equal(f[5:9, 2:4], full[5:9, 2:4])
        assert f[30:10].shape == (0, 16, 16)
        with pytest.raises(IndexError):
            f[40]
        assert len(f) == 40 and f.dtype == np.uint16


def test_same_input_same_bytes():
    a = smooth_stack((10, 20, 20), "float64")
    assert tezip.compress(a, mode="abs", bound=1e-2) == tezip.compress(a, mode="abs", bound=1e-2)


def test_every_flipped_byte_and_every_truncation_is_detected():
    a = smooth_stack((5, 6, 7), "float32")
    a[1, 2, 3] = np.nan
    blob = tezip.compress(a, mode="abs", bound=1e-2, window=2)
    good = tezip.decompress(blob)
    assert len(blob) < 2000
    for i in range(len(blob)):
        for flip in (0x01, 0x80):
            bad = bytearray(blob)
            bad[i] ^= flip
            with pytest.raises(tezip.TezipError):
                out = tezip.decompress(bytes(bad))
                # a decode that succeeds must be exact; (it cannot: every byte is covered)
                assert np.array_equal(out, good, equal_nan=True)
                raise AssertionError(f"flip at byte {i} went unnoticed")
    for n in range(len(blob)):
        with pytest.raises(tezip.TezipError):
            tezip.decompress(blob[:n])


def _rewrite_header(blob: bytes, change) -> bytes:
    hlen = struct.unpack_from("<I", blob, 10)[0]
    header = json.loads(blob[14:14 + hlen])
    change(header)
    body = json.dumps(header).encode()
    pre = struct.pack("<8sHI", MAGIC, header.get("format_version", FORMAT_VERSION), len(body))
    pre = pre + body
    rest = blob[14 + hlen + 4:]
    # window offsets in the index shift with the header length: rebuild them
    foot = rest[-28:]
    index_off, n, _, fm, _ = struct.unpack("<QII8sI", foot)
    shift = len(pre) + 4 - (14 + hlen + 4)
    index = bytearray(rest[index_off - (14 + hlen + 4):-28])
    for i in range(n):
        off = struct.unpack_from("<Q", index, i * 28)[0]
        struct.pack_into("<Q", index, i * 28, off + shift)
    newfoot = struct.pack("<QII8s", index_off + shift, n, zlib.crc32(index), fm)
    newfoot += struct.pack("<I", zlib.crc32(newfoot))
    body_windows = rest[:index_off - (14 + hlen + 4)]
    return pre + struct.pack("<I", zlib.crc32(pre)) + body_windows + bytes(index) + newfoot


def test_newer_format_version_is_refused_by_name():
    blob = tezip.compress(smooth_stack((4, 8, 8)), mode="abs", bound=0.1)
    hlen = struct.unpack_from("<I", blob, 10)[0]
    pre = bytearray(blob[:14 + hlen])
    struct.pack_into("<H", pre, 8, FORMAT_VERSION + 1)
    newer = bytes(pre) + struct.pack("<I", zlib.crc32(pre)) + blob[14 + hlen + 4:]
    with pytest.raises(tezip.FormatVersionError, match="upgrade tezip"):
        tezip.decompress(newer)


def test_crafted_header_cannot_make_the_decoder_allocate_huge_arrays():
    blob = tezip.compress(smooth_stack((4, 8, 8)), mode="abs", bound=0.1, window=2)
    assert tezip.decompress(_rewrite_header(blob, lambda h: None)).shape == (4, 8, 8)

    def huge(h):
        h["shape"] = [4, 2**20, 2**20]
    with pytest.raises(tezip.CorruptFileError):
        tezip.decompress(_rewrite_header(blob, huge))

    def wrong_frames(h):
        h["shape"] = [400, 8, 8]
    with pytest.raises(tezip.CorruptFileError):
        tezip.decompress(_rewrite_header(blob, wrong_frames))


def test_api_errors_are_tezip_errors():
    a = smooth_stack((4, 8, 8))
    with pytest.raises(tezip.OptionError):
        tezip.compress(a, mode="abs", bound=0)
    with pytest.raises(tezip.OptionError):
        tezip.compress(a, mode="abs", bound=-1)
    with pytest.raises(tezip.OptionError):
        tezip.compress(a, mode="nope", bound=1)
    with pytest.raises(tezip.OptionError):
        tezip.compress(a, mode="abs", bound=float("nan"))
    with pytest.raises(tezip.OptionError):
        tezip.compress(a, mode="pwrel", bound=1.5)
    with pytest.raises(tezip.OptionError):
        tezip.compress(a, mode="abs", bound=1, predictor="magic")
    with pytest.raises(tezip.UnsupportedError):
        tezip.compress(a[:1], mode="abs", bound=1)
    with pytest.raises(tezip.UnsupportedError):
        tezip.compress(a[:0], mode="abs", bound=1)
    with pytest.raises(tezip.UnsupportedError):
        tezip.compress(a[0], mode="abs", bound=1)
    with pytest.raises(tezip.UnsupportedError):
        tezip.compress(a.astype(np.complex64), mode="abs", bound=1)
    with pytest.raises(tezip.InputError):
        tezip.decompress(b"this is not a tez file at all, just text")


def test_integer_rel_bound_below_one_is_lossless():
    a = smooth_stack((6, 10, 10), "uint8", scale=50)
    b = tezip.decompress(tezip.compress(a, mode="rel", bound=1e-3))
    assert np.array_equal(a, b)


def test_metadata_round_trips():
    blob = tezip.compress(smooth_stack((3, 4, 4)), mode="abs", bound=1,
                          metadata={"source": "x.h5", "attrs": {"units": "counts"}})
    with tezip.TezFile(blob) as f:
        assert f.metadata["attrs"] == {"units": "counts"}


def test_dynamic_windows_start_a_keyframe_at_a_scene_cut():
    a = smooth_stack((12, 24, 24), "float32")
    b = smooth_stack((12, 24, 24), "float32", seed=7)[::-1] * 3 + 50
    x = np.concatenate([a, b])                       # a cut at frame 12
    blob = tezip.compress(x, mode="rel", bound=1e-3, window=8, threshold=0.05)
    with tezip.open(blob) as f:
        starts = [t0 for t0, _ in f.window_frames()]
        assert f.header["windows"] == "dynamic" and f.header["threshold"] == 0.05
        assert 12 in starts and starts[0] == 0
        assert all(t1 - t0 <= 8 for t0, t1 in f.window_frames())
        back = f.read_all()
    check_bound(x, back, "rel", 1e-3)
    fixed = tezip.compress(x, mode="rel", bound=1e-3, window=8)
    with tezip.open(fixed) as f:
        assert 12 not in [t0 for t0, _ in f.window_frames()]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_dynamic_window_threshold_must_be_positive(bad):
    with pytest.raises(tezip.OptionError):
        tezip.compress(smooth_stack((4, 8, 8), "float32"), threshold=bad)
