"""The configuration of a ``tezip prepare`` run (what the user asked for)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import make_bound, predictors
from ..codec import Options
from ..errors import OptionError

DEFAULT_SHARD_MB = 128.0
# the learned predictor only where it decodes at least this fast (MB/s per core): a
# DataLoader core then still delivers about half of what it copies from raw .npy shards
DATASET_MIN_DECODE_MBPS = 100.0


@dataclass(frozen=True)
class CodecConfig:
    """The codec options as the user gave them (also what the manifest records)."""

    mode: str = "lossless"
    bound: float | None = None
    rel_bound: float | None = None
    predictor: str = "auto"
    window: int | None = None          # None: automatic (``windows.window_length``)
    model: str | None = None            # learned model file (None: the shipped default)
    min_decode_mbps: float = DATASET_MIN_DECODE_MBPS

    @classmethod
    def from_cli(cls, mode: str | None, bound: float | None, rel_bound: float | None,
                 predictor: str = "auto", window: int | None = None,
                 model: str | None = None,
                 min_decode_mbps: float | None = None) -> CodecConfig:
        """The same defaults and checks as ``tezip compress``."""
        if mode is None:
            mode = "rel" if bound is not None else "lossless"
        if mode == "absrel" and rel_bound is None:
            raise OptionError("mode 'absrel' needs both --bound (absolute) and --rel-bound")
        if mode != "absrel" and rel_bound is not None:
            raise OptionError("--rel-bound is only for --mode absrel")
        cfg = cls(mode, bound, rel_bound, predictor, window,
                  None if model is None else str(model),
                  DATASET_MIN_DECODE_MBPS if min_decode_mbps is None else min_decode_mbps)
        cfg.options()  # validates
        return cfg

    def options(self) -> Options:
        # (the shards' windows as ``plan.effective_window`` lays them out: its pieces and
        # the loader's order count on it, so not lengthened for the transform)
        return Options(make_bound(self.mode, self.bound, self.rel_bound),
                       predictor=self.predictor, window=self.window, model=self.model,
                       min_decode_mbps=self.min_decode_mbps, transform_windows=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def model_identity(self) -> str | None:
        """The content hash of the model the shards may use (None: classical only)."""
        return predictors.model_identity(self.options())


@dataclass(frozen=True)
class PrepareConfig:
    """One ``tezip prepare`` run. ``pieces_per_rank`` (with more than one rank): the
    shards to write are cut into about this many window-aligned pieces per rank, handed
    out to ranks as they become free, so that no rank idles while another still has a
    large stack to encode."""

    inputs: tuple[str, ...]
    out: Path
    codec: CodecConfig = field(default_factory=CodecConfig)
    dataset: str | None = None          # for HDF5 inputs without FILE:/dataset
    shard_size_mb: float = DEFAULT_SHARD_MB
    force: bool = False                 # rewrite every shard, trust nothing on disk
    progress: bool = True               # rank 0 prints the aggregated progress line
    pieces_per_rank: int = 16
    adapt: bool = False                 # fit one forecaster to the data set (all ranks)
    adapt_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not self.inputs:
            raise OptionError("no inputs given")
        if not (self.shard_size_mb > 0 and math.isfinite(self.shard_size_mb)):
            raise OptionError(f"--shard-size must be a positive number of MB, "
                              f"got {self.shard_size_mb}")
        if self.adapt and self.codec.predictor not in ("auto", "learned"):
            raise OptionError(f"--adapt fits a learned predictor; it does not go with "
                              f"--predictor {self.codec.predictor}")
        if self.adapt and self.codec.model is not None:
            raise OptionError("--adapt fits a new model; it does not go with --model")
        if not (self.adapt_seconds > 0 and math.isfinite(self.adapt_seconds)):
            raise OptionError(f"--adapt-seconds must be positive, got {self.adapt_seconds}")
        if self.pieces_per_rank < 1:
            raise OptionError(f"pieces_per_rank must be >= 1, got {self.pieces_per_rank}")

    @property
    def target_bytes(self) -> int:
        return max(1, int(self.shard_size_mb * 1e6))
