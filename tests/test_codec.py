"""Codec and container: predictors, random access, corruption detection, limits."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound

import tezip
from tezip import predictors, quantize
from tezip.container import FORMAT_VERSION


def _round_trip(name, x, qp, config=None):
    """Code window ``x`` with predictor ``name`` (its tuned configuration, or ``config``)
    and decode it; returns (encoder's reconstruction, decoded)."""
    from tezip.codec import decode_window, encode_window

    if config is not None:
        pred = predictors.get(name)
        orig = pred.configs
        pred.configs = lambda *a: [config]          # a single candidate: coded as given
        try:
            data, used = encode_window(x, qp, (name,))
        finally:
            pred.configs = orig
    else:
        data, used = encode_window(x, qp, (name,))
    assert used in predictors.LOSSLESS if qp.kind == "bits" else used == name
    back = decode_window(data, qp, x.shape[1:], x.shape[0])
    return data, back


QPS = {"float": quantize.QuantParams("float", "float32", step=0.2, eb=0.1),
       "int": quantize.QuantParams("int", "uint16", step=7.0, eb=3.0),
       "identity": quantize.QuantParams("identity", "uint16"),
       "bits": quantize.QuantParams("bits", "float32"),
       "log": quantize.QuantParams("log", "float32", step=0.02, eb=0.007)}


def _data(kind, shape):
    rng = np.random.default_rng(1)
    if kind in ("int", "identity"):
        return rng.integers(0, 60000, size=shape).astype(np.uint16)
    x = (np.cumsum(rng.normal(size=shape), axis=0) * 1e3).astype(np.float32)
    if kind != "log":
        x.reshape(-1)[::97] = np.nan
        x.reshape(-1)[5::101] = -np.inf
    x.reshape(-1)[3::89] = 0.0
    x.reshape(-1)[7::89] = -0.0
    return x


@pytest.mark.parametrize("name", predictors.CLASSICAL_CANDIDATES)
@pytest.mark.parametrize("shape", [(16, 33, 17), (5, 1, 9), (3, 4, 5, 3), (2, 64, 2), (2, 3, 3)])
@pytest.mark.parametrize("kind", list(QPS))
def test_predictors_decode_exactly_what_they_encode(name, shape, kind):
    x = _data(kind, shape)
    qp = QPS[kind]
    _, back = _round_trip(name, x, qp)
    check_bound(x, back, *{"float": ("abs", 0.1), "int": ("abs", 3), "identity": ("lossless", None),
                           "bits": ("lossless", None), "log": ("pwrel", 0.007)}[kind])


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
@pytest.mark.parametrize("cubic", [False, True])
@pytest.mark.parametrize("ab", [[1.0, 1.0], [2.0, 3.0]])
@pytest.mark.parametrize("anchor", [0, 4, 32])
def test_every_interpolation_configuration_round_trips(order, cubic, ab, anchor):
    x = _data("float", (9, 21, 14))
    cfg = {"order": order, "cubic": cubic, "ab": ab, "anchor": anchor}
    data, back = _round_trip("interp", x, QPS["float"], cfg)
    check_bound(x, back, "abs", 0.1)
    with tezip.TezFile(tezip.compress(x, mode="abs", bound=0.1)) as f:
        assert f.window_meta(0)["p"] in predictors.CLASSICAL_CANDIDATES


def test_grid_predictors_wrap_consistently_at_int64_limits():
    info = np.finfo(np.float64)
    x = np.array([info.max, -info.max, np.nan, -0.0, info.tiny, -np.inf] * 16,
                 np.float64).reshape(4, 4, 6)
    _, back = _round_trip("interp", x, quantize.QuantParams("bits", "float64"))
    assert back.tobytes() == x.tobytes()
    y = np.array([np.iinfo(np.int32).max, np.iinfo(np.int32).min] * 32, np.int32).reshape(4, 4, 4)
    for name in predictors.CLASSICAL_CANDIDATES:
        _, back = _round_trip(name, y, quantize.QuantParams("identity", "int32"))
        assert np.array_equal(back, y), name


def test_auto_is_never_worse_than_the_best_fixed_predictor():
    a = smooth_stack((24, 40, 40), "float32")
    sizes = {p: len(tezip.compress(a, mode="rel", bound=1e-3, predictor=p))
             for p in predictors.CLASSICAL_CANDIDATES}
    auto = len(tezip.compress(a, mode="rel", bound=1e-3, predictor="auto"))
    assert auto <= min(sizes.values()) * 1.01, (auto, sizes)


def test_compression_actually_compresses_smooth_data():
    a = smooth_stack((32, 64, 64), "float32")
    assert a.nbytes / len(tezip.compress(a, mode="rel", bound=1e-3)) > 4


@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint16"])
@pytest.mark.parametrize("shape", [(9, 20, 13), (9, 20, 13, 2)])
def test_narrow_integers_decode_through_int32_to_the_encoders_values(dtype, shape,
                                                                     monkeypatch):
    """Interpolation decodes 8- and 16-bit integers of windows of up to
    ``NARROW_VIA_INT32`` values into an int32 array and narrows it: the values at both
    ends of the type's range, the clamped ones and the outliers come out as the encoder
    reconstructed them (``decode_window`` checks its CRC), within the bound, into a
    given array too; larger windows decode in their own type to the same values."""
    from tezip.codec import decode_window, encode_window
    from tezip.predictors import classical

    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    x = rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    x.reshape(-1)[::5] = info.min
    x.reshape(-1)[1::7] = info.max
    eb = 2 if dtype == "uint8" else 300
    qp = quantize.resolve(quantize.ErrorBound("abs", abs=eb), np.dtype(dtype), (0.0, 0.0))
    kernels = []
    call = classical.call
    monkeypatch.setattr(classical, "call", lambda k, lit, *a: (kernels.append(
        (k.__name__, a[0].dtype)), call(k, lit, *a))[1])
    data, used = encode_window(x, qp, ("interp",))
    assert used == "interp"
    kernels.clear()
    back = decode_window(data, qp, x.shape[1:], x.shape[0])
    assert back.dtype == x.dtype
    assert kernels and set(kernels) == {("decode", np.dtype(np.int32))}
    check_bound(x, back, "abs", eb)
    into = np.full(x.shape, 1, dtype)
    assert decode_window(data, qp, x.shape[1:], x.shape[0], out=into) is into
    assert np.array_equal(into, back)
    # past NARROW_VIA_INT32 values a window decodes in its own type (the same values)
    monkeypatch.setattr(classical, "NARROW_VIA_INT32", int(np.prod(shape[:3])) - 1)
    kernels.clear()
    assert np.array_equal(decode_window(data, qp, x.shape[1:], x.shape[0]), back)
    assert set(kernels) == {("decode", np.dtype(dtype))}


@pytest.mark.parametrize("shape", [(21, 9, 7), (21, 9, 7, 3)])
@pytest.mark.parametrize("threads", [1, 3])
def test_ranges_decoded_in_place_equal_the_whole(shape, threads):
    """Windows wholly inside a range are decoded straight into the result, the others
    into their own array and copied: every range gives the whole file's values."""
    a = smooth_stack(shape, "float32", scale=50)
    blob = tezip.compress(a, mode="rel", bound=1e-3, window=4, threads=threads)
    full = tezip.decompress(blob, threads=threads)
    with tezip.TezFile(blob, threads=threads) as f:
        for t0 in range(0, 21, 3):
            for t1 in range(t0 + 1, 22, 4):
                assert np.array_equal(f[t0:t1], full[t0:t1]), (t0, t1)


def test_random_access_decodes_only_needed_windows(tmp_path, monkeypatch):
    a = smooth_stack((40, 16, 16), "uint16", scale=3000)
    p = tmp_path / "a.tez"
    p.write_bytes(tezip.compress(a, mode="abs", bound=2, window=8))
    full = tezip.decompress(p.read_bytes())
    with tezip.open(p) as f:
        calls = []
        orig = f._decode
        monkeypatch.setattr(f, "_decode",
                            lambda i, data, *out: calls.append(i) or orig(i, data, *out))
        assert np.array_equal(f[10:20], full[10:20])
        assert calls == [1, 2]
        calls.clear()
        assert np.array_equal(f[8:24], full[8:24])       # whole windows: decoded in place
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
    from fuzz_target import reseal

    return reseal(blob, lambda header, entries, payloads: change(header))


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


@pytest.mark.parametrize("dtype,mode", [("float32", "lossless"), ("uint16", "abs"),
                                        ("float32", "rel")])
def test_a_window_off_its_checksum_is_damage_not_a_machine_mismatch(dtype, mode):
    """Classical and bit-exact windows use only reproducible arithmetic: values that do
    not match their checksum mean a damaged file (CorruptFileError), not a machine that
    computes differently (DecodeMismatchError, kept for learned forecasts)."""
    from tezip import codec, payload

    a = smooth_stack((6, 12, 12), dtype, scale=3000)
    bound = {"lossless": None, "rel": 2e-3, "abs": 3}[mode]
    blob = tezip.compress(a, mode=mode, bound=bound, window=6)
    with tezip.open(blob) as f:
        data = f._payload(0)
        quant, frame_shape = f.quant, f.shape[1:]
    crc = payload.peek_meta(data)["c"]
    old = f'"c":{crc}'.encode()
    new = f'"c":{(crc + 1) % 10 ** len(str(crc))}'.encode().ljust(len(old), b" ")[:len(old)]
    damaged = data.replace(old, new, 1)
    assert damaged != data
    with pytest.raises(tezip.CorruptFileError, match="checksum"):
        codec.decode_window(damaged, quant, frame_shape, 6)
    assert np.array_equal(codec.decode_window(data, quant, frame_shape, 6),
                          tezip.decompress(blob))


@pytest.mark.parametrize("start", ["random", "repetitive"])
def test_a_large_low_bit_stream_is_compressed_when_its_start_compresses(start):
    from tezip import payload

    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, 3 * payload.PROBE_BYTES, dtype=np.uint8).tobytes()
    head = noise[:payload.PROBE_BYTES] if start == "random" else bytes(payload.PROBE_BYTES)
    low = head + bytes(2 * payload.PROBE_BYTES)      # compressible as a whole either way
    packed = payload.pack({"p": "x"}, {"model": b"m", "words": b"w" * 8, "low": low})
    meta = payload.peek_meta(packed)
    # a start like the near-uniform low bits: stored as is, without compressing the rest
    assert (meta["z"][2] == 0) == (start == "random")
    back = payload.unpack(packed, {n: len(low) for n in payload.SECTIONS})
    assert back.sections["low"] == low
    # a short stream is still tried whole
    small = noise[:1000] + bytes(2000)
    meta = payload.peek_meta(payload.pack({"p": "x"}, {"model": b"m", "words": b"w" * 8,
                                                       "low": small}))
    assert meta["z"][2] == len(small)
