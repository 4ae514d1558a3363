"""The learned predictor: bound, exact round trips, determinism, model identity and
storage, safe loading, thread safety, adaptation and (data-parallel) training."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound

import tezip
from tezip.codec import TezFile
from tezip.learned import model as M


def _model(path: Path, cfg: M.ModelConfig, seed: int) -> Path:
    """A model with random weights (every unit active): enough to exercise the codec."""
    rng = np.random.default_rng(seed)
    params = M.init_params(cfg, seed)
    for k in params:
        params[k] = params[k] + rng.normal(0, 0.1, params[k].shape).astype(np.float32)
    path.write_bytes(M.to_bytes(cfg, params))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return (_model(d / "a.safetensors", M.ModelConfig(1, (4,)), 0),
            _model(d / "b.safetensors", M.ModelConfig(1, (4,)), 1),
            _model(d / "rgb.safetensors", M.ModelConfig(3, (4, 4)), 2))


def _compress(a, model, predictor="learned", mode="rel", bound=1e-3, **kw):
    return tezip.compress(a, mode=mode, bound=bound, predictor=predictor, model=model, **kw)


def _predictors(blob) -> set[str]:
    with TezFile(blob) as f:
        return {f.window_meta(i)["p"] for i in range(f.n_windows)}


@pytest.mark.parametrize("dtype", ["float32", "uint16", "float64", "int16"])
@pytest.mark.parametrize("mode,bound", [("abs", 0.5), ("rel", 1e-3), ("lossless", None)])
def test_learned_keeps_the_bound(models, dtype, mode, bound):
    a = smooth_stack((10, 20, 24), dtype, scale=3000, offset=10)
    if mode == "lossless" and a.dtype.kind == "f":
        pytest.skip("bit-exact floats are coded by the integer predictors")
    blob = _compress(a, models[0], mode=mode, bound=bound)
    assert _predictors(blob) == {"learned"}
    check_bound(a, tezip.decompress(blob), mode, bound)


@pytest.mark.parametrize("shape", [(9, 33, 17), (5, 1, 9), (2, 3, 3), (6, 40, 2)])
def test_exact_round_trip_with_special_values(models, shape):
    rng = np.random.default_rng(1)
    a = (np.cumsum(rng.normal(size=shape), axis=0) * 1e3).astype(np.float32)
    a.reshape(-1)[::37] = np.nan
    a.reshape(-1)[5::41] = -np.inf
    a.reshape(-1)[3::29] = -0.0
    blob = _compress(a, models[0], mode="abs", bound=0.1)
    check_bound(a, tezip.decompress(blob), "abs", 0.1)


def test_multichannel_two_layer_model_and_odd_sizes(models):
    a = smooth_stack((6, 13, 11, 3), "float32")
    blob = _compress(a, models[2], mode="abs", bound=0.01)
    assert _predictors(blob) == {"learned"}
    check_bound(a, tezip.decompress(blob), "abs", 0.01)


def test_one_channel_stack_with_a_channel_axis(models):
    """(T, H, W, 1): frames with a channel axis of one (hypothesis found the learned
    predictor writing (H, W) frames into (H, W, 1) once a shipped model existed)."""
    a = smooth_stack((7, 12, 10), "float32")[..., None]
    blob = _compress(a, models[0], mode="abs", bound=0.01)
    assert _predictors(blob) == {"learned"}
    back = tezip.decompress(blob)
    assert back.shape == a.shape
    check_bound(a, back, "abs", 0.01)


def test_refusals_name_the_reason(models):
    gray = smooth_stack((6, 16, 16), "float32")
    with pytest.raises(tezip.OptionError, match="3-channel"):
        _compress(gray, models[2])
    with pytest.raises(tezip.OptionError, match="learned predictor codes"):
        _compress(gray, models[0], mode="pwrel", bound=1e-2)
    # auto quietly keeps the classical predictors where the model cannot run
    blob = _compress(gray, models[2], predictor="auto")
    assert "learned" not in _predictors(blob)


def test_the_model_travels_in_the_file_only_if_a_window_uses_it(models):
    a = smooth_stack((8, 24, 24), "float32")
    forced = _compress(a, models[0])
    with TezFile(forced) as f:
        assert f.model_stored and f.header["model"]["hash"] == M.load(models[0]).hash
    assert tezip.decompress(forced).shape == a.shape      # no --model needed
    auto = _compress(a, models[0], predictor="auto")
    classical = _compress(a, models[0], predictor="classical")
    if "learned" not in _predictors(auto):
        with TezFile(auto) as f:
            assert not f.model_stored
    # a stored model must pay for itself: auto is never larger than classical, up to the
    # header's model record
    assert len(auto) <= len(classical) + 300


def test_a_file_naming_an_unknown_model_asks_for_it(models, monkeypatch):
    """A model that is neither stored nor shipped: the file says which one to pass."""
    import io

    from tezip.container import ContainerReader, ContainerWriter
    from tezip.learned import registry

    a = smooth_stack((8, 16, 16), "float32")
    blob = _compress(a, models[0])
    r = ContainerReader(blob)
    h = r.header["model"]["hash"]
    buf = io.BytesIO()
    w = ContainerWriter(None, r.header, fileobj=buf)
    for i, e in enumerate(r.entries):
        w.add_window(e.t0, e.frames, r.payload(i))
    w.close(None)                                      # the model left out
    bare = buf.getvalue()
    monkeypatch.setattr(registry, "_BY_HASH", {})     # as in a fresh process
    with pytest.raises(tezip.OptionError, match=h[:16]):
        tezip.decompress(bare)
    with pytest.raises(tezip.DecodeMismatchError) as e:
        tezip.decompress(bare, model=models[1])
    assert h[:16] in str(e.value) and M.load(models[1]).hash[:16] in str(e.value)
    check_bound(a, tezip.decompress(bare, model=models[0]), "rel", 1e-3)


def test_same_bytes_whatever_the_thread_count(models):
    a = smooth_stack((40, 24, 24), "float32")
    one = _compress(a, models[0], window=8, threads=1)
    two = _compress(a, models[0], window=8, threads=2)
    assert one == two
    assert tezip.decompress(one, threads=1).tobytes() == tezip.decompress(one, threads=2).tobytes()


def test_decode_compiled_for_another_cpu_reproduces_the_bytes(models, tmp_path):
    """NUMBA_CPU_NAME=generic compiles the kernels without AVX: other vector widths,
    the same arithmetic per value, so the same forecasts and the same bytes."""
    a = smooth_stack((10, 48, 40), "float32")
    (tmp_path / "a.tez").write_bytes(_compress(a, models[0]))
    here = tezip.decompress(tmp_path / "a.tez")
    code = ("import sys, numpy as np, tezip; "
            "np.save(sys.argv[2], tezip.decompress(sys.argv[1]))")
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path / "nc")}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.tez"),
                    str(tmp_path / "there.npy")], check=True, env=env, timeout=900)
    assert np.load(tmp_path / "there.npy").tobytes() == here.tobytes()


def test_concurrent_compress_and_decompress_from_eight_threads(models):
    """Issue 12: shared predictors hold no per-call state."""
    stacks = [smooth_stack((6, 20, 20), "float32", seed=s) for s in range(8)]
    want = [_compress(a, models[0]) for a in stacks]
    with cf.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda a: _compress(a, models[0], threads=1), stacks))
        back = list(pool.map(lambda b: tezip.decompress(b, threads=1), got * 2))
    assert got == want
    for a, b in zip(stacks * 2, back, strict=True):
        check_bound(a, b, "rel", 1e-3)


def test_forecast_crc_mismatch_raises_decode_mismatch(models, monkeypatch):
    """Issue 14 item 16: a decoder whose forecasts differ from the encoder's refuses."""
    from tezip.learned.runtime import Forecaster

    a = smooth_stack((8, 20, 24), "float32", scale=3000, offset=10)
    blob = _compress(a, models[0], mode="abs", bound=0.5)
    original = Forecaster.forecast
    monkeypatch.setattr(Forecaster, "forecast", lambda self: original(self) + 0.3)
    with pytest.raises(tezip.DecodeMismatchError, match="forecast"):
        tezip.decompress(blob)


