"""Loader benchmark: samples/s of ``TezShardStream`` over tezip shards, over lossless
blosc2/zstd shards (what a careful user would do without tezip) and over raw ``.npy``
shards, with 1 and 2 ranks and storage throttled per rank.

    python benchmarks/loader_bench.py            # results/loader.{md,json}, ~5 min here
    python benchmarks/loader_bench.py --quick    # a smoke run of a minute

The throttle emulates a shared parallel file system: one token bucket per rank (shared by
its DataLoader workers) paces every byte read from the data set directory, e.g. 4 MB/s,
the per-GPU share of 9 GB/s over 2,160 GPUs. Shards reach the workers through node-local
staging (``cache_dir``, one directory shared by the ranks, as on one node): epoch 0 reads
every shard once through the throttles ("cold"), epoch 1 the local copies ("warm").
"in place" reads the shard files directly, unthrottled.

Ranks are processes started together (``world_size`` ranks of one stream, each with its
own DataLoader and workers); with 2 cores here, 1 rank x 2 workers and 2 ranks x 1
worker. A configuration's samples/s is all ranks' samples over the slowest rank's time.
All three formats use the same shard boundaries, loader code and sample order; only the
shard files differ. ``--predictor`` (default ``classical``).

Also measured, for ``scale_model.py``: each format's ratio and its per-core rate (one
process decoding every window, one thread), and a 1-worker unthrottled run (the rate one
loader worker sustains, IPC to the main process included).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch.utils.data import DataLoader

import tezip
from tezip.codec import ArrayStack, Options, compress_stack, value_range
from tezip.dataset import manifest
from tezip.dataset.readers import write_blosc2
from tezip.dataset.torch import TezShardStream
from tezip.io import atomic_output

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
FORMATS = ("raw", "blosc2", "tez")
SUFFIX = {"raw": "npy", "blosc2": "b2nd", "tez": "tez"}


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

    def __exit__(self, *exc: object) -> None:
        self._f.close()


# ---------------------------------------------------------------------------------------
# data sets


def _b2_filter(part: np.ndarray, window: int, tmp: Path) -> str:
    """The blosc2 filter (byte or bit shuffle) that compresses this data better: what a
    careful user would pick."""
    sizes = {}
    for f in ("shuffle", "bitshuffle"):
        write_blosc2(tmp, part, window, filters=f)
        sizes[f] = tmp.stat().st_size
    tmp.unlink()
    return min(sizes, key=lambda k: sizes[k])


def build(stacks: list[Path], out: Path, args: argparse.Namespace) -> dict[str, Path]:
    """Three data sets with the same shards: ``out/{raw,blosc2,tez}`` (each stack taken
    ``repeat`` times, flipped in time and/or space so that every shard differs and
    content-addressed staging cannot share copies)."""
    roots = {fmt: out / fmt for fmt in FORMATS}
    entries: dict[str, list] = {fmt: [] for fmt in FORMATS}
    for r in roots.values():
        r.mkdir(parents=True, exist_ok=True)
    opts = Options(tezip.make_bound("rel", args.bound), predictor=args.predictor)
    for path, k in [(s, k) for s in stacks for k in range(args.repeat)]:
        a = np.load(path, mmap_mode="r")[:args.frames or None]
        a = a[::-1 if k % 2 else 1, ::-1 if k // 2 % 2 else 1, ::1 if k < 4 else -1]
        vr = value_range(ArrayStack(a))
        filt = _b2_filter(np.ascontiguousarray(a[:args.shard_frames]), args.window,
                          out / "probe.b2nd")
        for t0 in range(0, a.shape[0], args.shard_frames):
            part = np.ascontiguousarray(a[t0:t0 + args.shard_frames])
            if part.shape[0] < 2:
                continue
            i = len(entries["tez"])
            for fmt in FORMATS:
                f = roots[fmt] / f"shard-{i:06d}.{SUFFIX[fmt]}"
                if fmt == "tez":
                    compress_stack(ArrayStack(part), f, opts, force=True, vrange=vr)
                elif fmt == "raw":
                    np.save(f, part)
                else:
                    write_blosc2(f, part, args.window, filters=filt)
                entries[fmt].append({
                    "file": f.name, "bytes": f.stat().st_size, "sha256": manifest.sha256_file(f),
                    "frames": part.shape[0], "shape": list(part.shape),
                    "dtype": part.dtype.name, "source": str(path), "dataset": None,
                    "source_frames": [t0, t0 + part.shape[0]]})
    for fmt, r in roots.items():
        codec = {"window": args.window}
        if fmt == "tez":
            codec.update(mode="rel", bound=args.bound, predictor=args.predictor)
        manifest.write(r, manifest.build(codec, entries[fmt]))
    return roots


# ---------------------------------------------------------------------------------------
# measurements


def as_list(batch: list) -> list:
    """Collate that keeps samples of different frame shapes apart."""
    return batch


def _stream(root: Path, args: argparse.Namespace, rank: int, world: int,
            **kw: Any) -> TezShardStream:
    return TezShardStream(root, args.clip, shuffle=args.shuffle, seed=0, lanes=args.lanes,
                          unit=args.unit, batch_size=args.batch_size, rank=rank,
                          world_size=world, group_by_shape=False, **kw)


def _rank_main(rank: int, world: int, workers: int, root: str, args: argparse.Namespace,
               rate: float | None, cache: str | None, barrier: Any, q: Any) -> None:
    torch.set_num_threads(1)
    throttle = Throttle(rate * 1e6 if rate else 0.0)
    stream = _stream(Path(root), args, rank, world, cache_dir=cache,
                     reader=throttle if cache else None)
    loader = DataLoader(stream, batch_size=args.batch_size, num_workers=workers,
                        collate_fn=as_list)
    for epoch in range(args.epochs):
        stream.set_epoch(epoch)
        barrier.wait()
        b0, t0, n = throttle.bytes, time.perf_counter(), 0
        cpu0, kids0 = time.process_time(), _children_cpu()
        for batch in loader:
            n += len(batch)
        dt = time.perf_counter() - t0
        # CPU seconds of this rank's main process and of its workers (reaped when the
        # epoch's iterator ends)
        q.put({"rank": rank, "epoch": epoch, "samples": n, "seconds": dt,
               "cpu_main": time.process_time() - cpu0, "cpu_workers": _children_cpu() - kids0,
               "bytes_read": throttle.bytes - b0 if cache else None})
    # a short warm epoch, the last two batches of each worker of the last epoch: an
    # epoch's fixed cost (starting workers, the first batch), for scale_model.py
    total = stream.num_samples()
    stream.set_epoch(args.epochs - 1, start=max(0, total - 2 * args.batch_size * world
                                                * max(1, workers)))
    barrier.wait()
    t0, n = time.perf_counter(), 0
    for batch in loader:
        n += len(batch)
    q.put({"rank": rank, "epoch": "short", "samples": n, "seconds": time.perf_counter() - t0})


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_config(root: Path, args: argparse.Namespace, ranks: int, workers: int,
               rate: float | None, work: Path) -> list[dict]:
    """One configuration, ``args.epochs`` epochs; returns one row per epoch."""
    cache = None
    if rate is not None:
        cache = work / "cache"
        shutil.rmtree(cache, ignore_errors=True)
    ctx = mp.get_context("fork")
    barrier, q = ctx.Barrier(ranks), ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, ranks, workers, str(root), args, rate,
                                                  None if cache is None else str(cache),
                                                  barrier, q)) for r in range(ranks)]
    for p in procs:
        p.start()
    got = [q.get(timeout=3600) for _ in range(ranks * (args.epochs + 1))]
    for p in procs:
        p.join()
        if p.exitcode:
            sys.exit(f"a rank failed (exit {p.exitcode})")
    rows = []
    for epoch in range(args.epochs):
        mine = [g for g in got if g["epoch"] == epoch]
        n = sum(g["samples"] for g in mine)
        dt = max(g["seconds"] for g in mine)
        rb = [g["bytes_read"] for g in mine]
        rows.append({"epoch": epoch, "samples": n, "seconds": dt, "samples_s": n / dt,
                     "cpu_main": sum(g["cpu_main"] for g in mine),
                     "cpu_workers": sum(g["cpu_workers"] for g in mine),
                     "per_rank_seconds": [g["seconds"] for g in sorted(mine,
                                                                      key=lambda g: g["rank"])],
                     "bytes_read": None if rb[0] is None else sum(rb)})
    short = [g for g in got if g["epoch"] == "short"]
    rows[-1].update(short_samples=sum(g["samples"] for g in short),
                    short_seconds=max(g["seconds"] for g in short))
    return rows


def decode_speed(root: Path, args: argparse.Namespace) -> float:
    """MB of frames per second of decoding in one process, one thread (windows only)."""
    torch.set_num_threads(1)
    s = _stream(root, args, 0, 1)
    for _ in s:
        pass
    return s.stats["decoded_bytes"] / 1e6 / max(s.stats["decode_seconds"], 1e-9)


def sample_bytes(root: Path, args: argparse.Namespace) -> float:
    """Mean raw bytes of one sample."""
    s = _stream(root, args, 0, 1)
    per = [np.prod(sh.shape[1:]) * np.dtype(sh.dtype).itemsize * (args.clip or 1)
           for sh in s.manifest.shards]
    return float(np.dot(s.samples.counts, per) / s.samples.n)


def first_use(roots: dict[str, Path], args: argparse.Namespace, ranks: int,
              workers: int) -> dict[str, list[list[list[int]]]]:
    """For each format and rank: at which sample of the rank's sequence (the DataLoader's
    order: batches from the workers in turn) each shard is first needed, and the bytes
    staged by then: [[k, ...], [cumulative bytes, ...]] (for scale_model.py's cold
    epochs)."""
    out: dict[str, list[list[list[int]]]] = {}
    for fmt, root in roots.items():
        s = _stream(root, args, 0, ranks)
        sizes = np.array([sh.bytes for sh in s.manifest.shards], np.int64)
        per_rank = []
        for r in range(ranks):
            parts = [s.consumer_order(r, w, workers, epoch=0) for w in range(workers)]
            seq, pos, k = [], [0] * workers, 0
            while any(p < len(x) for p, x in zip(pos, parts, strict=True)):
                w = k % workers
                seq.append(parts[w][pos[w]:pos[w] + args.batch_size])
                pos[w] += args.batch_size
                k += 1
            shard = s.samples.locate(np.concatenate(seq))[0]
            uniq, first = np.unique(shard, return_index=True)
            order = np.argsort(first)
            per_rank.append([first[order].tolist(),
                             np.cumsum(sizes[uniq[order]]).tolist()])
        out[fmt] = per_rank
    return out


def machine_ceiling(n: int = 2, trials: int = 3) -> float:
    """How much faster n copies of a pure CPU loop finish than one after another, now."""
    code = ("import time\nt = time.perf_counter()\nx = 0\nfor i in range(4_000_000):\n"
            "    x += i * i\nprint(time.perf_counter() - t)")
    import subprocess

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                text=True)
    solo, together = [], []
    for _ in range(trials):
        solo.append(float(start().communicate()[0]))
        procs = [start() for _ in range(n)]
        together.append(max(float(p.communicate()[0]) for p in procs))
    return n * min(solo) / min(together)


# ---------------------------------------------------------------------------------------
# report


def table(results: list[dict], meta: dict) -> str:
    lines = [
        f"Data: {meta['data']}; {meta['shards']} shards of <= {meta['shard_frames']} frames; "
        f"raw {meta['mb']['raw']:.1f} MB, blosc2/zstd {meta['mb']['blosc2']:.1f} MB (ratio "
        f"{meta['ratio']['blosc2']:.2f}), tez {meta['mb']['tez']:.2f} MB (ratio "
        f"{meta['ratio']['tez']:.2f}) at rel bound {meta['bound']:g}, predictor "
        f"{meta['predictor']}. Loader: clip {meta['clip']}, batch {meta['batch_size']}, "
        f"lanes {meta['lanes']}, shuffle {meta['shuffle']} (unit {meta['unit']}), "
        f"{meta['samples']} samples per "
        f"epoch; best of {meta['trials']} trials. Per-core rate (one process, windows "
        f"only): raw {meta['decode']['raw']:.0f}, blosc2 {meta['decode']['blosc2']:.0f}, "
        f"tez {meta['decode']['tez']:.1f} MB/s. Load average before: {meta['load']}; two "
        f"copies of a CPU loop ran {meta['ceiling']:.2f}x faster than one after another.",
        "",
        "| ranks x workers | storage (per rank) | epoch | raw samples/s | blosc2 samples/s "
        "| tez samples/s | tez / raw | tez / blosc2 | MB read raw / blosc2 / tez |",
        "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["ranks"], r["workers"], -1 if r["rate"] is None else r["rate"])
                   for r in results}, key=lambda k: (k[0], -k[1], -k[2] if k[2] > 0 else
                                                     (1e9 if k[2] == 0 else 2e9)))
    for ranks, workers, rate in keys:
        for epoch in range(meta["epochs"]):
            sel = {r["fmt"]: r for r in results if (r["ranks"], r["workers"]) ==
                   (ranks, workers) and (-1 if r["rate"] is None else r["rate"]) == rate
                   and r["epoch"] == epoch}
            if len(sel) < 3:
                continue
            where = ("in place, unthrottled" if rate == -1 else
                     f"{rate:g} MB/s + staging" if rate else "unthrottled + staging")
            when = "" if rate == -1 else (" (cold)" if epoch == 0 else " (warm)")

            def mb(row: dict) -> str:
                return "-" if row["bytes_read"] is None else f"{row['bytes_read'] / 1e6:.1f}"
            raw, b2, tez = (sel[f]["samples_s"] for f in FORMATS)
            lines.append(f"| {ranks} x {workers} | {where} | {epoch}{when} | {raw:.1f} | "
                         f"{b2:.1f} | {tez:.1f} | {tez / raw:.2f}x | {tez / b2:.2f}x | "
                         f"{' / '.join(mb(sel[f]) for f in FORMATS)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    p.add_argument("--stacks", default="", help="comma-separated names (default: all)")
    p.add_argument("--frames", type=int, default=0, help="first N frames of each (0: all)")
    p.add_argument("--shard-frames", type=int, default=32)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--repeat", type=int, default=4, help="use each stack N times (as runs)")
    p.add_argument("--bound", type=float, default=1e-3, help="fraction of the value range")
    p.add_argument("--predictor", default="classical")
    p.add_argument("--rates", default="4,0", help="MB/s per rank; 0 = unthrottled")
    p.add_argument("--layouts", default="1x2,2x1,1x1",
                   help="ranks x workers; 1x1 runs unthrottled only (per-worker rate)")
    p.add_argument("--clip", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lanes", type=int, default=16)
    p.add_argument("--shuffle", type=int, default=64)
    p.add_argument("--unit", default="window", choices=["window", "shard"],
                   help="shuffle unit of the stream (window: mixed over the data set)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--trials", type=int, default=2,
                   help="run every configuration N times and keep the fastest")
    p.add_argument("--quick", action="store_true", help="small data, one trial (smoke run)")
    p.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    p.add_argument("--out", type=Path, default=RESULTS / "loader",
                   help="writes OUT.md and OUT.json")
    args = p.parse_args(argv)
    if args.quick:
        args.frames, args.repeat, args.trials = args.frames or 32, min(args.repeat, 2), 1

    names = [s for s in args.stacks.split(",") if s]
    stacks = sorted(args.data.glob("*.npy")) if not names else \
        [args.data / f"{n}.npy" for n in names]
    work = args.work or Path(tempfile.mkdtemp(prefix="loader_bench-"))
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    t = time.perf_counter()
    roots = build(stacks, work / "data", args)
    m = {fmt: json.loads((r / "manifest.json").read_text()) for fmt, r in roots.items()}
    mb = {fmt: m[fmt]["total_bytes"] / 1e6 for fmt in FORMATS}
    print(f"built {len(m['tez']['shards'])} shards in {time.perf_counter() - t:.1f} s: "
          + ", ".join(f"{f} {mb[f]:.1f} MB" for f in FORMATS), flush=True)
    speed = {fmt: decode_speed(roots[fmt], args) for fmt in FORMATS}
    print("per-core rate: " + ", ".join(f"{f} {speed[f]:.1f} MB/s" for f in FORMATS),
          flush=True)
    ceiling = machine_ceiling()

    results = []
    rates: list[float | None] = [float(r) for r in args.rates.split(",") if r]
    configs = []
    for lay in args.layouts.split(","):
        ranks, workers = (int(v) for v in lay.split("x"))
        for rate in ([0.0] if (ranks, workers) == (1, 1) else [*rates, None]):
            configs.append((ranks, workers, rate))
    best: dict[tuple, dict] = {}
    for trial in range(args.trials):         # interleaved: a busy spell hits every format
        for ranks, workers, rate in configs:
            for fmt in FORMATS:
                for row in run_config(roots[fmt], args, ranks, workers, rate, work):
                    row.update(fmt=fmt, rate=rate, ranks=ranks, workers=workers, trial=trial)
                    print(json.dumps(row), flush=True)
                    key = (fmt, ranks, workers, rate, row["epoch"])
                    if key not in best or row["samples_s"] > best[key]["samples_s"]:
                        best[key] = row
    results = list(best.values())
    raw_bytes = m["raw"]["total_raw_bytes"]
    meta = {"data": ", ".join(f"{s.stem} x{args.repeat}" for s in stacks),
            "shards": len(m["tez"]["shards"]), "shard_frames": args.shard_frames,
            "mb": mb, "ratio": {f: raw_bytes / m[f]["total_bytes"] for f in FORMATS},
            "bound": args.bound, "predictor": args.predictor, "clip": args.clip,
            "batch_size": args.batch_size, "lanes": args.lanes, "shuffle": args.shuffle,
            "unit": args.unit,
            "samples": results[0]["samples"], "epochs": args.epochs, "trials": args.trials,
            "decode": speed, "load": load, "ceiling": ceiling,
            "raw_bytes_per_sample": sample_bytes(roots["raw"], args),
            "first_use": {f"{r}x{w}": first_use(roots, args, r, w)
                          for r, w, _ in {(c[0], c[1], 0) for c in configs}},
            "raw_bytes": raw_bytes, "cores": os.cpu_count(),
            "command": "python benchmarks/loader_bench.py " + " ".join(argv or sys.argv[1:])}
    md = table(results, meta)
    print("\n" + md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(args.out.with_suffix(".md"), force=True) as tmp:
        Path(tmp).write_text(md + "\n")
    with atomic_output(args.out.with_suffix(".json"), force=True) as tmp:
        Path(tmp).write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(math.isfinite(r["samples_s"]) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
