"""Threads on a stack of 8 or more windows: tezip classical on one and two threads against
SZ3 3-D, in one `tezip bench` run (issue 13: 2 threads at least 1.7x one thread).

The shared stacks hold 64-72 frames (2-3 windows of 32), too few for windows in parallel
to show, so each is lengthened to 256 frames by playing it forward, backward, forward,
backward (no jump in time at the joins; the statistics of the stack are unchanged):

    python benchmarks/threads_bench.py [--data DIR] [--names ks_pypde,speckle_hcipy]
        [--bounds 1e-3,1e-4] [--repeat 2] [--md benchmarks/results/threads.md]

The long stacks go to a temporary directory and are removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lengthen(x: np.ndarray, frames: int) -> np.ndarray:
    """``x`` played forward and backward in turn until it has ``frames`` frames."""
    parts, n, forward = [], 0, True
    while n < frames:
        part = x if forward else x[::-1]
        parts.append(part[:frames - n])
        n += parts[-1].shape[0]
        forward = not forward
    return np.ascontiguousarray(np.concatenate(parts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                    "data")))
    ap.add_argument("--names", default="ks_pypde,smoke_phiflow,speckle_hcipy")
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--bounds", default="1e-3,1e-4")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results", "threads.md"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in args.names.split(","):
            x = np.load(os.path.join(args.data, f"{name}.npy"))
            path = os.path.join(tmp, f"{name}_{args.frames}.npy")
            np.save(path, lengthen(x, args.frames))
            paths.append(path)
        cmd = ["tezip", "bench", *paths, "--bounds", args.bounds, "--predictors",
               "classical,classical@2", "--codecs", "sz3", "--repeat", str(args.repeat),
               "--md", args.md]
        print(" ".join(cmd), file=sys.stderr)
        return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
