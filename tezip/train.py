"""Training the learned forecaster: single process or torch DDP (gloo on CPU, NCCL on GPU).

    tezip train DATA... --out MODEL_DIR [--steps N] [--hidden 8,16] [--init default]
    torchrun --nproc-per-node 2 -m tezip train DATA... --out MODEL_DIR

What the codec needs from the model shaped the recipe: inputs are *reconstructed* frames,
so training inputs get uniform noise of the size of a quantization error (``--noise``, a
fraction of each clip's range); the loss is L1 (residual code length grows with log|e|,
closer to L1 than to L2); clips are normalized by their first frame's min and max, exactly
as the codec normalizes a window by its keyframe.
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .atomic import atomic_output
from .errors import InputError, OptionError
from .models import ModelConfig, PredNet, default_model_path, load_model, save_model


@dataclass
class TrainConfig:
    hidden: tuple[int, ...] = (8,)
    kernel: int = 3
    clip: int = 8
    crop: int = 64
    batch: int = 8
    steps: int = 1500
    lr: float = 3e-3
    noise: float = 1e-3
    val_fraction: float = 0.2
    val_every: int = 250
    seed: int = 0
    init: str | None = None
    extra: dict = field(default_factory=dict)


def _load_stacks(paths: list[str], dataset: str | None) -> list[np.ndarray]:
    from . import io

    stacks = []
    for p in paths:
        with io.open_input(p, dataset=dataset) as s:
            a = s.read(0, s.shape[0]).astype(np.float32)
        if a.ndim == 3:
            a = a[..., None]
        stacks.append(a)
    if not stacks:
        raise InputError("no training data given")
    chans = {a.shape[-1] for a in stacks}
    if len(chans) != 1:
        raise InputError(f"training stacks differ in channel count: {sorted(chans)}")
    return stacks


def _split(stacks: list[np.ndarray], cfg: TrainConfig) -> tuple[list, list]:
    """Last ``val_fraction`` of each stack's frames (at least one clip) for validation."""
    train, val = [], []
    for a in stacks:
        n_val = max(cfg.clip, int(round(a.shape[0] * cfg.val_fraction)))
        if a.shape[0] - n_val < cfg.clip:
            raise InputError(f"a stack of {a.shape[0]} frames is too short to train on with "
                             f"clips of {cfg.clip} frames and a validation split")
        train.append(a[:-n_val])
        val.append(a[-n_val:])
    return train, val


def _clip(a: np.ndarray, rng: np.random.Generator, cfg: TrainConfig
          ) -> tuple[np.ndarray, float, float]:
    """A random clip, cropped, with the min and max of its first *full* frame (the codec
    normalizes a window by its whole keyframe)."""
    t, h, w, _ = a.shape
    t0 = int(rng.integers(0, t - cfg.clip + 1))
    first = a[t0]
    lo, hi = float(first.min()), float(first.max())
    ch, cw = min(cfg.crop, h), min(cfg.crop, w)
    y0 = int(rng.integers(0, h - ch + 1))
    x0 = int(rng.integers(0, w - cw + 1))
    c = a[t0:t0 + cfg.clip, y0:y0 + ch, x0:x0 + cw]
    if ch < cfg.crop or cw < cfg.crop:
        c = np.pad(c, ((0, 0), (0, cfg.crop - ch), (0, cfg.crop - cw), (0, 0)), mode="edge")
    return c, lo, hi


