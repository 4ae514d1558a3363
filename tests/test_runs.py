"""Run coding of the prequantized Lorenzo predictors (format v6, ``kernels.lorenzo.
runs_apply``) and of interp (v7, ``kernels.interp.runs_apply``): the symbols are those
of the documented rules, written out in Python here;
a run-coded window decodes to exactly what the same window decodes to without runs,
within its bound, whatever its shape, dtype, outliers or second stage; a damaged one is
refused or decodes unchanged, never crashes; configurations are checked."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from exact import check_bound
from hypothesis import given, settings
from hypothesis import strategies as st

import tezip
from tezip import codec
from tezip.errors import CorruptFileError, TezipError
from tezip.kernels import interp as KI
from tezip.kernels import lorenzo as KL
from tezip.kernels.consts import NB, RUN_CHUNK
from tezip.predictors import classical, get

RUN_CHECK_BYTES = codec.RUN_CHECK_BYTES
RUN_SAMPLE = classical.RUN_SAMPLE


@pytest.fixture(autouse=True, scope="module")
def _runs_kept_in_small_files():
    """These tests' files are small: a small run-coded window is also coded without runs
    and the smaller kept (``codec.RUN_CHECK_BYTES``, its own test below); here the runs
    are kept, to be tested."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(codec, "RUN_CHECK_BYTES", 0)
        m.setattr(classical, "RUN_SAMPLE", 0)      # (nor the larger ones: ``_dark``)
        yield


def _reference(codes: np.ndarray, ctx: np.ndarray, w: int) -> tuple[list[int], list[int]]:
    """The documented rule, point by point: a point of activity 0 (bucket 0) whose left
    neighbour's code is 0, or that starts a row, starts a run: the stretch of points of
    activity 0 from it, L long, its first r codes 0, is coded as L - r (as the code whose
    zigzag is L - r, in RUN_ROW at a row's start, else RUN_MID), followed, where r < L,
    by the code after them, in RUN_END."""
    out_c: list[int] = []
    out_x: list[int] = []
    for r0 in range(0, codes.size, w):
        x = 0
        while x < w:
            i = r0 + x
            if ctx[i] % NB == 0 and (x == 0 or codes[i - 1] == 0):
                stretch = 1
                while x + stretch < w and ctx[i + stretch] % NB == 0:
                    stretch += 1
                j = x
                while j < x + stretch and codes[r0 + j] == 0:
                    j += 1
                s = stretch - (j - x)
                out_c.append((s >> 1) ^ -(s & 1))
                out_x.append(KL.RUN_ROW if x == 0 else KL.RUN_MID)
                if j < x + stretch:
                    out_c.append(int(codes[r0 + j]))
                    out_x.append(KL.RUN_END)
                    j += 1
                x = j
            else:
                out_c.append(int(codes[i]))
                out_x.append(int(ctx[i]))
                x += 1
    return out_c, out_x


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.integers(1, 40), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
       st.integers(0, 2**31 - 1))
