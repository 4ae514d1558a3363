"""Bit-exact floats as byte planes + zstd (predictor 'shuffle'): exact round trips of
every transform, the per-window choice against 'bits' by real size, and damage."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from conftest import smooth_stack
from exact import bytes_equal
from fuzz_target import damage_window, reseal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tezip
from tezip import codec, payload, predictors
from tezip.predictors import shuffle
from tezip.quantize import QuantParams

SPECIAL = {"float32": [0x7FC00123, 0xFF800001, 0x80000000, 0x7F800000, 0x00000001],
           "float64": [0x7FF8000000000123, 0xFFF0000000000001, 0x8000000000000000,
                       0x7FF0000000000000, 0x0000000000000001]}


def plume(shape=(8, 24, 20), dtype="float32", seed=0, zeros=0.5):
    """A smooth positive field that is exactly zero on a ``zeros`` fraction: where
    byte planes beat the residual coder (as on smoke_phiflow)."""
    a = smooth_stack(shape, "float64", seed=seed, scale=2.0)
    cut = np.quantile(a, zeros)
    return np.where(a > cut, a - cut, 0.0).astype(dtype)


@st.composite
def windows(draw):
    dtype = draw(st.sampled_from(["float32", "float64"]))
    shape = (draw(st.integers(1, 6)), draw(st.integers(1, 9)), draw(st.integers(1, 9)))
    if draw(st.booleans()):
        shape = (*shape, draw(st.integers(1, 3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["smooth", "sparse", "wide", "bits", "constant"]))
    n = int(np.prod(shape))
    u = np.dtype(f"u{np.dtype(dtype).itemsize}")
    if kind == "bits":                      # any bit pattern at all
        a = rng.integers(0, np.iinfo(u).max, size=shape, dtype=u, endpoint=True).view(dtype)
    elif kind == "constant":
        a = np.full(shape, draw(st.floats(allow_nan=True, width=32)), dtype)
    else:
        a = np.cumsum(rng.normal(size=n)).reshape(shape) * 10.0 ** rng.integers(-30, 30)
        if kind == "wide":
            a *= 10.0 ** rng.integers(-20, 20, size=shape)
        with np.errstate(over="ignore"):
            a = a.astype(dtype)                 # beyond float32: +-inf, also fine
        if kind == "sparse":
            a[rng.random(shape) < draw(st.floats(0.0, 1.0))] = draw(st.sampled_from(
                [0.0, -0.0, np.nan, -200.0]))
    flat = a.reshape(-1)
    k = draw(st.integers(0, 3))
    idx = rng.integers(0, n, size=k)
    flat[idx] = np.array(SPECIAL[dtype], u)[rng.integers(0, 5, size=k)].view(dtype)
    return np.ascontiguousarray(a)


def _sections(cfg, sections, shape, dtype):
    cfg = shuffle.ByteShuffle().validate(json.loads(json.dumps(cfg)), shape)
    return shuffle.ByteShuffle().decode(shape, np.dtype(dtype), cfg,
                                        sections.get("masks", b""), sections["planes"])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(), st.sampled_from(shuffle.TRANSFORMS))
def test_every_transform_round_trips_every_bit_pattern(x, transform):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shuffle, "TRANSFORMS", (transform,))
        cfg, sections = shuffle.ByteShuffle().encode(x)
    assert cfg["t"] == transform
    back = _sections(cfg, sections, x.shape, x.dtype)
    assert back.dtype == x.dtype and back.shape == x.shape
    assert bytes_equal(x, back).all()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows(), st.integers(1, 4))
def test_lossless_files_round_trip_bit_exact(x, window):
    if x.shape[0] < 2:
        x = np.concatenate([x, x[::-1]])
    back = tezip.decompress(tezip.compress(x, mode="lossless", window=window))
    assert back.dtype == x.dtype and bytes_equal(x, back).all()


def test_the_fill_value_goes_to_a_mask_only_when_frequent():
    x = plume()
    cfg, sections = shuffle.ByteShuffle().encode(x)
    assert cfg["fill"] == 0 and len(sections["masks"]) == (x.size + 7) // 8
    y = smooth_stack((8, 24, 20), "float32")
    cfg, sections = shuffle.ByteShuffle().encode(y)
    assert cfg["fill"] is None and "masks" not in sections
    z = np.zeros((3, 4, 5), np.float64)            # every value the fill: no planes at all
    cfg, sections = shuffle.ByteShuffle().encode(z)
    assert cfg["zs"] == [0] * 8 and sections["planes"] == b""
    assert _sections(cfg, sections, z.shape, z.dtype).tobytes() == z.tobytes()


def _window_sizes(x):
    qp = QuantParams("bits", x.dtype.name)
    data, used = codec.encode_window(x, qp)
    return data, used, len(codec._pack_shuffle(np.ascontiguousarray(x)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_shuffle_is_chosen_where_it_codes_smaller(dtype):
    x = plume(dtype=dtype)
    data, used, shuffled = _window_sizes(x)
    assert used == "shuffle" and len(data) == shuffled
    back = codec.decode_window(data, QuantParams("bits", dtype), x.shape[1:], x.shape[0])
    assert back.tobytes() == x.tobytes()


def test_bits_is_kept_where_it_codes_smaller():
    x = smooth_stack((8, 48, 40), "float32")       # smooth, noisy, no repeated value
    data, used, shuffled = _window_sizes(x)
    assert used == "bits" and len(data) < shuffled
    with tezip.open(tezip.compress(x, mode="lossless")) as f:
        assert f.window_meta(0)["p"] == "bits"


def test_each_window_takes_its_own_coding():
    x = np.concatenate([plume((6, 24, 20)), smooth_stack((6, 48, 40), "float32")[:, :24, :20]])
    blob = tezip.compress(x, mode="lossless", window=6)
    with tezip.open(blob) as f:
        assert [f.window_meta(i)["p"] for i in range(f.n_windows)] == ["shuffle", "bits"]
        assert f.read_all().tobytes() == x.tobytes()
        assert f[4:8].tobytes() == x[4:8].tobytes()


def test_payloads_without_planes_keep_five_sections():
    """Windows that do not use the new section keep their bytes (files written before
    it, and 'bits' windows written after)."""
    blob = payload.pack({"p": "x"}, {"model": b"m", "words": b"w" * 8})
    meta = payload.peek_meta(blob)
    assert len(meta["s"]) == 5 and len(meta["z"]) == 5
    assert payload.unpack(blob, {}).sections["planes"] == b""
    blob = payload.pack({"p": "x"}, {"planes": b"p"})
    assert len(payload.peek_meta(blob)["s"]) == 6
    assert payload.unpack(blob, {}).sections["planes"] == b"p"


# ---------------------------------------------------------------------------------------
# damage


def _shuffle_file():
    x = plume((6, 10, 9))
    x[2, 3, 4] = np.nan
    blob = tezip.compress(x, mode="lossless", window=3)
    with tezip.open(blob) as f:
        assert {f.window_meta(i)["p"] for i in range(f.n_windows)} == {"shuffle"}
    return x, blob


def test_every_flipped_byte_and_every_truncation_is_detected():
    x, blob = _shuffle_file()
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x10
        with pytest.raises(tezip.TezipError):
            tezip.decompress(bytes(bad))
    for n in range(0, len(blob), 7):
        with pytest.raises(tezip.TezipError):
            tezip.decompress(blob[:n])


def _edit_window(blob, edit):
    """Rewrite window 0's meta record with ``edit(meta, sections)`` (sections: name ->
    stored bytes) and reseal the container: only the decoder's own checks stand."""
    def change(header, entries, payloads):
        data = payloads[0]
        (mlen,) = struct.unpack_from("<I", data)
        meta = json.loads(data[4:4 + mlen])
        pos, sections = 4 + mlen, {}
        for name, size in zip(payload.SECTIONS, meta["s"], strict=False):
            sections[name] = data[pos:pos + size]
            pos += size
        edit(meta, sections)
        body = b"".join(sections[n] for n in payload.SECTIONS[:len(meta["s"])])
        mb = json.dumps(meta, separators=(",", ":")).encode()
        payloads[0] = struct.pack("<I", len(mb)) + mb + body
    return reseal(blob, change)


