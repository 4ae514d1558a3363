"""Compact README table from the JSON of run_classical.py (one row per data set and bound).

    python benchmarks/run_classical.py --predictors classical,prednet,prednet+interp,auto \
        --repeat 2 --out-json results.json
    python benchmarks/summarize.py results.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    with open(path) as f:
        rows = json.load(f)
    cell: dict[tuple, dict] = {}
    for r in rows:
        cell.setdefault((r["dataset"], r["bound"]), {})[r["codec"]] = r
    print("| data | bound | classical | prednet | prednet+interp | **auto** | SZ3 3-D | ZFP 3-D "
          "| auto / SZ3 | enc / dec MB/s: classical | prednet+interp | auto |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    order = sorted(cell, key=lambda k: (k[1] == "lossless",
                                        -float(k[1]) if k[1] != "lossless" else 0, k[0]))
    for ds, b in order:
        c = cell[(ds, b)]
        lossless = b == "lossless"
        ref = "zstd-19" if lossless else "SZ3 3-D"
        alt = "zstd-3" if lossless else "ZFP 3-D"

        def ratio(name: str, c: dict = c) -> str:
            return f"{c[name]['ratio']:.2f}" if name in c else "n/a"

        def speed(name: str, c: dict = c) -> str:
            r = c.get(name)
            return f"{r['enc_mbs']:.0f} / {r['dec_mbs']:.0f}" if r else "n/a"

        vs = c["tezip"]["ratio"] / c[ref]["ratio"] if ref in c else float("nan")
        label = "lossless" if lossless else f"{float(b):g}"
        refcell = f"{ratio(ref)}" + (" (zstd-19)" if lossless else "")
        altcell = f"{ratio(alt)}" + (" (zstd-3)" if lossless else "")
        print(f"| {ds} | {label} | {ratio('tezip-classical')} | {ratio('tezip-prednet')} | "
              f"{ratio('tezip-prednet+interp')} | **{ratio('tezip')}** | {refcell} | {altcell} "
              f"| {vs:.2f}x | {speed('tezip-classical')} | {speed('tezip-prednet+interp')} | "
              f"{speed('tezip')} |")


if __name__ == "__main__":
    main(sys.argv[1])
