"""`tezip bench` and tezip.bench: rows, bound and bit-exact checks, skipped codecs, PSNR,
markdown, JSON and the rate-distortion plot, on tiny generated stacks."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_stack

from tezip import bench
from tezip.errors import OptionError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SKIPPED = "skipped:"


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def _skipped(r: dict) -> bool:
    return r["ratio"] is None and r["ok"] is None and SKIPPED in r["note"]


@pytest.fixture(scope="module")
def u16_rows():
    # values well under 4096, so x265 (at most 12 bits) applies when ffmpeg is there
    a = smooth_stack((6, 24, 20), dtype="uint16", scale=3000, offset=50)
    return bench.bench_array("u16", a, (1e-2, None), ("classical",))


def test_every_row_checked_or_skipped_with_a_note(u16_rows):
    assert u16_rows
    for r in u16_rows:
        if _skipped(r):
            continue
        assert r["ok"] is True, r
        assert r["ratio"] > 0 and r["compressed_bytes"] > 0
        if r["bound"] == bench.LOSSLESS:
            assert r["max_abs_error"] == 0 and r["psnr"] is None
        else:
            assert r["max_abs_error"] <= r["bound_abs"]
            assert r["psnr"] is not None and r["psnr"] > 20


def test_codecs_measured_when_installed(u16_rows):
    got = {(r["bound"], r["codec"]): r for r in u16_rows}
    measured = {c for (_, c), r in got.items() if r["ratio"] is not None}
    assert {"tezip-classical", bench.ZSTD3, bench.ZSTD19} <= measured
    expect = {bench.SZ3: "pysz", bench.ZFP: "zfpy", bench.SPERR: "imagecodecs",
              bench.JPEGXL: "imagecodecs", bench.JPEGLS: "imagecodecs",
              bench.BLOSC2_SHUFFLE: "blosc2", bench.BLOSC2_BITSHUFFLE: "blosc2"}
    for codec, mod in expect.items():
        assert any(c == codec for _, c in got), codec  # a row either way
        if _has(mod):
            assert codec in measured, got[next(k for k in got if k[1] == codec)]
    if bench._ffmpeg() and " ffv1 " in bench._ffmpeg_encoders(bench._ffmpeg()):
        assert bench.FFV1 in measured


def test_float_data_skips_the_integer_image_codecs():
    a = smooth_stack((4, 16, 16), dtype="float32")
    rows = bench.bench_array("f32", a, (None,), ("classical",),
                             codecs=("jpegxl", "jpegls", "ffv1", "x265"))
    other = [r for r in rows if not r["codec"].startswith("tezip")]
    assert {r["codec"] for r in other} == {bench.JPEGXL, bench.JPEGLS, bench.FFV1, bench.X265}
    for r in other:
        assert _skipped(r), r
        if "not on the PATH" not in r["note"] and "not installed" not in r["note"]:
            assert "float32" in r["note"]


def test_missing_codecs_are_skipped_with_a_note(monkeypatch):
    for mod in ("pysz", "zfpy", "imagecodecs", "blosc2"):
        monkeypatch.setitem(sys.modules, mod, None)  # import raises ImportError
    monkeypatch.setattr(bench, "_ffmpeg", lambda: None)
    a = smooth_stack((4, 16, 16), dtype="uint16", scale=1000)
    rows = bench.bench_array("gone", a, (1e-2, None), ("classical",))
    others = [r for r in rows if not r["codec"].startswith(("tezip", "zstd"))]
    assert len(others) == 3 + 2 + 4  # SZ3 ZFP SPERR, 2x blosc2, JPEG-XL JPEG-LS FFV1 x265
    for r in others:
        assert _skipped(r), r
    notes = {r["codec"]: r["note"] for r in others}
    assert "pysz" in notes[bench.SZ3] and "ffmpeg" in notes[bench.X265]
    assert all(r["ok"] for r in rows if r["codec"].startswith(("tezip", "zstd")))
    md = bench.to_markdown(rows)
    assert "skipped" in md and "pysz (SZ3) is not installed" in md


def test_learned_on_lossless_floats_is_skipped_not_failed():
    """The learned predictor refuses lossless floats by design: that row is skipped with
    the codec's reason (it used to be FAILED, with a traceback in the row)."""
    a = smooth_stack((4, 16, 16), dtype="float32")
    rows = bench.bench_array("f32", a, (1e-2, None), ("auto", "learned"), codecs=("zstd",))
    got = {(r["bound"], r["codec"]): r for r in rows}
    r = got[(bench.LOSSLESS, "tezip-learned")]
    assert _skipped(r) and "error" not in r, r
    assert r["note"] == ("skipped: the learned predictor codes absolute and relative bounds "
                         "and lossless integers, not this mode")
    assert got[(bench.LOSSLESS, "tezip")]["ok"] is True
    assert all(r["ok"] is True or _skipped(r) for r in rows), rows
    md = bench.to_markdown(rows)
    assert "FAILED" not in md and "| skipped |" in md
    assert "- tezip-learned (f32): skipped: the learned predictor" in md


