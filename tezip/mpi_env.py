"""What the batch system says about the world this process belongs to, independent of MPI.

Slurm's ``srun`` starts the tasks of a job step and tells each its rank and the step's
size (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``), whether or not it also wires them into
an MPI world (through PMI/PMIx, when the MPI library and ``srun --mpi=...`` agree). If it
does not, each task's MPI world is just itself, and every task would do the whole job.
``check_world`` refuses that. In a batch script itself (no ``srun``), Slurm sets
``SLURM_NTASKS`` for the allocation and ``SLURM_PROCID=0`` but no ``SLURM_STEP_*``
variables: one process, a world of one, which is fine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import OptionError


def _int(environ: Mapping[str, str], name: str) -> int | None:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


def slurm_tasks(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(rank, tasks) if Slurm started this process as one of several tasks, else None.
    Tasks: ``SLURM_STEP_NUM_TASKS`` (set by srun for its step); without it, a rank other
    than 0 in ``SLURM_PROCID`` also proves several tasks (``SLURM_NTASKS`` then gives
    their number)."""
    env = os.environ if environ is None else environ
    rank = _int(env, "SLURM_PROCID")
    step = _int(env, "SLURM_STEP_NUM_TASKS")
    if step is not None and step > 1:
        return (rank or 0), step
    if rank is not None and rank > 0:
        return rank, max(rank + 1, _int(env, "SLURM_NTASKS") or 0)
    return None


def check_world(size: int, environ: Mapping[str, str] | None = None) -> None:
    """OptionError if Slurm started several tasks but MPI shows this process a world of
    ``size`` that does not hold them (each task would run the whole job alone)."""
    slurm = slurm_tasks(environ)
    if slurm is None or size >= slurm[1]:
        return
    rank, tasks = slurm
    raise OptionError(
        f"Slurm started {tasks} tasks (this is task {rank}) but MPI sees a world of {size}: "
        "srun did not connect them; launch with `srun --mpi=pmi2` (or --mpi=pmix; "
        "`srun --mpi=list` shows what your site has), or with the mpiexec of the MPI that "
        "mpi4py uses; see cli/slurm.sbatch")