def test_runs_apply_is_the_documented_rule(rows, w, p_zero, p_low, seed):
    rng = np.random.default_rng(seed)
    n = rows * w
    codes = np.where(rng.random(n) < p_zero, 0, rng.integers(-5, 6, n)).astype(np.int32)
    codes[rng.random(n) < 0.05] = -(2**31)      # FLAG, an outlier: not 0
    ctx = np.where(rng.random(n) < p_low, rng.integers(0, 2, n) * NB,
                   rng.integers(0, 2 * NB, n)).astype(np.uint8)
    want_c, want_x = _reference(codes, ctx, w)
    oc, ox, m = KL.runs_apply(codes, ctx, w, 10 * n + 10)
    assert m == len(want_c)
    assert oc[:m].tolist() == want_c and ox[:m].tolist() == want_x
    # the worst case fits the kernel's buffer: at most 1.5 symbols a point and 2 a row
    assert m <= n + n // 2 + 2 * rows
    # past the limit: -1
    if m > 0:
        assert KL.runs_apply(codes, ctx, w, m - 1)[2] == -1
    assert KL.runs_apply(codes, ctx, w, m)[2] == m


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(1, 90), st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_runs_apply_on_long_quiet_stretches(rows, w, skew, seed):
    # (the kernel reads 8 aligned points at once where they are quiet: long stretches,
    # a code or a context that breaks them anywhere in such a block, and arrays that
    # start at any byte: slices of a larger one)
    rng = np.random.default_rng(seed)
    n = rows * w
    codes = np.zeros(n + skew, np.int32)[skew:]
    ctx = np.zeros(n + skew, np.uint8)[skew:]
    ctx[:] = rng.integers(0, 2, n) * NB * (rng.random() < 0.5)
    for _ in range(int(rng.integers(0, 6))):
        i = int(rng.integers(0, n))
        if rng.random() < 0.5:
            codes[i] = rng.choice([-3, -1, 1, 2, -(2**31)])
        else:
            ctx[i] = rng.choice([1, 8, 16, 23, 25, 40])
    want_c, want_x = _reference(codes, ctx, w)
    oc, ox, m = KL.runs_apply(codes, ctx, w, 10 * n + 10)
    assert m == len(want_c)
    assert oc[:m].tolist() == want_c and ox[:m].tolist() == want_x
    assert KL.runs_apply(codes, ctx, w, m - 1)[2] == -1
    assert KL.runs_apply(codes, ctx, w, m)[2] == m


def test_runs_apply_refuses_codes_that_are_not_whole_rows():
    codes = np.zeros(10, np.int32)
    ctx = np.zeros(10, np.uint8)
    assert KL.runs_apply(codes, ctx, 3, 100)[2] == -1
    assert KL.runs_apply(codes, ctx, 0, 100)[2] == -1
    assert KL.runs_apply(codes, ctx, 5, 100)[2] == 2      # two rows, one run each


