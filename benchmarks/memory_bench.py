"""Bounded memory: compress, decompress and verify an HDF5 stack several times larger than
the memory each command may use.

    python benchmarks/memory_bench.py                      # 1024 x 1024 x 1024 float32, 4.3 GB
    python benchmarks/memory_bench.py --frames 64                  # a quicker run
    python benchmarks/memory_bench.py --frames 64 --window-sweep 16,8,4   # peak per window

Builds (or reuses) ``WORKDIR/big.h5`` with a float32 dataset ``/entry/data/data`` (a smooth
evolving field plus noise, chunked one frame per chunk, written slab by slab so generation
itself stays in bounded memory), then runs, each in its own subprocess::

    tezip compress big.h5 big.tez --dataset /entry/data/data --mode rel --bound 1e-3 \
        --predictor classical --window 8
    tezip decompress big.tez restored.h5
    tezip verify big.h5 big.tez --dataset /entry/data/data --no-ssim

The limit is enforced with ``RLIMIT_AS`` (virtual address space, set in the child before
exec): stricter than a limit on resident memory, since every mapping counts whether touched
or not. cgroup memory limits are not available to this benchmark here. Peak RSS per
command comes from ``os.wait4`` (the child's own ``ru_maxrss``). Results go to
``benchmarks/results/memory.md``.

``--window-sweep W1,W2,...`` instead compresses the stack once per window length, without
a limit, and writes the peak RSS of each to ``benchmarks/results/memory_windows.md``:
memory depends on the window, not on the stack.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tezip.atomic import atomic_output  # noqa: E402

DATASET = "/entry/data/data"


def field_slab(t0: int, t1: int, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Frames [t0, t1) of a smooth field drifting in time, plus noise (float32)."""
    y = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :]
    out = np.empty((t1 - t0, h, w), np.float32)
    for i, t in enumerate(range(t0, t1)):
        s = np.float32(t / 64.0)
        f = np.sin(7.0 * x + 2.0 * s) * np.cos(5.0 * y - 1.3 * s)
        f += 0.5 * np.sin(19.0 * (x + y) - 3.1 * s) * np.exp(-((x - 0.5) ** 2) * 4.0)
        f += 0.002 * rng.standard_normal((h, w), dtype=np.float32)
        out[i] = f
    return out


def build(path: Path, shape: tuple[int, int, int], slab: int = 16) -> float:
    """Write the stack slab by slab; returns seconds. Reuses a file of the right shape."""
    import h5py

    if path.exists():
        try:
            with h5py.File(path, "r") as f:
                if f[DATASET].shape == shape and f.attrs.get("complete"):
                    return 0.0
        except (OSError, KeyError):
            pass
    rng = np.random.default_rng(12345)
    t = time.perf_counter()
    with atomic_output(path, force=True) as tmp, h5py.File(tmp, "w") as f:
        ds = f.create_dataset(DATASET, shape=shape, dtype=np.float32,
                              chunks=(1, shape[1], shape[2]))
        ds.attrs["units"] = "counts"
        for t0 in range(0, shape[0], slab):
            t1 = min(shape[0], t0 + slab)
            ds[t0:t1] = field_slab(t0, t1, shape[1], shape[2], rng)
        f.attrs["complete"] = True
    return time.perf_counter() - t


