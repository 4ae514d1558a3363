"""Fitting the forecaster to the data being compressed (``--adapt``) or to a training set
(``tezip train``): torch, CPU or GPU, within a time budget.

Training clips are random crops of consecutive frames, normalized like the codec does
(the clip's first frame's finite min/max); the network sees the frames as the decoder
will, perturbed by reconstruction noise at the target bound (uniform in +-eb: the
quantizer leaves every value within eb of the truth), and is trained to forecast the
clean next frame (L1 on bound-normalized errors, the code length of a Laplacian
residual). Optionally data-parallel over torch.distributed ranks (gradients averaged).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .model import Model, ModelConfig, from_bytes, init_params, to_bytes
from .torch_model import PredNet


@dataclass
class AdaptConfig:
    seconds: float = 30.0          # wall-clock budget for the optimisation
    crop: int = 32                 # spatial crop of a clip
    clip: int = 8                  # frames per clip (the first is the keyframe)
    batch: int = 16
    lr: float = 2e-2               # measured on ks_pypde at 1e-3 in 30 s: 3e-3 coded 4%
                                   # larger than the classical predictors, 2e-2 20% smaller
    seed: int = 0                  # clip sampling (data-parallel ranks: one per rank)
    init_seed: int = 0             # initial weights (the same on every rank)
    max_steps: int = 100_000
    threads: int | None = None
    noise_spread: float = 0.0      # vary the bound log-uniformly over this many decades
    log: list = field(default_factory=list)


def _clip_batch(stacks: Sequence[np.ndarray], weights: np.ndarray, cfg: AdaptConfig,
                rng: np.random.Generator, eb_norm: Sequence[float]) -> tuple[np.ndarray, ...]:
    # eb_norm: the absolute bound of each stack
    """(clean, noised) normalized clips (N, T, C, h, w) and the bound in normalized units
    per clip (N,)."""
    clean, noisy, ebs = [], [], []
    for _ in range(cfg.batch):
        k = int(rng.choice(len(stacks), p=weights))
        a = stacks[k]
        # one clip shape for the whole batch, whatever the stacks' shapes
        t = min([cfg.clip] + [b.shape[0] for b in stacks])
        t0 = int(rng.integers(0, a.shape[0] - t + 1))
        h, w = a.shape[1:3]
        ch = min([cfg.crop] + [b.shape[1] for b in stacks])
        cw = min([cfg.crop] + [b.shape[2] for b in stacks])
        y0, x0 = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        x = np.asarray(a[t0:t0 + t, y0:y0 + ch, x0:x0 + cw], np.float64)
        x = x[..., None] if x.ndim == 3 else x
        fin = x[0][np.isfinite(x[0])]
        lo = float(fin.min()) if fin.size else 0.0
        hi = float(fin.max()) if fin.size else 1.0
        scale = (hi - lo) if hi > lo else 1.0
        v = np.nan_to_num((x - lo) / scale, nan=0.0, posinf=0.0, neginf=0.0)
        v = np.clip(v, -8.0, 9.0)
        # the bound in normalized units (at most the keyframe's range: a nearly constant
        # keyframe must not turn the noise, and the loss scale, into overflows)
        e = min(eb_norm[k] / scale, 1.0)
        if cfg.noise_spread:
            e *= 10.0 ** rng.uniform(-cfg.noise_spread, cfg.noise_spread)
        noise = rng.uniform(-1.0, 1.0, v.shape) * e  # every frame, keyframe included
        clean.append(np.moveaxis(v, -1, 1))
        noisy.append(np.moveaxis(v + noise, -1, 1))
        ebs.append(max(e, 1e-6))
    return (np.stack(clean).astype(np.float32), np.stack(noisy).astype(np.float32),
            np.array(ebs, np.float32))


def fit(stacks: Sequence[np.ndarray], eb: Sequence[float], model_cfg: ModelConfig,
        cfg: AdaptConfig, init: Model | None = None,
        progress: Callable[[int, float], None] | None = None,
        allreduce: Callable[[list[torch.Tensor]], None] | None = None,
        agree: Callable[[float], float] | None = None) -> Model:
    """Train on ``stacks`` (each (T, H, W[, C])) whose reconstructions carry noise up to
    ``eb`` (absolute, per stack). Returns the model (float16 weights, as stored).
    Data-parallel: ``allreduce`` averages gradients over the ranks, ``agree(elapsed)``
    returns the largest elapsed time of all ranks, so that every rank follows the same
    learning-rate schedule and all stop at the same step."""
    torch.manual_seed(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed)
    net = PredNet(model_cfg)
    if init is not None and init.config == model_cfg:
        net.load_numpy(init.params)
    else:
        net.load_numpy(init_params(model_cfg, cfg.init_seed))
    sizes = np.array([float(a.size) for a in stacks])
    weights = sizes / sizes.sum()
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    t_start = time.perf_counter()
    step = 0
    while step < cfg.max_steps:
        elapsed = time.perf_counter() - t_start
        if agree is not None:
            elapsed = agree(elapsed)
        if elapsed >= cfg.seconds:
            break
        frac = elapsed / max(cfg.seconds, 1e-9)
        for g in opt.param_groups:          # cosine decay over the time budget
            g["lr"] = cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))
        clean, noisy, ebn = _clip_batch(stacks, weights, cfg, rng, eb)
        target = torch.from_numpy(clean[:, 1:])
        fc = net(torch.from_numpy(clean), torch.from_numpy(noisy))
        scale = torch.from_numpy(ebn).view(-1, 1, 1, 1, 1)
        loss = (torch.abs(fc - target) / scale).mean()
        opt.zero_grad(set_to_none=True)
        if torch.isfinite(loss):
            loss.backward()
        else:       # a batch the network cannot take adds nothing (ranks stay in step)
            for p in net.parameters():
                p.grad = torch.zeros_like(p)
        if allreduce is not None:
            allreduce([p.grad for p in net.parameters() if p.grad is not None])
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 25 == 0:
            value = float(loss.detach())
            cfg.log.append({"step": step, "seconds": round(time.perf_counter() - t_start, 2),
                            "loss": value})
            if progress:
                progress(step, value)
    meta = {"steps": step, "seconds": round(time.perf_counter() - t_start, 2),
            "config": {k: v for k, v in cfg.__dict__.items() if k != "log"}}
    return from_bytes(to_bytes(model_cfg, net.numpy_params(), meta))
