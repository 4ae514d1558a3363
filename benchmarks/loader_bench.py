"""Loader benchmark: samples/s of ``TezShardStream`` over compressed shards against the
same loader over raw ``.npy`` shards, with storage throttled per rank.

The throttle emulates a shared parallel file system: one token bucket per rank (shared
by its DataLoader workers) paces every byte read from the data set directory, e.g. to
4 MB/s, the per-GPU share one published TSUBAME3.0 measurement found for random reads.
Shards reach the workers through node-local staging (``cache_dir``): the first epoch
reads every shard once through the throttle ("cold"), the second reads the local copies
("warm"). "in place" rows read the shard files directly, unthrottled (no staging).

    python benchmarks/loader_bench.py                       # all stacks in ../shared/data
    python benchmarks/loader_bench.py --rates 4,0 --workers 2 --clip 4 --out-md t.md

Both formats use the same shard boundaries, the same loader code and the same sample
order; only the shard files differ. ``--predictor`` (default ``classical``, as in the
published table; ``auto`` adds the learned predictor, ``prednet+interp`` forces it).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch.utils.data import DataLoader

import tezip
from tezip.codec import ArrayStack, Options, compress_stack, value_range
from tezip.data import TezShardStream

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------
# throttled storage


class Throttle:
    """A per-rank byte pacer shared by the rank's worker processes (fork): reads are
    served back to back at ``rate`` bytes/s; ``rate=0`` only counts."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._next = mp.Value("d", 0.0)
        self._bytes = mp.Value("q", 0)

    @property
    def bytes(self) -> int:
        return int(self._bytes.value)

    def take(self, n: int) -> None:
        with self._bytes.get_lock():
            self._bytes.value += n
        if not self.rate:
            return
        with self._next.get_lock():
            now = time.monotonic()
            done = max(now, self._next.value) + n / self.rate
            self._next.value = done
        time.sleep(max(0.0, done - now))

    def __call__(self, path: Path) -> BinaryIO:
        return _ThrottledFile(open(path, "rb"), self)  # noqa: SIM115


class _ThrottledFile:
    def __init__(self, f: BinaryIO, throttle: Throttle) -> None:
        self._f, self._t = f, throttle

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._t.take(len(data))
        return data

    def __enter__(self) -> _ThrottledFile:
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


# ---------------------------------------------------------------------------------------
# data sets


