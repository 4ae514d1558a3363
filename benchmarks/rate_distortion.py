"""Rate-distortion run: tezip's predictors against every codec installed, over many bounds.

    python benchmarks/rate_distortion.py [--data DIR] [--bounds 1e-2,3e-3,1e-3,3e-4,1e-4,lossless]
        [--predictors classical,learned,auto] [--repeat 1] [--codecs all]
        [--out DIR] [--name rate_distortion] [--replot]

Measures every ``*.npy`` (T, H, W) stack in ``--data`` (default: ``$TEZIP_DATA``, else the
shared data folder next to the checkout) in one process and writes ``OUT/NAME.md`` (tables,
codec versions), ``OUT/NAME.json`` (every row) and ``OUT/NAME.png`` (ratio vs PSNR and vs
bound per data set). ``--predictors`` takes the specs of ``tezip bench --predictors``:
``classical`` (interp, lorenzo or spatial, picked on the first window), ``learned`` (the
shipped model on every window), ``auto`` (the default: classical or learned, picked per window),
``adapt`` (auto with the model fitted to each stack for 30 s; slow), a predictor's name,
a suffix ``@N`` for N threads. A ``learned`` row the predictor cannot take (lossless
floats) is skipped, not failed. Progress goes to stderr. Exit status 1 if any codec broke
its bound or was not bit-exact where it should be.

The README's table and plot (``results/bench.md``, ``results/rd.png``) come from
``tezip bench --plot`` instead, hence the default name here; ``results/rd.{md,json}`` are
this script's last run, on format v1.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tezip import bench  # noqa: E402

DEFAULT_BOUNDS = "1e-2,3e-3,1e-3,3e-4,1e-4,lossless"
DEFAULT_PREDICTORS = "classical,learned,auto"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_data = os.environ.get("TEZIP_DATA") or os.path.normpath(
        os.path.join(REPO, "..", "shared", "data"))
    ap.add_argument("--data", default=default_data,
                    help="directory of *.npy stacks (default: %(default)s)")
    ap.add_argument("--bounds", type=bench.parse_bounds, default=bench.parse_bounds(DEFAULT_BOUNDS),
                    help=f"comma-separated fractions of the value range; 'lossless' for "
                         f"bit-exact (default: {DEFAULT_BOUNDS})")
    ap.add_argument("--predictors", default=DEFAULT_PREDICTORS,
                    help=f"comma-separated tezip predictors (default: {DEFAULT_PREDICTORS})")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per measurement; the fastest counts (default: 1)")
    ap.add_argument("--codecs", default="all",
                    help="comma-separated other codecs, from " + ", ".join(bench.FAMILIES)
                    + " (default: all)")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"),
                    help="output directory (default: %(default)s)")
    ap.add_argument("--name", default="rate_distortion",
                    help="output file stem (default: %(default)s; 'rd' would overwrite the "
                         "README's plot from tezip bench)")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw OUT/NAME.png from an earlier run's OUT/NAME.json")
    args = ap.parse_args(argv)
    stem = os.path.join(args.out, args.name)
    if args.replot:
        import json

        from tezip.bench_plot import plot_rd

        with open(stem + ".json") as f:
            plot_rd(json.load(f), stem + ".png")
        print(f"wrote {stem}.png", file=sys.stderr)
        return 0

    paths = sorted(glob.glob(os.path.join(args.data, "*.npy")))
    if not paths:
        ap.error(f"no *.npy files in {args.data}")
    predictors = [p.strip() for p in args.predictors.split(",") if p.strip()]
    codecs = None if args.codecs.strip() == "all" else args.codecs.split(",")

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    rows = bench.run(paths, args.bounds, predictors, max(1, args.repeat), progress, codecs)
    elapsed = time.perf_counter() - t0
    for r in rows:
        skip_unsupported(r)

    for r in rows:
        if r.get("error"):
            print(f"\n{r['codec']} failed on {r['dataset']} (bound {r['bound']}):\n"
                  f"{r['error']}", file=sys.stderr)
    versions = bench.codec_versions()
    head = [
        "# Rate-distortion: tezip against the codecs installed",
        "",
        f"Regenerate: `python benchmarks/rate_distortion.py` (data: {len(paths)} stacks, "
        f"bounds {_fmt(args.bounds)}, "
        f"predictors {', '.join(predictors)}, best of {max(1, args.repeat)}). "
        "Ratio = raw bytes / compressed bytes; bounds are fractions of each stack's value "
        "range; PSNR uses the value range as peak; every lossy row was checked against its "
        "bound, every lossless row for bit-exactness. `tezip` = the default predictor "
        "(auto). One process on "
        f"{platform.machine()} with {os.cpu_count()} CPUs, run time {elapsed:.0f} s.",
        "",
        "Versions: " + "; ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
    ]
    md = "\n".join(head) + "\n" + bench.to_markdown(rows)
    print(md)
    os.makedirs(args.out, exist_ok=True)
    with open(stem + ".md", "w") as f:
        f.write(md)
    with open(stem + ".json", "w") as f:
        f.write(bench.to_json(rows))
    if not args.no_plot:
        from tezip.bench_plot import plot_rd

        plot_rd(rows, stem + ".png")
        print(f"wrote {stem}.md, {stem}.json and {stem}.png", file=sys.stderr)
    return 1 if any(r["ok"] is False for r in rows) else 0


def skip_unsupported(row: dict) -> None:
    """A ``learned`` row the predictor rejects by design (lossless floats: it codes abs/rel
    bounds and lossless integers only) is a skipped row, as for a codec that cannot take
    the data, not a failure that fails the run."""
    spec = row["codec"].removeprefix("tezip-")
    if row["ok"] is False and spec != row["codec"] and bench.tezip_spec(spec)[0] == "learned" \
            and "OptionError" in row.get("error", ""):
        why = row["error"].strip().splitlines()[-1].split(": ", 1)[-1]
        row.update(ok=None, note=f"skipped: {why}")
        del row["error"]


def _fmt(bounds: list[float | None]) -> str:
    return ", ".join("lossless" if b is None else f"{b:g}" for b in bounds)


if __name__ == "__main__":
    sys.exit(main())
