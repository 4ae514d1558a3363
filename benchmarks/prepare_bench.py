"""Time ``tezip prepare`` with 1 and 2 MPI ranks on every *.npy stack in a directory.

    python benchmarks/prepare_bench.py [--data DIR] [--bound 1e-3] [--ranks 1,2]
        [--shard-size MB[,MB...]] [--repeat N] [--out-md FILE]

Each configuration runs as ``mpiexec -n R python -m tezip prepare DATA/*.npy --out TMP
--mode rel --bound B --shard-size S --force --json``, the configurations interleaved, best
of --repeat. Reported:

- wall s: the whole process, start-up (Python, numpy, MPI) included;
- prepare s: what prepare reports, from after start-up to the manifest written;
- MB/s: raw MB / prepare s; MB/s per rank: each rank's raw MB / its own busy time;
- speedup: 1-rank prepare s / R-rank prepare s (and the same on wall s).

The load average is printed too, and the speedup of two copies of a pure CPU loop over one
after another: the cores of this machine may be shared with other work, and that ceiling
says how much parallel speedup the machine offered at that moment.
Needs mpi4py and an MPI (``pip install -e .[mpi]``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    ranks: int
    shard_size: float
    wall: float
    seconds: float
    raw_mb: float
    ratio: float
    shards: int
    per_rank_mbs: list[float]


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        sys.exit("mpiexec not found: pip install -e .[mpi]")
    return found


def run_once(files: list[str], ranks: int, bound: float, shard: float, out: Path,
             predictor: str = "classical") -> Run:
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "tezip", "prepare", *files,
           "--out", str(out), "--mode", "rel", "--bound", str(bound), "--shard-size",
           str(shard), "--predictor", predictor, "--force", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"prepare failed ({p.returncode}): {p.stderr.strip()}")
    s = json.loads(p.stdout)
    return Run(ranks, shard, wall, s["seconds"], s["raw_bytes"] / 1e6, s["ratio"],
               s["shards"], [r["mb_per_s"] for r in s["per_rank"]])


_BURN = ("import time\nt = time.perf_counter()\nx = 0\nfor i in range(6_000_000):\n"
         "    x += i * i\nprint(time.perf_counter() - t)")


def machine_ceiling(n: int = 2, trials: int = 3) -> float:
    """How much faster n copies of a pure CPU loop finish than n runs one after another,
    on this machine right now (best times of a few interleaved trials): the most any
    n-rank run can gain here."""
    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _BURN], stdout=subprocess.PIPE,
                                text=True)

    solo, together = [], []
    for _ in range(trials):
        solo.append(float(start().communicate()[0]))
        procs = [start() for _ in range(n)]
        together.append(max(float(p.communicate()[0]) for p in procs))
    return n * min(solo) / min(together)


def table(runs: list[Run]) -> str:
    base = {r.shard_size: r for r in runs if r.ranks == 1}
    lines = ["| ranks | shard MB | shards | raw MB | ratio | wall s | prepare s | MB/s | "
             "MB/s per rank | speedup (prepare) | speedup (wall) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        b = base.get(r.shard_size)
        sp = f"{b.seconds / r.seconds:.2f}x" if b else "-"
        sw = f"{b.wall / r.wall:.2f}x" if b else "-"
        per = ", ".join(f"{v:.1f}" for v in r.per_rank_mbs)
        lines.append(f"| {r.ranks} | {r.shard_size:g} | {r.shards} | {r.raw_mb:.1f} | "
                     f"{r.ratio:.2f} | {r.wall:.2f} | {r.seconds:.2f} | "
                     f"{r.raw_mb / r.seconds:.1f} | {per} | {sp} | {sw} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.environ.get("TEZIP_DATA", "/work/shared/data"))
    ap.add_argument("--bound", type=float, default=1e-3)
    ap.add_argument("--predictor", default="classical",
                    help="as in the published table; 'auto' adds the learned predictor")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--shard-size", default="128,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out-md")
    a = ap.parse_args(argv)
    files = sorted(glob.glob(os.path.join(a.data, "*.npy")))
    if not files:
        sys.exit(f"no *.npy in {a.data}")
    ranks = [int(x) for x in a.ranks.split(",")]
    sizes = [float(x) for x in a.shard_size.split(",")]
    load = os.getloadavg()
    ceiling = max(ranks)
    if ceiling > 1:
        ceiling = machine_ceiling(ceiling)
    configs = [(shard, n) for shard in sizes for n in ranks]
    trials: dict[tuple[float, int], list[Run]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.repeat):      # interleaved, so a busy spell hits every config
            for shard, n in configs:
                # a fresh directory per run: a rerun with --force into a finished one fails
                # with 2 ranks ("shard-000003.tez.json already exists", 0.5 MB shards)
                out = Path(tmp) / f"ds{n}"
                shutil.rmtree(out, ignore_errors=True)
                r = run_once(files, n, a.bound, shard, out, a.predictor)
                trials[(shard, n)].append(r)
                print(f"  {n} rank(s), shard {shard:g} MB: {r.seconds:.2f} s", file=sys.stderr)
    runs = [min(trials[c], key=lambda r: r.seconds) for c in configs]
    md = (f"`prepare` of {', '.join(os.path.basename(f) for f in files)} at rel {a.bound:g}, "
          f"best of {a.repeat}, {os.cpu_count()} cores, load average before the run "
          f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; {max(ranks)} copies of a pure CPU "
          f"loop ran {ceiling:.2f}x faster than one after another (the ceiling for the "
          f"speedup on this machine at that moment)\n\n" + table(runs))
    print(md)
    if a.out_md:
        Path(a.out_md).write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
