"""Bits per value of each predictor on the shared stacks: the table in
pretrained/MODEL_CARD.md.

    python benchmarks/model_card_bits.py [--data DIR] [--bound 1e-3] [--window 16]
        [--model pretrained/default.safetensors] [--out-md benchmarks/results/model_card_bits.md]

Each ``*.npy`` stack is compressed whole with one predictor at a time (``--mode rel``,
bound a fraction of its value range, windows of ``--window`` frames) and the coded size
of the whole file is reported as bits per value (8 x bytes / values; header included).
Every result is decoded and checked against the bound.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tezip  # noqa: E402
from tezip.atomic import atomic_output  # noqa: E402
from tezip.bench import value_range  # noqa: E402

CLASSICAL = ("previous", "lorenzo", "spatial", "interp")
LEARNED = ("prednet", "prednet+interp")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--bound", type=float, default=1e-3)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--model", type=Path, default=REPO / "pretrained" / "default.safetensors")
    ap.add_argument("--out-md", type=Path, default=REPO / "benchmarks" / "results" /
                    "model_card_bits.md")
    a = ap.parse_args()
    rows = []
    for path in sorted(a.data.glob("*.npy")):
        x = np.load(path)
        lo, hi = value_range(x)
        row = {"data": path.stem, "shape": list(x.shape), "dtype": str(x.dtype), "bits": {},
               "seconds": {}}
        for pred in CLASSICAL + LEARNED:
            t = time.perf_counter()
            blob = tezip.compress(x, mode="rel", bound=a.bound, predictor=pred,
                                  window=a.window, model=a.model)
            row["seconds"][pred] = round(time.perf_counter() - t, 2)
            back = tezip.decompress(blob, model=a.model)
            err = np.abs(back.astype(np.float64) - x.astype(np.float64))
            fin = np.isfinite(err)
            limit = a.bound * (hi - lo)
            if not (err[fin] <= limit).all():     # a float check; the bound audit is exact
                print(f"{path.stem} {pred}: bound exceeded", file=sys.stderr)
                return 1
            row["bits"][pred] = 8 * len(blob) / x.size
            print(f"{path.stem:16s} {pred:16s} {row['bits'][pred]:.3f} bits/value", flush=True)
        rows.append(row)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    md = [f"# Bits per value by predictor (`python benchmarks/model_card_bits.py`, commit "
          f"{commit})", "",
          f"Whole stacks, `--mode rel --bound {a.bound:g}`, windows of {a.window} frames, model "
          f"`{a.model.name}`; 8 x file bytes / values (header included); lower is better.",
          "", "| data | shape | " + " | ".join(CLASSICAL + LEARNED) + " | best classical | "
          "prednet+interp vs best classical |",
          "|---|---|" + "---|" * (len(CLASSICAL + LEARNED) + 2)]
    for r in rows:
        best = min(CLASSICAL, key=lambda p: r["bits"][p])
        gain = r["bits"]["prednet+interp"] / r["bits"][best] - 1
        md.append(f"| {r['data']} | {'x'.join(map(str, r['shape']))} {r['dtype']} | "
                  + " | ".join(f"{r['bits'][p]:.3f}" for p in CLASSICAL + LEARNED)
                  + f" | {best} | {gain:+.0%} |")
    with atomic_output(a.out_md, force=True) as tmp:
        Path(tmp).write_text("\n".join(md) + "\n")
    with atomic_output(a.out_md.with_suffix(".json"), force=True) as tmp:
        Path(tmp).write_text(json.dumps({"commit": commit, "bound": a.bound,
                                         "window": a.window, "rows": rows}, indent=1) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
