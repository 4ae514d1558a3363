"""Start-up time of the command line: wall seconds of whole processes (best of ``--repeat``),
each on a file too small for its work to count, next to the floors a numba program
cannot go under on the same machine: Python alone, ``import numba``, and numba's first
call of a cached function (numba builds its compiler's tables once per process, even to
load compiled code from its disk cache).

    python benchmarks/startup.py [--repeat 5] [--md benchmarks/results/startup.md] [--base DIR]

``--base DIR``: also time an older ``tezip`` package (``git archive REV tezip | tar -x -C
DIR``), alternating with this checkout. Kernels are compiled (or loaded) once before
timing, so no row pays a first compile.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from tezip.atomic import atomic_output

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_NUMBA_FIRST = """
import numba, numpy as np
@numba.njit(cache=True)
def f(a):
    return a.sum()
f(np.ones(3))
"""


def _commands(tmp: str) -> list[tuple[str, list[str]]]:
    py = sys.executable
    tez = os.path.join(tmp, "tiny.tez")
    return [
        ("python -c pass", [py, "-c", "pass"]),
        ("python -c 'import numba'", [py, "-c", "import numba"]),
        ("numba: import and first call of a cached function",
         [py, os.path.join(tmp, "numba_first.py")]),
        ("tezip --help", [py, "-m", "tezip", "--help"]),
        ("tezip info tiny.tez", [py, "-m", "tezip", "info", tez]),
        ("tezip compress tiny.npy (classical)",
         [py, "-m", "tezip", "compress", os.path.join(tmp, "tiny.npy"),
          os.path.join(tmp, "out.tez"), "--mode", "rel", "--bound", "1e-3", "--predictor",
          "classical", "--force"]),
        ("tezip decompress tiny.tez", [py, "-m", "tezip", "decompress", tez,
                                       os.path.join(tmp, "out.npy"), "--force"]),
    ]


def _time(cmd: list[str], env: dict) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd="/")
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--md", default=None)
    ap.add_argument("--base", default=None, help="directory holding an older tezip package")
    a = ap.parse_args(argv)
    trees = {"this": REPO} if a.base is None else {"base": a.base, "this": REPO}
    with tempfile.TemporaryDirectory() as tmp:
        x = np.sin(np.arange(4 * 16 * 16, dtype=np.float32) / 7).reshape(4, 16, 16)
        np.save(os.path.join(tmp, "tiny.npy"), x)
        with open(os.path.join(tmp, "numba_first.py"), "w") as f:
            f.write(_NUMBA_FIRST)
        # bytecode written (as a pip install does), also where the caller's environment
        # says not to: compiling tezip's modules from source took 60 ms of every command
        base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        envs = {k: {**base_env, "PYTHONPATH": v, "TEZIP_PROGRESS": "0"}
                for k, v in trees.items()}
        cmds = _commands(tmp)
        for env in envs.values():    # compile / load every kernel and cache once
            subprocess.run(cmds[-2][1], env=env, check=True, capture_output=True, cwd="/")
            subprocess.run([sys.executable, "-m", "tezip", "compress",
                            os.path.join(tmp, "tiny.npy"), os.path.join(tmp, "tiny.tez"),
                            "--mode", "rel", "--bound", "1e-3", "--force"],
                           env=env, check=True, capture_output=True, cwd="/")
            subprocess.run(cmds[-1][1], env=env, check=True, capture_output=True, cwd="/")
            subprocess.run(cmds[2][1], env=env, check=True, capture_output=True, cwd="/")
        best = {(k, name): float("inf") for k in trees for name, _ in cmds}
        for _ in range(a.repeat):
            for name, cmd in cmds:
                for k, env in envs.items():
                    best[k, name] = min(best[k, name], _time(cmd, env))
    head = "| command | " + " | ".join(f"{k} s" for k in trees) + " |"
    lines = [
        "# Start-up time",
        "",
        f"`python benchmarks/startup.py --repeat {a.repeat}"
        + (f" --base {a.base}" if a.base else "") + "`: wall seconds of a whole process, "
        "best of the repeats, on a 4 x 16 x 16 float32 stack; kernels compiled and "
        "modules' bytecode written before.",
        "",
        head,
        "|---|" + "---|" * len(trees),
    ]
    for name, _ in cmds:
        lines.append(f"| {name} | " + " | ".join(f"{best[k, name]:.2f}" for k in trees) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.md:
        with atomic_output(a.md, force=True) as tmp_md, open(tmp_md, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
