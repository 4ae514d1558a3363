"""Old name of ``tezip prepare``'s module; kept so that existing imports work. The code
lives in ``tezip.dataset`` (``prepare``, ``plan``, ``comm``, ``manifest``)."""

from __future__ import annotations

from .dataset.comm import Comm, MpiComm, SerialComm, get_comm
from .dataset.config import DEFAULT_SHARD_MB, CodecConfig, PrepareConfig
from .dataset.manifest import (
    FORMAT,
    MANIFEST,
    VERSION,
    DatasetReport,
    is_dataset_dir,
    sha256_file,
)
from .dataset.manifest import read as load_manifest
from .dataset.manifest import verify as verify_dataset
from .dataset.messages import RankFailure, RankStats
from .dataset.plan import Shard, Source, SourceInfo, assign, expand_inputs, plan_shards
from .dataset.prepare import PrepareResult, prepare

__all__ = ["DEFAULT_SHARD_MB", "FORMAT", "MANIFEST", "VERSION", "CodecConfig", "Comm",
           "DatasetReport", "MpiComm", "PrepareConfig", "PrepareResult", "RankFailure",
           "RankStats", "SerialComm", "Shard", "Source", "SourceInfo", "assign",
           "expand_inputs", "get_comm", "is_dataset_dir", "load_manifest", "plan_shards",
           "prepare", "sha256_file", "verify_dataset"]
