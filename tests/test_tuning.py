"""The encoder's tuning: which classical configurations a stack's windows choose among,
and in what order (``codec.tune``)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bound import stacks

from tezip import codec, predictors, quantize


def _quant(x: np.ndarray) -> quantize.Quantizer:
    bound = quantize.ErrorBound("rel", rel=1e-3)
    return quantize.quantizer(quantize.resolve(bound, x.dtype, (float(x.min()),
                                                                float(x.max()))))


def _head_sizes(x, quant, finalists):
    """Estimated bits of each finalist coding the window's first frames in full."""
    head = np.ascontiguousarray(x[:codec.head_frames(x.shape)])
    sgn = codec.sign_map(head, quant)
    return [codec._estimate(predictors.get(n).encode(head, quant, c, sgn), x.itemsize)
            for n, c in finalists]


@pytest.fixture
def many_finalists(monkeypatch):
    # every trial within reach: the three best of the sample become finalists
    monkeypatch.setattr(codec, "_FULL_MARGIN", 100.0)


def test_long_window_ranks_finalists_on_its_first_frames(many_finalists):
    x = smooth_stack((20, 40, 36), seed=3)
    quant = _quant(x)
    t = codec.tune(x, quant, predictors.CLASSICAL_CANDIDATES)
    assert len(t.finalists) == codec.N_FINALISTS
    sizes = _head_sizes(x, quant, t.finalists)
    assert sizes == sorted(sizes)
    # the head's coding is kept only where it begins the window's (``extends``)
    best = predictors.get(t.finalists[0][0])
    assert (t.head is not None) == best.extends(x.shape)
    assert codec.tune(x, quant, predictors.CLASSICAL_CANDIDATES, threads=3) == t


def test_large_frames_rank_finalists_on_fewer_frames(many_finalists):
    assert codec.head_frames((32, 109, 110)) == codec.HEAD_FRAMES
    assert codec.head_frames((32, 256, 256)) == codec.HEAD_MIN_FRAMES == 4
    assert codec.head_frames((32, 4096, 4096)) == codec.HEAD_MIN_FRAMES
    assert codec.head_frames((6, 4096, 4096)) == 6          # short: ranked whole
    x = smooth_stack((10, 260, 270), seed=5)
    quant = _quant(x)
    t = codec.tune(x, quant, predictors.CLASSICAL_CANDIDATES)
    assert len(t.finalists) == codec.N_FINALISTS
    sizes = _head_sizes(x, quant, t.finalists)      # on its first 4 frames
    assert sizes == sorted(sizes)
    # a window of up to HEAD_FRAMES frames is ranked whole, its codings kept
    short = np.ascontiguousarray(x[:6])
    t = codec.tune(short, quant, predictors.CLASSICAL_CANDIDATES)
    assert t.head is not None and list(t.head) == [codec.config_key(*t.finalists[0])]


def test_short_window_keeps_its_full_codings(many_finalists):
    x = smooth_stack((codec.HEAD_FRAMES, 40, 36), seed=4)
    quant = _quant(x)
    t = codec.tune(x, quant, predictors.CLASSICAL_CANDIDATES)
    assert len(t.finalists) == codec.N_FINALISTS
    assert t.head is not None and list(t.head) == [codec.config_key(*t.finalists[0])]
    sizes = _head_sizes(x, quant, t.finalists)
    assert sizes == sorted(sizes)
    # a kept coding is the window's coding, reconstruction included
    name, cfg = t.finalists[0]
    kept = t.head[codec.config_key(name, cfg)]
    again = predictors.get(name).encode(x, quant, cfg, codec.sign_map(x, quant))
    np.testing.assert_array_equal(kept.codes, again.codes)
    np.testing.assert_array_equal(kept.out, again.out)


def test_stack_bytes_do_not_depend_on_the_tuning_threads(many_finalists):
    import tezip

    x = smooth_stack((40, 40, 36), seed=5)
    one = tezip.compress(x, mode="rel", bound=1e-3, predictor="classical", threads=1)
    two = tezip.compress(x, mode="rel", bound=1e-3, predictor="classical", threads=2)
    assert one == two
    back = tezip.decompress(one)
    assert np.abs(back.astype(np.float64) - x).max() <= 1e-3 * float(x.max() - x.min())


