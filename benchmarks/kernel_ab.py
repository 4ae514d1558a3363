"""The classical kernels of an older tezip tree against this checkout's, on the same
inputs, in one process, in ABBA order (old, new, new, old, ...): what a change to a kernel
is worth, without the run-to-run noise of whole-process comparisons (``speed_ab.py``)
nor the order bias of always timing one kernel first (the second call of a pair found
warmer caches and measured 2-5% faster here).

    python benchmarks/kernel_ab.py --base DIR [--data DIR] [--bounds 1e-3,1e-4]
        [--rounds 12] [--md FILE]

``DIR`` holds the older ``tezip`` package (``git archive COMMIT tezip | tar -x -C DIR``);
its ``kernels/interp.py`` and ``kernels/lorenzo.py`` are loaded next to this checkout's
(sharing this checkout's ``kernels.core``). For every shared stack and bound, the
classical kernels' calls of one compression and one decompression with this checkout
are recorded, then each kernel's calls are run with the old and the new kernel: the
outputs must be identical, and the times are summed per kernel and group (the tuning's
sample tiles apart from whole windows), best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

import tezip
from tezip.atomic import atomic_output
from tezip.kernels import interp as KI
from tezip.kernels import lorenzo as KL
from tezip.kernels.core import call
from tezip.predictors import classical

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("iris_sji2796", "ks_pypde", "smoke_phiflow", "speckle_hcipy")
# kernel name -> (this checkout's module, index of ``rec`` (aliased to ``out`` at index
# rec - 1 in plain coding; None: no such argument)
KERNELS = {"interp.encode": (KI, "encode", 3), "interp.decode": (KI, "decode", 1),
           "lorenzo.encode_pq": (KL, "encode_pq", None),
           "lorenzo.decode_pq": (KL, "decode_pq", None),
           "lorenzo.decode_pq_runs": (KL, "decode_pq_runs", None)}


def load_base(base: str, name: str):
    """The older tree's kernel module ``name`` as ``tezip.kernels._base_<name>``."""
    path = os.path.join(base, "tezip", "kernels", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"tezip.kernels._base_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def record(a: np.ndarray, bound: float) -> list[tuple[str, tuple, list, bool]]:
    """The classical kernel calls of one compression and decompression of ``a``:
    (kernel, literal positions, copied arguments, whether rec is out itself)."""
    calls = []
    by_fn = {getattr(m, f): (k, r) for k, (m, f, r) in KERNELS.items()}
    orig = classical.call

    def spy(kernel, literal, *args):
        if kernel in by_fn:
            key, r = by_fn[kernel]
            alias = (r is not None and args[r] is not None
                     and np.shares_memory(args[r - 1], args[r]))
            calls.append((key, literal,
                          [x.copy() if isinstance(x, np.ndarray) else x for x in args], alias))
        return orig(kernel, literal, *args)

    classical.call = spy
    try:
        blob = tezip.compress(a, mode="rel", bound=bound, predictor="classical", threads=1)
        tezip.decompress(blob, threads=1)
    finally:
        classical.call = orig
    return calls


def run(fn, c) -> tuple[float, object, list]:
    """Time one call of ``fn``; an older kernel without this checkout's trailing
    arguments (format v7 added ``seg`` to interp's encoder, ``runs`` to its decoder)
    gets the arguments it has, and the literal positions among them."""
    key, literal, args, alias = c
    nargs = fn.py_func.__code__.co_argcount
    a = [x.copy() if isinstance(x, np.ndarray) else x for x in args[:nargs]]
    r = KERNELS[key][2]
    if alias:
        a[r] = a[r - 1]
    t0 = time.perf_counter()
    res = call(fn, tuple(i for i in literal if i < nargs), *a)
    return time.perf_counter() - t0, res, a


def same(x, y) -> bool:
    rx, ry = x[1], y[1]
    if isinstance(rx, tuple) and isinstance(ry, tuple):    # (the encoders' counts)
        k = min(len(rx), len(ry))
        rx, ry = rx[:k], ry[:k]
    if rx != ry:
        return False
    return all(np.array_equal(np.asarray(p).view(np.uint8), np.asarray(q).view(np.uint8))
               for p, q in zip(x[2], y[2], strict=False) if isinstance(p, np.ndarray))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="directory holding the older tezip package")
    ap.add_argument("--data", default=os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                    "data")))
    ap.add_argument("--bounds", default="1e-3,1e-4")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--md", default=os.path.join(REPO, "benchmarks", "results",
                                                 "kernel_ab.md"))
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    base = {"interp": load_base(args.base, "interp"), "lorenzo": load_base(args.base, "lorenzo")}
    lines = [f"# Classical kernels: `{args.base}` against this checkout, ABBA", "",
             f"`python benchmarks/kernel_ab.py --base {args.base} --bounds {args.bounds} "
             f"--rounds {args.rounds}`: the kernels' calls of one compression and "
             "decompression (classical, one thread) run with each tree's kernel in ABBA "
             f"order, best of {args.rounds} rounds; ns per value; identical outputs checked.",
             "", "| stack, bound | kernel (calls) | old ns/value | new ns/value | new speed |",
             "|---|---|---|---|---|"]
    for name in NAMES:
        a = np.load(os.path.join(args.data, f"{name}.npy"))
        for b in (float(s) for s in args.bounds.split(",")):
            calls = record(a, b)
            groups: dict[str, list] = {}
            for c in calls:
                vol = c[2][0]
                tiles = c[0].endswith("encode") and vol.shape[1] <= 40 < a.shape[1]
                groups.setdefault(c[0] + (" (tiles)" if tiles else ""), []).append(c)
            for g, cs in groups.items():
                mod, fn, _ = KERNELS[cs[0][0]]
                new = getattr(mod, fn)
                old = getattr(base[cs[0][0].split(".")[0]], fn)
                for c in cs:
                    if not same(run(old, c), run(new, c)):
                        raise SystemExit(f"{name} {b:g} {g}: the kernels' outputs differ")
                best = [float("inf"), float("inf")]
                for r in range(args.rounds):
                    for j in ((0, 1) if r % 2 == 0 else (1, 0)):
                        t = sum(run((old, new)[j], c)[0] for c in cs)
                        best[j] = min(best[j], t)
                n = sum(c[2][0].size for c in cs)
                lines.append(f"| {name} {b:g} | {g} ({len(cs)}) | {best[0] / n * 1e9:.2f} | "
                             f"{best[1] / n * 1e9:.2f} | {best[0] / best[1]:.2f}x |")
                print(lines[-1], file=sys.stderr, flush=True)
    with atomic_output(args.md, force=True) as tmp, open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
