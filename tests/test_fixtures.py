"""Format compatibility: every .tez fixture of every format version decodes to the array
stored beside it, bit for bit. A change that breaks one must bump FORMAT_VERSION and keep
the old reader (tests/fixtures/make_fixtures.py writes the fixtures of a new version)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tezip
from tezip.container import FORMAT_VERSION

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("v*/*.tez"))


def test_fixtures_exist_for_the_current_version():
    assert any(p.parent.name == f"v{FORMAT_VERSION}" for p in FIXTURES)
    assert len({p.stem for p in FIXTURES}) >= 10


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fixture_decodes_bit_for_bit(path):
    want = np.load(path.with_suffix(".npy"))
    with tezip.open(path) as f:
        assert f.header["format_version"] == int(path.parent.name[1:])
        got = f.read_all()
        part = f[1:3]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    assert part.tobytes() == want[1:3].tobytes()


def test_the_byte_plane_fixture_covers_every_transform():
    """v2/f32_lossless_shuffle (written after the rest of v2, when the 'shuffle' coding of
    bit-exact floats came): a window for each of its transforms, two with a fill mask."""
    path = Path(__file__).parent / "fixtures" / "v2" / "f32_lossless_shuffle.tez"
    with tezip.open(path) as f:
        cfgs = [f.window_meta(i)["cfg"] for i in range(f.n_windows)]
        assert {f.window_meta(i)["p"] for i in range(f.n_windows)} == {"shuffle"}
    assert sorted(c["t"] for c in cfgs) == ["raw", "space", "time"]
    assert sum(c["fill"] is not None for c in cfgs) == 2


def _windows(version: str):
    """(window record, quantizer kind) of every window of the fixtures of ``version``."""
    for path in FIXTURES:
        if path.parent.name == version:
            with tezip.open(path) as f:
                for i in range(f.n_windows):
                    yield f.window_meta(i), f.header["quant"]["kind"]


def test_the_v4_fixtures_hold_second_stages():
    """v4 added the Lorenzo second stage: its fixtures hold 3-D and 2-D windows with one,
    float and integer."""
    seen = {(meta["p"], kind) for meta, kind in _windows("v4") if "w" in meta["cfg"]}
    assert {"lorenzo", "spatial"} <= {p for p, _ in seen}
    assert {"float", "int"} <= {k for _, k in seen}


def test_the_v5_fixtures_hold_edge_extrapolation():
    """v5 added interp's linear extrapolation at the edges: its fixtures hold windows
    with it, float and integer."""
    seen = {kind for meta, kind in _windows("v5")
            if meta["p"] == "interp" and meta["cfg"].get("edge")}
    assert {"float", "int"} <= seen


def test_the_v6_fixtures_hold_run_coding():
    """v6 added the Lorenzo predictors' run coding: its fixtures hold 2-D and 3-D windows
    with it, float and integer, one with a second stage."""
    seen = [(meta["p"], kind, "w" in meta["cfg"]) for meta, kind in _windows("v6")
            if meta["cfg"].get("r") == 1]
    assert {"lorenzo", "spatial"} <= {p for p, _, _ in seen}
    assert {"float", "int"} <= {k for _, k, _ in seen}
    assert any(w for _, _, w in seen)


def test_the_v7_fixtures_hold_interp_run_coding():
    """v7 added interp's run coding: its fixtures hold windows with it, float and
    integer."""
    seen = {kind for meta, kind in _windows("v7")
            if meta["p"] == "interp" and meta["cfg"].get("r") == 1}
    assert {"float", "int"} <= seen


def test_the_v8_fixtures_hold_wavelet_windows():
    """v8 added the wavelet transform coder: its fixtures hold wavelet windows, float and
    integer, one of several channels."""
    seen = {kind for meta, kind in _windows("v8") if meta["p"] == "wavelet"}
    assert {"float", "int"} <= seen


def test_the_v8_fixtures_hold_a_learned_window():
    """A learned window written by 0.8.0 with the shipped model: the network's kernels
    (``kernels.nn``) must keep their bits, or the window's forecast CRC refuses it (0.8.1
    rewrote conv3x3 four output channels at a time, the same bits)."""
    assert any(meta["p"] == "learned" for meta, _ in _windows("v8"))
