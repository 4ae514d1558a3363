"""How fast the learned predictor decodes, against the estimate that ``auto`` and
``tezip info`` use (``codec.learned_decode_mbps``): every window forced to the shipped
model (``--predictor learned``), one thread, best of ``--repeat`` decodes.

Stacks: the shared stacks found in ``--data`` (float32 ones), Gray-Scott 64 x 128 x 128
(``edges.py``), and ks_pypde's first 16 frames upsampled 4x to 1024 x 1024 (large frames).

    python benchmarks/learned_decode.py [--data DIR] [--bound 1e-3] [--repeat 3]
        [--md benchmarks/results/learned_decode.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import tezip
from tezip import codec
from tezip.atomic import atomic_output
from tezip.learned import registry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from edges import grayscott  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stacks(data: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in ("iris_sji2796", "ks_pypde", "smoke_phiflow"):
        path = os.path.join(data, f"{name}.npy")
        if os.path.exists(path):
            out[name] = np.load(path)
    out["grayscott"] = grayscott()
    if "ks_pypde" in out:
        out["ks_pypde x4"] = np.repeat(np.repeat(out["ks_pypde"][:16], 4, 1), 4, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data"))
    ap.add_argument("--bound", type=float, default=1e-3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results",
                                                 "learned_decode.md"))
    args = ap.parse_args(argv)
    cfg = registry.default().config
    lines = ["| stack | ratio | decode MB/s | ns a value | estimate MB/s |", "|---" * 5 + "|"]
    for name, a in stacks(args.data).items():
        blob = tezip.compress(a, mode="rel", bound=args.bound, predictor="learned", threads=1)
        best = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            y = tezip.decompress(blob, threads=1)
            best = min(best, time.perf_counter() - t)
        span = float(a.max()) - float(a.min())          # (in float64, as the codec does)
        if not np.all(np.abs(y.astype(np.float64) - a) <= args.bound * span):
            raise SystemExit(f"{name}: bound not kept")
        est = codec.learned_decode_mbps(cfg.macs_per_pixel(), 1, a.itemsize,
                                        int(np.prod(a.shape[1:])))
        lines.append(f"| {name} {'x'.join(map(str, a.shape))} | {a.nbytes / len(blob):.2f} | "
                     f"{a.nbytes / best / 1e6:.1f} | {best / a.size * 1e9:.1f} | {est:.1f} |")
        print(lines[-1], flush=True)
    text = ("# The learned predictor's decoding speed\n\n"
            f"`python benchmarks/learned_decode.py --bound {args.bound:g} --repeat "
            f"{args.repeat}` (tezip {tezip.__version__}), the shipped model forced on every "
            "window, rel bound, one thread, best of the repeats, this project's 2-core "
            "machine; the estimate: `codec.learned_decode_mbps` (what `auto`'s decode floor "
            "and `tezip info` use).\n\n" + "\n".join(lines) + "\n")
    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as fh:
        fh.write(text)
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
