"""The encode phase of ``tezip prepare`` on one rank: pieces handed to ranks as they
become free. Every rank starts with two pieces (largest first) and asks rank 0 for the
next when it starts its last; rank 0 answers between windows of its own work, collects
progress for the progress line and each rank's final report."""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..codec import Tuning, tune_stack
from . import shards as sh
from .messages import (
    EncodeDone,
    Failure,
    ProgressMsg,
    ShardDone,
    WorkGrant,
    WorkRequest,
    describe,
)
from .plan import assign
from .progress import Counters, ProgressLine

if TYPE_CHECKING:
    from .prepare import Run

LOOKAHEAD = 2          # pieces a rank holds (the one it encodes and the next)


class Encoder:
    """The encode phase on one rank: pieces handed out as ranks become free."""

    def __init__(self, run: Run, reuse: dict[int, dict[str, Any]]) -> None:
        self.r = run
        comm = run.comm
        self.comm = comm
        self.counters = Counters()
        self.results: dict[int, sh.PieceResult] = {}
        self.shards: dict[int, ShardDone] = {}
        self.failure: Failure | None = None
        # shards kept: reused ones whose value range is still the one they were written with
        self.kept = {s for s, old in reuse.items()
                     if old.get("vrange") == _as_list(run.vranges[run.shards[s].source])
                     and old.get("integral", False) == run.integral[run.shards[s].source]}
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
        first = LOOKAHEAD * comm.size
        self.mine: deque[int] = deque(self.queue[comm.rank:first:comm.size])
        self.next = min(first, len(self.queue))          # rank 0's pointer
        self.bar = ProgressLine(run.cfg.progress and run.root,
                                sum(s.frames for s in run.shards), comm.size)
        self.done: dict[int, EncodeDone] = {}             # rank 0: by rank
        self.requested = False
        self.exhausted = False
        self.last_send = 0.0
        self.tunings: dict[int, Tuning] = {}              # by shard, for its pieces

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
        tuning = None
        if not piece.whole:     # tuned on the shard's first window, as the whole shard is
            tuning = self.tunings.get(shard.index)
            if tuning is None:
                tuning = tune_stack(run.view(shard, shard.t0, shard.t1), run.options,
                                    run.vranges[shard.source], run.integral[shard.source])
                self.tunings[shard.index] = tuning
        res = sh.encode_piece(piece, run.view(shard, piece.t0, piece.t1), path, run.options,
                              run.vranges[shard.source], step, tuning,
                              run.integral[shard.source])
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
