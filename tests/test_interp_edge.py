"""Interpolation's linear extrapolation at the edges (format v5, ``{"edge": 1..3}``): where
a point has no right neighbour along an axis, it is predicted from the line through its
left neighbours at -s and -3s (1: along time, 2: along the frame's axes, 3: both)."""

from __future__ import annotations

import numpy as np
import pytest
from exact import check_bound
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bound import stacks

import tezip
from tezip import codec, predictors, windows
from tezip.errors import CorruptFileError
from tezip.kernels.consts import FLAG
from tezip.predictors.classical import DEFAULT_ANCHOR
from tezip.quantize import ErrorBound, quantizer, resolve

BASE = {"order": [0, 1, 2], "cubic": False, "ab": [1.0, 1.0], "anchor": DEFAULT_ANCHOR}


def _range(x: np.ndarray) -> tuple[float, float]:
    fin = x[np.isfinite(x)] if x.dtype.kind == "f" else x
    return (float(fin.min()), float(fin.max())) if fin.size else (0.0, 0.0)


def _codes(x: np.ndarray, cfg: dict) -> np.ndarray:
    quant = quantizer(resolve(ErrorBound("abs", abs=1e-3), x.dtype, _range(x)))
    coded = predictors.get("interp").encode(x, quant, cfg, codec.sign_map(x, quant))
    return coded.codes[coded.codes != FLAG]


@pytest.mark.parametrize("axis,edge,other", [(0, 1, 2), (2, 2, 1), (1, 2, 1)])
def test_a_ramp_is_predicted_exactly_at_the_edges_of_its_axis(axis, edge, other):
    # a ramp along one axis of 57 points, anchors at 0 and 32: 48, 56 and the odd
    # points past them have no right neighbour, and two on the left (-s, -3s): they are
    # extrapolated. The line through those hits the ramp; the left neighbour alone, or
    # the other axis' flag, does not
    shape = [1, 1, 1]
    shape[axis] = 57
    ramp = np.arange(57, dtype=np.float64).reshape(shape) * 3.0
    for cfg in (BASE, {**BASE, "cubic": True}):
        assert not np.any(_codes(ramp, {**cfg, "edge": edge})), cfg
        assert not np.any(_codes(ramp, {**cfg, "edge": 3})), cfg
        assert np.any(_codes(ramp, cfg)), cfg
        assert np.any(_codes(ramp, {**cfg, "edge": other})), cfg


def _roundtrip(x: np.ndarray, b: ErrorBound, cfg: dict) -> np.ndarray:
    qp = resolve(b, x.dtype, _range(x))
    quant = quantizer(qp)
    coded = predictors.get("interp").encode(x, quant, cfg, codec.sign_map(x, quant))
    data = codec._pack(x, quant, coded, "interp", coded.out)
    y = codec.decode_window(data, qp, x.shape[1:], x.shape[0])
    assert y.tobytes() == coded.out.tobytes()
    return y


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stacks(), st.sampled_from(["abs", "pwrel", "lossless"]),
       st.sampled_from([1e-6, 1e-3, 0.3, 2.0]), st.sampled_from([1, 2, 3]), st.booleans())
def test_edge_windows_decode_to_the_encoders_values_within_the_bound(a, mode, bound, edge,
                                                                       cubic):
    if a.ndim == 4:
        a = np.ascontiguousarray(a[..., 0])
    b = (ErrorBound("abs", abs=bound) if mode == "abs" else
         ErrorBound("pwrel", pw=min(bound, 0.5)) if mode == "pwrel" else ErrorBound("lossless"))
    if mode == "lossless" and a.dtype.kind == "f":
        return                      # bit-exact floats are coded by the 'bits' predictors
    y = _roundtrip(a, b, {**BASE, "cubic": cubic, "edge": edge})
    check_bound(a, y, mode, None if mode == "lossless" else b.abs if mode == "abs" else b.pw)


