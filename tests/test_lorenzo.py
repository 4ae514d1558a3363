"""The prequantized Lorenzo predictors (format v3, ``kernels.lorenzo.encode_pq``): the
codes and contexts are those of the documented transform, written out in numpy here;
the older form (predictions from reconstructed values, format v2) is decoded, no longer
coded; a configuration neither reader knows is refused."""

from __future__ import annotations

import numpy as np
import pytest
from exact import check_bound

import tezip
from tezip.errors import CorruptFileError, OptionError
from tezip.kernels.consts import FLAG, NB
from tezip.predictors import get
from tezip.quantize import ErrorBound, quantizer, resolve


def _bucket16(y: np.ndarray) -> np.ndarray:
    y = np.maximum(np.minimum(y, 2048.0), 0.75)
    return (y.view(np.int64) >> 51) - 2045


def _reference(g: np.ndarray, three: bool) -> tuple[np.ndarray, np.ndarray]:
    """Codes and contexts of grid indices ``g`` (T, H, W): Lorenzo on the integers, with
    0 outside the volume; activity 2 up + up-left + up-right (+ 2 previous frame)."""
    t, h, w = g.shape
    p = np.zeros((t + 1, h + 1, w + 1), np.int64)
    p[1:, 1:, 1:] = g
    pred = p[1:, 1:, :-1] + p[1:, :-1, 1:] - p[1:, :-1, :-1]
    if three:
        pred += -p[:-1, 1:, :-1] - p[:-1, :-1, 1:] + p[:-1, :-1, :-1] + p[:-1, 1:, 1:]
    k = g - pred
    return k, _contexts(k, three)


def _contexts(k: np.ndarray, three: bool) -> np.ndarray:
    """The contexts of codes ``k`` (T, H, W): group x bucket of the activity of the codes
    in the row above (and the previous frame)."""
    t, h, w = k.shape
    a = np.zeros((t + 1, h + 1, w + 2), np.int64)
    a[1:, 1:, 1:-1] = np.minimum(np.abs(k), 255)
    s = 2 * a[1:, :-1, 1:-1] + a[1:, :-1, :-2] + a[1:, :-1, 2:]
    group = np.ones_like(s)
    if three:
        s[1:] += 2 * a[1:-1, 1:, 1:-1][: t - 1]
        group[1:] = 0
    return group * NB + _bucket16(2.0 * s)


@pytest.mark.parametrize("name", ["lorenzo", "spatial"])
@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_codes_and_contexts_are_those_of_the_grid_indices(name, dtype):
    rng = np.random.default_rng(7)
    t, h, w = 5, 13, 17
    yy, xx = np.mgrid[:h, :w]
    x = np.stack([np.sin(0.3 * xx + 0.2 * i) * np.cos(0.2 * yy) for i in range(t)]) * 300
    x = x + rng.normal(0, 5, x.shape)
    x = x.astype(dtype)
    qp = resolve(ErrorBound("abs", abs=2.0), x.dtype, (float(x.min()), float(x.max())))
    quant = quantizer(qp)
    coded = get(name).encode(x, quant, {"pq": 1}, np.zeros((1, 1, 1), np.int8))
    if dtype == "int16":
        g = np.floor((x.astype(np.float64) + qp.eb) / qp.step)
    else:
        g = np.floor(x.astype(np.float64) / qp.step + 0.5)
    k, ctx = _reference(g.astype(np.int64), name == "lorenzo")
    assert not (coded.codes == FLAG).any()
    assert np.array_equal(coded.codes, k.ravel())
    assert np.array_equal(coded.ctx, ctx.ravel())
    check_bound(x, coded.out, "abs", 2.0, None)


def test_the_v2_form_is_decoded_and_no_longer_coded():
    """Format-v2 Lorenzo windows (``{}``: predictions from reconstructed values) are in
    the v2 fixtures, 3-D and 2-D, float, integer, bit-exact integer and point-wise
    relative (test_fixtures decodes them bit for bit); coding that form is refused."""
    from pathlib import Path

    seen = set()
    for path in sorted((Path(__file__).parent / "fixtures" / "v2").glob("*.tez")):
        with tezip.open(path) as f:
            for i in range(f.n_windows):
                meta = f.window_meta(i)
                if meta["p"] in ("lorenzo", "spatial"):
                    assert meta["cfg"] == {}
                    seen.add((meta["p"], f.header["quant"]["kind"]))
    assert seen >= {("lorenzo", "float"), ("spatial", "int"), ("lorenzo", "identity"),
                    ("spatial", "log")}
    x = np.zeros((2, 3, 4), np.float32)
    quant = quantizer(resolve(ErrorBound("abs", abs=1.0), x.dtype, (0.0, 0.0)))
    with pytest.raises(OptionError, match="v2 form"):
        get("lorenzo").encode(x, quant, {}, np.zeros((1, 1, 1), np.int8))