def test_every_window_codes_with_the_tunings_best(many_finalists, monkeypatch):
    import tezip

    x = smooth_stack((36, 40, 36), seed=6)
    x[24:] = x[24:] ** 3                 # later windows unlike the tuned one
    trials = []
    real = codec.sample_tiles

    def spy(w):
        trials.append(w.shape[0])
        return real(w)

    monkeypatch.setattr(codec, "sample_tiles", spy)
    monkeypatch.setattr(codec, "DRIFT", float("inf"))     # (see the drift tests below)
    blob = tezip.compress(x, mode="rel", bound=1e-3, predictor="classical", window=12)
    assert trials == [12]                # one tuning, on the first window; no other check
    quant = _quant(x)
    t = codec.tune(np.ascontiguousarray(x[:12]), quant, predictors.CLASSICAL_CANDIDATES)
    assert len(t.finalists) == codec.N_FINALISTS
    with tezip.open(blob) as f:
        used = [f.window_meta(i) for i in range(f.n_windows)]
    # (less the run coding a window may add to its record, format v6)
    assert [(u["p"], {k: v for k, v in u["cfg"].items() if k != "r"})
            for u in used] == [t.finalists[0]] * 3


def test_finalists_differ_in_more_than_the_level_wise_bounds(many_finalists, monkeypatch):
    # the sample ranks the level-wise bounds ("ab") as the window does: of two
    # configurations that differ only there, the sample's better one is the finalist
    x = smooth_stack((20, 40, 36), seed=7)
    quant = _quant(x)
    interp = predictors.get("interp")
    base = {"order": [0, 1, 2], "cubic": False, "ab": [1.0, 1.0], "anchor": 32}
    a = {**base, "ab": [1.25, 2.0]}
    b = {**a, "ab": [1.0, 1.0]}
    c = {**base, "cubic": True}
    d = {**base, "order": [0, 2, 1]}
    trials = [(100.0, a), (100.5, b), (101.0, c), (101.5, {**c, "ab": [1.5, 2.5]}),
              (102.0, d)]
    monkeypatch.setattr(type(interp), "tune", lambda self, *args, **kw: trials)
    t = codec.tune(x, quant, ("interp",))
    assert sorted(map(str, t.finalists)) == sorted(map(str, [("interp", a), ("interp", c),
                                                             ("interp", d)]))
    sizes = _head_sizes(x, quant, t.finalists)
    assert sizes == sorted(sizes)
    assert interp.variant(a) == interp.variant(b) != interp.variant(c)


def test_a_tuning_for_other_options_is_refused(tmp_path):
    from tezip.codec import ArrayStack, Options, Tuning, compress_stack, tune_stack
    from tezip.errors import OptionError

    x = smooth_stack((12, 40, 36), seed=8)
    vr = (float(x.min()), float(x.max()))
    bound = quantize.ErrorBound("rel", rel=1e-3)
    interp = tune_stack(ArrayStack(x), Options(bound, predictor="interp"), vr)
    assert interp.finalists[0][0] == "interp"
    learned = tune_stack(ArrayStack(x), Options(bound, predictor="learned"), vr)
    assert learned.finalists is None          # no classical tuning for a learned stack
    for tuning in (interp, Tuning([]), learned):
        with pytest.raises(OptionError, match="tuning"):
            compress_stack(ArrayStack(x), tmp_path / "a.tez", Options(bound, predictor="lorenzo"),
                           vrange=vr, tuning=tuning)
        assert not list(tmp_path.iterdir())
    compress_stack(ArrayStack(x), tmp_path / "b.tez", Options(bound, predictor="classical"),
                   vrange=vr, tuning=interp)
    assert (tmp_path / "b.tez").exists()


def _frames_apart(shape, seed):
    """Frames unlike each other (a noisy plane of its own each): the 2-D Lorenzo
    predictor ('spatial') codes them smallest."""
    rng = np.random.default_rng(seed)
    t, h, w = shape
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([rng.normal() * yy * 3 + rng.normal() * xx * 3 + rng.normal() * 50
                     + rng.normal(0, 0.05, (h, w)) for _ in range(t)]).astype("float32")


