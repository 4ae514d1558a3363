"""The one aggregated progress line of ``tezip prepare`` (printed by rank 0)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Counters:
    """What one rank has done so far. Reused shards count in frames, MB in and MB out
    (so the line adds up to the data set) but not in the encoding speed."""

    frames: int = 0
    raw_in: int = 0          # raw bytes read and encoded, plus those of reused shards
    raw_done: int = 0        # raw bytes of finished pieces and reused shards
    bytes_out: int = 0       # compressed bytes of finished pieces and reused shards
    raw_reused: int = 0      # raw bytes of reused shards (not encoded this run)

    def add(self, frames: int = 0, raw_in: int = 0, raw_done: int = 0, bytes_out: int = 0,
            raw_reused: int = 0) -> Counters:
        return Counters(self.frames + frames, self.raw_in + raw_in, self.raw_done + raw_done,
                        self.bytes_out + bytes_out, self.raw_reused + raw_reused)


class ProgressLine:
    """A carriage-return line on a terminal, a plain line every 15 s otherwise (batch
    logs), nothing when disabled."""

    def __init__(self, enabled: bool, total_frames: int, ranks: int) -> None:
        tty = sys.stderr.isatty() or bool(os.environ.get("TEZIP_PROGRESS"))
        self.mode = "off" if not enabled else ("tty" if tty else "log")
        self.interval = 0.5 if self.mode == "tty" else 15.0
        self.total = total_frames
        self.ranks = ranks
        self.t_start = time.perf_counter()
        self.last = self.t_start
        self.state: dict[int, Counters] = {}
        self.width = 0

    def line(self, now: float) -> str:
        c = list(self.state.values())
        frames = sum(x.frames for x in c)
        raw = sum(x.raw_in for x in c)
        encoded = raw - sum(x.raw_reused for x in c)
        done_raw = sum(x.raw_done for x in c)
        out = sum(x.bytes_out for x in c)
        ratio = f"{done_raw / out:.2f}" if out else "-"
        dt = max(1e-9, now - self.t_start)
        return (f"prepare: {frames}/{self.total} frames, {raw / 1e6:.1f} MB in, "
                f"{out / 1e6:.1f} MB out, ratio {ratio}, {encoded / 1e6 / dt:.1f} MB/s "
                f"({self.ranks} rank{'s' if self.ranks > 1 else ''})")

    def update(self, rank: int, counters: Counters, force: bool = False) -> None:
        self.state[rank] = counters
        now = time.perf_counter()
        if self.mode == "off" or (now - self.last < self.interval
                                  and not (force and self.mode == "tty")):
            return
        self.last = now
        text = self.line(now)
        if self.mode == "tty":
            sys.stderr.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.mode == "tty" and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()
            self.width = 0
