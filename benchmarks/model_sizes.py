"""Width and depth of the learned forecaster: coded bits against decode cost.

    python benchmarks/model_sizes.py [--data DIR] [--stacks ks_pypde,iris_sji2796]
        [--hidden 4 8 16 8,8] [--seconds 30] [--bound 1e-3] [--init]
        [--out-md benchmarks/results/model_sizes.md]

For each stack and size: fit a forecaster to the stack for ``--seconds`` (the recipe of
``tezip compress --adapt``; ``--init`` starts from the shipped model where it has that
size), then code every window with the learned predictor forced and with the classical
ones, and report the ratio of the coded sizes (the stored model's bytes counted) and the
codec's decode-speed estimate for float32 (``tezip.codec.learned_decode_mbps``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tezip import make_bound, predictors  # noqa: E402
from tezip.atomic import atomic_output  # noqa: E402
from tezip.codec import encode_window_alternatives, learned_decode_mbps, resolve  # noqa: E402
from tezip.learned import adapt, registry  # noqa: E402
from tezip.learned.model import ModelConfig  # noqa: E402
from tezip.predictors.learned import for_model  # noqa: E402
from tezip.windows import DEFAULT_WINDOW  # noqa: E402


def measure(a: np.ndarray, hidden: tuple[int, ...], seconds: float, bound: float,
            init: bool) -> dict:
    fin = a[np.isfinite(a)]
    qp = resolve(make_bound("rel", bound, None), a.dtype, (float(fin.min()), float(fin.max())))
    cfg = ModelConfig(channels=1, hidden=hidden)
    start = registry.default() if init else None
    acfg = adapt.AdaptConfig(seconds=seconds)
    m = registry.remember(adapt.fit([a], [qp.eb], cfg, acfg, init=start))
    learned = for_model(m)
    learned_bytes = len(m.data)
    classical = 0
    for t0 in range(0, a.shape[0], DEFAULT_WINDOW):
        x = np.ascontiguousarray(a[t0:t0 + DEFAULT_WINDOW])
        if x.shape[0] < 2:
            continue
        classical += len(encode_window_alternatives(x, qp, predictors.CLASSICAL_CANDIDATES)
                         .payload)
        learned_bytes += len(encode_window_alternatives(x, qp, ("learned",), learned).payload)
    return {"hidden": list(hidden), "params": cfg.n_params(), "macs": cfg.macs_per_pixel(),
            "decode_mbs": learned_decode_mbps(cfg.macs_per_pixel(), 1, 4),
            "steps": m.meta.get("steps"), "ratio": learned_bytes / classical}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--stacks", default="ks_pypde,iris_sji2796")
    ap.add_argument("--hidden", nargs="+", default=["4", "8", "16", "8,8"])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--bound", type=float, default=1e-3)
    ap.add_argument("--init", action="store_true")
    ap.add_argument("--out-md", type=Path, default=REPO / "benchmarks" / "results" /
                    "model_sizes.md")
    a = ap.parse_args()
    stacks = a.stacks.split(",")
    sizes = [tuple(int(v) for v in h.split(",")) for h in a.hidden]
    res: dict[tuple, dict[str, dict]] = {}
    for name in stacks:
        x = np.load(a.data / f"{name}.npy")
        for h in sizes:
            t = time.perf_counter()
            r = measure(x, h, a.seconds, a.bound, a.init)
            res.setdefault(h, {})[name] = r
            print(f"{name:14s} hidden {h}: {r['ratio']:.3f}x classical, {r['steps']} steps, "
                  f"{time.perf_counter() - t:.0f} s", flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    md = [f"# Width and depth of the forecaster (`python benchmarks/model_sizes.py --seconds "
          f"{a.seconds:g} --bound {a.bound:g}{' --init' if a.init else ''}`, commit {commit})",
          "", "Fitted to each stack for the time budget, then every window coded with the "
          "learned predictor forced; coded size (model bytes included) against the best "
          "classical predictor per window; decode MB/s: the codec's estimate for float32, "
          "one core. Steps: optimisation steps taken within the budget.", "",
          "| hidden | parameters | multiply-adds / pixel | decode MB/s (est.) | "
          + " | ".join(f"{s}: learned / classical (steps)" for s in stacks) + " |",
          "|---|---|---|---|" + "---|" * len(stacks)]
    for h in sizes:
        r0 = res[h][stacks[0]]
        md.append(f"| {', '.join(map(str, h))} | {r0['params']:,} | {r0['macs']:,.0f} | "
                  f"{r0['decode_mbs']:.1f} | "
                  + " | ".join(f"{res[h][s]['ratio']:.2f}x ({res[h][s]['steps']})"
                               for s in stacks) + " |")
    with atomic_output(a.out_md, force=True) as tmp:
        Path(tmp).write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