def build(stacks: list[Path], out: Path, shard_frames: int, frames: int, bound: float,
          predictor: str, repeat: int = 1) -> tuple[Path, Path, float]:
    """Two data sets with the same shards: ``out/tez`` and ``out/raw`` (each stack taken
    ``repeat`` times, as if several runs: flipped in time and/or space, so that every
    shard differs and staging, which is content-addressed, cannot share copies); returns
    them and the encode time."""
    roots = {fmt: out / fmt for fmt in ("tez", "raw")}
    entries: dict[str, list] = {"tez": [], "raw": []}
    enc = 0.0
    for r in roots.values():
        r.mkdir(parents=True, exist_ok=True)
    first = 0
    for path, k in [(s, k) for s in stacks for k in range(repeat)]:
        a = np.load(path, mmap_mode="r")[:frames or None]
        a = a[::-1 if k % 2 else 1, ::-1 if k // 2 % 2 else 1, ::1 if k < 4 else -1]
        vr = value_range(ArrayStack(a))
        for t0 in range(0, a.shape[0], shard_frames):
            part = np.ascontiguousarray(a[t0:t0 + shard_frames])
            if part.shape[0] < 2:
                continue
            i = len(entries["tez"])
            for fmt in ("tez", "raw"):
                f = roots[fmt] / f"shard-{i:06d}.{'tez' if fmt == 'tez' else 'npy'}"
                if fmt == "tez":
                    t = time.perf_counter()
                    compress_stack(ArrayStack(part), f, Options(
                        tezip.make_bound("rel", bound), predictor=predictor), force=True,
                        vrange=vr)
                    enc += time.perf_counter() - t
                else:
                    np.save(f, part)
                entries[fmt].append({
                    "file": f.name, "bytes": f.stat().st_size, "sha256": _sha(f),
                    "frames": part.shape[0], "shape": list(part.shape),
                    "dtype": part.dtype.name, "source": path.name, "dataset": None,
                    "source_frames": [t0, t0 + part.shape[0]], "first_frame": first})
            first += part.shape[0]
    for fmt, r in roots.items():
        m = {"format": "tezip-dataset", "version": 1, "created_by": "loader_bench",
             "codec": {"mode": "rel", "bound": bound, "rel_bound": None,
                       "predictor": predictor, "window": 16},
             "model_hash": None, "total_frames": first,
             "total_raw_bytes": sum(e["bytes"] for e in entries["raw"]),
             "total_bytes": sum(e["bytes"] for e in entries[fmt]), "shards": entries[fmt]}
        (r / "manifest.json").write_text(json.dumps(m, indent=1))
    return roots["tez"], roots["raw"], enc


def _sha(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 22):
            h.update(b)
    return h.hexdigest()


def as_list(batch: list) -> list:
    """Collate that keeps samples of different frame shapes apart."""
    return batch


# ---------------------------------------------------------------------------------------
# measurements


def run_epochs(root: Path, args: argparse.Namespace, rate: float | None,
               work: Path) -> list[dict]:
    """One loader, ``args.epochs`` epochs; staging through a throttle unless rate is None
    (then the shards are read in place)."""
    throttle = Throttle(rate * 1e6 if rate else 0.0)
    cache = None
    if rate is not None:
        cache = work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
    stream = TezShardStream(root, args.clip, shuffle=args.shuffle, seed=0, lanes=args.lanes,
                            batch_size=args.batch_size, rank=0, world_size=1,
                            cache_dir=cache, reader=throttle if cache else None)
    loader = DataLoader(stream, batch_size=args.batch_size, num_workers=args.workers,
                        collate_fn=as_list)
    rows = []
    for epoch in range(args.epochs):
        stream.set_epoch(epoch)
        b0, t0, n = throttle.bytes, time.perf_counter(), 0
        for batch in loader:
            n += len(batch)
        dt = time.perf_counter() - t0
        rows.append({"epoch": epoch, "samples": n, "seconds": dt, "samples_s": n / dt,
                     "bytes_read": throttle.bytes - b0 if cache else None})
    return rows


def decode_speed(root: Path, args: argparse.Namespace) -> float:
    """MB of frames out per second of decoding in one process (one worker's speed)."""
    torch.set_num_threads(1)
    s = TezShardStream(root, args.clip, rank=0, world_size=1, lanes=args.lanes)
    for _ in s:
        pass
    return s.stats["decoded_bytes"] / 1e6 / max(s.stats["decode_seconds"], 1e-9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--stacks", default="", help="comma-separated names (default: all)")
    p.add_argument("--frames", type=int, default=0, help="first N frames of each (0: all)")
    p.add_argument("--shard-frames", type=int, default=32)
    p.add_argument("--repeat", type=int, default=4, help="use each stack N times (as runs)")
    p.add_argument("--bound", type=float, default=1e-3, help="fraction of the value range")
    p.add_argument("--predictor", default="classical")
    p.add_argument("--rates", default="4,0", help="MB/s per rank; 0 = unthrottled")
    p.add_argument("--clip", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lanes", type=int, default=16)
    p.add_argument("--shuffle", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--trials", type=int, default=2,
                   help="run every configuration N times and keep the fastest")
    p.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    p.add_argument("--out-md", type=Path)
    p.add_argument("--out-json", type=Path)
    args = p.parse_args(argv)

    names = [s for s in args.stacks.split(",") if s]
    stacks = sorted(args.data.glob("*.npy")) if not names else \
        [args.data / f"{n}.npy" for n in names]
    work = args.work or Path(tempfile.mkdtemp(prefix="loader_bench-"))
    t = time.perf_counter()
    tez_root, raw_root, enc = build(stacks, work / "data", args.shard_frames, args.frames,
                                    args.bound, args.predictor, args.repeat)
    m = {fmt: json.loads((r / "manifest.json").read_text())
         for fmt, r in (("tez", tez_root), ("raw", raw_root))}
    raw_mb, tez_mb = m["raw"]["total_bytes"] / 1e6, m["tez"]["total_bytes"] / 1e6
    print(f"built {len(m['tez']['shards'])} shards from {len(stacks)} stacks in "
          f"{time.perf_counter() - t:.1f} s: raw {raw_mb:.1f} MB, tez {tez_mb:.2f} MB "
          f"(ratio {raw_mb / tez_mb:.2f}), encode {enc:.1f} s", flush=True)
    speed = decode_speed(tez_root, args)
    print(f"decode: {speed:.1f} MB/s per worker (one process, one thread)", flush=True)

    results = []
    rates: list[float | None] = [float(r) for r in args.rates.split(",") if r]
    rates = [r if r else 0.0 for r in rates] + [None]
    for rate in rates:
        for fmt, root in (("raw", raw_root), ("tez", tez_root)):
            best: list[dict] = []
            for trial in range(args.trials):
                for row in run_epochs(root, args, rate, work):
                    row.update(fmt=fmt, rate=rate, trial=trial)
                    print(json.dumps(row), flush=True)
                    e = row["epoch"]
                    if len(best) <= e:
                        best.append(row)
                    elif row["samples_s"] > best[e]["samples_s"]:
                        best[e] = row
            results += best

    lines = [f"Data: {', '.join(s.stem for s in stacks)} (each x{args.repeat}); "
             f"{len(m['tez']['shards'])} shards "
             f"of <= {args.shard_frames} frames; raw {raw_mb:.1f} MB, tez {tez_mb:.2f} MB "
             f"(ratio {raw_mb / tez_mb:.2f}) at rel bound {args.bound:g}, predictor "
             f"{args.predictor}. Loader: 1 rank, {args.workers} workers, clip {args.clip}, "
             f"batch {args.batch_size}, {results[0]['samples']} samples/epoch; best of "
             f"{args.trials} trials. Decode {speed:.1f} MB/s per worker.", "",
             "| storage (per rank) | epoch | raw samples/s | tez samples/s | tez / raw "
             "| raw MB read | tez MB read |", "|---|---|---|---|---|---|---|"]
    for rate in rates:
        for epoch in range(args.epochs):
            r = {row["fmt"]: row for row in results
                 if row["rate"] == rate and row["epoch"] == epoch}
            where = ("in place, unthrottled" if rate is None else
                     f"{rate:g} MB/s + staging" if rate else "unthrottled + staging")
            when = "" if rate is None else (" (cold)" if epoch == 0 else " (warm)")

            def mb(row: dict) -> str:
                return "-" if row["bytes_read"] is None else f"{row['bytes_read'] / 1e6:.2f}"
            lines.append(f"| {where} | {epoch}{when} | {r['raw']['samples_s']:.1f} | "
                         f"{r['tez']['samples_s']:.1f} | "
                         f"{r['tez']['samples_s'] / r['raw']['samples_s']:.2f}x | "
                         f"{mb(r['raw'])} | {mb(r['tez'])} |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.out_md:
        args.out_md.write_text(table + "\n")
    if args.out_json:
        args.out_json.write_text(json.dumps({"decode_mb_s": speed, "rows": results}, indent=1))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(math.isfinite(r["samples_s"]) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
