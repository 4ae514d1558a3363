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
    a = np.zeros((t + 1, h + 1, w + 2), np.int64)
    a[1:, 1:, 1:-1] = np.minimum(np.abs(k), 255)
    s = 2 * a[1:, :-1, 1:-1] + a[1:, :-1, :-2] + a[1:, :-1, 2:]
    group = np.ones_like(s)
    if three:
        s[1:] += 2 * a[1:-1, 1:, 1:-1][: t - 1]
        group[1:] = 0
    return k, group * NB + _bucket16(2.0 * s)


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
    """The v2 fixtures' stacks again: the prequantized form within 3% of the v2 file."""
    from pathlib import Path

    fixture = {"lorenzo": "f32_abs_lorenzo", "spatial": "i16_spatial"}[name]
    path = Path(__file__).parent / "fixtures" / "v2" / f"{fixture}.tez"
    old = path.read_bytes()
    x = np.load(path.with_suffix(".npy"))
    with tezip.open(old) as f:
        b = f.header["bound"]
    new = tezip.compress(x, mode=b["mode"], bound=b["abs"], predictor=name, threads=1)
    assert abs(len(new) / len(old) - 1) < 0.03


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