def _set(key, value):
    def edit(meta, sections):
        meta["cfg"][key] = value
    return edit


def _resize(name, data):
    def edit(meta, sections):
        i = payload.SECTIONS.index(name)
        sections[name] = data(sections[name])
        meta["s"][i] = len(sections[name])
        if name == "masks":
            meta["z"][i] = 0
    return edit


@pytest.mark.parametrize("edit", [
    _set("t", "lorenzo"), _set("t", None), _set("fill", -1), _set("fill", 2**64),
    _set("fill", 2**40), _set("fill", True), _set("fill", 1.5), _set("zs", [1, 2, 3]),
    _set("zs", "x"), _set("zs", [10**12, 0, 0, 0]), _set("extra", 1),
    _resize("planes", lambda b: b[:-1]), _resize("planes", lambda b: b + b"\0"),
    _resize("masks", lambda b: b"\xff" * 3), _resize("masks", lambda b: b""),
    _resize("model", lambda b: b"x"), _resize("outliers", lambda b: b"\0" * 4),
], ids=lambda e: e.__qualname__)
def test_crafted_windows_are_refused(edit):
    _, blob = _shuffle_file()
    with pytest.raises(tezip.CorruptFileError):
        tezip.decompress(_edit_window(blob, edit))


def test_a_valid_configuration_that_decodes_to_other_data_is_refused():
    _, blob = _shuffle_file()
    with tezip.open(blob) as f:
        used = f.window_meta(0)["cfg"]["t"]
    for other in set(shuffle.TRANSFORMS) - {used}:
        with pytest.raises(tezip.CorruptFileError, match="checksum"):
            tezip.decompress(_edit_window(blob, _set("t", other)))