def test_forecast_snapping_absorbs_last_bit_differences(models, monkeypatch):
    """A forecast off in the last bits (another machine) snaps to the same grid point and
    decodes to the same values. float64 data: a float32 output would round it away."""
    from tezip.learned.runtime import Forecaster

    a = smooth_stack((8, 20, 24), "float64", scale=3000, offset=10)
    blob = _compress(a, models[0], mode="abs", bound=0.5)
    want = tezip.decompress(blob)
    original = Forecaster.forecast
    monkeypatch.setattr(Forecaster, "forecast",
                        lambda self: (lambda f: f + np.abs(f) * 1e-13)(original(self)))
    got = tezip.decompress(blob)
    assert got.tobytes() == want.tobytes()


def test_loading_a_pickle_disguised_as_a_model_is_refused(tmp_path):
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    (tmp_path / "evil.safetensors").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(tezip.InputError):
        M.load(tmp_path / "evil.safetensors")
    assert not (tmp_path / "pwned").exists()


def test_model_files_round_trip_and_damage_is_refused(models):
    m = M.load(models[2])
    again = M.from_bytes(M.to_bytes(m.config, m.params, m.meta))
    assert again.hash == m.hash
    for i in range(0, len(m.data), 97):
        bad = bytearray(m.data)
        bad[i] ^= 0x55
        try:
            other = M.from_bytes(bytes(bad))
        except tezip.CorruptFileError:
            continue
        assert other.hash != m.hash          # a change of weights is a different model