@pytest.mark.parametrize("edge", [4, -1, True, 1.0, "3", None, [1]])
def test_bad_edge_values_are_refused(edge):
    with pytest.raises(CorruptFileError):
        predictors.get("interp").validate({**BASE, "edge": edge}, (4, 5, 6))


def test_valid_edge_values_are_kept_and_zero_is_dropped():
    interp = predictors.get("interp")
    for e in (1, 2, 3):
        assert interp.validate({**BASE, "edge": e}, (4, 5, 6))["edge"] == e
    assert "edge" not in interp.validate({**BASE, "edge": 0}, (4, 5, 6))
    assert "edge" not in interp.validate(BASE, (4, 5, 6))        # files before v5


def _smooth_field(t: int = 20, h: int = 24, w: int = 28) -> np.ndarray:
    """Smooth in time and space, without noise: extrapolating a line pays."""
    yy, xx = np.mgrid[:h, :w]
    return np.stack([np.sin(xx / 7 + i / 5) * np.cos(yy / 9 - i / 8) + 0.01 * i * i
                     for i in range(t)]).astype(np.float32) * 50


def _edge_of(blob: bytes) -> list:
    with tezip.open(blob) as f:
        return [f.window_meta(i)["cfg"].get("edge") for i in range(f.n_windows)]


def test_the_tuning_extrapolates_a_smooth_field_and_not_noise():
    x = _smooth_field()
    assert _edge_of(tezip.compress(x, mode="rel", bound=1e-4, predictor="interp")) == [3]
    noise = np.random.default_rng(5).normal(0, 1, x.shape).astype(np.float32)
    assert _edge_of(tezip.compress(noise, mode="rel", bound=1e-3,
                                   predictor="interp")) == [None]


def test_the_edge_setting_is_ranked_on_the_sample_not_among_the_finalists():
    interp = predictors.get("interp")
    assert interp.variant({**BASE, "edge": 3}) == interp.variant(BASE)


def test_the_default_window_ends_on_the_anchor_grid():
    # a window of DEFAULT_WINDOW frames has its last frame on the interpolation's anchor
    # grid: no frame of a full window is extrapolated in time
    assert (windows.DEFAULT_WINDOW - 1) % DEFAULT_ANCHOR == 0


def test_info_labels_edge_windows(tmp_path):
    from click.testing import CliRunner

    from tezip.cli import cli

    p = tmp_path / "s.tez"
    p.write_bytes(tezip.compress(_smooth_field(), mode="rel", bound=1e-4, predictor="interp"))
    r = CliRunner().invoke(cli, ["info", str(p)])
    assert r.exit_code == 0, r.output
    assert "interp+edge" in r.output


@pytest.mark.parametrize("shape,want", [((33, 33, 33, 4), False), ((32, 33, 33), True),
                                        ((33, 64, 64), True), ((3, 3, 3), False),
                                        ((33, 65, 97), False), ((65, 17, 33), True)])
def test_has_edges_tells_where_the_extrapolation_can_act(shape, want):
    from tezip.predictors.classical import has_edges

    assert has_edges(shape) is want


def test_no_edge_trial_on_a_sample_without_edges():
    # a full window of 33 frames of large frames: the sample's 33 x 33 tiles sit on the
    # anchor grid, where the trial could only tie
    x = np.repeat(_smooth_field(33, 24, 28), 3, axis=1).repeat(3, axis=2)[:, :70, :75]
    x = np.ascontiguousarray(x)
    quant = quantizer(resolve(ErrorBound("rel", rel=1e-4), x.dtype, _range(x)))
    sample = codec.sample_tiles(x)
    assert sample.shape[1:3] == (33, 33)
    tried = predictors.get("interp").tune(sample, quant, codec.sign_map(sample, quant),
                                          lambda c: codec._estimate(c, 4))
    assert not any(c.get("edge") for _, c in tried)
    # ... while the whole window of a small frame is its own sample, and gets the trial
    small = _smooth_field()
    tried = predictors.get("interp").tune(small, quant, codec.sign_map(small, quant),
                                          lambda c: codec._estimate(c, 4))
    assert any(c.get("edge") for _, c in tried)
