"""Window planning: a short last window joins the one before it (windows.coded_windows),
in the codec, in the container's header and in the data set's shard and piece cuts."""

from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound
from hypothesis import given, settings
from hypothesis import strategies as st

import tezip
from tezip.codec import ArrayStack, Options, compress_stack, tune_stack
from tezip.dataset import config, plan
from tezip.windows import (
    ANCHOR_FRAMES,
    AUTO_WINDOW_VALUES,
    DEFAULT_WINDOW,
    MAX_WINDOW_VALUES,
    TRANSFORM_MAX_FRAMES,
    TRANSFORM_WINDOW_VALUES,
    coded_windows,
    fixed_windows,
    transform_window,
    window_length,
)


@pytest.mark.parametrize("n,length,want", [
    (2, 33, [(0, 2)]),
    (33, 33, [(0, 33)]),
    (49, 33, [(0, 49)]),                    # a tail of 16 (< 33 / 2) joins
    (50, 33, [(0, 33), (33, 50)]),          # a tail of 17 stays a window
    (72, 33, [(0, 33), (33, 72)]),
    (100, 33, [(0, 33), (33, 66), (66, 100)]),
    (5, 2, [(0, 2), (2, 4), (4, 5)]),       # one frame is half of 2: not fewer
    (13, 4, [(0, 4), (4, 8), (8, 13)]),
])
def test_coded_windows(n, length, want):
    assert coded_windows(n, length) == want