def run_limited(args: list[str], limit: int) -> dict:
    """Run ``python -m tezip ARGS`` with RLIMIT_AS = limit bytes; wall time, peak RSS."""

    def pre() -> None:
        if limit != resource.RLIM_INFINITY:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "tezip", *args], preexec_fn=pre,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = b"", b""
    # read the pipes after the child is gone (the outputs are a few lines)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = p.stdout.read(), p.stderr.read()  # type: ignore[union-attr]
    p.stdout.close()  # type: ignore[union-attr]
    p.stderr.close()  # type: ignore[union-attr]
    dt = time.perf_counter() - t
    return {"cmd": "tezip " + " ".join(args), "rc": p.returncode, "seconds": dt,
            "peak_rss_mb": usage.ru_maxrss / 1024, "stdout": out.decode().strip(),
            "stderr": err.decode().strip()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/tezip_mem")
    ap.add_argument("--frames", type=int, default=1024)
    ap.add_argument("--size", type=int, default=1024, help="frame height and width")
    ap.add_argument("--limit-mb", type=int, default=1024, help="RLIMIT_AS per command, MiB")
    ap.add_argument("--window", type=int, default=8,
                    help="compress --window; the default 16 needs about 1.5 GB for one window "
                         "of 1024 x 1024 frames, more than a 1 GiB limit")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep big.tez and restored.h5")
    ap.add_argument("--out-md", default=None,
                    help="default: results/memory.md (results/memory_windows.md with "
                         "--window-sweep)")
    ap.add_argument("--window-sweep", help="comma-separated window lengths: peak RSS of "
                                           "compress per window, no limit")
    a = ap.parse_args()
    if a.window_sweep:
        return sweep(a)
    a.out_md = a.out_md or str(HERE / "results" / "memory.md")

    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    shape = (a.frames, a.size, a.size)
    big, tez, restored = work / "big.h5", work / "big.tez", work / "restored.h5"
    gen_s = build(big, shape)
    gen_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    raw = int(np.prod(shape)) * 4
    print(f"input {big}: {shape} float32, {raw / 1e9:.2f} GB "
          f"({'reused' if gen_s == 0 else f'built in {gen_s:.0f} s'}, "
          f"generator peak RSS {gen_rss:.0f} MB)", flush=True)
    limit = a.limit_mb << 20
    runs = {}
    cmds = {
        "compress": ["compress", str(big), str(tez), "--dataset", DATASET, "--mode", "rel",
                     "--bound", "1e-3", "--predictor", "classical", "--window",
                     str(a.window), "--force"],
        "decompress": ["decompress", str(tez), str(restored), "--force"],
        "verify": ["verify", str(big), str(tez), "--dataset", DATASET, "--no-ssim", "--json"],
    }
    if a.no_verify:
        del cmds["verify"]
    for name, args in cmds.items():
        r = run_limited(args, limit)
        runs[name] = r
        print(f"{name}: rc {r['rc']}, {r['seconds']:.1f} s, {raw / 1e6 / r['seconds']:.1f} MB/s, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB; {r['stderr'][-300:]}", flush=True)
        if r["rc"] != 0 and name == "compress":
            break
    ratio = raw / tez.stat().st_size if tez.exists() else None
    verify = None
    if "verify" in runs and runs["verify"]["rc"] in (0, 1):
        try:
            verify = json.loads(runs["verify"]["stdout"])
        except ValueError:
            verify = None
    restored_ok = None
    if runs.get("decompress", {}).get("rc") == 0:
        restored_ok = restored.stat().st_size >= raw
    md = [
        "# Bounded memory",
        "",
        f"`python benchmarks/memory_bench.py --frames {a.frames} --size {a.size} "
        f"--limit-mb {a.limit_mb}`",
        "",
        f"- Input: HDF5 `{DATASET}`, {shape} float32, chunks (1, {a.size}, {a.size}), "
        f"{raw / 1e9:.2f} GB ({raw / limit:.1f}x the limit); smooth drifting field + noise.",
        f"- Limit: `RLIMIT_AS` = {a.limit_mb} MiB of virtual address space per command, set "
        "in the child before exec (every mapping counts, so resident memory stays below "
        "it). Peak RSS from `os.wait4` (the child's own `ru_maxrss`).",
        f"- Options: `--mode rel --bound 1e-3 --predictor classical --window {a.window}`.",
        "",
        "| command | exit | wall s | MB/s (raw) | peak RSS MB |",
        "|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        md.append(f"| {name} | {r['rc']} | {r['seconds']:.1f} | {raw / 1e6 / r['seconds']:.1f} | "
                  f"{r['peak_rss_mb']:.0f} |")
    md.append("")
    if ratio is not None:
        md.append(f"- Compressed: {tez.stat().st_size / 1e6:.1f} MB, ratio {ratio:.2f}.")
    if restored_ok is not None:
        md.append(f"- Restored HDF5: {restored.stat().st_size / 1e9:.2f} GB written.")
    if verify is not None:
        md.append(f"- verify: exit {runs['verify']['rc']}, bound {verify['bound_mode']} "
                  f"{'OK' if verify['ok'] else 'VIOLATED'} ({verify['violations']} violations), "
                  f"max abs error {verify['max_abs_error']:.4g}, PSNR {verify['psnr']:.2f} dB.")
    for name, r in runs.items():
        if r["rc"] != 0:
            md.append(f"- {name} failed: `{r['stderr'][-300:]}`")
    Path(a.out_md).parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(a.out_md, force=True) as tmp:
        Path(tmp).write_text("\n".join(md) + "\n")
    print("\n".join(md))
    if not a.keep:
        restored.unlink(missing_ok=True)
    ok = all(r["rc"] == 0 for r in runs.values()) and len(runs) == len(cmds)
    return 0 if ok else 1


def sweep(a: argparse.Namespace) -> int:
    """Peak RSS of compress for each window length, no memory limit."""
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    shape = (a.frames, a.size, a.size)
    big, tez = work / f"sweep_{a.frames}x{a.size}.h5", work / "sweep.tez"
    build(big, shape)
    raw = int(np.prod(shape)) * 4
    windows = [int(w) for w in a.window_sweep.split(",")]
    md = ["# Memory per window length", "",
          f"`python benchmarks/memory_bench.py --frames {a.frames} --size {a.size} "
          f"--window-sweep {a.window_sweep}` (commit {_commit()})", "",
          f"- Input: HDF5 `{DATASET}`, {shape} float32, {raw / 1e6:.0f} MB.",
          "- `tezip compress --mode rel --bound 1e-3 --predictor classical --window W`, no "
          "memory limit; peak RSS from `os.wait4` (the child's `ru_maxrss`).", "",
          "| window | frame values per window | exit | wall s | peak RSS MB | bytes per value "
          "of one window |", "|---|---|---|---|---|---|"]
    for w in windows:
        r = run_limited(["compress", str(big), str(tez), "--dataset", DATASET, "--mode", "rel",
                         "--bound", "1e-3", "--predictor", "classical", "--window", str(w),
                         "--force"], resource.RLIM_INFINITY)
        values = w * a.size * a.size
        md.append(f"| {w} | {values} | {r['rc']} | {r['seconds']:.1f} | "
                  f"{r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] * 2**20 / values:.0f} |")
        print(md[-1], flush=True)
    out = Path(a.out_md or HERE / "results" / "memory_windows.md")
    with atomic_output(out, force=True) as tmp:
        Path(tmp).write_text("\n".join(md) + "\n")
    tez.unlink(missing_ok=True)
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
