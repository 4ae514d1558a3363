"""The windows' drift check (``codec._drifted``): tezip classical with it and without it
(``codec.DRIFT`` set to infinity), on the shared stacks as they are and with a start
unlike the rest put before them, one core, best of ``--repeat`` timings.

    python benchmarks/drift.py [--data DIR] [--bounds 1e-2,1e-3,1e-4] [--repeat 3]
        [--md benchmarks/results/drift.md]

The start: 33 dark frames (a bias of 100 and read noise of 2 counts, rounded) before a
detector's integer stack; the first frame held for 33 frames, with noise of 1e-4 of the
value range, before a float stack. The stack then plays forward and backward once, so
that later windows are the stack's own. Every file is decoded and checked against the
bound; "windows tuned": the windows the check tuned on their own, of all.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("iris_sji2796", "ks_pypde", "smoke_phiflow", "speckle_hcipy")


def with_start(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if a.dtype.kind in "iu":
        start = np.round(100 + rng.normal(0, 2, size=(33, *a.shape[1:])))
    else:
        noise = rng.normal(0, 1e-4 * (float(a.max()) - float(a.min())),
                           size=(33, *a.shape[1:]))
        start = a[:1].astype(np.float64) + noise
    return np.ascontiguousarray(np.concatenate([start.astype(a.dtype), a, a[::-1]]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                    "data")))
    ap.add_argument("--bounds", default="1e-2,1e-3,1e-4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results", "drift.md"))
    args = ap.parse_args(argv)
    import tezip
    from tezip import codec

    real = codec._drifted
    tuned: list[bool] = []

    def spy(x, quant, classical, name, cfg, data, ref):  # noqa: ANN001, ANN202
        calls = []
        inner = codec.tune

        def count(*a, **k):  # noqa: ANN002, ANN003, ANN202
            calls.append(1)
            return inner(*a, **k)

        codec.tune = count
        try:
            return real(x, quant, classical, name, cfg, data, ref)
        finally:
            codec.tune = inner
            tuned.append(bool(calls))

    codec._drifted = spy
    rng = np.random.default_rng(0)
    lines = [
        "# The windows' drift check",
        "",
        f"`python benchmarks/drift.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
        f", tezip {tezip.__version__}, {time.strftime('%Y-%m-%d')}, this project's 2-core "
        f"machine, one core, best of {args.repeat}; `--predictor classical`. Ratio "
        "(encode MB/s) with the check (a window that takes more than "
        f"{codec.DRIFT:g} times the bits per value the tuning estimated, and "
        f"{codec.DRIFT_MIN_BYTES} bytes or more, is tuned on its own) and without it.",
        "",
        "| stack | bound | without | with | with / without | windows tuned | same bytes |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in NAMES:
        plain = np.load(os.path.join(args.data, f"{name}.npy"))
        for label, a in ((name, plain), (f"{name} + start", with_start(plain, rng))):
            rng_v = float(a.max()) - float(a.min())
            for b in (float(v) for v in args.bounds.split(",")):
                kw = dict(mode="rel", bound=b, predictor="classical", threads=1)
                res = {}
                for drift in (float("inf"), codec.DRIFT):
                    codec_drift = codec.DRIFT
                    codec.DRIFT = drift
                    try:
                        tezip.compress(a, **kw)
                        best, blob = float("inf"), b""
                        for _ in range(args.repeat):
                            tuned.clear()
                            t = time.perf_counter()
                            blob = tezip.compress(a, **kw)
                            best = min(best, time.perf_counter() - t)
                        err = float(np.max(np.abs(tezip.decompress(blob).astype(np.float64)
                                                  - a)))
                        eb = b * rng_v if a.dtype.kind == "f" else max(0.0,
                                                                       np.floor(b * rng_v))
                        assert err <= eb, (label, b, err, eb)
                        res[drift] = (blob, best, sum(tuned), len(tuned))
                    finally:
                        codec.DRIFT = codec_drift
                (b0, t0, _, _), (b1, t1, k, n) = res[float("inf")], res[codec.DRIFT]
                row = (f"| {label} | {b:g} | {a.nbytes / len(b0):.2f} "
                       f"({a.nbytes / t0 / 1e6:.0f}) | {a.nbytes / len(b1):.2f} "
                       f"({a.nbytes / t1 / 1e6:.0f}) | {len(b0) / len(b1):.3f}x | {k} of {n} "
                       f"| {'yes' if b0 == b1 else 'no'} |")
                print(row, flush=True)
                lines.append(row)
    from tezip.atomic import atomic_output

    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