def test_the_trial_runs_the_network_once_for_every_configuration(monkeypatch):
    """``Learned.trial``: the first coding is ``encode``'s; the others replay its
    forecasts (a configuration replayed against its own forecasts codes what it coded),
    and the network runs once, however many configurations are estimated."""
    from tezip import quantize
    from tezip.learned import registry
    from tezip.predictors import learned as L

    pred = L.for_model(registry.default())
    x = smooth_stack((6, 24, 20))
    quant = quantize.quantizer(quantize.resolve(quantize.ErrorBound("rel", rel=1e-3),
                                                x.dtype, (float(x.min()), float(x.max()))))
    c0, c1 = pred.configs(x, quant)
    runs = []
    real = L.Forecaster

    class Counted(real):
        def __init__(self, *a, **k):
            runs.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(L, "Forecaster", Counted)
    first, again, other = list(pred.trial(x, quant, [c0, c0, c1]))
    assert len(runs) == 1
    enc = pred.encode(x, quant, c0, np.zeros(0, np.int8))
    for got in (first, again):
        assert np.array_equal(got.codes, enc.codes) and np.array_equal(got.ctx, enc.ctx)
        assert np.array_equal(got.outliers, enc.outliers)
    assert other.config == c1 and not np.array_equal(other.codes, enc.codes)
    assert len(runs) == 2
    trial = pred.trial(x, quant, [c0, c1])
    next(trial)                 # a caller that stops after the first pays no replay
    assert len(runs) == 3


def test_the_forecasters_frame_steps_keep_numpys_bits():
    """``kernels.nn.normalize`` and ``snap`` (one pass each, 0.8.2) against the numpy
    steps they replace, bit for bit: a forecast's grid indices make its CRC, and a
    learned window's reconstruction depends on both."""
    from tezip.kernels import nn

    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        for scale in (1e-30, 1e-3, 1.0, 7.5, 1e30):
            x = (rng.standard_normal((2, 13, 17)) * scale * 10).astype(dtype)
            x[0, 1, :4] = [np.nan, np.inf, -np.inf, 0.0]
            x[1, 2, :2] = [np.finfo(dtype).max, -np.finfo(dtype).tiny / 3]
            prev = rng.standard_normal(x.shape).astype(np.float32)
            lo = float(rng.standard_normal() * scale)
            for xv in (x, x.transpose(0, 2, 1).copy().transpose(0, 2, 1)):  # any layout
                with np.errstate(all="ignore"):
                    v = (np.asarray(xv, np.float64) - lo) / scale
                    want = np.where(np.isfinite(v), np.clip(v, -8.0, 9.0), prev)
                got = np.empty(x.shape, np.float32)
                nn.normalize(xv, lo, scale, -8.0, 9.0, prev, got)
                assert got.tobytes() == want.astype(np.float32).tobytes()
            f = (rng.standard_normal(500) * scale * 1e3).astype(np.float64)
            f[:5] = [np.nan, np.inf, -np.inf, 2.0**60 * scale, 0.5 * scale]
            unit = scale / 4096
            with np.errstate(all="ignore"):
                k = np.rint(f / unit)
            k = np.where(np.abs(k) <= 2.0**52, k, 0.0)
            got_k, got = np.empty(f.size, np.int64), np.empty(f.size)
            nn.snap(f, unit, got_k, got)
            assert got_k.tobytes() == k.astype("<i8").tobytes()
            assert got.tobytes() == (k * unit).tobytes()


