"""Training the learned forecaster on a set of stacks: single process or data-parallel
(torch.distributed, gloo on CPU, NCCL on GPU; launched by torchrun or mpirun: ranks from
the launcher's environment), gradients averaged over the ranks after every step.

    tezip train DATA... --out MODEL_DIR [--seconds S | --steps N] [--hidden 8] [--init default]
    torchrun --nproc-per-node 2 -m tezip train DATA... --out MODEL_DIR

The recipe is the one ``--adapt`` uses on the data being compressed (``learned.adapt``):
inputs are reconstructions (noise of the target bound, ``--bound``, a fraction of each
stack's value range, varied log-uniformly over a decade each way so one model serves a
range of bounds), the target the clean next frame, the loss L1 in units of the bound.
The last ``val_fraction`` of each stack's frames is held out for validation.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .atomic import atomic_output
from .errors import InputError, OptionError


@dataclass
class TrainConfig:
    hidden: tuple[int, ...] = (4,)
    clip: int = 8
    crop: int = 32
    batch: int = 16
    steps: int = 100_000
    seconds: float = 120.0
    lr: float = 2e-2
    bound: float = 1e-3
    val_fraction: float = 0.2
    seed: int = 0
    init: str | None = None
    extra: dict = field(default_factory=dict)


def _load_stacks(paths: list[str], dataset: str | None) -> list[np.ndarray]:
    from . import io

    stacks = []
    for p in paths:
        with io.open_input(p, dataset=dataset) as s:
            stacks.append(s.read(0, s.shape[0]))
    if not stacks:
        raise InputError("no training data given")
    chans = {a.shape[3] if a.ndim == 4 else 1 for a in stacks}
    if len(chans) != 1:
        raise InputError(f"training stacks differ in channel count: {sorted(chans)}")
    return stacks


def _split(stacks: list[np.ndarray], cfg: TrainConfig) -> tuple[list, list]:
    """The last ``val_fraction`` of each stack's frames (at least one clip) for validation."""
    train, val = [], []
    for a in stacks:
        n_val = max(cfg.clip, int(round(a.shape[0] * cfg.val_fraction)))
        if a.shape[0] - n_val < cfg.clip:
            raise InputError(f"a stack of {a.shape[0]} frames is too short to train on with "
                             f"clips of {cfg.clip} frames and a validation split")
        train.append(a[:-n_val])
        val.append(a[-n_val:])
    return train, val


def dist_env() -> tuple[int, int, int]:
    """(rank, world, local rank) from torchrun or an MPI launcher; (0, 1, 0) otherwise."""
    env = os.environ
    for r, w, lr in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                     ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                     ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")):
        if r in env and w in env:
            return int(env[r]), int(env[w]), int(env.get(lr, env[r]))
    return 0, 1, 0


def _range(a: np.ndarray) -> float:
    fin = a[np.isfinite(a)] if a.dtype.kind == "f" else a
    return float(fin.max()) - float(fin.min()) if fin.size else 1.0


