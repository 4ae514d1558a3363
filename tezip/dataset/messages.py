"""What the ranks of ``tezip prepare`` tell each other: dataclasses sent between ranks
(instead of tuples read by position), per-rank statistics, and how failures travel."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import TezipError
from .comm import Comm
from .progress import Counters
from .shards import PieceResult


class RankFailure(TezipError):
    """A rank failed; raised on every rank. ``report`` is True on the rank that should
    print it (rank 0)."""

    def __init__(self, message: str, report: bool) -> None:
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------------------------------
# what ranks tell each other


@dataclass(frozen=True)
class Failure:
    where: str | None          # the input it happened on
    message: str


@dataclass
class RankStats:
    rank: int
    shards_written: int = 0     # whole shards encoded, or assembled, by this rank
    shards_reused: int = 0
    pieces: int = 0             # pieces this rank encoded
    raw_bytes: int = 0          # raw bytes this rank encoded
    compressed_bytes: int = 0
    seconds: float = 0.0        # busy: scan, resume check, ranges, encoding, assembly
    phases: dict[str, float] = field(default_factory=dict)   # wall seconds per phase

    def lap(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - since
        return now

    @property
    def mb_per_s(self) -> float:
        """Raw MB this rank encoded per second of its busy time."""
        return self.raw_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ProgressMsg:
    counters: Counters


@dataclass(frozen=True)
class WorkRequest:
    """A rank started its last piece and asks rank 0 for another."""


@dataclass(frozen=True)
class WorkGrant:
    piece: int | None           # None: no more work


@dataclass(frozen=True)
class ShardDone:
    record: dict[str, Any]      # the manifest entry
    model_hash: str | None


@dataclass(frozen=True)
class EncodeDone:
    """A rank's last message of the encode phase."""

    pieces: dict[int, PieceResult]    # parts of shards, waiting for assembly
    shards: dict[int, ShardDone]         # whole shards written (or reused)
    failure: Failure | None
    counters: Counters
    stats: RankStats


@dataclass(frozen=True)
class AssemblyPlan:
    failures: list[Failure | None]       # by rank; the run stops if any
    jobs: dict[int, list[str]]           # shard -> piece files, in order
    owner: dict[int, int]                # shard -> rank that assembles it



def describe(exc: BaseException) -> str:
    if isinstance(exc, TezipError):
        text = str(exc)
    elif isinstance(exc, OSError):
        text = (exc.strerror or str(exc)) + (f": {exc.filename}" if exc.filename else "")
    elif isinstance(exc, MemoryError):
        text = "out of memory; use a smaller --window or --shard-size"
    else:
        text = f"internal error: {type(exc).__name__}: {exc}"
    return " ".join(text.split())


def check(comm: Comm, failures: list[Failure | None]) -> None:
    """Raise on every rank if any rank failed: the lowest rank's failure is the message."""
    bad = [(r, f) for r, f in enumerate(failures) if f is not None]
    if not bad:
        return
    r, f = bad[0]
    text = f"rank {r} failed" + (f" on {f.where}" if f.where else "") + f": {f.message}"
    if len(bad) > 1:
        text += f" (and {len(bad) - 1} more rank{'s' if len(bad) > 2 else ''} failed)"
    raise RankFailure(text, report=comm.rank == 0)
