"""What joining a short last window to the one before it changes
(``windows.coded_windows``): every stack is cut to lengths whose last window of 33
frames is short (a tail of 2-16 frames, joined) or not (31 and 33 frames, left alone),
and compressed with ``--predictor classical`` as windows are now planned and as they were
(``fixed_windows``: the tail a window of its own). Sizes, ratio of the two, and encoding
and decoding time of each (one thread, best of ``--repeat``). Every file is decoded and
checked against the bound.

Stacks: the shared ones where present (``--data``) and the three smooth fields of
``benchmarks/edges.py`` (generated with numpy).

    python benchmarks/tails.py [--data DIR] [--bounds 1e-2,1e-3,1e-4] [--repeat 3]
        [--md benchmarks/results/tails.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import tezip
import tezip.codec
from tezip.atomic import atomic_output
from tezip.windows import coded_windows, fixed_windows

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from edges import stacks  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAILS = (2, 6, 16, 31, 33)      # frames after the first window of 33


def _code(a: np.ndarray, bound: float, plan, repeat: int) -> tuple[int, float, float]:
    """Bytes, best encoding and decoding seconds with the window planner ``plan``."""
    tezip.codec.coded_windows = plan
    try:
        te, td = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            blob = tezip.compress(a, mode="rel", bound=bound, predictor="classical",
                                  threads=1)
            te.append(time.perf_counter() - t)
            t = time.perf_counter()
            d = tezip.decompress(blob, threads=1)
            td.append(time.perf_counter() - t)
    finally:
        tezip.codec.coded_windows = coded_windows
    lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
    if not np.max(np.abs(d.astype(np.float64) - a)) <= bound * (hi - lo):
        raise SystemExit(f"bound violated: bound {bound}, {a.shape[0]} frames")
    return len(blob), min(te), min(td)


def _fixed(n_frames: int, length: int, frame_values: int = 1) -> list[tuple[int, int]]:
    return fixed_windows(n_frames, length)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data"))
    ap.add_argument("--bounds", default="1e-2,1e-3,1e-4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results", "tails.md"))
    args = ap.parse_args(argv)
    bounds = [float(b) for b in args.bounds.split(",")]
    t0 = time.perf_counter()
    lines = ["| stack | frames | windows now | bound | bytes before | bytes now | now / before "
             "| enc ms before / now | dec ms before / now |", "|---" * 9 + "|"]
    for name, full in stacks(args.data).items():
        lengths = [33 + k for k in TAILS if 33 + k <= full.shape[0]]
        if full.shape[0] not in lengths:
            lengths.append(full.shape[0])
        for n in lengths:
            a = np.ascontiguousarray(full[:n])
            plan = coded_windows(n, 33, a[0].size)
            for b in bounds:
                sb, eb, db = _code(a, b, _fixed, args.repeat)
                sn, en, dn = _code(a, b, coded_windows, args.repeat)
                lines.append(f"| {name} | {n} | {'+'.join(str(y - x) for x, y in plan)} | "
                             f"{b:g} | {sb} | {sn} | {sn / sb:.3f} | {eb * 1e3:.1f} / "
                             f"{en * 1e3:.1f} | {db * 1e3:.1f} / {dn * 1e3:.1f} |")
                print(lines[-1], flush=True)
    text = (f"# A short last window joined to the one before\n\n"
            f"`python benchmarks/tails.py --bounds {args.bounds} --repeat {args.repeat}` "
            f"(tezip {tezip.__version__}): `--predictor classical`, windows of 33 frames, "
            "each stack cut to several lengths; before: the last window on its own "
            "(`fixed_windows`), now: a last window of fewer than 17 frames joined to the "
            "one before (`coded_windows`). One thread, best of the repeats; every file "
            "checked against the bound.\n\n" + "\n".join(lines)
            + f"\n\n{time.perf_counter() - t0:.0f} s.\n")
    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as fh:
        fh.write(text)
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
