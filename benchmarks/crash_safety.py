"""Crash safety: SIGKILL ``tezip compress``, ``decompress`` and ``prepare`` at random moments,
then check what is left and that a rerun succeeds.

    python benchmarks/crash_safety.py [--trials 20] [--frames 256] [--seed 0]
        [--workdir DIR] [--out-md benchmarks/results/crash_safety.md]

Per trial the command runs as a subprocess (``python -m tezip ...``; for some prepare
trials under ``mpiexec -n 2``) in its own process group, and the whole group gets SIGKILL
after a delay drawn uniformly from [0, typical runtime] (measured once per command
beforehand). Then:

- no file may exist under the final output name unless it is complete and valid:
  compress: the .tez decodes and equals the reference decode; decompress (to .npy, or .h5
  in every third trial): the output equals the reference; prepare: ``manifest.json``
  exists only if ``tezip verify DIR`` exits 0;
- the same command is run again (compress gets ``--force`` only if the killed run had
  already finished and left its output; decompress likewise; prepare never: it resumes)
  and must succeed with a correct result (prepare: ``tezip verify DIR`` passes and the
  decoded frames equal those of a reference 1-rank run);
- temporary files (``.NAME.*tmp*`` next to the output, ``.shard-*``/``.manifest.json.*``
  in a prepare directory) are counted after the kill and after the rerun.

Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CODEC = ["--mode", "rel", "--bound", "1e-3", "--predictor", "classical"]


def make_stack(frames: int, side: int, seed: int) -> np.ndarray:
    """A smooth field drifting in time plus noise, float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames, dtype=np.float32)[:, None, None] / 32
    y = np.linspace(0, 1, side, dtype=np.float32)[None, :, None]
    x = np.linspace(0, 1, side, dtype=np.float32)[None, None, :]
    a = np.sin(6 * x + 2 * t + seed) * np.cos(5 * y - t) + 0.3 * np.sin(17 * (x + y) - 3 * t)
    return (a + 0.01 * rng.standard_normal(a.shape, dtype=np.float32)).astype(np.float32)


def tezip_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tezip", *args]


def mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if cmd[0] != mpiexec():
        env["TEZIP_MPI"] = "0"  # a plain run is one rank, whatever the environment says
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def kill_after(cmd: list[str], delay: float) -> tuple[bool, int]:
    """Start ``cmd`` in a new process group, SIGKILL the group after ``delay`` s.
    Returns (killed before it finished, return code)."""
    env = dict(os.environ)
    if cmd[0] != mpiexec():
        env["TEZIP_MPI"] = "0"
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=env)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=delay)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # the group id is the leader's pid
    rc = p.wait()
    # wait until no member of the group is left (MPI ranks are grandchildren)
    for _ in range(200):
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        raise RuntimeError(f"processes of group {p.pid} survived SIGKILL")
    return rc == -signal.SIGKILL, rc


def temp_files(directory: Path, name: str | None = None) -> list[str]:
    """Hidden temporary files in ``directory`` (of output ``name``, or of a data set)."""
    out = []
    for e in os.scandir(directory):
        if name is not None:
            if e.name.startswith(f".{name}.") and "tmp" in e.name:
                out.append(e.name)
        elif e.name.startswith(".") and "tmp" in e.name:
            out.append(e.name)
    return sorted(out)


def decode_tez(path: Path) -> np.ndarray:
    import tezip

    with tezip.open(str(path)) as f:
        return f.read_all()


def load_output(path: Path) -> np.ndarray:
    if path.suffix == ".npy":
        return np.load(path)
    import h5py

    with h5py.File(path, "r") as f:
        return f["/data"][()]


def decode_dataset(directory: Path) -> np.ndarray:
    m = json.loads((directory / "manifest.json").read_text())
    return np.concatenate([decode_tez(directory / s["file"]) for s in m["shards"]])


@dataclass
class Row:
    command: str
    trials: int = 0
    killed_before: int = 0
    killed_after: int = 0
    present_valid: int = 0
    absent: int = 0
    rerun_ok: int = 0
    temp_after_kill: int = 0
    temp_after_rerun: int = 0
    trials_with_temp: int = 0
    failures: list[str] = field(default_factory=list)

    def record_kill(self, killed: bool) -> None:
        self.trials += 1
        if killed:
            self.killed_before += 1
        else:
            self.killed_after += 1


