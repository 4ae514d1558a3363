"""What the learned forecaster earns: bits per value and decoding speed of the classical
predictors, the shipped model, ``auto`` and ``auto --adapt`` on the shared stacks (the
tables in pretrained/MODEL_CARD.md and issue 12).

    python benchmarks/model_card_bits.py [--data DIR] [--bounds 1e-3] [--adapt-seconds 30]
        [--threads 1] [--out-md benchmarks/results/model_card_bits.md]

Each ``*.npy`` stack is compressed whole with each choice (``--mode rel``, the default
window), decoded with ``--threads`` threads (best of 2, wall clock, MB/s of raw data)
and checked against the bound. Bits per value = 8 x file bytes / values, header and any
stored model included.
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

CHOICES = {  # name: keyword arguments of tezip.compress
    "classical": {"predictor": "classical"},
    "learned (shipped)": {"predictor": "learned"},
    "auto": {"predictor": "auto"},
    "auto --adapt": {"predictor": "auto", "adapt": True},
    "learned --adapt": {"predictor": "learned", "adapt": True},
}


def _predictors(blob: bytes) -> str:
    with tezip.TezFile(blob) as f:
        used: dict[str, int] = {}
        for i in range(f.n_windows):
            w = f.window_meta(i)["p"]
            used[w] = used.get(w, 0) + 1
    return " ".join(f"{k}x{v}" for k, v in sorted(used.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--bounds", default="1e-3")
    ap.add_argument("--adapt-seconds", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--choices", default=",".join(CHOICES),
                    help="comma-separated subset of: " + ", ".join(CHOICES))
    ap.add_argument("--out-md", type=Path, default=REPO / "benchmarks" / "results" /
                    "model_card_bits.md")
    a = ap.parse_args()
    bounds = [float(b) for b in a.bounds.split(",")]
    names = [c.strip() for c in a.choices.split(",")]
    if not set(names) <= set(CHOICES) or "classical" not in names:
        ap.error(f"--choices: a subset of {', '.join(CHOICES)} including classical")
    rows = []
    for path in sorted(a.data.glob("*.npy")):
        x = np.load(path)
        lo, hi = value_range(x)
        for bound in bounds:
            row = {"data": path.stem, "shape": list(x.shape), "dtype": str(x.dtype),
                   "bound": bound, "bits": {}, "decode_mbs": {}, "encode_s": {},
                   "windows": {}}
            for name in names:
                kw = CHOICES[name]
                t = time.perf_counter()
                blob = tezip.compress(x, mode="rel", bound=bound, threads=a.threads,
                                      adapt_seconds=a.adapt_seconds, **kw)
                row["encode_s"][name] = round(time.perf_counter() - t, 2)
                best = float("inf")
                for _ in range(2):
                    t = time.perf_counter()
                    back = tezip.decompress(blob, threads=a.threads)
                    best = min(best, time.perf_counter() - t)
                err = np.abs(back.astype(np.float64) - x.astype(np.float64))
                fin = np.isfinite(err)
                if not (err[fin] <= bound * (hi - lo)).all():  # float check; audit is exact
                    print(f"{path.stem} {name}: bound exceeded", file=sys.stderr)
                    return 1
                row["bits"][name] = 8 * len(blob) / x.size
                row["decode_mbs"][name] = x.nbytes / best / 1e6
                row["windows"][name] = _predictors(blob)
                print(f"{path.stem:14s} {bound:g} {name:18s} {row['bits'][name]:.3f} bits/value"
                      f"  decode {row['decode_mbs'][name]:6.1f} MB/s  {row['windows'][name]}",
                      flush=True)
            rows.append(row)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    md = [f"# What the learned forecaster earns (`python benchmarks/model_card_bits.py "
          f"--bounds {a.bounds} --adapt-seconds {a.adapt_seconds:g} --threads {a.threads}`, "
          f"commit {commit})", "",
          "Whole stacks, `--mode rel`; bits per value = 8 x file bytes / values (header and "
          "stored model included; lower is better); decode MB/s of raw data with "
          f"{a.threads} thread(s), best of 2; the windows' predictors in the last column.",
          "", "| data | bound | " + " | ".join(names) + " | best vs classical | "
          "decode MB/s: " + " / ".join(names) + " | windows of the smallest |",
          "|---|---|" + "---|" * (len(names) + 3)]
    for r in rows:
        best = min(names, key=lambda p: r["bits"][p])
        gain = r["bits"][best] / r["bits"]["classical"]
        md.append(f"| {r['data']} | {r['bound']:g} | "
                  + " | ".join(f"{r['bits'][p]:.3f}" for p in names)
                  + f" | {gain:.2f}x | "
                  + " / ".join(f"{r['decode_mbs'][p]:.0f}" for p in names)
                  + f" | {best}: {r['windows'][best]} |")
    with atomic_output(a.out_md, force=True) as tmp:
        Path(tmp).write_text("\n".join(md) + "\n")
    with atomic_output(a.out_md.with_suffix(".json"), force=True) as tmp:
        Path(tmp).write_text(json.dumps({"commit": commit, "bounds": bounds,
                                         "adapt_seconds": a.adapt_seconds,
                                         "threads": a.threads, "rows": rows}, indent=1) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