def _plume(t: int, h: int, w: int, seed: int = 1, channels: int = 0) -> np.ndarray:
    """Smooth values over a third of the frame, exact zeros elsewhere: runs pay."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    frames = []
    for i in range(t):
        r = np.hypot(yy - h / 2 - i, xx - w / 3)
        v = np.where(r < min(h, w) / 3, np.cos(r / 4) * 50 + 60 + rng.normal(0, 0.3, r.shape),
                     0.0)
        frames.append(v)
    x = np.stack(frames)
    if channels:
        x = np.stack([x * (c + 1) for c in range(channels)], axis=-1)
    return x


def _cfgs(blob: bytes) -> list[dict]:
    with tezip.open(blob) as f:
        return [f.window_meta(i)["cfg"] for i in range(f.n_windows)]


def _any_runs(x: np.ndarray, **kw) -> bool:
    """Whether coding ``x`` with ``kw`` run-codes any window."""
    return any("r" in c for c in _cfgs(tezip.compress(x, **kw)))


def _without_runs(monkeypatch, x, **kw) -> bytes:
    with monkeypatch.context() as m:
        m.setattr(classical, "RUN_SHARE", 0.0)
        return tezip.compress(x, **kw)


CASES = [
    ("lorenzo", "float32", "abs", 0.05, {}),
    ("spatial", "float32", "rel", 1e-3, {}),
    ("lorenzo", "float64", "abs", 1e-6, {}),
    ("spatial", "uint16", "abs", 2, {}),
    ("lorenzo", "int32", "abs", 0.5, {}),
    ("lorenzo", "uint16", "absrel", 1, {"rel_bound": 1e-2}),
    ("spatial", "float32", "abs", 0.05, {"channels": 3}),
]


@pytest.mark.parametrize("pred,dtype,mode,bound,extra", CASES)
def test_run_coded_windows_decode_as_without_runs(monkeypatch, pred, dtype, mode, bound,
                                                  extra):
    x = _plume(12, 48, 64, channels=extra.get("channels", 0))
    x = np.round(x * 3).astype(dtype) if np.dtype(dtype).kind in "iu" else x.astype(dtype)
    kw = {"mode": mode, "bound": bound, "predictor": pred, "window": 6,
          **({"rel_bound": extra["rel_bound"]} if "rel_bound" in extra else {})}
    _runs_decode_as_without(monkeypatch, x, kw, extra)


def _runs_decode_as_without(monkeypatch, x: np.ndarray, kw: dict, extra: dict) -> None:
    """``x`` coded with ``kw``: every window run-coded; decoded, what the same coding
    without runs decodes to, within the bound; and about as small."""
    blob = tezip.compress(x, **kw)
    assert all(c.get("r") == 1 for c in _cfgs(blob))
    plain = _without_runs(monkeypatch, x, **kw)
    assert not any("r" in c for c in _cfgs(plain))
    y = tezip.decompress(blob)
    assert y.dtype == x.dtype and np.array_equal(y, tezip.decompress(plain), equal_nan=True)
    check_bound(x, y, kw["mode"], kw["bound"], extra.get("rel_bound"))
    assert len(blob) <= 1.03 * len(plain)


def test_runs_with_a_second_stage_and_outliers_in_the_zeros(monkeypatch):
    """Smooth, slowly evolving values (a second stage pays) beside exact zeros, with
    NaN, Inf and huge values inside the zeros: outliers end runs."""
    t, h, w = 12, 30, 48
    yy, xx = np.mgrid[:h, :w]
    x = np.stack([np.sin(0.21 * xx + 0.13 * i) * np.cos(0.17 * yy - 0.05 * i) * 400
                  for i in range(t)])
    x[:, :, w // 2:] = 0.0
    x = x.astype(np.float32)
    x[3, 5, 40], x[4, 0, 30], x[5, 29, 47], x[6, 7, 24] = np.nan, np.inf, -np.inf, 3e30
    kw = {"mode": "abs", "bound": 1e-2, "window": 12}
    for pred in ("lorenzo", "spatial"):
        blob = tezip.compress(x, predictor=pred, **kw)
        cfgs = _cfgs(blob)
        assert cfgs[0].get("r") == 1 and "w" in cfgs[0], cfgs
        y = tezip.decompress(blob)
        check_bound(x, y, "abs", 1e-2)
        assert np.array_equal(y, tezip.decompress(_without_runs(monkeypatch, x, predictor=pred,
                                                                **kw)), equal_nan=True)


@pytest.mark.parametrize("w", [1, 2, 4097, 9000])
def test_runs_in_narrow_and_wide_rows(monkeypatch, w):
    """One-point rows (every point starts a row), and rows wider than the decoder's
    chunk of RUN_CHUNK points (runs that cross a chunk's start)."""
    rng = np.random.default_rng(w)
    h = max(1, 18000 // w)
    x = np.zeros((4, h, w), np.float32)
    if w >= 7:
        x[:, :, : w // 7] = rng.normal(0, 1, (4, h, w // 7))
    else:
        x[:, : h // 7] = rng.normal(0, 1, (4, h // 7, w))
    x[:, :, w // 2: w // 2 + 3] = 5.0
    x[1, 0, w - 1] = 7.0
    x[2, h // 2, (w - 1) // 3] = 3.0
    kw = {"mode": "abs", "bound": 1e-3, "predictor": "spatial"}
    # one-point rows: a run is a symbol a point, no fewer than without runs (forced here)
    with mock.patch.object(classical, "RUN_SHARE", 2.0 if w == 1 else classical.RUN_SHARE):
        blob = tezip.compress(x, **kw)
    assert _cfgs(blob)[0].get("r") == 1
    y = tezip.decompress(blob)
    check_bound(x, y, "abs", 1e-3)
    assert np.array_equal(y, tezip.decompress(_without_runs(monkeypatch, x, **kw)))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.integers(1, 9), st.integers(1, 23), st.floats(0.5, 0.99),
       st.sampled_from(["lorenzo", "spatial"]), st.integers(0, 2**31 - 1))
def test_sparse_integer_stacks_round_trip_exactly(t, h, w, p_zero, pred, seed):
    """Integers whose Lorenzo codes are mostly 0 (sums of sparse steps), coded exactly
    (abs 0.5, exact for integers): bit for bit back, runs or not."""
    rng = np.random.default_rng(seed)
    steps = np.where(rng.random((t, h, w)) < p_zero, 0, rng.integers(-40, 41, (t, h, w)))
    x = np.cumsum(np.cumsum(steps, axis=1), axis=2).astype(np.int32)
    with mock.patch.object(classical, "RUN_MIN", 0):    # runs in windows this small too
        blob = tezip.compress(x, mode="abs", bound=0.5, predictor=pred)
    assert np.array_equal(x, tezip.decompress(blob))


@pytest.mark.parametrize("pred,seed", [("spatial", 5), ("interp", 7)])
def test_damaged_run_coded_files_are_refused_or_decode_unchanged(pred, seed):
    x = (_plume(4, 64, 64) if pred == "spatial" else _wide(4, 32, 192)).astype(np.float32)
    blob = tezip.compress(x, mode="abs", bound=0.01, predictor=pred)
    assert _cfgs(blob)[0].get("r") == 1
    good = tezip.decompress(blob)
    rng = np.random.default_rng(seed)
    refused = 0
    for _ in range(300):
        b = bytearray(blob)
        for pos in rng.integers(0, len(b), rng.integers(1, 4)):
            b[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            y = tezip.decompress(bytes(b))
        except TezipError:
            refused += 1
            continue
        assert np.array_equal(y, good)
    assert refused > 250


@pytest.mark.parametrize("cfg,want", [({"pq": 1, "r": 1}, {"pq": 1, "r": 1}),
                                      ({"pq": 1, "w": [1, 0, 0, 0, 0, 0, 2], "r": 1},
                                       {"pq": 1, "w": [1, 0, 0, 0, 0, 0, 2], "r": 1})])
def test_run_configurations_are_accepted(cfg, want):
    for name in ("lorenzo", "spatial"):
        got = get(name).validate(cfg, (4, 5, 6))
        assert got == want
        assert get(name).contexts(got) == KL.N_CTX_RUNS and get(name).reads(got) == 2
    assert get("lorenzo").contexts({"pq": 1}) == KL.N_CTX


@pytest.mark.parametrize("cfg", [{"r": 1}, {"pq": 1, "r": 0}, {"pq": 1, "r": 2},
                                 {"pq": 1, "r": True}, {"pq": 1, "r": 1.0},
                                 {"pq": 1, "r": "1"}, {"pq": 1, "r": 1, "x": 0},
                                 {"r": 1, "w": [1, 0, 0, 0, 0, 0, 0]}])
def test_bad_run_configurations_are_refused(cfg):
    with pytest.raises(CorruptFileError):
        get("lorenzo").validate(cfg, (4, 5, 6))


def test_no_runs_in_the_log_domain_nor_where_they_do_not_pay():
    """pwrel codes no value for its zeros, so its codes are not whole rows: never run
    coded; nor is a noisy stack, whose codes are rarely 0."""
    x = _plume(6, 60, 64).astype(np.float32)
    assert not _any_runs(x, mode="pwrel", bound=1e-3, predictor="lorenzo")
    noise = np.random.default_rng(0).normal(0, 100, (6, 60, 64)).astype(np.float32)
    assert not _any_runs(noise, mode="abs", bound=0.01, predictor="lorenzo")


# --- interp's run coding (format v7, ``kernels.interp.runs_apply``) --------------------


def _interp_reference(codes: np.ndarray, ctx: np.ndarray, starts: list[int],
                      chunk: int) -> tuple[list[int], list[int]]:
    """The documented rule, written out: the codes before the first segment as they
    are; each segment cut into chunks of ``chunk``; in a chunk, each stretch of quiet
    points (bucket 0 of groups 0-3) coded as runs: the number r of codes of 0 before the
    next code that is not 0, as the code whose zigzag is r + 1 (0: to the stretch's
    end; RUN_ROW at the chunk's start, else RUN_MID), then that code (RUN_END), then the
    next run."""
    out_c = [int(v) for v in codes[: starts[0]]]
    out_x = [int(v) for v in ctx[: starts[0]]]
    bounds = [*starts, codes.size]

    def quiet(i: int) -> bool:
        return ctx[i] % NB == 0 and ctx[i] < 4 * NB

    for s0, s1 in zip(bounds[:-1], bounds[1:], strict=True):
        for c0 in range(s0, s1, chunk):
            e = min(c0 + chunk, s1)
            i = c0
            while i < e:
                if not quiet(i):
                    out_c.append(int(codes[i]))
                    out_x.append(int(ctx[i]))
                    i += 1
                    continue
                q = i
                while q < e and quiet(q):
                    q += 1
                while i < q:
                    j = i
                    while j < q and codes[j] == 0:
                        j += 1
                    z = 0 if j == q else j - i + 1
                    out_c.append((z >> 1) ^ -(z & 1))
                    out_x.append(KI.RUN_ROW if i == c0 else KI.RUN_MID)
                    if j < q:
                        out_c.append(int(codes[j]))
                        out_x.append(KI.RUN_END)
                        j += 1
                    i = j
    return out_c, out_x


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=12), st.integers(0, 5),
       st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_interp_runs_apply_is_the_documented_rule(lengths, head, p_zero, p_quiet, seed):
    rng = np.random.default_rng(seed)
    n = head + sum(lengths)
    codes = np.where(rng.random(n) < p_zero, 0, rng.integers(-5, 6, n)).astype(np.int32)
    codes[rng.random(n) < 0.05] = -(2**31)      # an outlier's code: not 0
    ctx = np.where(rng.random(n) < p_quiet, rng.integers(0, 5, n) * NB,
                   rng.integers(0, 5 * NB, n)).astype(np.uint8)   # (anchors: 4 NB)
    starts = list(np.cumsum([head, *lengths[:-1]]))
    want_c, want_x = _interp_reference(codes, ctx, starts, RUN_CHUNK)
    st_ = np.asarray(starts, np.int32)
    oc, ox, m, runs = KI.runs_apply(codes, ctx, st_, 10 * n + 10)
    assert m == len(want_c)
    assert oc[:m].tolist() == want_c and ox[:m].tolist() == want_x
    assert runs == sum(x in (KI.RUN_MID, KI.RUN_ROW) for x in want_x)
    assert m <= 2 * n
    if m > 0:
        assert KI.runs_apply(codes, ctx, st_, m - 1)[2] == -1
    assert KI.runs_apply(codes, ctx, st_, m)[2] == m


def test_interp_runs_apply_cuts_rows_into_the_decoders_chunks():
    """A row longer than RUN_CHUNK: its stretches end at the chunks' ends, where the
    decoder's knowledge of the contexts ends."""
    n = 2 * RUN_CHUNK + 500
    codes = np.zeros(n, np.int32)
    codes[RUN_CHUNK + 7] = 3
    ctx = np.zeros(n, np.uint8)
    oc, ox, m, runs = KI.runs_apply(codes, ctx, np.asarray([0], np.int32), n)
    want_c, want_x = _interp_reference(codes, ctx, [0], RUN_CHUNK)
    assert (oc[:m].tolist(), ox[:m].tolist()) == (want_c, want_x)
    # one run a chunk, the second chunk's ended by the 3 and then one more
    assert runs == 4 and ox[:m].tolist().count(KI.RUN_ROW) == 3
    bad = np.asarray([5, 2], np.int32)     # out of order
    assert KI.runs_apply(codes, ctx, bad, n)[2] == -1


def _wide(t: int, h: int, w: int, seed: int = 1, channels: int = 0) -> np.ndarray:
    """A smooth blob at the left of wide frames of exact zeros: interp's runs pay."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    frames = []
    for i in range(t):
        r = np.hypot(yy - h / 2 - i, xx - 22)
        frames.append(np.where(r < min(h, 40) / 2.3, np.cos(r / 4) * 50 + 60
                               + rng.normal(0, 0.3, r.shape), 0.0))
    x = np.stack(frames)
    if channels:
        x = np.stack([x * (c + 1) for c in range(channels)], axis=-1)
    return x


ICASES = [
    ("float32", "abs", 0.01, {}),
    ("float32", "rel", 1e-3, {"channels": 3}),
    ("float64", "abs", 1e-6, {}),
    ("uint16", "rel", 1e-3, {}),
    ("uint8", "lossless", None, {}),
    ("int32", "abs", 0.5, {}),
    ("uint16", "absrel", 2, {"rel_bound": 1e-2}),
]


@pytest.mark.parametrize("dtype,mode,bound,extra", ICASES)
def test_interp_run_coded_windows_decode_as_without_runs(monkeypatch, dtype, mode, bound,
                                                         extra):
    x = _wide(6, 40, 192, channels=extra.get("channels", 0))
    if np.dtype(dtype).kind in "iu":
        x = np.clip(np.round(x * (1 if dtype == "uint8" else 20)), 0,
                    np.iinfo(dtype).max).astype(dtype)
    else:
        x = x.astype(dtype)
    kw = {"mode": mode, "bound": bound, "predictor": "interp",
          **({"rel_bound": extra["rel_bound"]} if "rel_bound" in extra else {})}
    _runs_decode_as_without(monkeypatch, x, kw, extra)


@pytest.mark.parametrize("w", [2, 5, 9000])
def test_interp_runs_in_narrow_and_wide_frames(monkeypatch, w):
    """Frames two or five points wide (forced: runs do not pay there), and rows wider
    than the decoder's chunk, with outliers (NaN, Inf, a huge value) in the zeros."""
    h = max(3, 40000 // (4 * w))
    x = np.zeros((4, h, w), np.float32)
    rng = np.random.default_rng(w)
    x[:, : max(1, h // 5), : max(1, w // 5)] = rng.normal(0, 1, (4, max(1, h // 5),
                                                                   max(1, w // 5)))
    x[1, h // 2, w - 1] = 7.0
    x[2, h - 1, (w - 1) // 3] = np.nan
    x[3, 1, w // 2] = np.inf
    x[0, h // 3, w - 2] = 3e30
    kw = {"mode": "abs", "bound": 1e-3, "predictor": "interp"}
    with monkeypatch.context() as m:
        m.setattr(classical, "RUN_GAIN", 0 if w < 100 else classical.RUN_GAIN)
        m.setattr(classical, "RUN_SHARE", 2.0)
        blob = tezip.compress(x, **kw)
    assert _cfgs(blob)[0].get("r") == 1
    y = tezip.decompress(blob)
    check_bound(x, y, "abs", 1e-3)
    assert np.array_equal(y, tezip.decompress(_without_runs(monkeypatch, x, **kw)),
                          equal_nan=True)


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 6), st.integers(2, 12), st.integers(2, 40), st.floats(0.5, 0.99),
       st.integers(0, 2**31 - 1))
def test_sparse_integer_stacks_round_trip_exactly_through_interp_runs(t, h, w, p_zero, seed):
    rng = np.random.default_rng(seed)
    x = np.where(rng.random((t, h, w)) < p_zero, 0,
                 rng.integers(-300, 300, (t, h, w))).astype(np.int32)
    with mock.patch.multiple(classical, RUN_MIN=0, RUN_GAIN=0, RUN_SHARE=2.0):
        blob = tezip.compress(x, mode="lossless", bound=None, predictor="interp")
    assert np.array_equal(x, tezip.decompress(blob))


def test_interp_run_configurations_are_checked():
    base = {"order": [0, 1, 2], "cubic": False, "ab": [1.0, 1.0], "anchor": 32}
    got = get("interp").validate({**base, "r": 1}, (4, 5, 6))
    assert got == {**base, "r": 1}
    assert get("interp").contexts(got) == KI.N_CTX_RUNS and get("interp").reads(got) == 2
    assert get("interp").contexts(base) == KI.N_CTX and get("interp").reads(base) == 1
    for bad in ({**base, "r": 0}, {**base, "r": True}, {**base, "r": 1.0}, {**base, "r": 2},
                {**base, "x": 1}):
        with pytest.raises(CorruptFileError):
            get("interp").validate(bad, (4, 5, 6))


def test_interp_runs_only_where_they_pay():
    """Square frames of a blob (runs of about five points: they would cost the decoder
    more time than they save), pwrel (no codes for its zeros) and noise: no runs."""
    sq = _plume(6, 64, 64).astype(np.float32)
    assert not _any_runs(sq, mode="abs", bound=1e-2, predictor="interp")
    wide = _wide(6, 40, 192).astype(np.float32)
    assert not _any_runs(wide, mode="pwrel", bound=1e-3, predictor="interp")
    noise = np.random.default_rng(0).normal(0, 100, (6, 60, 64)).astype(np.float32)
    assert not _any_runs(noise, mode="abs", bound=0.01, predictor="interp")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=10), st.integers(0, 4),
       st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_interp_quiet_stats_bound_the_runs(lengths, head, p_zero, p_quiet, seed):
    """``quiet_stats``' zeros Z and stretches S: the run coding saves Z - R symbols with
    R >= S runs (the bound that spares a window the run coding's pass)."""
    rng = np.random.default_rng(seed)
    n = head + sum(lengths)
    codes = np.where(rng.random(n) < p_zero, 0, rng.integers(-3, 4, n)).astype(np.int32)
    ctx = np.where(rng.random(n) < p_quiet, rng.integers(0, 5, n) * NB,
                   rng.integers(0, 5 * NB, n)).astype(np.uint8)
    starts = np.asarray(np.cumsum([head, *lengths[:-1]]), np.int64)
    z, s = KI.quiet_stats(codes, ctx, starts)
    _, _, m, runs = KI.runs_apply(codes, ctx, starts, 10 * n + 10)
    assert n - m == z - runs and runs >= s


def _hot_pixels(shape: tuple[int, ...], share: float, lo: int, hi: int, seed: int = 1
                ) -> np.ndarray:
    """Detector frames: a flat background of 100 and a share of hot pixels."""
    rng = np.random.default_rng(seed)
    x = np.full(shape, 100, np.uint16)
    hot = rng.random(shape) < share
    x[hot] += rng.integers(lo, hi, hot.sum()).astype(np.uint16)
    return x


@pytest.mark.parametrize("pred", ["interp", "lorenzo"])
def test_a_small_window_is_written_without_runs_where_that_is_smaller(monkeypatch, pred):
    x = _hot_pixels((8, 128, 128), 0.002, 1, 11)
    kw = {"mode": "abs", "bound": 2, "predictor": pred}
    forced = tezip.compress(x, **kw)         # (runs kept: this module's fixture)
    plain = _without_runs(monkeypatch, x, **kw)
    assert all(c.get("r") == 1 for c in _cfgs(forced)) and len(forced) > len(plain)
    monkeypatch.setattr(codec, "RUN_CHECK_BYTES", RUN_CHECK_BYTES)
    assert tezip.compress(x, **kw) == plain


def test_a_small_window_keeps_its_runs_where_they_are_smaller(monkeypatch):
    x = _hot_pixels((16, 96, 96), 0.002, 100, 4000) - np.uint16(100)
    kw = {"mode": "abs", "bound": 2, "predictor": "classical"}
    forced = tezip.compress(x, **kw)
    assert all(c.get("r") == 1 for c in _cfgs(forced))
    assert len(forced) < len(_without_runs(monkeypatch, x, **kw)) < RUN_CHECK_BYTES
    monkeypatch.setattr(codec, "RUN_CHECK_BYTES", RUN_CHECK_BYTES)
    assert tezip.compress(x, **kw) == forced


def _dark(t: int, n: int, lam: float, seed: int = 3) -> np.ndarray:
    """A detector's dark frames: 100 + Poisson(lam) counts, 0.2% of pixels hot."""
    r = np.random.default_rng(seed)
    x = 100 + r.poisson(lam, (t, n, n))
    x = x + (r.random((n, n)) < 0.002)[None] * r.integers(1000, 4000, (n, n))[None]
    return x.astype(np.uint16)


def test_a_large_window_whose_runs_code_larger_is_written_without_them(monkeypatch):
    x = _dark(32, 256, 0.5)
    kw = {"mode": "abs", "bound": 2, "predictor": "interp"}
    forced = tezip.compress(x, **kw)         # (runs kept: this module's fixture)
    plain = _without_runs(monkeypatch, x, **kw)
    assert all(c.get("r") == 1 for c in _cfgs(forced))
    assert len(forced) > len(plain) > RUN_CHECK_BYTES
    monkeypatch.setattr(codec, "RUN_CHECK_BYTES", RUN_CHECK_BYTES)
    monkeypatch.setattr(classical, "RUN_SAMPLE", RUN_SAMPLE)
    assert tezip.compress(x, **kw) == plain


def test_hot_pixels_whose_low_bits_compress_are_written_without_runs(monkeypatch):
    # (1% of pixels hot, the same in every frame: the plain coding's low bits compress
    # in the file, which a sample's short stream does not show; a break-test's case)
    r = np.random.default_rng(0)
    x = 100 + r.poisson(0.1, (33, 256, 256))
    x = (x + ((r.random((256, 256)) < 0.01) * r.integers(1000, 4000, (256, 256)))[None]
         ).astype(np.uint16)
    kw = {"mode": "abs", "bound": 1, "predictor": "interp"}
    forced = tezip.compress(x, **kw)
    plain = _without_runs(monkeypatch, x, **kw)
    assert all(c.get("r") == 1 for c in _cfgs(forced))
    assert len(forced) > 1.1 * len(plain) > RUN_CHECK_BYTES
    monkeypatch.setattr(codec, "RUN_CHECK_BYTES", RUN_CHECK_BYTES)
    monkeypatch.setattr(classical, "RUN_SAMPLE", RUN_SAMPLE)
    assert tezip.compress(x, **kw) == plain


@pytest.mark.parametrize("pred", ["interp", "lorenzo"])
def test_doubted_runs_are_kept_where_they_code_smaller(monkeypatch, pred):
    # sparse events: runs make them smaller; a doubt (forced here) codes both, keeps runs
    r = np.random.default_rng(4)
    x = ((r.random((16, 256, 256)) < 0.01) * r.integers(1, 200, (16, 256, 256))
         ).astype(np.int16)
    kw = {"mode": "abs", "bound": 0.5, "predictor": pred}
    forced = tezip.compress(x, **kw)
    assert all(c.get("r") == 1 for c in _cfgs(forced))
    assert RUN_CHECK_BYTES < len(forced) < len(_without_runs(monkeypatch, x, **kw))
    monkeypatch.setattr(codec, "RUN_CHECK_BYTES", RUN_CHECK_BYTES)
    monkeypatch.setattr(classical, "RUN_SAMPLE", RUN_SAMPLE)
    asked = []
    monkeypatch.setattr(classical, "_runs_doubtful", lambda *a: asked.append(1) or True)
    assert tezip.compress(x, **kw) == forced and asked


def test_the_run_size_check_is_for_integer_data_only(monkeypatch):
    monkeypatch.setattr(classical, "RUN_SAMPLE", RUN_SAMPLE)
    asked = []
    monkeypatch.setattr(classical, "_runs_doubtful", lambda *a: asked.append(1) or False)
    x = _plume(16, 64, 128)
    blob = tezip.compress(x, mode="abs", bound=0.05, predictor="spatial")
    assert all(c.get("r") == 1 for c in _cfgs(blob)) and not asked
    tezip.compress(_dark(8, 128, 0.5), mode="abs", bound=2, predictor="lorenzo")
    assert asked
