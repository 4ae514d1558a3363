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
             computes the min/max of its pieces (codec.value_range); allgather. A
             source's value range is the min/max over all its parts, so a relative bound
             means the same in every shard whatever the number of ranks
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
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import io
from ..errors import OutputError, TezipError
from . import manifest as mf
from . import shards as sh
from .comm import Comm, get_comm
from .config import CodecConfig, PrepareConfig
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
from .progress import Counters, ProgressLine

_MAX_OPEN_STACKS = 32
_LOOKAHEAD = 2          # pieces a rank holds (the one it encodes and the next)


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

    pieces: dict[int, sh.PieceResult]    # parts of shards, waiting for assembly
    shards: dict[int, ShardDone]         # whole shards written (or reused)
    failure: Failure | None
    counters: Counters
    stats: RankStats


@dataclass(frozen=True)
class AssemblyPlan:
    failures: list[Failure | None]       # by rank; the run stops if any
    jobs: dict[int, list[str]]           # shard -> piece files, in order
    owner: dict[int, int]                # shard -> rank that assembles it


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


class _Run:
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
        self.parts: dict[int, list[float] | None] = {}     # by shard
        self.vranges: list[tuple[float, float] | None] = []
        self._stacks: OrderedDict[int, Any] = OrderedDict()

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
        local: dict[int, list[float] | None] = {}
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
                self.parts[s] = sh.merge_parts(self.parts.get(s), part)
        self.vranges = sh.combine_ranges(self.shards, self.infos, self.codec, self.parts)

    def finish_shard(self, s: int) -> ShardDone:
        """Record and sidecar of shard ``s``, now complete on disk."""
        shard = self.shards[s]
        src, info = self.sources[shard.source], self.infos[shard.source]
        rec = sh.record(self.cfg.out, shard, src, info)
        mhash = sh.model_hash(self.cfg.out / shard.file)
        sh.write_sidecar(self.cfg.out, shard, self.keys[s], rec, self.parts.get(s),
                         self.vranges[shard.source], mhash)
        self.stats.shards_written += 1
        return ShardDone(rec, mhash)

    def run(self) -> PrepareResult:
        t_start = time.perf_counter()
        self.setup()
        self.scan()
        self.plan()
        reuse = self.resume()
        self.ranges(reuse)
        done = _Encoder(self, reuse).run()
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
        manifest = mf.build(self.codec.to_dict(), entries,
                            hashes.pop() if len(hashes) == 1 else None)
        mf.write(self.cfg.out, manifest)
        return manifest


