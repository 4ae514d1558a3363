"""Encode and decode MB/s of two tezip source trees on the same stacks, alternating, so
that both see the same machine (a speed change measured against a noisy neighbour).

    python benchmarks/speed_ab.py --base DIR [--data DIR] [--bounds 1e-3,1e-4]
        [--predictor classical] [--rounds 2] [--md benchmarks/results/speed_ab.md]

``DIR`` holds an older ``tezip`` package, e.g. ``git archive COMMIT tezip | tar -x -C DIR``.
Each round runs the base tree, then this checkout, each in a fresh process (one thread,
best of 3 per stack); the table keeps each tree's best round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("iris_sji2796", "ks_pypde", "smoke_phiflow", "speckle_hcipy")

_CHILD = r"""
import json, sys, time
import numpy as np
import tezip
data, bounds, pred = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
out = {}
for name in sys.argv[4].split(","):
    x = np.load(f"{data}/{name}.npy")
    for b in bounds:
        kw = dict(mode="rel", bound=float(b), predictor=pred, threads=1)
        blob = tezip.compress(x, **kw)
        tezip.decompress(blob, threads=1)               # compile / load kernels first
        te = td = float("inf")
        for _ in range(3):
            t = time.perf_counter(); blob = tezip.compress(x, **kw)
            te = min(te, time.perf_counter() - t)
            t = time.perf_counter(); tezip.decompress(blob, threads=1)
            td = min(td, time.perf_counter() - t)
        out[f"{name} {b}"] = [x.nbytes / len(blob), x.nbytes / te / 1e6, x.nbytes / td / 1e6]
print(json.dumps({"version": tezip.__version__, "rows": out}))
"""


def run(tree: str, data: str, bounds: str, pred: str) -> dict:
    env = {**os.environ, "PYTHONPATH": tree}
    p = subprocess.run([sys.executable, "-c", _CHILD, data, bounds, pred, ",".join(NAMES)], env=env,
                       capture_output=True, text=True, cwd="/", check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="directory holding the older tezip package")
    ap.add_argument("--data", default=os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                    "data")))
    ap.add_argument("--bounds", default="1e-3,1e-4")
    ap.add_argument("--predictor", default="classical")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results", "speed_ab.md"))
    args = ap.parse_args(argv)
    best: dict[str, dict] = {}
    versions = {}
    for r in range(args.rounds):
        for label, tree in (("base", os.path.abspath(args.base)), ("this", REPO)):
            res = run(tree, args.data, args.bounds, args.predictor)
            versions[label] = res["version"]
            for key, (ratio, enc, dec) in res["rows"].items():
                cur = best.setdefault(label, {}).setdefault(key, [ratio, 0.0, 0.0])
                cur[1], cur[2] = max(cur[1], enc), max(cur[2], dec)
            print(f"round {r + 1}: {label} done", file=sys.stderr)
    lines = [f"# Speed A/B: tezip {versions['base']} (`{args.base}`) against this checkout "
             f"({versions['this']})", "",
             f"`python benchmarks/speed_ab.py --base {args.base} --bounds {args.bounds} "
             f"--predictor {args.predictor} --rounds {args.rounds}`: one thread, best of 3 "
             f"per run, best of {args.rounds} alternating rounds.", "",
             "| stack, bound | ratio base / this | encode MB/s base -> this | decode MB/s "
             "base -> this |", "|---|---|---|---|"]
    for key in best["this"]:
        b, t = best["base"][key], best["this"][key]
        lines.append(f"| {key} | {b[0]:.2f} / {t[0]:.2f} | {b[1]:.0f} -> {t[1]:.0f} "
                     f"({t[1] / b[1]:.2f}x) | {b[2]:.0f} -> {t[2]:.0f} ({t[2] / b[2]:.2f}x) |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.md, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
