"""``tezip prepare --adapt``: one forecaster fitted to the whole data set, data-parallel
over the ranks that encode it, saved once in the data set directory.

Every rank trains on clips of its own inputs (source ``i`` belongs to rank ``i % size``;
with more ranks than inputs, ranks share them and sample with their own seeds); the
gradients are summed over the ranks after every step (MPI allreduce, as MPI
data-parallel trainers do) and every rank follows rank-agreed time, so all ranks take
the same steps and hold the same weights. Rank 0 writes the model atomically as
``ADAPTED`` in the data set directory and sends its bytes to the others; the shards name
it by hash (it is not stored in each shard) and ``manifest.json`` lists file and hash.
A rerun without ``--force`` reuses the model already in the directory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..codec import ADAPT_MAX_VALUES, learned_decode_mbps, resolve
from ..errors import OptionError
from .comm import Comm
from .config import DATASET_MIN_DECODE_MBPS

ADAPTED = "adapted-model.safetensors"


def _local_data(run: Any, comm: Comm) -> tuple[list[np.ndarray], list[float]]:
    """This rank's training stacks (a leading run of frames of each of its sources, at
    most ADAPT_MAX_VALUES values over all of them) and their absolute bounds."""
    n = len(run.sources)
    mine = [i for i in range(n) if i % comm.size == comm.rank] or [comm.rank % n]
    budget = max(1, ADAPT_MAX_VALUES // len(mine))
    stacks, ebs = [], []
    for i in mine:
        info = run.infos[i]
        frame = math.prod(info.shape[1:])
        t = max(2, min(info.shape[0], budget // max(1, frame)))
        stacks.append(np.asarray(run.stack(i).read(0, t)))
        vr = run.vranges[i] if run.vranges[i] is not None else (0.0, 0.0)
        qp = resolve(run.options.bound, np.dtype(info.dtype), (float(vr[0]), float(vr[1])),
                     integral=run.integral[i])
        ebs.append(qp.eb if qp.kind in ("float", "int") else 0.5)
    return stacks, ebs


def too_slow(run: Any) -> str | None:
    """Why no window could use an adapted model (the decode floor excludes it), or None."""
    from ..learned.model import ModelConfig

    channels = max(info.shape[3] if len(info.shape) == 4 else 1 for info in run.infos)
    cfg = ModelConfig(channels=min(channels, 16))
    floor = run.options.floor()
    # the fastest source (a dtype's width and, for small frames, their size set it)
    mbs, dtype = max((learned_decode_mbps(cfg.macs_per_pixel(), cfg.channels,
                                          np.dtype(info.dtype).itemsize,
                                          math.prod(info.shape[1:])), str(info.dtype))
                     for info in run.infos)
    if mbs >= floor:
        return None
    default = floor == DATASET_MIN_DECODE_MBPS
    # a floor that lets it through: half the estimate, in two significant digits (tiny
    # frames decode under 1 MB/s: "1" was still above it)
    hint = float(f"{mbs / 2:.2g}") if mbs < 2 else max(1, int(mbs) // 2)
    return (f"--adapt skipped: the learned forecaster decodes {dtype} at about {mbs:.2g} "
            f"MB/s per core, below --min-decode-mbps {floor:g}"
            + (" (the data set default, so that loaders keep up)" if default else "")
            + ", so no window could use it; the shards use the classical predictors. Pass "
            f"--min-decode-mbps {hint:g} to trade decoding speed for size")


def fit_dataset(run: Any, comm: Comm, seconds: float) -> bytes:
    """Train on every rank, return the model file's bytes (the same on every rank)."""
    try:
        import torch

        from ..learned import adapt
        from ..learned.model import ModelConfig
    except ImportError as exc:
        raise OptionError(f"--adapt trains a model and needs PyTorch ({exc.name} is not "
                          "installed): pip install torch") from None
    channels = {info.shape[3] if len(info.shape) == 4 else 1 for info in run.infos}
    if len(channels) != 1:
        raise OptionError("--adapt fits one model to the data set, but its stacks have "
                          f"different channel counts ({sorted(channels)}); prepare them "
                          "apart")
    cfg_model = ModelConfig(channels=next(iter(channels)))
    stacks, ebs = _local_data(run, comm)

    def allreduce(grads: list[torch.Tensor]) -> None:
        flat = torch.cat([g.reshape(-1) for g in grads]).numpy().astype(np.float64)
        comm.allreduce_sum(flat)
        flat /= comm.size
        k = 0
        for g in grads:
            g.copy_(torch.from_numpy(flat[k:k + g.numel()]).view_as(g))
            k += g.numel()

    cfg = adapt.AdaptConfig(seconds=seconds, seed=comm.rank)
    model = adapt.fit(stacks, ebs, cfg_model, cfg,
                      allreduce=allreduce if comm.size > 1 else None,
                      agree=comm.allreduce_max if comm.size > 1 else None)
    return comm.bcast(model.data if comm.rank == 0 else b"")


def existing(out: Path) -> bytes | None:
    """The model bytes of an earlier ``--adapt`` run in ``out``, if any."""
    p = out / ADAPTED
    return p.read_bytes() if p.is_file() else None