def test_an_option_error_of_another_tezip_row_still_fails(monkeypatch):
    def refuse(*args, **kw):
        raise OptionError("no")
    monkeypatch.setattr(bench.tezip, "compress", refuse)
    rows = bench.bench_array("f32", smooth_stack((2, 8, 8)), (None,), ("classical",),
                             codecs=())
    assert rows[0]["ok"] is False and "FAILED: OptionError: no" in rows[0]["note"]


def test_cli_bench_learned_on_lossless_floats_exits_0(tmp_path):
    src = tmp_path / "tiny.npy"
    np.save(src, smooth_stack((4, 16, 16), dtype="float32"))
    p = subprocess.run([sys.executable, "-m", "tezip", "bench", str(src), "--bounds",
                        "lossless", "--predictors", "auto,learned", "--codecs", "zstd"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TEZIP_DEBUG": ""})
    assert p.returncode == 0, p.stderr
    assert "FAILED" not in p.stdout + p.stderr and "Traceback" not in p.stderr
    line = [x for x in p.stderr.splitlines() if "tezip-learned" in x]
    assert len(line) == 1 and "tezip-learned: skipped: the learned predictor" in line[0]


def test_a_broken_bound_is_caught():
    a = smooth_stack((3, 8, 8))
    case = bench._Case("bad", a, 1e-2, 0.01, 0.01, "", 1, bench.value_range(a))
    row = bench._row(case, "liar")
    bench._measure(row, case, lambda: a.tobytes(), lambda b: a + np.float32(0.5), len,
                   bench._lossy_check(a, 0.01))
    assert row["ok"] is False and "BOUND VIOLATED" in row["note"]
    assert "**" in bench.to_markdown([row])
    case = bench._Case("bad", a, None, 0.0, 0.0, "", 1, bench.value_range(a))
    row = bench._row(case, "not-lossless")
    bench._measure(row, case, lambda: b"x", lambda b: a.astype(np.float64), len,
                   bench._lossless_check(a))
    assert row["ok"] is False and "NOT BIT-EXACT" in row["note"]


def test_repeats_go_in_rounds_over_the_codecs_and_keep_the_best_times(monkeypatch):
    a = smooth_stack((2, 8, 8))
    case = bench._Case("r", a, None, 0.0, 0.0, "", 3, bench.value_range(a))
    calls: list[str] = []
    # the seconds each run takes, by what runs: codec x's get slower, y's quicker
    clock = {"enc x": [1.0, 2.0, 3.0], "dec x": [4.0, 5.0, 6.0],
             "enc y": [6.0, 5.0, 4.0], "dec y": [3.0, 2.0, 1.0]}

    def fake_timed(fn):
        n = len(calls)
        out = fn()
        return clock[calls[n]].pop(0), out

    monkeypatch.setattr(bench, "_timed", fake_timed)

    def codec(c: str) -> tuple:
        def enc() -> bytes:
            calls.append(f"enc {c}")
            return a.tobytes()

        def dec(blob: bytes) -> np.ndarray:
            calls.append(f"dec {c}")
            return a.copy()
        return enc, dec

    rows = [bench._row(case, c) for c in "xy"]
    for row, c in zip(rows, "xy", strict=True):
        bench._measure(row, case, *codec(c), len, bench._lossless_check(a))
    assert [m.row["codec"] for m in case.pending] == ["x", "y"]
    bench._repeat_rounds(case)
    # the first runs x, y; a round x, y; a round starting one further on: y, x
    assert [c for c in calls if c.startswith("enc")] == [
        "enc x", "enc y", "enc x", "enc y", "enc y", "enc x"]
    assert len(calls) == 12 and not case.pending
    mb = a.nbytes / 1e6
    assert rows[0]["enc_mbs"] == pytest.approx(mb / 1.0)
    assert rows[0]["dec_mbs"] == pytest.approx(mb / 4.0)
    assert rows[1]["enc_mbs"] == pytest.approx(mb / 4.0)
    assert rows[1]["dec_mbs"] == pytest.approx(mb / 1.0)
    assert rows[0]["ok"] and rows[1]["ok"]


def test_a_slow_row_is_timed_once(monkeypatch):
    a = smooth_stack((2, 8, 8))
    case = bench._Case("r", a, None, 0.0, 0.0, "", 3, bench.value_range(a))
    monkeypatch.setattr(bench, "_timed", lambda fn: (bench.REPEAT_MAX_SECONDS, fn()))
    row = bench._row(case, "slow")
    bench._measure(row, case, lambda: a.tobytes(), lambda b: a.copy(), len,
                   bench._lossless_check(a))
    assert row["ok"] and not case.pending and "timed once" in row["note"]


def test_a_slow_first_run_that_loaded_a_kernel_is_timed_again(monkeypatch):
    # (a run-coded decoder compiled inside the first timed decode: "timed once", 0.3
    # MB/s, in a bench run whose warm-up corner was too small for runs)
    a = smooth_stack((2, 8, 8))
    case = bench._Case("r", a, None, 0.0, 0.0, "", 3, bench.value_range(a))
    times = iter([8.0, 4.0, 1.0, 2.0])      # encode, decode; then again
    monkeypatch.setattr(bench, "_timed", lambda fn: (next(times), fn()))
    loads = iter([5, 6])                     # a kernel loaded during the first run
    monkeypatch.setattr(bench, "_kernel_loads", lambda: next(loads))
    row = bench._row(case, "compiles")
    bench._measure(row, case, lambda: a.tobytes(), lambda b: a.copy(), len,
                   bench._lossless_check(a))
    assert row["ok"] and "timed once" not in row["note"] and len(case.pending) == 1
    mb = a.nbytes / 1e6
    assert row["enc_mbs"] == pytest.approx(mb / 1.0)
    assert row["dec_mbs"] == pytest.approx(mb / 2.0)


def test_kernel_loads_are_counted():
    import numba

    @numba.njit
    def _fresh(x):          # (a new function, not cached: its first call compiles)
        return x + 1

    before = bench._kernel_loads()
    _fresh(1)
    assert bench._kernel_loads() > before


def test_a_codec_failing_on_a_repeat_fails_its_row():
    a = smooth_stack((2, 8, 8))
    case = bench._Case("r", a, None, 0.0, 0.0, "", 2, bench.value_range(a))
    runs = []

    def enc() -> bytes:
        runs.append(1)
        if len(runs) > 1:
            raise RuntimeError("flaky")
        return a.tobytes()

    row = bench._row(case, "flaky")
    bench._measure(row, case, enc, lambda b: a.copy(), len, bench._lossless_check(a))
    assert row["ok"] is True and row["ratio"] is not None
    assert bench._repeat_rounds(case) == [row]
    assert row["ok"] is False and "FAILED on a repeat: RuntimeError: flaky" in row["note"]
    assert bench.failed_tezip_rows([{**row, "codec": "tezip"}])
    # it reads as a failed run, not as a wrong output with the first run's figures
    assert all(row[k] is None for k in ("ratio", "enc_mbs", "dec_mbs", "max_abs_error"))
    md = bench.to_markdown([row])
    assert "NOT EXACT" not in md and "failed" in md


def test_bench_array_warms_up_before_its_first_timed_run(monkeypatch):
    a = smooth_stack((3, 20, 20))
    shapes = []
    real = bench.tezip.compress

    def spy(x, **kw):
        shapes.append(x.shape)
        return real(x, **kw)

    monkeypatch.setattr(bench.tezip, "compress", spy)
    bench.bench_array("w", a, (1e-2,), ("classical",), codecs=())
    assert shapes == [(2, 16, 16), (3, 20, 20)]
    shapes.clear()
    bench.bench_array("w", a, (1e-2,), ("classical",), codecs=(), warm_up=False)
    assert shapes == [(3, 20, 20)]


def test_psnr():
    a = np.array([0.0, 10.0, 5.0, 5.0])
    d = np.array([1.0, 10.0, 5.0, 5.0])
    assert bench.psnr(a, d, 10.0) == pytest.approx(20 - 10 * math.log10(0.25))
    assert bench.psnr(a, a, 10.0) == math.inf
    assert bench.psnr(a, d[:3], 10.0) is None


def test_unknown_codec_is_refused():
    with pytest.raises(ValueError, match="unknown codec"):
        bench.bench_array("x", smooth_stack((2, 8, 8)), (None,), codecs=("nope",))


def test_json_round_trip(u16_rows):
    rows = json.loads(bench.to_json(u16_rows))
    assert len(rows) == len(u16_rows)
    assert all({"codec", "ratio", "ok", "psnr", "note"} <= set(r) for r in rows)


@pytest.mark.skipif(not _has("matplotlib"), reason="matplotlib is not installed")
def test_plot_from_rows_and_from_json(u16_rows, tmp_path):
    from tezip.bench_plot import plot_rd

    rows = u16_rows + bench.bench_array("f32", smooth_stack((4, 16, 16)), (1e-2, 1e-3, None),
                                        ("classical",), codecs=("sz3", "zstd"))
    for src, name in ((rows, "a.png"), (json.loads(bench.to_json(rows)), "b.png")):
        out = plot_rd(src, tmp_path / name)
        data = out.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_cli_bench_writes_md_json_plot(tmp_path):
    a = smooth_stack((4, 16, 16), dtype="float32")
    src = tmp_path / "tiny.npy"
    np.save(src, a)
    out_json, out_md, out_png = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.png"
    args = [sys.executable, "-m", "tezip", "bench", str(src), "--bounds", "1e-2,lossless",
            "--predictors", "classical", "--codecs", "sz3,zstd,jpegls", "--json",
            str(out_json), "--md", str(out_md)]
    plot = _has("matplotlib")
    if plot:
        args += ["--plot", str(out_png)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TEZIP_DEBUG": ""})
    assert p.returncode == 0, p.stderr
    assert "### Bound 0.01" in p.stdout and "tiny: bound 0.01: tezip-classical" in p.stderr
    rows = json.loads(out_json.read_text())
    assert {r["codec"] for r in rows} >= {"tezip-classical", bench.SZ3, bench.ZSTD19,
                                          bench.JPEGLS}
    assert all(r["ok"] for r in rows if r["ratio"] is not None)
    jls = next(r for r in rows if r["codec"] == bench.JPEGLS)
    assert SKIPPED in jls["note"]  # float data
    assert out_md.read_text() == p.stdout.rstrip("\n") + "\n"
    if plot:
        assert out_png.read_bytes()[:8] == PNG_MAGIC


def test_cli_bench_bad_codec(tmp_path):
    src = tmp_path / "tiny.npy"
    np.save(src, smooth_stack((2, 8, 8)))
    p = subprocess.run([sys.executable, "-m", "tezip", "bench", str(src), "--codecs", "zzz"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown codec" in p.stderr
    assert "Traceback" not in p.stderr


def test_rate_distortion_script_defaults():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import rate_distortion
    finally:
        sys.path.pop(0)
    assert bench.parse_bounds(rate_distortion.DEFAULT_BOUNDS) == [
        1e-2, 3e-3, 1e-3, 3e-4, 1e-4, None]


def test_cli_bench_exits_1_when_a_tezip_row_breaks_its_bound(tmp_path, monkeypatch, capsys):
    from tezip import cli

    src = tmp_path / "tiny.npy"
    np.save(src, smooth_stack((3, 8, 8), dtype="float32"))
    real = bench.tezip.decompress
    monkeypatch.setattr(bench.tezip, "decompress",
                        lambda *a, **kw: real(*a, **kw) + np.float32(1.0))
    out_md = tmp_path / "r.md"
    code = cli.main(["bench", str(src), "--bounds", "1e-2", "--predictors", "classical",
                     "--codecs", "zstd", "--md", str(out_md), "-q"])
    err = capsys.readouterr().err
    assert code == 1
    assert "1 tezip row(s) failed" in err and "BOUND VIOLATED" in err
    assert "Traceback" not in err
    assert "BOUND VIOLATED" in out_md.read_text()      # the tables are still written


def test_big_endian_stacks_are_bit_exact_in_the_machines_order():
    a = smooth_stack((2, 6, 5)).astype(">f4")
    assert bench.bit_exact(a, a.astype("<f4"))
    assert not bench.bit_exact(a, a.astype("<f8"))
    rows = bench.bench_array("be", a, (None,), ("classical",), codecs=())
    assert rows[0]["ok"] is True, rows[0]["note"]


def test_the_checked_bound_is_the_one_tezip_promises():
    # (max - min) rounds here, and 1e-4 x the rounded span is one ulp below the exact
    # product: a value decoded exactly at tezip's bound was flagged as a violation
    from tezip.quantize import relative_bound

    lo, hi = -1.0815613532525812e-16, 1.1859062658947177
    eb = relative_bound(1e-4, (lo, hi))
    assert eb > 1e-4 * (hi - lo)
    row = np.array([0.0, eb, hi, lo, 0.5, 0.5 + eb, 1.0, 1.0 - eb])
    a = np.stack([row, row])[:, None, :]
    rows = bench.bench_array("gap", a, (1e-4,), ("classical",), codecs=())
    assert rows[0]["bound_abs"] == eb and rows[0]["ok"] is True, rows[0]["note"]


@pytest.mark.parametrize("a", [np.zeros((3, 4, 5), np.float16), np.zeros((1, 8, 8), "f4")],
                         ids=["float16", "one-frame"])
def test_data_tezip_does_not_code_is_a_skipped_row(a):
    rows = bench.bench_array("x", a, (1e-2,), ("classical",), codecs=())
    assert _skipped(rows[0]) and not bench.failed_tezip_rows(rows)


def test_repeat_below_one_is_refused(tmp_path):
    """``--repeat 0`` timed every row once, as if it were 1; now refused, from the library
    (before any codec runs) and from the command line (usage error, exit 2)."""
    with pytest.raises(OptionError, match="repeat must be at least 1"):
        bench.bench_array("x", smooth_stack((4, 8, 8)), repeat=0)
    np.save(tmp_path / "a.npy", smooth_stack((4, 8, 8)))
    p = subprocess.run([sys.executable, "-m", "tezip", "bench", str(tmp_path / "a.npy"),
                        "--repeat", "0"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "--repeat" in p.stderr and "Traceback" not in p.stderr