def train(paths: list[str], out: str | os.PathLike, cfg: TrainConfig, *,
          dataset: str | None = None, progress: bool = True) -> dict:
    """Train (or fine-tune) a model; returns the metrics written to ``out/train_log.json``."""
    import torch
    import torch.distributed as dist

    from .learned import adapt, registry
    from .learned.model import ModelConfig, load, to_bytes
    from .learned.runtime import Forecaster

    rank, world, _ = dist_env()
    if world > 1 and not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=rank,
                                world_size=world)
    stacks = _load_stacks(paths, dataset)
    train_set, val_set = _split(stacks, cfg)
    channels = stacks[0].shape[3] if stacks[0].ndim == 4 else 1
    init = None
    if cfg.init:
        init = registry.default() if cfg.init == "default" else load(cfg.init)
        if init is None:
            raise OptionError("--init default: this installation has no shipped model")
        if init.config.channels != channels:
            raise OptionError(f"--init model forecasts {init.config.channels} channels, the "
                              f"data have {channels}")
        mcfg = init.config
    else:
        mcfg = ModelConfig(channels=channels, hidden=cfg.hidden)

    def allreduce(grads: list) -> None:
        for g in grads:
            dist.all_reduce(g)
            g /= world

    def agree(elapsed: float) -> float:
        t = torch.tensor([elapsed], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    acfg = adapt.AdaptConfig(seconds=cfg.seconds, crop=cfg.crop, clip=cfg.clip,
                             batch=cfg.batch, lr=cfg.lr, seed=cfg.seed * 1000 + rank,
                             init_seed=cfg.seed, max_steps=cfg.steps, noise_spread=1.0)
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=None, desc="train", unit="step")

    def step_progress(step: int, loss: float) -> None:
        if bar is not None:
            bar.update(step - bar.n)
            bar.set_postfix(loss=f"{loss:.3f}")

    eb = [cfg.bound * _range(a) for a in train_set]
    model = adapt.fit(train_set, eb, mcfg, acfg, init=init, progress=step_progress,
                      allreduce=allreduce if world > 1 else None,
                      agree=agree if world > 1 else None)
    if bar is not None:
        bar.close()
    # validation: closed-loop forecast error of the compiled runtime, in units of the
    # bound, against 'the previous frame' (what an untrained model forecasts)
    errs, base = [], []
    for a, e in zip(val_set, (cfg.bound * _range(a) for a in val_set), strict=True):
        f = Forecaster(model, a.shape[1:])
        x = a.astype(np.float64)
        f.start(x[0])
        for t in range(1, x.shape[0]):
            fc = f.forecast()
            f.observe(x[t])
            ok = np.isfinite(x[t]) & np.isfinite(fc)
            errs.append(float(np.abs(fc - x[t])[ok].mean()) / e)
            base.append(float(np.abs(x[t - 1] - x[t])[ok].mean()) / e)
    metrics = {
        "config": asdict(cfg), "model": json.loads(mcfg.to_json()),
        "data": [str(p) for p in paths], "world_size": world,
        "steps": model.meta.get("steps"), "seconds": model.meta.get("seconds"),
        "parameters": mcfg.n_params(), "macs_per_pixel": mcfg.macs_per_pixel(),
        "val_l1_bounds": float(np.mean(errs)) if errs else math.nan,
        "val_l1_bounds_previous_frame": float(np.mean(base)) if base else math.nan,
        "history": acfg.log,
    }
    if world > 1:      # averaged gradients keep the replicas equal; check it
        crc = zlib.crc32(b"".join(v.tobytes() for v in model.params.values()))
        crcs: list = [None] * world
        dist.all_gather_object(crcs, crc)
        metrics["ranks_agree"] = len(set(crcs)) == 1
    if rank == 0:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        data = to_bytes(mcfg, model.params, {"train": metrics["config"]})
        with atomic_output(out / "model.safetensors", force=True) as tmp:  # rerun replaces
            Path(tmp).write_bytes(data)
        import hashlib

        metrics["model_hash"] = hashlib.sha256(data).hexdigest()
        with atomic_output(out / "train_log.json", force=True) as tmp:
            Path(tmp).write_text(json.dumps(metrics, indent=2))
    if world > 1:
        dist.barrier()
    return metrics


# ---------------------------------------------------------------------------------------
# command line (registered in tezip.cli)

import click  # noqa: E402


@click.command("train")
@click.argument("data", nargs=-1, required=True)
@click.option("--out", "out", required=True, type=click.Path(), help="model directory")
@click.option("--dataset", help="dataset path inside HDF5 inputs")
@click.option("--hidden", default="4", show_default=True,
              help="ConvLSTM channels per layer, comma-separated (the depth is their count)")
@click.option("--seconds", default=120.0, show_default=True, type=float,
              help="training time budget (wall clock)")
@click.option("--steps", default=100_000, show_default=True, type=int,
              help="at most this many optimisation steps")
@click.option("--batch", default=16, show_default=True, type=int)
@click.option("--clip", default=8, show_default=True, type=int, help="frames per training clip")
@click.option("--crop", default=32, show_default=True, type=int, help="crop side in pixels")
@click.option("--lr", default=2e-2, show_default=True, type=float)
@click.option("--bound", default=1e-3, show_default=True, type=float,
              help="reconstruction noise to train with, a fraction of each stack's range")
@click.option("--init", help="'default' (fine-tune the shipped model) or a model file")
@click.option("--seed", default=0, show_default=True, type=int)
def train_cmd(data: tuple[str, ...], out: str, dataset: str | None, hidden: str,
              seconds: float, steps: int, batch: int, clip: int, crop: int, lr: float,
              bound: float, init: str | None, seed: int) -> None:
    """Train the learned forecaster on DATA (.npy, HDF5, TIFF, frame folders); writes
    OUT/model.safetensors and OUT/train_log.json. Data-parallel under torchrun/mpirun."""
    try:
        hid = tuple(int(v) for v in hidden.split(","))
    except ValueError:
        raise OptionError(f"--hidden takes comma-separated integers, got {hidden!r}") from None
    if steps < 1 or batch < 1 or clip < 3 or crop < 4 or not seconds > 0 or not bound > 0:
        raise OptionError("--steps and --batch must be >= 1, --clip >= 3, --crop >= 4, "
                          "--seconds and --bound > 0")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise OptionError("'tezip train' needs PyTorch: pip install torch") from None
    cfg = TrainConfig(hidden=hid, seconds=seconds, steps=steps, batch=batch, clip=clip,
                      crop=crop, lr=lr, bound=bound, init=init, seed=seed)
    m = train(list(data), out, cfg, dataset=dataset)
    if dist_env()[0] == 0:
        click.echo(f"{out}/model.safetensors: {m['parameters']} parameters, {m['steps']} steps "
                   f"in {m['seconds']:.0f} s on {m['world_size']} process(es); validation "
                   f"forecast error {m['val_l1_bounds']:.3f} bounds (previous frame: "
                   f"{m['val_l1_bounds_previous_frame']:.3f})")