@pytest.mark.parametrize("name", ["lorenzo", "spatial"])
def test_pq_codes_about_as_small_as_the_v2_form(name):
    """The v2 fixtures' stacks again: the prequantized form at most 3% larger than the v2
    file (smaller where a second stage is fitted: i16_spatial 4.5%)."""
    from pathlib import Path

    fixture = {"lorenzo": "f32_abs_lorenzo", "spatial": "i16_spatial"}[name]
    path = Path(__file__).parent / "fixtures" / "v2" / f"{fixture}.tez"
    old = path.read_bytes()
    x = np.load(path.with_suffix(".npy"))
    with tezip.open(old) as f:
        b = f.header["bound"]
    new = tezip.compress(x, mode=b["mode"], bound=b["abs"], predictor=name, threads=1)
    assert len(new) < 1.03 * len(old)


def test_huge_values_without_a_grid_index_are_stored_exactly():
    """A value whose grid index is past 2^50 has none: it is an outlier, stored bit for
    bit, and its neighbours are coded from the prediction in its place."""
    x = np.zeros((3, 6, 7), np.float64)
    x[1, 2, 3] = 1e200
    x[2, 4, 1] = -3e30
    x[0, 0, 0] = np.nan
    y = tezip.decompress(tezip.compress(x, mode="abs", bound=1e-3, predictor="lorenzo"))
    assert y[1, 2, 3] == 1e200 and y[2, 4, 1] == -3e30 and np.isnan(y[0, 0, 0])
    rest = np.ones(x.shape, bool)
    rest[1, 2, 3] = rest[2, 4, 1] = rest[0, 0, 0] = False
    assert np.abs(y[rest]).max() <= 1e-3


@pytest.mark.parametrize("cfg", [{"pq": 2}, {"pq": True}, {"pq": 1.0}, {"pq": "1"},
                                 {"pq": 1, "x": 0}, {"order": [0, 1, 2]}, None, [1]])
def test_unknown_configurations_are_refused(cfg):
    with pytest.raises(CorruptFileError):
        get("lorenzo").validate(cfg, (4, 5, 6))


# --- the second stage (format v4) ---------------------------------------------------------

V_MAX = 2**21


def _second_stage(k: np.ndarray, w: list[int]) -> np.ndarray:
    """The codes of the second stage with weights ``w`` (sixteenths) from the plain
    codes ``k`` (the Lorenzo residuals v; no outliers), written out in numpy: v less
    floor((sum of w times the clamped residuals up, up-left, up-right, up-up, previous
    frame, its left, its up) / 16 + 1/2), 0 outside the volume."""
    t, h, wd = k.shape
    v = np.zeros((t + 1, h + 2, wd + 2), np.int64)
    v[1:, 2:, 1:-1] = np.clip(k, -V_MAX, V_MAX)
    taps = [v[1:, 1:-1, 1:-1], v[1:, 1:-1, :-2], v[1:, 1:-1, 2:], v[1:, :-2, 1:-1],
            v[:-1, 2:, 1:-1], v[:-1, 2:, :-2], v[:-1, 1:-1, 1:-1]]
    s = sum(wi * tap for wi, tap in zip(w, taps, strict=True))
    return k - np.floor((s + 8) / 16).astype(np.int64)


