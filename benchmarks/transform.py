"""The wavelet transform coder (format v8) against the classical predictors, SZ3 3-D and
SPERR 3-D: every stack and bound coded by ``--predictor classical``, ``auto`` (the
default, which takes the wavelet where its coding of the first window is estimated under
0.9 times the classical choice's) and ``--predictor wavelet``, one core each, best of
``--repeat`` timings (the bench's own rows: every file decoded and checked against its
bound).

Stacks: the three smooth fields of ``edges.py`` (numpy, no download: ``heat``, ``blobs``,
``grayscott``, the reaction-diffusion run whose ratio SPERR led by 1.9x in issue 13, and
the same run for 160 frames, where the wavelet's windows are lengthened to 129 frames:
``windows.transform_window``) and the shared stacks found in ``--data``.

    python benchmarks/transform.py [--data DIR] [--bounds 1e-2,1e-3,1e-4] [--repeat 3]
        [--md benchmarks/results/transform.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import tezip
from tezip.atomic import atomic_output
from tezip.bench import bench_array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from edges import SHARED, blobs, grayscott, heat  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODECS = ("tezip-classical", "tezip", "tezip-wavelet", "SZ3 3-D", "SPERR 3-D")


def stacks(data: str) -> dict[str, np.ndarray]:
    out = {"heat": heat(), "blobs": blobs(), "grayscott": grayscott(),
           "grayscott-long": grayscott(t=160)}
    for name in SHARED:
        path = os.path.join(data, f"{name}.npy")
        if os.path.exists(path):
            out[name] = np.load(path)
    return out


def _taken(a: np.ndarray, bound: float) -> str:
    """The predictors ``auto`` codes the windows with."""
    with tezip.open(tezip.compress(a, mode="rel", bound=bound)) as f:
        return ", ".join(sorted({f.window_meta(i)["p"] for i in range(f.n_windows)}))


def _speed(row: dict | None) -> str:
    if not row or not row["enc_mbs"]:
        return "-"
    return f"{row['enc_mbs']:.0f} / {row['dec_mbs']:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data"))
    ap.add_argument("--bounds", default="1e-2,1e-3,1e-4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results",
                                                 "transform.md"))
    args = ap.parse_args(argv)
    bounds = [float(b) for b in args.bounds.split(",")]
    t0 = time.perf_counter()
    lines = ["| stack | bound | classical | auto | wavelet | SZ3 3-D | SPERR 3-D | auto took "
             "| auto / classical | auto / best other | enc / dec MB/s: classical | auto "
             "| wavelet | SZ3 |", "|---" * 14 + "|"]
    for name, a in stacks(args.data).items():
        rows = bench_array(name, a, bounds=bounds, predictors=("classical", "auto", "wavelet"),
                           codecs=("sz3", "sperr"), repeat=args.repeat)
        got = {(r["codec"], r["bound"]): r for r in rows}
        for b in bounds:
            r = {c: got.get((c, b)) for c in CODECS}
            bad = [c for c, v in r.items() if v is not None and v["ok"] is False]
            if bad:
                raise SystemExit(f"{name} {b}: bound not kept by {', '.join(bad)}")
            ratio = {c: (v["ratio"] if v and v["ratio"] else None) for c, v in r.items()}
            best = max(v for v in ratio.values() if v)
            cells = [f"**{v:.2f}**" if v == best else (f"{v:.2f}" if v else "-")
                     for v in ratio.values()]
            other = max(ratio[c] or 0 for c in ("SZ3 3-D", "SPERR 3-D"))

            vs = f"{ratio['tezip'] / other:.2f}x" if other else "-"
            lines.append(
                f"| {name} {'x'.join(map(str, a.shape))} {a.dtype} | {b:g} | "
                + " | ".join(cells) + f" | {_taken(a, b)} | "
                f"{ratio['tezip'] / ratio['tezip-classical']:.2f}x | {vs} | "
                + " | ".join(_speed(r[c]) for c in ("tezip-classical", "tezip",
                                                   "tezip-wavelet", "SZ3 3-D")) + " |")
            print(lines[-1], flush=True)
    text = (f"# The wavelet transform coder (format v8)\n\n"
            f"`python benchmarks/transform.py --bounds {args.bounds} --repeat {args.repeat}` "
            f"(tezip {tezip.__version__}), this project's 2-core machine, one core per "
            "codec, best of the repeats. Ratio at the same value-range relative bound "
            "(best in bold); `auto took`: the predictors of auto's windows; speeds in MB/s "
            "of raw data.\n\n" + "\n".join(lines)
            + f"\n\n{time.perf_counter() - t0:.0f} s.\n")
    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as fh:
        fh.write(text)
    print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
