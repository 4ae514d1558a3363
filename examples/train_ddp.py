"""Data-parallel training that reads a tezip data set directly (decoding in the loader).

A tiny convolutional net learns to predict the last frame of a clip from the frames
before it. Runs on CPU with the gloo backend; one process without torchrun.

    tezip prepare run1.npy run2.npy --out dataset_dir --mode rel --bound 1e-3
    torchrun --nproc-per-node 2 examples/train_ddp.py --data dataset_dir --epochs 1
    torchrun --nproc-per-node 2 examples/train_ddp.py --data dataset_dir --map   # map-style
    torchrun --nproc-per-node 2 examples/train_ddp.py --raw run1.npy             # raw baseline

``--data`` streams with ``TezShardStream`` (whole shards per rank and worker, shuffle
buffer, equal batches on every rank); ``--map`` uses ``TezDataset`` with a
``DistributedSampler``; ``--raw`` reads an uncompressed ``.npy`` stack the same way
``--map`` does, for comparison. Every epoch rank 0 prints the loss and samples/s over all
ranks.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class RawClips(Dataset):
    """Clips of consecutive frames of one ``.npy`` stack (T, H, W[, C]), scaled to
    [0, 1] by ``(lo, hi)``; the file is memory-mapped in each process."""

    def __init__(self, path: str, clip: int, stride: int, lo: float, hi: float) -> None:
        self.path, self.clip, self.stride, self.lo, self.hi = path, clip, stride, lo, hi
        a = np.load(path, mmap_mode="r")
        if a.ndim not in (3, 4) or a.shape[0] < clip:
            raise SystemExit(f"{path}: need a stack (T, H, W[, C]) of at least {clip} frames")
        self.n = (a.shape[0] - clip) // stride + 1
        self._a: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> torch.Tensor:
        if self._a is None:
            self._a = np.load(self.path, mmap_mode="r")
        x = np.array(self._a[k * self.stride:k * self.stride + self.clip], np.float32)
        return torch.from_numpy((x - self.lo) / max(self.hi - self.lo, 1e-30))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_a": None}


class NextFrame(nn.Module):
    """(B, clip - 1 frames x C channels, H, W) -> the next frame's C channels."""

    def __init__(self, frames_in: int, channels: int, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(frames_in * channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, channels, 3, padding=1))
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, -self.channels:] + self.net(x)   # residual on the last frame


def as_channels(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(B, T, H, W[, C]) -> (B, T * C, H, W) and C."""
    if x.dim() == 4:
        return x, 1
    b, t, h, w, c = x.shape
    return x.permute(0, 1, 4, 2, 3).reshape(b, t * c, h, w), c


def setup() -> tuple[int, int]:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", type=Path, help="a data set directory (tezip prepare)")
    src.add_argument("--raw", type=Path, nargs="+",
                     help="uncompressed .npy stacks (same frame shape), for comparison")
    p.add_argument("--map", action="store_true",
                   help="with --data: map-style TezDataset + DistributedSampler")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--clip", type=int, default=4, help="frames per sample (>= 2)")
    p.add_argument("--stride", type=int, default=None, help="frames between clips")
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--shuffle", type=int, default=256, help="shuffle buffer (stream)")
    p.add_argument("--lanes", type=int, default=128, help="lanes of the stream order")
    p.add_argument("--cache-dir", type=Path, help="node-local staging directory")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0, help="stop an epoch early (0: no)")
    args = p.parse_args()
    if args.clip < 2:
        p.error("--clip must be at least 2 (input frames + the frame to predict)")

    rank, world = setup()
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    sampler = None
    if args.raw is not None:
        arrays = [np.load(f, mmap_mode="r") for f in args.raw]
        lo = min(float(np.nanmin(a)) for a in arrays)   # one range for all, like
        hi = max(float(np.nanmax(a)) for a in arrays)   # tezip's normalize=True
        ds = torch.utils.data.ConcatDataset(
            [RawClips(str(f), args.clip, args.stride or args.clip, lo, hi) for f in args.raw])
        what = f"raw {', '.join(f.name for f in args.raw)}"
    else:
        from tezip.data import TezDataset, TezShardStream
        common = {"stride": args.stride, "normalize": True, "cache_dir": args.cache_dir}
        if args.map:
            ds = TezDataset(args.data, args.clip, **common)
            what = f"tezip map-style {args.data.name}"
        else:
            ds = TezShardStream(args.data, args.clip, shuffle=args.shuffle, seed=args.seed,
                                lanes=args.lanes, batch_size=args.batch_size, rank=rank,
                                world_size=world, **common)
            what = f"tezip stream {args.data.name}"
    if not isinstance(ds, torch.utils.data.IterableDataset):
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                     seed=args.seed)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers)

    first = next(iter(DataLoader(ds, batch_size=1, sampler=sampler)))
    x0, channels = as_channels(first)
    model: nn.Module = NextFrame(args.clip - 1, channels)
    if world > 1:
        model = DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    if rank == 0:
        print(f"{what}: {world} rank(s) x {args.workers} worker(s), {len(ds)} samples per "
              f"{'rank' if sampler is None else 'epoch'}, sample {tuple(first.shape[1:])}",
              flush=True)

    for epoch in range(args.epochs):
        (sampler or ds).set_epoch(epoch)
        t0 = time.perf_counter()
        seen, loss_sum, steps = 0, 0.0, 0
        for batch in loader:
            x, _ = as_channels(batch)
            inp, target = x[:, :-channels], x[:, -channels:]
            loss = nn.functional.mse_loss(model(inp), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += batch.shape[0]
            loss_sum += loss.item()
            steps += 1
            if args.max_steps and steps >= args.max_steps:
                break   # every rank stops at the same step
        stats = torch.tensor([seen, loss_sum, steps], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(stats)
        dt = time.perf_counter() - t0
        if rank == 0:
            n, ls, st = stats.tolist()
            print(f"epoch {epoch}: loss {ls / max(st, 1):.3e}, {int(n)} samples in {dt:.2f} s, "
                  f"{n / dt:.1f} samples/s", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