class Harness:
    def __init__(self, work: Path, frames: int, side: int, shard_mb: float, rng: random.Random,
                 prepare_inputs: int = 3, log: bool = True, mpi: bool = True) -> None:
        self.work = work
        self.rng = rng
        self.shard_mb = shard_mb
        self.log = log
        work.mkdir(parents=True, exist_ok=True)
        self.src = work / "stack.npy"
        np.save(self.src, make_stack(frames, side, 0))
        self.inputs = []
        for i in range(prepare_inputs):
            p = work / f"in{i}.npy"
            np.save(p, make_stack(max(32, frames // 2), side, i + 1))
            self.inputs.append(str(p))
        # references, and the typical runtime of each command
        self.ref_tez = work / "ref.tez"
        t = time.perf_counter()
        self._ok(run(tezip_cmd("compress", str(self.src), str(self.ref_tez), *CODEC)))
        self.t_compress = time.perf_counter() - t
        self.ref = decode_tez(self.ref_tez)
        t = time.perf_counter()
        self._ok(run(tezip_cmd("decompress", str(self.ref_tez), str(work / "ref_out.npy"))))
        self.t_decompress = time.perf_counter() - t
        (work / "ref_out.npy").unlink()
        self.ref_dir = work / "ref_prepared"
        t = time.perf_counter()
        self._ok(run(self.prepare_cmd(self.ref_dir, 1)))
        self.t_prepare = {1: time.perf_counter() - t}
        self.ref_frames = decode_dataset(self.ref_dir)
        if mpi and mpiexec():
            d = work / "ref_prepared2"
            t = time.perf_counter()
            self._ok(run(self.prepare_cmd(d, 2)))
            self.t_prepare[2] = time.perf_counter() - t
            if not np.array_equal(decode_dataset(d), self.ref_frames):
                raise RuntimeError("2-rank prepare decodes to other frames than 1-rank")
            shutil.rmtree(d)
        n_shards = len(json.loads((self.ref_dir / "manifest.json").read_text())["shards"])
        self.say(f"reference: compress {self.t_compress:.2f} s, decompress "
                 f"{self.t_decompress:.2f} s, prepare "
                 + ", ".join(f"{r} rank(s) {s:.2f} s" for r, s in self.t_prepare.items())
                 + f" ({n_shards} shards)")

    def say(self, text: str) -> None:
        if self.log:
            print(text, flush=True)

    @staticmethod
    def _ok(r: subprocess.CompletedProcess) -> None:
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(r.args)} failed: {r.stderr.strip()[-500:]}")

    def prepare_cmd(self, out: Path, ranks: int) -> list[str]:
        cmd = tezip_cmd("prepare", *self.inputs, "--out", str(out), *CODEC,
                        "--shard-size", str(self.shard_mb), "--quiet")
        if ranks > 1:
            mpi = mpiexec()
            assert mpi is not None
            cmd = [mpi, "-n", str(ranks), *cmd]
        return cmd

    # -- compress and decompress: one output file -----------------------------------
    def _file_trials(self, name: str, n: int, t_ref: float, out_of, cmd_of, load,
                     keep: bool) -> Row:
        """``n`` trials of one command writing one file: kill at a random moment, check
        that the output is absent or complete and correct, rerun, check again."""
        row = Row(name)
        for i in range(n):
            out = out_of(i)
            delay = self.rng.uniform(0, t_ref)
            killed, _ = kill_after(tezip_cmd(*cmd_of(out)), delay)
            row.record_kill(killed)
            fail = len(row.failures)
            present = out.exists()
            if present:
                try:
                    if np.array_equal(load(out), self.ref):
                        row.present_valid += 1
                    else:
                        row.failures.append(f"{name} trial {i}: {out.name} differs")
                except Exception as exc:  # noqa: BLE001 - any failure to decode is the finding
                    row.failures.append(f"{name} trial {i}: partial {out.name}: {exc}")
            else:
                row.absent += 1
            tmp = temp_files(self.work, out.name)
            row.temp_after_kill += len(tmp)
            row.trials_with_temp += bool(tmp)
            force = ["--force"] if present else []
            r = run(tezip_cmd(*cmd_of(out), *force))
            if r.returncode == 0 and np.array_equal(load(out), self.ref):
                row.rerun_ok += 1
            else:
                row.failures.append(f"{name} trial {i}: rerun failed: {r.stderr.strip()}")
            row.temp_after_rerun += len(temp_files(self.work, out.name))
            if not keep:
                out.unlink(missing_ok=True)
            self.say(f"{name} {i} ({out.suffix}): kill at {delay:.2f} s, "
                     f"{'killed' if killed else 'finished'}, output "
                     f"{'present' if present else 'absent'}, {len(tmp)} temp file(s)"
                     + ("" if len(row.failures) == fail else " FAIL"))
        return row

    def compress_trials(self, n: int) -> Row:
        return self._file_trials(
            "compress", n, self.t_compress, lambda i: self.work / f"c{i}.tez",
            lambda out: ("compress", str(self.src), str(out), *CODEC), decode_tez, keep=True)

    def decompress_trials(self, n: int) -> Row:
        return self._file_trials(
            "decompress", n, self.t_decompress,
            lambda i: self.work / (f"d{i}.h5" if i % 3 == 2 else f"d{i}.npy"),
            lambda out: ("decompress", str(self.ref_tez), str(out)), load_output, keep=False)

    # -- prepare ----------------------------------------------------------------------
    def prepare_trials(self, n: int, mpi_every: int = 3) -> Row:
        row = Row("prepare")
        for i in range(n):
            ranks = 2 if (mpi_every and i % mpi_every == 1 and 2 in self.t_prepare) else 1
            out = self.work / f"p{i}"
            delay = self.rng.uniform(0, self.t_prepare[ranks])
            killed, _ = kill_after(self.prepare_cmd(out, ranks), delay)
            row.record_kill(killed)
            fail = len(row.failures)
            present = (out / "manifest.json").exists()
            if present:
                r = run(tezip_cmd("verify", str(out)))
                if r.returncode == 0:
                    row.present_valid += 1
                else:
                    row.failures.append(f"prepare trial {i}: manifest present but verify "
                                        f"failed: {r.stdout.strip()[-300:]}")
            else:
                row.absent += 1
            tmp = temp_files(out) if out.is_dir() else []
            row.temp_after_kill += len(tmp)
            row.trials_with_temp += bool(tmp)
            r = run(self.prepare_cmd(out, ranks))
            v = run(tezip_cmd("verify", str(out))) if r.returncode == 0 else None
            if (r.returncode == 0 and v is not None and v.returncode == 0
                    and np.array_equal(decode_dataset(out), self.ref_frames)):
                row.rerun_ok += 1
            else:
                row.failures.append(f"prepare trial {i} ({ranks} ranks): rerun failed: "
                                    f"{r.stderr.strip()[-300:]} "
                                    f"{v.stdout.strip()[-300:] if v else ''}")
            row.temp_after_rerun += len(temp_files(out))
            shutil.rmtree(out, ignore_errors=True)
            self.say(f"prepare {i} ({ranks} rank{'s' if ranks > 1 else ''}): kill at "
                     f"{delay:.2f} s, {'killed' if killed else 'finished'}, manifest "
                     f"{'present' if present else 'absent'}, {len(tmp)} temp file(s)"
                     + ("" if len(row.failures) == fail else " FAIL"))
        return row


def table(rows: list[Row]) -> str:
    lines = ["| command | trials | killed before finish | killed after finish | "
             "output present and valid | output absent | rerun ok | temp files left by kills "
             "(trials with any) | temp files after rerun |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.command} | {r.trials} | {r.killed_before} | {r.killed_after} | "
                     f"{r.present_valid} | {r.absent} | {r.rerun_ok} | {r.temp_after_kill} "
                     f"({r.trials_with_temp}) | {r.temp_after_rerun} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--side", type=int, default=256)
    ap.add_argument("--shard-size", type=float, default=1.0, help="prepare --shard-size, MB")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", help="default: a temporary directory, removed afterwards")
    ap.add_argument("--out-md", default=str(HERE / "results" / "crash_safety.md"))
    a = ap.parse_args()
    own = a.workdir is None
    work = Path(tempfile.mkdtemp(prefix="tezip_crash_")) if own else Path(a.workdir)
    t0 = time.perf_counter()
    try:
        h = Harness(work, a.frames, a.side, a.shard_size, random.Random(a.seed))
        rows = [h.compress_trials(a.trials), h.decompress_trials(a.trials),
                h.prepare_trials(a.trials)]
        ref = (f"reference runs: compress {h.t_compress:.2f} s, decompress "
               f"{h.t_decompress:.2f} s, prepare "
               + ", ".join(f"{r} rank(s) {s:.2f} s" for r, s in h.t_prepare.items()))
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    failures = [f for r in rows for f in r.failures]
    md = "\n".join([
        "# Crash safety",
        "",
        f"`python benchmarks/crash_safety.py --trials {a.trials} --frames {a.frames} "
        f"--side {a.side} --shard-size {a.shard_size} --seed {a.seed}`: float32 "
        f"({a.frames}, {a.side}, {a.side}) smooth field + noise, `{' '.join(CODEC)}`; "
        f"prepare on 3 stacks of {max(32, a.frames // 2)} frames with "
        f"`--shard-size {a.shard_size}`, every third trial under `mpiexec -n 2`; "
        f"decompress to .h5 in every third trial, else .npy. SIGKILL to the whole process "
        f"group at a uniform random moment in [0, reference runtime]; {ref}.",
        "",
        table(rows),
        "",
        f"Failures: {len(failures)}" + "".join(f"\n- {f}" for f in failures),
        f"\nTotal {time.perf_counter() - t0:.0f} s.",
        "",
    ])
    print(md)
    Path(a.out_md).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out_md).write_text(md)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
