"""The learned predictor: bound, determinism, model identity, safe loading, DDP training."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import smooth_stack
from exact import check_bound

torch = pytest.importorskip("torch")

import tezip  # noqa: E402
from tezip.codec import ArrayStack, Options, TezFile, compress_stack  # noqa: E402
from tezip.models import load_model  # noqa: E402
from tezip.train import TrainConfig, train  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    data = smooth_stack((24, 32, 32), "float32")
    np.save(d / "train.npy", data)
    cfg = TrainConfig(hidden=(4,), steps=12, batch=2, clip=4, crop=16, val_every=6)
    train([str(d / "train.npy")], d / "a", cfg, progress=False)
    train([str(d / "train.npy")], d / "b", TrainConfig(**{**cfg.__dict__, "seed": 1}),
          progress=False)
    return d / "a" / "model.safetensors", d / "b" / "model.safetensors"


def _compress(a, model, predictor="prednet", mode="rel", bound=1e-3):
    import io

    buf = io.BytesIO()
    compress_stack(ArrayStack(a), None,
                   Options(tezip.make_bound(mode, bound), predictor=predictor, model=str(model)),
                   fileobj=buf)
    return buf.getvalue()


@pytest.mark.parametrize("dtype", ["float32", "uint16", "float64"])
@pytest.mark.parametrize("mode,bound", [("abs", 0.5), ("rel", 1e-3), ("pwrel", 1e-2)])
def test_prednet_keeps_the_bound(models, dtype, mode, bound):
    a = smooth_stack((10, 20, 24), dtype, scale=3000, offset=10)
    blob = _compress(a, models[0], mode=mode, bound=bound)
    b = TezFile(blob, model=str(models[0])).read_all()
    check_bound(a, b, mode, bound)


@pytest.mark.parametrize("name", ["prednet", "prednet+interp"])
@pytest.mark.parametrize("shape", [(9, 33, 17), (5, 1, 9), (1, 3, 3)])   # gray models
@pytest.mark.parametrize("kind", ["float", "int", "bits", "log"])
def test_learned_predictors_decode_exactly_what_they_encode(models, name, shape, kind):
    from test_codec import _round_trip

    from tezip import quantize

    rng = np.random.default_rng(1)
    if kind == "int":
        x = rng.integers(0, 60000, size=shape).astype(np.uint16)
        qp = quantize.QuantParams("int", "uint16", step=7.0, eb=3.0)
    else:
        x = (np.cumsum(rng.normal(size=shape), axis=0) * 1e3).astype(np.float32)
        qp = {"float": quantize.QuantParams("float", "float32", step=0.2, eb=0.1),
              "bits": quantize.QuantParams("bits", "float32"),
              "log": quantize.QuantParams("log", "float32", step=0.02, eb=0.007)}[kind]
    out, back = _round_trip(name, x, qp, model=str(models[0]))
    assert np.array_equal(out, back, equal_nan=True)


def test_prednet_multichannel_and_odd_sizes(models, tmp_path):
    from tezip.models import ModelConfig, PredNet, save_model

    net = PredNet(ModelConfig(channels=3, hidden=(4, 6)))
    save_model(net, tmp_path / "rgb.safetensors")
    a = smooth_stack((6, 13, 11, 3), "float32")
    blob = _compress(a, tmp_path / "rgb.safetensors", mode="abs", bound=0.01)
    b = TezFile(blob, model=str(tmp_path / "rgb.safetensors")).read_all()
    check_bound(a, b, "abs", 0.01)


def test_same_bytes_whatever_the_thread_count(models):
    a = smooth_stack((12, 40, 40), "float32")
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = _compress(a, models[0])
        torch.set_num_threads(1)
        one = _compress(a, models[0])
        assert one == two
        torch.set_num_threads(2)
        b2 = TezFile(one, model=str(models[0])).read_all()
        torch.set_num_threads(1)
        b1 = TezFile(one, model=str(models[0])).read_all()
        assert np.array_equal(b1, b2)
    finally:
        torch.set_num_threads(n)


def test_decode_on_other_cpu_kernels_reproduces_the_bytes(models, tmp_path):
    """ATEN_CPU_CAPABILITY=default runs torch's generic (non-SIMD) kernels: the snapped
    forecasts must still match, so the decoded bytes are identical."""
    a = smooth_stack((10, 48, 40), "float32")
    (tmp_path / "a.tez").write_bytes(_compress(a, models[0]))
    here = TezFile(tmp_path / "a.tez", model=str(models[0])).read_all()
    np.save(tmp_path / "here.npy", here)
    code = ("import sys, numpy as np; from tezip.codec import TezFile; "
            "np.save(sys.argv[3], TezFile(sys.argv[1], model=sys.argv[2]).read_all())")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.tez"), str(models[0]),
                    str(tmp_path / "there.npy")], check=True, env=env, timeout=300)
    assert np.load(tmp_path / "there.npy").tobytes() == here.tobytes()


def test_decoding_with_another_model_names_both_hashes(models):
    a = smooth_stack((8, 16, 16), "float32")
    blob = _compress(a, models[0])
    ha, hb = load_model(models[0]).hash, load_model(models[1]).hash
    assert ha != hb
    with pytest.raises(tezip.DecodeMismatchError) as e:
        TezFile(blob, model=str(models[1])).read_all()
    assert ha[:16] in str(e.value) and hb[:16] in str(e.value)


def test_auto_uses_the_learned_predictor_only_when_it_wins(models):
    a = smooth_stack((16, 32, 32), "float32")
    auto = _compress(a, models[0], predictor="auto")
    classical = _compress(a, models[0], predictor="classical")
    assert len(auto) <= len(classical) * 1.02
    header = TezFile(auto, model=str(models[0])).header
    assert header["model"]["hash"] == load_model(models[0]).hash


def test_loading_a_pickle_disguised_as_a_model_is_refused(tmp_path):
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    (tmp_path / "evil.safetensors").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(tezip.InputError):
        load_model(tmp_path / "evil.safetensors")
    assert not (tmp_path / "pwned").exists()


def test_two_process_ddp_training_agrees_on_weights(tmp_path):
    data = smooth_stack((24, 32, 32), "float32")
    np.save(tmp_path / "d.npy", data)
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-port", "29533", "-m", "tezip", "train",
         str(tmp_path / "d.npy"), "--out", str(tmp_path / "m"), "--hidden", "4", "--steps", "6",
         "--batch", "2", "--clip", "4", "--crop", "16"],
        capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    log = json.loads((tmp_path / "m" / "train_log.json").read_text())
    assert log["world_size"] == 2
    assert log["ranks_agree"] is True and len(log["rank_weight_crcs"]) == 2
    load_model(tmp_path / "m" / "model.safetensors")


def test_fine_tuning_starts_from_the_given_model(models, tmp_path):
    data = smooth_stack((24, 32, 32), "float32", seed=3)
    np.save(tmp_path / "mine.npy", data)
    base = load_model(models[0])
    cfg = TrainConfig(hidden=(9,), steps=4, batch=2, clip=4, crop=16, val_every=2,
                      init=str(models[0]))
    log = train([str(tmp_path / "mine.npy")], tmp_path / "ft", cfg, progress=False)
    tuned = load_model(tmp_path / "ft" / "model.safetensors")
    assert tuned.net.cfg == base.net.cfg          # the architecture comes from --init
    assert tuned.hash != base.hash and log["model_hash"] == tuned.hash


def test_train_command_reports_bad_options_in_one_line(tmp_path):
    np.save(tmp_path / "d.npy", smooth_stack((12, 16, 16), "float32"))
    p = subprocess.run([sys.executable, "-m", "tezip", "train", str(tmp_path / "d.npy"),
                        "--out", str(tmp_path / "m"), "--kernel", "4"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "--kernel odd" in p.stderr


# issue 14, item 16: a decoder whose forecast differs from the encoder's. These perturb the
# learned forecast in the decoder only (the encoder ran before the patch).


def _decode_with_forecast_shift(monkeypatch, blob, model, shift):
    """Decode ``blob`` with every learned forecast moved by ``shift(forecast)``."""
    from tezip.predictors import prednet

    original = prednet._Runner.forecast
    monkeypatch.setattr(prednet._Runner, "forecast", lambda self: (lambda f: f + shift(f))(
        original(self)))
    return TezFile(blob, model=str(model)).read_all()


def test_forecast_crc_mismatch_raises_decode_mismatch(models, monkeypatch):
    a = smooth_stack((8, 20, 24), "float32", scale=3000, offset=10)
    blob = _compress(a, models[0], mode="abs", bound=0.5)
    with TezFile(blob, model=str(models[0])) as f:
        assert {f.window_meta(i)["p"] for i in range(f.n_windows)} == {"prednet"}
    with pytest.raises(tezip.DecodeMismatchError, match="forecast"):
        _decode_with_forecast_shift(monkeypatch, blob, models[0], lambda f: 0.3 * 1.0)


def test_forecast_snapping_absorbs_last_bit_differences(models, monkeypatch):
    """Another machine's float64 forecast differs in the last bits; snapping to 1/64 of
    the quantization step makes it decode to the same values (no mismatch at all).
    float64 data: a float32 output would round such a difference away by itself."""
    a = smooth_stack((8, 20, 24), "float64", scale=3000, offset=10)
    blob = _compress(a, models[0], mode="abs", bound=0.5)
    want = TezFile(blob, model=str(models[0])).read_all()
    got = _decode_with_forecast_shift(monkeypatch, blob, models[0], lambda f: np.abs(f) * 1e-13)
    assert got.tobytes() == want.tobytes()
    check_bound(a, got, "abs", 0.5)