def test_mask_padding_bits_and_fill_mismatch_are_refused():
    _, blob = _shuffle_file()            # 270 values per window: the mask has padding

    def padbit(meta, sections):
        i = payload.SECTIONS.index("masks")
        mask = np.packbits(np.zeros(3 * 10 * 9, bool))
        mask[-1] |= 1
        sections["masks"] = mask.tobytes()
        meta["s"][i], meta["z"][i] = len(sections["masks"]), 0
    with pytest.raises(tezip.CorruptFileError, match="fill mask"):
        tezip.decompress(_edit_window(blob, padbit))
    # a mask given to a window declared without a fill value
    with pytest.raises(tezip.CorruptFileError, match="mask"):
        tezip.decompress(_edit_window(blob, _set("fill", None)))


def test_a_bits_window_with_a_planes_section_is_refused():
    x = smooth_stack((4, 30, 30), "float32")
    blob = tezip.compress(x, mode="lossless")

    def add(meta, sections):
        assert meta["p"] == "bits"
        sections["planes"] = b"junk"
        meta["s"].append(4)
        meta["z"].append(0)
    with pytest.raises(tezip.CorruptFileError):
        tezip.decompress(_edit_window(blob, add))


def test_shuffle_in_a_lossy_file_is_refused():
    blob = tezip.compress(smooth_stack((4, 8, 8)), mode="abs", bound=0.1)

    def rename(meta, sections):
        meta["p"] = "shuffle"
        meta["cfg"] = {"fill": None, "t": "raw", "zs": [0, 0, 0, 0]}
    with pytest.raises(tezip.CorruptFileError, match="unknown predictor"):
        tezip.decompress(_edit_window(blob, rename))


@settings(max_examples=150, deadline=10000, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_resealed_damage_is_an_error_or_exact(seed):
    x, blob = _shuffle_file()
    damaged = damage_window(blob, np.random.default_rng(seed))
    try:
        back = tezip.decompress(damaged)
    except tezip.TezipError:
        return
    assert back.tobytes() == x.tobytes()


def test_registry_knows_the_lossless_codings():
    assert predictors.LOSSLESS == ("bits", "shuffle")
    assert isinstance(predictors.get("shuffle"), shuffle.ByteShuffle)
