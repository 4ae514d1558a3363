"""Whole compressions and decompressions of an older tezip tree against this checkout's,
in one process, in ABBA order (old, new, new, old, ...), on the same stacks and files.

    python benchmarks/tree_ab.py --base DIR [--data DIR] [--cases iris_sji2796:1e-4,...]
        [--rounds 15] [--md FILE]

``DIR`` holds the older ``tezip`` package (``git archive COMMIT tezip | tar -x -C DIR``).
``kernel_ab.py`` times the interpolation and Lorenzo kernels of two trees, but shares
this checkout's ``kernels.core`` (and its tables) between them, so it cannot measure a
change to what they share; ``speed_ab.py`` compares whole processes, a minute apart.
This script imports a copy of the older tree as a package of another name
(``tezip_ab_base``, its absolute imports rewritten) next to this checkout's ``tezip``:
both run the whole path (container, model tables, kernels, checksums) seconds apart.
Both trees must write the same bytes and decode them to the same values (checked);
figures are MB/s of raw data, one thread, best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np

import tezip
from tezip.atomic import atomic_output

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_NAME = "tezip_ab_base"
DEFAULT_CASES = ("iris_sji2796:1e-3,iris_sji2796:1e-4,smoke_phiflow:1e-3,smoke_phiflow:1e-4,"
                 "ks_pypde:1e-3,ks_pypde:1e-4,speckle_hcipy:1e-3,speckle_hcipy:1e-4")


def load_base(tree: str, where: str):
    """The package in ``tree``/tezip, copied to ``where`` as ``BASE_NAME`` and imported."""
    dst = os.path.join(where, BASE_NAME)
    shutil.copytree(os.path.join(tree, "tezip"), dst,
                    ignore=shutil.ignore_patterns("__pycache__"))
    subs = ((re.compile(r"\bfrom tezip\b"), f"from {BASE_NAME}"),
            (re.compile(r"\bimport tezip\b(?!\.)"), f"import {BASE_NAME} as tezip"),
            (re.compile(r"([\"'])tezip\."), rf"\g<1>{BASE_NAME}."))
    for root, _, files in os.walk(dst):
        for fn in files:
            if fn.endswith(".py"):
                p = os.path.join(root, fn)
                with open(p) as f:
                    src = f.read()
                for pat, rep in subs:
                    src = pat.sub(rep, src)
                with open(p, "w") as f:
                    f.write(src)
    sys.path.insert(0, where)
    import importlib

    return importlib.import_module(BASE_NAME)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="directory holding the older tezip package")
    ap.add_argument("--data", default=os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                    "data")))
    ap.add_argument("--cases", default=DEFAULT_CASES, help="stack:bound,... (relative bounds)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results", "tree_ab.md"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    work = tempfile.mkdtemp(prefix="tezip_ab_")
    try:
        base = load_base(os.path.abspath(args.base), work)
        mods = (base, tezip)
        cases = []
        for c in args.cases.split(","):
            name, b = c.split(":")
            x = np.load(os.path.join(args.data, f"{name}.npy"))
            kw = dict(mode="rel", bound=float(b), predictor="classical", threads=1)
            blobs = [m.compress(x, **kw) for m in mods]
            if blobs[0] != blobs[1]:
                raise SystemExit(f"{c}: the two trees write different bytes")
            outs = [m.decompress(blobs[1], threads=1).tobytes() for m in mods]
            if outs[0] != outs[1]:
                raise SystemExit(f"{c}: the two trees decode to different values")
            cases.append((c, x, kw, blobs[1]))
        best = {c: [[np.inf, np.inf], [np.inf, np.inf]] for c, *_ in cases}  # [tree][enc, dec]
        for r in range(args.rounds):
            order = (0, 1, 1, 0) if r % 2 == 0 else (1, 0, 0, 1)
            for c, x, kw, blob in cases:
                for i in order:
                    m = mods[i]
                    t0 = time.perf_counter()
                    m.compress(x, **kw)
                    t1 = time.perf_counter()
                    m.decompress(blob, threads=1)
                    t2 = time.perf_counter()
                    b = best[c][i]
                    b[0], b[1] = min(b[0], t1 - t0), min(b[1], t2 - t1)
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"# Whole-path A/B: `{args.base}` against this checkout ({tezip.__version__})", "",
             f"`python benchmarks/tree_ab.py --base {args.base} --rounds {args.rounds}`: "
             "each round compresses and decompresses every case with the older tree and "
             "this checkout in ABBA order; the same bytes and values checked; MB/s of raw "
             f"data, one thread, best of {args.rounds}.", "",
             "| stack:bound | encode MB/s base -> this | decode MB/s base -> this |",
             "|---|---|---|"]
    for c, x, _, _ in cases:
        (e0, d0), (e1, d1) = best[c]
        mb = x.nbytes / 1e6
        lines.append(f"| {c} | {mb / e0:.0f} -> {mb / e1:.0f} ({e0 / e1:.3f}x) | "
                     f"{mb / d0:.0f} -> {mb / d1:.0f} ({d0 / d1:.3f}x) |")
    text = "\n".join(lines) + "\n"
    print(text)
    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