def test_a_framewise_best_keeps_its_head_coding_and_extends_it(many_finalists, monkeypatch):
    import tezip

    x = _frames_apart((20, 40, 36), seed=8)
    quant = _quant(x)
    t = codec.tune(x, quant, predictors.CLASSICAL_CANDIDATES)
    name, cfg = t.finalists[0]
    assert name == "spatial" and len(t.finalists) > 1
    nh = codec.head_frames(x.shape)
    assert nh < x.shape[0] and t.head is not None
    assert t.head[codec.config_key(name, cfg)].out.shape[0] == nh
    spatial = predictors.get("spatial")
    calls = []
    real = type(spatial).extend

    def spy(self, head, *args):
        calls.append(head.out.shape[0])
        return real(self, head, *args)

    monkeypatch.setattr(type(spatial), "extend", spy)
    blob = tezip.compress(x, mode="rel", bound=1e-3, predictor="classical", window=20)
    assert calls == [nh]
    # the same bytes as coding the window whole
    monkeypatch.setattr(type(spatial), "extends", lambda self, shape: False)
    assert tezip.compress(x, mode="rel", bound=1e-3, predictor="classical", window=20) == blob
    assert calls == [nh]


def test_only_one_channel_windows_extend():
    spatial = predictors.get("spatial")
    assert spatial.extends((20, 8, 8)) and not spatial.extends((20, 8, 8, 2))
    for name in ("interp", "lorenzo"):
        assert not predictors.get(name).extends((20, 8, 8))
    x = _frames_apart((6, 10, 9), seed=9)
    quant = _quant(x)
    head = spatial.encode(np.ascontiguousarray(x[:2]), quant, {"pq": 1},
                          codec.sign_map(x[:2], quant), sample=True)
    with pytest.raises(ValueError):          # a sample's coding has no reconstruction
        spatial.extend(head, x, quant, {"pq": 1}, codec.sign_map(x[2:], quant))
    head = spatial.encode(np.ascontiguousarray(x[:2]), quant, {"pq": 1},
                          codec.sign_map(x[:2], quant))
    with pytest.raises(ValueError):          # another dtype
        spatial.extend(head, x.astype("float64"), quant, {"pq": 1},
                       codec.sign_map(x[2:], quant))
    pw = quantize.quantizer(quantize.resolve(quantize.ErrorBound("pwrel", pw=1e-2), x.dtype,
                                             (float(x.min()), float(x.max()))))
    head = spatial.encode(np.ascontiguousarray(x[:2]), pw, {"pq": 1},
                          codec.sign_map(x[:2], pw))
    with pytest.raises(ValueError):          # the whole window's sign map, not the rest's
        spatial.extend(head, x, pw, {"pq": 1}, codec.sign_map(x, pw))
    got = spatial.extend(head, x, pw, {"pq": 1}, codec.sign_map(x[2:], pw))
    want = spatial.encode(x, pw, {"pq": 1}, codec.sign_map(x, pw))
    assert got.out.tobytes() == want.out.tobytes()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stacks(), st.sampled_from(["abs", "rel", "pwrel", "lossless"]),
       st.sampled_from([1e-6, 1e-3, 0.3, 2.0]), st.integers(1, 8))
def test_extending_a_head_coding_gives_the_windows_coding(a, mode, bound, nh):
    # what 'spatial' codes after the first frames' coding is what coding the window gives,
    # bit for bit: every dtype, bound kind, NaN, infinities, outliers
    if a.ndim != 3 or a.shape[0] < 2 or (mode == "lossless" and a.dtype.kind == "f"):
        return
    nh = min(nh, a.shape[0] - 1)
    kw = {"abs": {"abs": bound}, "rel": {"rel": bound}, "pwrel": {"pw": min(bound, 0.5)},
          "lossless": {}}[mode]
    finite = a[np.isfinite(a)] if a.dtype.kind == "f" else a
    vrange = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    quant = quantize.quantizer(quantize.resolve(quantize.ErrorBound(mode, **kw), a.dtype,
                                                vrange))
    if quant.qp.kind == "bits":            # bit-exact floats: integer predictors only
        return
    spatial = predictors.get("spatial")
    cfg = spatial.configs(a, quant)[0]
    head = np.ascontiguousarray(a[:nh])
    got = spatial.extend(spatial.encode(head, quant, cfg, codec.sign_map(head, quant)), a,
                         quant, cfg, codec.sign_map(a[nh:], quant))
    want = spatial.encode(a, quant, cfg, codec.sign_map(a, quant))
    for f in ("codes", "ctx", "outliers"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f))
        assert getattr(got, f).dtype == getattr(want, f).dtype
    assert got.out.tobytes() == want.out.tobytes()
    assert got.config == want.config


def _count_tunings(monkeypatch) -> list[int]:
    """The frames of each window ``codec.tune`` runs on, from now on."""
    tuned: list[int] = []
    real = codec.tune

    def spy(w, *a, **k):
        tuned.append(w.shape[0])
        return real(w, *a, **k)

    monkeypatch.setattr(codec, "tune", spy)
    return tuned


