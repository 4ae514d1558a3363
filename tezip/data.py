"""Old name of the torch datasets' module; kept so that existing imports work. The code
lives in ``tezip.dataset`` (``torch``, ``order``, ``cache``, ``manifest``). Importing
this module imports torch."""

from __future__ import annotations

from .dataset.cache import ShardCache
from .dataset.manifest import Manifest, ShardInfo
from .dataset.manifest import load as load_manifest
from .dataset.torch import ShapeBatchSampler, TezDataset, TezShardStream, worker_init_fn

__all__ = ["Manifest", "ShapeBatchSampler", "ShardCache", "ShardInfo", "TezDataset",
           "TezShardStream", "load_manifest", "worker_init_fn"]