class _Encoder:
    """The encode phase on one rank: pieces handed out as ranks become free."""

    def __init__(self, run: _Run, reuse: dict[int, dict[str, Any]]) -> None:
        self.r = run
        comm = run.comm
        self.comm = comm
        self.counters = Counters()
        self.results: dict[int, sh.PieceResult] = {}
        self.shards: dict[int, ShardDone] = {}
        self.failure: Failure | None = None
        # shards kept: reused ones whose value range is still the one they were written with
        self.kept = {s for s, old in reuse.items()
                     if old.get("vrange") == _as_list(run.vranges[run.shards[s].source])}
        resume_owner = assign([s.raw_bytes for s in run.shards], comm.size)
        for s in sorted(self.kept):
            if resume_owner[s] == comm.rank:
                old = reuse[s]
                src = run.sources[run.shards[s].source]
                rec = {**old["record"], "source": os.path.abspath(src.path)}
                self.shards[s] = ShardDone(rec, old.get("model_hash"))
                run.stats.shards_reused += 1
                raw = run.shards[s].raw_bytes
                self.counters = self.counters.add(run.shards[s].frames, raw, raw,
                                                  int(rec["bytes"]), raw)
        todo = [p for p in run.pieces if p.shard not in self.kept]
        if comm.size > 1:   # largest first, so the last pieces to finish are small ones
            todo.sort(key=lambda p: (-p.raw_bytes, p.index))
        self.queue = [p.index for p in todo]
        first = _LOOKAHEAD * comm.size
        self.mine: deque[int] = deque(self.queue[comm.rank:first:comm.size])
        self.next = min(first, len(self.queue))          # rank 0's pointer
        self.bar = ProgressLine(run.cfg.progress and run.root,
                                sum(s.frames for s in run.shards), comm.size)
        self.done: dict[int, EncodeDone] = {}             # rank 0: by rank
        self.requested = False
        self.exhausted = False
        self.last_send = 0.0

    # rank 0: serving the others -----------------------------------------------------------

    def _grant(self) -> int | None:
        if self.failure is not None or any(d.failure for d in self.done.values()):
            return None
        if self.next < len(self.queue):
            self.next += 1
            return self.queue[self.next - 1]
        return None

    def absorb(self) -> None:
        """Rank 0: answer requests, take progress and final reports."""
        for src, msg in self.comm.poll():
            if isinstance(msg, WorkRequest):
                self.comm.send(WorkGrant(self._grant()), src)
            elif isinstance(msg, ProgressMsg):
                self.bar.update(src, msg.counters)
            elif isinstance(msg, EncodeDone):
                self.done[src] = msg
                self.bar.update(src, msg.counters)

    # other ranks: asking rank 0 -----------------------------------------------------------

    def take_grants(self) -> None:
        for _, msg in self.comm.poll():
            if isinstance(msg, WorkGrant):
                self.requested = False
                if msg.piece is None:
                    self.exhausted = True
                else:
                    self.mine.append(msg.piece)

    def ask(self) -> None:
        if not self.requested and not self.exhausted:
            self.comm.send(WorkRequest(), 0)
            self.requested = True

    def wait_for_grant(self) -> None:
        delay = 1e-4
        while self.requested:
            self.take_grants()
            if self.requested:
                time.sleep(delay)
                delay = min(0.02, delay * 2)

    # both ---------------------------------------------------------------------------------

    def report(self, force: bool = False) -> None:
        if self.r.root:
            self.bar.update(0, self.counters, force)
            self.absorb()
        else:
            self.take_grants()
            if force or time.perf_counter() - self.last_send > 0.5:
                self.last_send = time.perf_counter()
                self.comm.send(ProgressMsg(self.counters), 0)

    def next_piece(self) -> int | None:
        if self.r.root:
            if not self.mine:
                g = self._grant()
                return g
            return self.mine.popleft()
        self.take_grants()
        if not self.mine:
            if self.exhausted or self.failure is not None:
                return None
            self.ask()
            self.wait_for_grant()
            if not self.mine:
                return None
        p = self.mine.popleft()
        if not self.mine:
            self.ask()      # ask for the next one while this one is encoded
        return p

    def encode(self, i: int) -> None:
        run = self.r
        piece = run.pieces[i]
        shard = run.shards[piece.shard]
        info = run.infos[shard.source]
        out = run.cfg.out

        def step(n: int) -> None:
            self.counters = self.counters.add(frames=n, raw_in=n * info.frame_bytes)
            self.report()

        if piece.whole:
            (out / (shard.file + sh.SIDECAR)).unlink(missing_ok=True)
            path = out / shard.file
        else:
            path = sh.piece_path(out, piece)
        res = sh.encode_piece(piece, run.view(shard, piece.t0, piece.t1), path, run.options,
                              run.vranges[shard.source], step)
        run.stats.pieces += 1
        run.stats.raw_bytes += res.raw_bytes
        run.stats.compressed_bytes += res.bytes
        self.counters = self.counters.add(raw_done=res.raw_bytes, bytes_out=res.bytes)
        if piece.whole:
            self.shards[shard.index] = run.finish_shard(shard.index)
        else:
            self.results[i] = res

    def run(self) -> dict[int, EncodeDone] | None:
        r = self.r
        t = time.perf_counter()
        while True:
            i = self.next_piece() if self.failure is None else None
            if i is None:
                break
            try:
                self.encode(i)
            except Exception as exc:
                self.failure = Failure(r.where(r.pieces[i].shard), describe(exc))
            self.report()
        if not r.root and self.requested:
            self.wait_for_grant()       # no grant is left in flight
        r.busy(t)
        t = r.stats.lap("encode", t)
        msg = EncodeDone(self.results, self.shards, self.failure, self.counters, r.stats)
        if not r.root:
            self.comm.send(msg, 0)
            self.comm.flush()
            r.stats.lap("wait", t)
            return None
        self.done[0] = msg
        delay = 1e-3
        while len(self.done) < self.comm.size:
            before = len(self.done)
            self.absorb()
            if len(self.done) == before:
                time.sleep(delay)
                delay = min(0.05, delay * 1.5)
        self.bar.update(0, self.counters, force=True)
        self.bar.close()
        r.stats.lap("wait", t)
        return self.done


def _as_list(v: tuple[float, float] | None) -> list[float] | None:
    return list(v) if v is not None else None


def prepare(cfg: PrepareConfig, comm: Comm | None = None) -> PrepareResult:
    """Run ``tezip prepare`` on this rank; see the module docstring. Returns on every
    rank when every rank succeeded (the manifest is written by then); raises
    RankFailure on every rank otherwise."""
    run = _Run(cfg, comm or get_comm())
    try:
        return run.run()
    finally:
        run.close()