def _smooth(t: int, h: int, w: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    x = np.stack([np.sin(0.21 * xx + 0.13 * i) * np.cos(0.17 * yy - 0.05 * i)
                  for i in range(t)]) * 400
    return x + rng.normal(0, 0.02, x.shape)


@pytest.mark.parametrize("name", ["lorenzo", "spatial"])
@pytest.mark.parametrize("w", [[16, 0, 0, 0, 0, 0, 0], [9, 7, 7, -11, -2, 1, 1],
                               [-64, 64, -64, 64, -64, 64, -64], [0, 0, 0, 0, 0, 0, 1]])
def test_second_stage_codes_are_those_of_the_documented_transform(name, w):
    x = _smooth(5, 13, 17).astype(np.float32)
    qp = resolve(ErrorBound("abs", abs=0.05), x.dtype, (float(x.min()), float(x.max())))
    quant = quantizer(qp)
    pred = get(name)
    plain = pred.encode(x, quant, {"pq": 1}, np.zeros((1, 1, 1), np.int8))
    coded = pred.encode(x, quant, {"pq": 1, "w": w}, np.zeros((1, 1, 1), np.int8))
    assert not (plain.codes == FLAG).any() and not (coded.codes == FLAG).any()
    want = _second_stage(plain.codes.reshape(x.shape).astype(np.int64), w)
    assert np.array_equal(coded.codes, want.ravel())
    # the same contexts rule, on the second stage's codes
    assert np.array_equal(coded.ctx, _contexts(want, name == "lorenzo").ravel())
    assert np.array_equal(coded.out, plain.out)     # the grid indices: the same values
    check_bound(x, coded.out, "abs", 0.05, None)


def _roundtrip(x, mode, bound, name, w):
    from tezip.codec import _pack, decode_window, sign_map

    b = (ErrorBound("abs", abs=bound) if mode == "abs" else
         ErrorBound("pwrel", pw=bound) if mode == "pwrel" else ErrorBound("lossless"))
    fin = x[np.isfinite(x)] if x.dtype.kind == "f" else x
    qp = resolve(b, x.dtype, (float(fin.min()), float(fin.max())))
    quant = quantizer(qp)
    cfg = {"pq": 1, "w": w}
    coded = get(name).encode(x, quant, cfg, sign_map(x, quant))
    data = _pack(x, quant, coded, name, coded.out)
    y = decode_window(data, qp, x.shape[1:], x.shape[0])
    assert y.tobytes() == coded.out.tobytes()
    return y


@pytest.mark.parametrize("name", ["lorenzo", "spatial"])
@pytest.mark.parametrize("dtype,mode,bound", [("float32", "abs", 0.01), ("float64", "abs", 1e-6),
                                              ("float32", "pwrel", 1e-3), ("int16", "abs", 3),
                                              ("uint16", "lossless", None),
                                              ("int32", "abs", 2)])
def test_second_stage_round_trips_within_the_bound(name, dtype, mode, bound):
    rng = np.random.default_rng(11)
    x = _smooth(6, 11, 14)
    if dtype.startswith("float"):
        big = 3e38 if dtype == "float32" else 1e200         # no grid index: an outlier
        x[0, 0, 0], x[2, 3, 4], x[3, 5, 5], x[4, 1, 1] = np.nan, np.inf, 0.0, big
        x[5, 7, 2] = -x[5, 7, 2]
    else:
        x = x * 30 + (30000 if dtype == "uint16" else 0)
    x = x.astype(dtype)
    for w in ([9, 7, 7, -11, -2, 1, 1], [-64, 64, -64, 64, -64, 64, -64],
              list(rng.integers(-64, 65, 7))):
        y = _roundtrip(x, mode, bound, name, [int(v) for v in w])
        check_bound(x, y, mode, bound, None)


def test_second_stage_residuals_past_the_clamp_round_trip():
    """Residuals beyond 2^21 grid steps enter the second stage clamped (encoder and
    decoder alike): still exact."""
    x = _smooth(4, 9, 10)
    x[:, ::2, ::3] += 1e7
    y = _roundtrip(x, "abs", 1e-3, "lorenzo", [16, 16, -16, 16, 16, -16, 16])
    check_bound(x, y, "abs", 1e-3, None)


@pytest.mark.parametrize("cfg", [{"pq": 1, "w": [0] * 7}, {"pq": 1, "w": [1] * 6},
                                 {"pq": 1, "w": [1] * 8}, {"pq": 1, "w": [65, 0, 0, 0, 0, 0, 0]},
                                 {"pq": 1, "w": [1.0, 0, 0, 0, 0, 0, 0]},
                                 {"pq": 1, "w": [True, 0, 0, 0, 0, 0, 0]},
                                 {"pq": 1, "w": (1, 0, 0, 0, 0, 0, 0)},
                                 {"pq": 2, "w": [1, 0, 0, 0, 0, 0, 0]},
                                 {"pq": 1, "w": [1, 0, 0, 0, 0, 0, 0], "x": 1},
                                 {"w": [1, 0, 0, 0, 0, 0, 0]}])
def test_bad_second_stages_are_refused(cfg):
    with pytest.raises(CorruptFileError):
        get("lorenzo").validate(cfg, (4, 5, 6))
    assert get("spatial").validate({"pq": 1, "w": [-64, 0, 0, 0, 0, 0, 64]}, (4, 5, 6)) == {
        "pq": 1, "w": [-64, 0, 0, 0, 0, 0, 64]}


def test_a_second_stage_is_fitted_where_it_pays_and_not_where_it_leaves_half():
    """On a smooth field the fitted second stage is chosen and the file is smaller than
    the plain form's; on this white noise none is kept (its weights leave more than half
    the squared residuals; on other noise, 3-D Lorenzo's residuals of neighbouring points
    are correlated enough for one to be kept, and to pay a few %)."""
    from tezip.predictors.classical import fit_second_stage

    x = _smooth(16, 40, 48).astype(np.float32)
    blob = tezip.compress(x, mode="abs", bound=1e-3, predictor="lorenzo", threads=1)
    with tezip.open(blob) as f:
        cfgs = [f.window_meta(i)["cfg"] for i in range(f.n_windows)]
    assert all("w" in c for c in cfgs)
    qp = resolve(ErrorBound("abs", abs=1e-3), x.dtype, (float(x.min()), float(x.max())))
    quant = quantizer(qp)
    plain = get("lorenzo").encode(x, quant, {"pq": 1}, np.zeros((1, 1, 1), np.int8))
    from tezip.codec import _pack

    assert len(blob) < 0.9 * len(_pack(x, quant, plain, "lorenzo", plain.out))
    noise = np.random.default_rng(5).normal(0, 100, (8, 32, 32))
    qn = quantizer(resolve(ErrorBound("abs", abs=1.0), noise.dtype, (-500.0, 500.0)))
    pn = get("lorenzo").encode(noise, qn, {"pq": 1}, np.zeros((1, 1, 1), np.int8))
    assert fit_second_stage(pn.codes, noise.shape) is None
    assert fit_second_stage(pn.codes[:10], noise.shape) is None         # not one per value
    assert fit_second_stage(np.full(8 * 32 * 32, FLAG, np.int32), noise.shape) is None


def test_spatial_extension_with_a_second_stage_is_the_whole_coding():
    """The 2-D second stage reads the previous frame: a window extended from its first
    frames' coding is coded whole, the same as coding it at once."""
    from tezip.codec import sign_map

    x = _smooth(10, 12, 15).astype(np.float32)
    quant = quantizer(resolve(ErrorBound("abs", abs=0.01), x.dtype,
                              (float(x.min()), float(x.max()))))
    cfg = {"pq": 1, "w": [9, 7, 7, -11, -2, 1, 1]}
    pred = get("spatial")
    head = pred.encode(x[:4].copy(), quant, cfg, sign_map(x[:4], quant))
    ext = pred.extend(head, x, quant, cfg, sign_map(x[4:], quant))
    whole = pred.encode(x, quant, cfg, sign_map(x, quant))
    assert np.array_equal(ext.codes, whole.codes) and np.array_equal(ext.ctx, whole.ctx)
    assert np.array_equal(ext.outliers, whole.outliers) and ext.out.tobytes() == whole.out.tobytes()


@pytest.mark.parametrize("axis,tap", [(1, 0), (0, 4)])
def test_the_fit_reads_the_taps_the_kernel_weights(axis, tap):
    """Residuals that are a random walk down the rows (or through the frames) are best
    predicted by the one above (or the previous frame's): the fit puts 16/16 on that tap
    (``stage_moments`` and ``_pq_corr_row`` name the taps in the same order)."""
    from tezip.predictors.classical import fit_second_stage

    rng = np.random.default_rng(9)
    steps = rng.integers(-40, 41, (6, 24, 24))
    codes = np.cumsum(steps, axis=axis).astype(np.int32)
    w = fit_second_stage(codes.ravel(), codes.shape)
    want = [0] * 7
    want[tap] = 16
    assert w is not None and max(abs(a - b) for a, b in zip(w, want, strict=True)) <= 1
