#!/usr/bin/env bash
# Prepare a training data set with tezip over MPI ranks on one machine (or on the nodes
# of an allocation you already hold). Copy this file, edit the variables, run it:
#
#     bash mpirun.sh
#
# Set-up once, without root:
#     python -m venv ~/tezip-env && . ~/tezip-env/bin/activate
#     pip install "tezip[mpi]"          # tezip + mpi4py + the mpich wheel (brings mpiexec)
# On a cluster with its own MPI, build mpi4py against it instead and use that mpirun:
#     module load openmpi               # or: module load cray-mpich / intel-mpi / mpich
#     pip install tezip && pip install --no-binary mpi4py mpi4py
set -euo pipefail

NPROCS=${NPROCS:-$(nproc)}                 # ranks: one per core is the usual choice
# inputs: files, globs, folders, FILE.h5:/dataset, separated by spaces. Globs are passed
# to tezip unexpanded (it expands them itself, sorted), so keep them quoted when you set
# INPUTS on the command line: INPUTS='runs/*.h5 extra.npy' bash mpirun.sh
read -r -a INPUTS <<< "${INPUTS:-data/*.h5}"
DATASET=${DATASET:-/entry/data/data}       # dataset path inside the HDF5 inputs
OUT=${OUT:-prepared}                       # output directory: shards + manifest.json
BOUND=${BOUND:-1e-3}                       # --mode rel: fraction of each stack's range
SHARD_MB=${SHARD_MB:-128}                  # target compressed size of one shard

# the mpiexec of the environment that has mpi4py; a launcher from another MPI would start
# N independent single-rank runs (tezip detects that and stops)
MPIEXEC=${MPIEXEC:-$(command -v mpiexec || true)}
if [ -z "$MPIEXEC" ] || [ ! -x "$MPIEXEC" ]; then
    echo "mpirun.sh: no mpiexec found${MPIEXEC:+ at $MPIEXEC}; install one with" \
         "'pip install \"tezip[mpi]\"' (brings mpich) or load your site's MPI, or set" \
         "MPIEXEC=/path/to/mpiexec" >&2
    exit 2
fi

"$MPIEXEC" -n "$NPROCS" python -m tezip prepare "${INPUTS[@]}" \
    --dataset "$DATASET" --out "$OUT" --mode rel --bound "$BOUND" --shard-size "$SHARD_MB"

# a rerun after a failure or a kill resumes: complete, verified shards are kept
python -m tezip verify "$OUT"
