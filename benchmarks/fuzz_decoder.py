"""Fuzz the .tez decoder for a time budget and report the counts.

    python benchmarks/fuzz_decoder.py [--seconds 600] [--seed 0] [--no-learned]
        [--out-md benchmarks/results/fuzz_decoder.md] [--out-json ...]

Mutates the format fixtures in tests/fixtures (bit flips, truncations, insertions,
deletions, overwrites, duplicated runs, extreme integers; 1-3 per case) and decodes each
result. tests/fixtures/v2 holds no file coded with the ``learned`` predictor, so one is
made here at start (a small float32 stack, rel 1e-3, the shipped model); ``--no-learned``
leaves it out together with the v1 ``prednet`` fixture. Three kinds of case, in turn:

- damaged: the file as mutated; a changed file must raise a TezipError (an unchanged one
  decode exactly), within a 64 MB allocation limit;
- resealed: one window payload, header field or index entry damaged and every container
  checksum recomputed, as a crafted file would be: a TezipError or an array of the
  declared shape, within 4 GiB;
- window: one window payload damaged and the container resealed around it, but not the
  window's checksum of its reconstruction: a TezipError or exactly the original data.

Exits 1 on the first other outcome, printing the seed that reproduces it. ``--out-md`` /
``--out-json`` append the run to a results file (rewritten atomically).
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
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fuzz_target import check, check_crafted, craft, damage_window, mutate, seeds  # noqa: E402

import tezip  # noqa: E402
from tezip.atomic import atomic_output  # noqa: E402

KINDS = ("damaged", "resealed", "window")


def learned_v2_seed() -> tuple[str, bytes, np.ndarray]:
    """A v2 file whose every window is coded by the learned predictor (the v2 fixtures have
    none): the fixtures' float32 stack shape, rel 1e-3, the shipped model."""
    rng = np.random.default_rng(2026)
    yy, xx = np.mgrid[0:12, 0:10]
    a = np.stack([np.sin(xx / 3 + i / 2) * np.cos(yy / 4) for i in range(6)])
    a = (a * 100 + rng.normal(0, 1, a.shape)).astype(np.float32)
    blob = tezip.compress(a, mode="rel", bound=1e-3, predictor="learned", threads=1)
    with tezip.TezFile(blob) as f:
        used = {f.window_meta(i)["p"] for i in range(f.n_windows)}
    if used != {"learned"}:
        raise RuntimeError(f"the learned fixture was coded with {sorted(used)}")
    return "v2_f32_learned", blob, tezip.decompress(blob)


def pool_of(learned: bool) -> list[tuple[str, bytes, np.ndarray]]:
    """The fixtures, each decoded once first (and checked against its reference) outside
    the allocation limit and the time budget: a first decode compiles kernels and the v1
    prednet reader imports torch, which tracemalloc counted as the decoder's allocations
    (over 64 MB: a spurious failure) and which took most of a short budget."""
    pool = [*seeds(learned=learned), *([learned_v2_seed()] if learned else [])]
    for name, blob, ref in pool:
        got = tezip.decompress(blob)
        if got.dtype != ref.dtype or got.tobytes() != ref.tobytes():
            raise RuntimeError(f"fixture {name} does not decode to its reference")
    return pool


def run(pool: list[tuple[str, bytes, np.ndarray]], seconds: float,
        seed: int) -> tuple[dict, int, float, str | None]:
    counts: dict[str, int] = {}
    t0 = time.perf_counter()
    case = 0
    while time.perf_counter() - t0 < seconds:
        rng = np.random.default_rng([seed, case])
        name, blob, ref = pool[case % len(pool)]
        kind = KINDS[case % 3]
        try:
            if kind == "resealed":      # checksums recomputed: the decoder's own checks only
                outcome = "resealed_" + check_crafted(craft(blob, rng))
            elif kind == "window":      # past the container, the window CRC left to catch it
                outcome = "window_" + check(damage_window(blob, rng), ref)
            else:
                damaged = mutate(blob, rng)
                if damaged == blob:
                    outcome = "unchanged"
                else:
                    outcome = check(damaged, ref)
                    if outcome != "error":
                        raise AssertionError("a changed file was accepted (decoded to the "
                                             "same data)")
        except BaseException as exc:  # noqa: BLE001 - report anything else
            return counts, case, time.perf_counter() - t0, (
                f"FAIL {kind} case {case} (seed [{seed}, {case}]) on {name}: "
                f"{type(exc).__name__}: {exc}")
        counts[outcome] = counts.get(outcome, 0) + 1
        case += 1
    return counts, case, time.perf_counter() - t0, None


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-learned", action="store_true",
                    help="skip the learned-predictor fixtures (v1 prednet, v2 learned)")
    ap.add_argument("--out-md", type=Path, help="append the run to this markdown table")
    ap.add_argument("--out-json", type=Path, help="append the run to this JSON list")
    a = ap.parse_args()
    pool = pool_of(not a.no_learned)
    counts, cases, dt, failure = run(pool, a.seconds, a.seed)
    n_fix = len(pool)
    g = counts.get
    summary = (f"{cases} cases in {dt:.0f} s over {n_fix} fixtures. Damaged files: "
               f"{g('error', 0)} rejected with a TezipError ({g('unchanged', 0)} mutations "
               f"left the bytes unchanged). Resealed: {g('resealed_error', 0)} rejected, "
               f"{g('resealed_decoded', 0)} decoded to a well-formed array. Window damage "
               f"past the container checks: {g('window_error', 0)} rejected, "
               f"{g('window_ok', 0)} decoded to exactly the original. ")
    print(summary + (failure or "0 crashes, 0 other exceptions, 0 wrong data, 0 allocations "
                                "over the limits"), file=sys.stderr if failure else sys.stdout)
    row = {"seconds": round(dt), "seed": a.seed, "learned": not a.no_learned,
           "fixtures": n_fix, "cases": cases, "commit": _commit(), "counts": counts,
           "failure": failure}
    if a.out_json:
        old = json.loads(a.out_json.read_text()) if a.out_json.exists() else []
        with atomic_output(a.out_json, force=True) as tmp:
            Path(tmp).write_text(json.dumps([*old, row], indent=1) + "\n")
    if a.out_md:
        head = ("| run | code | cases | damaged: rejected | resealed: rejected | resealed: "
                "decoded to a well-formed array | window damage: rejected | window damage: "
                "exact original | failures |\n|---|---|---|---|---|---|---|---|---|\n")
        text = a.out_md.read_text() if a.out_md.exists() else (
            "# Fuzzed decoding (`benchmarks/fuzz_decoder.py`)\n\n" + head)
        text += (f"| {row['seconds']} s, seed {a.seed}, {n_fix} fixtures"
                 f"{'' if row['learned'] else ' (no learned)'} | {row['commit']} | {cases} | "
                 f"{g('error', 0)} | {g('resealed_error', 0)} | {g('resealed_decoded', 0)} | "
                 f"{g('window_error', 0)} | {g('window_ok', 0)} | {failure or 0} |\n")
        with atomic_output(a.out_md, force=True) as tmp:
            Path(tmp).write_text(text)
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
