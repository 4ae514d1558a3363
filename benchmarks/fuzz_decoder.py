"""Fuzz the .tez decoder for a time budget and report the counts.

    python benchmarks/fuzz_decoder.py [--seconds 600] [--seed 0] [--no-learned]

Mutates the format fixtures in tests/fixtures (bit flips, truncations, insertions,
deletions, overwrites, duplicated runs, extreme integers; 1-3 per case) and decodes each
result: a changed file must raise a TezipError (an unchanged one decode exactly), within
a 64 MB allocation limit. Half of the cases are resealed (checksums recomputed after
the damage, as a crafted file would be): they must raise a TezipError or decode to an
array of the declared shape, within 4 GiB. Exits 1 on the first other outcome, printing
the seed that reproduces it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fuzz_target import check, check_crafted, craft, mutate, seeds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-learned", action="store_true", help="skip the prednet fixture")
    a = ap.parse_args()
    pool = seeds(learned=not a.no_learned)
    counts = {"error": 0, "ok": 0}
    t0 = time.perf_counter()
    case = 0
    while time.perf_counter() - t0 < a.seconds:
        rng = np.random.default_rng([a.seed, case])
        name, blob, ref = pool[case % len(pool)]
        if case % 2:         # resealed: checksums recomputed, the decoder's own checks only
            try:
                outcome = "resealed_" + check_crafted(craft(blob, rng))
                counts[outcome] = counts.get(outcome, 0) + 1
            except BaseException as exc:  # noqa: BLE001 - report anything else
                print(f"FAIL resealed case {case} (seed [{a.seed}, {case}]) on {name}: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)
                return 1
            case += 1
            continue
        damaged = mutate(blob, rng)
        if damaged == blob:
            counts["unchanged"] = counts.get("unchanged", 0) + 1
            case += 1
            continue
        try:
            outcome = check(damaged, ref)
            if outcome != "error":
                raise AssertionError("a changed file was accepted (decoded to the same data)")
            counts[outcome] += 1
        except BaseException as exc:  # noqa: BLE001 - report anything else
            print(f"FAIL case {case} (seed [{a.seed}, {case}]) on {name}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        case += 1
    dt = time.perf_counter() - t0
    print(f"{case} cases in {dt:.0f} s over {len(pool)} fixtures. Damaged files: "
          f"{counts['error']}, all rejected with a TezipError ({counts.get('unchanged', 0)} "
          f"mutations left the bytes unchanged). Resealed (checksums recomputed): "
          f"{counts.get('resealed_error', 0)} rejected with a TezipError, "
          f"{counts.get('resealed_decoded', 0)} decoded to a well-formed array. "
          f"0 crashes, 0 other exceptions, 0 allocations over the limits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
