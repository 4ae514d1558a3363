"""Compare tezip with SZ3, ZFP and zstd on every *.npy (T, H, W) stack in a directory.

    python benchmarks/run_classical.py [--data DIR] [--bounds 1e-2,1e-3,1e-4,lossless]
        [--predictors auto,classical,learned] [--codecs sz3,zfp,zstd] [--repeat N]
        [--out-md FILE] [--out-json FILE]

``--predictors`` takes the specs of ``tezip bench --predictors`` (``auto``, ``classical``,
``learned``, ``adapt``, a predictor's name, ``@N`` threads); a ``learned`` row on lossless
floats, which that predictor does not code, is skipped. Prints one markdown table per
bound; failures' tracebacks go to stderr.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from rate_distortion import skip_unsupported  # noqa: E402

from tezip import bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                    "data")),
                    help="directory of *.npy stacks (default: %(default)s)")
    ap.add_argument("--bounds", type=bench.parse_bounds, default=list(bench.DEFAULT_BOUNDS),
                    help="comma-separated fractions of the value range; 'lossless' for "
                         "bit-exact (default: 1e-2,1e-3,1e-4,lossless)")
    ap.add_argument("--predictors", default="auto",
                    help="comma-separated tezip rows: auto, classical, learned, adapt, a "
                         "predictor's name, @N threads (default: auto)")
    ap.add_argument("--codecs", default="sz3,zfp,zstd",
                    help="comma-separated other codecs, from " + ", ".join(bench.FAMILIES)
                    + ", or all (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per measurement; the fastest counts (default: 1)")
    ap.add_argument("--out-md", help="also write the markdown here")
    ap.add_argument("--out-json", help="write all rows as JSON here")
    args = ap.parse_args(argv)

    paths = sorted(glob.glob(os.path.join(args.data, "*.npy")))
    if not paths:
        ap.error(f"no *.npy files in {args.data}")
    predictors = [p.strip() for p in args.predictors.split(",") if p.strip()]

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    codecs = None if args.codecs.strip() == "all" else args.codecs.split(",")
    rows = bench.run(paths, args.bounds, predictors, max(1, args.repeat), progress, codecs)
    elapsed = time.perf_counter() - t0
    for r in rows:
        skip_unsupported(r)

    for r in rows:
        if r.get("error"):
            print(f"\n{r['codec']} failed on {r['dataset']} (bound {r['bound']}):\n"
                  f"{r['error']}", file=sys.stderr)
    md = bench.to_markdown(rows)
    md += f"\n_{len(paths)} data sets, total run time {elapsed:.1f} s._\n"
    print(md)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(md)
    if args.out_json:
        with open(args.out_json, "w") as f:
            f.write(bench.to_json(rows))
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