def _dark_start(dtype="uint16"):
    """33 dark frames (a bias and read noise) before a signal: a first window unlike the
    rest."""
    rng = np.random.default_rng(3)
    sig = smooth_stack((66, 40, 44), dtype=dtype, scale=3000, offset=100)
    dark = (100 + rng.normal(0, 1.0, size=(33, 40, 44))).round().astype(dtype)
    return np.concatenate([dark, sig]).astype(dtype)


@pytest.mark.parametrize("dtype,mode,bound", [("uint16", "abs", 4), ("float32", "rel", 1e-2)])
def test_a_window_far_costlier_than_the_tuning_said_is_tuned_on_its_own(dtype, mode, bound,
                                                                        monkeypatch):
    import tezip

    x = _dark_start(dtype)
    kw = dict(mode=mode, bound=bound, predictor="classical", window=33)
    drifted = tezip.compress(x, **kw, threads=1)
    assert tezip.compress(x, **kw, threads=2) == drifted
    monkeypatch.setattr(codec, "DRIFT", float("inf"))
    stuck = tezip.compress(x, **kw, threads=1)
    assert len(drifted) < 0.85 * len(stuck)
    with tezip.open(drifted) as f, tezip.open(stuck) as g:
        assert [f.window_meta(i)["p"] for i in range(3)] == ["lorenzo", "interp", "interp"]
        assert [g.window_meta(i)["p"] for i in range(3)] == ["lorenzo"] * 3
        check_bound(x, f.read_all(), mode, bound)


def test_the_drift_check_never_codes_a_window_larger(monkeypatch):
    """Every window tuned on its own (DRIFT tiny): the file is no larger than with the
    stack's choice everywhere, and each window's payload no larger; within DRIFT of
    the estimate no window is tuned again."""
    import tezip

    x = smooth_stack((99, 40, 36), seed=6)
    tuned = _count_tunings(monkeypatch)
    kw = dict(mode="rel", bound=1e-3, predictor="classical", window=33, threads=1)
    plain = tezip.compress(x, **kw)
    assert tuned == [33]                # the stack's tuning only
    monkeypatch.setattr(codec, "DRIFT", 1e-9)
    tuned.clear()
    every = tezip.compress(x, **kw)
    assert tuned == [33] * 4            # and each window's, the first one's too
    from tezip.container import ContainerReader

    a, b = ContainerReader(plain), ContainerReader(every)
    assert all(len(b.payload(i)) <= len(a.payload(i)) for i in range(3))
    with tezip.open(every) as f:
        check_bound(x, f.read_all(), "rel", 1e-3)


def test_a_part_coded_with_the_wholes_tuning_has_the_wholes_drifted_windows():
    """``tune_stack`` carries the estimate (``Tuning.bits``), so that the windows of a
    part coded with the whole's tuning are checked and coded as in the whole."""
    import io

    import tezip
    from tezip.codec import ArrayStack, Options, compress_stack, tune_stack

    x = _dark_start()
    opts = Options(tezip.make_bound("abs", 4), predictor="classical", window=33)
    t = tune_stack(ArrayStack(x), opts)
    assert t.bits is not None and t.bits > 0
    whole, part = io.BytesIO(), io.BytesIO()
    compress_stack(ArrayStack(x), None, opts, fileobj=whole)
    compress_stack(ArrayStack(x[33:]), None, opts, fileobj=part, tuning=t,
                   vrange=(float(x.min()), float(x.max())))
    with tezip.open(whole.getvalue()) as f, tezip.open(part.getvalue()) as g:
        assert [f.window_meta(i)["p"] for i in (1, 2)] == [g.window_meta(i)["p"]
                                                           for i in (0, 1)] == ["interp"] * 2
        np.testing.assert_array_equal(f[33:], g.read_all())


def test_windows_of_few_frames_are_not_checked_for_drift(monkeypatch):
    """A window of under HEAD_FRAMES frames keeps the stack's choice (a tuning costs
    several codings of it)."""
    import tezip

    x = _dark_start()
    tuned = _count_tunings(monkeypatch)
    tezip.compress(x, mode="abs", bound=4, predictor="classical", window=4, threads=1)
    assert tuned == [4]
    tuned.clear()
    tezip.compress(x, mode="abs", bound=4, predictor="classical", window=8, threads=1)
    assert tuned[0] == 8 and len(tuned) > 1         # (8 frames: checked, and some drift)
