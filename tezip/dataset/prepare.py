"""``tezip prepare`` over MPI ranks: many stacks (or one huge one) into ``.tez`` shards and
a ``manifest.json``.

How a run goes (every rank runs the same code; rank 0 also talks to the user)::

    setup    rank 0 expands the inputs, creates the output directory, removes a stale
             manifest and what a killed run left (pieces, temporary files); broadcast
    scan     sources are split over ranks by bytes on disk; each rank opens its sources
             (shape, dtype, identity) and, for a source larger than one shard, estimates
             its ratio by encoding the first window; allgather
    plan     every rank computes the same shards (plan.plan_shards: a function of the
             inputs and options only) and the same pieces (window-aligned runs of a
             shard, about ``pieces_per_rank`` per rank over the data set; with one rank a
             piece is a whole shard)
    resume   each rank checks the sidecars of its share of the shards; allgather
    range    the pieces of the shards to write are split over ranks by bytes; each rank
             computes the min/max of its pieces and whether a float piece is all finite
             integers (codec.scan); allgather. A source's value range is the min/max
             over all its parts, so a relative bound means the same in every shard
             whatever the number of ranks; a float source all of whose parts are
             integers is coded on the integer grid in every shard
    encode   pieces go to ranks as the ranks become free: every rank starts with two, and
             asks rank 0 for the next one when it starts its last (rank 0 answers between
             windows of its own work), largest pieces first. A whole-shard piece is
             written as the shard (temp + rename) with its sidecar; other pieces wait as
             hidden ``.piece-*`` files. Progress goes to rank 0 in small messages
    assemble rank 0 splits the shards made of several pieces over the ranks by bytes;
             each writes the shard from its pieces (same bytes as one encoding) and
             its sidecar
    manifest rank 0 writes ``manifest.json`` (atomically) only if every rank succeeded
             and broadcasts the outcome, so that all ranks exit alike

Any failure is caught on the rank where it happens and travels in the next exchange, so
no rank waits forever for a rank that gave up; rank 0 reports it as
``rank R failed on INPUT: message``. Each rank's busy time (scan, resume check, ranges,
encoding, assembly; waits excluded) is in ``PrepareResult.per_rank``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .. import io
from ..errors import OutputError
from ..io import atomic_output
from . import manifest as mf
from . import shards as sh
from .adapt import ADAPTED, fit_dataset, too_slow
from .adapt import existing as existing_model
from .comm import Comm, get_comm
from .config import CodecConfig, PrepareConfig
from .encode import Encoder
from .messages import (
    AssemblyPlan,
    EncodeDone,
    Failure,
    RankFailure,
    RankStats,
    ShardDone,
    check,
    describe,
)
from .plan import (
    Piece,
    Shard,
    Source,
    SourceInfo,
    assign,
    disk_bytes,
    expand_inputs,
    piece_bytes,
    plan_pieces,
    plan_shards,
    scan_source,
)

_MAX_OPEN_STACKS = 32


@dataclass
class PrepareResult:
    manifest: dict[str, Any]
    out: Path
    ranks: int
    seconds: float
    sources: int
    per_rank: list[RankStats]

    @property
    def shards_written(self) -> int:
        return sum(r.shards_written for r in self.per_rank)

    @property
    def shards_reused(self) -> int:
        return sum(r.shards_reused for r in self.per_rank)

    @property
    def raw_encoded(self) -> int:
        return sum(r.raw_bytes for r in self.per_rank)

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {"out": str(self.out), "manifest": str(self.out / mf.MANIFEST),
                "ranks": self.ranks, "sources": self.sources, "shards": len(m["shards"]),
                "shards_written": self.shards_written, "shards_reused": self.shards_reused,
                "frames": m["total_frames"], "raw_bytes": m["total_raw_bytes"],
                "compressed_bytes": m["total_bytes"],
                "ratio": m["total_raw_bytes"] / m["total_bytes"] if m["total_bytes"] else None,
                "seconds": self.seconds,
                "mb_per_s": self.raw_encoded / 1e6 / self.seconds if self.seconds else None,
                "per_rank": [{**asdict(r), "mb_per_s": r.mb_per_s} for r in self.per_rank]}


# ---------------------------------------------------------------------------------------
# the run


def _setup(cfg: PrepareConfig) -> list[Source]:
    """Rank 0: inputs, output directory, leftovers of an earlier run."""
    sources = expand_inputs(cfg.inputs, cfg.dataset)
    out = cfg.out
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {out}: {exc.strerror or exc}") from exc
    # the old manifest would describe shards this run may rewrite: it goes first, and a
    # new one appears only when the whole set is complete
    (out / mf.MANIFEST).unlink(missing_ok=True)
    for e in os.scandir(out):
        if sh.is_leftover(e.name) and e.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(e.path)
    return sources


class Run:
    """The state one rank keeps through a run."""

    def __init__(self, cfg: PrepareConfig, comm: Comm) -> None:
        self.cfg, self.comm = cfg, comm
        self.codec: CodecConfig = cfg.codec
        self.options = cfg.codec.options()
        self.root = comm.rank == 0
        self.stats = RankStats(comm.rank)
        self.sources: list[Source] = []
        self.infos: list[SourceInfo] = []
        self.shards: list[Shard] = []
        self.pieces: list[Piece] = []
        self.keys: dict[int, Any] = {}
        self.parts: dict[int, list | None] = {}     # by shard
        self.vranges: list[tuple[float, float] | None] = []
        self._stacks: OrderedDict[int, Any] = OrderedDict()
        self.model: Any = None          # --adapt: the data set's model, once known

    # helpers ----------------------------------------------------------------------------

    def busy(self, since: float) -> None:
        self.stats.seconds += time.perf_counter() - since

    def gather_checked(self, obj: Any, failure: Failure | None) -> list[Any]:
        gathered = self.comm.allgather((obj, failure))
        check(self.comm, [g[1] for g in gathered])
        return [g[0] for g in gathered]

    def stack(self, s: int) -> Any:
        st = self._stacks.get(s)
        if st is None:
            src = self.sources[s]
            st = self._stacks[s] = io.open_input(src.path, dataset=src.dataset)
            while len(self._stacks) > _MAX_OPEN_STACKS:
                _, old = self._stacks.popitem(last=False)
                with contextlib.suppress(Exception):
                    old.close()
        else:
            self._stacks.move_to_end(s)
        return st

    def view(self, shard: Shard, t0: int, t1: int) -> sh.FrameRange:
        st = self.stack(shard.source)
        meta = {**(st.metadata or {}), "source_frames": [shard.t0, shard.t1],
                "source_shape": list(self.infos[shard.source].shape)}
        return sh.FrameRange(st, t0, t1, meta)

    def where(self, shard: int) -> str:
        return self.sources[self.shards[shard].source].path

    def close(self) -> None:
        for st in self._stacks.values():
            with contextlib.suppress(Exception):
                st.close()
        self._stacks.clear()

    # phases -----------------------------------------------------------------------------

    def setup(self) -> None:
        sources: list[Source] = []
        failure = None
        t = time.perf_counter()
        if self.root:
            try:
                sources = _setup(self.cfg)
            except Exception as exc:
                failure = Failure(None, describe(exc))
        t = self.stats.lap("setup", t)
        sources, failure = self.comm.bcast((sources, failure))
        self.stats.lap("wait", t)
        if failure is not None:   # bad inputs or output directory: not one rank's failure
            raise RankFailure(failure.message, report=self.root)
        self.sources = sources

    def scan(self) -> None:
        t = time.perf_counter()
        owner = assign([disk_bytes(s.path) for s in self.sources], self.comm.size)
        local: dict[int, SourceInfo] = {}
        failure = None
        for i, src in enumerate(self.sources):
            if owner[i] != self.comm.rank:
                continue
            try:
                local[i] = scan_source(src, self.codec, self.cfg.target_bytes)
            except Exception as exc:
                failure = Failure(src.path, describe(exc))
                break
        self.busy(t)
        t = self.stats.lap("scan", t)
        gathered = self.gather_checked(local, failure)
        self.stats.lap("wait", t)
        merged: dict[int, SourceInfo] = {}
        for g in gathered:
            merged.update(g)
        self.infos = [merged[i] for i in range(len(self.sources))]

    def plan(self) -> None:
        self.shards = plan_shards(self.infos, self.codec, self.cfg.target_bytes)
        total = sum(s.raw_bytes for s in self.shards)
        size = (piece_bytes(total, self.comm.size, self.cfg.pieces_per_rank)
                if self.comm.size > 1 else max(1, total))
        self.pieces = plan_pieces(self.shards, self.infos, self.codec, size)
        model = self.codec.model_identity()
        if self.cfg.adapt:      # shards of an earlier run count only with the same model
            model = self.model.hash if self.model is not None else "adapt: not fitted yet"
        self.keys = {s.index: sh.shard_key(self.codec, model, self.sources[s.source],
                                           self.infos[s.source], s) for s in self.shards}

    def resume(self) -> dict[int, dict[str, Any]]:
        """Shard -> sidecar of the shards that may be reused."""
        t = time.perf_counter()
        owner = assign([s.raw_bytes for s in self.shards], self.comm.size)
        local: dict[int, dict[str, Any]] = {}
        failure = None
        if not self.cfg.force:
            for s in self.shards:
                if owner[s.index] != self.comm.rank:
                    continue
                try:
                    old = sh.reusable(self.cfg.out, s, self.keys[s.index])
                except Exception as exc:
                    failure = Failure(self.where(s.index), describe(exc))
                    break
                if old is not None:
                    local[s.index] = old
        self.busy(t)
        t = self.stats.lap("resume", t)
        gathered = self.gather_checked(local, failure)
        self.stats.lap("wait", t)
        reuse: dict[int, dict[str, Any]] = {}
        for g in gathered:
            reuse.update(g)
        return reuse

    def ranges(self, reuse: dict[int, dict[str, Any]]) -> None:
        t = time.perf_counter()
        for s, old in reuse.items():
            self.parts[s] = old.get("part_range")
        todo = [p for p in self.pieces if p.shard not in reuse
                and sh.needs_range(self.codec, self.infos[self.shards[p.shard].source].dtype)]
        owner = assign([p.raw_bytes for p in todo], self.comm.size)
        local: dict[int, list | None] = {}
        failure = None
        for p, o in zip(todo, owner, strict=True):
            if o != self.comm.rank:
                continue
            try:
                local[p.index] = sh.part_range(self.view(self.shards[p.shard], p.t0, p.t1))
            except Exception as exc:
                failure = Failure(self.where(p.shard), describe(exc))
                break
        self.busy(t)
        t = self.stats.lap("range", t)
        gathered = self.gather_checked(local, failure)
        self.stats.lap("wait", t)
        for g in gathered:
            for i, part in g.items():
                s = self.pieces[i].shard
                # (None: a part with no finite value; a shard's first part is taken as is)
                self.parts[s] = sh.merge_parts(self.parts[s], part) if s in self.parts \
                    else part
        self.vranges = sh.combine_ranges(self.shards, self.infos, self.codec, self.parts)
        self.integral = sh.combine_integral(self.shards, self.infos, self.parts)

    def finish_shard(self, s: int) -> ShardDone:
        """Record and sidecar of shard ``s``, now complete on disk."""
        shard = self.shards[s]
        src, info = self.sources[shard.source], self.infos[shard.source]
        rec = sh.record(self.cfg.out, shard, src, info)
        mhash = sh.model_hash(self.cfg.out / shard.file)
        sh.write_sidecar(self.cfg.out, shard, self.keys[s], rec, self.parts.get(s),
                         self.vranges[shard.source], mhash, self.integral[shard.source])
        self.stats.shards_written += 1
        return ShardDone(rec, mhash)

    def use_model(self, data: bytes) -> None:
        """Code the shards with the data set's adapted model (named by hash, not stored
        in each shard: it sits once in the data set directory)."""
        from ..learned import registry

        self.model = registry.from_embedded(data, str(self.cfg.out / ADAPTED))
        self.options = replace(self.options, model=str(self.cfg.out / ADAPTED),
                               embed_model=False)

    def reuse_model(self) -> None:
        """--adapt rerun without --force: the model of the earlier run, if it is there."""
        data = None
        if self.root and not self.cfg.force:
            with contextlib.suppress(OSError):
                data = existing_model(self.cfg.out)
        data = self.comm.bcast(data)
        if data is not None:
            self.use_model(data)

    def adapt(self) -> None:
        """--adapt: fit the data set's model over all ranks; rank 0 writes it."""
        why = too_slow(self)
        if why is not None:
            if self.root:
                print(f"tezip: note: {why}", file=sys.stderr, flush=True)
            return
        t = time.perf_counter()
        data = fit_dataset(self, self.comm, self.cfg.adapt_seconds)
        failure = None
        if self.root:
            try:
                with atomic_output(self.cfg.out / ADAPTED, force=True) as tmp:
                    Path(tmp).write_bytes(data)
            except OSError as exc:
                failure = Failure(None, f"cannot write the model: {describe(exc)}")
        failure = self.comm.bcast(failure)
        if failure is not None:
            raise RankFailure(failure.message, report=self.root)
        self.use_model(data)
        self.busy(t)
        self.stats.lap("adapt", t)
        model = self.model.hash
        self.keys = {s.index: sh.shard_key(self.codec, model, self.sources[s.source],
                                           self.infos[s.source], s) for s in self.shards}

    def run(self) -> PrepareResult:
        t_start = time.perf_counter()
        self.setup()
        self.scan()
        if self.cfg.adapt:
            self.reuse_model()
        self.plan()
        reuse = self.resume()
        self.ranges(reuse)
        if self.cfg.adapt and self.model is None:
            self.adapt()
        done = Encoder(self, reuse).run()
        manifest, per_rank = self.assemble_and_finish(done)
        return PrepareResult(manifest, self.cfg.out, self.comm.size,
                             time.perf_counter() - t_start, len(self.sources), per_rank)

    def assemble_and_finish(self, done: dict[int, EncodeDone] | None
                            ) -> tuple[dict[str, Any], list[RankStats]]:
        comm = self.comm
        t = time.perf_counter()
        plan: AssemblyPlan | None = None
        if self.root:
            assert done is not None
            failures = [done[r].failure for r in range(comm.size)]
            jobs: dict[int, list[str]] = {}
            owner: dict[int, int] = {}
            if not any(failures):
                results = {}
                for d in done.values():
                    results.update(d.pieces)
                by_shard: dict[int, list[Piece]] = {}
                for i in sorted(results):
                    by_shard.setdefault(self.pieces[i].shard, []).append(self.pieces[i])
                jobs = {s: [results[p.index].path for p in ps] for s, ps in by_shard.items()}
                order = sorted(jobs)
                ranks = assign([sum(results[p.index].bytes for p in by_shard[s])
                                for s in order], comm.size)
                owner = dict(zip(order, ranks, strict=True))
            plan = AssemblyPlan(failures, jobs, owner)
        plan = comm.bcast(plan)
        t = self.stats.lap("wait", t)
        assert plan is not None
        check(comm, plan.failures)

        local: dict[int, ShardDone] = {}
        failure = None
        for s in sorted(plan.jobs):
            if plan.owner[s] != comm.rank:
                continue
            try:
                # as for a whole-shard piece: the old sidecar goes before its shard does
                side = self.cfg.out / (self.shards[s].file + sh.SIDECAR)
                side.unlink(missing_ok=True)
                sh.assemble(self.cfg.out / self.shards[s].file, [Path(p) for p in plan.jobs[s]])
                local[s] = self.finish_shard(s)
            except Exception as exc:
                failure = Failure(self.where(s), describe(exc))
                break
        self.busy(t)
        t = self.stats.lap("assemble", t)
        gathered = comm.allgather((local, failure, self.stats))
        t = self.stats.lap("wait", t)
        outcome: tuple[dict[str, Any] | None, list[Failure | None]] = (None, [])
        if self.root:
            assert done is not None
            fails = [g[1] for g in gathered]
            manifest = None
            if not any(fails):
                shards: dict[int, ShardDone] = {}
                for d in done.values():
                    shards.update(d.shards)
                for g in gathered:
                    shards.update(g[0])
                try:
                    manifest = self.write_manifest(shards)
                except Exception as exc:
                    fails[0] = Failure(None, f"cannot write the manifest: {describe(exc)}")
            outcome = (manifest, fails)
        manifest, fails = comm.bcast(outcome)
        self.stats.lap("manifest", t)
        check(comm, fails)
        assert manifest is not None
        return manifest, [g[2] for g in gathered]

    def write_manifest(self, done: dict[int, ShardDone]) -> dict[str, Any]:
        """Rank 0, every rank done: drop shards of an earlier, larger plan, write the
        manifest."""
        n = len(self.shards)
        for e in os.scandir(self.cfg.out):
            name = e.name
            if name.startswith("shard-") and name.endswith((".tez", ".tez" + sh.SIDECAR)):
                stem = name[len("shard-"):].split(".", 1)[0]
                if stem.isdigit() and len(stem) == 6 and int(stem) >= n:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
        entries = [done[s.index].record for s in self.shards]
        hashes = {done[s.index].model_hash for s in self.shards}
        codec = {**self.codec.to_dict(), "adapt": self.cfg.adapt}
        hashes.discard(None)    # shards whose windows cannot use it (e.g. too slow) name none
        mhash = hashes.pop() if len(hashes) == 1 else None
        if self.model is not None:
            mhash = self.model.hash
        manifest = mf.build(codec, entries, mhash, ADAPTED if self.model is not None else None)
        mf.write(self.cfg.out, manifest)
        return manifest


def prepare(cfg: PrepareConfig, comm: Comm | None = None) -> PrepareResult:
    """Run ``tezip prepare`` on this rank; see the module docstring. Returns on every
    rank when every rank succeeded (the manifest is written by then); raises
    RankFailure on every rank otherwise."""
    run = Run(cfg, comm or get_comm())
    try:
        return run.run()
    finally:
        run.close()