def _batch(stacks: list[np.ndarray], rng: np.random.Generator, cfg: TrainConfig,
           n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(noisy inputs, clean targets), (N, T, C, H, W), clips from stacks chosen uniformly
    (a small stack counts as much as a large one), normalized per clip by its first
    frame's range; the noise imitates quantization errors of bounds from noise/10 to
    noise*10 of that range (log-uniform per clip)."""
    clips, los, his = [], [], []
    for _ in range(n):
        a = stacks[int(rng.integers(len(stacks)))]   # every stack counts the same
        c, lo, hi = _clip(a, rng, cfg)
        clips.append(c)
        los.append(lo)
        his.append(hi)
    x = np.stack(clips).transpose(0, 1, 4, 2, 3).astype(np.float64)
    lo = np.array(los)[:, None, None, None, None]
    rng_ = np.array(his)[:, None, None, None, None] - lo
    x = (x - lo) / np.where(rng_ > 0, rng_, 1.0)
    level = cfg.noise * 10.0 ** rng.uniform(-1.0, 1.0, size=(n, 1, 1, 1, 1))
    noisy = x + rng.uniform(-1.0, 1.0, size=x.shape) * level
    return torch.from_numpy(noisy.astype(np.float32)), torch.from_numpy(x.astype(np.float32))


def _val_set(val: list[np.ndarray], cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(12345)
    return _batch(val, rng, cfg, max(16, cfg.batch * 2))


def _dist_env() -> tuple[int, int, int]:
    """(rank, world, local rank) from torchrun or an MPI launcher; (0, 1, 0) otherwise."""
    env = os.environ
    for r, w, lr in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                     ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                     ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")):
        if r in env and w in env:
            return int(env[r]), int(env[w]), int(env.get(lr, env[r]))
    return 0, 1, 0


def train(paths: list[str], out: str | os.PathLike, cfg: TrainConfig, *,
          dataset: str | None = None, progress: bool = True) -> dict:
    """Train (or fine-tune) a model; returns the metrics written to ``out/train_log.json``.
    Under torchrun/mpirun with world size > 1 the model is wrapped in DDP."""
    rank, world, local = _dist_env()
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    stacks = _load_stacks(paths, dataset)
    train_set, val_set = _split(stacks, cfg)
    channels = stacks[0].shape[-1]
    if cfg.init:
        init_path = default_model_path() if cfg.init == "default" else Path(cfg.init)
        net = load_model(init_path).net
        if net.cfg.channels != channels:
            raise OptionError(f"--init model has {net.cfg.channels} channels, data {channels}")
        mcfg = net.cfg
    else:
        mcfg = ModelConfig(channels=channels, hidden=cfg.hidden, kernel=cfg.kernel)
        net = PredNet(mcfg)
    net = net.to(device).train()
    model: torch.nn.Module = net
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[local] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, cfg.steps))
    rng = np.random.default_rng(cfg.seed * 1000 + rank)     # each rank its own clips
    vx, vy = _val_set(val_set, cfg)
    vx, vy = vx.to(device), vy.to(device)
    base = float(F.l1_loss(vx[:, :-1], vy[:, 1:]))           # 'previous frame' forecast
    out = Path(out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    history = []
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, desc="train", unit="step")
    t_start = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        x, y = _batch(train_set, rng, cfg, cfg.batch)
        x, y = x.to(device), y.to(device)
        loss = F.l1_loss(model(x), y[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{float(loss):.5f}")
        if step % cfg.val_every == 0 or step == cfg.steps:
            with torch.no_grad():
                v = float(F.l1_loss(net(vx), vy[:, 1:]))
            history.append({"step": step, "train_l1": float(loss.detach()), "val_l1": v,
                            "val_l1_previous_frame": base})
            if rank == 0:
                save_model(net, out / "checkpoint.safetensors", {"step": step})
    seconds = time.perf_counter() - t_start
    if bar is not None:
        bar.close()
    metrics = {
        "config": asdict(cfg), "model": asdict(mcfg), "data": [str(p) for p in paths],
        "world_size": world, "steps": cfg.steps, "seconds": seconds,
        "parameters": sum(p.numel() for p in net.parameters()),
        "val_l1": history[-1]["val_l1"] if history else math.nan,
        "val_l1_previous_frame": base, "history": history,
    }
    if world > 1:   # DDP keeps replicas in sync; check it rather than assume it
        crc = zlib.crc32(b"".join(p.detach().cpu().numpy().tobytes() for p in net.parameters()))
        crcs: list = [None] * world
        dist.all_gather_object(crcs, crc)
        metrics["rank_weight_crcs"] = crcs
        metrics["ranks_agree"] = len(set(crcs)) == 1
    if rank == 0:
        h = save_model(net, out / "model.safetensors", {"train": metrics["config"]})
        metrics["model_hash"] = h
        with atomic_output(out / "train_log.json", force=True) as tmp:   # rerun replaces it
            Path(tmp).write_text(json.dumps(metrics, indent=2))
        ck = out / "checkpoint.safetensors"
        if ck.exists():
            ck.unlink()
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
@click.option("--hidden", default="8", show_default=True,
              help="hidden channels per layer, comma-separated (the depth is their count)")
@click.option("--kernel", default=3, show_default=True, type=int,
              help="convolution kernel size (odd)")
@click.option("--steps", default=1500, show_default=True, type=int)
@click.option("--batch", default=8, show_default=True, type=int)
@click.option("--clip", default=8, show_default=True, type=int, help="frames per training clip")
@click.option("--crop", default=64, show_default=True, type=int, help="crop side in pixels")
@click.option("--lr", default=3e-3, show_default=True, type=float)
@click.option("--noise", default=1e-3, show_default=True, type=float,
              help="input noise, fraction of the clip range (imitates reconstructions)")
@click.option("--init", help="'default' (fine-tune the shipped model) or a model file")
@click.option("--seed", default=0, show_default=True, type=int)
def train_cmd(data: tuple[str, ...], out: str, dataset: str | None, hidden: str, kernel: int,
              steps: int, batch: int, clip: int, crop: int, lr: float, noise: float,
              init: str | None, seed: int) -> None:
    """Train the learned forecaster on DATA (.npy, HDF5, TIFF, frame folders); writes
    OUT/model.safetensors and OUT/train_log.json. Data-parallel under torchrun/mpirun."""
    try:
        hid = tuple(int(v) for v in hidden.split(","))
    except ValueError:
        raise OptionError(f"--hidden takes comma-separated integers, got {hidden!r}") from None
    if steps < 1 or batch < 1 or clip < 3 or crop < 4 or kernel < 1 or kernel % 2 == 0:
        raise OptionError("--steps and --batch must be >= 1, --clip >= 3, --crop >= 4, "
                          "--kernel odd")
    cfg = TrainConfig(hidden=hid, kernel=kernel, steps=steps, batch=batch, clip=clip,
                      crop=crop, lr=lr, noise=noise, init=init, seed=seed,
                      val_every=max(1, min(250, steps)))
    m = train(list(data), out, cfg, dataset=dataset)
    if _dist_env()[0] == 0:
        click.echo(f"{out}/model.safetensors: {m['parameters']} parameters, {m['steps']} steps "
                   f"in {m['seconds']:.0f} s on {m['world_size']} process(es); validation L1 "
                   f"{m['val_l1']:.5f} (previous frame: {m['val_l1_previous_frame']:.5f})")
