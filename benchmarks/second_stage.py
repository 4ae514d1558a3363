"""What the Lorenzo second stage (format v4) changes on the shared stacks: each stack and
bound compressed with ``--predictor classical`` as tezip does it, and again with the
second stage switched off (no fit kept: the format-v3 choice), in one process,
alternating; ratio, the windows' predictors, and per-core encoding and decoding speed
(best of ``--rounds``, one thread). Both files' decoded values are checked against the
bound.

    python benchmarks/second_stage.py [--data DIR] [--bounds 1e-2,1e-3,1e-4] [--rounds 5]
        [--md benchmarks/results/second_stage.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

import numpy as np

import tezip
from tezip.atomic import atomic_output
from tezip.predictors import classical

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STACKS = ("iris_sji2796", "ks_pypde", "smoke_phiflow", "speckle_hcipy")


def _windows(blob: bytes) -> str:
    with tezip.open(blob) as f:
        seen = Counter(f.window_meta(i)["p"] + ("+stage" if "w" in f.window_meta(i)["cfg"]
                                                  else "") for i in range(f.n_windows))
    return ", ".join(f"{k} x{v}" for k, v in sorted(seen.items()))


def _run(a: np.ndarray, bound: float, stage: bool) -> tuple[bytes, float]:
    gain = classical.FIT_GAIN
    classical.FIT_GAIN = gain if stage else 0.0       # 0: no fit is ever kept
    try:
        t = time.perf_counter()
        blob = tezip.compress(a, "rel", bound, predictor="classical", threads=1)
        return blob, time.perf_counter() - t
    finally:
        classical.FIT_GAIN = gain


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                    "data")))
    ap.add_argument("--bounds", default="1e-2,1e-3,1e-4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results",
                                                 "second_stage.md"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    rows = ["| stack | bound | v3 ratio | v4 ratio | v4 / v3 | v4 windows | "
            "enc MB/s v3 / v4 | dec MB/s v3 / v4 |", "|---|---|---|---|---|---|---|---|"]
    for name in STACKS:
        a = np.load(os.path.join(args.data, f"{name}.npy"))
        vr = float(np.nanmax(a)) - float(np.nanmin(a))
        for b in [float(v) for v in args.bounds.split(",")]:
            enc = {False: [], True: []}
            dec = {False: [], True: []}
            blobs = {}
            for r in range(args.rounds):
                for stage in ((False, True) if r % 2 == 0 else (True, False)):
                    blob, te = _run(a, b, stage)
                    t = time.perf_counter()
                    y = tezip.decompress(blob)
                    dec[stage].append(time.perf_counter() - t)
                    enc[stage].append(te)
                    err = np.abs(y.astype(np.float64) - a.astype(np.float64)).max()
                    if not err <= b * vr:
                        raise SystemExit(f"{name} {b}: error {err} past the bound")
                    blobs[stage] = blob
            mb = a.nbytes / 1e6
            r3, r4 = a.nbytes / len(blobs[False]), a.nbytes / len(blobs[True])
            rows.append(f"| {name} | {b:g} | {r3:.3f} | {r4:.3f} | {r4 / r3:.3f} | "
                        f"{_windows(blobs[True])} | {mb / min(enc[False]):.0f} / "
                        f"{mb / min(enc[True]):.0f} | {mb / min(dec[False]):.0f} / "
                        f"{mb / min(dec[True]):.0f} |")
            print(rows[-1], flush=True)
    text = ("# The Lorenzo second stage on the shared stacks\n\n"
            f"`python benchmarks/second_stage.py --rounds {args.rounds}` (one thread, best "
            "of the rounds, v3 = the second stage switched off)\n\n" + "\n".join(rows) + "\n")
    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