def test_the_trial_ends_after_its_first_frames_where_the_forecaster_is_hopeless(monkeypatch):
    """``auto`` stops the network after ``_TRIAL_PREFIX`` frames of the crop where they
    code ``_PREFIX_HOPELESS`` times the classical choice's size (here: noiseless waves,
    which the interpolation codes almost for free while the forecaster warms up),
    and runs it over the whole crop where they do not; the file is the same."""
    from tezip import codec
    from tezip.predictors import learned as L

    calls = []
    real = L.Forecaster.forecast

    def counted(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(L.Forecaster, "forecast", counted)
    yy, xx = np.mgrid[0:64, 0:64]
    x = np.stack([1000 * np.sin(xx / 7 + i / 5) * np.cos(yy / 9 - i / 7)
                  for i in range(20)]).astype(np.float32)
    short = tezip.compress(x, mode="rel", bound=1e-3, threads=1)
    assert len(calls) == codec._TRIAL_PREFIX - 1            # one window: frames 1..8
    calls.clear()
    monkeypatch.setattr(codec, "_PREFIX_HOPELESS", float("inf"))
    assert tezip.compress(x, mode="rel", bound=1e-3, threads=1) == short
    assert len(calls) == x.shape[0] - 1


def test_later_windows_like_a_hopeless_first_skip_the_trial(monkeypatch):
    """Where the trial on the stack's first window and on its last finds the forecaster
    hopeless, a window between them skips its own if the classical choice codes its crop
    in about the first one's bits per value (``Tuning.hopeless``, ``_LATER_RETRY``); a
    window unlike the first runs its trial; a stack of two windows tries both. The file
    is the one a trial in every window gives, at any thread count."""
    from tezip import codec

    shapes = []
    real = codec._learned_trial

    def counted(x, *a, **k):
        shapes.append(x.shape[0])
        return real(x, *a, **k)

    monkeypatch.setattr(codec, "_learned_trial", counted)
    monkeypatch.setattr(codec, "TRANSFORM_SCREEN", 0.0)     # (no wavelet: windows of 33)
    yy, xx = np.mgrid[0:128, 0:128]
    x = np.stack([1000 * np.sin(xx / 7 + i / 5) * np.cos(yy / 9 - i / 7)
                  for i in range(132)]).astype(np.float32)     # 4 windows of 33
    assert codec.coded_windows(132, codec.window_length(None, 128 * 128), 128 * 128) == [
        (0, 33), (33, 66), (66, 99), (99, 132)]
    alike = tezip.compress(x, mode="rel", bound=1e-3, threads=1)
    assert shapes == [33, 33]               # the first and the last, in the tuning: no other
    rough = x.copy()
    rough[66:99] += np.random.default_rng(0).normal(0, 30, (33, 128, 128)).astype(np.float32)
    shapes.clear()
    unlike = tezip.compress(rough, mode="rel", bound=1e-3, threads=1)
    assert shapes == [33, 33, 33]           # ... and the third window's
    shapes.clear()
    tezip.compress(x[:66], mode="rel", bound=1e-3, threads=1)
    assert shapes == [33, 33]               # two windows: each its own trial
    monkeypatch.setattr(codec, "_LATER_RETRY", 1.0)         # every window tries
    for a, blob in ((x, alike), (rough, unlike)):
        shapes.clear()
        assert tezip.compress(a, mode="rel", bound=1e-3, threads=1) == blob
        assert len(shapes) == 5             # (the first's made once, the last's twice)
        assert tezip.compress(a, mode="rel", bound=1e-3, threads=2) == blob


def test_a_small_auto_file_names_the_model_only_where_a_window_uses_it(tmp_path):
    """``auto`` writes the shipped model's record into the header before coding; a small
    file none of whose windows use it is written again without it (``lean``: 118 bytes,
    4.8% of a 2.5 KB file; ``auto`` read 0.95x ``classical`` there), whether it goes to
    memory, into a stream after other bytes, or to a file through the CLI; a file that
    uses the model, or a large one, keeps the record."""
    import io

    from tezip import container
    from tezip.codec import ArrayStack, Options, compress_stack

    yy, xx = np.mgrid[0:64, 0:64]
    x = np.stack([np.exp(-((yy - 30 - i / 4) ** 2 + (xx - 20 - i / 3) ** 2) / 150.0)
                  for i in range(40)]).astype(np.float32)
    blob = tezip.compress(x, mode="rel", bound=1e-2)
    classical = tezip.compress(x, mode="rel", bound=1e-2, predictor="classical")
    with TezFile(blob) as f:
        assert f.header["model"] is None and f.header["predictor"] == "auto"
        assert "learned" not in {f.window_meta(i)["p"] for i in range(f.n_windows)}
    check_bound(x, tezip.decompress(blob), "rel", 1e-2)
    assert len(blob) <= len(classical)
    opts = Options(tezip.make_bound("rel", 1e-2))
    full = io.BytesIO()
    compress_stack(ArrayStack(x), None, opts, fileobj=full)          # (lean off: the record)
    with TezFile(full.getvalue()) as f:
        assert f.header["model"] is not None
    assert len(full.getvalue()) - len(blob) > 100
    into = io.BytesIO()
    into.write(b"prefix")
    compress_stack(ArrayStack(x), None, opts, fileobj=into, lean=True)
    assert into.getvalue()[:6] == b"prefix" and into.getvalue()[6:] == blob
    np.save(tmp_path / "x.npy", x)
    subprocess.run([sys.executable, "-m", "tezip", "compress", str(tmp_path / "x.npy"),
                    str(tmp_path / "x.tez"), "--bound", "1e-2"], check=True,
                   capture_output=True)
    with TezFile(tmp_path / "x.tez") as f:
        assert f.header["model"] is None
    np.testing.assert_array_equal(tezip.decompress(str(tmp_path / "x.tez")),
                                  tezip.decompress(blob))
    big = np.concatenate([x + np.float32(i) for i in range(4)] * 8)     # windows > LEAN_MAX
    big += np.random.default_rng(0).normal(0, 1e-3, big.shape).astype(np.float32)
    blob = tezip.compress(big, mode="rel", bound=1e-5)
    assert len(blob) > container.LEAN_MAX
    with TezFile(blob) as f:
        assert f.header["model"] is not None
    check_bound(big, tezip.decompress(blob), "rel", 1e-5)


torch = pytest.importorskip("torch")


def test_adapt_fits_a_model_stored_in_the_file(tmp_path):
    a = smooth_stack((16, 24, 24), "float32")
    np.save(tmp_path / "a.npy", a)
    p = subprocess.run([sys.executable, "-m", "tezip", "compress", str(tmp_path / "a.npy"),
                        str(tmp_path / "a.tez"), "--bound", "1e-3", "--adapt",
                        "--adapt-seconds", "2", "--predictor", "learned", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    with TezFile(tmp_path / "a.tez") as f:
        assert f.model_stored
        rec = f.header["model"]
    info = json.loads(subprocess.run([sys.executable, "-m", "tezip", "info",
                                      str(tmp_path / "a.tez"), "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    assert info["model"]["hash"] == rec["hash"] and info["model"]["stored_in_file"]
    assert info["window_predictors"] == {"learned": 1}
    assert info["expected_decode_mb_per_s"] > 0
    check_bound(a, tezip.decompress(tmp_path / "a.tez"), "rel", 1e-3)


def test_two_process_ddp_training_agrees_on_weights(tmp_path):
    np.save(tmp_path / "d.npy", smooth_stack((24, 32, 32), "float32"))
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:       # a free port: a fixed one can still be held
        sock.bind(("127.0.0.1", 0))     # (TIME_WAIT) by a run a minute before
        port = str(sock.getsockname()[1])
    p = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-port", port, "-m", "tezip", "train",
         str(tmp_path / "d.npy"), "--out", str(tmp_path / "m"), "--hidden", "4", "--steps", "6",
         "--batch", "2", "--clip", "4", "--crop", "16"],
        capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    log = json.loads((tmp_path / "m" / "train_log.json").read_text())
    assert log["world_size"] == 2 and log["steps"] == 6
    assert log["ranks_agree"] is True
    M.load(tmp_path / "m" / "model.safetensors")


def test_fine_tuning_starts_from_the_given_model(models, tmp_path):
    from tezip.train import TrainConfig, train

    np.save(tmp_path / "mine.npy", smooth_stack((24, 32, 32), "float32", seed=3))
    base = M.load(models[0])
    cfg = TrainConfig(hidden=(9,), steps=4, batch=2, clip=4, crop=16, init=str(models[0]))
    log = train([str(tmp_path / "mine.npy")], tmp_path / "ft", cfg, progress=False)
    tuned = M.load(tmp_path / "ft" / "model.safetensors")
    assert tuned.config == base.config            # the architecture comes from --init
    assert tuned.hash != base.hash and log["model_hash"] == tuned.hash


def test_train_command_reports_bad_options_in_one_line(tmp_path):
    np.save(tmp_path / "d.npy", smooth_stack((12, 16, 16), "float32"))
    p = subprocess.run([sys.executable, "-m", "tezip", "train", str(tmp_path / "d.npy"),
                        "--out", str(tmp_path / "m"), "--clip", "2"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "--clip >= 3" in p.stderr


@pytest.mark.parametrize("frames,window", [(13, 2), (9, 2)])  # (shorter tails join)
def test_forced_learned_codes_a_last_window_of_one_frame_classically(models, frames, window):
    """A stack whose length leaves one frame over: that window has no past to forecast
    from, so it is coded classically (it was refused, blaming the channel count)."""
    a = smooth_stack((frames, 16, 16), "float32")
    blob = _compress(a, models[0], window=window)
    check_bound(a, tezip.decompress(blob), "rel", 1e-3)
    with TezFile(blob) as f:
        names = [f.window_meta(i)["p"] for i in range(f.n_windows)]
    assert names[-1] != "learned" and "learned" in names[:-1]


def test_tiny_frames_do_not_try_the_forecaster(monkeypatch):
    """The decode floor counts the forecaster's cost per frame (``LEARNED_FRAME_S``):
    frames of a few values, which it would decode at under 1 MB/s, are not tried (a
    series of 1 x 1 frames spent 15 s a window in the learned trial)."""
    from tezip import codec
    from tezip.learned import registry

    cfg = registry.default().config
    speeds = [codec.learned_decode_mbps(cfg.macs_per_pixel(), 1, 4, fv)
              for fv in (1, 64, 1024, 1 << 14)]
    assert speeds == sorted(speeds) and speeds[0] < 1.0 < codec.DEFAULT_MIN_DECODE_MBPS
    assert speeds[-1] < codec.learned_decode_mbps(cfg.macs_per_pixel(), 1, 4)

    def no_trial(*a, **k):
        raise AssertionError("the learned trial ran")

    monkeypatch.setattr(codec, "_learned_trial", no_trial)
    x = np.cumsum(np.random.default_rng(0).normal(size=4000)).astype(np.float32)
    blob = tezip.compress(x.reshape(-1, 1, 1), mode="abs", bound=0.01)   # auto
    check_bound(x.reshape(-1, 1, 1), tezip.decompress(blob), "abs", 0.01)
    with pytest.raises(AssertionError, match="learned trial"):        # (large enough ones)
        tezip.compress(smooth_stack((8, 48, 48)), mode="rel", bound=1e-3)


def test_the_learned_trial_runs_on_the_first_frames_of_a_long_window():
    """The trial's crop holds at most ``_TRIAL_FRAMES`` frames: a window lengthened for
    small frames (4,097 of 8 x 8) ran the network over every frame."""
    from tezip import codec, quantize
    from tezip.learned import registry
    from tezip.predictors.learned import for_model

    learned = for_model(registry.default())
    seen = []
    real = learned.configs

    class Spy:
        def __getattr__(self, name):
            return getattr(learned, name)

        def configs(self, crop, quant):
            seen.append(crop.shape)
            return real(crop, quant)

    x = smooth_stack((300, 16, 16))
    quant = quantize.quantizer(quantize.resolve(quantize.ErrorBound("rel", rel=1e-3),
                                                x.dtype, (float(x.min()), float(x.max()))))
    codec._learned_trial(x, quant, Spy(), None, None)
    assert seen == [(codec._TRIAL_FRAMES, 16, 16)] and codec._TRIAL_FRAMES == 65
    codec._learned_trial(x[:40], quant, Spy(), None, None)
    assert seen[-1] == (40, 16, 16)

