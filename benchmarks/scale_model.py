"""A model of training-data throughput at scale, checked against this machine's loader runs.

    python benchmarks/loader_bench.py          # measures the inputs (results/loader.json)
    python benchmarks/scale_model.py           # results/scale_model.{md,png}

Per GPU, samples reach the model at the slowest of three rates (raw MB/s, divided by the
raw bytes of a sample for samples/s):

    storage   the GPU's share of the shared file system x the format's ratio (bytes
              that come from a node-local cache do not count against it)
    cpu       what the GPU's loader cores turn into samples: cores / (CPU seconds per
              sample in the workers + in the training process receiving it), and no
              more than one core's worth for each of the two (workers <= cores; the
              hand-off runs in one process)
    consume   what the GPU's training step takes (default 40 MB/s)

The shared file system gives ``fs_mbs`` to ``max(N, fs_gpus)`` GPUs: by default 9 GB/s
shared by the 2,160 GPUs of TSUBAME3.0 (about 4 MB/s each) whatever the job's size, and
B/N once the job is larger than that. A node-local cache of ``cache_gb`` holds a share
of the data set ``cache_gb x ratio / working set``: with units of a window (the
default shuffle) a node reads every shard, so its working set is the whole data set; with
``unit="shard"`` it is the node's share. Total samples/s = N x per GPU.

Inputs and where they come from (the figure says which are measured):

- raw bytes per sample, the ratios of blosc2/zstd and tezip classical shards: the data
  sets of ``loader_bench.py``;
- per format, the seconds one worker needs per sample and an epoch's fixed cost (the
  1-rank x 1-worker unthrottled warm epoch and a short epoch of the same run: two
  points), and the CPU seconds per sample the receiving (training) process spends
  (kernel accounting); "MB/s per core" = sample MB / (worker + receiver seconds);
- tezip learned: ratio and decode MB/s of ``tezip`` (auto) at 1e-3 in
  ``results/learned.json`` (``run_classical.py``, current uncompiled decoder; windows
  only), plus the receiver's cost measured with the classical shards; or
  ``--learned-ratio/--learned-mbs`` (then marked as assumed);
- the system: parameters (``System``; TSUBAME3.0-like defaults: 9 GB/s for 2,160 GPUs,
  7 cores per GPU).

Validation (``predict_run``): the same costs predict every other run of ``loader.json``
(1 rank x 2 workers and 2 ranks x 1 worker; throttled to 4 MB/s per rank, unthrottled
and in place; cold and warm epochs) with this machine as the system: a rank's samples at
the pace its CPU allows (a worker or a receiver is one core at most; all processes
together the machine's parallelism measured in the same run), after the fixed cost; in a
cold epoch each sample also waits for the shards first needed up to it (their bytes at
the ranks' throttled rates and the copy to local disk, whose cost per byte is solved
from the raw 1x1 cold epoch); where shards are first needed comes from the order itself
(``first_use`` in loader.json). Calibration rows are marked and not counted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
INF = math.inf


@dataclass(frozen=True)
class Format:
    name: str
    ratio: float
    cpu_worker: float        # CPU seconds per sample in the loader's workers
    cpu_main: float          # CPU seconds per sample in the process that trains
    sample_mb: float         # raw MB of one sample
    source: str              # where ratio and the CPU costs come from
    startup: float = 0.0     # seconds an epoch of the loader benchmark takes beyond its
                             # CPU work (starting workers, first batch), 1x1 warm run

    @property
    def core_mbs(self) -> float:
        """Raw MB/s one core turns into samples (workers and hand-off together)."""
        return self.sample_mb / (self.cpu_worker + self.cpu_main)


@dataclass(frozen=True)
class System:
    fs_mbs: float = 9000.0           # shared file system bandwidth, MB/s
    fs_gpus: int = 2160              # GPUs sharing it (the machine), at least
    cores_per_gpu: float = 7.0       # loader cores per GPU (TSUBAME3.0: 28 cores, 4 GPUs)
    consume_mbs: float = 40.0        # raw MB/s one GPU's training step takes
    gpus_per_node: int = 4
    cache_gb: float = 0.0            # node-local cache per node
    local_mbs: float = 2000.0        # node-local disk bandwidth per node (cache reads)
    dataset_tb: float = 10.0         # raw size of the data set (for the cache hit share)
    unit: str = "window"             # shuffle unit: "window" (every node reads every
                                     # shard) or "shard" (a node reads its share)


def fs_share(sys_: System, n: int) -> float:
    return sys_.fs_mbs / max(n, sys_.fs_gpus)


def cache_hit(fmt: Format, sys_: System, n: int) -> float:
    if sys_.cache_gb <= 0:
        return 0.0
    working = sys_.dataset_tb * 1e6        # raw MB a node needs per epoch
    if sys_.unit == "shard":
        working *= min(1.0, sys_.gpus_per_node / n)
    return min(1.0, sys_.cache_gb * 1e3 * fmt.ratio / working)


def per_gpu_mbs(fmt: Format, sys_: System, n: int, workers: float | None = None
                ) -> dict[str, float]:
    """Raw MB/s per GPU and what limits it. ``workers``: loader processes per GPU (default:
    all its cores); each is one core at most, as is the hand-off in the training process."""
    hit = cache_hit(fmt, sys_, n)
    fs = fs_share(sys_, n) * fmt.ratio / (1 - hit) if hit < 1 else INF
    local = sys_.local_mbs / sys_.gpus_per_node * fmt.ratio / hit if hit > 0 else INF
    w = sys_.cores_per_gpu if workers is None else workers
    s = fmt.sample_mb
    cpu = min(sys_.cores_per_gpu / (fmt.cpu_worker + fmt.cpu_main), w / fmt.cpu_worker,
              1 / fmt.cpu_main) * s
    rates = {"storage": min(fs, local), "cpu": cpu, "consume": sys_.consume_mbs}
    limit = min(rates, key=lambda k: rates[k])
    return {**rates, "rate": rates[limit], "limit": limit, "hit": hit}  # type: ignore[dict-item]


# ---------------------------------------------------------------------------------------
# inputs


def formats_from(loader: dict, learned: list[dict] | None, args: argparse.Namespace
                 ) -> tuple[list[Format], float]:
    meta = loader["meta"]
    s_mb = meta["raw_bytes_per_sample"] / 1e6
    rows = loader["rows"]

    def calib(fmt: str) -> tuple[float, float, float, str, float]:
        r = [x for x in rows if x["fmt"] == fmt and (x["ranks"], x["workers"]) == (1, 1)
             and x["rate"] == 0 and x["epoch"] == 1]
        if not r:
            sys.exit("loader.json has no 1x1 unthrottled run; rerun loader_bench.py")
        x = r[0]
        n, t = x["samples"], x["seconds"]
        cm = x["cpu_main"] / n
        if "short_seconds" in x:     # two points: per-sample time and fixed epoch cost
            ns, ts = x["short_samples"], x["short_seconds"]
            cw = max(cm, (t - ts) / (n - ns))
            return cw, cm, s_mb, src, max(0.0, ts - ns * cw)
        cw = x["cpu_workers"] / n
        return cw, cm, s_mb, src, max(0.0, t - n * max(cw, cm))
    src = "loader_bench 1x1 warm (measured)"
    out = [Format("raw", 1.0, *calib("raw")),
           Format("blosc2/zstd", meta["ratio"]["blosc2"], *calib("blosc2")),
           Format("tezip classical", meta["ratio"]["tez"], *calib("tez"))]
    ratio, mbs, note = args.learned_ratio, args.learned_mbs, "assumed"
    if learned and (ratio is None or mbs is None):
        rows_l = [r for r in learned if r["codec"] == "tezip" and
                  isinstance(r["bound"], float) and math.isclose(r["bound"], meta["bound"])]
        if rows_l:
            raw = sum(r["raw_bytes"] for r in rows_l)
            comp = sum(r["compressed_bytes"] for r in rows_l)
            secs = sum(r["raw_bytes"] / 1e6 / r["dec_mbs"] for r in rows_l)
            measured = (ratio is None, mbs is None)
            ratio = raw / comp if ratio is None else ratio
            mbs = raw / 1e6 / secs if mbs is None else mbs
            note = ("learned.json: ratio and windows-only decode of 'tezip' (auto) at "
                    f"{meta['bound']:g}, current decoder; hand-off cost of tezip classical"
                    if all(measured) else "partly assumed")
    if ratio is not None and mbs is not None:
        # the worker's cost: decoding at mbs, plus what the classical loader spends per
        # sample beyond decoding (measured) -- the same loader code
        classical = out[2]
        extra = max(0.0, classical.cpu_worker - s_mb / meta["decode"]["tez"])
        out.append(Format("tezip learned", ratio, s_mb / mbs + extra, classical.cpu_main,
                          s_mb, note))
    return out, s_mb


# ---------------------------------------------------------------------------------------
# validation on this machine


def stage_cost(loader: dict, formats: list[Format], cores: float) -> float:
    """Seconds per byte of staging a shard to node-local disk (copy, sha256, fsync): the
    value for which ``predict_run`` reproduces the raw format's 1x1 unthrottled cold
    epoch (where staging is nearly all of the time)."""
    row = next(r for r in loader["rows"] if r["fmt"] == "raw" and r["epoch"] == 0 and
               (r["ranks"], r["workers"], r["rate"]) == (1, 1, 0))
    lo, hi = 0.0, 1e-6
    while predict_run(formats[0], row, loader, cores, hi) > row["samples_s"] and hi < 1:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predict_run(formats[0], row, loader, cores, mid) > \
            row["samples_s"] else (lo, mid)
    return hi


def predict_run(fmt: Format, row: dict, loader: dict, cores: float, stage: float) -> float:
    """Samples/s of one loader run on this machine. A rank works through its samples at
    the pace its CPU allows (each worker and the main process one core at most, all
    processes of all ranks ``cores``), after a fixed start-up (from the 1x1 run). In a
    cold epoch through staging, sample k also waits until the shards first needed up to
    k have arrived: their bytes at the ranks' throttled rates (the node's cache is shared,
    so a shard is read once, by whichever rank asks first), plus the copy (seconds per MB
    from the raw 1x1 runs). The shards' first uses come from the order itself
    (``first_use`` in loader.json); with units of a window a rank needs most shards
    early, so staging and decoding overlap only in part."""
    meta = loader["meta"]
    r, w, n = row["ranks"], row["workers"], row["samples"]
    per_sample = max(fmt.cpu_worker / w, fmt.cpu_main,
                     (fmt.cpu_worker + fmt.cpu_main) * r / cores)
    cold = row["rate"] is not None and row["epoch"] == 0
    curves = meta.get("first_use", {}).get(f"{r}x{w}", {}).get(row["fmt"])
    finish = []
    for rank in range(r):
        n_r = n // r
        t = n_r * per_sample
        if cold:
            # copies go to one local disk (write + fsync): they do not run faster
            # with more workers
            per_byte = (1 / (r * row["rate"] * 1e6) if row["rate"] else 0.0) + stage
            total = meta["mb"][row["fmt"]] * 1e6
            if curves:
                # the ranks stage the shards they need in turn, so by the time a rank has
                # its c bytes the node has staged about c x (all shards / its shards)
                ks, cum = curves[rank]
                scale = max(1.0, total / cum[-1])
                t = max(t, max(c * scale * per_byte + (n_r - k) * per_sample
                               for k, c in zip(ks, cum, strict=True)))
            else:                 # no curve: all shards first, then the work
                t += total * per_byte
        finish.append(fmt.startup + t)
    return n / max(finish)


def machine_cores(loader: dict) -> float:
    """The parallelism the machine offered during the loader run (CPU-loop ceiling)."""
    meta = loader["meta"]
    return max(1.0, min(float(meta["cores"]), meta["ceiling"]))


def validate(loader: dict, formats: list[Format], s_mb: float) -> list[dict]:
    """Predict every loader run with this machine as the system."""
    cores = machine_cores(loader)
    stage = stage_cost(loader, formats, cores)
    by = {"raw": formats[0], "blosc2": formats[1], "tez": formats[2]}
    out = []
    for row in loader["rows"]:
        pred = predict_run(by[row["fmt"]], row, loader, cores, stage)
        calib = (row["ranks"], row["workers"], row["rate"]) == (1, 1, 0) and (
            row["epoch"] == 1 or row["fmt"] == "raw")
        where = ("in place" if row["rate"] is None else
                 f"{row['rate']:g} MB/s" if row["rate"] else "unthrottled")
        out.append({"fmt": row["fmt"], "layout": f"{row['ranks']}x{row['workers']}",
                    "storage": where, "epoch": row["epoch"], "measured": row["samples_s"],
                    "predicted": pred, "error": pred / row["samples_s"] - 1,
                    "calibration": calib})
    return out


# ---------------------------------------------------------------------------------------
# output


def plot(formats: list[Format], sys_: System, s_mb: float, path: Path,
         check: list[dict]) -> None:
    """Two panels (per GPU, in total), each format in its colour; solid: the file system
    shared by the machine's GPUs (``sys_``), dotted: the job alone on it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ns = [2 ** k for k in range(13)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
    colour = {"raw": "k", "blosc2/zstd": "tab:blue", "tezip classical": "tab:red",
              "tezip learned": "tab:purple"}
    alone = replace(sys_, fs_gpus=1)
    handles = []
    for f in formats:
        c = colour.get(f.name, "gray")
        for scenario, ls in ((sys_, "-"), (alone, ":")):
            per = [per_gpu_mbs(f, scenario, n)["rate"] / s_mb for n in ns]
            axes[0].plot(ns, per, color=c, ls=ls, marker="o" if ls == "-" else None, ms=3)
            axes[1].plot(ns, [p * n for p, n in zip(per, ns, strict=True)], color=c, ls=ls,
                         marker="o" if ls == "-" else None, ms=3)
        label = f"{f.name}: ratio {f.ratio:.2f}, {f.core_mbs:.0f} MB/s per core"
        if f.name == "tezip learned":
            label += ("\n  (learned.json: current decoder, not run through the loader)"
                      if f.source.startswith("learned.json") else "\n  (ASSUMED values)")
        handles.append(Line2D([], [], color=c, marker="o", ms=3, label=label))
    handles += [Line2D([], [], color="gray", ls="-",
                       label=f"FS {sys_.fs_mbs / 1000:g} GB/s shared by "
                             f"max(N, {sys_.fs_gpus}) GPUs"),
                Line2D([], [], color="gray", ls=":", label="FS for this job alone (B / N)")]
    cap = sys_.consume_mbs / s_mb
    axes[0].axhline(cap, color="gray", lw=0.8, ls="--")
    axes[0].text(1.2, cap * 1.1, f"GPU consumes {sys_.consume_mbs:g} MB/s", fontsize=8,
                 color="gray")
    for ax, title in zip(axes, ("samples/s per GPU", "samples/s in total"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylim(top=cap * 2)
    axes[1].legend(handles=handles, fontsize=7, loc="lower right")
    ok = [x for x in check if not x["calibration"]]
    err = max(abs(x["error"]) for x in ok) if ok else float("nan")
    note = (f"{sys_.cores_per_gpu:g} loader cores per GPU; {s_mb:.2f} MB per sample; node "
            f"cache {sys_.cache_gb:g} GB. Ratios and CPU costs per sample measured on a "
            f"2-core machine (loader_bench.py, classical predictors, rel 1e-3);\nthe same "
            f"costs predict {len(ok)} loader runs there within {err:.0%} "
            f"(benchmarks/results/scale_model.md).")
    fig.text(0.01, 0.01, note, fontsize=7.5)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=130, format="png")


def report(formats: list[Format], sys_: System, s_mb: float, check: list[dict],
           args: argparse.Namespace, loader: dict) -> str:
    lines = ["### Inputs", "", "| format | ratio | worker CPU ms / sample | hand-off CPU ms / "
             "sample | MB/s per core | source |", "|---|---|---|---|---|---|"]
    lines += [f"| {f.name} | {f.ratio:.2f} | {f.cpu_worker * 1e3:.2f} | "
              f"{f.cpu_main * 1e3:.2f} | {f.core_mbs:.1f} | {f.source} |" for f in formats]
    lines += ["", f"System: {json.dumps(asdict(sys_))}; {s_mb:.3f} MB per sample.", "",
              "### Predicted samples/s (per GPU / total; what limits it)", "",
              "| GPUs | " + " | ".join(f.name for f in formats) + " |",
              "|---|" + "---|" * len(formats)]
    for n in (1, 8, 64, 256, 1024, 2160, 4096):
        cells = []
        for f in formats:
            r = per_gpu_mbs(f, sys_, n)
            cells.append(f"{r['rate'] / s_mb:.0f} / {n * r['rate'] / s_mb:.0f} ({r['limit']})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    ok = [c for c in check if not c["calibration"]]
    worst = max((abs(c["error"]) for c in ok), default=float("nan"))
    lines += ["", "### Check against this machine's loader runs", "",
              f"Largest error {worst:.0%} over {len(ok)} runs; calibration rows excluded. "
              f"Machine parallelism {loader['meta']['ceiling']:.2f} (from the same run), "
              f"staging {stage_cost(loader, formats, machine_cores(loader)) * 1e9:.1f} ms "
              "per MB.", "",
              "| format | ranks x workers | storage | epoch | measured | predicted | error |",
              "|---|---|---|---|---|---|---|"]
    for c in check:
        lines.append(f"| {c['fmt']} | {c['layout']} | {c['storage']} | {c['epoch']} | "
                     f"{c['measured']:.1f} | {c['predicted']:.1f} | "
                     f"{c['error']:+.0%}{' (calibration)' if c['calibration'] else ''} |")
    lines += ["", "Command: `python benchmarks/scale_model.py "
              + " ".join(args.argv) + "`"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loader", type=Path, default=RESULTS / "loader.json")
    ap.add_argument("--learned", type=Path, default=RESULTS / "learned.json")
    ap.add_argument("--learned-ratio", type=float, help="assume this ratio for learned")
    ap.add_argument("--learned-mbs", type=float, help="assume this MB/s per core")
    d = System()
    for name, v in asdict(d).items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(v), default=v)
    ap.add_argument("--out", type=Path, default=RESULTS / "scale_model")
    args = ap.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    loader = json.loads(args.loader.read_text())
    learned = json.loads(args.learned.read_text()) if args.learned.exists() else None
    formats, s_mb = formats_from(loader, learned, args)
    sys_ = replace(d, **{k: getattr(args, k) for k in asdict(d)})
    check = validate(loader, formats, s_mb)
    md = report(formats, sys_, s_mb, check, args, loader)
    print(md)
    from tezip.io import atomic_output
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(args.out.with_suffix(".md"), force=True) as tmp:
        Path(tmp).write_text(md + "\n")
    with atomic_output(args.out.with_suffix(".png"), force=True) as tmp:
        plot(formats, sys_, s_mb, Path(tmp), check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