@given(st.integers(1, 400), st.integers(1, 70), st.integers(1, 1 << 22))
@settings(max_examples=300, deadline=None)
def test_coded_windows_tile_the_stack(n, length, frame_values):
    length = max(1, min(length, MAX_WINDOW_VALUES // frame_values))
    got = coded_windows(n, length, frame_values)
    assert got[0][0] == 0 and got[-1][1] == n
    assert all(a < b and b == c for (a, b), (c, _) in zip(got, got[1:], strict=False))
    assert all(b - a == length for a, b in got[:-1])
    assert all((b - a) * frame_values <= MAX_WINDOW_VALUES for a, b in got)
    last = got[-1][1] - got[-1][0]
    joined = len(got) < len(fixed_windows(n, length))
    assert joined == (last > length)
    if len(got) > 1 and not joined:       # a short tail stays alone only past the cap
        assert 2 * last >= length or (length + last) * frame_values > MAX_WINDOW_VALUES


def test_no_join_past_the_window_value_limit():
    fv = MAX_WINDOW_VALUES // 10           # a window of 10 such frames is the limit
    assert coded_windows(12, 10, fv) == [(0, 10), (10, 12)]
    assert coded_windows(12, 10, fv // 2) == [(0, 12)]


def test_a_short_tail_is_coded_in_the_window_before():
    a = smooth_stack((38, 20, 24))
    blob = tezip.compress(a, mode="rel", bound=1e-3, window=16)
    with tezip.open(blob) as f:
        assert f.window_frames() == [(0, 16), (16, 38)]
        assert f.window == 22                  # the header: the longest window
        check_bound(a, f.read_all(), "rel", 1e-3)
        np.testing.assert_array_equal(f[20:30], f.read_all()[20:30])
    blob = tezip.compress(a[:20], mode="rel", bound=1e-3, window=16)
    with tezip.open(blob) as f:
        assert f.window_frames() == [(0, 20)] and f.window == 20


def test_the_tuning_runs_on_the_joined_first_window():
    """tune_stack and compress_stack tune on the same frames, so that pieces coded with
    the whole's tuning write the whole's bytes."""
    a = smooth_stack((22, 16, 16))
    opts = Options(tezip.make_bound("rel", 1e-3), predictor="classical", window=16)
    st_ = ArrayStack(a)
    t = tune_stack(st_, opts)
    b1, b2 = io.BytesIO(), io.BytesIO()
    compress_stack(st_, None, opts, fileobj=b1)
    compress_stack(st_, None, opts, fileobj=b2, tuning=t)
    assert b1.getvalue() == b2.getvalue()


def test_shards_and_pieces_cut_on_the_coded_windows():
    info = plan.SourceInfo((70, 8, 8), "float32", None, (0, 0))
    codec = config.CodecConfig("rel", 1e-3, window=16)
    starts = {a for a, _ in coded_windows(70, 16)}
    for target in (10**9, 4000, 1000, 1):
        shards = plan.plan_shards([info], codec, target)
        assert all(s.t0 in starts for s in shards)
        for p in plan.plan_pieces(shards, [info], codec, 1):
            assert p.t0 in starts
            # a piece coded on its own has the windows the whole stack has there
            local = [(p.t0 + a, p.t0 + b) for a, b in coded_windows(p.t1 - p.t0, 16)]
            assert set(local) <= set(coded_windows(70, 16))


def test_no_run_of_one_frame_with_windows_of_one_frame():
    """Windows of one frame (--window 1, or frames of 2^26 values and more): shards and
    pieces are runs of at least two frames (a piece of one frame could not be coded)."""
    info = plan.SourceInfo((40, 8, 8), "float32", None, (0, 0))
    codec = config.CodecConfig("rel", 1e-3, window=1)
    for target in (10**9, 100, 1):
        shards = plan.plan_shards([info], codec, target)
        pieces = plan.plan_pieces(shards, [info], codec, 1)
        assert all(x.t1 - x.t0 >= 2 for x in [*shards, *pieces])
        assert pieces[0].t0 == 0 and pieces[-1].t1 == 40
        assert all(a.t1 == b.t0 for a, b in zip(pieces, pieces[1:], strict=False))


@pytest.mark.parametrize("bad", [True, 1.5, 0, -2, "3"])
def test_window_must_be_a_whole_number(bad):
    with pytest.raises(tezip.OptionError, match="window must be a positive whole number"):
        tezip.compress(smooth_stack((4, 8, 8)), mode="abs", bound=0.1, window=bad)


def test_numpy_integers_are_taken_for_window_and_threads():
    a = smooth_stack((10, 8, 8))
    ref = tezip.compress(a, mode="abs", bound=0.1, window=4, threads=2)
    assert tezip.compress(a, mode="abs", bound=0.1, window=np.int64(4),
                          threads=np.int32(2)) == ref


@pytest.mark.parametrize("fv,want", [
    (1, 262145), (256, 1025), (1024, 257), (4096, 65), (7943, 65),   # small frames
    (7944, 33), (109 * 110, 33), (256 * 256, 33),     # DEFAULT_WINDOW holds enough
    (MAX_WINDOW_VALUES // 10, 10), (MAX_WINDOW_VALUES + 1, 1),       # very large frames
])
def test_automatic_window_length(fv, want):
    assert window_length(None, fv) == want
    n = window_length(None, fv)
    if n > DEFAULT_WINDOW:      # the fewest frames 32 k + 1 that hold the values
        assert (n - 1) % ANCHOR_FRAMES == 0 and n * fv >= AUTO_WINDOW_VALUES
        assert (n - 1 - ANCHOR_FRAMES) * fv < AUTO_WINDOW_VALUES
    assert window_length(33, fv) == min(33, max(1, MAX_WINDOW_VALUES // fv))  # as asked


def test_the_anchor_frames_are_the_interpolations_anchor():
    from tezip.predictors.classical import DEFAULT_ANCHOR

    assert ANCHOR_FRAMES == DEFAULT_ANCHOR


def test_small_frames_get_long_windows_unless_a_length_is_asked_for():
    a = smooth_stack((300, 16, 16))
    auto = tezip.compress(a, mode="rel", bound=1e-3, predictor="classical")
    asked = tezip.compress(a, mode="rel", bound=1e-3, predictor="classical", window=33)
    with tezip.open(auto) as f:
        assert f.window_frames() == [(0, 300)]          # 1,025 frames: the whole stack
        check_bound(a, f.read_all(), "rel", 1e-3)
    with tezip.open(asked) as f:
        assert len(f.window_frames()) == 9
        check_bound(a, f.read_all(), "rel", 1e-3)
    b = smooth_stack((40, 96, 96))                      # 9,216 values a frame: 33 frames
    assert (tezip.compress(b, mode="rel", bound=1e-3, predictor="classical")
            == tezip.compress(b, mode="rel", bound=1e-3, predictor="classical", window=33))


def test_the_tuning_sample_of_a_long_window_of_small_frames():
    """A window of small frames longer than DEFAULT_WINDOW is sampled as a run of 32 k
    + 1 of its frames from a multiple of 32 near its middle, as few as hold the
    sample's values; a window of DEFAULT_WINDOW frames is its own sample."""
    from tezip.codec import _SAMPLE_VALUES, sample_tiles

    x = np.arange(1025 * 16 * 16, dtype=np.float32).reshape(1025, 16, 16)
    s = sample_tiles(x)
    assert s.shape[1:] == (16, 16) and (s.shape[0] - 1) % 32 == 0
    assert s.shape[0] * 256 >= _SAMPLE_VALUES > (s.shape[0] - 33) * 256
    assert s[0, 0, 0] == x[512, 0, 0]                  # frames 512.. of 0..1024
    assert sample_tiles(x[:33]).shape == (33, 16, 16)


def test_the_cli_window_default_is_automatic(tmp_path):
    from tezip.cli import main

    src = tmp_path / "small.npy"
    np.save(src, smooth_stack((200, 16, 16)))
    for extra, n in (([], 1), (["--window", "33"], 6)):
        out = tmp_path / f"o{len(extra)}.tez"
        assert main(["compress", str(src), str(out), "--bound", "1e-3", *extra]) == 0
        with tezip.open(out) as f:
            assert len(f.window_frames()) == n
    assert main(["compress", str(src), str(tmp_path / "x.tez"), "--window", "0"]) == 1


@pytest.mark.parametrize("fv,want", [
    (128 * 128, 129), (109 * 110, 129), (256 * 256, 65), (512 * 512, 33),
    (1024 * 1024, 33), (64 * 64, 129), (16 * 16, 1025), (1, 262145),
])
def test_transform_windows_are_lengthened_on_the_anchor_grid(fv, want):
    """``windows.transform_window``: an automatic window doubled (2 (n - 1) + 1 frames)
    while it holds at most TRANSFORM_WINDOW_VALUES values past its first frame, up to
    TRANSFORM_MAX_FRAMES; never shortened (frames so small that the window is longer
    already keep it)."""
    n = window_length(None, fv)
    got = transform_window(n, fv)
    assert got == want and got >= n and (got - 1) % ANCHOR_FRAMES == 0
    if got > n:
        assert got <= TRANSFORM_MAX_FRAMES and (got - 1) * fv <= TRANSFORM_WINDOW_VALUES
        assert 2 * (got - 1) + 1 > TRANSFORM_MAX_FRAMES or \
            2 * (got - 1) * fv > TRANSFORM_WINDOW_VALUES

