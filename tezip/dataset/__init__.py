"""The training-data layer: ``tezip prepare`` (MPI) writes shards and a manifest; the
torch datasets read them, decoding inside the DataLoader workers.

    manifest   the manifest: one schema, read/load/write/verify (no torch)
    config     CodecConfig, PrepareConfig
    plan       inputs, scan, shards, pieces (windows of one stack over ranks)
    comm       one rank, or mpi4py's COMM_WORLD
    shards     views, value ranges of parts, resume sidecars, piece assembly
    progress   the progress line of prepare
    messages   what ranks send each other (dataclasses), RankStats, RankFailure
    encode     the encode phase: pieces handed to ranks as they become free
    prepare    the MPI run
    cache      node-local staging of shards (no torch)
    readers    opening a shard: .tez, and raw .npy / lossless .b2nd baselines (no torch)
    order      the global sample order, shuffling, shape groups (numpy only)
    torch      TezDataset, TezShardStream, ShapeBatchSampler (imports torch)

The run itself is ``tezip.dataset.prepare.prepare(PrepareConfig(...))`` (the function is
not re-exported here: it would hide the module of the same name). ``import
tezip.dataset`` does not import torch; the torch classes are loaded on first
use of their names (``from tezip.dataset import TezShardStream``).
"""

from __future__ import annotations

from typing import Any

from .config import CodecConfig, PrepareConfig
from .manifest import MANIFEST, Manifest, ShardInfo, is_dataset_dir, load, verify
from .prepare import PrepareResult, RankFailure

_TORCH_NAMES = ("TezDataset", "TezShardStream", "ShapeBatchSampler", "worker_init_fn")

__all__ = ["MANIFEST", "CodecConfig", "Manifest", "PrepareConfig", "PrepareResult",
           "RankFailure", "ShardInfo", "is_dataset_dir", "load", "verify",
           *_TORCH_NAMES]


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        from . import torch as _torch
        return getattr(_torch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
