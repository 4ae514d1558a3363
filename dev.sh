#!/usr/bin/env bash
# Set-up and the two jobs a newcomer runs on a fresh machine (see README):
#   ./dev.sh demo   set up, build the sample stack, compress / decompress / verify it
#   ./dev.sh test   set up, run the fast test suite and the linter
# Set-up is idempotent: a virtual environment in .venv, re-installed when pyproject changes.
set -euo pipefail
cd "$(dirname "$0")"

setup() {
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  . .venv/bin/activate
  local stamp=.venv/.tezip-setup
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "== setting up .venv (first run takes a minute)"
    python -m pip install -q --upgrade pip
    # the CPU build from local disk: a bare 'torch' requirement would pull a CUDA build
    python -m pip install -q torch==2.13.0
    python -m pip install -q -e ".[dev]"
    echo "$want" > "$stamp"
  fi
}

demo() {
  setup
  mkdir -p out
  python datasets/build.py iris_sji2796 --out data
  echo "== compress (value-range relative bound 1e-3)"
  tezip compress data/iris_sji2796.npy out/iris_sji2796.tez --mode rel --bound 1e-3 --force
  tezip info out/iris_sji2796.tez
  echo "== decompress"
  tezip decompress out/iris_sji2796.tez out/iris_sji2796_restored.npy --force
  echo "== verify"
  tezip verify data/iris_sji2796.npy out/iris_sji2796.tez
}

# numba's disk cache knows only the file of each kernel: after an edit of a helper the
# kernels inline from another file (core.py, consts.py), the cached kernels would still
# run the old helper, and the tests with them. Clear the cache when any kernel source is
# newer than the oldest cache entry.
fresh_kernel_cache() {
  local d=tezip/kernels/__pycache__ oldest
  oldest=$(ls -tr "$d"/*.nbi 2>/dev/null | head -n 1 || true)
  if [ -n "$oldest" ] && [ -n "$(find tezip/kernels -maxdepth 1 -name '*.py' -newer "$oldest")" ]; then
    echo "== kernel sources changed since numba cached them: clearing the cache"
    rm -f "$d"/*.nbi "$d"/*.nbc
  fi
}

run_tests() {
  setup
  fresh_kernel_cache
  ruff check tezip tests datasets benchmarks examples
  # the suite in parallel processes (pytest-xdist), one per core up to four: most of a
  # first run is compiling kernels, which the workers share through numba's disk cache
  python -m pytest -m "not slow" -q -n auto --maxprocesses 4 "$@"
}

case "${1:-}" in
  demo) demo ;;
  test) shift; run_tests "$@" ;;
  setup) setup ;;
  *) echo "usage: ./dev.sh demo | test [pytest args] | setup" >&2; exit 2 ;;
esac
